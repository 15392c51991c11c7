"""A CPU stand-in for torch_npu's fused ops that pto_kernels calls, refusing what the real ones refuse.

It lets the `npu` backend's plumbing run here; it says nothing about speed or the real kernels' numerics
beyond what is written below. Each op mirrors its schema in Ascend/op-plugin
`op_plugin/config/op_plugin_functions.yaml` and its API page `docs/zh/custom_APIs/torch_npu/<op>.md`
(for Atlas A2 = 910B), in the schema of one op-plugin branch (`release`): 7.3.0; 26.0.0, which added
`rotate` to npu_rotary_mul and `cache_mode` to npu_mrope; 26.1.0 (as master of 2026-08), whose
npu_apply_rotary_pos_emb defaults to layout 'BSND' instead of 'BSH'. Mirrored: argument names and
keyword-only markers, return arity, ranks, layouts, contiguity and dtype rules. A refused input raises
RuntimeError, as an aclnn parameter check does on the device. Not mirrored (refused here although the
real op may take it): npu_apply_rotary_pos_emb's 'BSH' layout, npu_rotary_mul's `rotate` matrix and
npu_mrope's 'interleave' cache mode; pto_kernels uses none of them. npu_fused_infer_attention_score lives in
stand_in_fused_attention.py, which says what of it is mirrored.

`calls` counts each op; `copies` counts the contiguous copies aclnn makes in front of an op that takes a
non-contiguous input (one more launch each). `inside` is entered around each op's body (a benchmark sets it
to pause its op counter, so an op counts as the one launch it is).
"""

from __future__ import annotations

import contextlib
import types
from collections import Counter

import torch
from stand_in_fused_attention import make_op as _fused_attention

FLOATS = (torch.float16, torch.bfloat16, torch.float32)
RELEASES = ("7.3.0", "26.0.0", "26.1.0")
# npu_mrope's mrope_section values (its API page): [0, 0, 0] or None is plain RoPE
MROPE_SECTIONS = ([16, 24, 24], [24, 20, 20], [8, 12, 12], [16, 16, 16, 16])


def _refuse(op: str, why: str):
    raise RuntimeError(f"{op}: {why} (stand-in for torch_npu.{op}, op-plugin)")


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _rotate_interleaved(x: torch.Tensor) -> torch.Tensor:
    return torch.stack((-x[..., 1::2], x[..., ::2]), dim=-1).flatten(-2)


def _rotary_table_fits(x: torch.Size, r: torch.Size) -> bool:
    """npu_rotary_mul's r1/r2 shapes per input layout (half mode, A2): BNSD 11SD/B1SD/BNSD, BSND 1S1D/BS1D/
    BSND, SBND S11D/SB1D/SBND, TND T1D/TND; D always whole."""
    if len(r) != len(x) or r[-1] != x[-1]:
        return False
    if len(x) == 3:
        return r[0] == x[0] and r[1] in (1, x[1])
    a, b, c = x[0], x[1], x[2]
    return tuple(r[:3]) in {(1, 1, c), (a, 1, c), (a, b, c), (1, b, 1), (a, b, 1), (a, 1, 1)}


def make_module(release: str = "26.1.0") -> types.ModuleType:
    assert release in RELEASES, release
    since_26 = release >= "26"
    mod = types.ModuleType("torch_npu")
    mod.release = release
    mod.calls = Counter()
    mod.copies = Counter()
    mod.inside = contextlib.nullcontext

    def _counted(name: str, body):
        def op(*args, **kwargs):
            mod.calls[name] += 1
            with mod.inside():
                return body(*args, **kwargs)

        op.__name__ = name
        return op

    def npu_rms_norm(self, gamma, epsilon=1e-06):
        if not 2 <= self.dim() <= 8:
            _refuse("npu_rms_norm", f"self has {self.dim()} dims; 2 to 8 are supported")
        if self.shape[self.dim() - gamma.dim() :] != gamma.shape:
            _refuse(
                "npu_rms_norm",
                f"gamma {tuple(gamma.shape)} is not the trailing dims of self {tuple(self.shape)}",
            )
        if (self.dtype, gamma.dtype) not in {(d, d) for d in FLOATS} | {
            (torch.float16, torch.float32),
            (torch.bfloat16, torch.float32),
        }:
            _refuse("npu_rms_norm", f"self {self.dtype} with gamma {gamma.dtype} is not a supported pair")
        dims = tuple(range(self.dim() - gamma.dim(), self.dim()))
        xf = self.float()
        rstd = torch.rsqrt(xf.pow(2).mean(dims, keepdim=True) + epsilon)
        return (xf * rstd * gamma.float()).to(self.dtype), rstd

    def npu_add_rms_norm(x1, x2, gamma, epsilon=1e-06):
        for name, t in (("x1", x1), ("x2", x2)):
            if not 1 <= t.dim() <= 8 or t.numel() == 0:
                _refuse("npu_add_rms_norm", f"{name} must be a non-empty tensor of 1 to 8 dims")
        if x1.shape != x2.shape or x1.dtype != x2.dtype or x1.dtype not in FLOATS:
            _refuse("npu_add_rms_norm", "x1 and x2 must have one shape and one float dtype")
        if gamma.dtype != x1.dtype:
            _refuse("npu_add_rms_norm", f"gamma is {gamma.dtype}, x1 {x1.dtype}: they must match")
        if x1.shape[x1.dim() - gamma.dim() :] != gamma.shape:
            _refuse("npu_add_rms_norm", f"gamma {tuple(gamma.shape)} is not the trailing dims of x1")
        # Ascend910B / 910_93 (hicann/ops-nn norm/add_rms_norm/tests/assets/golden.py, add_rms_golden_v1):
        # the sum rounded to the input dtype, the normalised value rounded, then times gamma
        summed = (x1.float() + x2.float()).to(x1.dtype)
        dims = tuple(range(x1.dim() - gamma.dim(), x1.dim()))
        sf = summed.float()
        rstd = torch.rsqrt(sf.pow(2).mean(dims, keepdim=True) + epsilon)
        normed = (sf * rstd).to(x1.dtype)
        return (normed.float() * gamma.float()).to(x1.dtype), rstd, summed

    def npu_swiglu(self, dim=-1):
        if not self.is_contiguous():
            _refuse("npu_swiglu", "non-contiguous input is not supported")
        if not 1 <= self.dim() <= 8 or self.numel() == 0 or self.dtype not in FLOATS:
            _refuse("npu_swiglu", "input must be a non-empty float tensor of 1 to 8 dims")
        if not -self.dim() <= dim < self.dim() or self.shape[dim] % 2:
            _refuse("npu_swiglu", f"dim {dim} must exist and be even-sized in {tuple(self.shape)}")
        a, b = self.chunk(2, dim=dim)
        return (torch.nn.functional.silu(a.float()) * b.float()).to(self.dtype)

    def _rotary_mul(self, r1, r2, rotary_mode="half", rotate=None):
        for name, t in (("self", self), ("r1", r1), ("r2", r2)):
            if t.dim() not in (3, 4):
                _refuse("npu_rotary_mul", f"{name} has {t.dim()} dims; 3 or 4 are supported")
        if not self.dtype == r1.dtype == r2.dtype or self.dtype not in FLOATS:
            _refuse("npu_rotary_mul", f"self {self.dtype}, r1 {r1.dtype}, r2 {r2.dtype}: one float dtype")
        d = self.shape[-1]
        if d % 2 or d >= 896:
            _refuse("npu_rotary_mul", f"D = {d}: it must be even and below 896")
        if rotary_mode not in ("half", "interleave"):
            _refuse("npu_rotary_mul", f"rotary_mode {rotary_mode!r}: 'half' or 'interleave'")
        if r1.shape != r2.shape or not _rotary_table_fits(self.shape, r1.shape):
            _refuse("npu_rotary_mul", f"r1/r2 {tuple(r1.shape)} fit no layout of self {tuple(self.shape)}")
        if self.dim() == 4:  # B and N below 1000 (the op's API doc); N is where the table has a 1
            heads = self.shape[2] if r1.shape[2] == 1 else self.shape[1]
            if self.shape[0] >= 1000 or heads >= 1000:
                _refuse("npu_rotary_mul", f"B = {self.shape[0]}, N = {heads}: both must be below 1000")
        if rotate is not None:
            _refuse("npu_rotary_mul", "rotate is not mirrored here")
        for t in (self, r1, r2):
            if not t.is_contiguous():
                mod.copies["npu_rotary_mul"] += 1
        xf = self.float()
        rotated = _rotate_half(xf) if rotary_mode == "half" else _rotate_interleaved(xf)
        return (xf * r1.float() + rotated * r2.float()).to(self.dtype)

    if since_26:

        def npu_rotary_mul(self, r1, r2, rotary_mode="half", rotate=None):
            return _rotary_mul(self, r1, r2, rotary_mode, rotate)

    else:

        def npu_rotary_mul(self, r1, r2, rotary_mode="half"):
            return _rotary_mul(self, r1, r2, rotary_mode)

    def _mrope(positions, query, key, cos_sin_cache, head_size, mrope_section, rotary_mode, cache_mode):
        op = "npu_mrope"
        if positions.dtype not in (torch.int32, torch.int64):
            _refuse(op, f"positions are {positions.dtype}; int32 or int64")
        if query.dim() != 2 or key.dim() != 2:
            _refuse(op, "query and key must be 2-D: (num_tokens, heads * head_size)")
        if not query.dtype == key.dtype == cos_sin_cache.dtype or query.dtype not in FLOATS:
            _refuse(op, "query, key and cos_sin_cache must share one float dtype")
        tokens = positions.shape[-1]
        if query.shape[0] != tokens or key.shape[0] != tokens:
            _refuse(op, f"positions name {tokens} tokens, query {query.shape[0]}, key {key.shape[0]}")
        if query.shape[1] % head_size or key.shape[1] % head_size:
            _refuse(op, f"head_size {head_size} does not divide query/key widths")
        if cos_sin_cache.dim() != 2:
            _refuse(op, "cos_sin_cache must be 2-D: (max_seq_len, rotary_dim)")
        rotary_dim, multiple = cos_sin_cache.shape[1], 16 if query.dtype == torch.float32 else 32
        if head_size % multiple or rotary_dim % multiple or rotary_dim > head_size:
            _refuse(op, f"head_size {head_size} and rotary_dim {rotary_dim} must be multiples of {multiple}")
        section = None if mrope_section is None or list(mrope_section) == [0, 0, 0] else list(mrope_section)
        if section is None:
            if positions.dim() != 1:
                _refuse(op, "plain RoPE (no mrope_section) takes 1-D positions")
        elif section not in MROPE_SECTIONS:
            _refuse(op, f"mrope_section {section} is not one of {list(MROPE_SECTIONS)}")
        elif positions.dim() != 2 or positions.shape[0] != len(section) or 2 * sum(section) != rotary_dim:
            _refuse(
                op,
                f"mrope_section {section} needs positions ({len(section)}, T) and rotary_dim {2 * sum(section)}",
            )
        if rotary_mode not in ("half", "interleave"):  # the schema's spelling, as npu_rotary_mul's
            _refuse(op, f"rotary_mode {rotary_mode!r}: 'half' or 'interleave'")
        if cache_mode not in ("default", "interleave") or (cache_mode == "interleave" and section is None):
            _refuse(op, f"cache_mode {cache_mode!r}: 'default', or 'interleave' with an mrope_section")
        if cache_mode == "interleave":
            _refuse(op, "cache_mode 'interleave' is not mirrored here")
        cos, sin = cos_sin_cache[positions].float().chunk(2, dim=-1)  # [T, rd/2] or [rows, T, rd/2]
        if section is not None:
            cos = torch.cat([part[i] for i, part in enumerate(cos.split(section, dim=-1))], dim=-1)
            sin = torch.cat([part[i] for i, part in enumerate(sin.split(section, dim=-1))], dim=-1)
        cos, sin = cos[:, None, :], sin[:, None, :]

        def rotate(x):
            heads = x.float().view(tokens, -1, head_size)
            rot, keep = heads[..., :rotary_dim], heads[..., rotary_dim:]
            if rotary_mode == "half":
                x1, x2 = rot.chunk(2, dim=-1)
                rot = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
            else:
                x1, x2 = rot[..., ::2], rot[..., 1::2]
                rot = torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).flatten(-2)
            return torch.cat((rot, keep), dim=-1).reshape(x.shape).to(x.dtype)

        return rotate(query), rotate(key)

    if since_26:

        def npu_mrope(
            positions, query, key, cos_sin_cache, head_size, *, mrope_section=None, rotary_mode="half",
            cache_mode="default",
        ):  # fmt: skip
            return _mrope(
                positions, query, key, cos_sin_cache, head_size, mrope_section, rotary_mode, cache_mode
            )

    else:

        def npu_mrope(
            positions, query, key, cos_sin_cache, head_size, *, mrope_section=None, rotary_mode="half"
        ):
            return _mrope(
                positions, query, key, cos_sin_cache, head_size, mrope_section, rotary_mode, "default"
            )

    def npu_apply_rotary_pos_emb(
        query, key, cos, sin, layout="BSND" if release >= "26.1" else "BSH", rotary_mode="half"
    ):
        op = "npu_apply_rotary_pos_emb"
        if layout not in ("BSND", "TND"):  # A2: BSND 4-D or TND 3-D only
            _refuse(op, f"layout {layout!r} is not supported on Atlas A2 (BSND or TND)")
        rank = 4 if layout == "BSND" else 3
        if any(t.dim() != rank for t in (query, key, cos, sin)):
            _refuse(op, f"layout {layout} takes {rank}-D query, key, cos and sin")
        if rotary_mode != "half":
            _refuse(op, f"rotary_mode {rotary_mode!r}: only 'half' on Atlas A2")
        if not query.dtype == key.dtype == cos.dtype == sin.dtype or query.dtype not in FLOATS:
            _refuse(op, "query, key, cos and sin must share one float dtype")
        d = query.shape[-1]
        if d not in (64, 128) or key.shape[-1] != d or cos.shape[-1] != d or sin.shape[-1] != d:
            _refuse(op, f"D = {d}: 64 or 128, the same in query, key, cos and sin")
        lead = query.shape[: rank - 2]
        table = (*lead, 1, d)
        if key.shape[: rank - 2] != lead or tuple(cos.shape) != table or tuple(sin.shape) != table:
            _refuse(op, f"cos/sin must be {table} for query {tuple(query.shape)}")
        for x in (query, key):  # in place: the outputs are the inputs
            xf = x.float()
            x.copy_((xf * cos.float() + _rotate_half(xf) * sin.float()).to(x.dtype))
        return query, key

    for name, body in (
        ("npu_rms_norm", npu_rms_norm),
        ("npu_add_rms_norm", npu_add_rms_norm),
        ("npu_swiglu", npu_swiglu),
        ("npu_rotary_mul", npu_rotary_mul),
        ("npu_mrope", npu_mrope),
        ("npu_apply_rotary_pos_emb", npu_apply_rotary_pos_emb),
        ("npu_fused_infer_attention_score", _fused_attention()),
    ):
        setattr(mod, name, _counted(name, body))
    return mod
