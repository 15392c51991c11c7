"""vLLM layer classes whose forwards call pto_kernels: RMSNorm (plain and residual), SiluAndMul, MRoPE.

Each class here is a mixin put in front of the class vLLM would build (its own, or the one another
plugin such as vllm-ascend registered under the same key), by `pto_layer_class`. vLLM picks one forward
per platform when a layer is built (`forward_cpu`, `forward_cuda`, `forward_oot` on Ascend, ...) and
`forward_native` when its custom ops are off, which is what a compiled graph traces. Every one of them
is routed here through one table, `PLATFORM_FORWARDS`: the layer's pto_kernels entry when its op was
switched on when the layer was built and the call fits the entry, else the class underneath.

This module imports neither vLLM nor torch at import time: the classes read only the attributes vLLM's
layers set (weight, variance_epsilon, head_size, mrope_section, cos_sin_cache, ...).
"""

from __future__ import annotations

import importlib
import logging
import sys
from collections.abc import Callable
from typing import Any

KERNEL_PACKAGE = "pto_kernels"

# Every forward vLLM's CustomOp may dispatch to; each one is given the pto_kernels path.
PLATFORM_FORWARDS = (
    "forward_native",
    "forward_cpu",
    "forward_cuda",
    "forward_hip",
    "forward_xpu",
    "forward_tpu",
    "forward_oot",
)


def serving_ops():
    """pto_kernels.serving_ops of the pto_kernels package the plugin imported."""
    return importlib.import_module(f"{KERNEL_PACKAGE}.serving_ops")


def _switched_on(op: str) -> bool:
    kernels = sys.modules.get(KERNEL_PACKAGE)
    return kernels is not None and op in kernels.switched_on()


def _platform_forward(name: str) -> Callable:
    def forward(self, *args, **kwargs):
        underneath = getattr(super(PtoLayer, self), name)
        if self.pto_kernels_on:
            return self.pto_forward(underneath, *args, **kwargs)
        return underneath(*args, **kwargs)

    forward.__name__ = forward.__qualname__ = name
    return forward


class PtoLayer:
    """What the three layers share: the switch read once per layer, every platform forward routed."""

    pto_kernels_layer = True  # marks our classes in vLLM's registry (idempotent registration)
    pto_kernels_op = ""  # the pto_kernels op that switches this layer
    replaces = ""  # the class underneath, "module.qualname", for the log

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        declined = self.pto_declines() if _switched_on(self.pto_kernels_op) else "its op is off"
        self.pto_kernels_on = declined is None
        # what this layer's forward runs, for the log and `verify --engine vllm`
        self.pto_runs = "pto_kernels" if declined is None else f"{self.replaces} ({declined})"
        _log_once(type(self).__name__, self.pto_runs)
        # looked up once here: a compiled graph traces the forwards, and the tracer cannot import
        self.pto_ops = serving_ops() if self.pto_kernels_on else None

    def pto_declines(self) -> str | None:
        """Why this instance is left to the class underneath (a configuration the pto_kernels entry does not
        compute, or one the class underneath runs as a single fused kernel); None when pto_kernels runs it."""
        return None

    def underneath_is(self, package: str) -> bool:
        return self.replaces.startswith(f"{package}.")

    def pto_forward(self, underneath: Callable, *args, **kwargs) -> Any:
        raise NotImplementedError


for _name in PLATFORM_FORWARDS:
    setattr(PtoLayer, _name, _platform_forward(_name))

_logged: set[tuple[str, str]] = set()


def _log_once(layer: str, runs: str) -> None:
    """One line per layer class and what it runs: a model builds dozens of norms alike."""
    if (layer, runs) in _logged:
        return
    _logged.add((layer, runs))
    logging.getLogger("vllm.plugins.pto_kernels").info("pto_kernels: %s layers run %s", layer, runs)


class PtoRMSNorm(PtoLayer):
    """RMSNorm(x) and the residual form RMSNorm(x, residual) -> (normed, x + residual)."""

    pto_kernels_op = "rms_norm"

    def pto_declines(self) -> str | None:
        if getattr(self, "variance_size_override", None) is not None:
            return "a partial-width variance"
        if not getattr(self, "has_weight", True):
            return "no weight"
        if getattr(self, "bias", None) is not None:
            # vllm-ascend's norm bias (quantized checkpoints): its own kernel adds it, pto_kernels has none
            return "a norm bias"
        return None

    def pto_forward(self, underneath, x, residual=None):
        weight = self.weight.data
        if residual is None:
            return self.pto_ops.rms_norm(x, weight, self.variance_epsilon).to(x.dtype)
        normed, summed = self.pto_ops.add_rms_norm(x, residual, weight, self.variance_epsilon)
        return normed.to(x.dtype), summed


class PtoSiluAndMul(PtoLayer):
    """silu(x[..., :d]) * x[..., d:], the SwiGLU activation between the merged gate_up and down_proj."""

    pto_kernels_op = "swiglu_mlp"

    def pto_forward(self, underneath, x):
        return self.pto_ops.silu_and_mul(x)


# Sections vllm-ascend's forward_oot runs as one torch_npu.npu_mrope kernel (the cos/sin gather, the section
# mix and q and k rotated); pto_kernels' MRoPE needs the gather and reshapes before its kernel.
ASCEND_NPU_MROPE_SECTIONS = ([16, 24, 24],)


class PtoMRotaryEmbedding(PtoLayer):
    """MRoPE with the T/H/W sections side by side (Qwen2-VL, Qwen2.5-VL), neox-style, whole head.

    Interleaved sections (Qwen3-VL), GPT-J-style pairs, a partial rotary dimension and per-token offsets
    run the class underneath, and so does every section vllm-ascend runs as its single npu_mrope kernel.
    """

    pto_kernels_op = "mrope"

    def pto_declines(self) -> str | None:
        if not getattr(self, "mrope_section", None) or getattr(self, "mrope_interleaved", False):
            return "interleaved or no MRoPE sections"
        if not getattr(self, "is_neox_style", False) or self.rotary_dim != self.head_size:
            return "GPT-J pairs or a partial rotary dimension"
        if self.underneath_is("vllm_ascend") and list(self.mrope_section) in ASCEND_NPU_MROPE_SECTIONS:
            return f"mrope_section {list(self.mrope_section)}: one torch_npu.npu_mrope kernel"
        return None

    def pto_forward(self, underneath, *args, **kwargs):
        positions, query, key = _kernel_call(*args, **kwargs)
        if key is None:  # exactly what the caller gave: vllm-ascend's forward_oot takes no offsets
            return underneath(*args, **kwargs)
        if positions.ndim == 1:  # text only: the three position rows are the same
            positions = positions.expand(3, -1)
        matched = self._match_cos_sin_cache_dtype(query)  # some vLLM releases set the attribute, return None
        cache = self.cos_sin_cache if matched is None else matched
        cos, sin = cache[positions].chunk(2, dim=-1)  # [3, tokens, head_size // 2] each
        return self.pto_ops.token_mrope(query, key, cos, sin, list(self.mrope_section), self.head_size)


def _kernel_call(positions, query, key=None, offsets=None):
    """(positions, query, key) of a call the MRoPE entry computes; key None when it does not (no key, per-token
    offsets, positions of another rank)."""
    if key is None or offsets is not None or positions.ndim not in (1, 2):
        return positions, query, None
    return positions, query, key


# vLLM's registry key (its in-tree class name) -> the mixin for it
MIXINS: dict[str, type[PtoLayer]] = {
    "RMSNorm": PtoRMSNorm,
    "SiluAndMul": PtoSiluAndMul,
    "MRotaryEmbedding": PtoMRotaryEmbedding,
}


def pto_layer_class(key: str, underneath: type) -> type:
    """A class that runs pto_kernels in front of `underneath` (vLLM's class or another plugin's)."""
    mixin = MIXINS[key]
    return type(
        f"Pto{underneath.__name__}",
        (mixin, underneath),
        {"replaces": f"{underneath.__module__}.{underneath.__qualname__}", "__module__": __name__},
    )


def is_pto_layer(cls: type | None) -> bool:
    return bool(getattr(cls, "pto_kernels_layer", False))
