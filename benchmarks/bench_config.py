"""Decode and validate one JSON EngramConfig: engram's load_config(bytes, env={}) against a pydantic v2
dataclass written the way vLLM writes its configs, and against jsonschema on the same document.

Targets: at least 2x faster than pydantic, 50x faster than jsonschema. Then the full walk of whole
deployment documents (the generated check_document, which reports every problem) against jsonschema.
Run: python benchmarks/bench_config.py
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import jsonschema
from _timing import median_seconds, print_table  # benchmarks/ is on sys.path when run as a script
from pydantic import ConfigDict, Field, TypeAdapter, model_validator
from pydantic.dataclasses import dataclass

from engram._generated.validators import check_document
from engram.config import ConfigError, load_config

DOCUMENTS = [
    b'{"cpu_offload": true, "dp_shared_memory": true}',
    b'{"embedding_across_dp": true}',
    b'{"cpu_offload": true, "embedding_across_dp": false, "dp_shared_memory": false, "use_thp": true}',
    b"{}",
]
INVALID = b'{"cpu_offload": false, "dp_shared_memory": true}'
DEPLOYMENTS = [
    {
        "engram": {"cpu_offload": True, "dp_shared_memory": True},
        "parallel": {"data_parallel_size": 2},
        "load": {"load_format": "safetensors"},
        "platform": "cuda",
    },
    {
        "engram": {"embedding_across_dp": True},
        "model": {
            "architecture": "DeepseekV41ForCausalLM",
            "hf_text_config": {
                "engram_layer_ids": [1, 15],
                "engram_max_ngram_size": 3,
                "engram_vocab_size": [1000, 1000],
            },
        },
    },
    {"engram": {"cpu_offload": False, "dp_shared_memory": True, "bogus": 1}, "parallel": {"data_parallel_size": 1}},
    {},
]


def _default_cpu_offload() -> bool:
    value = os.environ.get("VLLM_PLE_CPU_OFFLOAD")
    return True if value is None else value.lower() in ("1", "true", "yes", "on")


@dataclass(config=ConfigDict(extra="forbid"))
class PydanticEngramConfig:
    """vLLM's shape: a pydantic dataclass, env default_factory, an after-validator per rule."""

    cpu_offload: bool = Field(default_factory=_default_cpu_offload)
    embedding_across_dp: bool = False
    dp_shared_memory: bool = False
    use_thp: bool = False

    @model_validator(mode="after")
    def _validate_shared_memory(self) -> PydanticEngramConfig:
        if self.dp_shared_memory and not self.cpu_offload:
            raise ValueError("dp_shared_memory requires cpu_offload=True")
        if self.use_thp and (not self.cpu_offload or self.dp_shared_memory):
            raise ValueError("use_thp requires cpu_offload=True and dp_shared_memory=False")
        return self


def main() -> None:
    schema = json.loads((Path(__file__).resolve().parents[1] / "schema" / "engram.schema.json").read_text())
    engram_schema = {**schema["$defs"]["EngramConfig"], "$defs": schema["$defs"]}
    validator = jsonschema.Draft202012Validator(engram_schema)
    adapter = TypeAdapter(PydanticEngramConfig)

    def run_engram() -> None:
        for doc in DOCUMENTS:
            load_config(doc, env={})

    def run_pydantic() -> None:
        for doc in DOCUMENTS:
            adapter.validate_json(doc)

    def run_jsonschema() -> None:
        for doc in DOCUMENTS:
            validator.validate(json.loads(doc))

    # All three accept the valid documents and reject the invalid one.
    run_engram(), run_pydantic(), run_jsonschema()
    for check in (
        lambda: load_config(INVALID, env={}),
        lambda: adapter.validate_json(INVALID),
        lambda: validator.validate(json.loads(INVALID)),
    ):
        try:
            check()
        except (ConfigError, ValueError, jsonschema.ValidationError):
            continue
        raise SystemExit("a validator accepted the invalid document")

    results = {}
    for name, fn, number in (
        ("engram", run_engram, 20000),
        ("pydantic", run_pydantic, 20000),
        ("jsonschema", run_jsonschema, 500),
    ):
        results[name] = median_seconds(fn, number=number) / len(DOCUMENTS) * 1e6
    engram_us = results["engram"]
    rows = [[name, f"{us:.2f}", f"{us / engram_us:.1f}x"] for name, us in results.items()]
    print_table(["validator", "us/document", "engram is faster by"], rows)
    print(
        f"targets: pydantic >= 2x ({results['pydantic'] / engram_us:.1f}x), jsonschema >= 50x ({results['jsonschema'] / engram_us:.0f}x)"
    )
    print()
    full_walk(schema)


def full_walk(schema: dict[str, object]) -> None:
    """Whole deployment documents, every problem collected: generated code against jsonschema."""
    validator = jsonschema.Draft202012Validator(schema)
    for doc in DEPLOYMENTS:  # the same verdicts first
        problems: list[object] = []
        check_document(doc, "", problems)
        assert (problems == []) is validator.is_valid(doc), doc

    def run_generated() -> None:
        for doc in DEPLOYMENTS:
            check_document(doc, "", [])

    def run_jsonschema() -> None:
        for doc in DEPLOYMENTS:
            list(validator.iter_errors(doc))

    generated = median_seconds(run_generated, number=5000) / len(DEPLOYMENTS) * 1e6
    reference = median_seconds(run_jsonschema, number=200) / len(DEPLOYMENTS) * 1e6
    rows = [
        ["generated check_document", f"{generated:.2f}", "1.0x"],
        ["jsonschema", f"{reference:.2f}", f"{reference / generated:.0f}x"],
    ]
    print_table(["full deployment walk", "us/document", "generated is faster by"], rows)


if __name__ == "__main__":
    main()
