"""Stand-in for torchvision: PyPI's torchvision is a CUDA build that cannot load beside the CPU build of torch
vLLM's CPU build runs on ('operator torchvision::nms does not exist'), and vLLM imports it at module level
for vision models (qwen3_vl, which Qwen4Exp's text model imports). Every name resolves to an inert class;
calling one raises, so nothing of it can run unnoticed. A text model never calls it."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types

__version__ = "0.0.0+standin"


class _Name(type):
    def __getattr__(cls, name: str) -> type:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Name(name, (), {})

    def __call__(cls, *args: object, **kwargs: object) -> object:
        raise RuntimeError(f"torchvision is a stand-in in this test (tests/vllm_engine): {cls.__name__} cannot run")


class _Module(types.ModuleType):
    def __getattr__(self, name: str) -> type:
        if name.startswith("__"):
            raise AttributeError(name)
        value = _Name(name, (), {})
        setattr(self, name, value)
        return value


class _Submodules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path, target=None):
        if fullname.startswith(__name__ + "."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _Module(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module):
        pass


sys.meta_path.insert(0, _Submodules())
sys.modules[__name__].__class__ = _Module
