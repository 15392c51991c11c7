"""A stand-in for Hugging Face `kernels` 0.19, the release transformers 5.25.0 requires (>=0.19.1,<0.20).

The index these machines reach stops at kernels 0.17.2, so tests put this folder first on PYTHONPATH
instead; its dist-info says 0.19.1, the version transformers checks. It mirrors what transformers 5.25.0
calls (`transformers/integrations/hub_kernels.py` imports the names below) with the behaviour of
huggingface/kernels at commit 8ac69fc5 (0.17.0.dev0, the newest source readable here):
`kernels/src/kernels/layer/{layer,kernelize,repos,mode,device}.py`. Where that behaviour refuses
something, this refuses it too:

- `use_kernel_forward_from_hub` on a class only names it (`kernel_layer_name`); on a function it turns
  the function into an instance of a small `nn.Module` whose forward calls the function;
- `kernelize` sets `forward` on each named module instance (and on the function modules a layer holds
  in `_kernel_funcs`): the mapped hub layer's forward where the mapping has one for the device and
  mode, else the class's own forward (fallback), else raises;
- a hub layer must be stateless (no `__init__`, no members of its own) and take a forward of the same
  shape, or `kernelize` raises TypeError;
- `LayerRepository` wants exactly one of `revision` and `version`.

Not the real thing: there is no hub. `get_kernel` knows only the repositories in `STAND_IN_HUB`, and
raises FileNotFoundError for any other, as a kernel missing from the hub's cache does offline. 0.19's
`KernelizeFallback` is only known by the name transformers passes (`KernelizeFallback.ALL`).
"""

from __future__ import annotations

import enum
import inspect
import sys
import types
import warnings
from contextvars import ContextVar
from copy import deepcopy
from dataclasses import dataclass
from inspect import Parameter, Signature

__version__ = "0.19.1"


class Mode(enum.Flag):
    """What a kernel is registered for; INFERENCE and TRAINING exclude each other, FALLBACK stands alone."""

    _NONE = 0
    FALLBACK = enum.auto()
    TRAINING = enum.auto()
    INFERENCE = enum.auto()
    TORCH_COMPILE = enum.auto()

    def __or__(self, other):
        union = super().__or__(other)
        if Mode.INFERENCE in union and Mode.TRAINING in union:
            raise ValueError("Mode.INFERENCE and Mode.TRAINING are mutually exclusive.")
        if Mode.FALLBACK in union and union != Mode.FALLBACK:
            raise ValueError("Mode.FALLBACK cannot be combined with other modes.")
        return union


# In the order the real kernels tries them for a requested mode.
_MODE_ORDER = {
    Mode.INFERENCE: (Mode.INFERENCE, Mode.INFERENCE | Mode.TORCH_COMPILE, Mode.TRAINING,
                     Mode.TRAINING | Mode.TORCH_COMPILE, Mode.FALLBACK),
    Mode.TRAINING: (Mode.TRAINING, Mode.TRAINING | Mode.TORCH_COMPILE, Mode.FALLBACK),
    Mode.INFERENCE | Mode.TORCH_COMPILE: (Mode.INFERENCE | Mode.TORCH_COMPILE,
                                          Mode.TRAINING | Mode.TORCH_COMPILE, Mode.FALLBACK),
    Mode.TRAINING | Mode.TORCH_COMPILE: (Mode.TRAINING | Mode.TORCH_COMPILE, Mode.FALLBACK),
}  # fmt: skip


class KernelizeFallback(enum.Enum):
    """0.19's `use_fallback` values: ALL falls back to the layer's own forward wherever no kernel fits."""

    NONE = "none"
    ALL = "all"


_DEVICE_TYPES = {"cpu", "cuda", "mps", "neuron", "npu", "rocm", "tpu", "xpu"}


@dataclass(frozen=True)
class CUDAProperties:
    min_capability: int
    max_capability: int


@dataclass(frozen=True)
class ROCMProperties:
    min_capability: int
    max_capability: int


@dataclass(frozen=True)
class Device:
    type: str
    properties: CUDAProperties | ROCMProperties | None = None

    def __post_init__(self):
        if isinstance(self.properties, CUDAProperties) and self.type != "cuda":
            raise ValueError("CUDAProperties is only supported for 'cuda' devices.")
        if isinstance(self.properties, ROCMProperties) and self.type != "rocm":
            raise ValueError("ROCMProperties is only supported for 'rocm' devices.")


class LayerRepository:
    """A layer in a hub kernel repository: `repo_id`, `layer_name`, and one of `revision` and `version`."""

    def __init__(self, repo_id, *, layer_name, revision=None, version=None, trust_remote_code=False):
        if revision is not None and version is not None:
            raise ValueError("Either a revision or a version must be specified, not both.")
        if revision is None and version is None:
            raise ValueError("Either a revision or a version must be specified.")
        self._repo_id, self.layer_name = repo_id, layer_name
        self._revision, self._version = revision, version

    def load(self):
        kernel = get_kernel(self._repo_id, revision=self._revision, version=self._version)
        layer = getattr(getattr(kernel, "layers", None), self.layer_name, None)
        if layer is None:
            raise ValueError(f"Layer `{self.layer_name}` not found in kernel repo {self}.")
        return layer

    def __eq__(self, other):
        return isinstance(other, LayerRepository) and self._key() == other._key()

    def __hash__(self):
        return hash(self._key())

    def _key(self):
        return (self._repo_id, self.layer_name, self._revision, self._version)

    def __str__(self):
        return f"`{self._repo_id}` (revision: {self._revision}, version: {self._version}), layer `{self.layer_name}`"


class LocalLayerRepository:
    """A layer from a kernel built on disk; the stand-in has no loader for one."""

    def __init__(self, repo_path, *, package_name=None, layer_name):
        self.repo_path, self.package_name, self.layer_name = repo_path, package_name, layer_name

    def load(self):
        raise FileNotFoundError(f"stand-in kernels: no local kernel loader ({self.repo_path})")


# --- the stand-in's hub: the repositories tests may map, with layers written for the stand-in ---------


def _liger_kernels():
    import torch
    from torch import nn

    class LigerRMSNorm(nn.Module):
        """Stateless, as hub layers must be: reads the replaced module's `weight` and `variance_epsilon`."""

        can_torch_compile = True

        def forward(self, hidden_states):
            dtype = hidden_states.dtype
            x = hidden_states.to(torch.float32)
            x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
            return self.weight * x.to(dtype)

    return types.SimpleNamespace(layers=types.SimpleNamespace(LigerRMSNorm=LigerRMSNorm))


STAND_IN_HUB = {"kernels-community/liger-kernels": _liger_kernels}


def get_kernel(repo_id, revision=None, version=None, user_agent=None, trust_remote_code=False):
    if revision is not None and version is not None:
        raise ValueError("Either a revision or a version must be specified, not both.")
    build = STAND_IN_HUB.get(repo_id)
    if build is None:
        raise FileNotFoundError(
            f"kernel {repo_id} is not on the stand-in hub (it has {sorted(STAND_IN_HUB)})"
        )
    module = build()
    module.__name__ = repo_id
    return module


# --- mapping -------------------------------------------------------------------------------------------

# As in kernels: one dict by default, which register_kernel_mapping merges into in place.
_KERNEL_MAPPING: ContextVar[dict] = ContextVar("_KERNEL_MAPPING", default={})  # noqa: B039


def register_kernel_mapping(mapping, inherit_mapping=True):
    """Merge `mapping` ({layer name: {device: repo or {Mode: repo}}}) into the current one."""
    if not inherit_mapping:
        _KERNEL_MAPPING.set({})
    for layer_name, device_repos in mapping.items():
        per_device = _KERNEL_MAPPING.get().setdefault(layer_name, {})
        for device, repos in device_repos.items():
            device = Device(type=device) if isinstance(device, str) else device
            if device.type not in _DEVICE_TYPES:
                raise ValueError(f"Unknown device type: {device.type}")
            options = repos if isinstance(repos, dict) else {Mode.FALLBACK: repos}
            per_device.setdefault(device.type, []).append((device.properties, options))


class use_kernel_mapping:  # noqa: N801 - a function in the real package, returning this context manager
    def __init__(self, mapping, *, inherit_mapping=True):
        self.mapping, self.inherit = mapping, inherit_mapping

    def __enter__(self):
        self.token = _KERNEL_MAPPING.set(deepcopy(_KERNEL_MAPPING.get()) if self.inherit else {})
        register_kernel_mapping(self.mapping)

    def __exit__(self, *exc):
        _KERNEL_MAPPING.reset(self.token)


def _capability():
    import torch

    major, minor = torch.cuda.get_device_capability(device=None)
    return major * 10 + minor


def _repos_for(entries, device: Device):
    """The {Mode: repo} registered for the device: the last one for most types, by capability for cuda/rocm."""
    if device.type not in ("cuda", "rocm"):
        return entries[-1][1]
    capability = _capability()
    fitting = [
        (props.max_capability - props.min_capability if props else sys.maxsize, options)
        for props, options in entries
        if props is None or props.min_capability <= capability <= props.max_capability
    ]
    return min(fitting, key=lambda item: item[0])[1] if fitting else None


# --- layers --------------------------------------------------------------------------------------------


def replace_kernel_forward_from_hub(cls, layer_name: str):
    cls.kernel_layer_name = layer_name


def _function_module(func):
    from torch import nn

    class Func(nn.Module):
        can_torch_compile = getattr(func, "can_torch_compile", False)
        has_backward = getattr(func, "has_backward", True)

        def forward(self, *args, **kwargs):
            return func(*args, **kwargs)

    signature = inspect.signature(func)
    Func.forward.__signature__ = Signature(
        [Parameter("self", Parameter.POSITIONAL_OR_KEYWORD), *signature.parameters.values()],
        return_annotation=signature.return_annotation,
    )
    return Func


def use_kernel_forward_from_hub(layer_name: str):
    def decorator(target):
        if inspect.isfunction(target):
            func_module = _function_module(target)
            replace_kernel_forward_from_hub(func_module, layer_name)
            return func_module()
        if inspect.isclass(target):
            replace_kernel_forward_from_hub(target, layer_name)
            return target
        raise TypeError("@use_kernel_forward_from_hub can only be applied to classes or functions")

    return decorator


def use_kernelized_func(*functions):
    """Keep the function modules on each instance (`_kernel_funcs`), where `kernelize` finds them."""

    def decorator(cls):
        for function in functions:
            if not hasattr(function, "kernel_layer_name"):
                raise ValueError(
                    f"Function `{getattr(function, '__name__', function)}` is not decorated with "
                    "@use_kernel_forward_from_hub and cannot be used with @use_kernelized_func"
                )
        original_init = cls.__init__

        def __init__(self, *args, **kwargs):
            original_init(self, *args, **kwargs)
            held = self.__dict__.setdefault("_kernel_funcs", {})
            for function in functions:
                held[getattr(function, "__name__", None) or function.kernel_layer_name] = function

        cls.__init__ = __init__
        return cls

    return decorator


def _check_layer(layer, replaced, repo):
    from torch import nn

    if not issubclass(layer, nn.Module):
        raise TypeError(f"Layer `{layer.__name__}` is not a Torch layer.")
    if layer.__init__ is not nn.Module.__init__:
        raise TypeError(f"{repo} must not override nn.Module constructor.")
    own = {name for name, _ in inspect.getmembers(layer)} - {
        name for name, _ in inspect.getmembers(nn.Module)
    }
    if not own <= {"can_torch_compile", "has_backward"}:
        raise TypeError(f"{repo} must not contain additional members compared to `{replaced.__name__}`.")
    params = list(inspect.signature(layer.forward).parameters.values())
    wanted = list(inspect.signature(replaced.forward).parameters.values())
    if len(params) != len(wanted):
        raise TypeError(
            f"Forward signature of {repo} does not match `{replaced.__name__}`: different number of arguments."
        )
    for param, want in zip(params, wanted, strict=True):
        if param.kind != want.kind:
            raise TypeError(
                f"Forward signature of {repo} does not match `{replaced.__name__}`: different kind of arguments"
            )


def _set_forward(module, layer) -> None:
    module.forward = types.MethodType(layer.forward, module)


def _kernelize_layer(module, mode: Mode, device: Device, use_fallback: bool) -> None:
    cls = type(module)
    name = cls.kernel_layer_name
    per_device = _KERNEL_MAPPING.get().get(str(name))
    if per_device is None:
        warnings.warn(f"No kernel mapping found for layer `{name}`.", stacklevel=3)
        if not use_fallback:
            raise ValueError(f"No layer mapping for `{name}`")
        _set_forward(module, cls)
        return
    entries = per_device.get(device.type)
    repos = _repos_for(entries, device) if entries else None
    repo = next((repos[m] for m in _MODE_ORDER[mode] if repos and m in repos), None)
    if repo is None:
        if not use_fallback:
            raise ValueError(
                f"No layer mapping for `{name}` with device type `{device.type}` and mode {mode}"
            )
        _set_forward(module, cls)
        return
    layer = repo.load()
    _check_layer(layer, cls, repo)
    if Mode.TORCH_COMPILE in mode and not getattr(layer, "can_torch_compile", False):
        if not use_fallback:
            raise ValueError(f"Available kernel does not support mode: {mode}")
        _set_forward(module, cls)
        return
    _set_forward(module, layer)


def kernelize(model, *, mode, device=None, use_fallback=True):
    """Set `forward` on every module whose class names a hub layer (see the module docstring)."""
    if mode == Mode.FALLBACK:
        raise ValueError("Mode.FALLBACK can only be used to register kernel mappings.")
    if Mode.INFERENCE not in mode and Mode.TRAINING not in mode:
        raise ValueError("kernelize mode must contain Mode.INFERENCE or Mode.TRAINING.")
    if mode not in _MODE_ORDER:
        raise ValueError(f"Unsupported mode: {mode}")
    if isinstance(use_fallback, KernelizeFallback):
        use_fallback = use_fallback is KernelizeFallback.ALL
    if device is None:
        device = Device(type=next(model.parameters()).device.type)
    elif isinstance(device, str):
        if device not in _DEVICE_TYPES:
            raise ValueError(
                f"Unsupported device type '{device}'. Supported device types are: {', '.join(sorted(_DEVICE_TYPES))}"
            )
        device = Device(type=device)
    else:
        device = Device(type=device.type)
    for _, module in model.named_modules():
        for func_module in getattr(module, "_kernel_funcs", {}).values():
            _kernelize_layer(func_module, mode, device, use_fallback)
        if hasattr(type(module), "kernel_layer_name"):
            _kernelize_layer(module, mode, device, use_fallback)
    return model


__all__ = [
    "CUDAProperties",
    "Device",
    "KernelizeFallback",
    "LayerRepository",
    "LocalLayerRepository",
    "Mode",
    "ROCMProperties",
    "STAND_IN_HUB",
    "get_kernel",
    "kernelize",
    "register_kernel_mapping",
    "replace_kernel_forward_from_hub",
    "use_kernel_forward_from_hub",
    "use_kernel_mapping",
    "use_kernelized_func",
]
