"""Every rule of the Engram config (docs/config.md's list) with its exact message, through each public
entry point."""

from __future__ import annotations

import json

import pytest

from engram.config import (
    ConfigError,
    EngramConfig,
    LoadConfig,
    ModelConfig,
    ParallelConfig,
    Problem,
    load_config,
    load_deployment,
)
from tests.config.fields import KNOWN_FIELDS

PREFIX = "EngramConfig requires a model with supported Engram embeddings and non-empty n-gram layer ids."


def problems(exc: pytest.ExceptionInfo[ConfigError]) -> list[tuple[str, str, str]]:
    return [tuple(p) for p in exc.value.errors]


def cfg(**fields: bool) -> EngramConfig:
    return load_config(fields, env={})


def test_defaults() -> None:
    assert load_config(env={}) == EngramConfig(
        cpu_offload=True, embedding_across_dp=False, dp_shared_memory=None, use_thp=False
    )


@pytest.mark.parametrize(
    "source", [{"cpu_offload": False, "dp_shared_memory": True}, b'{"cpu_offload": false, "dp_shared_memory": true}']
)
def test_dp_shared_memory_needs_cpu_offload(source: object) -> None:
    with pytest.raises(ConfigError) as exc:
        load_config(source, env={})  # type: ignore[arg-type]
    assert problems(exc) == [
        ("/engram/dp_shared_memory", "dp-shared-memory-needs-cpu-offload", "dp_shared_memory requires cpu_offload=True")
    ]
    assert isinstance(exc.value, ValueError)


@pytest.mark.parametrize(
    "fields",
    [{"use_thp": True, "cpu_offload": False}, {"use_thp": True, "dp_shared_memory": True}],
)
def test_use_thp_needs_private_offload(fields: dict[str, bool]) -> None:
    with pytest.raises(ConfigError) as exc:
        load_config(fields, env={})
    assert (
        "/engram/use_thp",
        "use-thp-needs-private-offload",
        "use_thp requires cpu_offload=True and dp_shared_memory=False",
    ) in problems(exc)


def test_both_config_rules_reported_together() -> None:
    with pytest.raises(ConfigError) as exc:
        load_config(b'{"cpu_offload": false, "dp_shared_memory": true, "use_thp": true}', env={})
    assert [p[1] for p in problems(exc)] == ["dp-shared-memory-needs-cpu-offload", "use-thp-needs-private-offload"]


def test_structural_problems_all_reported() -> None:
    with pytest.raises(ConfigError) as exc:
        load_config(b'{"cpu_offload": "yes", "dp_shared_memory": 1, "cpu_ofload": true}', env={})
    assert problems(exc) == [
        (
            "/engram/cpu_ofload",
            "unknown-field",
            f"unknown field 'cpu_ofload'; known fields: {KNOWN_FIELDS}",
        ),
        ("/engram/cpu_offload", "type", "expected a boolean; got the string 'yes'"),
        ("/engram/dp_shared_memory", "type", "expected a boolean or null; got 1"),
    ]


@pytest.mark.parametrize(
    ("parallel", "expected"),
    [
        (
            ParallelConfig(data_parallel_size=1),
            ("dp-shared-memory-needs-dp", "dp_shared_memory requires data_parallel_size > 1."),
        ),
        (
            ParallelConfig(data_parallel_size=2, enable_elastic_ep=True),
            ("dp-shared-memory-no-elastic-ep", "dp_shared_memory is not supported with elastic EP."),
        ),
    ],
)
def test_verify_parallel_config_shared(parallel: ParallelConfig, expected: tuple[str, str]) -> None:
    with pytest.raises(ConfigError) as exc:
        cfg(dp_shared_memory=True).verify_parallel_config(parallel)
    assert problems(exc) == [("/engram/dp_shared_memory", *expected)]


def test_verify_parallel_config_across_dp() -> None:
    config = cfg(embedding_across_dp=True)
    config.verify_parallel_config(ParallelConfig(data_parallel_size=1, enable_elastic_ep=True))
    config.verify_parallel_config(ParallelConfig(data_parallel_size=4))
    with pytest.raises(ConfigError) as exc:
        config.verify_parallel_config(ParallelConfig(data_parallel_size=2, enable_elastic_ep=True))
    assert problems(exc) == [
        (
            "/engram/embedding_across_dp",
            "embedding-across-dp-no-elastic-ep",
            "Engram embedding_across_dp is not supported with elastic EP yet.",
        )
    ]
    cfg(dp_shared_memory=True).verify_parallel_config(ParallelConfig(data_parallel_size=2))


@pytest.mark.parametrize("fmt", ["auto", "safetensors", "pt"])
def test_verify_load_config_accepts_weight_loaders(fmt: str) -> None:
    cfg(dp_shared_memory=True).verify_load_config(LoadConfig(load_format=fmt))


@pytest.mark.parametrize("fmt", ["dummy", "gguf", "bitsandbytes"])
def test_verify_load_config_rejects_others(fmt: str) -> None:
    cfg().verify_load_config(LoadConfig(load_format=fmt))  # only shared tables need weight loaders
    with pytest.raises(ConfigError) as exc:
        cfg(dp_shared_memory=True).verify_load_config(LoadConfig(load_format=fmt))
    assert problems(exc) == [
        (
            "/load/load_format",
            "dp-shared-memory-needs-weight-loader",
            f"dp_shared_memory requires load_format 'auto', 'safetensors' or 'pt'; got {fmt!r}.",
        )
    ]


def test_verify_model_config_accepts_both_families() -> None:
    config = cfg()
    config.verify_model_config(
        ModelConfig(architecture="DeepseekV41ForCausalLM", hf_text_config={"engram_layer_ids": [1, 14]}), "cuda"
    )
    for arch in ("Qwen4ExpForCausalLM", "Qwen4ExpForConditionalGeneration"):
        config.verify_model_config(ModelConfig(architecture=arch, hf_text_config={"ple_layer_ids": [3]}), "rocm")
    config.verify_model_config(
        ModelConfig(architecture="Qwen4ExpForCausalLM", hf_text_config={"ple_layer_ids": [3]}), "cpu"
    )


@pytest.mark.parametrize(
    ("model", "platform", "expected"),
    [
        (None, None, ("/model", "model-architecture", f"{PREFIX} No model config was given.")),
        (
            ModelConfig(architecture="LlamaForCausalLM"),
            None,
            (
                "/model/architecture",
                "model-architecture",
                f"{PREFIX} Architecture 'LlamaForCausalLM' carries no n-gram embeddings; supported: "
                "DeepseekV41ForCausalLM, Qwen4ExpForCausalLM, Qwen4ExpForConditionalGeneration.",
            ),
        ),
        (
            ModelConfig(architecture="DeepseekV41ForCausalLM", hf_text_config={"engram_layer_ids": []}),
            "cuda",
            (
                "/model/hf_text_config/engram_layer_ids",
                "model-layer-ids",
                f"{PREFIX} DeepseekV41ForCausalLM needs hf_text_config.engram_layer_ids, a non-empty list of at most 4096 distinct layer ids from 0 to 1000000; got []: value: expected at least 1 item(s); got an array.",
            ),
        ),
        (
            ModelConfig(architecture="DeepseekV41ForCausalLM", hf_text_config={"ple_layer_ids": [1]}),
            "cuda",
            (
                "/model/hf_text_config/engram_layer_ids",
                "model-layer-ids",
                f"{PREFIX} DeepseekV41ForCausalLM needs hf_text_config.engram_layer_ids, a non-empty list of at most 4096 distinct layer ids from 0 to 1000000; got None: value: expected an array; got null.",
            ),
        ),
        (
            ModelConfig(architecture="Qwen4ExpForConditionalGeneration", hf_text_config={"ple_layer_ids": [2, 2]}),
            "cuda",
            (
                "/model/hf_text_config/ple_layer_ids",
                "model-layer-ids",
                f"{PREFIX} Qwen4Exp models need hf_text_config.ple_layer_ids, a non-empty list of at most 4096 distinct layer ids from 0 to 1000000; got [2, 2]: value: expected distinct items; got an array.",
            ),
        ),
        (
            ModelConfig(architecture="Qwen4ExpForCausalLM", hf_text_config={"ple_layer_ids": [1]}),
            "xpu",
            (
                "/platform",
                "platform-backend",
                f"{PREFIX} Platform 'xpu' has no Engram backend; use 'cuda', 'rocm' or 'cpu'.",
            ),
        ),
    ],
)
def test_verify_model_config_rejects(
    model: ModelConfig | None, platform: str | None, expected: tuple[str, str, str]
) -> None:
    with pytest.raises(ConfigError) as exc:
        cfg().verify_model_config(model, platform)
    assert problems(exc) == [expected]
    assert str(exc.value).startswith(f"{expected[0]}: {PREFIX}")


@pytest.mark.parametrize(
    ("across", "tp", "dp", "expected"),
    [(False, 4, 8, 4), (True, 4, 8, 32), (True, 2, 1, 2), (False, 1, 1, 1), (True, 8, 2, 16)],
)
def test_get_parallel_size(across: bool, tp: int, dp: int, expected: int) -> None:
    parallel = ParallelConfig(tensor_parallel_size=tp, data_parallel_size=dp)
    config = cfg(embedding_across_dp=across)
    assert config.get_parallel_size(parallel) == expected


def test_deployment_reports_every_rule_at_once() -> None:
    document = {
        "engram": {"dp_shared_memory": True},
        "parallel": {"enable_elastic_ep": True},
        "load": {"load_format": "dummy"},
    }
    with pytest.raises(ConfigError) as exc:
        load_deployment(document, env={})
    assert problems(exc) == [
        ("/engram/dp_shared_memory", "dp-shared-memory-needs-dp", "dp_shared_memory requires data_parallel_size > 1."),
        (
            "/engram/dp_shared_memory",
            "dp-shared-memory-no-elastic-ep",
            "dp_shared_memory is not supported with elastic EP.",
        ),
        (
            "/load/load_format",
            "dp-shared-memory-needs-weight-loader",
            "dp_shared_memory requires load_format 'auto', 'safetensors' or 'pt'; got 'dummy'.",
        ),
    ]


def test_absent_parts_are_not_checked() -> None:
    deployment = load_deployment({"engram": {"dp_shared_memory": True}}, env={})
    assert deployment.checked == ["engram"]
    assert deployment.parallel is None and deployment.parallel_size is None


def test_data_parallel_size_local_defaults_to_data_parallel_size() -> None:
    deployment = load_deployment({"parallel": {"data_parallel_size": 8}}, env={})
    assert deployment.parallel == ParallelConfig(data_parallel_size=8, data_parallel_size_local=8)
    assert load_deployment(
        {"parallel": {"data_parallel_size": 8.0, "data_parallel_size_local": 2}}, env={}
    ).parallel == (ParallelConfig(data_parallel_size=8, data_parallel_size_local=2))


def test_config_error_needs_problems() -> None:
    with pytest.raises(ValueError, match="at least one problem"):
        ConfigError([])
    assert ConfigError([Problem("/a", "r", "m")]).errors == [("/a", "r", "m")]


def test_model_ngram_fields() -> None:
    config = cfg()
    bad = {
        "engram_layer_ids": [1],
        "engram_n_heads": 0,
        "engram_vocab_size": [100, 1],
        "engram_pad_id": -1,
        "hidden_size": "free-form",
    }
    with pytest.raises(ConfigError) as exc:
        config.verify_model_config(ModelConfig(architecture="DeepseekV41ForCausalLM", hf_text_config=bad))
    assert problems(exc) == [
        (
            "/model/hf_text_config",
            "model-ngram-fields",
            "DeepseekV41ForCausalLM's n-gram fields in hf_text_config are off (engram_n_heads: expected >= 1; got 0; "
            "engram_pad_id: expected >= 0; got -1; engram_vocab_size: expected one of the allowed forms; got an array); "
            "where given they must be integers: engram_max_ngram_size >= 2; engram_n_heads, engram_head_dim and "
            "engram_compressed_vocab_size >= 1; engram_pad_token_id (or engram_pad_id) and engram_seed >= 0; "
            "engram_vocab_size >= 2, or a list of such, one per order.",
        )
    ]
    with pytest.raises(ConfigError) as exc:
        config.verify_model_config(
            ModelConfig(architecture="Qwen4ExpForCausalLM", hf_text_config={"ple_layer_ids": [1], "ngram_size": "3"})
        )
    assert [(p[1], p[2].split(";")[0]) for p in problems(exc)] == [
        ("model-ngram-fields", "Qwen4Exp's n-gram fields in hf_text_config are off (ngram_size: expected an integer")
    ]


def test_a_constructed_config_is_a_valid_config() -> None:
    """vLLM's constructor raises for dp_shared_memory without cpu_offload; so does ours, and so do
    msgspec's replace, convert and decode (which wrap it in their ValidationError)."""
    import msgspec

    from engram.config import EngramConfig

    with pytest.raises(ConfigError) as exc:
        EngramConfig(cpu_offload=False, dp_shared_memory=True)
    assert [(p.path, p.rule) for p in exc.value.errors] == [
        ("/engram/dp_shared_memory", "dp-shared-memory-needs-cpu-offload")
    ]
    with pytest.raises(ConfigError, match=r"use_thp requires cpu_offload=True and dp_shared_memory=False"):
        msgspec.structs.replace(EngramConfig(), dp_shared_memory=True, use_thp=True)
    with pytest.raises(msgspec.ValidationError, match="dp_shared_memory requires cpu_offload=True"):
        msgspec.convert({"cpu_offload": False, "dp_shared_memory": True}, EngramConfig)
    with pytest.raises(msgspec.ValidationError, match="dp_shared_memory requires cpu_offload=True"):
        msgspec.json.decode(b'{"cpu_offload": false, "dp_shared_memory": true}', type=EngramConfig)
    assert (
        EngramConfig(cpu_offload=True, dp_shared_memory=True).compute_hash()
        == load_config({"dp_shared_memory": True}, env={}).compute_hash()
    )


def test_device_cache_field() -> None:
    """device_cache_bytes: an integer >= 0, only with host tables, left out of the hash (the rows a lookup
    returns do not change, only where they live)."""
    assert load_config({"device_cache_bytes": 1 << 30}, env={}).device_cache_bytes == 1 << 30
    assert load_config({"device_cache_bytes": 1 << 30}, env={}).compute_hash() == load_config({}, env={}).compute_hash()
    assert load_config({"cpu_offload": False, "device_cache_bytes": 0}, env={}).device_cache_bytes == 0
    cases = [
        ({"cpu_offload": False, "device_cache_bytes": 1}, "/engram/device_cache_bytes", "device-cache-needs-cpu-offload",
         "device_cache_bytes caches hot rows of host tables in GPU memory; it requires cpu_offload=True (with cpu_offload=False every row is on the GPU already)"),
        ({"device_cache_bytes": -1}, "/engram/device_cache_bytes", "minimum", "expected >= 0; got -1"),
        ({"device_cache_bytes": 1.5}, "/engram/device_cache_bytes", "type", "expected an integer; got 1.5"),
    ]  # fmt: skip
    for fields, path, rule, message in cases:
        with pytest.raises(ConfigError) as exc:
            load_config(fields, env={})
        assert [(p.path, p.rule, p.message) for p in exc.value.errors] == [(path, rule, message)]
    from engram.config import EngramConfig

    with pytest.raises(ConfigError, match="device-cache-needs-cpu-offload"):
        EngramConfig(cpu_offload=False, device_cache_bytes=4096)


@pytest.mark.parametrize(
    ("fields", "rule"),
    [
        ({"file_backed": True, "cpu_offload": False}, "file-backed-needs-cpu-offload"),
        ({"file_backed": True, "dp_shared_memory": True}, "file-backed-not-with-dp-shared-memory"),
        ({"file_backed": True, "use_thp": True}, "file-backed-not-with-use-thp"),
    ],
)
def test_file_backed_rules(fields: dict[str, bool], rule: str) -> None:
    """Each combination that makes no sense is refused on the fast path and the full walk alike."""
    with pytest.raises(ConfigError) as exc:
        load_config(json.dumps(fields).encode(), env={})
    assert [(path, r) for path, r, _ in problems(exc) if r.startswith("file-backed")] == [("/engram/file_backed", rule)]
    with pytest.raises(ConfigError) as walked:
        load_config(fields, env={})
    assert rule in {r for _, r, _ in problems(walked)}
    assert load_config({"file_backed": True}, env={}).file_backed is True


@pytest.mark.parametrize(
    ("parallel", "refused"),
    [({"enable_dbo": True}, True), ({"ubatch_size": 2}, True), ({"ubatch_size": 1}, False), ({}, False)],
)
def test_deepseek_engram_refuses_dbo_and_microbatching(parallel: dict[str, object], refused: bool) -> None:
    """vLLM 0.33: DeepSeek V4.1 with Engram layers refuses DBO and more than one micro-batch; Qwen4Exp does not."""
    deepseek = {"architecture": "DeepseekV41ForCausalLM", "hf_text_config": {"engram_layer_ids": [1, 3]}}
    qwen = {"architecture": "Qwen4ExpForCausalLM", "hf_text_config": {"ple_layer_ids": [1]}}
    assert load_deployment({"model": qwen, "parallel": parallel}, env={}).parallel is not None
    if not refused:
        assert load_deployment({"model": deepseek, "parallel": parallel}, env={}).parallel is not None
        return
    with pytest.raises(ConfigError) as exc:
        load_deployment({"model": deepseek, "parallel": parallel}, env={})
    assert problems(exc) == [
        (
            "/parallel",
            "deepseek-engram-no-ubatching",
            "DeepSeek V4.1 Engram does not support DBO or microbatching. Disable --enable-dbo and set --ubatch-size to 0.",
        )
    ]


@pytest.mark.parametrize(
    ("fields", "rule"),
    [
        ({"node_sharing": "node", "file_backed": True, "use_thp": False}, "node-sharing-not-file-backed"),
        ({"node_sharing": "numa", "cpu_offload": False}, "node-sharing-needs-cpu-offload"),
    ],
)
def test_node_sharing_rules(fields: dict[str, object], rule: str) -> None:
    """node_sharing shares loaded host tables: not file-backed ones, not GPU tables; both paths refuse alike."""
    for document in (json.dumps(fields).encode(), fields):
        with pytest.raises(ConfigError) as exc:
            load_config(document, env={})
        assert ("/engram/node_sharing", rule) in {(path, r) for path, r, _ in problems(exc)}
    assert load_config({"node_sharing": "numa", "cpu_offload": True}, env={}).node_sharing == "numa"
    with pytest.raises(ConfigError, match="node_sharing"):
        load_config({"node_sharing": "pod"}, env={})


QWEN = {"architecture": "Qwen4ExpForCausalLM", "hf_text_config": {"ple_layer_ids": [1]}}
DEEPSEEK = {"architecture": "DeepseekV41ForCausalLM", "hf_text_config": {"engram_layer_ids": [1, 3]}}
DISK_OFFLOAD_MESSAGE = "disk_offload requires a Qwen4Exp model on CUDA"  # vLLM 0.34.0's, word for word


@pytest.mark.parametrize(
    ("deployment", "expected"),
    [
        ({"model": QWEN, "platform": "cuda"}, []),
        ({"model": QWEN, "platform": "cpu"}, []),  # engram's CPU backend serves it as file-backed tables
        ({"model": QWEN, "parallel": {"data_parallel_size": 2}}, []),
        ({"model": DEEPSEEK}, [("/engram/disk_offload", "disk-offload-needs-qwen", DISK_OFFLOAD_MESSAGE)]),
        (
            {"model": QWEN, "platform": "rocm"},
            [("/engram/disk_offload", "disk-offload-needs-cuda", DISK_OFFLOAD_MESSAGE)],
        ),
        (
            {"model": QWEN, "parallel": {"enable_elastic_ep": True}},
            [("/engram/disk_offload", "disk-offload-no-elastic-ep", "disk_offload is not supported with elastic EP.")],
        ),
    ],
)
def test_disk_offload_rules(deployment: dict[str, object], expected: list[tuple[str, str, str]]) -> None:
    """vLLM 0.34's disk_offload rules, with its messages: a Qwen4Exp model, on CUDA (or engram's CPU
    backend), without elastic EP; it takes precedence over cpu_offload, so cpu_offload false is fine."""
    for engram in ({"disk_offload": True}, {"disk_offload": True, "cpu_offload": False}):
        document = {"engram": engram, **deployment}
        if not expected:
            assert load_deployment(document, env={}).engram.disk_offload is True
            continue
        with pytest.raises(ConfigError) as exc:
            load_deployment(document, env={})
        assert problems(exc) == expected


@pytest.mark.parametrize("field", ["ram_cache_bytes", "file_cache_bytes"])
def test_tiers_over_checkpoint_files_take_disk_offload_too(field: str) -> None:
    """The RAM tier and the page-cache bound serve tables read from the checkpoint's files: file_backed's,
    or disk_offload's; a table in memory has neither, and both paths refuse it alike."""
    assert getattr(load_config({field: 1 << 20, "disk_offload": True}, env={}), field) == 1 << 20
    assert getattr(load_config({field: 1 << 20, "file_backed": True}, env={}), field) == 1 << 20
    rule = "ram-cache-needs-file-backed" if field == "ram_cache_bytes" else "file-cache-needs-file-backed"
    for document in ({field: 1 << 20}, json.dumps({field: 1 << 20}).encode()):
        with pytest.raises(ConfigError) as exc:
            load_config(document, env={})
        assert [(path, r) for path, r, message in problems(exc)] == [(f"/engram/{field}", rule)]
        assert "it requires file_backed=True (or disk_offload=True)" in problems(exc)[0][2]
    with pytest.raises(ConfigError) as exc:
        load_config({"node_sharing": "node", "disk_offload": True}, env={})
    assert [(path, r) for path, r, _ in problems(exc)] == [("/engram/node_sharing", "node-sharing-not-disk-offload")]


@pytest.mark.parametrize("sharing", ["node", "numa"])
def test_use_thp_with_node_sharing_is_refused_not_ignored(sharing: str) -> None:
    """A node copy is a shared memfd: use_thp's anonymous huge pages cannot back it, so asking for both
    is one error naming the rule, not a setting silently dropped."""
    with pytest.raises(ConfigError) as exc:
        load_config({"node_sharing": sharing, "use_thp": True, "cpu_offload": True}, env={})
    assert [(path, r) for path, r, _ in problems(exc)] == [("/engram/node_sharing", "node-sharing-not-use-thp")]
    assert load_config({"node_sharing": sharing, "use_thp": False, "cpu_offload": True}, env={}).node_sharing == sharing
    assert load_config({"node_sharing": "off", "use_thp": True, "cpu_offload": True}, env={}).use_thp is True
