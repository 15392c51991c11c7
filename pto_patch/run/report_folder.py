"""Where a run's reports go: never into the model folder unless asked, never into a Hugging Face cache.

bench writes its two mode reports, and verify its `--report-file`, to a place of their own: by default
`reports/` in the user's pto-patch cache folder (`$PTO_PATCH_CACHE`, else `$XDG_CACHE_HOME/pto-patch`,
else `~/.cache/pto-patch`, as huggingface_hub places its own), one new folder per run, named after the
command, the model folder and the time. A folder passed on the command line is used as it is, the model
folder too (it was asked for; `status` then lists the files as not the checkpoint's), but a place in
the hub cache is refused: other snapshots and users share it.

Everything that could stop the reports from being written is checked before anything is measured: a
place that is a file, under a file, or not writable (an unwritable `$PTO_PATCH_CACHE` too), and a
folder that already holds another run's reports of the same names. Two runs into one folder never
replace each other: each report is created, never renamed over a file; a name another run took
meanwhile gets a number (`bench_baseline-2.json`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from pto_patch.errors import EXIT_USAGE, PtoPatchError, UsageError
from pto_patch.model.hub_cache import cache_holding
from pto_patch.patching.rewrite_cache import cache_dir
from pto_patch.run.user_files import outside_model_folder

REPORTS = "reports"


def reports_root() -> Path:
    return cache_dir() / REPORTS


def check_report_place(path: Path, option: str) -> None:
    """Refuse a report path inside the Hugging Face cache (asked for or not)."""
    holder = cache_holding(Path(path))
    if holder is not None:
        raise PtoPatchError(
            f"{path} is inside the Hugging Face cache ({holder}); runs write no reports there",
            f"pass {option} with a path outside it (bench reports go to {reports_root()} by default)",
            exit_code=EXIT_USAGE,
        )


def check_writable_place(path: Path, what: str, hint: str) -> None:
    """Refuse a folder that is a file, lies under a file, or lies where nothing can be written."""
    path = Path(path)
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent  # the first that exists: the missing folders are made in it
    if not existing.is_dir():
        where = "is a file" if existing == path else f"lies under the file {existing}"
        raise UsageError(f"{what} {path} {where}, not a folder", hint)
    from pto_patch.run.kept_results import room_problem

    problem = room_problem(existing)
    if problem is not None:
        raise UsageError(f"{what} {path}: {problem}", hint)


@dataclass(frozen=True)
class ReportPlace:
    """Where a run's reports go: `path` itself, or (`fresh`) a new folder named after it."""

    path: Path
    fresh: bool
    option: str = "--output-dir"

    def write(self, directory: Path, name: str, document: dict) -> Path:
        """One report, created in `directory` (never over another run's file); the path it took."""
        from pto_patch.run.report import report_bytes
        from pto_patch.run.user_files import write_new_user_file

        return write_new_user_file(Path(directory) / name, report_bytes(document), self.option)

    def make(self) -> Path:
        """The folder, made now: a fresh one never reuses a folder that exists (two runs in one second)."""
        if not self.fresh:
            return self.path
        for number in range(1, 1000):
            chosen = self.path if number == 1 else self.path.with_name(f"{self.path.name}-{number}")
            try:
                chosen.mkdir(parents=True)
            except FileExistsError:
                continue
            except OSError as exc:  # after the work: the reports go to pto-patch's cache instead
                from pto_patch.run.kept_results import keep_folder

                return keep_folder(self.option, chosen, exc) or chosen
            return chosen
        raise PtoPatchError(f"{self.path}: too many report folders of this name", "pass --output-dir")


def output_dir_check(command: str, output_dir: Path | None, files: tuple[str, ...]):
    """A plan's usage check (`run.start.plan_run`): `--output-dir`'s place for `files`, once the model
    folder is known (`run_reports_place`); the plan keeps the place as `plan.usage`."""
    return lambda model_folder: run_reports_place(command, model_folder, output_dir, "--output-dir", files)


def run_reports_place(
    command: str, model_folder: Path, requested: Path | None, option: str, files: tuple[str, ...] = ()
) -> ReportPlace:
    """Where a run writes its reports (`files`): `requested`, else a new folder under `reports_root()`.
    Chosen and checked before anything loads (see the module docstring); made when they are written."""
    if requested is not None:
        requested = Path(requested)
        outside_model_folder(requested, option, model_folder)
        check_report_place(requested, option)
        check_writable_place(requested, option, f"pass a writable folder for {option}")
        taken = [name for name in files if (requested / name).exists() or (requested / name).is_symlink()]
        if taken:
            raise UsageError(
                f"{option} {requested} already holds {taken[0]} of another run",
                f"pass a new or empty folder for {option}, so that no run's reports replace another's",
            )
        return ReportPlace(requested, fresh=False, option=option)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    base = reports_root() / f"{command}-{Path(model_folder).name}-{stamp}"
    check_report_place(base, option)
    check_writable_place(
        reports_root(),
        "the reports folder",
        f"set PTO_PATCH_CACHE to a writable folder, or pass {option}",
    )
    return ReportPlace(base, fresh=True, option=option)
