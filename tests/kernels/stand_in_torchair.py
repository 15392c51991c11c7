"""A stand-in for torchair as an Ascend host holds it: torch_npu's lazy proxy in sys.modules["torchair"].

Mirrors, read and not run:
- torch_npu/dynamo/__init__.py (Ascend/pytorch, the same in v2.7.1, v2.9.0, v2.10.0, v2.12.0 and master of
  2026-08), `_LazyTorchair` and `_install_lazy_torchair`: importing torch_npu puts a proxy object (not a
  module) at sys.modules["torchair"]. Until torchair is really imported, reading any attribute but
  `__spec__` and `__path__` raises AttributeError; reading one of those two (which `import torchair` and
  importlib do) imports the real package, after which every attribute is the real one's. A failed load is
  remembered and raised again on every later read.
- torchair's top-level `register_fx_node_ge_converter(aten_op)` (Ascend/torchair, python/torchair/__init__.py):
  a decorator that records a converter for an op, which GE (max-autotune) mode looks up when lowering.
"""

from __future__ import annotations

import sys
import types


def make_torchair() -> types.ModuleType:
    """The real package behind the proxy: its converter registry, recorded in `converters`."""
    module = types.ModuleType("torchair")
    module.converters = {}

    def register_fx_node_ge_converter(aten_op):
        def register(converter):
            module.converters[aten_op] = converter
            return converter

        return register

    module.register_fx_node_ge_converter = register_fx_node_ge_converter
    return module


class LazyTorchair:
    """torch_npu's proxy: attributes only after the real package loaded, which `__spec__` triggers."""

    _allowed = ("__spec__", "__path__")

    def __init__(self, load=make_torchair):
        self._load, self._torchair, self._error = load, None, None
        self.loads = 0

    def __getattr__(self, name):
        if self._error is not None:
            raise self._error
        if self._torchair is not None:
            return getattr(self._torchair, name)
        if name not in self._allowed:
            raise AttributeError(f"Try to get torchair's attr `{name}` before torchair is initialized.")
        try:
            self.loads += 1
            self._torchair = self._load()
        except Exception as exc:
            self._error = exc
            raise
        return getattr(self._torchair, name)


def install(monkeypatch, load=make_torchair) -> LazyTorchair:
    """What `import torch_npu` does on a host whose torch_npu was built with torchair."""
    proxy = LazyTorchair(load)
    monkeypatch.setitem(sys.modules, "torchair", proxy)
    return proxy
