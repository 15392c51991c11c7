"""Deterministic fault injection: every file operation of an apply and of a restore, made to fail.

The file layer (pto_patch/patching/fileio.py) passes one checkpoint per write, rename, link and remove; a
`FaultPlan` armed there fails the Nth one. Each sweep runs the command once to count its
operations, then once per N and per kind of fault:

- a passing fault (ENOSPC, EIO or EACCES, once): the command fails with one message and the folder
  is left exactly original or exactly patched, as that message says;
- a full disk (every write from the Nth on fails with ENOSPC): the same, since undoing needs no space;
- a dead folder (every operation from the Nth on fails with EIO): the message says what is left,
  and once the fault is gone, restore (or apply, then restore) gives the original back.

After every run the folder's bytes, modes and links are compared with the original, the blob store
of the Hugging Face cache layout is checked untouched, and every path the file layer touched must
lie inside the folder. Planning (the codemods) writes nothing, so its result is computed once per
layout and reused, which keeps a sweep to seconds. The real SIGKILL of a `pto-patch` process at
spread-out operations is here too. Counts are printed at the end of the run.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from pto_patch.errors import PtoPatchError
from pto_patch.patching import engine, fileio
from pto_patch.patching.manifest import MANIFEST_DIR, Manifest
from tests.folder_snapshot import snapshot
from tests.helpers.cli import run_cli
from tests.helpers.folders import HUB_CONFIG
from tests.robustness_counts import COUNTS

# Each test its own rewrite cache: a campaign counts the writes of an apply, the cache's among them.
pytestmark = pytest.mark.usefixtures("rewrite_cache_dir")

REPO = Path(__file__).resolve().parents[1]
PASSING = (errno.ENOSPC, errno.EIO, errno.EACCES)


def _modeling_source() -> bytes:
    from pto_patch.model.locate import installed_transformers_dir

    return (installed_transformers_dir() / "models" / "qwen2_5_vl" / "modeling_qwen2_5_vl.py").read_bytes()


def _configuration_source() -> bytes:
    from pto_patch.model.locate import installed_transformers_dir

    return (
        installed_transformers_dir() / "models" / "qwen2_5_vl" / "configuration_qwen2_5_vl.py"
    ).read_bytes()


def _config_bytes() -> bytes:
    return (json.dumps(HUB_CONFIG, indent=2) + "\n").encode()


class Layout:
    """A template folder, a work copy reset before every run, and what must never change."""

    def __init__(self, root: Path, kind: str) -> None:
        self.kind = kind
        self.repo = root / kind
        if kind == "hf-cache":
            # <repo>/snapshots/<rev>/ holds links to <repo>/blobs/; apply must replace links, never write blobs
            self.blobs = self.repo / "blobs"
            self.template = self.repo / "snapshots" / "template"
            self.folder = self.repo / "snapshots" / "work"
            self.blobs.mkdir(parents=True)
            self.template.mkdir(parents=True)
            files = {
                "config.json": _config_bytes(),
                "tokenizer.json": b"{}",
                "modeling_qwen2_5_vl.py": _modeling_source(),
                "configuration_qwen2_5_vl.py": _configuration_source(),
            }
            for name, data in files.items():
                blob = self.blobs / hashlib.sha256(data).hexdigest()
                blob.write_bytes(data)
                os.symlink(os.path.relpath(blob, self.template), self.template / name)
        else:
            self.blobs = None
            self.template = self.repo / "template"
            self.folder = self.repo / "work"
            self.template.mkdir(parents=True)
            (self.template / "config.json").write_bytes(_config_bytes())
            (self.template / "tokenizer.json").write_bytes(b"{}")
            os.chmod(self.template / "config.json", 0o640)  # modes come back too
        self.original = snapshot(self.template)
        self.blob_picture = snapshot(self.blobs) if self.blobs else None
        self.reset()
        engine.apply_patch(model_path=self.folder)
        self.patched = snapshot(self.folder)
        self.patched_template = self.template.with_name("patched-template")
        shutil.copytree(self.folder, self.patched_template, symlinks=True)

    def reset(self, *, patched: bool = False) -> None:
        """The work folder as the original (or as apply leaves it), at the same path every time."""
        if self.folder.exists():
            shutil.rmtree(self.folder)
        shutil.copytree(self.patched_template if patched else self.template, self.folder, symlinks=True)

    def check_untouched_outside(self, plan: fileio.FaultPlan) -> None:
        if self.blobs is not None:
            assert snapshot(self.blobs) == self.blob_picture, "the HF cache's blob store was written"
        outside = [path for _, path in plan.operations if not Path(path).is_relative_to(self.folder)]
        assert outside == [], f"file operations outside the folder: {outside[:3]}"

    def state(self) -> str:
        now = snapshot(self.folder)
        if now == self.original:
            return "original"
        if now == self.patched:
            return "patched"
        return "in-progress"


@pytest.fixture(scope="module")
def layouts(tmp_path_factory) -> dict[str, Layout]:
    root = tmp_path_factory.mktemp("faults")
    return {kind: Layout(root, kind) for kind in ("hf-cache", "plain")}


@pytest.fixture()
def planned_once(monkeypatch):
    """Plan each folder once: planning reads and computes, never writes, and is the slow part."""
    plans: dict = {}
    real = engine.plan_patch

    def cached(folder, spec, ops, *args, **kwargs):
        key = (str(folder), ops)
        if key not in plans:
            plans[key] = real(folder, spec, ops, *args, **kwargs)
        return plans[key]

    monkeypatch.setattr(engine, "plan_patch", cached)


def count_operations(layout: Layout, command) -> int:
    with fileio.injected_faults(fileio.FaultPlan(nth=10**9)) as plan:
        command()
    layout.check_untouched_outside(plan)
    return plan.seen


def fault_plans(total: int, writes: int):
    for nth in range(1, total + 1):  # the errno takes no other path in the code: one per N, in turn
        yield "passing", fileio.FaultPlan(nth=nth, error=PASSING[nth % len(PASSING)])
    for nth in range(1, writes + 1):
        yield (
            "full-disk",
            fileio.FaultPlan(nth=nth, error=errno.ENOSPC, kinds=(fileio.WRITE,), persistent=True),
        )
    for nth in range(1, total + 1):
        yield "dead", fileio.FaultPlan(nth=nth, error=errno.EIO, persistent=True)


def recover_and_check(layout: Layout, attempt: int) -> None:
    """Restore, or apply then restore (alternating), must give back the original byte for byte."""
    if attempt % 2 and layout.state() != "original":
        engine.apply_patch(model_path=layout.folder)
        assert layout.state() == "patched"
    if (layout.folder / MANIFEST_DIR).exists():
        engine.restore_model(model_path=layout.folder)
    assert layout.state() == "original"
    COUNTS["recovered"] += 1


def _write_count(layout: Layout, command) -> int:
    with fileio.injected_faults(fileio.FaultPlan(nth=10**9, kinds=(fileio.WRITE,))) as plan:
        command()
    return plan.seen


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["hf-cache", "plain"])
def test_every_fault_of_an_apply(layouts, kind: str, planned_once):
    layout = layouts[kind]
    layout.reset()
    apply = lambda: engine.apply_patch(model_path=layout.folder)  # noqa: E731
    total = count_operations(layout, apply)
    layout.reset()
    writes = _write_count(layout, apply)
    assert total >= 20 and writes >= 8  # the sweep reaches every step, not a token few

    for attempt, (mode, plan) in enumerate(fault_plans(total, writes)):
        layout.reset()
        with fileio.injected_faults(plan), pytest.raises(PtoPatchError) as failed:
            apply()
        COUNTS["fault_runs"] += 1
        COUNTS["faults"] += plan.injected
        assert plan.injected >= 1
        message = failed.value.message
        assert message.startswith(f"writing the patch into {layout.folder} failed"), message
        assert "\n" not in message
        layout.check_untouched_outside(plan)
        if mode in ("passing", "full-disk"):
            assert "rolled back to its original bytes" in message, (mode, plan.nth, message)
            assert layout.state() == "original", (mode, plan.nth)
        elif "rolled back to its original bytes" in message:
            assert layout.state() == "original"
        else:
            COUNTS["left_in_progress"] += 1
            assert "rolling it back failed too" in message and "left: " in message
            assert "pto-patch restore" in failed.value.hint
            assert layout.state() == "in-progress", (mode, plan.nth)
        recover_and_check(layout, attempt)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["hf-cache", "plain"])
def test_every_fault_of_a_restore(layouts, kind: str, planned_once):
    layout = layouts[kind]

    def patched_folder() -> None:
        layout.reset(patched=True)
        assert layout.state() == "patched"

    restore = lambda: engine.restore_model(model_path=layout.folder)  # noqa: E731
    patched_folder()
    total = count_operations(layout, restore)
    patched_folder()
    writes = _write_count(layout, restore)
    assert total >= 10

    for attempt, (mode, plan) in enumerate(fault_plans(total, writes)):
        patched_folder()
        try:
            with fileio.injected_faults(plan):
                restore()
            done = True
        except PtoPatchError as failed:
            done = False
            assert failed.message.startswith(f"restoring {layout.folder} stopped"), failed.message
            assert "left: " in failed.message and "\n" not in failed.message
        COUNTS["fault_runs"] += 1
        COUNTS["faults"] += plan.injected
        assert plan.injected >= 1
        layout.check_untouched_outside(plan)
        if mode in ("passing", "full-disk"):
            # the retry at once (passing) or renames that need no space (full disk) finish the job
            assert done and layout.state() == "original", (mode, plan.nth)
        elif not done:
            COUNTS["left_in_progress"] += 1
            if layout.state() == "in-progress" and Manifest.exists_in(layout.folder):
                # status must not call a half-restored folder cleanly patched
                status = engine.model_status(model_path=layout.folder)
                assert status.state == "in_progress" or status.drifted, (plan.nth, status)
        recover_and_check(layout, attempt)


# --- a real SIGKILL at spread-out moments -----------------------------------------------------------

# The pto-patch command line, with the fault hook armed to SIGKILL the process at operation N.
KILLED_AT = """
import sys
from pto_patch.patching import fileio
fileio.arm(fileio.FaultPlan(nth=int(sys.argv[1]), kill=True))
from pto_patch.cli.app import main
main(sys.argv[2:])
"""
KILLS_PER_COMMAND = 4


def run_killed(nth: int, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-c", KILLED_AT, str(nth), *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=300,
    )


def spread(total: int, count: int) -> list[int]:
    """`count` operation numbers from the first to the last, evenly apart."""
    return sorted({1 + round(i * (total - 1) / (count - 1)) for i in range(count)})


@pytest.mark.slow
@pytest.mark.parametrize("command", ["apply", "restore"])
def test_sigkill_at_spread_out_moments(layouts, command: str):
    layout = layouts["hf-cache"]
    layout.reset()
    if command == "restore":
        engine.apply_patch(model_path=layout.folder)
        run = lambda: engine.restore_model(model_path=layout.folder)  # noqa: E731
    else:
        run = lambda: engine.apply_patch(model_path=layout.folder)  # noqa: E731
    total = count_operations(layout, run)
    for attempt, nth in enumerate(spread(total, KILLS_PER_COMMAND)):
        layout.reset(patched=command == "restore")
        done = run_killed(nth, command, "--model-path", str(layout.folder))
        assert done.returncode == -signal.SIGKILL, done.stderr[-2000:]
        COUNTS["kills"] += 1
        assert layout.blob_picture == snapshot(layout.blobs)
        if layout.state() == "in-progress":
            assert (layout.folder / MANIFEST_DIR).exists()  # the next command knows to roll it back
        recover_and_check(layout, attempt)


# --- the rewrite cache: a writer killed or out of disk space never costs the apply ------------------

# pto-patch, SIGKILLed as it renames its Nth rewrite cache entry into place (its text fully written).
KILLED_SAVING_THE_CACHE = """
import os, signal, sys
renames = []
real_replace = os.replace
def replace(source, target, *args, **kwargs):
    if os.sep + "rewrites" + os.sep in os.fspath(target):
        renames.append(target)
        if len(renames) == int(sys.argv[1]):
            os.kill(os.getpid(), signal.SIGKILL)
    return real_replace(source, target, *args, **kwargs)
os.replace = replace
from pto_patch.cli.app import main
main(sys.argv[2:])
"""


def _plain_model(folder: Path) -> Path:
    folder.mkdir()
    (folder / "config.json").write_bytes(_config_bytes())
    return folder


def _cache_entries(cache: Path) -> list[Path]:
    return sorted((cache / "rewrites").glob("*")) if (cache / "rewrites").is_dir() else []


@pytest.mark.parametrize("nth", [1, 2])
def test_a_writer_killed_saving_the_cache_leaves_no_entry_and_no_harm(tmp_path, rewrite_cache_dir, nth: int):
    reference = _plain_model(tmp_path / "reference")
    engine.apply_patch(model_path=reference, use_cache=False)
    folder = _plain_model(tmp_path / "model")
    original = snapshot(folder)
    killed = subprocess.run(
        [sys.executable, "-c", KILLED_SAVING_THE_CACHE, str(nth), "apply", "--model-path", str(folder)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        cwd=REPO,
        timeout=300,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    COUNTS["kills"] += 1
    assert snapshot(folder) == original  # killed while planning: the folder was never touched
    whole = [p for p in _cache_entries(rewrite_cache_dir) if not p.name.startswith(".")]
    assert len(whole) == nth - 1  # the entry being renamed never appeared; its temporary is ignored
    assert any(p.name.startswith(".") for p in _cache_entries(rewrite_cache_dir))

    done = subprocess.run(
        [sys.executable, "-m", "pto_patch", "apply", "--model-path", str(folder)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        cwd=REPO,
        timeout=300,
    )
    assert done.returncode == 0 and "warning" not in done.stderr, done.stderr
    assert snapshot(folder) == snapshot(reference)
    assert len([p for p in _cache_entries(rewrite_cache_dir) if not p.name.startswith(".")]) == 2
    COUNTS["recovered"] += 1


def test_a_full_disk_while_saving_the_cache_does_not_fail_the_apply(
    tmp_path, rewrite_cache_dir, monkeypatch, capsys
):
    """The cache's writes hit a real ENOSPC (/dev/full); apply writes the folder all the same."""
    reference = _plain_model(tmp_path / "reference")
    engine.apply_patch(model_path=reference, use_cache=False)
    real_mkstemp = tempfile.mkstemp
    full: list[str] = []

    def mkstemp(*args, dir=None, **kwargs):
        fd, name = real_mkstemp(*args, dir=dir, **kwargs)
        if dir is not None and Path(dir).is_relative_to(rewrite_cache_dir):
            os.close(fd)
            fd = os.open("/dev/full", os.O_WRONLY)
            full.append(name)
        return fd, name

    monkeypatch.setattr(tempfile, "mkstemp", mkstemp)
    folder = _plain_model(tmp_path / "model")
    assert run_cli("apply", "--model-path", str(folder)) == 0
    assert len(full) == 2  # both rewrites tried to save, and the disk was full both times
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 2 and all("No space left on device" in line for line in warnings), warnings
    assert snapshot(folder) == snapshot(reference)
    assert _cache_entries(rewrite_cache_dir) == []  # no entry, and no temporary left behind
    COUNTS["faults"] += len(full)
