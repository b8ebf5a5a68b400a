"""Checkpoint loading: exact bytes, lazy row shards, and clear errors for bad files."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from engram.cli import main
from engram.errors import EngramError
from engram.ops import gather, gather_reference
from engram.ops.formats import FORMATS
from engram.runtime.checkpoints.loader import Checkpoint, SafetensorsFile, load_shards
from engram.runtime.checkpoints.quantize import quantize_fp8
from engram.runtime.checkpoints.writer import synthetic_table, write_checkpoint
from engram.runtime.placement.storage import allocate
from engram.runtime.rank_tables import open_tables
from engram.runtime.shard import ShardFormat
from tests.runtime.specs import QWEN, SMALL


def shards_for(
    rows_by_name: dict[str, int], dim: int = 32, dtype: str = "fp8", row_range: tuple[int, int] | None = None
) -> list:  # type: ignore[type-arg]
    out = []
    for name, rows in rows_by_name.items():
        start, stop = row_range or (0, rows)
        out.append(allocate(name, ShardFormat(stop - start, dim, dtype), "host", row_start=start))
    return out


def test_loads_exact_bytes_from_safetensors_and_pt(tmp_path: Path) -> None:
    for fmt in ("safetensors", "pt"):
        path = write_checkpoint(SMALL, tmp_path / fmt, seed=3, fmt=fmt)
        checkpoint = Checkpoint(path.parent)
        rows = dict(zip(SMALL.table_names(), SMALL.layout.table_rows, strict=True))
        shards = shards_for(rows, dim=SMALL.head_dim)
        copied = load_shards(shards, rows, checkpoint, progress=False)
        assert copied == sum(s.format.weight_bytes + s.rows * 4 for s in shards)
        for shard in shards:
            assert torch.equal(
                shard.weight.view(torch.uint8), checkpoint.sources[f"{shard.name}.weight"]().view(torch.uint8)
            )
            assert torch.equal(
                shard.scale.view(torch.uint8), checkpoint.sources[f"{shard.name}.scale"]().view(torch.uint8)
            )


def test_row_shard_copies_only_its_rows(tmp_path: Path) -> None:
    weight = torch.arange(100 * 32, dtype=torch.float32).view(100, 32)
    save_file({"t.weight": weight}, str(tmp_path / "m.safetensors"))
    shard = shards_for({"t": 100}, dtype="fp32", row_range=(40, 70))[0]
    load_shards([shard], {"t": 100}, Checkpoint(tmp_path), progress=False)
    assert torch.equal(shard.weight, weight[40:70])


def test_synthetic_checkpoint_is_deterministic_and_dequantises(tmp_path: Path) -> None:
    a = write_checkpoint(SMALL, tmp_path / "a", seed=1)
    b = write_checkpoint(SMALL, tmp_path / "b", seed=1)
    c = write_checkpoint(SMALL, tmp_path / "c", seed=2)
    assert a.read_bytes() == b.read_bytes() != c.read_bytes()
    config = json.loads((tmp_path / "a" / "config.json").read_text())
    assert config["architectures"] == ["DeepseekV41ForCausalLM"] and config["text_config"]["engram_layer_ids"] == [1, 3]
    values = torch.randn(4, 64) * 3
    q, s = quantize_fp8(values)
    restored = q.float().view(4, 2, 32) * s.float()[:, :, None]
    assert torch.allclose(restored.view(4, 64), values, rtol=0.07, atol=1e-6)
    assert torch.all(q.float().abs() <= 448)


@pytest.fixture
def one_table(tmp_path: Path) -> Path:
    save_file(
        {
            "t.weight": torch.zeros(10, 32, dtype=torch.float8_e4m3fn),
            "t.scale": torch.ones(10, 1).to(torch.float8_e8m0fnu),
        },
        str(tmp_path / "m.safetensors"),
    )
    return tmp_path / "m.safetensors"


def test_truncated_file(one_table: Path) -> None:
    data = one_table.read_bytes()
    one_table.write_bytes(data[:-5])
    with pytest.raises(
        EngramError, match=r"m.safetensors: truncated: tensor 't.weight' ends at byte [\d,]+ but the file has [\d,]+"
    ):
        Checkpoint(one_table)
    one_table.write_bytes(data[:20])
    with pytest.raises(EngramError, match="does not fit a 20-byte file"):
        Checkpoint(one_table)
    one_table.write_bytes(b"\x01\x00")
    with pytest.raises(EngramError, match="only 2 bytes: too short for a safetensors header"):
        SafetensorsFile(one_table)


def test_malformed_header(tmp_path: Path) -> None:
    path = tmp_path / "bad.safetensors"
    header = b'{"t.weight": {"dtype": "F8_E4M3", "shape": [10, 32], "data_offsets": [0, 100]}}'
    path.write_bytes(len(header).to_bytes(8, "little") + header + bytes(320))
    with pytest.raises(
        EngramError, match=r"tensor 't.weight': data_offsets \[0, 100\] do not hold \[10, 32\] x F8_E4M3"
    ):
        Checkpoint(path)
    header = b"not json"
    path.write_bytes(len(header).to_bytes(8, "little") + header)
    with pytest.raises(EngramError, match="header is not valid JSON"):
        Checkpoint(path)


PARTS = {
    "weight": lambda rows: torch.zeros(rows, 32, dtype=torch.float8_e4m3fn),
    "scale": lambda rows: torch.zeros(rows, 1, dtype=torch.float8_e8m0fnu),
}


def test_split_parts_load_like_one_tensor(tmp_path: Path) -> None:
    """vLLM's `shard_{k}` parts (Qwen4Exp's split_ngram_parts: ceil(10 / 3) = 4 rows each, the last 2, and a
    trailing empty part) load into every row shard exactly as the whole table does."""
    whole = synthetic_table(10, 32, "fp8", seed=3)
    parts = {
        f"t.shard_{k}.{p}": tensor[4 * k : 4 * k + 4].contiguous() for k in range(4) for p, tensor in whole.items()
    }
    save_file(parts, str(tmp_path / "split.safetensors"))
    torch.save(parts, tmp_path / "split.pt")
    for file in ("split.safetensors", "split.pt"):
        for start, stop in ((0, 10), (3, 9), (8, 10)):
            [shard] = shards_for({"t": 10}, row_range=(start, stop))
            load_shards([shard], {"t": 10}, Checkpoint(tmp_path / file), progress=False)
            assert torch.equal(shard.weight.view(torch.uint8), whole["weight"][start:stop].view(torch.uint8))
            assert torch.equal(shard.scale.view(torch.uint8), whole["scale"][start:stop].view(torch.uint8))


@pytest.mark.parametrize(
    ("tensors", "message"),
    [
        (
            {"t.weight": torch.zeros(11, 32, dtype=torch.float8_e4m3fn)},
            r"t.weight has shape \[11, 32\], the model needs \[10, 32\]",
        ),
        (
            {"t.weight": torch.zeros(10, 32, dtype=torch.bfloat16)},
            "t.weight has dtype torch.bfloat16, the model needs torch.float8_e4m3fn",
        ),
        (
            {"other": torch.zeros(1)},
            r"t.weight is missing \(nor is it split into t.shard_<k>.weight parts\); t.scale is missing",
        ),
        (
            {f"t.shard_{k}.{p}": PARTS[p](4 if k < 2 else 2) for k in (0, 2) for p in PARTS},
            r"t.shard_1.weight is missing: the parts of 4 rows must cover all 10; t.shard_1.scale is missing",
        ),
        (
            {f"t.shard_{k}.{p}": PARTS[p](4 if k < 2 else 3) for k in (0, 1, 2) for p in PARTS},
            r"t.shard_2.weight has shape \[3, 32\], the model needs \[2, 32\]",
        ),
        (  # one problem however many parts are missing (a 1-row part 0 of a huge table is not a huge list)
            {f"t.shard_0.{p}": PARTS[p](1) for p in PARTS},
            r"t.shard_1.weight is missing \(and 8 more\): the parts of 1 rows must cover all 10",
        ),
        (
            {f"t.shard_{k}.{p}": PARTS[p](4) for k in (1, 2) for p in PARTS},
            r"t.shard_0.weight is missing: the parts of t.weight must start at part 0",
        ),
        (  # a one-dimensional part 0 sizes no part: one short problem, not one for each part after it
            {"t.shard_0.weight": torch.zeros(128, dtype=torch.float8_e4m3fn), "t.scale": PARTS["scale"](10)},
            r"t.shard_0.weight has shape \[128\]; parts are \[rows, 32\] tensors$",
        ),
        (  # many wrong parts: three named, the others counted
            {f"t.shard_{k}.weight": torch.zeros(1, 32) for k in range(10)} | {"t.scale": PARTS["scale"](10)},
            r"t.shard_0.weight has dtype torch.float32, the model needs torch.float8_e4m3fn; "
            r"t.shard_1.weight has dtype torch.float32, the model needs torch.float8_e4m3fn; "
            r"t.shard_2.weight has dtype torch.float32, the model needs torch.float8_e4m3fn; and 7 more parts like these$",
        ),
    ],
)
def test_shape_dtype_and_missing(tmp_path: Path, tensors: dict[str, torch.Tensor], message: str) -> None:
    save_file(tensors, str(tmp_path / "m.safetensors"))
    shard = shards_for({"t": 10})[0]
    with pytest.raises(EngramError, match="checkpoint does not match the model: " + message):
        load_shards([shard], {"t": 10}, Checkpoint(tmp_path), progress=False)
    assert int(shard.weight.view(torch.uint8).sum()) == 0  # nothing was copied


class Payload:
    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (os.system, ("echo pwned > /dev/null",))


def test_pickle_bearing_pt_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "evil.pt"
    torch.save({"t.weight": torch.zeros(2), "extra": Payload()}, path)
    with pytest.raises(
        EngramError, match=r"evil.pt: holds pickled objects other than tensors, refused \(weights_only\)"
    ):
        Checkpoint(path)


def test_corrupt_pt(tmp_path: Path) -> None:
    path = tmp_path / "broken.pt"
    torch.save({"t.weight": torch.zeros(1000)}, path)
    path.write_bytes(path.read_bytes()[:300])
    with pytest.raises(EngramError, match=r"broken.pt: not a readable .pt checkpoint \(truncated or corrupt\)"):
        Checkpoint(path)


def test_missing_and_empty_checkpoint(tmp_path: Path) -> None:
    with pytest.raises(EngramError, match="does not exist"):
        Checkpoint(tmp_path / "nope")
    with pytest.raises(EngramError, match=r"holds no \*.safetensors, \*.pt or \*.bin file"):
        Checkpoint(tmp_path)


def test_make_checkpoint_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["make-checkpoint", "--preset", "tiny", "--out", str(tmp_path), "--dtype", "bf16", "--seed", "5"]) == 0
    assert capsys.readouterr().out == (
        f"wrote {tmp_path / 'model.safetensors'} ({(tmp_path / 'model.safetensors').stat().st_size:,} bytes)\n"
        "note: vLLM 0.33 cannot load this checkpoint: its DeepSeek V4.1 tables are always fp8 with ue8m0 block scales, not bf16\n"
        "note: vLLM 0.33 cannot load this checkpoint: it reads one engram_vocab_size for every order, not the per-order list [1000, 1500]\n"
    )
    config = json.loads((tmp_path / "config.json").read_text())
    assert (config["model_type"], config["engram_checkpoint_seed"], config["engram_dtype"]) == (
        "deepseek_v41",
        5,
        "bf16",
    )
    assert config["text_config"]["engram_num_embeddings"] == [10_170, 10_380]
    assert "engram_seed" not in config["text_config"]  # the fill seed is not the hash's seed
    checkpoint = Checkpoint(tmp_path)
    assert sorted(checkpoint.shapes) == ["layers.1.engram.embed.weight", "layers.3.engram.embed.weight"]
    assert checkpoint.shapes["layers.1.engram.embed.weight"] == ((10_170, 32), torch.bfloat16)
    assert main(["make-checkpoint", "--preset", "deepseek-v4.1-flash", "--out", str(tmp_path / "big")]) == 2
    assert "deepseek-v4.1-flash in fp8 needs 202,758,032,400 bytes on disk but only" in capsys.readouterr().err


def test_qwen_checkpoint_in_vllm_naming_split_into_parts(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A Qwen4Exp checkpoint as vLLM 0.33 names it: one table per PLE layer on `layers.{L-1}`, split into
    `shard_{k}` parts, with the hash buffers beside it. It loads equal to the whole tables; a hash buffer
    that differs from the config's derivation is refused before any table is allocated."""
    whole = write_checkpoint(QWEN, tmp_path / "whole", seed=4)
    parts = write_checkpoint(QWEN, tmp_path / "parts", seed=4, split_parts=5)
    names = sorted(Checkpoint(parts).shapes)
    prefix = "model.language_model.layers"
    assert names[:4] == [
        f"{prefix}.0.ple.ple_embedding.layer_multipliers",
        f"{prefix}.0.ple.ple_embedding.ngram_embedding.shard_0.weight",
        f"{prefix}.0.ple.ple_embedding.ngram_embedding.shard_1.weight",
        f"{prefix}.0.ple.ple_embedding.ngram_embedding.shard_2.weight",
    ]
    assert json.loads((tmp_path / "parts" / "config.json").read_text())["split_ngram_parts"] == 5
    for a, b in zip(
        open_tables(QWEN, Checkpoint(whole), "host"), open_tables(QWEN, Checkpoint(parts), "host"), strict=True
    ):
        assert torch.equal(a.weight, b.weight) and a.rows == b.rows
    tampered = {name: Checkpoint(parts).sources[name]() for name in names}
    tampered[f"{prefix}.1.ple.ple_embedding.layer_multipliers"][0] += 2
    save_file(tampered, str(tmp_path / "parts" / "model.safetensors"))
    with pytest.raises(
        EngramError, match=rf"{prefix}.1.ple.ple_embedding.layer_multipliers differs from what the config derives"
    ):
        open_tables(QWEN, Checkpoint(parts), "host")
    assert main(["make-checkpoint", "--preset", "tiny", "--out", str(tmp_path / "x"), "--split-parts", "0"]) == 2
    assert "split parts must be between 1 and 1048576, got 0" in capsys.readouterr().err


@pytest.mark.parametrize("dtype", ["fp8-table", "nvfp4"])
def test_qwen_scaled_tables_load_and_read_like_vllm_names_them(dtype: str, tmp_path: Path) -> None:
    """Qwen4Exp fp8 (one float32 `weight_scale` a table) and NVFP4 (`weight` packed, e4m3 block-16
    `weight_scale`, float32 `weight_scale_2`): split into parts, loaded into host tables or served in place
    from the file, every placement returns the rows of the whole checkpoint's tensors."""
    spec = dataclasses.replace(QWEN, dtype=dtype)
    whole = Checkpoint(write_checkpoint(spec, tmp_path / "whole", seed=2))
    parts = Checkpoint(write_checkpoint(spec, tmp_path / "parts", seed=2, split_parts=4))
    table = spec.table_names()[1]
    names = {"fp8-table": ["weight", "weight_scale"], "nvfp4": ["weight", "weight_scale", "weight_scale_2"]}[dtype]
    assert sorted(n.removeprefix(table + ".") for n in whole.shapes if n.startswith(table + ".")) == sorted(names)
    f = FORMATS[dtype]
    weight = whole.sources[f"{table}.weight"]()
    scale = whole.sources[f"{table}.{f.scale_name}"]() if f.scale is not None else None
    table_scale = float(whole.sources[f"{table}.{f.table_scale_name}"]())
    rows = spec.layout.table_rows[1]
    ids = torch.tensor([[0, rows - 1, -1], [7, 7, rows // 2]])
    want = gather_reference(weight, scale, ids, 0, rows, torch.bfloat16, table_scale=table_scale)
    assert torch.count_nonzero(want) > 0
    for checkpoint, placement in ((whole, "host"), (parts, "host"), (whole, "file")):
        shard = open_tables(spec, checkpoint, placement, progress=False)[1]
        assert shard.table_scale is not None and float(shard.table_scale[0]) == table_scale
        got = gather(shard.weight, shard.scale, ids, 0, rows, torch.bfloat16, table_scale=float(shard.table_scale[0]))
        assert torch.equal(got, want), placement
    scaleless = {n: whole.sources[n]() for n in whole.shapes if not n.endswith(f.table_scale_name)}
    save_file(scaleless, str(tmp_path / "whole" / "model.safetensors"))
    with pytest.raises(
        EngramError,
        match=rf"{table}.{f.table_scale_name} is missing: the table's {dtype} rows need their float32 scale",
    ):
        open_tables(spec, Checkpoint(tmp_path / "whole"), "host", progress=False)
