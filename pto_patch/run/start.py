"""Where verify, bench and tune start: options read once into a plan, the folder checked, the model loaded
once.

A run's options are read in one pass (`plan_run`), before anything loads: every value checked, `--image`,
the device, `--ops` parsed, the model folder named and the ops it must hold. The folder's patch state is
decided there once, under its lock, with the ops the run may switch on and the folder's files as they were
(`patching.folder_watch`): the reference and the load take them from the plan, and refuse to go on if a file
changed since (a restore, an apply, an edit). The rest of the run reads the frozen `RunPlan` and never
parses an option or decides the folder's state again.

An op `--ops` names that apply did not patch in has no guard to reach, so its run could only end in
"switched on but never ran" after the whole load and both modes; the manifest already says what is
patched, so one line naming it, and the commands that would add the rest, come first.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pto_patch.errors import ModelFolderError
from pto_patch.model.spec import ModelSpec, OpsAsked, load_spec
from pto_patch.patching import folder_lock
from pto_patch.patching.folder_watch import FolderState, named
from pto_patch.patching.run_folder import FolderRead, read_for_run
from pto_patch.run import loading, progress
from pto_patch.run.device import DeviceChoice, resolve_device
from pto_patch.run.inputs import check_image
from pto_patch.run.loading import LoadedModel, load_failures
from pto_patch.run.options import RunOptions, check_option_values
from pto_patch.run.patchers import find_other_patchers, other_patcher_checks
from pto_patch.run.report_folder import check_report_place
from pto_patch.run.user_files import check_target


@dataclass(frozen=True)
class RunPlan:
    """A run's options, read and checked once: what it runs, on which folder and device, which ops."""

    options: RunOptions  # as given: counts, prompt and flags are read from here as they are
    spec: ModelSpec
    folder: Path  # the model folder the options name (checked here, under its lock)
    batch: int  # the largest batch the run makes
    use_pto: bool  # whether a PTO mode runs
    ops: OpsAsked  # --ops, parsed
    device: DeviceChoice
    read: FolderRead  # what was read of the folder, once, under its lock (`patching.run_folder`)
    usage: Any = None  # what the command's own usage checks returned (plan_run's `usage_checks`)

    def check_unchanged(self) -> None:
        """Refuse to go on (the reference, the load) when a file of the folder changed since the plan
        checked it: what the plan decided would not be what runs."""
        changed = self.read.watched.changed()
        if changed:
            raise ModelFolderError(
                f"{self.folder} changed since this run checked it ({named(changed)})",
                "run again once nothing changes the folder meanwhile (an apply, a restore, an edit)",
            )


def plan_run(
    options: RunOptions,
    *,
    batch: int,
    use_pto: bool,
    report_file: Path | None = None,
    usage_checks: Callable[[Path], Any] | None = None,
    reference: bool = False,
) -> RunPlan:
    """Usage errors first (every option value, --image), the device, the report's place; then the spec,
    `--ops` read once, the folder's name; the command's own usage checks that need the folder
    (`usage_checks(folder)`: its output places, its saved answers; what it returns is `plan.usage`); then
    the folder read once, under its lock (`patching.run_folder`: its inputs, --output_length against the
    model's positions, the ops it must hold, its patch state, its files and, with
    `reference` (a run that rebuilds the unpatched model), where its originals lie). Nothing loads."""
    from pto_patch.model.folder import resolve_model_folder

    check_option_values(options, batch)
    if options.image is not None:
        check_image(Path(options.image))
    device = resolve_device(options.device)
    if report_file is not None:
        check_report_place(Path(report_file).parent, "--report-file")
    spec = load_spec(options.model)
    asked = OpsAsked.read(options.ops, spec)
    folder = resolve_model_folder(options.model_path, spec)
    if report_file is not None:
        inputs = {"--model": spec.source_path, "--image": options.image}
        check_target(Path(report_file), "--report-file", inputs, model_folder=folder)
    usage = usage_checks(folder) if usage_checks is not None else None
    read = read_for_run(
        folder,
        spec,
        asked,
        output_length=options.output_length,
        use_pto=use_pto,
        allow_modified=options.allow_modified,
        reference=reference,
    )
    return RunPlan(options, spec, folder, batch, use_pto, asked, device, read, usage)


@dataclass
class StartedRun:
    """The loaded model, and the failures (checkpoint keys, other patchers) and warnings found so far."""

    loaded: LoadedModel
    failures: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    folder_state: FolderState | None = None  # the folder as the plan checked it (patching/folder_watch)

    def folder_changes(self) -> list[str]:
        """A failure naming what changed in the folder since it loaded (a restore, an edit), or none."""
        return self.folder_state.changes() if self.folder_state is not None else []


def start_run(plan: RunPlan) -> StartedRun:
    """One load of the planned folder (`loading.load_model`, looked up at call time so a test can wrap
    it), under a shared lock: no apply or restore may change the files while they are checked and loaded."""
    options = plan.options
    with folder_lock.shared(plan.folder):
        plan.check_unchanged()
        progress.phase("loading the patched model")
        loaded = loading.load_model(
            plan.spec,
            plan.folder,
            plan.device,
            options.dtype,
            checked=plan.read.checked,
            rope_section=plan.read.rope_section,
            kernels=plan.read.kernels,
            hub_kernels=options.hub_kernels,
        )
    warnings: list[str] = []
    if loaded.state.modified_files:
        warnings.append(
            "--allow-modified: ran patched files that differ from what apply wrote: "
            + ", ".join(loaded.state.modified_files)
        )
    if loaded.state.source_changed:
        warnings.append(
            "--allow-modified: ran an overlay whose source folder changed since apply: "
            + ", ".join(loaded.state.source_changed)
        )
    failures = load_failures(loaded.load_info)
    loaded.other_patchers = find_other_patchers(loaded.model, plan.spec, plan.read.guard_sites)
    more_failures, more_warnings = other_patcher_checks(loaded.other_patchers, plan.read.may_switch_on)
    # the folder as the plan checked it: a change after that (meanwhile or after the load) fails the run
    return StartedRun(loaded, failures + more_failures, warnings + more_warnings, plan.read.watched)
