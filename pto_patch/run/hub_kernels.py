"""Hugging Face hub kernels at load time: off unless a run asks for them, and what they replaced.

transformers 5.25 kernelizes every model it loads unless told otherwise (`use_kernels=None` means on
unless USE_HUB_KERNELS is false), and refuses to load without `kernels` 0.19. Where `kernels` is
installed, its default mapping sets the forward of each RMSNorm (cuda, rocm) and of the rotary function
(cuda, xpu) to a hub kernel's: the injected guards never run there. Every release pto-patch supports
(4.57 on) takes `use_kernels`, so a run always passes it: False, so that only the guards decide the
patched ops and the baseline and PTO modes run the same code; True with --hub-kernels, to measure or
verify beside the hub kernels (verify then fails naming the layers they took from a switched-on op).
"""

from __future__ import annotations

import importlib.metadata

from pto_patch.errors import EXIT_USAGE, PtoPatchError

HUB_KERNELS_HINT = (
    "install the `kernels` release your transformers names (transformers 5.25: pip install 'kernels>=0.19.1,<0.20'), "
    "or drop --hub-kernels"
)


def load_arguments(hub_kernels: bool) -> dict[str, bool]:
    """What `from_pretrained` gets: an explicit `use_kernels`, whatever the release's default."""
    return {"use_kernels": hub_kernels}


def check_hub_kernels(hub_kernels: bool) -> None:
    """--hub-kernels needs a `kernels` package the installed transformers accepts (checked before the load)."""
    if not hub_kernels:
        return
    from transformers.utils import import_utils

    available = getattr(import_utils, "is_kernels_available", None)
    if available is not None and available():
        return
    try:
        found = f"kernels {importlib.metadata.version('kernels')} is installed"
    except importlib.metadata.PackageNotFoundError:
        found = "no `kernels` package is installed"
    raise PtoPatchError(
        f"--hub-kernels: {found}, and the installed transformers cannot use it",
        HUB_KERNELS_HINT,
        exit_code=EXIT_USAGE,
    )


def kernelized_layers(model) -> dict[str, int]:
    """{'<hub layer name> -> <forward now run>': modules} for each module whose forward kernelize replaced."""
    import types

    replaced: dict[str, int] = {}
    for module in _modules_and_function_layers(model):
        layer_name = getattr(type(module), "kernel_layer_name", None)
        forward = module.__dict__.get("forward")
        if layer_name is None or not isinstance(forward, types.MethodType):
            continue
        if forward.__func__ is getattr(type(module), "forward", None):
            continue  # kernelize's fallback: the module's own forward
        key = f"{layer_name} -> {forward.__func__.__qualname__}"
        replaced[key] = replaced.get(key, 0) + 1
    return replaced


def _modules_and_function_layers(model):
    seen: set[int] = set()
    for _, module in model.named_modules():
        held = module.__dict__.get("_kernel_funcs") or {}  # kernels' function layers a module holds
        for candidate in (module, *held.values()):
            if id(candidate) not in seen:
                seen.add(id(candidate))
                yield candidate


def describe_hub_kernels(model, hub_kernels: bool) -> str:
    """One line for the report: off, or on with what the hub kernels replaced."""
    if not hub_kernels:
        return "off (loaded with use_kernels=False: only the injected guards decide the patched ops)"
    try:
        version = importlib.metadata.version("kernels")
    except importlib.metadata.PackageNotFoundError:
        version = "?"
    if not getattr(model, "use_kernels", False):
        return f"asked for, but transformers did not kernelize (USE_HUB_KERNELS false?); kernels {version}"
    replaced = kernelized_layers(model)
    if not replaced:
        return f"on (kernels {version}): no layer replaced on this device"
    listed = ", ".join(f"{key} ({count} module(s))" for key, count in sorted(replaced.items()))
    return f"on (kernels {version}): replaced {listed}"
