"""The kernel entries as torch custom ops: registered once, correct fakes, counted, traced whole."""

from __future__ import annotations

import importlib
import sys

import pto_kernels
import pytest
import stand_in_torchair
import torch
from pto_kernels import _dispatch, ops, static_cache
from pto_kernels.backends import reference

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def _inputs():
    """Per op: arguments shaped as a decoder layer hands them over (q and k transposed views)."""
    torch.manual_seed(0)
    q = torch.randn(2, 8, 4, 32).transpose(1, 2)  # [b, heads, s, d], not contiguous
    k = torch.randn(2, 8, 2, 32).transpose(1, 2)
    return {
        "rms_norm": (torch.randn(2, 8, 64), torch.randn(64), 1e-6),
        "mrope": (q, k, torch.randn(3, 2, 8, 32), torch.randn(3, 2, 8, 32), [4, 6, 6], 1),
        "mrope_mixed": (q, k, torch.randn(2, 8, 32), torch.randn(2, 8, 32), 1),
        "swiglu_mlp": (
            torch.randn(2, 8, 64),
            torch.randn(96, 64),
            None,
            torch.randn(96, 64),
            None,
            torch.randn(64, 96),
            None,
        ),
    }


REFERENCE = {
    "rms_norm": reference.rms_norm,
    "mrope": reference.mrope,
    "mrope_mixed": reference.mrope_mixed,
    "swiglu_mlp": reference.swiglu_mlp_weights,
}


def test_every_entry_is_a_registered_custom_op():
    assert set(ops.NAMES) == {
        "rms_norm",
        "mrope",
        "mrope_mixed",
        "swiglu_mlp",
        "residual_rms_norm",
        "mlp_block",
        "attention_prologue",
        "attention_prologue_mixed",
        "attention_prologue_cached",
        "attention_prologue_mixed_cached",
        "attention_prologue_cached_at",
        "attention_prologue_mixed_cached_at",
        "attention_core",
        "attention_core_masked",
    }
    for name in ops.NAMES:
        assert ops.registered(name)
    assert not ops.registered("no_such_op")


def test_every_custom_op_is_counted_under_an_op_the_stats_name():
    """What a captured graph holds is read by custom-op name (graph decode's graph_ops): each one must
    name an op of `stats()`, the `_at` cache-writing forms included (they counted as themselves, so a
    graph of 4.57's static-cache decode seemed to hold no attention prologue)."""
    counted = set(pto_kernels.stats())
    assert {
        name: pto_kernels.op_of(name) for name in ops.NAMES if pto_kernels.op_of(name) not in counted
    } == {}
    assert pto_kernels.op_of("attention_prologue_cached_at") == "attention_prologue"
    assert pto_kernels.op_of("mrope_mixed") == "mrope"


def _tensors(value) -> list:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for item in value for t in _tensors(item)]
    return []


def fake_layout_mismatches(op, args) -> list[str]:
    """Where the op's fake and its body disagree on an output's shape, dtype or strides.

    opcheck's test_faketensor compares strides in torch 2.13 and 2.14 but not in 2.9.0 (it checks shapes and
    dtypes and lets a stride mismatch pass), so the suite checks the layout itself, on every torch."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    real = _tensors(op(*args))
    with FakeTensorMode() as mode:
        fake_args = [mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args]
        fake = _tensors(op(*fake_args))
    if len(fake) != len(real):
        return [f"{len(fake)} fake outputs, {len(real)} from the body"]
    return [
        f"output {i}: fake {tuple(f.shape)} {f.dtype} strides {f.stride()}, "
        f"body {tuple(r.shape)} {r.dtype} strides {r.stride()}"
        for i, (f, r) in enumerate(zip(fake, real, strict=True))
        if (tuple(f.shape), f.dtype, f.stride()) != (tuple(r.shape), r.dtype, r.stride())
    ]


@pytest.mark.parametrize("backend", ["torch", "fused"])
@pytest.mark.parametrize("name", ["rms_norm", "mrope", "mrope_mixed", "swiglu_mlp"])
def test_op_passes_torch_opcheck_and_matches_the_reference(backend, name):
    """opcheck compares the fake with the body and the schema with what the body does (no mutation, no
    aliasing); the fake's strides are checked against the body's as well: what a compiled graph relies on."""
    pto_kernels.enable(backend=backend)
    args = _inputs()[name]
    op = getattr(torch.ops.pto_kernels, name).default
    torch.library.opcheck(op, args, test_utils=("test_schema", "test_faketensor"))
    assert fake_layout_mismatches(op, args) == []
    out = op(*args)
    torch.testing.assert_close(out, REFERENCE[name](*args))


def test_a_fake_with_other_strides_than_the_body_fails_opcheck(monkeypatch):
    """The check above can fail: a body handing back q's transposed layout while the fake says contiguous."""
    pto_kernels.enable(backend="torch")
    monkeypatch.setattr(ops, "_run", lambda entry, args: _dispatch.ROUTES[entry](*args))  # body only
    op, args = torch.ops.pto_kernels.mrope_mixed.default, _inputs()["mrope_mixed"]
    mismatches = fake_layout_mismatches(op, args)
    assert mismatches and all("strides" in m for m in mismatches), mismatches
    if tuple(int(p) for p in torch.__version__.split(".")[:2]) >= (2, 13):  # opcheck compares strides too
        with pytest.raises(Exception, match="[Ss]tride"):
            torch.library.opcheck(op, args)


def test_op_calls_run_the_bound_backend_and_are_counted():
    pto_kernels.enable(backend="fused")
    args = _inputs()
    torch.ops.pto_kernels.rms_norm(*args["rms_norm"])
    torch.ops.pto_kernels.swiglu_mlp(*args["swiglu_mlp"])
    torch.ops.pto_kernels.mrope_mixed(*args["mrope_mixed"])
    torch.ops.pto_kernels.mrope(*args["mrope"])
    stats = pto_kernels.stats()
    assert stats["rms_norm"]["backends"] == {"fused": 1}
    assert stats["swiglu_mlp"]["backends"] == {"fused": 1}
    assert stats["mrope"]["backends"] == {"fused": 2}
    pto_kernels.enable(backend="torch")  # chosen at enable(), read by the op's body when it runs
    torch.ops.pto_kernels.rms_norm(*args["rms_norm"])
    assert pto_kernels.stats()["rms_norm"]["backends"] == {"fused": 1, "torch": 1}


def test_a_second_copy_of_the_package_reuses_the_ops_and_its_own_routes(monkeypatch):
    """Model folders each carry pto_kernels; the ops are registered once per process and run the routes of
    the package the modeling code's guards find in sys.modules."""
    saved = {name: module for name, module in sys.modules.items() if name.split(".")[0] == "pto_kernels"}
    for name in saved:
        monkeypatch.delitem(sys.modules, name)
    second = importlib.import_module("pto_kernels")
    try:
        assert second is not pto_kernels
        second.enable(backend="torch")
        second.reset_stats()
        torch.ops.pto_kernels.rms_norm(*_inputs()["rms_norm"])
        assert second.stats()["rms_norm"]["calls"] == 1
        assert pto_kernels.stats()["rms_norm"]["calls"] == 0
    finally:
        for name in [n for n in sys.modules if n.split(".")[0] == "pto_kernels"]:
            del sys.modules[name]
        sys.modules.update(saved)


def _decoder_like(x, w, q, k, cos, sin, mlp):
    """What a patched decoder layer calls, through the wrappers."""
    h = pto_kernels.rms_norm_wrapper(x, w, 1e-6)
    q, k = pto_kernels.mrope_pto_correct(q, k, cos, sin, [4, 6, 6], 1)
    return pto_kernels.swiglu_mlp_wrapper(mlp, h), q, k


def _mlp():
    torch.manual_seed(1)
    mlp = torch.nn.Module()
    mlp.gate_proj, mlp.up_proj = torch.nn.Linear(64, 96, bias=False), torch.nn.Linear(64, 96, bias=False)
    mlp.down_proj, mlp.act_fn = torch.nn.Linear(96, 64, bias=False), torch.nn.SiLU()
    return mlp


def _explain(fn, *args):
    torch._dynamo.reset()
    return torch._dynamo.explain(fn)(*args)


@pytest.mark.parametrize("backend", ["fused", "torch"])
def test_wrappers_trace_as_one_graph_with_the_ops_in_it(backend):
    pto_kernels.enable(backend=backend)
    args = _inputs()
    x, w, _ = args["rms_norm"]
    q, k, cos, sin, _, _ = args["mrope"]
    with torch.no_grad():
        explained = _explain(_decoder_like, x, w, q, k, cos, sin, _mlp())
    assert explained.graph_break_count == 0, [r.reason for r in explained.break_reasons]
    targets = {str(node.target) for graph in explained.graphs for node in graph.graph.nodes}
    assert {
        "pto_kernels.rms_norm.default",
        "pto_kernels.mrope.default",
        "pto_kernels.swiglu_mlp.default",
    } <= (targets)


def test_per_call_python_state_in_the_traced_path_breaks_the_graph(monkeypatch):
    """The failing case: a wrapper that runs its route under the tracer (as before the custom ops) reads
    per-call Python state (the fused MRoPE's table cache) and breaks the graph."""
    pto_kernels.enable(backend="fused")
    monkeypatch.setattr(pto_kernels, "_tracing", lambda: False)
    args = _inputs()
    x, w, _ = args["rms_norm"]
    q, k, cos, sin, _, _ = args["mrope"]
    with torch.no_grad():
        explained = _explain(_decoder_like, x, w, q, k, cos, sin, _mlp())
    assert explained.graph_break_count > 0


def test_compiled_calls_are_counted_and_match_eager():
    pto_kernels.enable(backend="fused")
    args = _inputs()
    x, w, _ = args["rms_norm"]
    q, k, cos, sin, _, _ = args["mrope"]
    mlp = _mlp()
    with torch.no_grad():
        eager = _decoder_like(x, w, q, k, cos, sin, mlp)
        torch._dynamo.reset()
        compiled = torch.compile(_decoder_like, backend="aot_eager", fullgraph=True)
        pto_kernels.reset_stats()
        for _ in range(3):
            out = compiled(x, w, q, k, cos, sin, mlp)
    for a, b in zip(out, eager, strict=True):
        torch.testing.assert_close(a, b)
    calls = {op: s["calls"] for op, s in pto_kernels.stats().items()}
    assert calls == {"rms_norm": 3, "mrope": 3, "swiglu_mlp": 3} | dict.fromkeys(pto_kernels.BLOCK_OPS, 0)


def test_replays_of_a_captured_graph_are_counted_not_lost(monkeypatch):
    """A device graph replays its kernels without Python: calls made during a capture are marked, and a
    count_replays callable counts the replays. The capture probe is a stand-in here (no CUDA/NPU)."""
    pto_kernels.enable(backend="torch")
    args = _inputs()["rms_norm"]
    capturing = {"on": True}
    monkeypatch.setattr(_dispatch, "capturing", lambda device_type: capturing["on"])

    def forward(replay: bool):
        if not replay:  # capture (or warm-up): the op's body runs
            return torch.ops.pto_kernels.rms_norm(*args)
        return None  # a replay: the device reruns the captured kernels, no Python runs

    counted = pto_kernels.count_replays(forward)
    counted(False)
    capturing["on"] = False
    for _ in range(4):
        counted(True)
    counted(False)  # an eager call again: the op ran, so this call is no replay
    stats = pto_kernels.stats()["rms_norm"]
    assert stats["captured"] == 1 and stats["replays"] == 4 and stats["calls"] == 2
    assert pto_kernels.stats()["mrope"]["replays"] == 0  # never captured: never counted as replayed


class _StandInTorchair:
    """What pto_kernels uses of torchair: its GE converter registry (the real one needs CANN)."""

    def __init__(self):
        self.converters = {}

    def register_fx_node_ge_converter(self, aten_op):
        def register(converter):
            self.converters[aten_op] = converter
            return converter

        return register


def test_torchair_graph_mode_gets_a_converter_per_op_that_names_it(monkeypatch):
    torchair = _StandInTorchair()
    monkeypatch.setitem(sys.modules, "torchair", torchair)
    monkeypatch.setattr(ops, "_ge_refused", set())
    pto_kernels.enable(backend="torch")
    assert set(torchair.converters) == {getattr(torch.ops.pto_kernels, name).default for name in ops.NAMES}
    for name in ops.NAMES:
        converter = torchair.converters[getattr(torch.ops.pto_kernels, name).default]
        with pytest.raises(ops.GraphModeUnsupported, match=f"pto_kernels::{name} has no Ascend IR converter"):
            converter(torch.ones(1), meta_outputs=None)
    assert ops.refuse_graph_mode(torchair) is False  # once per torchair: enable() may run many times
    pto_kernels.enable(backend="torch")
    assert len(torchair.converters) == len(ops.NAMES)


def test_without_torchair_no_converter_is_registered(monkeypatch):
    monkeypatch.delitem(sys.modules, "torchair", raising=False)
    monkeypatch.setattr(ops, "_ge_refused", set())
    pto_kernels.enable(backend="torch")
    assert ops._ge_refused == set()
    assert ops.refuse_graph_mode(object()) is False  # a module without the registry: nothing to do


def test_torchair_behind_torch_npus_lazy_proxy_is_loaded_and_refuses_ge_mode(monkeypatch):
    """On an Ascend host sys.modules["torchair"] is torch_npu's proxy, which answers no attribute before
    torchair loads: reading the registry off it directly would register nothing."""
    proxy = stand_in_torchair.install(monkeypatch)
    monkeypatch.setattr(ops, "_ge_refused", set())
    with pytest.raises(AttributeError, match="before torchair is initialized"):
        proxy.register_fx_node_ge_converter  # noqa: B018 - what the proxy does before the load
    pto_kernels.enable(backend="torch")
    assert proxy.loads == 1
    assert set(proxy.converters) == {getattr(torch.ops.pto_kernels, name).default for name in ops.NAMES}
    pto_kernels.enable(backend="torch")
    assert proxy.loads == 1 and len(proxy.converters) == len(ops.NAMES)


def test_a_torchair_that_fails_to_load_registers_nothing_and_enable_still_works(monkeypatch):
    def broken():
        raise ImportError("libge_runner.so: cannot open shared object file")

    stand_in_torchair.install(monkeypatch, load=broken)
    monkeypatch.setattr(ops, "_ge_refused", set())
    pto_kernels.enable(backend="torch")
    assert ops._ge_refused == set() and ops.loaded_torchair() is None


def _mixed_cache_write_args(seed: int, batch: int, advance: bool) -> tuple:
    """attention_prologue_mixed_cached's arguments at small widths: caches of 6 positions, position 3."""
    gen = torch.Generator().manual_seed(seed)
    hidden, heads, kv_heads, dim = 32, 4, 2, 8

    def randn(*shape):
        return torch.randn(*shape, generator=gen)

    return (
        randn(batch, 1, hidden), randn(hidden) + 1.0, 1e-6,
        randn(heads * dim, hidden), randn(heads * dim),
        randn(kv_heads * dim, hidden), randn(kv_heads * dim),
        randn(kv_heads * dim, hidden), randn(kv_heads * dim),
        randn(batch, 1, dim), randn(batch, 1, dim), dim,
        torch.zeros(batch, kv_heads, 6, dim), torch.zeros(batch, kv_heads, 6, dim), torch.tensor([3]), advance,
    )  # fmt: skip


def test_the_cache_writing_prologue_says_what_it_mutates():
    """torch.library's own checks of the op that writes the static cache: its schema marks the two caches as
    written (a compiled graph must not reorder or drop the write), its fake matches its body, and it runs
    under torch.compile's functionalization."""
    args = _mixed_cache_write_args(5, 1, True)
    schema = str(ops.attention_prologue_mixed_cached._schema)
    assert "Tensor(a12!) key_cache" in schema and "Tensor(a13!) value_cache" in schema
    assert "Tensor(a14!) position" in schema
    torch.library.opcheck(ops.attention_prologue_mixed_cached, args)
    written, position = args[12], args[14]
    position.fill_(3)  # opcheck ran the op several times, each advancing it
    ops.attention_prologue_mixed_cached(*args)
    assert written[:, :, 3].abs().sum() > 0 and not written[:, :, :3].any() and not written[:, :, 4:].any()
    assert position.tolist() == [4]
    ops.attention_prologue_mixed_cached(*args[:-1], False)  # cache_position (4.57 - 5.0): left as it is
    assert position.tolist() == [4] and written[:, :, 4].abs().sum() > 0


def test_the_cache_writing_prologue_at_a_given_position_does_not_say_it_mutates_it():
    """Under transformers 4.57 - 5.0 the write is at the attention's cache_position, which the layer does not
    own: the op that writes there marks the caches written, not the position, and refuses to advance it."""
    args = _mixed_cache_write_args(6, 2, False)
    schema = str(ops.attention_prologue_mixed_cached_at._schema)
    assert "Tensor(a12!) key_cache" in schema and "Tensor(a13!) value_cache" in schema
    assert "Tensor position" in schema and "!) position" not in schema
    torch.library.opcheck(ops.attention_prologue_mixed_cached_at, args)
    written, position = args[12], args[14]
    ops.attention_prologue_mixed_cached_at(*args)
    assert position.tolist() == [3] and written[:, :, 3].abs().sum(-1).all()  # both sequences' rows
    with pytest.raises(ValueError, match="never advances"):
        ops.attention_prologue_mixed_cached_at(*args[:-1], True)
    assert "!) position" not in str(ops.attention_prologue_cached_at._schema)


@pytest.mark.parametrize("advance", [True, False])
def test_a_traced_cache_write_marks_the_position_written_only_where_it_advances(advance, monkeypatch):
    called = []
    for name in ("attention_prologue_mixed_cached", "attention_prologue_mixed_cached_at"):
        monkeypatch.setattr(ops, name, lambda *args, _name=name: called.append(_name))
    target = static_cache.WriteTarget(torch.zeros(1), torch.zeros(1), torch.tensor([3]), advance)
    monkeypatch.setattr(static_cache, "write_target", lambda *args: target)
    monkeypatch.setattr(pto_kernels, "_prologue_args", lambda *args: ())
    monkeypatch.setattr(pto_kernels, "_tracing", lambda: True)
    attention = type("Attention", (), {"layer_idx": 0, "head_dim": 8})()
    pto_kernels.attention_prologue_mixed_cache_wrapper(attention, None, None, None, None, None, None)
    want = "attention_prologue_mixed_cached" if advance else "attention_prologue_mixed_cached_at"
    assert called == [want]
