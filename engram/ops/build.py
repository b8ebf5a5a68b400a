"""Build a shared library from kernels/ once per source hash and load it with ctypes.

The cache key covers the sources, every header beside them, the command line and the compiler's
version, so an edit or a new toolchain rebuilds and nothing stale is ever loaded. Builds write to a
temporary name and rename, so processes that build at the same time never see half a file."""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

from engram.errors import EngramError
from engram.scratch import reclaim_scratch, scratch_name
from engram.user_cache import cache_subdir

KERNELS = Path(__file__).resolve().parents[1] / "_kernels"  # kernels/ in a checkout (a link), copied in a wheel
BUILD_TIMEOUT_S = 600


def cache_dir() -> Path:
    """Where built libraries go: a directory of the user's cache only they can write (engram.user_cache)."""
    return cache_subdir("build")


def source_digest(sources: list[Path], command: list[str], version: str) -> str:
    digest = hashlib.sha256()
    headers = sorted({h for s in sources for h in s.parent.glob("*.h*")} | set(KERNELS.rglob("*.h*")))
    for path in [*sources, *headers]:
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    digest.update("\0".join(command).encode() + version.encode())
    return digest.hexdigest()


def compiler_version(compiler: str) -> str:
    try:
        done = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise EngramError(f"cannot run {compiler!r}: {exc}; install it or put it on PATH") from None
    if done.returncode != 0:
        raise EngramError(f"{compiler} --version failed: {done.stderr.strip()}")
    return done.stdout


def library_name(name: str, sources: list[Path], compiler: str, flags: list[str]) -> str:
    """`lib{name}-{digest}.so`: the cache's name for this build of these sources."""
    return f"lib{name}-{source_digest(sources, [compiler, *flags], compiler_version(compiler))[:20]}.so"


def build_library(name: str, sources: list[Path], compiler: str, flags: list[str]) -> Path:
    """Path of the built library `lib{name}-{digest}.so`, compiling it if the cache lacks it."""
    command = [compiler, *flags]
    target = cache_dir() / library_name(name, sources, compiler, flags)
    if target.exists():
        return target
    reclaim_scratch(target.parent)  # what a build killed half-way left
    tmp = str(target.parent / scratch_name(target.name, ".so"))
    try:
        done = subprocess.run(
            [*command, "-o", tmp, *map(str, sources)],
            capture_output=True,
            text=True,
            timeout=BUILD_TIMEOUT_S,
            check=False,
        )
        if done.returncode != 0:
            raise EngramError(f"building {name} failed ({' '.join(command)}):\n{done.stderr.strip()}")
        os.replace(tmp, target)
    except subprocess.TimeoutExpired:
        raise EngramError(f"building {name} took longer than {BUILD_TIMEOUT_S} s") from None
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target
