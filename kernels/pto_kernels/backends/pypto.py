"""The pypto backend as the dispatcher sees it: each kernel entry, from the PyPTO module that defines it.

The reference system's three ops (and the serving engines' forms of them) live in pypto_ops.py; the
decoder-layer blocks in pypto_blocks.py, pypto_prologue.py and pypto_attention.py. All launch through
pypto_runtime.py (the jit, the kernel cache and its counts). An entry (pto_kernels/entries.py names them) is the function
of its name that one of these modules defines (not one it imports): found once, then looked up in that module
at every call, so a kernel replaced there (a test, a hot fix) is seen. Neither module imports this one.
"""

from types import ModuleType

from . import pypto_attention, pypto_blocks, pypto_ops, pypto_prologue, pypto_runtime

MODULES = (pypto_ops, pypto_blocks, pypto_prologue, pypto_attention)
_defined_in: dict[str, ModuleType] = {}


def module_of(name: str) -> ModuleType | None:
    """The module of MODULES that defines the public function `name`, or None."""
    module = _defined_in.get(name)
    if module is None and not name.startswith("_"):
        holders = [candidate for candidate in MODULES if callable(getattr(candidate, name, None))]
        defining = [m for m in holders if getattr(getattr(m, name), "__module__", None) == m.__name__]
        module = (defining or holders or [None])[0]  # a replaced kernel is not defined where it is held
        if module is not None:
            _defined_in[name] = module
    return module


def kernel_stats() -> dict[str, dict]:
    """Per op: kernels built, pypto compiles and their seconds, cache hits, evictions and kernels held."""
    return pypto_runtime.kernel_stats()


def reset_kernel_stats() -> None:
    pypto_runtime.reset_kernel_stats()


def __getattr__(name: str):
    module = module_of(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(module, name)
