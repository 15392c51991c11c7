"""A stand-in for vLLM's out-of-tree layer registry and for vllm-ascend's layers, for the plugin tests that
cannot run vLLM on an Ascend NPU. What each part mirrors (read, not run; shared/notes/vllm.md and
shared/notes/ascend-stack-as-it-is.md):

- vllm/model_executor/custom_op.py, in the two shapes the plugin meets (`use_release`):
  vLLM v0.11.0 to v0.13.x keep the registry as the class attribute `CustomOp.op_registry_oot`; from the
  PluggableLayer refactor (v0.16.0 on) it is the module attribute `custom_op.op_registry_oot` and the class
  has none. In both, `register_oot(cls, name=KEY)` refuses a taken KEY ("Duplicate op name") and sets the
  class's `name`, and building a layer whose class name is a registered KEY builds the registered class.
- A layer picks one forward when built: custom ops off (compiled) -> forward_native; else by platform:
  cpu -> forward_cpu, cuda -> forward_cuda, out-of-tree (Ascend) -> forward_oot, which falls to
  forward_native unless a subclass defines it.
- vllm_ascend/ops/layernorm.py (`AscendRMSNorm`, v0.11.0 to main): an optional norm `bias`, created only for
  quantized checkpoints whose description names a norm bias; with a residual it adds the bias whenever one
  exists, without one only once the bias was loaded.
- vllm_ascend/ops/rotary_embedding.py (`AscendMRotaryEmbedding.forward_oot(self, positions, query, key)`:
  three arguments in every release): for mrope_section [16, 24, 24] one torch_npu.npu_mrope kernel (counted
  in `npu_mrope_calls`), other sections the class above it.
- vllm_ascend/utils.py (`register_ascend_customop`): the worker registers its classes under the same keys
  after vLLM loaded the general plugins.

The layers compute their definitions in plain torch; they are not vLLM's code.
"""

from __future__ import annotations

import sys
import types

import torch
import torch.nn.functional as F

RELEASES = ("0.13.0", "0.16.0")  # one per registry shape
__version__ = "0.16.0"
op_registry_oot: dict[str, type] = {}  # present in the >= 0.16 shape only (use_release removes it)
_REGISTRY: dict[str, type] = op_registry_oot  # the one dict, wherever the current shape keeps it
PLATFORM = {"name": "cpu"}  # "cpu", "cuda", "oot" or "compiled" (custom ops off: forward_native)
QUANT_CONFIG = {"norm.bias": False}  # True: a quantized checkpoint whose description names a norm bias


def registry() -> dict[str, type]:
    """Where register_oot and __new__ look, as the release being mirrored keeps it (AttributeError if not)."""
    if __version__ < "0.16":
        return CustomOp.__dict__["op_registry_oot"]
    return sys.modules[__name__].op_registry_oot


class CustomOp(torch.nn.Module):
    def __new__(cls, *args, **kwargs):
        return super().__new__(registry().get(cls.__name__, cls))

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
            held = registry()
            assert key not in held, f"Duplicate op name: {key}"
            op_cls.name = key
            held[key] = op_cls
            return op_cls

        if _decorated_op_cls is None:
            return decorator
        if not isinstance(_decorated_op_cls, type):
            raise TypeError("Decorator can only be applied to classes.")
        return decorator(_decorated_op_cls)


def use_release(version: str) -> None:
    """Mirror vLLM `version`'s registry shape (one of RELEASES), with an empty registry."""
    global __version__
    assert version in RELEASES, version
    module = sys.modules[__name__]
    _REGISTRY.clear()
    __version__ = version
    if version < "0.16":
        CustomOp.op_registry_oot = _REGISTRY
        if hasattr(module, "op_registry_oot"):
            del module.op_registry_oot
    else:
        module.op_registry_oot = _REGISTRY
        if "op_registry_oot" in CustomOp.__dict__:
            del CustomOp.op_registry_oot


def install(monkeypatch) -> None:
    """Put this stand-in where the plugin imports vLLM from: `vllm`, `vllm.model_executor.custom_op` and the
    three layer modules."""
    module = sys.modules[__name__]
    package = types.ModuleType("vllm")
    package.__version__ = __version__
    package.__path__ = []
    executor = types.ModuleType("vllm.model_executor")
    executor.__path__ = []
    executor.custom_op = module
    package.model_executor = executor
    monkeypatch.setitem(sys.modules, "vllm", package)
    monkeypatch.setitem(sys.modules, "vllm.model_executor", executor)
    for name in (
        "vllm.model_executor.custom_op",
        "vllm.model_executor.layers.layernorm",
        "vllm.model_executor.layers.activation",
        "vllm.model_executor.layers.rotary_embedding.mrope",
    ):
        monkeypatch.setitem(sys.modules, name, module)


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

        return rotate(query), None if key is None else rotate(key)


IN_TREE = {"RMSNorm": RMSNorm, "SiluAndMul": SiluAndMul, "MRotaryEmbedding": MRotaryEmbedding}


# --- vllm-ascend -----------------------------------------------------------------------------------


class AscendRMSNorm(RMSNorm):
    calls = 0

    def __init__(self, hidden_size: int, eps: float = 1e-6, has_weight: bool = True):
        super().__init__(hidden_size, eps, has_weight)
        self.bias, self.bias_loaded = None, False
        if QUANT_CONFIG["norm.bias"]:  # vllm-ascend reads get_current_vllm_config().quant_config
            self.bias = torch.nn.Parameter(torch.zeros(hidden_size), requires_grad=False)

    def load_bias(self, values: torch.Tensor) -> None:
        self.bias.data.copy_(values)
        self.bias_loaded = True

    def forward_oot(self, x, residual=None):
        AscendRMSNorm.calls += 1
        if residual is not None:  # npu_add_rms_norm, then the bias whenever there is one
            out, residual = self.forward_native(x, residual)
            return (out if self.bias is None else out + self.bias), residual
        out = self.forward_native(x)  # npu_rms_norm, then the bias once loaded
        return out + self.bias if self.bias_loaded else out


class AscendSiluAndMul(SiluAndMul):
    calls = 0

    def forward_oot(self, x):
        AscendSiluAndMul.calls += 1
        return self.forward_native(x)


class AscendMRotaryEmbedding(MRotaryEmbedding):
    calls = 0
    npu_mrope_calls = 0

    def forward_oot(self, positions, query, key):
        AscendMRotaryEmbedding.calls += 1
        if self.mrope_section != [16, 24, 24]:
            return super().forward_oot(positions, query, key)
        AscendMRotaryEmbedding.npu_mrope_calls += 1  # torch_npu.npu_mrope(positions, query, key, cache, ...)
        return self.forward_native(positions, query, key)


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


def reset(release: str = "0.16.0") -> None:
    use_release(release)
    PLATFORM["name"] = "cpu"
    QUANT_CONFIG["norm.bias"] = False
    for cls in ASCEND.values():
        cls.calls = 0
    AscendMRotaryEmbedding.npu_mrope_calls = 0
