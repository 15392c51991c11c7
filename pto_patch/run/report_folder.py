"""Where a run's reports go: never into the model folder unless asked, never into a Hugging Face cache.

bench writes its two mode reports, and verify its `--report-file`, to a place of their own: by default
`reports/` in the user's pto-patch cache folder (`$PTO_PATCH_CACHE`, else `$XDG_CACHE_HOME/pto-patch`,
else `~/.cache/pto-patch`, as huggingface_hub places its own), one new folder per run, named after the
command, the model folder and the time. A folder passed on the command line is used as it is, the model
folder too (it was asked for; `status` then lists the files as not the checkpoint's), but a place in
the hub cache is refused: other snapshots and users share it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from pto_patch.errors import EXIT_USAGE, PtoPatchError
from pto_patch.model.hub_cache import cache_holding
from pto_patch.patching.rewrite_cache import cache_dir

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


@dataclass(frozen=True)
class ReportPlace:
    """Where a run's reports go: `path` itself, or (`fresh`) a new folder named after it."""

    path: Path
    fresh: bool

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
            except OSError as exc:
                raise PtoPatchError(
                    f"cannot make the report folder {chosen}: {exc.strerror}",
                    "pass --output-dir with a writable folder",
                ) from exc
            return chosen
        raise PtoPatchError(f"{self.path}: too many report folders of this name", "pass --output-dir")


def run_reports_place(command: str, model_folder: Path, requested: Path | None, option: str) -> ReportPlace:
    """Where a run writes its reports: `requested`, else a new folder under `reports_root()`. Chosen
    (and refused) before anything loads; made when the reports are written."""
    if requested is not None:
        check_report_place(Path(requested), option)
        return ReportPlace(Path(requested), fresh=False)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    base = reports_root() / f"{command}-{Path(model_folder).name}-{stamp}"
    check_report_place(base, option)
    return ReportPlace(base, fresh=True)
