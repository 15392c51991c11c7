"""The pypto backend as the dispatcher sees it: each kernel entry, from the module that defines it.

The reference system's three ops (and the serving engines' forms of them) live in pypto_kernels.py with the
machinery every PyPTO kernel shares; the decoder-layer blocks in pypto_blocks.py and pypto_prologue.py, which import that
machinery. This table hands both to the dispatcher without either module importing the other back. Each
entry is looked up in its module at every call, so a kernel replaced there (a test, a hot fix) is seen.
"""

from . import pypto_attention, pypto_blocks, pypto_kernels, pypto_prologue

# kernel entry (as _dispatch names it) -> the module that defines it
ENTRIES = {
    "rms_norm": pypto_kernels,
    "mrope": pypto_kernels,
    "mrope_mixed": pypto_kernels,
    "swiglu_mlp": pypto_kernels,
    "swiglu_mlp_weights": pypto_kernels,
    "add_rms_norm": pypto_kernels,
    "silu_and_mul": pypto_kernels,
    "residual_rms_norm": pypto_blocks,
    "mlp_block": pypto_blocks,
    "attention_prologue": pypto_prologue,
    "attention_prologue_mixed": pypto_prologue,
    "attention_prologue_cached": pypto_prologue,
    "attention_prologue_mixed_cached": pypto_prologue,
    "attention_core": pypto_attention,
    "attention_core_masked": pypto_attention,
}


def kernel_stats() -> dict[str, dict]:
    """Per op: kernels built, pypto compiles and their seconds, cache hits, evictions and kernels held."""
    return pypto_kernels.kernel_stats()


def reset_kernel_stats() -> None:
    pypto_kernels.reset_kernel_stats()


def __getattr__(name: str):
    module = ENTRIES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(module, name)
