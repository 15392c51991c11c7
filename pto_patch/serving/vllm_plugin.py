"""The vLLM plugin (entry point `pto_kernels` in the `vllm.general_plugins` group, extra `vllm`).

vLLM builds its own layers and never reads a patched modeling file; it swaps a layer class for the one
registered under the class's name in its out-of-tree registry (`CustomOp.register_oot`). `register()`
puts classes there whose forwards call pto_kernels (`pto_patch.serving.vllm_layers`), for the ops named in
$PTO_KERNELS_VLLM_OPS, on the backend $PTO_KERNELS_BACKEND chooses:

    PTO_KERNELS_VLLM_OPS=all vllm serve ./GutenOCR-3B        # or rms_norm,mrope,swiglu_mlp
    PTO_KERNELS_VLLM_OPS=rms_norm PTO_KERNELS_BACKEND=fused ...

Unset or empty, the plugin does nothing. vLLM loads general plugins in every process it starts (front
end, engine core, each worker), maybe more than once in one: registering is idempotent.

Taking turns with vllm-ascend: its worker registers its own classes under the same three keys after the
general plugins have loaded, and the registry refuses a second class for a key ("Duplicate op name").
So the plugin hooks `CustomOp.register_oot`: a later registration under a key the plugin holds goes
through as asked and then gets the pto_kernels class put in front of it (the vllm-ascend class becomes
the class underneath, run whenever pto_kernels does not apply); a key someone registered before the
plugin is wrapped at once. Each replacement is logged.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from pto_patch.errors import EXIT_USAGE, PtoPatchError
from pto_patch.model.spec import BLOCK_OPS, REFERENCE_OPS
from pto_patch.resources import kernels_dir
from pto_patch.serving.vllm_layers import KERNEL_PACKAGE, MIXINS, is_pto_layer, pto_layer_class

OPS_ENV = "PTO_KERNELS_VLLM_OPS"
# vLLM's layers take the reference's three ops; the decoder-layer blocks live in patched transformers code
SERVED_OPS = REFERENCE_OPS
BACKEND_ENV = "PTO_KERNELS_BACKEND"
BACKENDS = ("auto", "pypto", "npu", "torch", "fused")

# vLLM registry key (the in-tree class name) -> the module that defines that class
IN_TREE = {
    "RMSNorm": "vllm.model_executor.layers.layernorm",
    "SiluAndMul": "vllm.model_executor.layers.activation",
    "MRotaryEmbedding": "vllm.model_executor.layers.rotary_embedding.mrope",
}
# the pto_kernels op that switches each key on
KEY_OPS = {key: mixin.pto_kernels_op for key, mixin in MIXINS.items()}

# under "vllm.", so vLLM's own log handler prints it beside its messages
_log = logging.getLogger("vllm.plugins.pto_kernels")


class PluginSettingsError(PtoPatchError):
    """$PTO_KERNELS_VLLM_OPS or $PTO_KERNELS_BACKEND names something that does not exist."""

    exit_code = EXIT_USAGE


@dataclass(frozen=True)
class PluginSettings:
    ops: tuple[str, ...]  # pto_kernels ops switched on, in SERVED_OPS order; empty: the plugin does nothing
    backend: str

    def keys(self) -> tuple[str, ...]:
        """The vLLM registry keys these ops replace."""
        return tuple(key for key, op in KEY_OPS.items() if op in self.ops)


def plugin_settings(environ: Mapping[str, str]) -> PluginSettings:
    """The switch and backend from the environment, checked: an unknown name is an error, never ignored."""
    text = environ.get(OPS_ENV, "").strip()
    backend = environ.get(BACKEND_ENV, "").strip().lower() or "auto"
    if backend not in BACKENDS:
        raise PluginSettingsError(
            f"{BACKEND_ENV}={environ.get(BACKEND_ENV)!r} is not a pto_kernels backend",
            f"set it to one of {', '.join(BACKENDS)}, or unset it for auto",
        )
    if not text:
        return PluginSettings((), backend)
    wanted = SERVED_OPS if text == "all" else tuple(part.strip() for part in text.split(",") if part.strip())
    blocks = [op for op in wanted if op in BLOCK_OPS]
    if blocks:
        raise PluginSettingsError(
            f"{OPS_ENV}={text!r} names decoder-layer block(s) {', '.join(blocks)}, which vLLM cannot run",
            f"vLLM builds its own layers (no patched decoder layer to hold a block): use {', '.join(SERVED_OPS)}, or all",
        )
    unknown = [op for op in wanted if op not in SERVED_OPS]
    if unknown or not wanted:
        raise PluginSettingsError(
            f"{OPS_ENV}={text!r} names unknown pto_kernels op(s) {', '.join(map(repr, unknown))}",
            f"use a comma list of {', '.join(SERVED_OPS)}, or all",
        )
    return PluginSettings(tuple(op for op in SERVED_OPS if op in wanted), backend)


def import_kernels():
    """The first `pto_kernels` on sys.path, else pto-patch's bundled copy (appended last, so a copy the
    user put on PYTHONPATH wins); with its serving entries registered as custom ops."""
    try:
        kernels = importlib.import_module(KERNEL_PACKAGE)
    except ImportError:
        sys.path.append(str(kernels_dir()))
        importlib.invalidate_caches()
        kernels = importlib.import_module(KERNEL_PACKAGE)
    importlib.import_module(f"{KERNEL_PACKAGE}.serving_ops")
    return kernels


def register() -> None:
    """The entry point vLLM calls in each of its processes."""
    settings = plugin_settings(os.environ)
    if not settings.ops:
        return
    kernels = import_kernels()
    if tuple(kernels.switched_on()) != settings.ops:
        kernels.enable(settings.ops, backend=settings.backend)
    from vllm.model_executor import custom_op

    registry = oot_registry(custom_op)
    in_tree = {key: getattr(importlib.import_module(IN_TREE[key]), key) for key in settings.keys()}
    take_turn(custom_op.CustomOp, registry.entries, in_tree)
    _log.info(
        "pto_kernels: vLLM %s (%s); its %s run pto_kernels (%s, backend %s) in process %d",
        registry.vllm_version,
        registry.where,
        ", ".join(in_tree),
        ", ".join(settings.ops),
        settings.backend,
        os.getpid(),
    )


class RegistryNotFoundError(PtoPatchError):
    """The vLLM that loaded the plugin keeps its out-of-tree layer registry in neither known place."""


@dataclass(frozen=True)
class OotRegistry:
    entries: dict[str, type]  # vLLM's own dict: key -> registered class
    where: str  # which of the two shapes, for the log
    vllm_version: str


def oot_registry(custom_op) -> OotRegistry:
    """vLLM's out-of-tree registry in `custom_op` (vllm.model_executor.custom_op), in either shape: the module
    attribute since the PluggableLayer refactor (vLLM 0.16 on), the class attribute before it (up to 0.13,
    which vllm-ascend v0.11.0 and v0.13.0 pin)."""
    version = str(getattr(sys.modules.get("vllm"), "__version__", "of unknown release"))
    module_level = getattr(custom_op, "op_registry_oot", None)
    if isinstance(module_level, dict):
        return OotRegistry(module_level, "custom_op.op_registry_oot, the >= 0.16 shape", version)
    class_level = vars(custom_op.CustomOp).get("op_registry_oot")
    if isinstance(class_level, dict):
        return OotRegistry(class_level, "CustomOp.op_registry_oot, the <= 0.13 shape", version)
    raise RegistryNotFoundError(
        f"vLLM {version} has no out-of-tree layer registry where pto_kernels looks "
        "(vllm.model_executor.custom_op.op_registry_oot or CustomOp.op_registry_oot)",
        f"unset {OPS_ENV} to run vLLM without pto_kernels, or use a vLLM from 0.11 to 0.32",
    )


def take_turn(custom_op_cls: type, registry: dict[str, type], in_tree: Mapping[str, type]) -> dict[str, type]:
    """Put a pto_kernels class under each key of `in_tree`, in front of whatever holds the key (vLLM's own
    class if nobody registered one), and let later registrations under those keys through (see the module
    docstring). Idempotent. Returns key -> the class now registered."""
    _hook_register_oot(custom_op_cls, registry, frozenset(in_tree))
    for key, own in in_tree.items():
        held = registry.get(key)
        if is_pto_layer(held):
            continue
        if held is None:
            custom_op_cls.register_oot(pto_layer_class(key, own), name=key)
        else:
            _put_in_front(registry, key, held)
    return {key: registry[key] for key in in_tree}


def _put_in_front(registry: dict[str, type], key: str, held: type) -> None:
    wrapped = pto_layer_class(key, held)
    wrapped.name = key
    registry[key] = wrapped
    _log.warning(
        "pto_kernels: %s registered %s for vLLM's %s; pto_kernels runs in front of it (%s), and it runs "
        "wherever pto_kernels does not apply",
        held.__module__.split(".")[0],
        wrapped.replaces,
        key,
        wrapped.__name__,
    )


def _hook_register_oot(custom_op_cls: type, registry: dict[str, type], keys: frozenset[str]) -> None:
    current = custom_op_cls.__dict__["register_oot"]
    if getattr(current.__func__, "pto_kernels_turn", None) is not None:
        current.__func__.pto_kernels_turn.update(keys)
        return
    original: Callable = current.__func__
    ours: set[str] = set(keys)

    def register_oot(cls, _decorated_op_cls=None, name: str | None = None):
        def decorator(op_cls):
            key = name if name is not None else cls.__name__
            held = registry.get(key)
            if key not in ours or not is_pto_layer(held) or is_pto_layer(op_cls):
                return original(cls, op_cls, name=name)
            del registry[key]  # the newcomer registers as it asked, then pto_kernels goes in front again
            registered = original(cls, op_cls, name=name)
            _put_in_front(registry, key, op_cls)
            return registered

        if _decorated_op_cls is None:
            return decorator
        if not isinstance(_decorated_op_cls, type):
            return original(cls, _decorated_op_cls, name=name)  # vLLM's own TypeError
        return decorator(_decorated_op_cls)

    register_oot.pto_kernels_turn = ours
    custom_op_cls.register_oot = classmethod(register_oot)
