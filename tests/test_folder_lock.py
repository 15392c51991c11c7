"""The folder lock: one writer at a time, readers beside readers, a killed holder never blocks.

Races run real `pto-patch` processes against one folder; after each round a restore must give the
original folder back byte for byte.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from pto_patch.errors import FolderBusyError
from pto_patch.patching import engine, folder_lock
from tests.folder_snapshot import snapshot
from tests.helpers.cli import run_cli
from tests.helpers.folders import HUB_CONFIG, write_config
from tests.helpers.lock_holder import HOLDER, Holder
from tests.robustness_counts import COUNTS

REPO = Path(__file__).resolve().parents[1]


def test_a_second_writer_fails_at_once_naming_the_holder(model_folder: Path, capsys):
    before = snapshot(model_folder)
    holder = Holder(model_folder, folder_lock.EXCLUSIVE)
    try:
        with pytest.raises(FolderBusyError) as busy:
            engine.apply_patch(model_path=model_folder)
        assert busy.value.message == (
            f"another pto-patch (pid {holder.process.pid}, "
            f"{' '.join([sys.executable, '-c', HOLDER, str(model_folder), 'exclusive'])[:120]}) "
            f"is working on {model_folder.resolve()}"
        )
        assert busy.value.exit_code == 1
        assert run_cli("apply", "--model-path", str(model_folder)) == 1
        stderr = capsys.readouterr().err
        assert f"another pto-patch (pid {holder.process.pid}" in stderr and "hint:" in stderr
        assert "Traceback" not in stderr
        # readers are refused while a writer works, too
        with pytest.raises(FolderBusyError), folder_lock.shared(model_folder):
            pass
    finally:
        holder.release()
    assert snapshot(model_folder) == before
    engine.apply_patch(model_path=model_folder)  # free again once the holder is done


def test_a_killed_holder_never_blocks(model_folder: Path):
    before = snapshot(model_folder)
    holder = Holder(model_folder, folder_lock.EXCLUSIVE)
    with pytest.raises(FolderBusyError):
        engine.restore_model(model_path=model_folder)
    holder.kill()
    engine.apply_patch(model_path=model_folder)
    engine.restore_model(model_path=model_folder)
    assert snapshot(model_folder) == before


def test_readers_share_and_keep_writers_out(model_folder: Path):
    reader = Holder(model_folder, folder_lock.SHARED)
    try:
        with folder_lock.shared(model_folder):  # a second reader is welcome
            pass
        with pytest.raises(FolderBusyError, match=f"pid {reader.process.pid}"):
            engine.apply_patch(model_path=model_folder)
        engine.apply_patch(model_path=model_folder, dry_run=True)  # a dry run only reads
    finally:
        reader.release()
    with folder_lock.exclusive(model_folder):
        pass


def test_reentrant_in_one_thread_exclusive_across_threads(model_folder: Path):
    seen: list[BaseException | None] = []

    def other_thread() -> None:
        try:
            with folder_lock.shared(model_folder):
                seen.append(None)
        except FolderBusyError as exc:
            seen.append(exc)

    with folder_lock.shared(model_folder):
        with folder_lock.exclusive(model_folder):  # upgraded for the inner block (tune calling apply)
            engine.apply_patch(model_path=model_folder)  # takes it again: re-entrant
            thread = threading.Thread(target=other_thread)
            thread.start()
            thread.join()
        thread = threading.Thread(target=other_thread)  # back to shared: another reader may join
        thread.start()
        thread.join()
    assert isinstance(seen[0], FolderBusyError) and seen[1] is None
    engine.restore_model(model_path=model_folder)


def _cli(*args: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen(
        [sys.executable, "-m", "pto_patch", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=REPO,
    )


RACE_ROUNDS = (
    ("apply", "apply", "apply"),  # the report that started it: three applies at once
    ("apply", "restore", "apply"),
    ("restore", "apply", "restore"),
)


@pytest.mark.parametrize("commands", RACE_ROUNDS, ids=["-".join(c) for c in RACE_ROUNDS])
def test_concurrent_commands_never_lose_the_original(model_folder: Path, commands):
    before = snapshot(model_folder)
    if commands[0] == "restore":
        engine.apply_patch(model_path=model_folder)
    processes = [_cli(command, "--model-path", str(model_folder)) for command in commands]
    COUNTS["races"] += len(processes)
    COUNTS["race_rounds"] += 1
    outcomes = []
    for process in processes:
        stdout, stderr = process.communicate(timeout=300)
        outcomes.append((process.returncode, stderr))
    for code, stderr in outcomes:
        assert "Traceback" not in stderr
        assert code == 0 or "another pto-patch (pid" in stderr or "is not patched" in stderr, stderr
    assert any(code == 0 for code, _ in outcomes)
    status = engine.model_status(model_path=model_folder)
    assert status.state in (None, "complete") and not status.drifted
    if status.patched:
        engine.restore_model(model_path=model_folder)
    assert snapshot(model_folder) == before


@pytest.mark.parametrize("command", ["verify", "bench"])
def test_verify_and_bench_wait_for_no_writer(model_folder: Path, command: str, capsys, tmp_path: Path):
    """They take the lock shared while they check and load: a writer at work makes them stop at once."""
    holder = Holder(model_folder, folder_lock.EXCLUSIVE)
    try:
        extra = ("--output-dir", str(tmp_path)) if command == "bench" else ()
        assert run_cli(command, "--model-path", str(model_folder), "--device", "cpu", *extra) == 1
        stderr = capsys.readouterr().err
        assert f"another pto-patch (pid {holder.process.pid}" in stderr and "Traceback" not in stderr
    finally:
        holder.release()


def test_applies_at_once_share_the_rewrite_cache(tmp_path: Path, rewrite_cache_dir: Path):
    """Three applies of one release at once on three folders: all rewrite and save the same entries
    together (an empty cache), then three more all reuse them; every folder is what apply writes
    without a cache, and every entry is whole."""
    from pto_patch.patching.rewrite_cache import RewriteCache

    reference = tmp_path / "reference"
    reference.mkdir()
    write_config(reference, HUB_CONFIG)
    engine.apply_patch(model_path=reference, use_cache=False)
    for wave in ("empty cache", "filled cache"):
        folders = []
        for index in range(3):
            folder = tmp_path / f"{wave.split()[0]}{index}"
            folder.mkdir()
            write_config(folder, HUB_CONFIG)
            folders.append(folder)
        processes = [_cli("apply", "--model-path", str(folder)) for folder in folders]
        COUNTS["races"] += len(processes)
        COUNTS["race_rounds"] += 1
        for process in processes:
            _, stderr = process.communicate(timeout=300)
            assert process.returncode == 0 and "warning" not in stderr, (wave, stderr)
        for folder in folders:
            assert snapshot(folder) == snapshot(reference), wave
    warnings: list[str] = []
    cache = RewriteCache(rewrite_cache_dir, warnings.append)
    keys = [p.name for p in (rewrite_cache_dir / "rewrites").iterdir() if not p.name.startswith(".")]
    assert len(keys) == 2 and all(cache.load(key) for key in keys) and warnings == []
    assert [p.name for p in (rewrite_cache_dir / "rewrites").iterdir() if p.name.startswith(".")] == []
