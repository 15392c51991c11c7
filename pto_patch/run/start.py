"""Where verify, bench and tune start: options checked, the folder checked, the model loaded once."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from pto_patch.model.spec import load_spec
from pto_patch.patching import folder_lock
from pto_patch.run import loading
from pto_patch.run.device import resolve_device
from pto_patch.run.inputs import check_image
from pto_patch.run.loading import LoadedModel, load_failures
from pto_patch.run.ops import choose_ops
from pto_patch.run.options import RunOptions, check_options
from pto_patch.run.patchers import find_other_patchers, other_patcher_checks
from pto_patch.run.preflight import check_ops_patched


@dataclass
class StartedRun:
    """The loaded model, and the failures (checkpoint keys, other patchers) and warnings found so far."""

    loaded: LoadedModel
    failures: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def run_folder(options: RunOptions, *, batch: int) -> Path:
    """The model folder a run's options name, before anything loads: usage errors first, as in start_run."""
    from pto_patch.model.folder import resolve_model_folder

    spec = load_spec(options.model)
    check_options(options, spec, batch)
    return resolve_model_folder(options.model_path, spec)


def start_run(options: RunOptions, *, batch: int, use_pto: bool) -> StartedRun:
    """Usage errors first, then the folder and --image, then one load (`loading.load_model`, looked up
    at call time so a test can wrap it)."""
    from pto_patch.model.folder import resolve_model_folder

    spec = load_spec(options.model)
    check_options(options, spec, batch)
    folder = resolve_model_folder(options.model_path, spec)
    if use_pto:
        check_ops_patched(options.ops, spec, folder)
    if options.image is not None:
        check_image(Path(options.image))
    device = resolve_device(options.device)
    with folder_lock.shared(
        folder
    ):  # no apply or restore may change the files while they are checked and loaded
        loaded = loading.load_model(
            spec,
            folder,
            device,
            options.dtype,
            use_pto=use_pto,
            allow_modified=options.allow_modified,
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
    loaded.other_patchers = find_other_patchers(loaded.model, spec)
    # Every op this run may switch on (--use_dynamic_config only ever switches a subset of these on).
    may_switch_on = choose_ops(options.ops, spec, loaded.state, batch, False)[0] if use_pto else ()
    more_failures, more_warnings = other_patcher_checks(loaded.other_patchers, may_switch_on)
    return StartedRun(loaded, failures + more_failures, warnings + more_warnings)
