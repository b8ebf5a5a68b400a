"""engram inside SGLang (0.5.23): a `sglang.srt.plugins` entry point that serves DeepSeek V4.1's Engram
tables (integrations.sglang.deepseek) and Qwen4Exp's offloaded bf16 PLE tables (integrations.sglang.qwen)
from engram's table layer. SGLang keeps hashing (its ids equal engram's); only where the rows live and how
they are gathered move.

SGLang loads the entry point in every scheduler (TP rank) process before it builds the model, and
`register` never raises there. On a SGLang it serves it REPLACEs the two table classes (TARGETS) with engram's
subclasses through SGLang's HookRegistry (which also rebinds the names where another module imported
them), safe to run more than once; each subclass behaves exactly as SGLang's class unless
ENGRAM_SGLANG_CONFIG enables engram. On any other SGLang engram leaves it as it is and logs one warning
naming the version (an error where ENGRAM_SGLANG_CONFIG is set: that section is not served).

Nothing here has run on a GPU yet: the plugin is tested on the CPU against SGLang's own classes."""

from __future__ import annotations

import logging
import os

from engram.integrations.entry_points import serve_or_stand_aside, version_numbers

log = logging.getLogger("engram")
SUPPORTED = ((0, 5, 23),)  # SGLang versions (major, minor, patch) whose Engram internals engram serves
TARGETS = {
    "deepseek": "sglang.srt.layers.engram.EngramEmbedding",
    "qwen": "sglang.srt.models.qwen4_exp.Qwen4ExpPinnedHostEmbedding",
    "qwen naming": "sglang.srt.models.qwen4_exp.Qwen4ExpNGramEmbedding.__init__",
}
_said: set[str] = set()  # a process says once why engram stands aside
_registered = False


def register() -> None:
    """The entry point: serve SGLang's Engram tables from engram's table layer, or stand aside (module
    docstring). Never raises (entry_points.serve_or_stand_aside); calling it again changes nothing."""
    serve_or_stand_aside("sglang", unsupported, _install, _stand_aside)


def unsupported(version: str) -> str | None:
    """Why engram does not serve tables inside SGLang `version`, or None where it does."""
    if version_numbers(version, 3) not in SUPPORTED:
        return "engram serves SGLang " + ", ".join(".".join(map(str, v)) for v in SUPPORTED) + " only"
    return None


def _install() -> None:
    """Register engram's table classes as class REPLACEs of SGLang's, and the hook that names a PLE table
    by its module (once per process): SGLang applies them after every plugin has run. Every internal
    needed is imported first, so a SGLang without them changes nothing."""
    from sglang.srt.layers import engram as deepseek_layers
    from sglang.srt.models import qwen4_exp
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    from engram.integrations.sglang.deepseek import embedding_class
    from engram.integrations.sglang.qwen import named_by_module, pinned_host_class

    global _registered
    if _registered or deepseek_layers.EngramEmbedding.__module__.startswith("engram."):
        return  # registered in this process already
    hooks = [
        (TARGETS["deepseek"], embedding_class(deepseek_layers.EngramEmbedding), HookType.REPLACE),
        (TARGETS["qwen"], pinned_host_class(qwen4_exp.Qwen4ExpPinnedHostEmbedding), HookType.REPLACE),
        (TARGETS["qwen naming"], named_by_module, HookType.AROUND),
    ]
    if not hasattr(qwen4_exp, "Qwen4ExpNGramEmbedding"):  # the naming hook's target: all or nothing
        raise AttributeError("sglang.srt.models.qwen4_exp has no Qwen4ExpNGramEmbedding")
    for target, hook, kind in hooks:
        HookRegistry.register(target, hook, kind)
    _registered = True


def _stand_aside(version: str, problem: str) -> None:
    """Leave SGLang as it is: one warning per process, or one error where engram's section is set."""
    if version in _said:
        return
    _said.add(version)
    from engram.integrations.sglang.rules import ENV

    if os.environ.get(ENV):
        log.error(
            "engram: SGLang %s is installed and %s, so %s is not served: install SGLang %s beside engram, or "
            "unset %s", version, problem, ENV, ".".join(map(str, SUPPORTED[-1])), ENV,
        )  # fmt: skip
    else:
        log.warning("engram: SGLang %s is installed and %s; engram leaves SGLang as it is", version, problem)
