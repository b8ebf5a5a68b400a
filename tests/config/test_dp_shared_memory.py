"""dp_shared_memory: null (the default, as in vLLM 0.33) is resolved against the deployment: on exactly
when cpu_offload, not use_thp, not file_backed, data_parallel_size > 1 and no elastic EP. An explicit value
is kept; the rules treat null as off; the digest hashes null until it is resolved."""

from __future__ import annotations

from typing import Any

import pytest

from engram.cli import main
from engram.config import ConfigError, EngramConfig, ParallelConfig, load_config, load_deployment
from tests.config.fields import shown


@pytest.mark.parametrize(
    ("fields", "parallel", "shared"),
    [
        ({}, {"data_parallel_size": 4}, True),
        ({}, {"data_parallel_size": 1}, False),
        ({"use_thp": True}, {"data_parallel_size": 4}, False),
        ({"cpu_offload": False}, {"data_parallel_size": 4}, False),
        ({"file_backed": True}, {"data_parallel_size": 4}, False),
        ({}, {"data_parallel_size": 4, "enable_elastic_ep": True}, False),
        ({"dp_shared_memory": False}, {"data_parallel_size": 4}, False),
        ({"dp_shared_memory": True}, {"data_parallel_size": 4}, True),
    ],
)
def test_null_resolves_as_vllm_does(fields: dict[str, Any], parallel: dict[str, Any], shared: bool) -> None:
    config = load_config(fields, env={})
    assert config.dp_shared_memory == fields.get("dp_shared_memory")
    assert config.resolve_dp_shared_memory(ParallelConfig(**parallel)).dp_shared_memory is shared
    deployment = load_deployment({"engram": fields, "parallel": parallel}, env={})
    assert deployment.engram.dp_shared_memory is shared
    assert deployment.dp_shared_memory_given == fields.get("dp_shared_memory")


def test_null_is_off_for_the_rules_and_stays_null_without_parallel_sizes() -> None:
    assert load_config({"use_thp": True}, env={}).dp_shared_memory is None
    assert load_config({"file_backed": True}, env={}).dp_shared_memory is None
    assert load_config({"cpu_offload": False}, env={}).dp_shared_memory is None
    assert load_deployment({"engram": {}}, env={}).engram == EngramConfig()
    unresolved = EngramConfig().hash_factors()["dp_shared_memory"]
    assert unresolved is None


def test_the_command_line_says_how_null_was_resolved(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", "--data-parallel-size", "4"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1] == shown(dp_shared_memory=True)
    assert lines[2] == (
        "dp_shared_memory: null, resolved to true (vLLM's rule, file_backed added: on exactly when cpu_offload, not use_thp, not "
        "file_backed, data_parallel_size > 1 and no elastic EP)"
    )
    assert main(["validate", "--engram-config.dp_shared_memory", "null", "--data-parallel-size", "1"]) == 0
    assert "dp_shared_memory: null, resolved to false (" in capsys.readouterr().out
    assert main(["plan", "--preset", "tiny", "--data-parallel-size", "2"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].endswith("tables shm: 678,150 table bytes") and out[2].startswith(
        "dp_shared_memory: null, resolved to true"
    )
    assert out[1] == "shard layout: vllm (vLLM 0.33's per-rank layout)"


def test_the_host_memory_check_resolves_null_first() -> None:
    """At DP 2 a null dp_shared_memory is one shared copy per node: no private tables to refuse."""
    from engram.config import HostLimits

    parallel = ParallelConfig(tensor_parallel_size=4, data_parallel_size=2)
    EngramConfig().verify_host_memory(1 << 40, parallel, HostLimits(1 << 30))
    with pytest.raises(
        ConfigError, match=r"^/engram/cpu_offload: Engram tables need 2,199,023,255,552 bytes"
    ):  # two private copies
        EngramConfig(dp_shared_memory=False).verify_host_memory(1 << 40, parallel, HostLimits(1 << 30))
