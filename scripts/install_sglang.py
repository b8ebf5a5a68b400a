"""Install one SGLang release into the running Python (a venv of its own) for `make test-sglang`, which
runs SGLang's own Engram classes beside engram's on the CPU. The registry has no CPU build of SGLang, and
its full requirements pull GPU kernel packages that do nothing here, so SGLang goes in without its
dependencies, then torch (the CUDA build SGLang pins; it runs on the CPU) and what SGLang's Engram
modules, its DeepSeek V4 and Qwen4Exp models and its plugin loader import, each at SGLang's own pin where
it pins one. Triton comes with torch; SGLang's kernels run under TRITON_INTERPRET=1.

    python scripts/install_sglang.py 0.5.23
"""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys

# What `import sglang.srt.layers.engram, ...engram_staging, ...models.deepseek_v4, ...models.qwen4_exp,
# ...models.qwen4_exp_ple_table, ...plugins` needs beside torch (found by importing them in a bare venv).
IMPORTED = [
    "numpy", "msgspec", "pydantic", "aiohttp", "apache-tvm-ffi", "transformers", "tokenizers", "torchvision",
    "sentencepiece", "compressed-tensors", "gguf", "openai", "partial-json-parser", "einops", "ipython",
    "orjson", "pybase64", "pyzmq", "pillow", "psutil", "requests", "regex", "tqdm", "pyyaml", "dill", "fastapi",
]  # fmt: skip


def pip(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", *args], check=True, timeout=3600)


def pinned(requirements: list[str], name: str) -> str:
    """SGLang's requirement of `name` (its pin, markers dropped), or the bare name where it has none."""
    for requirement in requirements:
        head = requirement.split(";")[0].strip()
        found = re.match(r"([A-Za-z0-9_.\-]+)(\[[^\]]*\])?\s*(.*)", head)
        if found and found[1].lower().replace("_", "-") == name and "extra ==" not in requirement:
            return name + found[3].replace(" ", "")
    return name


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: install_sglang.py VERSION", file=sys.stderr)
        return 2
    pip("--no-deps", f"sglang=={argv[0]}")
    requirements = importlib.metadata.requires("sglang") or []
    torch = pinned(requirements, "torch")
    pip(torch)  # first, and held to in what follows: nothing may pull another build
    pip(torch, *(pinned(requirements, name) for name in IMPORTED))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
