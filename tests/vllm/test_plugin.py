"""engram's vLLM plugin (engram.integrations.vllm) inside the real vLLM (tests/vllm/runner.py): vLLM loads it
from the `vllm.general_plugins` entry point with its own plugin loader; vLLM's Qwen4ExpNGramEmbedding is
then built, loaded through its load_weights from a checkpoint make-checkpoint wrote, and run on vLLM's own
ids. Not enabled, the swapped class returns vLLM's rows from vLLM's storage; enabled, the table lives in an
engram mapping and engram's gather returns the same rows, bit for bit, for bf16, fp8-table and nvfp4
tables, one ETP rank or one of two; with cpu_offload (vLLM's pinned-host class) too, in engram's host
mapping, on huge pages, or file-backed: the checkpoint's own pages, loaded by no copy (under a resident-set
budget too); and with a device cache of a profile's hot rows (in host memory here, on the GPU there), hits
and misses alike. Settings engram's schema refuses, or the plugin cannot honour, are one-line errors naming
the setting, and `vllm serve` refuses them when it creates its engine config, before any worker starts.
Run against each vLLM release `make test-vllm` installs (0.33.0 and 0.34.0)."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from engram.memory.mapping import PAGE
from engram.ngram.spec import ModelSpec
from engram.runtime.checkpoints.writer import hf_config, write_checkpoint
from engram.runtime.placement.filemap import in_memory_fs
from engram.runtime.shard import ShardFormat
from tests.runtime.specs import QWEN
from tests.vllm.runner import VLLM_PYTHON, ask_vllm, needs_vllm, vllm_version

pytestmark = needs_vllm
DS = ModelSpec(
    "ds",
    "DeepseekV41ForCausalLM",
    {
        "engram_layer_ids": [1, 3],
        "engram_max_ngram_size": 3,
        "engram_n_heads": 3,
        "engram_head_dim": 64,
        "engram_vocab_size": 700,
        "engram_compressed_vocab_size": 300,
        "engram_pad_token_id": 2,
    },
    dtype="fp8",
)
ENABLED = {"on": {}, "bad": {"nope": 1}, "theirs": {"use_thp": True}}
PINNED = ("host", "hugepages", "node", "file")  # cpu_offload: vLLM's pinned-host table class, engram's storage


def device_cache(spec: ModelSpec, path: Path, rows_cached: int) -> dict[str, object]:
    """engram settings for a static device cache from a profile of every row of every table, in a seeded
    order, with room for `rows_cached` rows per table (each with its id and slot)."""
    generator = torch.Generator().manual_seed(11)
    hot = {
        f"{name}.hot_rows": torch.randperm(rows, generator=generator)
        for name, rows in zip(spec.table_names(), spec.layout.table_rows, strict=True)
    }
    save_file(hot, str(path))
    budget = rows_cached * (ShardFormat(1, spec.head_dim, spec.dtype).row_bytes + 16) * len(hot)
    return {"device_cache_bytes": budget, "device_cache_profile": str(path), "cache_admission": "static"}


def assert_partly_cached(table: dict[str, object], rows: int) -> None:
    """A cache that holds some of the table's rows, and that some of the lookups hit."""
    assert 0 < table["cached_rows"] < rows and table["hits"] > 0, table  # type: ignore[operator]


@pytest.mark.parametrize(
    ("dtype", "parts"), [("bf16", None), ("bf16", 37), ("fp8-table", None), ("fp8-table", 5), ("nvfp4", 3)]
)
def test_the_plugin_serves_qwen_tables_as_vllm_does(dtype: str, parts: int | None, tmp_path: Path) -> None:
    """Whole tables, and tables split into shard_<k> parts (NVFP4's only form), every placement: file-backed
    ones from the parts' own pages."""
    spec = dataclasses.replace(QWEN, dtype=dtype)
    write_checkpoint(spec, tmp_path, seed=5, split_parts=parts)
    cache = device_cache(spec, tmp_path / "hot.profile", min(spec.layout.table_rows) // 2)
    cases = [
        {"path": str(tmp_path), "etp": etp, "etp_rank": etp - 1, "enabled": ENABLED, "cache": cache} for etp in (1, 2)
    ]
    for answer in ask_vllm("plugin_qwen", cases):
        assert "engram" in answer["plugins"]
        vllm, disabled, on = answer["vllm"], answer["disabled"], answer["on"]
        assert set(vllm) == set(disabled) == set(on) == {"1", "2"}
        for layer in vllm:
            assert vllm[layer]["class"] == "Qwen4ExpPLEDeviceEmbedding" and not vllm[layer]["engram_storage"]
            assert disabled[layer]["class"] == on[layer]["class"] == "EngramQwenDeviceEmbedding"
            assert not disabled[layer]["engram_storage"] and on[layer]["engram_storage"]
            assert disabled[layer]["rows"] == vllm[layer]["rows"] == on[layer]["rows"]
            assert any(vllm[layer]["rows"])
        assert answer["bad"]["error"].startswith("ConfigError: /engram/nope: unknown field 'nope'")
        for placement in (*PINNED, "bounded"):
            for layer in vllm:
                table = answer[placement][layer]
                assert table["class"] == "EngramQwenPinnedHostEmbedding", table
                assert table["rows"] == vllm[layer]["rows"]
                file_backed = placement in ("file", "bounded")
                assert table["file_backed"] == file_backed != table["engram_storage"]
                assert table["budget_files"] == (placement == "bounded")  # file_cache_bytes: the one file
        for layer, rows in zip(vllm, spec.layout.table_rows, strict=True):  # device_cache_bytes
            assert answer["cached"][layer]["rows"] == vllm[layer]["rows"]
            assert_partly_cached(answer["cached"][layer], rows)
        assert answer["theirs"]["error"] == (
            "EngramError: engram setting 'use_thp' is vLLM's own: give it in --engram-config, not in engram's section"
        )


def test_the_plugin_serves_deepseek_tables_as_vllm_does(tmp_path: Path) -> None:
    """Engram._create_embedding with the plugin loaded: not enabled, vLLM's own ParallelEngramEmbedding;
    enabled, engram's subclass with the table in an engram mapping, or with file_backed a view of the
    checkpoint's own pages (vLLM's weight loaders copy nothing), and a RAM tier over it that reads its
    misses past the page cache, whose lookups (bf16 rows and packed fp8
    bytes with their scales, TP 1 and each of TP 2's head shards) equal vLLM's kernel on vLLM's storage.
    The time from building the tables to the first lookup is printed for both (-s), not asserted."""
    write_checkpoint(DS, tmp_path, seed=8)
    hf = hf_config(DS, "fp8", 0)["text_config"]
    ids = DS.hasher().hash(torch.randint(0, DS.vocab, (24,), generator=torch.Generator().manual_seed(2)))
    cache = device_cache(DS, tmp_path / "hot.profile", min(DS.layout.table_rows) // 2)
    for tp in (1, 2):
        case = {"path": str(tmp_path), "hf": hf, "tp": tp, "ids": ids.transpose(0, 1).tolist(), "cache": cache}
        [answer] = ask_vllm("plugin_deepseek", [case])
        ranks = zip(answer["vllm"], answer["disabled"], answer["on"], answer["file"], strict=True)
        for vllm_rank, (vllm, disabled, on, file) in enumerate(ranks):
            assert "error" not in file, file
            tables = zip(vllm["tables"], disabled["tables"], on["tables"], file["tables"], strict=True)
            for index, (theirs, off, ours, mapped) in enumerate(tables):
                assert theirs["class"] == off["class"] == "ParallelEngramEmbedding" and not off["engram_storage"]
                assert ours["class"] == mapped["class"] == "EngramParallelEmbedding" and ours["engram_storage"]
                assert mapped["file_backed"] and not ours["file_backed"]  # the checkpoint's pages, no copy
                assert theirs["rows"] == off["rows"] == ours["rows"] == mapped["rows"] and any(theirs["rows"])
                assert theirs["packed"] == off["packed"] == ours["packed"] == mapped["packed"]
                for placement in ("host", "hugepages", "cached"):  # cpu_offload: host mapping, huge pages, cache
                    table = answer[placement][vllm_rank]["tables"][index]
                    assert table["engram_storage"] and not table["file_backed"]
                    assert table["rows"] == theirs["rows"] and table["packed"] == theirs["packed"]
                cached = answer["cached"][vllm_rank]["tables"][index]
                assert cached["cached_rows"] > 0 and cached["hits"] > 0, cached
                assert "error" not in answer["ram"][vllm_rank], answer["ram"][vllm_rank]
                ram = answer["ram"][vllm_rank]["tables"][index]  # the first lookup misses, the packed one hits
                assert ram["file_backed"] and ram["rows"] == theirs["rows"] and ram["packed"] == theirs["packed"]
                if not in_memory_fs(str(tmp_path)):  # a file on disk: a RAM tier reading past the page cache
                    assert ram["direct_reads"] and ram["cached_rows"] > 0 and ram["tier_hits"] > 0, ram
                seconds = (theirs["seconds_to_first_lookup"], mapped["seconds_to_first_lookup"])
                print(f"TP {tp}: start to first lookup, vLLM's load {seconds[0]:.4f} s, file-backed {seconds[1]:.4f} s")


def test_two_replicas_share_one_copy_and_a_kill_leaves_nothing(tmp_path: Path) -> None:
    """dp_shared_memory through the plugin: two processes as two DP replicas on one node (vLLM's Engram DP
    group a real gloo group) map one memfd copy of each table, loaded by the leader alone: each process's
    PSS of it is half the table, and both read vLLM's rows. A replica killed in the middle of the load:
    the survivor reports the dead peer in one line, and nothing is left in /dev/shm (a memfd dies with
    its last holder)."""
    write_checkpoint(DS, tmp_path, seed=9)
    hf = hf_config(DS, "fp8", 0)["text_config"]
    ids = DS.hasher().hash(torch.randint(0, DS.vocab, (16,), generator=torch.Generator().manual_seed(4)))
    base = {"path": str(tmp_path), "hf": hf, "ids": ids.transpose(0, 1).tolist()}
    [vllm] = ask_vllm("plugin_deepseek", [{**base, "tp": 1}])
    shared, killed = ask_vllm("plugin_shared", [base, {**base, "kill_during_load": True}])
    tables = ("engram-layers-", "vllm_engram")  # named tables of these (other tests may share the directory)
    assert shared["exit_codes"] == [0, 0] and not [f for f in shared["shm_left"] if f.startswith(tables)]
    replicas = [shared["replicas"][r] for r in ("0", "1")]
    for index, table in enumerate(vllm["vllm"][0]["tables"]):
        assert replicas[0][index]["rows"] == replicas[1][index]["rows"] == table["rows"]
        size = replicas[0][index]["bytes"]
        assert all(0.45 * size <= r[index]["pss"] <= 0.55 * size for r in replicas)  # one copy, two holders
    assert killed["exit_codes"][1] == -9 and not [f for f in killed["shm_left"] if f.startswith(tables)]
    assert killed["replicas"]["0"].startswith(
        "EngramError: vLLM's Engram DP group: ranks [0, 1] did not all reach 'load "
    )


def test_file_backed_tables_under_a_budget_keep_the_page_cache_near_it(tmp_path: Path) -> None:
    """file_cache_bytes through the plugin: DeepSeek tables of 60 MiB served from the checkpoint's pages
    under an 8 MiB budget, one per checkpoint and process that both tables share. Over twenty steps of
    random text from a cold page cache, the file's resident pages stay within the budget and one step's
    reads (two tables x 384 ids x a weight page, its gap page and two scale pages), while without the
    budget they pass three times it; every step's rows are vLLM's own, bit for bit."""
    if in_memory_fs(str(tmp_path)):
        pytest.skip("the temporary directory is on tmpfs, whose pages are memory, not page cache")
    big = dataclasses.replace(DS, hf_text_config={**DS.hf_text_config, "engram_vocab_size": 80_000})
    write_checkpoint(big, tmp_path, seed=3)
    hf = hf_config(big, "fp8", 0)["text_config"]
    generator = torch.Generator().manual_seed(6)
    steps = [
        big.hasher().hash(torch.randint(0, big.vocab, (64,), generator=generator)).transpose(0, 1).tolist()
        for _ in range(20)
    ]
    budget, step_reads = 8 << 20, 2 * 64 * 6 * 4 * PAGE
    [answer] = ask_vllm("plugin_file_budget", [{"path": str(tmp_path), "hf": hf, "steps": steps, "budget": budget}])
    vllm, bounded, unbounded = answer["vllm"], answer["bounded"], answer["unbounded"]
    assert bounded["digests"] == unbounded["digests"] == vllm["digests"]
    assert len(set(vllm["digests"])) == len(steps)
    assert (vllm["budgets"], unbounded["budgets"], bounded["budgets"], bounded["files"]) == (0, 0, 1, 1)
    assert bounded["resident"][0] == unbounded["resident"][0] == 0  # cold at the start
    assert max(bounded["resident"]) <= budget + step_reads and bounded["peak"] <= budget + step_reads
    assert bounded["trims"] >= 2 and bounded["measures"] >= bounded["trims"]
    assert unbounded["resident"][-1] > 3 * budget


def test_a_table_class_another_plugin_replaced_stays_theirs_and_engram_says_so() -> None:
    [answer] = ask_vllm("plugin_collision", [{}])
    disk = {"Qwen4ExpPLEDiskOffloadEmbedding": "EngramQwenDiskOffloadEmbedding"} if vllm_version() >= (0, 34) else {}
    assert answer["classes"] == {
        "Qwen4ExpPLEDeviceEmbedding": "Theirs",
        "Qwen4ExpPLEPinnedHostEmbedding": "EngramQwenPinnedHostEmbedding",
        **disk,
    }
    warning = (
        "engram: vLLM's Qwen4ExpPLEDeviceEmbedding is already replaced by "
        "__main__.plugin_collision_case.<locals>.Theirs (another plugin), so engram does not serve Qwen4Exp's PLE "
        "tables of that class in this process; uninstall one of the two plugins"
    )
    assert answer["warnings"] == [warning, warning]  # once each time vLLM loads the plugins


@pytest.mark.parametrize(
    ("section", "error"),
    [
        (
            '{"engram": {"file_backed": 1}}',
            "Value error, engram: /engram/file_backed: expected a boolean; got 1 [type]",
        ),
        (
            '{"engram": {"use_thp": true}}',
            "Value error, engram: engram setting 'use_thp' is vLLM's own: give it in --engram-config, not in "
            "engram's section",
        ),
        ('{"engram": {}}', None),  # checked and good: vLLM goes on, and fails later for want of a tokenizer
    ],
)
def test_vllm_serve_refuses_a_bad_section_before_any_worker_starts(
    section: str, error: str | None, tmp_path: Path
) -> None:
    """The real `vllm serve` (on vLLM's CPU platform): engram's section is checked where vLLM checks its own
    Engram fields, while the API server creates the engine config, so a mistake stops it there with the one
    line, before the tokenizer is read or an engine process starts."""
    write_checkpoint(DS, tmp_path, seed=3)  # no tokenizer: a good section fails only after the config
    assert VLLM_PYTHON is not None
    env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu", "CUDA_VISIBLE_DEVICES": ""}
    env.pop("ENGRAM_VLLM_CONFIG", None)
    done = subprocess.run(
        [str(Path(VLLM_PYTHON).absolute().with_name("vllm")), "serve", str(tmp_path), "--additional-config", section],
        capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path,
    )  # fmt: skip
    output = done.stdout + done.stderr
    assert done.returncode != 0 and "Resolved Engram configuration" in output, output[-3000:]
    later = "Couldn't instantiate the backend tokenizer"
    if error is None:
        assert "Value error, engram" not in output and later in output, output[-3000:]
    else:
        assert error in output.splitlines()[-2], output[-3000:]
        assert later not in output and "EngineCore" not in output, output[-3000:]


def metric_values(text: str, name: str) -> dict[str, float]:
    """Each table's value of the metric `name` in Prometheus text (the `table` label's value)."""
    found = {}
    for line in text.splitlines():
        match = re.fullmatch(rf"{re.escape(name)}\{{(.*)\}} (\S+)", line)
        if match:
            labels = dict(re.findall(r'(\w+)="([^"]*)"', match.group(1)))
            found[labels["table"]] = float(match.group(2))
    return found


def test_the_plugins_online_tier_learns_and_its_counters_reach_vllms_metrics(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """device_cache_bytes with no profile inside vLLM: the tier fills from the traffic (a refresh within
    the repeated lookups), every lookup's rows equal vLLM's own table's, and vLLM's /metrics registry (in
    its multi-process mode, PROMETHEUS_MULTIPROC_DIR) serves engram's counters under vLLM-style names
    with the tier's exact values: hits + misses = lookups."""
    write_checkpoint(DS, tmp_path, seed=9)
    metrics_dir = tmp_path / "prometheus"
    metrics_dir.mkdir()
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(metrics_dir))
    hf = hf_config(DS, "fp8", 0)["text_config"]
    tokens = torch.randint(0, DS.vocab, (4096,), generator=torch.Generator().manual_seed(3))
    ids = DS.hasher().hash(tokens)
    case = {"path": str(tmp_path), "hf": hf, "ids": ids.transpose(0, 1).tolist(), "repeat": 10}
    [answer] = ask_vllm("plugin_tier", [case])
    assert "error" not in answer, answer
    text = answer["metrics"]
    for theirs, ours in zip(answer["vllm"], answer["tiered"], strict=True):
        assert ours["digests"] == theirs["digests"]  # every lookup, before and after the refresh
        tier, name = ours["stats"]["tier"], ours["stats"]["name"]
        assert tier["policy"] == "online" and tier["refreshes"] >= 1 and tier["rows"] > 0
        assert tier["hits"] > 0 and tier["hits"] + tier["misses"] == tier["lookups"] == ours["stats"]["ids"]
        for metric, key in (
            ("hits", "hits"),
            ("misses", "misses"),
            ("lookups", "lookups"),
            ("admissions", "admissions"),
        ):
            assert metric_values(text, f"vllm:engram_tier_{metric}_total")[name] == tier[key], metric
        assert metric_values(text, "vllm:engram_lookups_total")[name] == ours["stats"]["ids"]
        assert metric_values(text, "vllm:engram_tier_rows")[name] == tier["rows"]


def test_a_ram_tiers_counters_reach_vllms_metrics_on_their_own(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """ram_cache_bytes over file-backed tables inside vLLM: its rows equal vLLM's own table's, and the
    plugin itself publishes the RAM tier's counters (it admits as it reads and never refreshes, so they go
    out at its first lookup and every PUBLISH_EVERY lookups after): after 1 + PUBLISH_EVERY, vLLM's /metrics
    serves every tier series labelled tier="ram" with the tier's values."""
    from engram.integrations.vllm.metrics import PUBLISH_EVERY

    monkeypatch.setenv("ENGRAM_DIRECT_READS", "0")  # memory to spare here: told, the RAM tier serves (page cache)
    write_checkpoint(DS, tmp_path, seed=9)
    metrics_dir = tmp_path / "prometheus"
    metrics_dir.mkdir()
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(metrics_dir))
    hf = hf_config(DS, "fp8", 0)["text_config"]
    ids = DS.hasher().hash(torch.randint(0, DS.vocab, (512,), generator=torch.Generator().manual_seed(4)))
    settings = {"file_backed": True, "ram_cache_bytes": 4 << 20}
    case = {"path": str(tmp_path), "hf": hf, "ids": ids.transpose(0, 1).tolist(), "repeat": 1 + PUBLISH_EVERY}
    [answer] = ask_vllm("plugin_tier", [{**case, "settings": settings, "publish": False}])
    assert "error" not in answer, answer
    text = answer["metrics"]
    for theirs, ours in zip(answer["vllm"], answer["tiered"], strict=True):
        assert ours["digests"] == theirs["digests"]
        tier, name = ours["stats"]["tier"], ours["stats"]["name"]
        assert tier["tier"] == "ram" and tier["rows"] > 0 and tier["hits"] > 0
        for metric in ("hits", "misses", "lookups", "admissions"):
            series = [line for line in text.splitlines() if line.startswith(f"vllm:engram_tier_{metric}_total{{")]
            assert any('tier="ram"' in line for line in series), metric
            assert metric_values(text, f"vllm:engram_tier_{metric}_total")[name] == tier[metric], metric
        assert metric_values(text, "vllm:engram_tier_rows")[name] == tier["rows"]


@pytest.mark.parametrize("through", ["network namespace", "node_dir"])
def test_two_separately_started_engines_share_one_node_copy(tmp_path: Path, through: str) -> None:
    """node_sharing through the plugin: two processes with no group between them (two vLLM engines of DP 1
    on one node) build the same DeepSeek tables; the first loads each table's node copy from the model's
    checkpoint, the second attaches it (vLLM's weight loaders copy nothing into a sealed copy), both read
    vLLM's rows, each process's PSS of a table is half of it, and nothing is left once both exit. With
    node_dir in the engram section they meet in that directory, with no abstract socket at all."""
    write_checkpoint(DS, tmp_path, seed=12)
    hf = hf_config(DS, "fp8", 0)["text_config"]
    ids = DS.hasher().hash(torch.randint(0, DS.vocab, (16,), generator=torch.Generator().manual_seed(6)))
    base = {"path": str(tmp_path), "hf": hf, "ids": ids.transpose(0, 1).tolist()}
    [vllm] = ask_vllm("plugin_deepseek", [{**base, "tp": 1}])
    node_dir = tmp_path / "rendezvous" if through == "node_dir" else None
    [shared] = ask_vllm("plugin_node_shared", [{**base, "node_dir": str(node_dir) if node_dir else None}])
    assert shared["exit_codes"] == [0, 0] and shared["left"] == {"memfds": [], "sockets": []}, shared
    if node_dir is not None:  # both engines' servers named in the directory, and gone with them
        assert shared["abstract_servers_while_built"] == 0
        assert [n[:2] for n in shared["node_dir_while_built"]] == ["di", "s-", "s-"]
        assert shared["node_dir_left"] == ["digests"]
    else:
        assert shared["abstract_servers_while_built"] == 2
    first, second = shared["engines"]
    for index, table in enumerate(vllm["vllm"][0]["tables"]):
        ours, theirs = first["built"][index], second["built"][index]
        assert ours["rows"] == theirs["rows"] == table["rows"]
        assert (ours["origin"], ours["loaded_by"]) == ("loaded", first["pid"])
        assert (theirs["origin"], theirs["loaded_by"]) == ("attached", first["pid"])
        for engine in (first, second):  # one copy, two holders (the table and its trailer page)
            assert 0.45 * ours["bytes"] <= engine["pss"][index] <= 0.55 * (ours["bytes"] + PAGE), engine["pss"]
