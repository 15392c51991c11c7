"""A patched folder's own `pto_kernels`, imported under that name and forgotten again when done.

The patched modeling code finds the kernel package with `sys.modules.get("pto_kernels")`, so the
copy apply wrote into the folder is imported under that name. Runs import it; status borrows it to
read the folder's tuning.
"""

from __future__ import annotations

import contextlib
import importlib
import sys
from collections.abc import Iterator
from pathlib import Path

from pto_patch.errors import ModelFolderError, PtoPatchError

KERNEL_PACKAGE = "pto_kernels"


def import_folder_kernels(folder: Path):
    """Import `pto_kernels` from the model folder (the copy apply wrote), never another copy.

    The patched modeling code finds it with `sys.modules.get("pto_kernels")`.
    """
    package_dir = (folder / KERNEL_PACKAGE).resolve()
    if not (package_dir / "__init__.py").is_file():
        raise ModelFolderError(
            f"{folder} has no pto_kernels/ package although it is patched",
            "run `pto-patch restore` then `pto-patch apply` again",
        )
    loaded = sys.modules.get(KERNEL_PACKAGE)
    if loaded is not None and module_dir(loaded) != package_dir:
        _forget_kernel_modules()
    if str(folder) in sys.path:
        sys.path.remove(str(folder))
    sys.path.insert(0, str(folder))
    importlib.invalidate_caches()
    # No __pycache__ inside the model folder: restore must find exactly the bytes apply wrote.
    saved, sys.dont_write_bytecode = sys.dont_write_bytecode, True
    try:
        module = importlib.import_module(KERNEL_PACKAGE)
    finally:
        sys.dont_write_bytecode = saved
    if module_dir(module) != package_dir:
        raise PtoPatchError(
            f"`import pto_kernels` found {module.__file__}, not the model folder's copy {package_dir}",
            "remove the other pto_kernels from PYTHONPATH",
        )
    for name in ("enable", "disable", "stats", "reset_stats"):
        if not callable(getattr(module, name, None)):
            raise PtoPatchError(
                f"{package_dir} lacks pto_kernels.{name}(): not the kernel package this pto-patch ships",
                "run `pto-patch restore` then `pto-patch apply` again",
            )
    return module


def module_dir(module) -> Path | None:
    file = getattr(module, "__file__", None)
    return Path(file).resolve().parent if file else None


def forget_folder_kernels(folder: Path) -> None:
    """Drop the folder's pto_kernels import and sys.path entry so nothing points into a removed folder."""
    loaded = sys.modules.get(KERNEL_PACKAGE)
    if loaded is not None and str(folder) in str(getattr(loaded, "__file__", "")):
        _forget_kernel_modules()
    while str(folder) in sys.path:
        sys.path.remove(str(folder))


@contextlib.contextmanager
def borrowed_folder_kernels(folder: Path) -> Iterator:
    """The folder's pto_kernels for a moment (status reads its tuning with it); afterwards the process
    has the pto_kernels modules and sys.path it had before."""
    saved = {name: module for name, module in sys.modules.items() if _is_kernel_module(name)}
    try:
        yield import_folder_kernels(folder)
    finally:
        _forget_kernel_modules()
        while str(folder) in sys.path:
            sys.path.remove(str(folder))
        sys.modules.update(saved)


def _is_kernel_module(name: str) -> bool:
    return name == KERNEL_PACKAGE or name.startswith(KERNEL_PACKAGE + ".")


def _forget_kernel_modules() -> None:
    for name in [n for n in sys.modules if _is_kernel_module(n)]:
        del sys.modules[name]
