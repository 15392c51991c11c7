"""The tuning file `tune` writes (`<folder>/.pto_patch/tuning.json`), and how runs find and trust it.

The file's reader and its device / release check live in the kernel package (`pto_kernels.tuning`),
so user code that only has the patched folder reads it the same way; this module writes it, records
it in the manifest (so `restore` removes it), and decides for verify and bench whether it applies.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pto_patch.fileio import atomic_write_bytes, sha256_file
from pto_patch.manifest import MANIFEST_DIR, Manifest

TUNING_NAME = "tuning.json"
TUNING_PATH = f"{MANIFEST_DIR}/{TUNING_NAME}"  # relative to the model folder
MANIFEST_KEY = "tuning"  # Manifest.extra[MANIFEST_KEY] = {"path", "sha256"}

SOURCE_TUNING = "tuning"
SOURCE_TABLE = "reference table"


def tuning_path(folder: Path) -> Path:
    return Path(folder) / TUNING_PATH


def write_tuning(folder: Path, document: dict[str, Any]) -> Path:
    """Write the tuning atomically and record it in the manifest, which `restore` empties with the rest."""
    path = tuning_path(folder)
    text = json.dumps(document, indent=2, ensure_ascii=False) + "\n"
    atomic_write_bytes(path, text.encode("utf-8"))
    manifest = Manifest.load(folder)
    extra = dict(manifest.extra)
    extra[MANIFEST_KEY] = {"path": TUNING_PATH, "sha256": sha256_file(path)}
    dataclasses.replace(manifest, extra=extra).save(folder)
    return path


@dataclass(frozen=True)
class TuningLookup:
    """Where --use_dynamic_config takes its choice from, and why (one line)."""

    source: str  # SOURCE_TUNING or SOURCE_TABLE
    reason: str
    file: str | None = None
    tuning: Any = None  # pto_kernels.tuning.Tuning when source is SOURCE_TUNING

    def to_json(self) -> dict[str, Any]:
        return {"source": self.source, "file": self.file, "reason": self.reason}


OLDER_KERNELS = "the folder's pto_kernels was written by an older pto-patch, which knows no tuning files"
OLDER_KERNELS_HINT = "run `pto-patch restore` then `pto-patch apply` again, then `pto-patch tune`"


def kernel_tuning(kernels):
    """The folder's `pto_kernels.tuning`, or None where its kernel package predates this format."""
    saved, sys.dont_write_bytecode = sys.dont_write_bytecode, True  # restore needs the bytes apply wrote
    try:
        module = importlib.import_module(f"{kernels.__name__}.tuning")
    except ImportError:
        return None
    finally:
        sys.dont_write_bytecode = saved
    tuning_class = getattr(module, "Tuning", None)
    if getattr(module, "FORMAT_VERSION", None) != 1 or "header" not in getattr(
        tuning_class, "__dataclass_fields__", {}
    ):
        return None
    return module


def find_tuning(folder: Path, kernels, device_name: str, dtype: str, spec: str, patched: tuple[str, ...]):
    """The folder's tuning if it was made here (device, releases, dtype, spec, patched ops), else why not.

    `kernels` is the folder's own pto_kernels module, whose `tuning` reads and checks the file.
    """
    path = tuning_path(folder)
    if not path.is_file():
        return TuningLookup(SOURCE_TABLE, f"no tuning in {TUNING_PATH} (run `pto-patch tune`)")
    reader = kernel_tuning(kernels)
    if reader is None:
        return TuningLookup(
            SOURCE_TABLE, f"{OLDER_KERNELS}; using the reference table ({OLDER_KERNELS_HINT})", str(path)
        )
    try:
        tuning = reader.load(path)
    except reader.TuningError as exc:
        return TuningLookup(SOURCE_TABLE, f"{exc}; using the reference table", str(path))
    mismatch = tuning.mismatch(reader.environment(device_name))
    if mismatch is None:
        made = tuning.header.get("dtype")
        if made is not None and made != dtype:
            mismatch = f"tuning {path} was measured in {made}, this run is {dtype}: run `pto-patch tune` here"
        elif tuning.spec != spec or tuple(tuning.ops_patched) != tuple(patched):
            mismatch = (
                f"tuning {path} was made for spec {tuning.spec} with ops {','.join(tuning.ops_patched)}; "
                f"this folder is {spec} with {','.join(patched)}: run `pto-patch tune` again"
            )
    if mismatch is not None:
        return TuningLookup(SOURCE_TABLE, f"{mismatch}; using the reference table", str(path))
    return TuningLookup(SOURCE_TUNING, f"tuned on this device ({tuning.device['name']})", str(path), tuning)


def lookup_for_run(loaded, warnings: list[str]) -> TuningLookup:
    """find_tuning for a loaded run; a tuning that is there but does not apply is one warning line."""
    lookup = find_tuning(
        loaded.folder,
        loaded.kernels,
        loaded.device.name,
        loaded.dtype_name,
        loaded.spec.name,
        tuple(loaded.state.patched_ops),
    )
    if lookup.source == SOURCE_TABLE and lookup.file is not None:
        warnings.append(f"--use_dynamic_config: {lookup.reason}")
    return lookup


def describe_backend(backend: str | dict[str, str]) -> str:
    """The backend a report names: one name, or `op=backend` pairs where a tuning chose per op."""
    if isinstance(backend, str):
        return backend
    return ",".join(f"{op}={name}" for op, name in backend.items())
