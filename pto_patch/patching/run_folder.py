"""What a run reads of its model folder: once, under the folder's lock, before anything loads.

A run's plan (`run.start.plan_run`) hands the folder here. The files a load reads are checked first (fit
to be read, config.json's auto_map inside the folder); its patch state is decided; a folder that may not
run is refused (interrupted, unpatched, drifted, an overlay whose source changed, `--ops` naming an op not
patched in); the files' state is taken (`folder_watch`); for a run with a reference, where the files
before apply lie (`originals`); for a PTO run, the folder's own kernel package is imported
(`folder_kernels`); the MRoPE section config.json calls for and the guards its modeling file holds are
read; and the ops the run may switch on are chosen. The run goes on from the returned `FolderRead`: the
load reads the checkpoint through transformers, and the folder's state is read again only to check that
nothing changed.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pto_patch.errors import EXIT_USAGE, PtoPatchError
from pto_patch.model.folder import check_folder_auto_map, check_model_inputs, check_output_length
from pto_patch.model.injections_found import guarded_in_folder
from pto_patch.model.rope_section import folder_mrope_section
from pto_patch.model.spec import OPS, ModelSpec, OpsAsked
from pto_patch.patching import folder_lock
from pto_patch.patching.folder_check import CheckedFolder, check_folder
from pto_patch.patching.folder_kernels import import_folder_kernels
from pto_patch.patching.folder_watch import FolderState
from pto_patch.patching.originals import Originals, original_files
from pto_patch.patching.patch_state import PatchState, patch_state


@dataclass(frozen=True)
class FolderRead:
    checked: CheckedFolder  # the folder's patch state, decided once
    watched: FolderState  # the folder's files when it was checked: a change after that fails the run
    originals: Originals | None  # where the files before apply lie (a run with a reference), else None
    kernels: Any  # the folder's own pto_kernels, switched off (a PTO run), else None
    rope_section: list[int]  # the MRoPE section its config.json calls for (`model.rope_section`)
    guard_sites: dict[str, list[str]]  # {op: [class or function]} guarded in its modeling file
    may_switch_on: tuple[str, ...]  # every op the run may switch on (none without a PTO run)


def read_for_run(
    folder: Path,
    spec: ModelSpec,
    asked: OpsAsked,
    *,
    output_length: int,
    use_pto: bool,
    allow_modified: bool,
    reference: bool,
) -> FolderRead:
    """The folder's patch state, files and inputs, read under its shared lock (a writer at work: stop at
    once, never read its half-written files); `reference`: the run rebuilds the unpatched model."""
    with folder_lock.shared(folder):
        # a bad input is the user's to fix, whatever the folder's patch state: named first
        check_model_inputs(folder)  # every file a load reads fit to be read
        check_folder_auto_map(folder, spec)  # nothing imported from outside it, nothing fetched
        check_output_length(output_length, folder)  # within max_position_embeddings
        state = patch_state(folder)
        if use_pto:
            check_ops_patched(asked, folder, state)
        # half-patched, drifted or (with use_pto) unpatched folders are refused here, with their own message
        checked = check_folder(folder, use_pto=use_pto, allow_modified=allow_modified, state=state)
        watched = FolderState.now(folder)
        originals = original_files(folder, state) if reference else None
        kernels = _switched_off(import_folder_kernels(folder)) if use_pto else None
        rope_section = folder_mrope_section(folder, spec)
        guard_sites = guarded_in_folder(folder, spec)
    may_switch_on = asked.may_switch_on(spec, checked.patched_ops) if use_pto else ()
    return FolderRead(checked, watched, originals, kernels, rope_section, guard_sites, may_switch_on)


def _switched_off(kernels):
    """The kernel package as a run starts it: every op off, no call counted yet."""
    kernels.disable()
    kernels.reset_stats()
    return kernels


def check_ops_patched(asked: OpsAsked, folder: Path, state: PatchState) -> None:
    """Refuse `--ops` naming an op the folder was not patched with (`all` means every patched op).
    A folder that is not patched, or half patched, is left to the folder check, which says so."""
    if asked.named is None or asked.every_patched:
        return
    wanted = asked.named
    if not state.patched:
        return
    patched = tuple(state.manifest.ops)
    missing = [op for op in wanted if op not in patched]
    if not missing:
        return
    union = ",".join(op for op in OPS if op in patched or op in wanted)
    present = [op for op in wanted if op in patched]
    instead = f", or pass --ops {','.join(present)}" if present else ""
    raise PtoPatchError(
        f"{folder} is patched with {', '.join(patched)} only; --ops {', '.join(missing)} is not patched in",
        f"run `pto-patch restore --model-path {folder}` then "
        f"`pto-patch apply --model-path {folder} --ops {union}`{instead}",
        exit_code=EXIT_USAGE,
    )
