"""engram profile --text: a user's own text (plain and JSON Lines) replayed through the tiers. Token counts
against the tokenizer's own encoding, lookups against the layout, static hits against a plain Python
count of the hashed ids, and online hits against the runtime's own tier (Table.lookup) fed the same
steps; bad input gets one line naming what to change."""

from __future__ import annotations

import json
import os
import sysconfig
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch

from engram.apps import replay as replay_module
from engram.apps.presets import get_preset
from engram.apps.replay import STEP_TOKENS
from engram.cli import main
from engram.ngram.vocab import deepseek_v4_tokenizer
from engram.runtime.checkpoints.loader import Checkpoint
from engram.runtime.checkpoints.writer import write_checkpoint
from engram.runtime.lookup.file import FileReader
from engram.runtime.plan import table_shards
from engram.runtime.rank_tables import open_tables
from engram.runtime.table import Table, read_profile
from engram.runtime.tiers.budget import WINDOW_IDS, state_bytes
from engram.runtime.tiers.device import DeviceTier
from engram.runtime.tiers.ram import RamTier
from tests.runtime.shards import random_shard

TINY = get_preset("tiny")
STDLIB = Path(sysconfig.get_paths()["stdlib"])


@pytest.fixture(scope="module")
def texts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Served: Python code as plain text, then prose as JSON Lines (prompt and text fields); fit: code."""
    out = tmp_path_factory.mktemp("traffic")
    code = "".join((STDLIB / name).read_text() for name in ("argparse.py", "typing.py"))
    fit = (STDLIB / "inspect.py").read_text()
    prose = [f"{p.strip()}\n" for p in (STDLIB / "this.py").read_text().split("\n") if p.strip()] * 3
    prose += [doc for doc in (json.__doc__ or "", os.__doc__ or "", Path.__doc__ or "") if doc]
    (out / "code.txt").write_text(code)
    (out / "fit.py").write_text(fit)
    lines = [json.dumps({"prompt": t} if i % 2 else {"text": t, "id": i}) for i, t in enumerate(prose)]
    (out / "chat.jsonl").write_text("\n".join(lines) + "\n\n")
    tokenizer = deepseek_v4_tokenizer()

    def count(text: str) -> int:
        return len(tokenizer.encode(text, add_special_tokens=False).ids)

    return {"dir": out, "code": count(code), "prose": sum(count(t) for t in prose), "prose_texts": prose}


def run_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    assert main(["profile", "--preset", "tiny", *args, "--json"]) == 0
    report: dict[str, Any] = json.loads(capsys.readouterr().out)
    return report


def hashed(tokens: torch.Tensor) -> list[torch.Tensor]:
    rows = TINY.hasher().hash(TINY.compress(tokens))
    return [rows[:, layer] for layer in range(rows.shape[1])]  # tiny: one table per layer


@pytest.mark.parametrize("chunk", [replay_module.CHUNK_TOKENS, STEP_TOKENS])
def test_replay_of_plain_text_and_json_lines(
    capsys: pytest.CaptureFixture[str], texts: dict[str, Any], monkeypatch: pytest.MonkeyPatch, chunk: int
) -> None:
    """The stream is hashed a chunk at a time (the hash's state carried across): with chunks of one step
    the hits are those of the whole stream hashed at once, here."""
    monkeypatch.setattr(replay_module, "CHUNK_TOKENS", chunk)
    d = texts["dir"]
    report = run_json(
        capsys, "--text", str(d / "code.txt"), str(d / "chat.jsonl"), "--fit", str(d / "fit.py"),
        "--cache-fraction", "0.05", "--window-tokens", "4096",
    )  # fmt: skip
    assert report["files"] == [
        {"path": str(d / "code.txt"), "tokens": texts["code"]},
        {"path": str(d / "chat.jsonl"), "tokens": texts["prose"]},
    ]
    total = texts["code"] + texts["prose"]
    assert [(r["policy"], r["tier"], r["cache_fraction"]) for r in report["results"]] == [
        ("online", "device", 0.05),
        ("static", "device", 0.05),
    ]
    columns = TINY.layout.columns * len(TINY.layout.table_of_layer)
    for result in report["results"]:
        windows = result["windows"]
        assert sum(w["tokens"] for w in windows) == total and all(w["tokens"] == 4096 for w in windows[:-1])
        assert all(w["lookups"] == w["tokens"] * columns and 0 <= w["hits"] <= w["lookups"] for w in windows)
    # the oracle: the same text tokenized and hashed here, counted in plain Python
    tokenizer = deepseek_v4_tokenizer()
    served = torch.tensor(
        tokenizer.encode((d / "code.txt").read_text(), add_special_tokens=False).ids
        + [i for t in texts["prose_texts"] for i in tokenizer.encode(t, add_special_tokens=False).ids]
    )
    fit = torch.tensor(tokenizer.encode((d / "fit.py").read_text(), add_special_tokens=False).ids)
    for result in report["results"]:
        hot_sets = []
        for table, (stream, fitted) in enumerate(zip(hashed(served), hashed(fit), strict=True)):
            rows = int(result["cache_fraction"] * TINY.layout.table_rows[table])
            assert result["rows"][TINY.table_names()[table]] == rows
            ranked = sorted(Counter(fitted.reshape(-1).tolist()).items(), key=lambda kv: (-kv[1], kv[0]))
            hot_sets.append((stream, [r for r, _ in ranked[:rows]], [c for _, c in ranked[:rows]], rows))
        hits = sum(w["hits"] for w in result["windows"])
        if result["policy"] == "static":
            assert hits == sum(int(torch.isin(s, torch.tensor(h)).sum()) for s, h, _, _ in hot_sets)
            continue
        served_hits = 0  # the runtime's own tier, fed the same steps and warmed from the same rows
        for table, (stream, hot, counts, rows) in enumerate(hot_sets):
            shard = random_shard(TINY.layout.table_rows[table], "fp8", table, dim=32)
            runtime = Table(shard, shard.rows)
            runtime.tier = DeviceTier(shard, rows, "cpu")
            runtime.tier.warm(torch.tensor(hot), torch.tensor(counts))
            for step in torch.split(stream, STEP_TOKENS):
                runtime.lookup(step)
            stats = runtime.tier.stats()
            assert stats.refreshes >= 1 and stats.lookups == stream.numel() > WINDOW_IDS
            served_hits += stats.hits
        assert hits == served_hits


def test_the_ram_tier_replay_hits_what_a_file_backed_table_serves(
    capsys: pytest.CaptureFixture[str],
    texts: dict[str, Any],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    memory_short: None,
) -> None:
    """--tier ram replays the RAM tier (admitting after every lookup): its hits equal those of the
    runtime's own RAM tier over the tables mapped from a checkpoint on disk, fed the same steps (each
    read in one batch) and warmed from the same rows."""
    d = texts["dir"]
    report = run_json(
        capsys, "--text", str(d / "chat.jsonl"), "--fit", str(d / "fit.py"), "--cache-fraction", "0.02",
        "--tier", "device", "ram", "--policy", "online",
    )  # fmt: skip
    assert [(r["policy"], r["tier"]) for r in report["results"]] == [("online", "device"), ("online", "ram")]
    ram = report["results"][1]
    tokenizer = deepseek_v4_tokenizer()
    served = torch.tensor([i for t in texts["prose_texts"] for i in tokenizer.encode(t, add_special_tokens=False).ids])
    fit = torch.tensor(tokenizer.encode((d / "fit.py").read_text(), add_special_tokens=False).ids)
    write_checkpoint(TINY, tmp_path, seed=3)
    monkeypatch.setattr(FileReader, "batch_rows", 1 << 20)
    tables = open_tables(TINY, Checkpoint(tmp_path), "file", plans=table_shards(TINY, 0, 1), progress=False)
    served_hits = 0
    for table, (shard, stream, fitted) in enumerate(zip(tables, hashed(served), hashed(fit), strict=True)):
        rows = ram["rows"][TINY.table_names()[table]]
        ranked = sorted(Counter(fitted.reshape(-1).tolist()).items(), key=lambda kv: (-kv[1], kv[0]))[:rows]
        runtime = Table(shard, shard.rows)
        budget = rows * shard.format.row_bytes + state_bytes(rows, shard.rows, 0, "online", eager=True)
        hot, counts = torch.tensor([r for r, _ in ranked]), torch.tensor([c for _, c in ranked])
        assert runtime.keep_hot(budget, "cpu", "ram", hot=hot, hot_counts=counts) == rows
        for step in torch.split(stream, STEP_TOKENS):
            runtime.lookup(step)
        assert isinstance(runtime.tier, RamTier)
        served_hits += runtime.tier.stats().hits
        runtime.release()
    assert sum(w["hits"] for w in ram["windows"]) == served_hits > 0


def test_profile_text_output_plot_and_profile(
    capsys: pytest.CaptureFixture[str], texts: dict[str, Any], tmp_path: Path
) -> None:
    d = texts["dir"]
    plot, out = tmp_path / "curve.png", tmp_path / "hot.safetensors"
    args = ["--text", str(d / "chat.jsonl"), "--cache-fraction", "0.1", "--plot", str(plot), "--out", str(out)]
    assert main(["profile", "--preset", "tiny", *args, "--fit", str(d / "fit.py")]) == 0
    printed = capsys.readouterr().out
    assert f"tiny: {texts['prose']:,} tokens of 1 file(s) replayed in order" in printed
    assert "online device: " in printed and "static device: " in printed
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    hot = read_profile(out)  # the fit text's hottest rows, as `engram profile --out` writes them
    assert sorted(hot) == sorted(TINY.table_names())
    assert all(hot[n].numel() == int(0.1 * r) for n, r in zip(TINY.table_names(), TINY.layout.table_rows, strict=True))
    assert main(["profile", "--preset", "tiny", "--text", str(d / "chat.jsonl"), "--cache-fraction", "0.1", "0.3"]) == 0
    printed = capsys.readouterr().out
    assert "static" not in printed and printed.count("online device: ") == 2  # no --fit: online only, per budget
    assert "tiers of 10.00% of each table's rows" in printed and "tiers of 30.00% of each table's rows" in printed


@pytest.mark.parametrize(
    ("content", "args", "message"),
    [
        ('{"text": "a"}\n[1, 2]\n', ("--text", "{path}"), "{path}:2: not a JSON object; JSON Lines hold one object a line"),
        ('{"text": "a"}\n{"body": "b"}\n', ("--text", "{path}"), "{path}:2: the object has no string field 'prompt' or 'text'"),
        ("", ("--text", "{path}"), "--text: no tokens in {path}"),
        ('{"text": "a"}\n', ("--text", "{path}", "--policy", "static"), "--policy static keeps the rows most frequent in the fit text: give it with --fit FILE"),
        ('{"text": "a"}\n', ("--fit", "{path}"), "--fit and --policy replay your own text: give it with --text FILE"),
    ],
)  # fmt: skip
def test_bad_traffic_is_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, content: str, args: tuple[str, ...], message: str
) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text(content)
    assert main(["profile", "--preset", "tiny", *(a.format(path=path) for a in args)]) == 2
    assert capsys.readouterr().err == f"error: {message.format(path=path)}\n"


def test_a_fifo_or_a_missing_file_is_named(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    fifo = tmp_path / "stream"
    os.mkfifo(fifo)
    assert main(["profile", "--preset", "tiny", "--text", str(fifo)]) == 2
    assert capsys.readouterr().err == f"error: the text file {fifo} is a FIFO; it must be a regular file\n"
    missing = tmp_path / "missing.txt"
    assert main(["profile", "--preset", "tiny", "--text", str(missing)]) == 2
    assert capsys.readouterr().err == f"error: the text file {missing} cannot be read: No such file or directory\n"
    assert main(["profile", "--preset", "qwen4-exp-ple", "--text", str(missing)]) == 2
    assert capsys.readouterr().err == (
        "error: qwen4-exp-ple's tokenizer is not bundled: pass --tokenizer FILE (the model's tokenizer.json)\n"
    )


def test_a_replay_that_would_not_fit_is_refused_with_its_figure_before_reading(
    capsys: pytest.CaptureFixture[str], texts: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Sized first: RAM tiers of every row of deepseek-v4.1-flash's tables need their index of at least 8
    bytes a row, more than the memory free; refused with both figures, no text read and no traceback."""
    free = 3 << 30
    monkeypatch.setattr("engram.commands.profile.free_bytes_now", lambda: free)
    missing = texts["dir"] / "never-read.txt"  # refused before the text is opened
    argv = [
        "profile",
        "--preset",
        "deepseek-v4.1-flash",
        "--text",
        str(missing),
        "--tier",
        "ram",
        "--cache-fraction",
        "1",
    ]
    assert main(argv) == 2
    [line] = capsys.readouterr().err.splitlines()
    prefix = "error: --text: replaying tiers of 1 of each table (ram, online) needs "
    assert line.startswith(prefix) and line.endswith(
        " GiB at once and 3.0 GiB is free; give a smaller --cache-fraction, or fewer of --tier and --policy at a time"
    ), line
    needed = float(line[len(prefix) :].split(" GiB")[0])
    assert needed * (1 << 30) >= 8 * sum(get_preset("deepseek-v4.1-flash").layout.table_rows)


def test_a_fit_text_whose_counts_outgrow_memory_is_refused_with_its_figure(
    capsys: pytest.CaptureFixture[str], texts: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    d = texts["dir"]
    monkeypatch.setattr(replay_module, "CHUNK_TOKENS", STEP_TOKENS)
    tiers = replay_module.replay_bytes(TINY, [0.01], ["online", "static"], ["device"], WINDOW_IDS)
    monkeypatch.setattr("engram.commands.profile.free_bytes_now", lambda: tiers + 4096)  # 256 rows' counts
    argv = ["profile", "--preset", "tiny", "--text", str(d / "code.txt"), "--fit", str(d / "fit.py")]
    argv += ["--cache-fraction", "0.01"]
    code = main(argv)
    err = capsys.readouterr().err
    assert (
        code == 2
        and err.startswith("error: --fit: counting its rows takes more than ")
        and err.endswith("; give a shorter --fit text or a smaller --max-tokens\n")
    ), err
