"""status: whether a model folder is patched, which ops, and what drifted since apply. It only reads.

Kept apart from the engine, which plans and writes patches, so `pto-patch status` imports nothing of
the rewrite and starts fast.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from pto_patch.model.folder import read_download_record, resolve_model_folder
from pto_patch.model.locate import installed_transformers_release
from pto_patch.model.spec import load_spec
from pto_patch.patching.folder_contents import kept_copies, unexpected_entries
from pto_patch.patching.manifest import STATE_IN_PROGRESS
from pto_patch.patching.overlay_record import record_of
from pto_patch.patching.patch_state import patch_state
from pto_patch.patching.tuning_file import tuning_status


@dataclass(frozen=True)
class StatusResult:
    folder: Path
    spec: str
    patched: bool
    state: str | None = None  # None (not patched), "complete" or "in_progress"
    ops: tuple[str, ...] = ()
    ops_found: dict[str, list[str]] = field(default_factory=dict)
    release_at_apply: str | None = None
    release_now: str | None = None
    tool_version_at_apply: str | None = None
    drifted: tuple[str, ...] = ()
    files: tuple[tuple[str, str], ...] = ()
    download: dict | None = None
    overlay: dict | None = None  # apply --overlay: the source folder and what changed there since
    tuning: dict | None = None  # after `pto-patch tune`: tuning_file.tuning_status
    kept_edits: tuple[str, ...] = ()  # what `restore --force` kept of edited files (*.edited, *.edited.2)
    unexpected: tuple[str, ...] = ()  # put there by neither the checkpoint nor the patch

    @property
    def needs_reapply(self) -> bool:
        return self.patched and self.release_at_apply != self.release_now


def model_status(model: str = "gutenocr_3b", model_path: Path | str | None = None) -> StatusResult:
    from pto_patch.model.injections_found import find_injections

    spec = load_spec(model)
    folder = resolve_model_folder(model_path, spec)
    release_now = installed_transformers_release()
    download = read_download_record(folder)
    state = patch_state(folder)
    if state.manifest is None:
        shown = STATE_IN_PROGRESS if state.interrupted else None
        return StatusResult(
            folder,
            spec.name,
            patched=False,
            state=shown,
            release_now=release_now,
            download=download,
            kept_edits=tuple(kept_copies(folder)),
            unexpected=tuple(unexpected_entries(folder)),
        )
    manifest = state.manifest
    modeling = folder / spec.modeling_file
    ops_found = find_injections(modeling.read_text(encoding="utf-8")) if modeling.is_file() else {}
    return StatusResult(
        folder=folder,
        spec=manifest.spec,
        patched=state.patched,
        state=manifest.state,
        ops=manifest.ops,
        ops_found=ops_found,
        release_at_apply=manifest.transformers_release,
        release_now=release_now,
        tool_version_at_apply=manifest.tool_version,
        drifted=state.drifted,
        files=tuple((r.path, r.action) for r in manifest.files),
        download=download,
        overlay=_overlay_status(folder, manifest),
        tuning=tuning_status(folder, manifest, state.drifted) if state.patched else None,
        kept_edits=tuple(kept_copies(folder)),
        unexpected=tuple(unexpected_entries(folder, manifest)),
    )


def _overlay_status(folder: Path, manifest) -> dict | None:
    """An overlay's source and what changed there; the overlay's module is imported only for an overlay."""
    if record_of(folder, manifest) is None:
        return None
    from pto_patch.patching import overlay

    return overlay.status_of(folder, manifest)
