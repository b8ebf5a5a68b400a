"""Differential: on generated deployment documents (valid ones and near misses), the generated
validators and stock jsonschema against the schema give the same verdict."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import msgspec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engram._generated.structs import EngramConfig
from engram._generated.validators import check_document, check_EngramConfig_rules
from engram.config import ConfigError, load_config, validate_deployment
from engram.errors import Problem

SCHEMA = json.loads((Path(__file__).resolve().parents[2] / "schema" / "engram.schema.json").read_text())
ORACLE = jsonschema.Draft202012Validator(SCHEMA)

# Values a user might write in any field: right types, wrong types, boundary numbers.
ANY_SCALAR = st.one_of(
    st.booleans(),
    st.integers(-3, 10),
    st.sampled_from([0.0, 1.0, 2.0, 2.5, -1.5]),
    st.sampled_from(["", "auto", "dummy", "cuda", "true", "safetensors"]),
    st.none(),
)
ANY_VALUE = st.one_of(
    ANY_SCALAR, st.lists(ANY_SCALAR, max_size=3), st.dictionaries(st.sampled_from(["a", "x"]), ANY_SCALAR, max_size=2)
)


def mostly(good: st.SearchStrategy[Any], bad: st.SearchStrategy[Any], one_in: int = 12) -> st.SearchStrategy[Any]:
    """`good`, except one draw in `one_in` is `bad`: near misses rather than noise."""
    return st.integers(1, one_in).flatmap(lambda i: bad if i == 1 else good)


def field(good: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return mostly(good, ANY_VALUE)


def section(fields: dict[str, st.SearchStrategy[Any]], extra: tuple[str, ...] = ("bogus",)) -> st.SearchStrategy[Any]:
    good = st.fixed_dictionaries({}, optional=fields)
    with_unknown = st.fixed_dictionaries({}, optional={**fields, **{n: ANY_VALUE for n in extra}})
    return mostly(good, st.one_of(with_unknown, ANY_VALUE), one_in=10)


BOOL = field(st.booleans())
COUNT = field(mostly(st.integers(1, 9), st.sampled_from([0, -1, 1.0, 2.0, 4.0]), one_in=6))
ENGRAM = section(
    {"cpu_offload": BOOL, "embedding_across_dp": BOOL, "dp_shared_memory": BOOL, "use_thp": BOOL}, ("thp", "bogus")
)
LAYER_IDS = field(st.lists(mostly(st.integers(0, 20), st.sampled_from([-1, 1.0, True, "1"])), max_size=4))
HF = mostly(
    st.fixed_dictionaries(
        {}, optional={"engram_layer_ids": LAYER_IDS, "ple_layer_ids": LAYER_IDS, "hidden_size": ANY_SCALAR}
    ),
    ANY_VALUE,
)
ARCH = field(
    st.sampled_from(
        ["DeepseekV41ForCausalLM", "Qwen4ExpForCausalLM", "Qwen4ExpForConditionalGeneration", "LlamaForCausalLM"]
    )
)
MODEL = section({"architecture": ARCH, "hf_text_config": HF})
PARALLEL = section(
    {
        "tensor_parallel_size": COUNT,
        "data_parallel_size": COUNT,
        "data_parallel_size_local": COUNT,
        "enable_elastic_ep": BOOL,
    }
)
LOAD = section({"load_format": field(st.sampled_from(["auto", "safetensors", "pt", "dummy", "gguf"]))})
PLATFORM = field(st.sampled_from(["cuda", "rocm", "cpu", "xpu", "tpu"]))
PARTS = {"engram": ENGRAM, "model": MODEL, "parallel": PARALLEL, "load": LOAD, "platform": PLATFORM}
DOCUMENTS = mostly(
    st.fixed_dictionaries({}, optional=PARTS), st.fixed_dictionaries({}, optional={**PARTS, "extra": ANY_VALUE}), 20
)


def generated_verdict(document: Any) -> bool:
    problems: list[Problem] = []
    check_document(document, "", problems)
    return not problems


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(DOCUMENTS)
def test_generated_validators_agree_with_jsonschema(document: dict[str, Any]) -> None:
    expected = ORACLE.is_valid(document)
    assert generated_verdict(document) is expected
    # Filling defaults (empty environment) and building the structs never changes the verdict.
    try:
        validate_deployment(json.loads(json.dumps(document)), env={})
    except ConfigError:
        assert not expected
    else:
        assert expected


@settings(max_examples=500, deadline=None)
@given(ENGRAM)
def test_fast_path_agrees_with_full_walk(engram: Any) -> None:
    """load_config(bytes) decodes with msgspec and checks rules on the struct; it must agree with the
    schema walk of the same document."""
    expected = ORACLE.is_valid({"engram": engram})
    data = msgspec.json.encode(engram)
    try:
        config = load_config(data, env={})
    except ConfigError:
        assert not expected
    else:
        assert expected
        problems: list[Problem] = []
        check_EngramConfig_rules(config, "/engram", problems)
        assert problems == []
        assert isinstance(config, EngramConfig)
