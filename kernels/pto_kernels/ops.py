"""The kernel entries as PyTorch custom ops (namespace `pto_kernels`): what torch.compile and graph capture see.

Under torch.compile the wrappers call these ops instead of running Python: a tracer treats a custom op as
one opaque node, so PTO mode compiles whole (`fullgraph=True`), and a captured graph launches each op as
one kernel. Each op's body runs the route bound at `enable()` (the backend is never chosen by traced
code), so its calls are counted in `stats()` as in eager mode. Its fake runs the reference math on fake
tensors: shapes and dtypes while tracing, without data.

    torch.ops.pto_kernels.rms_norm(x, weight, eps)
    torch.ops.pto_kernels.mrope(q, k, cos, sin, mrope_section, unsqueeze_dim)       # transformers <= 5.16
    torch.ops.pto_kernels.mrope_mixed(q, k, cos, sin, unsqueeze_dim)                # transformers 5.20+
    torch.ops.pto_kernels.swiglu_mlp(x, gate_w, gate_b, up_w, up_b, down_w, down_b) # SiLU MLP

The ops are registered once per process. The body runs the routes of the `pto_kernels` package that is
in sys.modules when it is called, which is the one the patched modeling code's guards look up too.
A body reads Python state (routes, counters, the MRoPE table cache) only when it runs: a graph replayed
on the device without Python (CUDA graph, ACL graph) replays the kernels it launched at capture.
"""

from __future__ import annotations

import sys

import torch
from torch import Tensor

from . import _dispatch, reference

NAMESPACE = "pto_kernels"


def _contiguous(out):
    """Every op hands back contiguous tensors, in its body and in its fake alike: a compiled graph plans
    views on the strides the fake gave, and backends differ (a rotation built with cat is contiguous, the
    reference's elementwise result keeps a transposed q's strides)."""
    if isinstance(out, tuple):
        return tuple(t.contiguous() for t in out)
    return out.contiguous()


def _run(entry: str, args: tuple):
    dispatch = getattr(sys.modules.get(__package__), "_dispatch", _dispatch)
    if dispatch.capturing(args[0].device.type):
        dispatch.note_capture(entry)
    return _contiguous(dispatch.ROUTES[entry](*args))


def _rms_norm(hidden_states: Tensor, weight: Tensor, eps: float) -> Tensor:
    return _run("rms_norm", (hidden_states, weight, eps))


def _mrope(
    q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, mrope_section: list[int], unsqueeze_dim: int
) -> tuple[Tensor, Tensor]:
    return _run("mrope", (q, k, cos, sin, mrope_section, unsqueeze_dim))


def _mrope_mixed(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, unsqueeze_dim: int) -> tuple[Tensor, Tensor]:
    return _run("mrope_mixed", (q, k, cos, sin, unsqueeze_dim))


def _swiglu_mlp(
    hidden_states: Tensor,
    gate_weight: Tensor,
    gate_bias: Tensor | None,
    up_weight: Tensor,
    up_bias: Tensor | None,
    down_weight: Tensor,
    down_bias: Tensor | None,
) -> Tensor:
    return _run(
        "swiglu_mlp_weights",
        (hidden_states, gate_weight, gate_bias, up_weight, up_bias, down_weight, down_bias),
    )


# op name -> (body, fake). The fakes are the reference math run on fake tensors while tracing; like the
# bodies, they return new tensors, never a view of an input.
_OPS = {
    "rms_norm": (_rms_norm, reference.rms_norm),
    "mrope": (_mrope, reference.mrope),
    "mrope_mixed": (_mrope_mixed, reference.mrope_mixed),
    "swiglu_mlp": (_swiglu_mlp, reference.swiglu_mlp_weights),
}
NAMES = tuple(_OPS)


def registered(name: str) -> bool:
    try:
        getattr(getattr(torch.ops, NAMESPACE), name)
    except (AttributeError, RuntimeError):
        return False
    return True


def _register() -> None:
    for name, (body, fake) in _OPS.items():
        if registered(name):
            continue  # another copy of pto_kernels registered it: its body runs this process's current routes
        op = torch.library.custom_op(f"{NAMESPACE}::{name}", mutates_args=())(body)
        op.register_fake(lambda *args, _fake=fake: _contiguous(_fake(*args)))


_register()


class GraphModeUnsupported(RuntimeError):
    """torchair's graph (GE) mode met a pto_kernels op, which has no Ascend IR converter."""


def _ge_refusal(name: str):
    def refuse(*args, meta_outputs=None, **kwargs):
        raise GraphModeUnsupported(
            f"{NAMESPACE}::{name} has no Ascend IR converter, so torchair's graph (GE) mode cannot compile it; "
            "use ACL graph instead (torchair CompilerConfig().mode = 'reduce-overhead', as "
            "`pto-patch verify --use_acl_graph` does) or a torch.compile backend"
        )

    return refuse


_ge_refused: set[int] = set()


def refuse_graph_mode(torchair=None) -> bool:
    """Register, with torchair, a converter per op that stops GE mode with an error naming the op.

    ACL graph (reduce-overhead) captures the ops' kernels as they run and needs no converter; GE mode
    (torchair's default, max-autotune) lowers each node to Ascend IR, where these ops have none. Without
    this, GE mode would fail somewhere inside torchair. Runs once per torchair module; `enable()` calls it
    when torchair is imported. Returns whether converters were registered.
    """
    torchair = torchair if torchair is not None else sys.modules.get("torchair")
    register = getattr(torchair, "register_fx_node_ge_converter", None)
    if register is None or id(torchair) in _ge_refused:
        return False
    for name in NAMES:
        register(getattr(torch.ops.pto_kernels, name).default)(_ge_refusal(name))
    _ge_refused.add(id(torchair))
    return True


rms_norm = torch.ops.pto_kernels.rms_norm.default
mrope = torch.ops.pto_kernels.mrope.default
mrope_mixed = torch.ops.pto_kernels.mrope_mixed.default
swiglu_mlp = torch.ops.pto_kernels.swiglu_mlp.default
