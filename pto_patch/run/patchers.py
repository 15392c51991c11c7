"""Other patchers: whatever, besides the injected guard, decides what runs for an op in a loaded model.

Run-time patchers (Liger's `model=` path, Hugging Face `kernels`' kernelize) set `forward` on module
instances; others replace a class's `forward` or a module-level function after import. Where one
bypasses the guard, the PTO kernel cannot run there, and verify says so.
"""

from __future__ import annotations

import importlib.metadata
import inspect
import sys

from pto_patch.model.spec import ModelSpec
from pto_patch.run.report import OtherPatcher

OTHER_PATCHER_HINT = "load the model without the other patcher, or `pto-patch restore` and apply after it"
HUB_KERNEL_MARK = (
    "kernelized: hub kernel layer"  # in `how` where Hugging Face kernels' kernelize set the forward
)
HUB_KERNEL_HINT = "drop --hub-kernels: the patch's guards then decide every patched op"


def _code_of(function):
    function = getattr(function, "__func__", function)  # a bound method's function
    return getattr(function, "__code__", None)


def guarded_ops(function, switches: dict[str, str]) -> set[str]:
    """The ops whose guard `function` carries: it binds `pto_kernels` and reads a USE_PTO_* switch."""
    code = _code_of(function)
    if code is None or "pto_kernels" not in code.co_varnames:
        return set()
    return {switches[c] for c in code.co_consts if isinstance(c, str) and c in switches}


def _wraps_guard(function, op: str, switches: dict[str, str]) -> bool:
    """`function` declares (functools.wraps) that it wraps a guarded forward, directly or further down."""
    for _ in range(16):
        function = getattr(function, "__wrapped__", None)
        if function is None:
            return False
        if op in guarded_ops(function, switches):
            return True
    return False


def _reaches_guard(function, op: str, switches: dict[str, str]) -> bool:
    """`function` is the guarded one, wraps it (functools.wraps), or calls it from its closure: the
    module `kernels` makes of a hub-decorated function (`use_kernel_forward_from_hub` on a function)
    has a forward that calls the function it was made from."""
    if op in guarded_ops(function, switches) or _wraps_guard(function, op, switches):
        return True
    for cell in getattr(getattr(function, "__func__", function), "__closure__", None) or ():
        try:
            held = cell.cell_contents
        except ValueError:  # a cell not yet bound
            continue
        if callable(held) and not isinstance(held, type):
            if op in guarded_ops(held, switches) or _wraps_guard(held, op, switches):
                return True
    return False


def _global_bypass(value, op: str, switches: dict[str, str]) -> str | None:
    """How a module global that carried the guard when apply wrote it now skips it; None if it does not."""
    import torch

    if isinstance(value, torch.nn.Module):  # `kernels` turned the function into a module instance
        forward = value.__dict__.get("forward") or type(value).forward
        if _reaches_guard(forward, op, switches):
            return None
        hub_layer = getattr(type(value), "kernel_layer_name", None)
        by = f" ({HUB_KERNEL_MARK} {hub_layer!r})" if hub_layer else ""
        return f"module global's forward{by}: {_describe(forward)}"
    if inspect.isclass(value) or not _reaches_guard(value, op, switches):
        return f"module global replaced by {_describe(value)}"
    return None


def _describe(function) -> str:
    function = getattr(function, "__func__", function)
    name = getattr(function, "__qualname__", None) or type(function).__qualname__
    return f"{getattr(function, '__module__', None) or '?'}.{name}"


def _guard_targets(
    module, switches: dict[str, str], guard_sites: dict[str, list[str]]
) -> dict[str, list[str]]:
    """{name: [op]} for each class or function of the patched module that carried guards when apply wrote
    it (a decoder layer carries one per block): as its source holds them (`guard_sites`, read from the
    folder's modeling file: a forward replaced since still counts), and by behaviour."""
    targets: dict[str, list[str]] = {}
    for op, names in guard_sites.items():
        for name in names:
            targets.setdefault(name, []).append(op)
    for name, value in vars(module).items():
        function = value.__dict__.get("forward") if isinstance(value, type) else value
        for op in sorted(guarded_ops(function, switches)):
            if op not in targets.setdefault(name, []):
                targets[name].append(op)
    return targets


def find_other_patchers(model, spec: ModelSpec, guard_sites: dict[str, list[str]]) -> list[OtherPatcher]:
    """Every place in the loaded model where something other than the injected guard runs for an op;
    `guard_sites`: the guards the folder's modeling file holds (`model.injections_found.guarded_in_folder`).

    Run-time patchers (Liger's `model=` path, Hugging Face `kernels`' kernelize) set `forward` on
    module instances; others replace a class's `forward` or a module-level function after import.
    """
    import torch

    switches = {injection.switch: op for op, injection in spec.injections.items()}
    module = sys.modules.get(type(model).__module__)
    if module is None:
        return []
    targets = _guard_targets(module, switches, guard_sites)
    classes = {
        value: targets[name]
        for name, value in vars(module).items()
        if name in targets and inspect.isclass(value) and issubclass(value, torch.nn.Module)
    }
    found: list[OtherPatcher] = []
    for name, ops in targets.items():
        value = vars(module).get(name)
        if value is None or (inspect.isclass(value) and value in classes):
            continue
        for op in ops:
            how = _global_bypass(value, op, switches)
            if how is not None:
                found.append(OtherPatcher(op, f"{module.__name__}.{name}", how, True))
    functions = {name for name in targets if not inspect.isclass(vars(module).get(name))}
    for path, layer in model.named_modules():
        ops = next((ops for cls, ops in classes.items() if isinstance(layer, cls)), ())
        for op in ops:
            found.extend(_forward_patchers(path or "<model>", layer, op, switches))
        found.extend(_kernelized_functions(path or "<model>", layer, module, functions, targets, switches))
    if "kernels" in sys.modules:
        try:
            use_kernels = bool(getattr(model, "use_kernels", False))
        except Exception:  # a property of a transformers release we do not know
            use_kernels = False
        if use_kernels:
            try:
                version = importlib.metadata.version("kernels")
            except importlib.metadata.PackageNotFoundError:
                version = "?"
            found.append(
                OtherPatcher(
                    None, "", f"model loaded with use_kernels=True (kernels {version} imported)", False
                )
            )
    return found


def _forward_patchers(path: str, layer, op: str, switches: dict[str, str]) -> list[OtherPatcher]:
    """The one instance's effective forward: set on the instance, or its class's (maybe replaced) forward."""
    hub_layer = getattr(type(layer), "kernel_layer_name", None)
    by = f" ({HUB_KERNEL_MARK} {hub_layer!r})" if hub_layer else ""
    instance_forward = layer.__dict__.get("forward")
    if instance_forward is not None:
        if op in guarded_ops(instance_forward, switches):
            how = f"forward set on the instance{by}, still the guarded forward"
            return [OtherPatcher(op, path, how, False)]
        if _wraps_guard(instance_forward, op, switches):  # e.g. accelerate's hooks call through
            how = f"forward set on the instance{by}: {_describe(instance_forward)} wraps the guarded forward"
            return [OtherPatcher(op, path, how, False)]
        return [
            OtherPatcher(op, path, f"forward set on the instance{by}: {_describe(instance_forward)}", True)
        ]
    class_forward = type(layer).forward
    if op in guarded_ops(class_forward, switches) or _wraps_guard(class_forward, op, switches):
        return []  # the guarded forward, or a decorator of it (transformers' deprecate_kwarg) calling it
    return [OtherPatcher(op, path, f"class forward replaced: {_describe(class_forward)}", True)]


def _kernelized_functions(path, layer, module, functions, targets, switches) -> list[OtherPatcher]:
    """Functions `use_kernelized_func` keeps on an instance (transformers 5.0 - 5.8: `_hidden_kernels`;
    from 5.16 the `kernels` package's, `_kernel_funcs`).

    They bypass the guard only where the layer's forward calls them instead of the module global.
    """
    hidden = {**(layer.__dict__.get("_hidden_kernels") or {}), **(layer.__dict__.get("_kernel_funcs") or {})}
    if not hidden:
        return []
    code = _code_of(type(layer).forward)
    calls_global = code.co_names if code is not None else ()
    found = []
    for name, function in hidden.items():
        if name not in functions or function is vars(module).get(name):
            continue
        op = targets[name][0]
        if _reaches_guard(getattr(function, "forward", function), op, switches):
            continue
        how = f"use_kernelized_func holds {_describe(function)} for {name}"
        found.append(OtherPatcher(op, path, how, name not in calls_global))
    return found


def other_patcher_checks(
    patchers: list[OtherPatcher], switched_on: tuple[str, ...]
) -> tuple[list[str], list[str]]:
    """A bypassed instance of an op this run switches on fails; anything else is a warning."""
    failures, warnings = [], []
    bypassed: dict[str, list[OtherPatcher]] = {}
    for patcher in patchers:
        if patcher.bypasses and patcher.op is not None:
            bypassed.setdefault(patcher.op, []).append(patcher)
        elif patcher.op is None:
            warnings.append(f"another patcher is active: {patcher.how}")
    others = [p for p in patchers if not p.bypasses and p.op is not None]
    if others:
        warnings.append(
            f"{len(others)} module(s) have a forward set by another patcher that still runs the guard, "
            f"e.g. {others[0].module} ({others[0].how})"
        )
    for op, found in bypassed.items():
        first = found[0]
        hint = HUB_KERNEL_HINT if all(HUB_KERNEL_MARK in p.how for p in found) else OTHER_PATCHER_HINT
        message = (
            f"{op}: {len(found)} module(s) bypass the injected guard, first {first.module} ({first.how}); "
            f"the PTO kernel cannot run there: {hint}"
        )
        if op in switched_on:
            failures.append(message)
        else:
            warnings.append(message + " (fails verify --use_pto when the op is switched on)")
    return failures, warnings
