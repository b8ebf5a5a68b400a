"""`engram validate`, `hash`, `schema`, `docs`: verdicts, flag precedence, exit codes, no tracebacks."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engram.cli import main
from tests.config.fields import DEFAULTS, ENGRAM_FIELDS, KNOWN_FIELDS, NEWEST_VLLM, shown, vllm_digest

EXAMPLES = Path(__file__).resolve().parents[2] / "schema" / "examples"


def run(capsys: pytest.CaptureFixture[str], *argv: str, stdin: bytes | None = None) -> tuple[int, str, str]:
    if stdin is not None:
        sys.stdin = io.TextIOWrapper(io.BytesIO(stdin))
    try:
        code = main(list(argv))
    finally:
        sys.stdin = sys.__stdin__
    out, err = capsys.readouterr()
    return code, out, err


def verdict(capsys: pytest.CaptureFixture[str], *argv: str, stdin: bytes | None = None) -> dict[str, object]:
    code, out, _ = run(capsys, "validate", "--json", *argv, stdin=stdin)
    result = json.loads(out)
    assert code == (0 if result["valid"] else 2)
    return result


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.json")), ids=lambda p: p.stem)
def test_examples(capsys: pytest.CaptureFixture[str], path: Path) -> None:
    result = verdict(capsys, str(path))
    assert result["valid"] is path.name.startswith("valid-")


def test_json_output_valid(capsys: pytest.CaptureFixture[str]) -> None:
    result = verdict(capsys, str(EXAMPLES / "valid-qwen-across-dp.json"))
    given = {"embedding_across_dp": True, "dp_shared_memory": False}
    assert result == {
        "valid": True,
        "checked": ["engram", "model", "parallel", "platform"],
        "engram": DEFAULTS | given,
        "hash": vllm_digest(given),
        "hash_of": f"vLLM {NEWEST_VLLM}'s EngramConfig.compile_factors()",
        "parallel_size": 8,
        "errors": [],
    }


def test_json_output_invalid(capsys: pytest.CaptureFixture[str]) -> None:
    result = verdict(capsys, str(EXAMPLES / "invalid-shared-single-replica.json"))
    assert result == {
        "valid": False,
        "checked": ["engram", "parallel", "load"],
        "engram": None,
        "hash": None,
        "hash_of": None,
        "parallel_size": None,
        "errors": [
            {
                "path": "/engram/dp_shared_memory",
                "rule": "dp-shared-memory-needs-dp",
                "message": "dp_shared_memory requires data_parallel_size > 1.",
            },
            {
                "path": "/load/load_format",
                "rule": "dp-shared-memory-needs-weight-loader",
                "message": "dp_shared_memory requires load_format 'auto', 'safetensors' or 'pt'; got 'dummy'.",
            },
        ],
    }


def test_text_output(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "validate", str(EXAMPLES / "valid-engram-only.json"))
    assert code == 0 and err == ""
    assert out.splitlines() == [
        "valid: engram checked; not given, not checked: model, parallel, load, platform",
        shown(use_thp=True),
        "dp_shared_memory: null, resolved once the parallel sizes are known (give --data-parallel-size)",
        f"hash: {vllm_digest({'use_thp': True})}  (vLLM {NEWEST_VLLM}'s EngramConfig.compile_factors())",
    ]
    code, out, err = run(capsys, "validate", str(EXAMPLES / "invalid-shared-without-offload.json"))
    assert (code, out) == (2, "")
    assert (
        err
        == "error: /engram/dp_shared_memory: dp_shared_memory requires cpu_offload=True [dp-shared-memory-needs-cpu-offload]\n"
    )


def test_flags_override_document(capsys: pytest.CaptureFixture[str]) -> None:
    doc = str(EXAMPLES / "invalid-shared-single-replica.json")
    result = verdict(capsys, doc, "--data-parallel-size", "2", "--load-format", "pt", "--tensor-parallel-size", "2")
    assert result["valid"] is True and result["parallel_size"] == 2
    result = verdict(capsys, str(EXAMPLES / "valid-v41-dp8-shared.json"), "--enable-elastic-ep", "--platform", "cpu")
    assert [e["rule"] for e in result["errors"]] == ["dp-shared-memory-no-elastic-ep"]  # type: ignore[union-attr]
    result = verdict(capsys, "--architecture", "Qwen4ExpForCausalLM", "--model-config", '{"ple_layer_ids": [1]}')
    assert result["checked"] == ["engram", "model"] and result["valid"] is True


def test_engram_flag_precedence(capsys: pytest.CaptureFixture[str]) -> None:
    def engram(*argv: str) -> object:
        return verdict(capsys, *argv)["engram"]

    base = dict(DEFAULTS)
    # later JSON wins over earlier JSON
    assert engram("--engram-config", '{"use_thp": true}', "--engram-config", '{"use_thp": false}') == base
    # a dotted field wins over JSON, even when the JSON comes later
    assert engram("--engram-config.use_thp", "true", "--engram-config", '{"use_thp": false}') == {
        **base,
        "use_thp": True,
        "file_backed": False,
    }
    # later dotted fields win over earlier ones
    assert engram("--engram-config.cpu_offload", "false", "--engram-config.cpu_offload", "1") == base
    # flags win over the document
    doc = str(EXAMPLES / "valid-engram-only.json")
    assert engram(doc, "--engram-config.use_thp", "off") == base


def test_flag_errors_name_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "validate", "--engram-config.dp_shared_memory", "maybe")
    assert code == 2
    assert (
        err
        == "error: /engram/dp_shared_memory: --engram-config.dp_shared_memory: expected true or false; got 'maybe' [type]\n"
    )
    code, _, err = run(capsys, "validate", "--engram-config", "[1]")
    assert (code, err) == (2, "error: /engram: --engram-config must be a JSON object; got an array [type]\n")
    code, _, err = run(capsys, "validate", "--engram-config", "{bad")
    assert code == 2 and err.startswith("error: /engram: --engram-config is not valid JSON: ")


def test_environment_reaches_the_cli(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ENGRAM_CPU_OFFLOAD", "0")
    assert verdict(capsys)["engram"] == DEFAULTS | {"cpu_offload": False}
    monkeypatch.setenv("ENGRAM_CPU_OFFLOAD", "sometimes")
    code, _, err = run(capsys, "validate")
    assert code == 2 and "ENGRAM_CPU_OFFLOAD='sometimes' is not a boolean" in err


def test_unreadable_and_malformed(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, out, err = run(capsys, "validate", str(tmp_path / "nope.json"))
    assert (code, out) == (2, "") and err.count("\n") == 1 and "No such file or directory" in err
    code, out, err = run(capsys, "validate", "-", stdin=b'{"engram": ')
    assert (code, out) == (2, "") and err.startswith("error: /: input is not valid JSON")


def test_hash_schema_docs(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "hash", "--engram-config.dp_shared_memory", "true")
    digest = vllm_digest({"dp_shared_memory": True})
    assert (code, out) == (0, f"{digest}  vLLM {NEWEST_VLLM}'s EngramConfig.compile_factors()\n")
    code, out, _ = run(capsys, "hash", "--vllm", "0.33.0", "--engram-config.dp_shared_memory", "true")
    digest = "0103d4fb0b496f6466971874ca0a01faaac0bac227aafbae6f39e56a1dc1bbb0"  # printed by vLLM 0.33.0 itself
    assert (code, out) == (0, f"{digest}  vLLM 0.33's EngramConfig.compute_hash()\n")
    code, out, _ = run(capsys, "schema")
    assert code == 0 and json.loads(out) == json.loads((EXAMPLES.parent / "engram.schema.json").read_text())
    code, out, _ = run(capsys, "docs")
    assert code == 0 and out == (EXAMPLES.parents[1] / "docs" / "config.md").read_text()


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
SECTION_KEYS = st.sampled_from(["engram", "model", "parallel", "load", "platform", "x"])
DEPLOYMENT_LIKE = st.dictionaries(SECTION_KEYS, JSON_VALUES, max_size=5)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.one_of(
        st.binary(max_size=64),
        JSON_VALUES.map(lambda v: json.dumps(v).encode()),
        DEPLOYMENT_LIKE.map(lambda v: json.dumps(v).encode()),
    )
)
def test_fuzz_validate_never_crashes(capsys: pytest.CaptureFixture[str], data: bytes) -> None:
    for argv in (["validate", "-"], ["validate", "--json", "-"]):
        code, out, err = run(capsys, *argv, stdin=data)
        assert code in (0, 2)
        assert "Traceback" not in out + err
        if "--json" in argv:
            assert json.loads(out)["valid"] is (code == 0)


@pytest.mark.parametrize(
    "data",
    [
        b"\x00\xff",
        b"[" * 100000,
        b'{"model": {"architecture": "DeepseekV41ForCausalLM", "hf_text_config": {"engram_layer_ids": '
        + b"[" * 5000
        + b"]" * 5000
        + b"}}}",
    ],
)
def test_real_process_exits_cleanly(data: bytes) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "engram", "validate", "-"], input=data, capture_output=True, timeout=60, check=False
    )
    assert done.returncode == 2
    assert b"Traceback" not in done.stderr
    assert done.stderr.startswith(b"error: ") and done.stderr.count(b"\n") <= 3


def test_model_config_from_a_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    hf = tmp_path / "config.json"
    hf.write_text('{"engram_layer_ids": [1, 14], "engram_max_ngram_size": 4}')
    result = verdict(capsys, "--architecture", "DeepseekV41ForCausalLM", "--model-config", str(hf))
    assert result["valid"] is True and result["checked"] == ["engram", "model"]
    code, _, err = run(
        capsys, "validate", "--architecture", "DeepseekV41ForCausalLM", "--model-config", str(tmp_path / "missing.json")
    )
    assert (
        code == 2
        and err
        == f"error: /model/hf_text_config: cannot read --model-config {str(tmp_path / 'missing.json')!r}: No such file or directory [source]\n"
    )


def test_control_characters_from_the_input_are_printed_escaped(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A key can neither clear the screen nor forge a line of engram's own output."""
    path = tmp_path / "hostile.json"
    path.write_text(json.dumps({"engram": {"x\x1b[2J\nerror: all good\u202e": True}}))
    assert main(["validate", str(path)]) == 2
    assert capsys.readouterr().err == (
        "error: /engram/x\\x1b[2J\\nerror: all good\\u202e: unknown field 'x\\x1b[2J\\nerror: all good\\u202e'; "
        f"known fields: {KNOWN_FIELDS} [unknown-field]\n"
    )


@pytest.mark.parametrize("field", ENGRAM_FIELDS)
def test_a_bare_engram_config_is_read_as_the_engram_section(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, field: str
) -> None:
    """What vLLM's --engram-config takes ({"cpu_offload": true}, any field the schema lists) is a whole
    deployment document's engram section: validated, not refused as unknown top-level fields."""
    value = DEFAULTS[field]
    path = tmp_path / "engram.json"
    path.write_text(json.dumps({field: value, "cpu_offload": True}))
    result = verdict(capsys, str(path))
    assert result["valid"] is True and result["checked"] == ["engram"]
    assert result["engram"] == DEFAULTS | {field: value, "cpu_offload": True}


def test_an_engram_field_beside_the_sections_says_where_it_goes(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "deployment.json"
    path.write_text(json.dumps({"cpu_offload": True, "parallel": {"tensor_parallel_size": 2}}))
    assert main(["validate", str(path)]) == 2
    assert capsys.readouterr().err == (
        "error: /cpu_offload: 'cpu_offload' is an engram setting: put it inside \"engram\" [engram-field-outside-engram]\n"
    )


def test_a_misspelt_field_in_a_bare_engram_config_is_named(capsys: pytest.CaptureFixture[str]) -> None:
    """{"cpu_offload": true, "cpu_offlaod": true} is a bare EngramConfig with a typo: the typo is the
    problem named, not the field spelt right."""
    assert main(["validate", '{"cpu_offload": true, "cpu_offlaod": true}']) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: /engram/cpu_offlaod: unknown field 'cpu_offlaod'; known fields: cpu_offload, ")
    assert err.endswith(" [unknown-field]\n") and err.count("\n") == 1
