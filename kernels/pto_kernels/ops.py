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

and the decoder-layer blocks, several of a layer's ops in one launch (reference.py has their math):

    torch.ops.pto_kernels.residual_rms_norm(x, residual, weight, eps) -> (normed, residual + x)
    torch.ops.pto_kernels.mlp_block(residual, attn, o_w, o_b, norm_w, eps, gate_w, gate_b, up_w, up_b,
                                    down_w, down_b) -> the layer's output
    torch.ops.pto_kernels.attention_prologue(x, norm_w, eps, q_w, q_b, k_w, k_b, v_w, v_b, cos, sin,
                                             mrope_section, head_dim) -> (q, k, v)
    torch.ops.pto_kernels.attention_prologue_mixed(x, norm_w, eps, q_w, q_b, k_w, k_b, v_w, v_b, cos, sin,
                                                   head_dim) -> (q, k, v)
    torch.ops.pto_kernels.attention_prologue_cached(<attention_prologue's>, key_cache, value_cache, position,
                                                    advance)
    torch.ops.pto_kernels.attention_prologue_mixed_cached(<attention_prologue_mixed's>, key_cache,
                                                          value_cache, position, advance)
        -> q; k and v written into the static caches at position, and position advanced by the new rows
           with advance (the cache update's work, in place)
    torch.ops.pto_kernels.attention_prologue_cached_at(<the same>, advance=False)
    torch.ops.pto_kernels.attention_prologue_mixed_cached_at(<the same>, advance=False)
        -> the same write at a position the op leaves as it is (4.57 - 5.0: the attention's cache_position,
           which the layer does not own): its schema marks the caches written, not the position

and the attention core between them, over the static KV cache of a decode step:

    torch.ops.pto_kernels.attention_core(q, key_cache, value_cache, kv_lens, scale, kv_starts=None)
        -> [b, s, heads * d]; each sequence's kv_lens[b] valid positions from kv_starts[b] (left padding)
    torch.ops.pto_kernels.attention_core_masked(q, key_cache, value_cache, attention_mask, scale)  # ranges
                                                                                # from the model's mask

The ops are registered once per process. The body runs the routes of the `pto_kernels` package that is
in sys.modules when it is called, which is the one the patched modeling code's guards look up too.
A body reads Python state (routes, counters, the MRoPE table cache) only when it runs: a graph replayed
on the device without Python (CUDA graph, ACL graph) replays the kernels it launched at capture.
"""

from __future__ import annotations

import functools
import importlib
import sys
import types
from collections.abc import Callable

import torch
from torch import Tensor

from . import _dispatch, entries
from .backends import reference

NAMESPACE = "pto_kernels"


def _contiguous(out):
    """Every op hands back contiguous tensors, in its body and in its fake alike: a compiled graph plans
    views on the strides the fake gave, and backends differ (a rotation built with cat is contiguous, the
    reference's elementwise result keeps a transposed q's strides)."""
    if isinstance(out, tuple):
        return tuple(t.contiguous() for t in out)
    return out.contiguous()


# custom op name -> its typed body: torch.library reads the op's schema from the body's annotations
BODIES: dict[str, Callable] = {}


def _typed_body(body: Callable) -> Callable:
    """Declare `_<custom op>` as the body of a custom op of entries.py's table."""
    name = body.__name__.removeprefix("_")
    if name not in entries.ENTRY_OF_CUSTOM_OP:
        raise ValueError(f"{name} is no custom op of pto_kernels/entries.py")
    BODIES[name] = body
    return body


def _run(entry: str, args: tuple):
    dispatch = getattr(sys.modules.get(__package__), "_dispatch", _dispatch)
    if dispatch.capturing(args[0].device.type):
        dispatch.note_capture(entry)
    return _contiguous(dispatch.ROUTES[entry](*args))


@_typed_body
def _rms_norm(hidden_states: Tensor, weight: Tensor, eps: float) -> Tensor:
    return _run("rms_norm", (hidden_states, weight, eps))


@_typed_body
def _mrope(
    q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, mrope_section: list[int], unsqueeze_dim: int
) -> tuple[Tensor, Tensor]:
    return _run("mrope", (q, k, cos, sin, mrope_section, unsqueeze_dim))


@_typed_body
def _mrope_mixed(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, unsqueeze_dim: int) -> tuple[Tensor, Tensor]:
    return _run("mrope_mixed", (q, k, cos, sin, unsqueeze_dim))


@_typed_body
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


@_typed_body
def _residual_rms_norm(
    hidden_states: Tensor, residual: Tensor, weight: Tensor, eps: float
) -> tuple[Tensor, Tensor]:
    return _run("residual_rms_norm", (hidden_states, residual, weight, eps))


@_typed_body
def _mlp_block(
    residual: Tensor,
    attn_output: Tensor,
    o_weight: Tensor,
    o_bias: Tensor | None,
    norm_weight: Tensor,
    eps: float,
    gate_weight: Tensor,
    gate_bias: Tensor | None,
    up_weight: Tensor,
    up_bias: Tensor | None,
    down_weight: Tensor,
    down_bias: Tensor | None,
) -> Tensor:
    return _run(
        "mlp_block",
        (
            residual,
            attn_output,
            o_weight,
            o_bias,
            norm_weight,
            eps,
            gate_weight,
            gate_bias,
            up_weight,
            up_bias,
            down_weight,
            down_bias,
        ),
    )


@_typed_body
def _attention_prologue(
    hidden_states: Tensor,
    norm_weight: Tensor,
    eps: float,
    q_weight: Tensor,
    q_bias: Tensor | None,
    k_weight: Tensor,
    k_bias: Tensor | None,
    v_weight: Tensor,
    v_bias: Tensor | None,
    cos: Tensor,
    sin: Tensor,
    mrope_section: list[int],
    head_dim: int,
) -> tuple[Tensor, Tensor, Tensor]:
    return _run(
        "attention_prologue",
        (hidden_states, norm_weight, eps, q_weight, q_bias, k_weight, k_bias, v_weight, v_bias, cos, sin)
        + (mrope_section, head_dim),
    )


@_typed_body
def _attention_prologue_mixed(
    hidden_states: Tensor,
    norm_weight: Tensor,
    eps: float,
    q_weight: Tensor,
    q_bias: Tensor | None,
    k_weight: Tensor,
    k_bias: Tensor | None,
    v_weight: Tensor,
    v_bias: Tensor | None,
    cos: Tensor,
    sin: Tensor,
    head_dim: int,
) -> tuple[Tensor, Tensor, Tensor]:
    return _run(
        "attention_prologue_mixed",
        (hidden_states, norm_weight, eps, q_weight, q_bias, k_weight, k_bias, v_weight, v_bias, cos, sin)
        + (head_dim,),
    )


@_typed_body
def _attention_prologue_cached(
    hidden_states: Tensor,
    norm_weight: Tensor,
    eps: float,
    q_weight: Tensor,
    q_bias: Tensor | None,
    k_weight: Tensor,
    k_bias: Tensor | None,
    v_weight: Tensor,
    v_bias: Tensor | None,
    cos: Tensor,
    sin: Tensor,
    mrope_section: list[int],
    head_dim: int,
    key_cache: Tensor,
    value_cache: Tensor,
    position: Tensor,
    advance: bool,
) -> Tensor:
    return _run(
        "attention_prologue_cached",
        (hidden_states, norm_weight, eps, q_weight, q_bias, k_weight, k_bias, v_weight, v_bias, cos, sin)
        + (mrope_section, head_dim, key_cache, value_cache, position, advance),
    )


@_typed_body
def _attention_prologue_mixed_cached(
    hidden_states: Tensor,
    norm_weight: Tensor,
    eps: float,
    q_weight: Tensor,
    q_bias: Tensor | None,
    k_weight: Tensor,
    k_bias: Tensor | None,
    v_weight: Tensor,
    v_bias: Tensor | None,
    cos: Tensor,
    sin: Tensor,
    head_dim: int,
    key_cache: Tensor,
    value_cache: Tensor,
    position: Tensor,
    advance: bool,
) -> Tensor:
    return _run(
        "attention_prologue_mixed_cached",
        (hidden_states, norm_weight, eps, q_weight, q_bias, k_weight, k_bias, v_weight, v_bias, cos, sin)
        + (head_dim, key_cache, value_cache, position, advance),
    )


def _fixed_position(body):
    """An `_at` op's body: the cache write at a position it never advances (its schema does not mark it
    written, so an advance would go unseen by a compiled graph)."""

    @functools.wraps(body)
    def at(*args):
        if args[-1]:
            raise ValueError("an _at cache-writing prologue writes at its position and never advances it")
        return body(*args)

    return at


@_typed_body
def _attention_core(
    query: Tensor,
    key_cache: Tensor,
    value_cache: Tensor,
    kv_lens: Tensor,
    scale: float,
    kv_starts: Tensor | None = None,
) -> Tensor:
    return _run("attention_core", (query, key_cache, value_cache, kv_lens, scale, kv_starts))


@_typed_body
def _attention_core_masked(
    query: Tensor, key_cache: Tensor, value_cache: Tensor, attention_mask: Tensor | None, scale: float
) -> Tensor:
    return _run("attention_core_masked", (query, key_cache, value_cache, attention_mask, scale))


for _fixed in entries.FIXED_POSITION_OPS:  # the `_at` forms run the cached prologue's routes
    BODIES[_fixed.name] = _fixed_position(BODIES[entries.BY_NAME[_fixed.entry].custom_op])
NAMES = tuple(BODIES)


def registered(name: str) -> bool:
    try:
        getattr(getattr(torch.ops, NAMESPACE), name)
    except (AttributeError, RuntimeError):
        return False
    return True


def _mutates(name: str) -> tuple[str, ...]:
    """The arguments custom op `name` writes (the static KV cache; the position where the op advances it),
    as torch.library must be told."""
    for fixed in entries.FIXED_POSITION_OPS:
        if fixed.name == name:
            return fixed.mutates
    return entries.BY_NAME[entries.ENTRY_OF_CUSTOM_OP[name]].mutates


def register(bodies: dict[str, Callable]) -> None:
    """Register each custom op once per process: its body, and as its fake the reference math of its entry
    on fake tensors while tracing. Like the bodies, the fakes return new tensors, never a view of an input."""
    for name, body in bodies.items():
        if registered(name):
            continue  # another copy of pto_kernels registered it: its body runs this process's current routes
        fake = getattr(reference, entries.ENTRY_OF_CUSTOM_OP[name])
        op = torch.library.custom_op(f"{NAMESPACE}::{name}", mutates_args=_mutates(name))(body)
        op.register_fake(lambda *args, _fake=fake: _contiguous(_fake(*args)))


register(BODIES)


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


def loaded_torchair():
    """sys.modules["torchair"], loaded; None when absent or when it cannot load (GE mode cannot run then).

    On an Ascend host it is torch_npu's lazy proxy (torch_npu/dynamo/__init__.py, `_LazyTorchair`), not a
    module: it raises AttributeError for every attribute until torchair is really imported, and
    `torch.compile(backend="npu")` imports it only when it compiles. Reading the proxy's `__spec__` loads
    the real package (as an `import torchair` statement does) and is what lets the refusal be registered
    before that. `importlib.import_module` alone is not enough: on Python 3.10 it returns whatever
    sys.modules holds without reading `__spec__` (3.11+ reads it), so the proxy would stay unloaded.
    """
    held = sys.modules.get("torchair")
    if held is None or isinstance(held, types.ModuleType):
        return held
    try:
        getattr(held, "__spec__", None)  # the read is what loads torchair behind the proxy
        return importlib.import_module("torchair")
    except Exception:  # torchair's import fails in many ways without CANN's graph engine; GE mode fails too
        return None


def refuse_graph_mode(torchair=None) -> bool:
    """Register, with torchair, a converter per op that stops GE mode with an error naming the op.

    ACL graph (reduce-overhead) captures the ops' kernels as they run and needs no converter; GE mode
    (torchair's default, max-autotune) lowers each node to Ascend IR, where these ops have none. Without
    this, GE mode would fail somewhere inside torchair. Runs once per torchair module; `enable()` calls it
    when sys.modules holds torchair, torch_npu's lazy proxy included (then torchair is loaded: see
    `loaded_torchair`). Returns whether converters were registered.
    """
    torchair = torchair if torchair is not None else loaded_torchair()
    register = getattr(torchair, "register_fx_node_ge_converter", None)
    if register is None or id(torchair) in _ge_refused:
        return False
    for name in NAMES:
        register(getattr(torch.ops.pto_kernels, name).default)(_ge_refusal(name))
    _ge_refused.add(id(torchair))
    return True


# each custom op's default overload as a name of this module (ops.rms_norm, ...): what the wrappers call
# under a tracer
for _name in NAMES:
    globals()[_name] = getattr(torch.ops.pto_kernels, _name).default
