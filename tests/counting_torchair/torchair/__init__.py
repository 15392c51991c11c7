"""A stand-in torchair that counts what it is handed: each FX graph, and each capture of it.

Put `tests/counting_torchair` on PYTHONPATH. It mirrors what pto-patch uses of torchair at github
Ascend/torchair commit fced884 (2026-06-01):
- `python/torchair/configs/_option_base.py`: an option takes only its listed values (ValueError
  otherwise) and a config refuses an option it does not have (ValueError "... has no option ...");
- `python/torchair/configs/compiler_config.py` / `experimental_config.py`: `mode` in max-autotune,
  reduce-overhead, npugraph_ex; `experimental_config.frozen_parameter` and `tiling_schedule_optimize`;
- `python/torchair/npu_fx_compiler.py`: `get_npu_backend(compiler_config=...)`, which warns (compiler_config.py
  `_check_config_support`) that tiling_schedule_optimize may not take effect in reduce-overhead mode, and
  that reduce-overhead is deprecated in favour of the npugraph_ex backend;
- `python/torchair/_acl_concrete_graph/acl_graph.py`: a reduce-overhead graph captures once per
  concrete input shapes and records `counters["npugraph_ex"]["captured_<graph>"]`;
- `python/torchair/npu_fx_compiler.py` and `_acl_concrete_graph/fx2acl_converter.py` (torchair), and torch-npu
  2.13.0's `torch_npu/dynamo/npugraph_ex/npu_fx_compiler.py`: both build `AclConcreteGraph(...,
  num_warmup_iters=0)`, so **the first call of each new input-shape key is the capture**, with no eager run
  before. During it the stand-in answers the stream query as a capturing NPU stream does: the tensors here
  are on the CPU, so it sets `torch.cpu.is_current_stream_capturing` (torch has none; pto_kernels asks the
  tensors' device type, as it asks `torch.npu` on an NPU) to return True, and removes it after. A PyPTO
  kernel that is not built yet then raises CompileDuringCaptureError where the real capture does;
- torch-npu 2.13.0 registers the `npugraph_ex` torch.compile backend, whose options take `frozen_parameter`
  (and have no warm-up option): with `COUNTING_TORCHAIR_NPUGRAPH_EX=1` this torchair registers one when it
  is imported, refusing any other option.
It refuses GE mode (max-autotune), which needs CANN. Replays rerun the graph's Python outside any capture
(there is no device stream to replay), so what a capture recorded is read from the counters taken during
it, not from the replays. `COUNTING_TORCHAIR_LOG` names a file that gets one JSON line per graph handed
over; `COUNTING_TORCHAIR_WITHOUT` names an experimental option this torchair lacks (an older release).
"""

from __future__ import annotations

import contextlib
import json
import os
import warnings

import torch

__all__ = ["CompilerConfig", "get_npu_backend"]


class _Option:
    def __init__(self, default, allowed):
        self.allowed = allowed
        self._value = default

    @property
    def value(self):
        return self._value

    @value.setter
    def value(self, value):
        if value not in self.allowed:
            raise ValueError(f"Value {value!r} (type: {type(value)}) not in optional list {self.allowed!r}")
        self._value = value


class _Config:
    def __init__(self):
        object.__setattr__(
            self, "_fixed", [k for k, v in vars(self).items() if isinstance(v, (_Option, _Config))]
        )

    def __setattr__(self, key, value):
        if "_fixed" not in vars(self):
            object.__setattr__(self, key, value)
            return
        if key not in self._fixed:
            raise ValueError(f"{type(self).__name__} has no option {key}, all options {self._fixed}")
        current = getattr(self, key)
        if isinstance(current, _Option):
            current.value = value
        else:
            object.__setattr__(self, key, value)


class _ExperimentalConfig(_Config):
    def __init__(self):
        self.frozen_parameter = _Option(False, [True, False])
        self.tiling_schedule_optimize = _Option(False, [True, False])
        missing = os.environ.get("COUNTING_TORCHAIR_WITHOUT")
        if missing:
            vars(self).pop(missing, None)
        super().__init__()


class CompilerConfig(_Config):
    def __init__(self):
        self.experimental_config = _ExperimentalConfig()
        self.mode = _Option("max-autotune", ["max-autotune", "reduce-overhead", "npugraph_ex"])
        super().__init__()


_graphs = 0


def _log(entry: dict) -> None:
    path = os.environ.get("COUNTING_TORCHAIR_LOG")
    if path:
        with open(path, "a", encoding="utf-8") as log:
            log.write(json.dumps(entry) + "\n")


def get_npu_backend(*, compiler_config: CompilerConfig | None = None, custom_decompositions=None):
    config = compiler_config if compiler_config is not None else CompilerConfig()
    experimental = config.experimental_config
    settings = {
        "mode": config.mode.value,
        "frozen_parameter": experimental.frozen_parameter.value,
        "tiling_schedule_optimize": getattr(
            experimental, "tiling_schedule_optimize", _Option(None, [None])
        ).value,
    }

    if settings["mode"] == "reduce-overhead":
        if settings["tiling_schedule_optimize"]:
            warnings.warn(
                "The following torchair config or properties may not take effect or report error in "
                "reduce-overhead mode: config.experimental_config.tiling_schedule_optimize:True",
                UserWarning,
                stacklevel=2,
            )
        warnings.warn(
            'The "reduce-overhead" mode configuration will be deprecated. Please use the "npugraph_ex" backend.',
            DeprecationWarning,
            stacklevel=2,
        )

    def backend(gm, example_inputs):
        if settings["mode"] == "max-autotune":
            raise RuntimeError("GE graph mode needs CANN, which this stand-in does not have")
        return _acl_graph(gm, example_inputs, settings)

    return backend


@contextlib.contextmanager
def _capturing():
    """The stream query answering True, as on an NPU stream being captured (see the module docstring)."""
    torch.cpu.is_current_stream_capturing = lambda: True
    try:
        yield
    finally:
        del torch.cpu.is_current_stream_capturing


def _acl_graph(gm, example_inputs, settings: dict):
    """An ACL graph: each new input-shape key captured on its first call, then replayed."""
    global _graphs
    from torch._dynamo.utils import counters

    _graphs += 1
    name = f"graph_{_graphs}"
    shapes = [list(x.shape) for x in example_inputs if hasattr(x, "shape")]
    _log({"graph": name, "nodes": len(gm.graph.nodes), "inputs": len(shapes), **settings})
    captured: set = set()

    def run(*args):
        key = tuple(tuple(a.shape) for a in args if hasattr(a, "shape"))
        if key in captured:
            return gm(*args)
        captured.add(key)
        counters["npugraph_ex"]["captured_" + name] = len(captured)
        with _capturing():  # num_warmup_iters=0: this first call is the capture
            return gm(*args)

    return run


NPUGRAPH_EX_OPTIONS = ("frozen_parameter",)


def _npugraph_ex(gm, example_inputs, options=None):
    unknown = sorted(set(options or {}) - set(NPUGRAPH_EX_OPTIONS))
    if unknown:
        raise ValueError(f"npugraph_ex has no option {unknown[0]}, all options {list(NPUGRAPH_EX_OPTIONS)}")
    settings = {"mode": "npugraph_ex", "frozen_parameter": bool((options or {}).get("frozen_parameter"))}
    return _acl_graph(gm, example_inputs, settings | {"tiling_schedule_optimize": None})


if os.environ.get("COUNTING_TORCHAIR_NPUGRAPH_EX") == "1":
    from torch._dynamo import list_backends, register_backend

    if "npugraph_ex" not in list_backends(exclude_tags=()):
        register_backend(name="npugraph_ex")(_npugraph_ex)
