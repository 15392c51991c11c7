"""A stand-in for vLLM's out-of-tree layer registry and for vllm-ascend's registration, as the notes
describe them (shared/notes/vllm.md, read in vLLM 0.32.0 and vllm-ascend's worker), for the plugin tests
that cannot run vLLM or an Ascend NPU:

- `CustomOp.register_oot(cls, name=KEY)` refuses a KEY already taken ("Duplicate op name") and sets the
  class's `name`; building a layer whose class name is a registered KEY builds the registered class.
- A layer picks one forward when built: custom ops off (compiled) -> forward_native; else by platform:
  cpu -> forward_cpu, cuda -> forward_cuda, out-of-tree (Ascend) -> forward_oot.
- vllm-ascend's worker registers its RMSNorm, SiluAndMul and MRotaryEmbedding under the same keys at
  worker start, after general plugins have loaded.

The layers compute their definitions in plain torch; they are not vLLM's code.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

op_registry_oot: dict[str, type] = {}
PLATFORM = {"name": "cpu"}  # "cpu", "cuda", "oot" or "compiled" (custom ops off: forward_native)


class CustomOp(torch.nn.Module):
    def __new__(cls, *args, **kwargs):
        return super().__new__(op_registry_oot.get(cls.__name__, cls))

    def __init__(self) -> None:
        super().__init__()
        self._forward_method = {
            "compiled": self.forward_native,
            "cpu": self.forward_cpu,
            "cuda": self.forward_cuda,
            "oot": self.forward_oot,
        }[PLATFORM["name"]]

    def forward(self, *args, **kwargs):
        return self._forward_method(*args, **kwargs)

    def forward_native(self, *args, **kwargs):
        raise NotImplementedError

    def forward_cuda(self, *args, **kwargs):
        raise NotImplementedError  # a CUDA kernel, absent here

    def forward_cpu(self, *args, **kwargs):
        return self.forward_native(*args, **kwargs)

    def forward_oot(self, *args, **kwargs):
        return self.forward_native(*args, **kwargs)

    @classmethod
    def register_oot(cls, _decorated_op_cls=None, name: str | None = None):
        def decorator(op_cls):
            key = name if name is not None else cls.__name__
            assert key not in op_registry_oot, f"Duplicate op name: {key}"
            op_cls.name = key
            op_registry_oot[key] = op_cls
            return op_cls

        if _decorated_op_cls is None:
            return decorator
        if not isinstance(_decorated_op_cls, type):
            raise TypeError("Decorator can only be applied to classes.")
        return decorator(_decorated_op_cls)


class RMSNorm(CustomOp):
    def __init__(self, hidden_size: int, eps: float = 1e-6, has_weight: bool = True) -> None:
        super().__init__()
        self.variance_epsilon, self.has_weight, self.variance_size_override = eps, has_weight, None
        self.weight = torch.nn.Parameter(torch.linspace(0.5, 1.5, hidden_size))

    def forward_native(self, x, residual=None):
        if residual is not None:
            x = x + residual
            residual = x
        normed = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        out = normed * self.weight if self.has_weight else normed
        return out if residual is None else (out, residual)


class SiluAndMul(CustomOp):
    def forward_native(self, x):
        half = x.shape[-1] // 2
        return F.silu(x[..., :half]) * x[..., half:]


class MRotaryEmbedding(CustomOp):
    """MRoPE, neox halves: dimension j of each half takes its angle from the position row its section
    assigns (temporal, height, width)."""

    def __init__(self, head_size: int, mrope_section: list[int], base: float = 10000.0) -> None:
        super().__init__()
        self.head_size = self.rotary_dim = head_size
        self.mrope_section, self.mrope_interleaved, self.is_neox_style = mrope_section, False, True
        inv_freq = 1.0 / base ** (torch.arange(0, head_size, 2, dtype=torch.float32) / head_size)
        angles = torch.arange(64, dtype=torch.float32)[:, None] * inv_freq[None, :]
        self.cos_sin_cache = torch.cat((angles.cos(), angles.sin()), dim=-1)

    def _match_cos_sin_cache_dtype(self, query):
        return self.cos_sin_cache.to(query.dtype)

    def forward_native(self, positions, query, key=None, offsets=None):
        if positions.ndim == 1:
            positions = positions.expand(3, -1)
        if offsets is not None:
            positions = positions + offsets
        rows = [i for i, width in enumerate(self.mrope_section) for _ in range(width)]
        cos, sin = self.cos_sin_cache[positions].chunk(2, dim=-1)  # [3, tokens, half]
        cos = torch.stack([cos[row, :, j] for j, row in enumerate(rows)], dim=-1)[:, None, :]
        sin = torch.stack([sin[row, :, j] for j, row in enumerate(rows)], dim=-1)[:, None, :]

        def rotate(x):
            heads = x.view(x.shape[0], -1, self.head_size)
            x1, x2 = heads.chunk(2, dim=-1)
            return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).reshape(x.shape)

        return rotate(query), rotate(key)


IN_TREE = {"RMSNorm": RMSNorm, "SiluAndMul": SiluAndMul, "MRotaryEmbedding": MRotaryEmbedding}


# --- vllm-ascend -----------------------------------------------------------------------------------


class AscendRMSNorm(RMSNorm):
    calls = 0

    def forward_oot(self, x, residual=None):
        AscendRMSNorm.calls += 1
        return self.forward_native(x, residual)


class AscendSiluAndMul(SiluAndMul):
    calls = 0

    def forward_oot(self, x):
        AscendSiluAndMul.calls += 1
        return self.forward_native(x)


class AscendMRotaryEmbedding(MRotaryEmbedding):
    calls = 0

    def forward_oot(self, positions, query, key=None, offsets=None):
        AscendMRotaryEmbedding.calls += 1
        return self.forward_native(positions, query, key, offsets)


ASCEND = {
    "RMSNorm": AscendRMSNorm,
    "SiluAndMul": AscendSiluAndMul,
    "MRotaryEmbedding": AscendMRotaryEmbedding,
}
AscendRMSNorm.__module__ = AscendSiluAndMul.__module__ = AscendMRotaryEmbedding.__module__ = "vllm_ascend.ops"


def register_ascend_customop() -> None:
    """What vllm-ascend's worker does at start: one register_oot call per key."""
    for key, cls in ASCEND.items():
        CustomOp.register_oot(_decorated_op_cls=cls, name=key)


def reset() -> None:
    op_registry_oot.clear()
    PLATFORM["name"] = "cpu"
    for cls in ASCEND.values():
        cls.calls = 0
