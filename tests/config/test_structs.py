"""The generated structs check their fields whenever they are constructed, decoded or replaced: a value of
the wrong JSON type, or out of bounds, is the ConfigError load_config reports for it, never a config that
answers wrongly later (EngramConfig(embedding_across_dp="false") made get_parallel_size 8 where vLLM says 2)."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from engram.config import EngramConfig, LoadConfig, ModelConfig, ParallelConfig, load_config
from engram.errors import ConfigError, Problem


def refused(make: Any, **fields: Any) -> list[Problem]:
    with pytest.raises(ConfigError) as raised:
        make(**fields)
    return raised.value.errors


@pytest.mark.parametrize(
    ("make", "fields", "problems"),
    [
        (
            EngramConfig,
            {"embedding_across_dp": "false"},
            [Problem("/engram/embedding_across_dp", "type", "expected a boolean; got the string 'false'")],
        ),
        (EngramConfig, {"cpu_offload": None}, [Problem("/engram/cpu_offload", "type", "expected a boolean; got null")]),
        (
            EngramConfig,
            {"dp_shared_memory": 1},
            [Problem("/engram/dp_shared_memory", "type", "expected a boolean or null; got 1")],
        ),
        (
            EngramConfig,
            {"device_cache_bytes": -1},
            [Problem("/engram/device_cache_bytes", "minimum", "expected >= 0; got -1")],
        ),
        (
            ParallelConfig,
            {"tensor_parallel_size": "2", "data_parallel_size": 0},
            [
                Problem("/parallel/tensor_parallel_size", "type", "expected an integer; got the string '2'"),
                Problem("/parallel/data_parallel_size", "minimum", "expected >= 1; got 0"),
                Problem("/parallel/data_parallel_size_local", "minimum", "expected >= 1; got 0"),
            ],
        ),
        (
            ParallelConfig,
            {"tensor_parallel_size": 2.0},
            [
                Problem(
                    "/parallel/tensor_parallel_size",
                    "type",
                    "expected a Python value of the field's JSON type; got a float",
                )
            ],
        ),
        (LoadConfig, {"load_format": None}, [Problem("/load/load_format", "type", "expected a string; got null")]),
        (
            ModelConfig,
            {"architecture": "x", "hf_text_config": []},
            [Problem("/model/hf_text_config", "type", "expected an object; got an array")],
        ),
    ],
)
def test_a_constructor_refuses_what_load_config_refuses(
    make: Any, fields: dict[str, Any], problems: list[Problem]
) -> None:
    assert refused(make, **fields) == problems


def test_replace_checks_too() -> None:
    config = EngramConfig()
    with pytest.raises(ConfigError) as raised:
        msgspec.structs.replace(config, embedding_across_dp="yes")
    assert raised.value.errors == [
        Problem("/engram/embedding_across_dp", "type", "expected a boolean; got the string 'yes'")
    ]


def test_the_json_fast_path_checks_bounds() -> None:
    """load_config of JSON bytes decodes straight into the struct: its bounds hold there too."""
    with pytest.raises(ConfigError) as raised:
        load_config(b'{"device_cache_bytes": -1}', env={})
    assert raised.value.errors == [Problem("/engram/device_cache_bytes", "minimum", "expected >= 0; got -1")]


def test_types_only_the_rules_stay_with_the_verify_methods() -> None:
    """Any architecture constructs, as in vLLM; verify_model_config is where an unsupported one is refused."""
    model = ModelConfig(architecture="LlamaForCausalLM", hf_text_config={})
    with pytest.raises(ConfigError, match=r"Architecture 'LlamaForCausalLM' carries no n-gram embeddings"):
        EngramConfig().verify_model_config(model)
    assert (
        EngramConfig(embedding_across_dp=True).get_parallel_size(
            ParallelConfig(tensor_parallel_size=2, data_parallel_size=4)
        )
        == 8
    )
    assert (
        EngramConfig(embedding_across_dp=False).get_parallel_size(
            ParallelConfig(tensor_parallel_size=2, data_parallel_size=4)
        )
        == 2
    )
