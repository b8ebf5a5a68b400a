"""Inputs of any size or kind end quickly with bounded output: linear checks, size bounds, no blocking
read, excerpts instead of echoes."""

from __future__ import annotations

import json
import os
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from engram.cli import main
from engram.validation import json_values
from engram.validation.json_values import _json_equal, _unique

DEEPSEEK_FIELDS = {
    "engram_max_ngram_size": 3,
    "engram_n_heads": 4,
    "engram_head_dim": 32,
    "engram_vocab_size": 1000,
    "engram_compressed_vocab_size": 99_092,
    "engram_pad_token_id": 2,
}


def model(layer_ids: list[int]) -> dict[str, object]:
    return {
        "architecture": "DeepseekV41ForCausalLM",
        "hf_text_config": {"engram_layer_ids": layer_ids, **DEEPSEEK_FIELDS},
    }


def python_calls(run: Callable[[], object]) -> int:
    """How many Python functions `run` calls: work counted, where a clock would count the machine too."""
    calls = 0

    def profile(frame: object, event: str, arg: object) -> None:
        nonlocal calls
        calls += event == "call"

    sys.setprofile(profile)
    try:
        run()
    finally:
        sys.setprofile(None)
    return calls


def test_unique_items_is_linear_and_right(monkeypatch: pytest.MonkeyPatch) -> None:
    keyed: list[object] = []
    key = json_values._key
    monkeypatch.setattr(json_values, "_key", lambda v: keyed.append(v) or key(v))
    monkeypatch.setattr(json_values, "_json_equal", lambda a, b: pytest.fail("compared pairwise"))
    assert _unique(list(range(200_000)))
    assert len(keyed) == 200_000  # one key per item, no pairs (pairwise it took minutes)
    keyed.clear()
    assert not _unique([*range(100_000), 5])
    assert len(keyed) == 100_001
    monkeypatch.undo()
    values = [1, 1.0, True, "1", [1], [1.0], {"a": 1}, {"a": 1.0}, None, 0, False, 2**53 + 1, float(2**53)]
    for i, a in enumerate(values):
        for b in values[:i]:
            assert _unique([a, b]) == (not _json_equal(a, b)), (a, b)


def test_twenty_thousand_layer_ids_are_bounded_work(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Linear work in the ids, at any length: a few calls per layer id (a pairwise check would make
    hundreds of millions), with the list past its bound refused and shown as an excerpt."""
    path = tmp_path / "d.json"
    path.write_text(json.dumps({"model": model(list(range(4096)))}))
    allowed = python_calls(lambda: main(["validate", str(path)]))
    assert main(["validate", str(path)]) == 0
    path.write_text(json.dumps({"model": model(list(range(20_000)))}))
    refused = python_calls(lambda: main(["validate", str(path)]))
    assert allowed <= 8 * 4096 and refused <= 8 * 20_000
    capsys.readouterr()
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert (
        "error: /model/hf_text_config/engram_layer_ids: EngramConfig requires a model with supported Engram embeddings"
        in err
    )
    assert (
        "got [0, 1, 2, 3, 4, 5, 6, 7, ...]: value: expected at most 4096 item(s); got an array. [model-layer-ids]"
        in err
    )
    assert len(err) < 2000


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("--tensor-parallel-size", "70000", "/parallel/tensor_parallel_size: expected <= 65536; got 70000"),
        ("--data-parallel-size", "1000000", "/parallel/data_parallel_size: expected <= 65536; got 1000000"),
    ],
)
def test_sizes_no_deployment_has(capsys: pytest.CaptureFixture[str], flag: str, value: str, message: str) -> None:
    assert main(["validate", flag, value]) == 2
    assert message in capsys.readouterr().err


def test_a_fifo_is_refused_not_waited_on(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fifo = tmp_path / "deployment.json"
    os.mkfifo(fifo)
    result: list[int] = []
    worker = threading.Thread(target=lambda: result.append(main(["validate", str(fifo)])), daemon=True)
    worker.start()
    worker.join(timeout=10)
    if worker.is_alive():  # unblock the reader so the test run can end, then fail
        with open(fifo, "w"):
            pass
        pytest.fail("engram validate blocked on a FIFO")
    assert result == [2]
    assert f"cannot read {str(fifo)!r}: not a regular file" in capsys.readouterr().err


def test_a_huge_key_is_shown_as_an_excerpt(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    key = "k" * 1_000_000
    path = tmp_path / "d.json"
    path.write_text(json.dumps({"engram": {key: True}}))
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert len(err) < 5000 and "unknown field 'kkkk" in err and "characters in all" in err


def test_a_hundred_thousand_unknown_fields_give_a_count(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "d.json"
    path.write_text(json.dumps({"engram": {f"f{i}": True for i in range(100_000)}}))
    assert main(["validate", str(path)]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 101
    assert lines[-1] == "error: /: and 99,900 more problems (100,000 in all); fix these first [too-many-problems]"
