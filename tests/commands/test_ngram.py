"""`engram ngram` and `engram layout`."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from engram.apps.presets import get_preset
from engram.cli import main
from engram.ngram.vocab import deepseek_v4_tokenizer


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_ngram_text_json(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "ngram", "--preset", "tiny", "--text", "Hello, Engram world", "--json")
    result = json.loads(out)
    raw = deepseek_v4_tokenizer().encode("Hello, Engram world", add_special_tokens=False).ids
    spec = get_preset("tiny")
    assert code == 0
    assert result["preset"] == "tiny" and result["raw_ids"] == raw
    assert result["compressed_ids"] == spec.compress(raw).tolist()
    rows = spec.hasher().hash(spec.compress(raw))
    assert result["layers"] == {"1": rows[:, 0].tolist(), "3": rows[:, 1].tolist()}


def test_ngram_ids_compressed_and_dead(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "ngram", "--preset", "tiny", "--ids", "5,6,7", "--compressed", "--dead", "1", "--json")
    result = json.loads(out)
    assert code == 0 and result["raw_ids"] is None and result["compressed_ids"] == [5, 6, 7]
    import torch

    rows = get_preset("tiny").hasher().hash(torch.tensor([5, 6, 7]), torch.tensor([False, True, False]))
    assert result["layers"]["1"] == rows[:, 0].tolist()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--preset", "tiny", "--ids", "1,129280"],
            "error: token id 129280 is outside the tokenizer's 129280 ids (0..129279)\n",
        ),
        (
            ["--preset", "tiny", "--ids", "1,99092", "--compressed"],
            "error: compressed id 99092 is outside [0, 99092); compress raw token ids first\n",
        ),
        (
            ["--preset", "qwen4-exp-ple", "--text", "hi"],
            "error: preset qwen4-exp-ple has no bundled tokenizer; pass --ids\n",
        ),
        (
            ["--preset", "engram-demo-v1", "--ids", "1"],
            "error: engram-demo-v1: its tokenizer is not bundled; pass compressed ids instead of raw ones\n",
        ),
        (["--preset", "tiny", "--ids", "1,2", "--dead", "2"], "error: --dead position 2 is outside the 2 tokens\n"),
    ],
)
def test_ngram_errors(capsys: pytest.CaptureFixture[str], argv: list[str], message: str) -> None:
    assert run(capsys, "ngram", *argv) == (2, "", message)


def test_ngram_bad_ids_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["ngram", "--preset", "tiny", "--ids", "1,x"])
    assert exc.value.code == 2
    assert "expected comma-separated integers, got 'x'" in capsys.readouterr().err


def test_layout_json(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "layout", "--preset", "deepseek-v4.1-flash", "--json")
    result = json.loads(out)
    assert code == 0
    assert result["rows"] == [384_006_168, 384_016_682]
    assert result["bytes"] == 202_758_032_400 and result["row_bytes"] == 264
    assert result["layers"][0]["primes"] == {"first": 16000057, "last": 16000463, "count": 24}
    assert result["layers"][1]["primes"] == {"first": 16000477, "last": 16000889, "count": 24}
    assert [t["name"] for t in result["tables"]] == ["layers.1.engram.embed", "layers.14.engram.embed"]


def test_layout_qwen_text(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "layout", "--preset", "qwen4-exp-ple")
    assert code == 0
    assert (
        "table model.language_model.layers.0.ple.ple_embedding.ngram_embedding: 320,001,536 rows, 51,200,245,760 bytes"
        in out
    )
    assert "primes 20000003..20000171 (16)" in out


def test_ngram_text_that_is_not_utf8(capsys: pytest.CaptureFixture[str]) -> None:
    """Bytes the locale could not decode reach argv as lone surrogates: a one-line error, no traceback."""
    assert main(["ngram", "--preset", "deepseek-v4.1-flash", "--text", "ab\udcff\udcfe"]) == 2
    assert capsys.readouterr().err == "error: --text is not valid UTF-8; pass UTF-8 text, or token ids with --ids\n"


def test_profile_out_checked_before_the_work(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["profile", "--preset", "tiny", "--out", str(tmp_path)]) == 2
    assert capsys.readouterr().err == (
        f"error: --out {tmp_path} is a directory; name a file, e.g. {tmp_path / 'hot.safetensors'}\n"
    )
    missing = tmp_path / "no" / "hot.safetensors"
    assert main(["profile", "--preset", "tiny", "--out", str(missing)]) == 2
    assert capsys.readouterr().err == (
        f"error: --out {missing}: the directory {missing.parent} does not exist; create it or choose another\n"
    )


@pytest.mark.parametrize(
    ("ids", "message"),
    [
        (f"1,{2**70}", f"argument --ids: {2**70} is outside the 64-bit integers an id can be"),
        ("9" * 5000, "argument --ids: expected comma-separated integers, got '" + "9" * 60 + "'"),
    ],
)
def test_ngram_ids_beyond_int64_are_a_usage_error(ids: str, message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["ngram", "--preset", "tiny", "--ids", ids])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.endswith(f"error: {message}\n") and "Traceback" not in err


def test_validate_from_a_closed_or_endless_stdin(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "stdin", None)  # what Python makes of a closed descriptor 0
    assert main(["validate", "-"]) == 2
    assert capsys.readouterr().err == (
        "error: '-' reads the document from standard input, which is closed; give a file or pipe one in\n"
    )
    with open("/dev/zero", encoding="latin-1") as zero:
        monkeypatch.setattr(sys, "stdin", zero)
        assert main(["validate", "-"]) == 2
    assert capsys.readouterr().err == (
        "error: standard input holds more than 67,108,864 bytes; a deployment document is smaller\n"
    )


def test_a_path_the_system_refuses_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check-checkpoint", "a" * 5000]) == 2
    err = capsys.readouterr().err
    assert err == f"error: checkpoint {'a' * 300} cannot be read: File name too long\n"
