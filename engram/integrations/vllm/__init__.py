"""engram inside vLLM (0.32, 0.33 and 0.34): a `vllm.general_plugins` entry point that serves Qwen4Exp's PLE
tables and DeepSeek V4.1's Engram tables from engram's storage and lookups. vLLM keeps hashing (its ids
equal engram's); only where the rows live and how they are gathered move.

vLLM loads the entry point in every process it starts, before any model is built, and lets an exception
from it stop that process; `register` therefore never raises. On a vLLM it supports it swaps the Qwen
table classes by name (PluggableLayer's out-of-tree registry) and routes DeepSeek's one table factory
(Engram._create_embedding) through engram's, all or nothing, safe to run more than once. The swapped
classes behave exactly as vLLM's own unless engram is enabled for the model being built:
`--additional-config '{"engram": {...}}'`, or the JSON in ENGRAM_VLLM_CONFIG. The section is checked by
engram's schema with vLLM's own Engram fields beside it when vLLM creates its engine config (before any
worker starts), so a mistake is one line naming the field. On any other vLLM (another version, or
internals engram does not find) engram leaves vLLM exactly as it is, logs one warning naming the version,
and an engram section there is that one-line config error.

Nothing here has run on a GPU yet: the GPU paths compile and their CPU twins are tested."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable

from engram.integrations.entry_points import serve_or_stand_aside, version_numbers

log = logging.getLogger("engram")
SUPPORTED = ("0.32", "0.33", "0.34")  # vLLM versions (major.minor) whose Engram internals engram serves
_warned: set[str] = set()  # a process says once why engram stands aside


def register() -> None:
    """The entry point: serve vLLM's Engram tables from engram's table layer, or stand aside (module
    docstring). Never raises (entry_points.serve_or_stand_aside); calling it again changes nothing."""
    serve_or_stand_aside("vllm", unsupported, _install, _stand_aside)


def unsupported(version: str) -> str | None:
    """Why engram does not serve tables inside vLLM `version`, or None where it does."""
    numbers = version_numbers(version, 2)
    if numbers is None or ".".join(map(str, numbers)) not in SUPPORTED:
        return f"engram serves vLLM {', '.join(SUPPORTED)} only"
    return None


def _install() -> None:
    """Swap vLLM's table classes for engram's, all of them or none: every vLLM internal engram needs is
    imported before anything changes, and what was changed is undone if a later step fails."""
    from vllm.model_executor.custom_op import op_registry_oot

    from engram.integrations.vllm import deepseek, settings

    undo: list[Callable[[], None]] = []
    try:
        for name, cls in swaps().items():
            if name not in op_registry_oot:
                op_registry_oot[name] = cls
                undo.append(functools.partial(op_registry_oot.pop, name, None))
            elif (theirs := op_registry_oot[name]) is not cls:  # another plugin's: it stays, and engram says
                # it does not serve those tables
                log.warning(
                    "engram: vLLM's %s is already replaced by %s.%s (another plugin), so engram does not serve "
                    "Qwen4Exp's PLE tables of that class in this process; uninstall one of the two plugins",
                    name, theirs.__module__, theirs.__qualname__,
                )  # fmt: skip
        undo.append(deepseek.install())
        undo.append(settings.install_check())
    except BaseException:
        for step in reversed(undo):
            step()
        raise


def swaps() -> dict[str, type]:
    """vLLM's Qwen4Exp table class names -> engram's class for each, as this vLLM has them (0.34's
    disk-offload class where it exists)."""
    from engram.integrations.vllm import qwen

    found: dict[str, type] = {
        "Qwen4ExpPLEDeviceEmbedding": qwen.EngramQwenDeviceEmbedding,
        "Qwen4ExpPLEPinnedHostEmbedding": qwen.EngramQwenPinnedHostEmbedding,
    }
    try:
        import vllm.models.qwen4_exp.nvidia.ngram_embedding as nvidia
    except ImportError:  # a ROCm-only build: no disk offload there
        return found
    if hasattr(nvidia, "Qwen4ExpPLEDiskOffloadEmbedding"):
        from engram.integrations.vllm.qwen_disk import EngramQwenDiskOffloadEmbedding

        found["Qwen4ExpPLEDiskOffloadEmbedding"] = EngramQwenDiskOffloadEmbedding
    return found


def _stand_aside(version: str, problem: str) -> None:
    """Leave vLLM as it is: one warning per process, and an engram section refused where vLLM checks its
    config."""
    refusal = (
        f"vLLM {version} is installed and {problem}, so the engram section cannot be served here; install one of "
        f"vLLM {', '.join(SUPPORTED)} beside engram, or remove the engram section (and ENGRAM_VLLM_CONFIG)"
    )
    try:
        from engram.integrations.vllm import settings

        settings.install_check(refusal)
        consequence = "an engram section is refused"
    except BaseException:  # a vLLM without the hook: it runs as if engram were not installed
        consequence = "an engram section would be ignored"
    if version in _warned:
        return
    _warned.add(version)
    log.warning("engram: vLLM %s is installed and %s; engram leaves vLLM as it is (%s)", version, problem, consequence)
