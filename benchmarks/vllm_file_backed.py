"""Start to first lookup under vLLM 0.33's loader, one process: a DeepSeek V4.1 Engram table of --table-gb
(default 1 GiB, fp8 rows with ue8m0 scales) built by Engram._create_embedding, its tensors read through
safetensors' safe_open as vLLM's default iterator reads them and handed to the table's weight loaders, then
one lookup of 64 tokens. vLLM's own table (the plugin loaded, engram not enabled: a host tensor the loader
copies every row into) against engram's file-backed table (the checkpoint's own pages: the loader copies
nothing), alternating, each --repeat times, with the page cache warm and dropped (posix_fadvise DONTNEED)
before each run. Also the private (anonymous) memory each start added: the load copy. Page-cache pages a
lookup maps are not counted (they are the node's one shared copy; the kernel's fault-around maps up to 16
resident neighbours per fault). Needs vLLM: run by the vLLM venv's Python (`make bench-vllm`).
Run: .venv-vllm/bin/python benchmarks/vllm_file_backed.py [--table-gb N] [--repeat N] [--json]
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from pathlib import Path

import torch
from _scratch import scratch_dir
from _timing import print_table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.vllm.vllm_side: vLLM's state as the tests set it

from engram.integrations.vllm import files
from engram.ngram.spec import ModelSpec
from engram.runtime.checkpoints.writer import hf_config, write_checkpoint
from engram.runtime.placement.residency import drop_file_cache
from tests.vllm.vllm_side import deepseek_config, deepseek_state

ROW_BYTES = 512 + 16  # a 512-wide fp8 row and its 16 ue8m0 scales


def spec_for(table_gb: float) -> ModelSpec:
    heads = 2 * 8  # orders 2 and 3, 8 heads each: one table of their rows
    vocab = max(1000, int(table_gb * 2**30 / ROW_BYTES / heads))
    fields = {
        "engram_layer_ids": [1],
        "engram_max_ngram_size": 3,
        "engram_n_heads": 8,
        "engram_head_dim": 512,
        "engram_vocab_size": vocab,
        "engram_compressed_vocab_size": 1000,
        "engram_pad_token_id": 2,
    }
    return ModelSpec("bench", "DeepseekV41ForCausalLM", fields, dtype="fp8")


def private_bytes() -> int:
    """This process's anonymous resident memory (RssAnon): what a load copy adds."""
    with open("/proc/self/status") as status:
        line = next(line for line in status if line.startswith("RssAnon:"))
    return int(line.split()[1]) * 1024


def start(path: Path, hf: dict, ids: torch.Tensor, file_backed: bool) -> tuple[float, int, torch.Tensor]:
    """Seconds from nothing to the first lookup's rows, the private memory it added, and the rows."""
    import vllm.models.deepseek_v41.common.engram as engram
    from safetensors import safe_open
    from vllm.transformers_utils.configs.deepseek_v41 import DeepseekV41Config

    additional = {"engram": {"file_backed": True}} if file_backed else {}
    current = deepseek_config(str(path), additional, cpu_offload=file_backed)
    before = private_bytes()
    began = time.perf_counter()
    with deepseek_state(current, 1, 0):
        layout = engram.EngramLayout(DeepseekV41Config(text_config=hf))
        table = engram.Engram._create_embedding(None, layout, 0)
        with safe_open(str(path / "model.safetensors"), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 (safe_open's keys() is not a dict's)
                param = {
                    "layers.1.engram.embed.weight": table.weight,
                    "layers.1.engram.embed.scale": table.weight_scale_inv,
                }.get(name)
                if param is not None:
                    param.weight_loader(param, f.get_tensor(name))
        rows = torch.zeros(ids.shape[0], table.part_n_hash_cols, table.dim, dtype=torch.bfloat16)
        table.lookup(ids, rows)
    seconds = time.perf_counter() - began
    added = private_bytes() - before
    del table
    gc.collect()
    files.forget_checkpoints()
    return seconds, added, rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--table-gb", type=float, default=1.0)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    from vllm.plugins import DEFAULT_PLUGINS_GROUP, load_plugins_by_group

    for func in load_plugins_by_group(DEFAULT_PLUGINS_GROUP).values():  # engram's entry point among them
        func()
    spec = spec_for(args.table_gb)
    results = []
    with scratch_dir() as tmp:
        path = Path(tmp)
        write_checkpoint(spec, path, seed=3)
        hf = hf_config(spec, "fp8", 3)["text_config"]
        ids = spec.hasher().hash(torch.randint(0, spec.vocab, (64,), generator=torch.Generator().manual_seed(1)))[:, 0]
        table_bytes = (path / "model.safetensors").stat().st_size
        for cache in ("warm", "cold"):
            runs: dict[str, list[tuple[float, int]]] = {"vllm": [], "file": []}
            reference = None
            for _ in range(args.repeat):
                for mode in ("vllm", "file"):
                    if cache == "cold":
                        drop_file_cache(path / "model.safetensors")
                    seconds, added, rows = start(path, hf, ids, mode == "file")
                    if reference is None:
                        reference = rows
                    assert torch.equal(rows.view(torch.int16), reference.view(torch.int16)), "file-backed rows differ"
                    runs[mode].append((seconds, added))
            theirs = statistics.median(s for s, _ in runs["vllm"])
            ours = statistics.median(s for s, _ in runs["file"])
            results.append(
                {
                    "page_cache": cache,
                    "table_bytes": table_bytes,
                    "vllm_s": theirs,
                    "file_backed_s": ours,
                    "speedup": theirs / ours,
                    "vllm_rss_added": statistics.median(a for _, a in runs["vllm"]),
                    "file_backed_rss_added": statistics.median(a for _, a in runs["file"]),
                }
            )
    if args.json:
        print(json.dumps(results, indent=2))
        return
    print(f"start to first lookup, one {table_bytes / 2**30:.2f} GiB table, median of {args.repeat}:")
    print_table(
        ["page cache", "vLLM's load s", "file-backed s", "speed-up", "vLLM private added", "file-backed private added"],
        [
            [
                r["page_cache"],
                f"{r['vllm_s']:.3f}",
                f"{r['file_backed_s']:.4f}",
                f"{r['speedup']:.0f}x",
                f"{r['vllm_rss_added'] / 2**20:,.0f} MiB",
                f"{r['file_backed_rss_added'] / 2**20:,.1f} MiB",
            ]
            for r in results
        ],
    )


if __name__ == "__main__":
    main()
