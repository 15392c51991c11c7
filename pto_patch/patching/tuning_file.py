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

from pto_patch.patching.fileio import atomic_write_bytes, sha256_file
from pto_patch.patching.manifest import MANIFEST_DIR, Manifest, is_sha256, parent_escapes

TUNING_NAME = "tuning.json"
TUNING_PATH = f"{MANIFEST_DIR}/{TUNING_NAME}"  # relative to the model folder
TUNING_FILE = "the tuning file"  # how messages name it (a run's write target, run/kept_results)
MANIFEST_KEY = "tuning"  # Manifest.extra[MANIFEST_KEY] = {"path", "sha256"}

SOURCE_TUNING = "tuning"
SOURCE_TABLE = "reference table"


NOT_CHECKED = object()  # find_tuning: the run's compile set-up is not compared


def tuning_path(folder: Path) -> Path:
    return Path(folder) / TUNING_PATH


def tuning_bytes(document: dict[str, Any]) -> bytes:
    return (json.dumps(document, indent=2, ensure_ascii=False) + "\n").encode("utf-8")


def write_tuning(folder: Path, document: dict[str, Any]) -> Path:
    """Write the tuning atomically and record it in the manifest, which `restore` empties with the rest."""
    path = tuning_path(folder)
    atomic_write_bytes(path, tuning_bytes(document))
    manifest = Manifest.load(folder)
    extra = dict(manifest.extra)
    extra[MANIFEST_KEY] = {"path": TUNING_PATH, "sha256": sha256_file(path)}
    dataclasses.replace(manifest, extra=extra).save(folder)
    return path


# Why a tuning file in the folder is not the one tune wrote (see `unrecorded_change`).
NOT_RECORDED = f"{TUNING_PATH} is not recorded in the manifest, so `pto-patch tune` did not write it here"
CHANGED_SINCE_TUNE = f"{TUNING_PATH} was changed after tune wrote it"
NOT_A_PLAIN_FILE = f"{TUNING_PATH} is not a plain file inside the folder"
TUNE_AGAIN = "run `pto-patch tune` again"


def unrecorded_change(folder: Path, manifest: Manifest) -> str | None:
    """Why the folder's tuning file is not the one tune wrote and recorded (one line), or None if it is.

    Only the fixed TUNING_PATH is ever read: a manifest that names another path is not followed.
    """
    record = manifest.extra.get(MANIFEST_KEY)
    if record is None:
        return NOT_RECORDED
    if (
        not isinstance(record, dict)
        or record.get("path") != TUNING_PATH
        or not is_sha256(record.get("sha256"))
    ):
        return f"the manifest's tuning record is not one tune writes (it names {TUNING_PATH} and a sha256)"
    path = tuning_path(folder)
    if path.is_symlink() or not path.is_file() or parent_escapes(Path(folder).resolve(), TUNING_PATH):
        return NOT_A_PLAIN_FILE
    if sha256_file(path) != record["sha256"]:
        return CHANGED_SINCE_TUNE
    return None


@dataclass(frozen=True)
class TuningLookup:
    """Where --use_dynamic_config takes its choice from, and why (one line)."""

    source: str  # SOURCE_TUNING or SOURCE_TABLE
    reason: str
    file: str | None = None
    tuning: Any = None  # pto_kernels.tuning.Tuning when source is SOURCE_TUNING
    read: Any = None  # the Tuning read from the file, also where it does not apply here

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


def find_tuning(
    folder: Path,
    kernels,
    device_name: str | None,
    dtype: str | None,
    spec: str,
    patched: tuple[str, ...],
    *,
    manifest: Manifest | None = None,
    compiled: Any = NOT_CHECKED,
) -> TuningLookup:
    """The folder's tuning if tune wrote it (its sha256 in the manifest) and it was made here (device,
    releases, dtype, spec, patched ops, compiled the same way), else why not.

    `kernels` is the folder's own pto_kernels module, whose `tuning` reads and checks the file.
    `device_name` None is the default device (NPU, else CUDA, else CPU); `dtype` None is not checked.
    `compiled` is the run's compile set-up (`CompileSetup.to_json()`, None for eager): an op choice
    measured eager need not be the faster one compiled, nor the other way round.
    """
    path = tuning_path(folder)
    if not (path.exists() or path.is_symlink()):
        return TuningLookup(SOURCE_TABLE, f"no tuning in {TUNING_PATH} (run `pto-patch tune`)")
    changed = unrecorded_change(folder, manifest or Manifest.load(folder))
    if changed is not None:
        return TuningLookup(SOURCE_TABLE, f"{changed}: {TUNE_AGAIN}; using the reference table", str(path))
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
        if dtype is not None and made is not None and made != dtype:
            mismatch = f"tuning {path} was measured in {made}, this run is {dtype}: run `pto-patch tune` here"
        elif tuning.spec != spec or tuple(tuning.ops_patched) != tuple(patched):
            mismatch = (
                f"tuning {path} was made for spec {tuning.spec} with ops {','.join(tuning.ops_patched)}; "
                f"this folder is {spec} with {','.join(patched)}: run `pto-patch tune` again"
            )
        elif compiled is not NOT_CHECKED and tuning.header.get("compile") != compiled:
            mismatch = (
                f"tuning {path} was measured {describe_compile(tuning.header.get('compile'))}, this run is "
                f"{describe_compile(compiled)}: run `pto-patch tune` with the same compile options"
            )
    if mismatch is not None:
        return TuningLookup(SOURCE_TABLE, f"{mismatch}; using the reference table", str(path), read=tuning)
    return TuningLookup(
        SOURCE_TUNING, f"tuned on this device ({tuning.device['name']})", str(path), tuning, read=tuning
    )


def describe_compile(compiled: dict[str, Any] | None) -> str:
    if not compiled:
        return "eager"
    mode = f", mode {compiled['mode']}" if compiled.get("mode") else ""
    return f"compiled (backend {compiled.get('backend')}{mode})"


def lookup_for_run(loaded, warnings: list[str], compiled=None) -> TuningLookup:
    """find_tuning for a loaded run; a tuning that is there but does not apply is one warning line."""
    lookup = find_tuning(
        loaded.folder,
        loaded.kernels,
        loaded.device.name,
        loaded.dtype_name,
        loaded.spec.name,
        tuple(loaded.state.patched_ops),
        compiled=None if compiled is None else compiled.to_json(),
    )
    if lookup.source == SOURCE_TABLE and lookup.file is not None:
        warnings.append(f"--use_dynamic_config: {lookup.reason}")
    return lookup


def tuning_status(folder: Path, manifest: Manifest, drifted: tuple[str, ...]) -> dict[str, Any] | None:
    """What `status` shows of the folder's tuning: where it is, whether verify and bench would use it on
    this machine's default device (and if not, their one-line reason), and its choice per batch size.

    None where there is no tuning file. The folder's own pto_kernels reads it, as in verify; a folder
    whose patched files drifted is not imported (verify would refuse to run it).
    """
    path = tuning_path(folder)
    if not (path.exists() or path.is_symlink()):
        return None
    from pto_patch.errors import PtoPatchError
    from pto_patch.patching.folder_kernels import borrowed_folder_kernels

    shown: dict[str, Any] = {
        "file": str(path),
        "applies": False,
        "reason": "",
        "made_on": None,
        "batches": [],
    }
    if drifted:
        shown["reason"] = "not checked: patched files differ from what apply wrote (see drifted)"
        return shown
    try:
        with borrowed_folder_kernels(folder) as kernels:
            lookup = find_tuning(folder, kernels, None, None, manifest.spec, manifest.ops, manifest=manifest)
    except PtoPatchError as exc:
        shown["reason"] = f"not checked: {exc.message}"
        return shown
    shown.update(applies=lookup.source == SOURCE_TUNING, reason=lookup.reason)
    if lookup.read is not None:
        made = lookup.read
        shown["made_on"] = {
            "device": made.device,
            "versions": made.versions,
            "dtype": made.header.get("dtype"),
        }
        shown["batches"] = [
            {"batch": choice.batch, "chosen": dict(choice.ops), "decided": choice.decided}
            for choice in sorted(made.batches, key=lambda choice: choice.batch)
        ]
    return shown


def describe_backend(backend: str | dict[str, str]) -> str:
    """The backend a report names: one name, or `op=backend` pairs where a tuning chose per op."""
    if isinstance(backend, str):
        return backend
    return ",".join(f"{op}={name}" for op, name in backend.items())
