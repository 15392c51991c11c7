"""The kernel entry table (pto_kernels/entries.py): what dispatch, the custom ops and the backends derive from it."""

from __future__ import annotations

import pto_kernels
import pytest
import torch
from pto_kernels import _dispatch, entries, ops, serving_ops
from pto_kernels.backends import fused, npu, pypto, pypto_blocks, reference


@pytest.mark.parametrize(
    "backend", [reference, fused, npu, pypto], ids=lambda m: m.__name__.rsplit(".", 1)[1]
)
def test_every_backend_defines_every_entry(backend):
    missing = [entry.name for entry in entries.ENTRIES if not callable(getattr(backend, entry.name, None))]
    assert missing == []


def test_every_custom_op_of_the_table_has_one_typed_body_and_is_registered():
    bodies = {**ops.BODIES, **serving_ops.BODIES}
    assert set(bodies) == set(entries.ENTRY_OF_CUSTOM_OP)
    assert not set(ops.BODIES) & set(serving_ops.BODIES)
    for name in bodies:
        assert ops.registered(name), name


def test_each_custom_op_writes_exactly_what_the_table_declares():
    for name, entry in entries.ENTRY_OF_CUSTOM_OP.items():
        schema = getattr(torch.ops.pto_kernels, name).default._schema
        written = {
            arg.name for arg in schema.arguments if arg.alias_info is not None and arg.alias_info.is_write
        }
        fixed = {op.name: op for op in entries.FIXED_POSITION_OPS}
        declared = fixed[name].mutates if name in fixed else entries.BY_NAME[entry].mutates
        assert written == set(declared), name


def test_dispatch_routes_and_counts_every_entry_of_the_table_and_nothing_else():
    assert set(_dispatch.ROUTES) == set(entries.BY_NAME)
    assert _dispatch.OPS == entries.OPS == pto_kernels.OPS
    for entry in entries.ENTRIES:
        assert pto_kernels.op_of(entry.name) == entry.op
        if entry.custom_op:
            assert pto_kernels.op_of(entry.custom_op) == entry.op
    assert pto_kernels.op_of("attention_prologue_cached_at") == "attention_prologue"


def test_only_the_cache_writing_entries_count_cache_writes(monkeypatch):
    monkeypatch.setattr(_dispatch, "_modules", dict(_dispatch._modules))
    calls = {}
    stand_in = type("Backend", (), {})()
    for entry in entries.ENTRIES:
        setattr(stand_in, entry.name, lambda *args, _name=entry.name: calls.setdefault(_name, args))
    _dispatch._modules["fused"] = stand_in
    pto_kernels.reset_stats()
    try:
        for entry in entries.ENTRIES:
            args = [torch.zeros(1)] * (entry.device_arg + 1)
            _dispatch.bind(entry.name, "fused")(*args)
        written = {op for op, stats in pto_kernels.stats().items() if stats["cache_writes"]}
        cached = [entry for entry in entries.ENTRIES if entry.writes_cache]
        assert written == {entry.op for entry in cached}
        assert pto_kernels.stats()["attention_prologue"]["cache_writes"] == len(cached)
    finally:
        pto_kernels.reset_stats()


def test_a_body_for_an_undeclared_custom_op_is_refused():
    def _not_in_the_table(x: torch.Tensor) -> torch.Tensor:
        return x

    with pytest.raises(ValueError, match="no custom op of pto_kernels/entries.py"):
        ops._typed_body(_not_in_the_table)


def test_an_entry_under_an_unknown_op_is_refused(monkeypatch):
    monkeypatch.setattr(entries, "ENTRIES", (*entries.ENTRIES, entries.Entry("rms_norm_2", "rmsnorm")))
    with pytest.raises(ValueError, match="rms_norm_2"):
        entries._check()
    bad = entries.FixedPositionOp("mlp_block_at", "mlp_block")
    monkeypatch.setattr(entries, "FIXED_POSITION_OPS", (bad,))
    monkeypatch.setattr(entries, "ENTRIES", entries.ENTRIES[:-1])
    with pytest.raises(ValueError, match="mlp_block_at"):
        entries._check()


def test_the_pypto_backend_finds_an_entry_where_it_is_defined_even_when_replaced(monkeypatch):
    monkeypatch.setattr(pypto, "_defined_in", {})
    replaced = []
    monkeypatch.setattr(pypto_blocks, "mlp_block", lambda *args: replaced.append(args) or "replaced")
    assert pypto.module_of("mlp_block") is pypto_blocks
    assert pypto.mlp_block(1) == "replaced" and replaced == [(1,)]
    assert pypto.module_of("_swiglu") is None  # a private helper is no entry
    with pytest.raises(AttributeError):
        pypto.no_such_entry  # noqa: B018
