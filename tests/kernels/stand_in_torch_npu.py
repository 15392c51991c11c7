"""A CPU stand-in for torch_npu with the documented signatures of the fused ops pto_kernels uses.

It lets the `npu` backend's plumbing run here; it says nothing about the real ops on Ascend hardware.
"""

import types
from collections import Counter

import torch


def make_module() -> types.ModuleType:
    mod = types.ModuleType("torch_npu")
    mod.calls = Counter()

    def npu_rms_norm(x, gamma, epsilon=1e-6):
        mod.calls["npu_rms_norm"] += 1
        xf = x.float()
        rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + epsilon)
        return (xf * rstd * gamma.float()).to(x.dtype), rstd

    def npu_add_rms_norm(x1, x2, gamma, epsilon=1e-6):
        mod.calls["npu_add_rms_norm"] += 1
        summed = x1.float() + x2.float()
        rstd = torch.rsqrt(summed.pow(2).mean(-1, keepdim=True) + epsilon)
        return (summed * rstd * gamma.float()).to(x1.dtype), rstd, summed.to(x1.dtype)

    def npu_swiglu(x, dim=-1):
        mod.calls["npu_swiglu"] += 1
        a, b = x.chunk(2, dim=dim)
        return (torch.nn.functional.silu(a.float()) * b.float()).to(x.dtype)

    def npu_rotary_mul(x, r1, r2, rotary_mode="half"):
        mod.calls["npu_rotary_mul"] += 1
        assert rotary_mode == "half"
        half = x.shape[-1] // 2
        xf = x.float()
        rotated = torch.cat((-xf[..., half:], xf[..., :half]), dim=-1)
        return (xf * r1.float() + rotated * r2.float()).to(x.dtype)

    def npu_mrope(positions, query, key, cos_sin_cache, head_size, *, mrope_section=None, rotary_mode="half"):
        raise NotImplementedError("stand-in: npu_mrope is not used by pto_kernels")

    mod.npu_rms_norm = npu_rms_norm
    mod.npu_add_rms_norm = npu_add_rms_norm
    mod.npu_swiglu = npu_swiglu
    mod.npu_rotary_mul = npu_rotary_mul
    mod.npu_mrope = npu_mrope
    return mod
