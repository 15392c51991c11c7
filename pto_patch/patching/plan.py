"""The plan of a patch: every change computed in memory (codemods, config.json, the kernel package), the
result type, the diff, and the manifest an apply saves before it writes. Its two writers sit above it:
the engine writes the plan in place, the overlay (`apply --overlay`) beside the source folder.
"""

from __future__ import annotations

import difflib
import os
import time
from dataclasses import dataclass, replace
from pathlib import Path

from pto_patch import __version__
from pto_patch.errors import AnchorNotFoundError, ModelFolderError
from pto_patch.model.folder import read_model_config
from pto_patch.model.locate import locate_sources
from pto_patch.model.spec import ModelSpec
from pto_patch.patching.config_fix import ConfigChange, config_changes, fixed_config, render_config
from pto_patch.patching.fileio import (
    file_mode,
    sha256_bytes,
)
from pto_patch.patching.folder_kernels import KERNEL_PACKAGE
from pto_patch.patching.manifest import (
    STATE_IN_PROGRESS,
    FileRecord,
    Manifest,
    link_target_escapes,
    parent_escapes,
)
from pto_patch.patching.patch_context import PatchContext
from pto_patch.patching.rewrite_cache import RewriteCache
from pto_patch.resources import kernel_package_dir


@dataclass(frozen=True)
class PlannedFile:
    path: str  # relative, '/'-separated
    new_bytes: bytes
    old_bytes: bytes | None  # None: apply adds the file
    symlink_target: str | None = None
    mode: int | None = None
    # an added file rewritten from a source outside the folder (transformers'): its path and bytes, which
    # a dry run's diff starts from
    rewrites: tuple[str, bytes] | None = None

    @property
    def action(self) -> str:
        return "added" if self.old_bytes is None else "modified"


@dataclass(frozen=True)
class ApplyResult:
    folder: Path
    spec: str
    ops: tuple[str, ...]
    release: str
    source: str
    files: tuple[tuple[str, str], ...]  # (path, "added" | "modified")
    source_release: str | None = None  # the release the source file comes from, where not `release`
    config_changes: tuple[ConfigChange, ...] = ()  # what apply changes (or changed) in config.json
    dry_run: bool = False
    diff: str = ""
    already_applied: bool = False
    rolled_back_interrupted: bool = False
    overlay_of: Path | None = None  # apply --overlay: the source folder, which was only read
    elapsed_s: float = 0.0

    @classmethod
    def already_applied_from(
        cls, folder: Path, manifest: Manifest, started: float, overlay_of: Path | None = None
    ) -> ApplyResult:
        """The result of an apply that found `folder` already patched as `manifest` records."""
        return cls(
            folder=folder,
            spec=manifest.spec,
            ops=manifest.ops,
            release=manifest.transformers_release,
            source=manifest.source,
            files=tuple((r.path, r.action) for r in manifest.files),
            already_applied=True,
            overlay_of=overlay_of,
            elapsed_s=time.perf_counter() - started,
        )


# --- planning (in memory only) --------------------------------------------------------------------


def _read_existing(folder: Path, relative: str) -> tuple[bytes | None, str | None, int | None]:
    """Bytes (through a link), link target and mode of a file in the folder, or Nones if absent.

    Refuses what restore could not put back inside the folder: a path under a link that leads out,
    a link that leads out (other than into the HF cache's blob store), a folder or a dangling link.
    """
    path = folder / relative
    if parent_escapes(folder, relative):
        raise ModelFolderError(
            f"{relative} in {folder} lies under a link that leads out of the folder",
            "replace that linked folder by a real one, then run apply again",
        )
    target = os.readlink(path) if path.is_symlink() else None
    if target is not None and link_target_escapes(folder, path, target):
        raise ModelFolderError(
            f"{path} is a link to {target}, outside the folder",
            f"replace the link by a copy of its file (cp --remove-destination {os.path.realpath(path)} {path})",
        )
    if target is not None and not path.exists():
        raise ModelFolderError(
            f"{path} is a link to {target}, which does not exist", "fix or remove the link"
        )
    if not path.exists():
        return None, None, None
    if not path.is_file():
        raise ModelFolderError(
            f"{path} is not a regular file", "move it out of the way, then run apply again"
        )
    return path.read_bytes(), target, file_mode(path)


def _planned(folder: Path, relative: str, new_bytes: bytes) -> PlannedFile:
    old, target, mode = _read_existing(folder, relative)
    return PlannedFile(relative, new_bytes, old, target, mode if target is None else None)


def _from_source(item: PlannedFile, source: Path) -> PlannedFile:
    """An added file, with the source it rewrites (where that is not the folder's own file)."""
    return item if item.old_bytes is not None else replace(item, rewrites=(str(source), source.read_bytes()))


def _kernel_package_files() -> list[tuple[str, bytes]]:
    root = kernel_package_dir()
    files = []
    for path in sorted(root.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
            relative = f"{KERNEL_PACKAGE}/{path.relative_to(root).as_posix()}"
            files.append((relative, path.read_bytes()))
    return files


def plan_patch(
    folder: Path,
    spec: ModelSpec,
    ops: tuple[str, ...],
    cache: RewriteCache | None = None,
    save_to_cache: bool = True,
) -> tuple[list[PlannedFile], dict]:
    """Every file apply will write, computed in memory; raises before anything is written.

    With `cache`, a rewrite done before with byte-identical inputs is reused (rewrite_cache.py), and
    with `save_to_cache` a new one is kept there.
    """
    config = read_model_config(folder, spec)
    sources = locate_sources(folder, spec)
    modeling_bytes = sources.modeling.read_bytes()
    context = PatchContext(
        spec=spec,
        ops=ops,
        release=sources.origin,
        tool_version=__version__,
        source_sha256=sha256_bytes(modeling_bytes),
    )

    def rewritten(kind: str, path: Path, data: bytes) -> str:
        def run() -> str:
            from pto_patch.patching import codemods  # libcst: only for a rewrite the cache does not hold

            rewrite = codemods.rewrite_modeling if kind == "modeling" else codemods.rewrite_configuration
            return _rewritten(folder, path, data, rewrite, context)

        return run() if cache is None else cache.rewritten(kind, data, context, run, save=save_to_cache)

    modeling = rewritten("modeling", sources.modeling, modeling_bytes)
    configuration = rewritten("configuration", sources.configuration, sources.configuration.read_bytes())
    new_data = fixed_config(config, spec)
    new_config = render_config(new_data, config.raw_bytes)

    planned = [
        _from_source(_planned(folder, spec.modeling_file, modeling.encode("utf-8")), sources.modeling),
        _from_source(
            _planned(folder, spec.configuration_file, configuration.encode("utf-8")), sources.configuration
        ),
        _planned(folder, "config.json", new_config),
    ]
    planned += [_planned(folder, relative, data) for relative, data in _kernel_package_files()]
    info = {
        "release": sources.release,
        "source": str(sources.modeling),
        "source_sha256": context.source_sha256,
        "from_folder": sources.from_folder,
        "source_release": sources.origin,
        "config_changes": tuple(config_changes(config.data, new_data)),
    }
    return planned, info


def _rewritten(folder: Path, path: Path, data: bytes, rewrite, context) -> str:
    """`rewrite` of a source file; where the file is the folder's own, its faults are the folder's."""
    own = path.parent == folder
    if own:
        context = replace(context, source_folder=folder)
    try:
        return rewrite(data.decode("utf-8"), context)
    except UnicodeDecodeError as exc:
        if own:
            raise ModelFolderError(
                f"{context.where(path.name)} is not UTF-8 text ({exc.reason} at byte {exc.start})",
                _OWN_SOURCE_HINT.format(name=path.name),
            ) from exc
        raise AnchorNotFoundError(
            f"{context.where(path.name)} is not UTF-8 text ({exc.reason} at byte {exc.start})",
            "the source file is damaged; reinstall transformers",
        ) from exc
    except AnchorNotFoundError as exc:
        if not own:
            raise
        raise ModelFolderError(exc.message, _OWN_SOURCE_HINT.format(name=path.name)) from exc


_OWN_SOURCE_HINT = (
    "the folder's own {name} is not the transformers code pto-patch patches: move it out of the folder "
    "(the installed release's file is used then), or download the model again"
)


def unified_diff(planned: list[PlannedFile]) -> str:
    chunks = []
    kernel_files = [item for item in planned if item.path.startswith(f"{KERNEL_PACKAGE}/")]
    for item in planned:
        if item in kernel_files:
            continue
        base = item.old_bytes if item.old_bytes is not None else (item.rewrites or ("", b""))[1]
        old = base.decode("utf-8").splitlines(keepends=True)
        new = item.new_bytes.decode("utf-8").splitlines(keepends=True)
        if item.old_bytes is not None:
            before = f"a/{item.path}"
        else:  # added: the diff of the rewrite, from the source it rewrites
            before = item.rewrites[0] if item.rewrites else "/dev/null"
        chunks.extend(difflib.unified_diff(old, new, before, f"b/{item.path}"))
    if kernel_files:
        chunks.append(
            f"# plus {len(kernel_files)} file(s) of the kernel package, added under {KERNEL_PACKAGE}/:\n"
        )
        chunks.extend(f"#   {item.action} {item.path}\n" for item in kernel_files)
    return "".join(chunk if chunk.endswith("\n") else chunk + "\n" for chunk in chunks)


def manifest_in_progress(
    spec: ModelSpec,
    ops: tuple[str, ...],
    info: dict,
    files: tuple[FileRecord, ...],
    added_dirs: tuple[str, ...],
    extra: dict | None = None,
) -> Manifest:
    """The manifest an apply (in place or overlay) saves before it writes a patched byte: this tool's
    version, the modeling source `plan_patch` found (its `info`), state in progress."""
    return Manifest(
        tool_version=__version__,
        spec=spec.name,
        ops=ops,
        transformers_release=info["release"],
        source=info["source"],
        source_sha256=info["source_sha256"],
        files=files,
        added_dirs=added_dirs,
        state=STATE_IN_PROGRESS,
        extra=extra or {},
    )
