"""The patched folder a run starts from: its patch state checked, and its own `pto_kernels` imported.

The patched modeling code finds the kernel package with `sys.modules.get("pto_kernels")`, so the
copy apply wrote into the folder is imported under that name, and forgotten again when done.
"""

from __future__ import annotations

import contextlib
import importlib
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from pto_patch.errors import ModelFolderError, PtoPatchError
from pto_patch.patch_state import patch_state

KERNEL_PACKAGE = "pto_kernels"


@dataclass(frozen=True)
class FolderState:
    folder: Path
    patched: bool
    patched_ops: tuple[str, ...]
    modified_files: tuple[str, ...]
    source_changed: tuple[str, ...] = ()  # apply --overlay: what changed in the source since apply


def check_folder(folder: Path, *, use_pto: bool, allow_modified: bool) -> FolderState:
    """Refuse to run half-patched code, or code that differs from what apply wrote (unless allowed)."""
    from pto_patch.overlay import record_of, source_changes

    state = patch_state(folder)
    if state.interrupted:
        raise ModelFolderError(
            f"{folder} holds an interrupted apply; refusing to run its half-patched files",
            f"run `pto-patch restore --model-path {folder}` (or `pto-patch apply` again)",
        )
    if not state.patched:
        if use_pto:
            raise ModelFolderError(
                f"{folder} is not patched (no .pto_patch/manifest.json): --use_pto has nothing to switch on",
                f"run `pto-patch apply --model-path {folder}` first, or drop --use_pto for a baseline run",
            )
        return FolderState(folder, False, (), ())
    drifted = state.drifted
    if drifted and not allow_modified:
        shown = ", ".join(drifted[:4]) + (" ..." if len(drifted) > 4 else "")
        raise PtoPatchError(
            f"{folder}: {len(drifted)} patched file(s) differ from what apply wrote ({shown}); "
            "refusing to execute them",
            "run `pto-patch restore` then `pto-patch apply` again, or pass --allow-modified to run them",
        )
    source_changed = tuple(source_changes(folder, state.manifest))
    if source_changed and not allow_modified:
        shown = ", ".join(source_changed[:4]) + (" ..." if len(source_changed) > 4 else "")
        raise PtoPatchError(
            f"{folder} is an overlay whose source folder {record_of(folder, state.manifest).source} changed "
            f"since apply ({shown}); its patched files were made for the old one",
            f"run `pto-patch restore --model-path {folder}`, then apply --overlay {folder} again, "
            "or pass --allow-modified to run it anyway",
        )
    return FolderState(folder, True, tuple(state.manifest.ops), drifted, source_changed)


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
