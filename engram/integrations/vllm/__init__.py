"""engram inside vLLM 0.33: a `vllm.general_plugins` entry point that serves Qwen4Exp's PLE tables and
DeepSeek V4.1's Engram tables from engram's storage and lookups. vLLM keeps hashing (its ids equal engram's); only where the rows live and how
they are gathered move.

vLLM loads the entry point in every process it starts, before any model is built; `register` only swaps
the Qwen table classes by name (PluggableLayer's out-of-tree registry) and routes DeepSeek's one table
factory (Engram._create_embedding) through engram's, so it is safe to run more than once. The swapped
classes behave exactly as vLLM's own unless engram is enabled for the model being built:
`--additional-config '{"engram": {...}}'`, or the JSON in ENGRAM_VLLM_CONFIG. The section is checked by
engram's schema with vLLM's own Engram fields beside it when vLLM creates its engine config (before any
worker starts), so a mistake is one line naming the field.

Nothing here has run on a GPU yet (issue 22): the GPU paths compile and their CPU twins are tested."""

from __future__ import annotations

import logging

log = logging.getLogger("engram")
SWAPPED = ("Qwen4ExpPLEDeviceEmbedding", "Qwen4ExpPLEPinnedHostEmbedding")


def register() -> None:
    """The entry point: swap vLLM's Qwen4Exp table classes for engram's (once per process)."""
    try:
        from vllm.model_executor.custom_op import op_registry_oot
    except ImportError:  # not inside vLLM, or a vLLM without pluggable layers: nothing to do
        return
    from engram.integrations.vllm import deepseek, qwen, settings

    for name, cls in zip(SWAPPED, (qwen.EngramQwenDeviceEmbedding, qwen.EngramQwenPinnedHostEmbedding), strict=True):
        theirs = op_registry_oot.setdefault(name, cls)
        if theirs is not cls:  # another plugin's: it stays, and engram says it does not serve those tables
            log.warning(
                "engram: vLLM's %s is already replaced by %s.%s (another plugin), so engram does not serve "
                "Qwen4Exp's PLE tables of that class in this process; uninstall one of the two plugins",
                name, theirs.__module__, theirs.__qualname__,
            )  # fmt: skip
    deepseek.install()
    settings.install_check()
