"""apply --overlay OUT: the source folder is never written, and is byte-identical (links included) after.

Read-only is enforced three ways, as far as the machine allows: a read-only bind mount (in a private
mount namespace), another user (`nobody`) on a folder without write bits, and, for root on an
ordinary folder, an audit hook that fails the process on any write-type file operation that touches
the source. Every test compares the source (bytes, modes, links, modification times) before and after.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from pto_patch.errors import DriftError, ModelFolderError, PtoPatchError
from pto_patch.patching import engine, fileio
from pto_patch.patching.fileio import sha256_file
from pto_patch.patching.manifest import Manifest
from pto_patch.patching.overlay import record_of
from pto_patch.tiny.model import make_tiny
from tests.folder_snapshot import snapshot
from tests.helpers.cli import run_cli
from tests.spec_pipeline import QUICK, page_image, run_in_fresh_process

REPO = Path(__file__).resolve().parents[1]
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def picture(root: Path) -> dict:
    """snapshot() plus every entry's own modification time (lstat), the root's included."""
    times = {".": os.lstat(root).st_mtime_ns}
    for directory, dirs, files in os.walk(root, followlinks=False):
        for name in dirs + files:
            path = Path(directory) / name
            times[path.relative_to(root).as_posix()] = os.lstat(path).st_mtime_ns
    return {"entries": snapshot(root), "mtimes": times}


def _chmod_tree(root: Path, file_mode: int, dir_mode: int) -> None:
    """Every file and folder under root (links left alone), root first so a locked tree opens up."""
    root.chmod(dir_mode)
    for directory, dirs, files in os.walk(root):
        for name, mode in [(d, dir_mode) for d in dirs] + [(f, file_mode) for f in files]:
            path = Path(directory) / name
            if not path.is_symlink():
                path.chmod(mode)


def make_read_only(root: Path) -> None:
    _chmod_tree(root, 0o444, 0o555)


def make_writable(root: Path) -> None:
    if root.exists():
        _chmod_tree(root, 0o644, 0o755)


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    return make_tiny(tmp_path_factory.mktemp("pristine") / "GutenOCR-tiny").path


@pytest.fixture
def source(pristine: Path, tmp_path: Path):
    """A read-only (no write bits) copy of the tiny model."""
    folder = tmp_path / "store" / "GutenOCR-tiny"
    shutil.copytree(pristine, folder)
    make_read_only(folder)
    yield folder
    make_writable(folder)


@pytest.fixture
def hf_cache(pristine: Path, tmp_path: Path):
    """The Hugging Face cache layout: snapshots/<commit>/<file> are relative links into blobs/."""
    repo = tmp_path / "hub" / "models--rootsautomation--GutenOCR-3B"
    (repo / "blobs").mkdir(parents=True)
    snap = repo / "snapshots" / COMMIT
    snap.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    for path in sorted(pristine.iterdir()):
        blob = sha256_file(path)
        shutil.copyfile(path, repo / "blobs" / blob)
        (snap / path.name).symlink_to(f"../../blobs/{blob}")
    make_read_only(repo)
    yield snap
    make_writable(repo)


def overlay_record(out: Path):
    return record_of(out, Manifest.load(out))


# --- the layout, in process --------------------------------------------------------------------------


def test_overlay_links_the_rest_writes_only_into_out_and_restore_removes_it(source: Path, tmp_path: Path):
    before = picture(source)
    out = tmp_path / "overlay"
    with fileio.injected_faults(fileio.FaultPlan(nth=10**9)) as seen:
        result = engine.apply_patch(model_path=source, overlay=out)
    assert result.overlay_of == source and result.folder == out
    assert seen.operations and not [path for _, path in seen.operations if Path(path).is_relative_to(source)]

    written = {path for path, _ in result.files}
    assert {"config.json", "modeling_qwen2_5_vl.py", "configuration_qwen2_5_vl.py"} <= written
    for entry in sorted(source.iterdir()):
        in_out = out / entry.name
        if entry.name in written:
            assert in_out.is_file() and not in_out.is_symlink()
        else:
            assert in_out.is_symlink() and os.readlink(in_out) == str(entry)
            assert in_out.read_bytes() == entry.read_bytes()
    assert (out / "pto_kernels" / "__init__.py").is_file()

    record = overlay_record(out)
    assert record.source == str(source) and record.created_folder
    assert {e.path: e.sha256 for e in record.entries} == {p.name: sha256_file(p) for p in source.iterdir()}

    status = engine.model_status(model_path=out)
    assert status.patched and status.overlay == {
        "source": str(source),
        "links": len(record.links),
        "source_changed": [],
    }

    restored = engine.restore_model(model_path=out)
    assert restored.removed_folder and restored.overlay_of == source
    assert not out.exists()
    assert picture(source) == before


def test_restore_keeps_a_folder_that_existed_and_refuses_edits(source: Path, tmp_path: Path):
    before = picture(source)
    out = tmp_path / "overlay"
    out.mkdir()
    engine.apply_patch(model_path=source, overlay=out)
    with open(out / "modeling_qwen2_5_vl.py", "a", encoding="utf-8") as handle:
        handle.write("# my edit\n")
    with pytest.raises(DriftError, match="modeling_qwen2_5_vl.py"):
        engine.restore_model(model_path=out)
    restored = engine.restore_model(model_path=out, force=True)
    assert not restored.removed_folder
    assert sorted(p.name for p in out.iterdir()) == ["modeling_qwen2_5_vl.py.edited"]
    assert picture(source) == before


def test_second_apply_is_a_noop_and_conflicts_are_refused(source: Path, tmp_path: Path, pristine: Path):
    out = tmp_path / "overlay"
    engine.apply_patch(model_path=source, overlay=out)
    assert engine.apply_patch(model_path=source, overlay=out).already_applied
    with pytest.raises(ModelFolderError, match="already patched with ops"):
        engine.apply_patch(model_path=source, overlay=out, ops="rms_norm")
    other = tmp_path / "other"
    shutil.copytree(pristine, other)
    with pytest.raises(ModelFolderError, match=f"is an overlay of {source}"):
        engine.apply_patch(model_path=other, overlay=out)
    # the overlay is itself a patched folder: a plain apply there is the same no-op
    assert engine.apply_patch(model_path=out).already_applied


@pytest.mark.parametrize(
    ("where", "message"),
    [
        ("inside", "lies inside the model folder"),
        ("foreign", "is not empty and holds no pto-patch overlay"),
        ("file", "exists and is not a folder"),
    ],
)
def test_bad_overlay_folders_are_refused_before_anything_is_written(
    source: Path, tmp_path: Path, where, message
):
    before = picture(source)
    out = {"inside": source / "overlay", "foreign": tmp_path / "foreign", "file": tmp_path / "a-file"}[where]
    if where == "foreign":
        out.mkdir()
        (out / "notes.txt").write_text("mine")
    if where == "file":
        out.write_text("x")
    with pytest.raises(ModelFolderError, match=message):
        engine.apply_patch(model_path=source, overlay=out)
    assert picture(source) == before


def test_a_folder_patched_in_place_cannot_be_overlaid(pristine: Path, tmp_path: Path):
    folder = tmp_path / "model"
    shutil.copytree(pristine, folder)
    engine.apply_patch(model_path=folder)
    with pytest.raises(ModelFolderError, match="holds a pto-patch patch"):
        engine.apply_patch(model_path=folder, overlay=tmp_path / "overlay")
    assert not (tmp_path / "overlay").exists()


def test_dry_run_creates_nothing(source: Path, tmp_path: Path, capsys):
    assert (
        run_cli("apply", "--model-path", str(source), "--overlay", str(tmp_path / "o"), "--dry-run", "--json")
        == 0
    )
    document = json.loads(capsys.readouterr().out)
    assert document["dry_run"] and document["overlay_of"] == str(source)
    assert "+++ b/modeling_qwen2_5_vl.py" in document["diff"]
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("nth", [1, 3, 9, 20])
def test_a_failed_overlay_apply_rolls_back_and_removes_the_folder(source: Path, tmp_path: Path, nth):
    before = picture(source)
    out = tmp_path / "overlay"
    with fileio.injected_faults(fileio.FaultPlan(nth=nth, error=errno.ENOSPC)):
        with pytest.raises(PtoPatchError, match="rolled back|cannot create --overlay"):
            engine.apply_patch(model_path=source, overlay=out)
    assert not out.exists()
    assert picture(source) == before


@pytest.mark.parametrize("nth", [3, 12])
def test_an_interrupted_overlay_apply_is_finished_by_the_next(source: Path, tmp_path: Path, nth):
    before = picture(source)
    out = tmp_path / "overlay"
    with fileio.injected_faults(fileio.FaultPlan(nth=nth, error=errno.EIO, persistent=True)):
        with pytest.raises(PtoPatchError, match="rolling it back failed too"):
            engine.apply_patch(model_path=source, overlay=out)
    result = engine.apply_patch(model_path=source, overlay=out)
    assert result.rolled_back_interrupted and engine.model_status(model_path=out).patched
    assert engine.restore_model(model_path=out).removed_folder and not out.exists()
    assert picture(source) == before


# --- a read-only folder ---------------------------------------------------------------------------


def test_plain_apply_on_a_read_only_folder_names_overlay(source: Path, capsys):
    before = picture(source)
    assert run_cli("apply", "--model-path", str(source), "--json") == 1
    error = json.loads(capsys.readouterr().out)
    assert "read-only" in error["error"] and "--overlay" in error["hint"]
    assert picture(source) == before


def test_status_reports_a_source_changed_under_the_overlay(pristine: Path, tmp_path: Path):
    source = tmp_path / "model"
    shutil.copytree(pristine, source)
    out = tmp_path / "overlay"
    engine.apply_patch(model_path=source, overlay=out)
    (source / "tokenizer.json").write_bytes((source / "tokenizer.json").read_bytes() + b" ")
    (source / "extra.txt").write_text("new file")
    (out / "generation_config.json").unlink()
    changed = engine.model_status(model_path=out).overlay["source_changed"]
    assert changed == [
        "tokenizer.json",
        "extra.txt (new in the source)",
        "generation_config.json (the overlay's link was changed)",
    ]
    source.rename(tmp_path / "moved")
    assert engine.model_status(model_path=out).overlay["source_changed"] == [
        f"{source} (the source folder is gone)"
    ]
    assert engine.restore_model(model_path=out).removed_folder and not out.exists()


# Any write-type file operation on the source makes the process exit 97; the same hook on a plain
# apply shows that it does catch writes.
AUDIT_GUARD = textwrap.dedent(
    """
    import json, os, sys
    guarded = [os.path.realpath(p) for p in sys.argv[1].split(os.pathsep)]
    commands = json.loads(sys.argv[2])
    WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
    PATH_EVENTS = {"os.remove", "os.rmdir", "os.mkdir", "os.chmod", "os.chown", "os.utime", "os.truncate",
                   "os.symlink", "os.link", "os.rename", "shutil.rmtree", "shutil.copyfile", "shutil.move"}

    ENTRY_EVENTS = {"os.remove", "os.rmdir", "os.mkdir", "os.symlink", "os.rename", "shutil.rmtree", "shutil.move"}

    def under(path, follow=True):
        if not isinstance(path, (str, bytes, os.PathLike)):
            return False
        path = os.fsdecode(path)
        # removing or renaming a link acts on the link itself, not on where it leads
        real = os.path.realpath(path) if follow else os.path.join(
            os.path.realpath(os.path.dirname(path) or "."), os.path.basename(path)
        )
        return any(real == g or real.startswith(g + os.sep) for g in guarded)

    def hook(event, args):
        if event == "open" and args and isinstance(args[0], (str, bytes, os.PathLike)):
            mode, flags = args[1], args[2]
            writes = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (flags or 0) & WRITE_FLAGS
            if writes and under(args[0]):
                os.write(2, f"WRITE TO SOURCE: open {args[0]} {mode} {flags}\\n".encode()); os._exit(97)
        elif event == "os.symlink" and under(args[1], False):  # the link's target is only named, not written
            os.write(2, f"WRITE TO SOURCE: {event} {args[:2]}\\n".encode()); os._exit(97)
        elif event in PATH_EVENTS - {"os.symlink"} and any(under(a, event not in ENTRY_EVENTS) for a in args[:2]):
            os.write(2, f"WRITE TO SOURCE: {event} {args[:2]}\\n".encode()); os._exit(97)

    sys.addaudithook(hook)
    from pto_patch.cli.app import main
    for command in commands:
        try:
            main(command)
        except SystemExit as done:
            if done.code:
                sys.exit(done.code)
    """
)


def run_guarded(guarded: list[Path], *commands: list[str], home: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HOME": str(home / "hf"), "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)}
    argv = [os.pathsep.join(map(str, guarded)), json.dumps(list(commands))]
    return subprocess.run(
        [sys.executable, "-c", AUDIT_GUARD, *argv], capture_output=True, text=True, env=env, timeout=300
    )


def test_no_write_operation_reaches_the_source(hf_cache: Path, pristine: Path, tmp_path: Path):
    cache_repo = hf_cache.parent.parent
    before = picture(cache_repo)
    out = tmp_path / "overlay"
    done = run_guarded(
        [cache_repo],
        ["apply", "--model-path", str(hf_cache), "--overlay", str(out)],
        ["status", "--model-path", str(out)],
        ["restore", "--model-path", str(out)],
        home=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert not out.exists() and picture(cache_repo) == before

    writable = tmp_path / "writable"
    shutil.copytree(pristine, writable)
    done = run_guarded([writable], ["apply", "--model-path", str(writable)], home=tmp_path)
    assert done.returncode == 97 and "WRITE TO SOURCE" in done.stderr  # the guard does see writes


# --- end to end: verify (and bench) on an overlay of the HF-cache layout ------------------------------


@pytest.mark.slow
def test_verify_and_bench_run_on_an_overlay_of_the_hf_cache(hf_cache: Path, tmp_path: Path, capsys):
    cache_repo = hf_cache.parent.parent
    before = picture(cache_repo)
    out = tmp_path / "overlay"
    assert run_cli("apply", "--model-path", str(hf_cache), "--overlay", str(out)) == 0
    verify = ["verify", "--model-path", str(out), "--use_pto", "--image", str(page_image(tmp_path)), "--json"]
    done = run_in_fresh_process([*verify, "--dtype", "fp32", *QUICK], tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert report["passed"] and report["load_info"]["missing_keys"] == []
    assert all(report["pto"]["ops"][op]["calls"] > 0 for op in report["switched_on"])
    bench = ["bench", "--model-path", str(out), "--batches", "1", "--warmup", "0", "--iters", "1"]
    done = run_in_fresh_process(
        [*bench, "--output_length", "2", "--output-dir", str(tmp_path / "b"), "--json"], tmp_path
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert picture(cache_repo) == before

    # A new download changes the snapshot's config.json link to a new blob.
    config = json.loads((hf_cache / "config.json").read_text())
    config["rms_norm_eps"] = 1e-5
    new_blob = cache_repo / "blobs" / "new-config"
    make_writable(cache_repo)
    new_blob.write_text(json.dumps(config))
    (hf_cache / "config.json").unlink()
    (hf_cache / "config.json").symlink_to("../../blobs/new-config")
    make_read_only(cache_repo)
    downloaded = picture(cache_repo)
    capsys.readouterr()
    assert run_cli("status", "--model-path", str(out), "--json") == 0
    assert json.loads(capsys.readouterr().out)["overlay"]["source_changed"] == ["config.json"]
    done = run_in_fresh_process([*verify, *QUICK], tmp_path)
    assert done.returncode == 1 and "changed since apply" in json.loads(done.stdout)["error"]
    done = run_in_fresh_process([*verify, "--dtype", "fp32", *QUICK, "--allow-modified"], tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert any("source folder changed" in warning for warning in json.loads(done.stdout)["warnings"])

    assert run_cli("restore", "--model-path", str(out)) == 0
    assert not out.exists() and picture(cache_repo) == downloaded


# --- a read-only mount, another user --------------------------------------------------------------


def world_readable_dir() -> Path:
    root = Path(tempfile.mkdtemp(prefix="pto-overlay-"))
    root.chmod(0o755)
    return root


MOUNT_SCRIPT = """
set -e
mount --bind "$SRC" "$MNT"
mount -o remount,bind,ro "$MNT"
if touch "$MNT/probe" 2>/dev/null; then echo "mount is writable" >&2; exit 90; fi
set +e
"$PY" -m pto_patch apply --model-path "$MNT" --json > "$LOGS/plain.json"; echo $? > "$LOGS/plain.rc"
set -e
"$PY" -m pto_patch apply --model-path "$MNT" --overlay "$OUT" --json > "$LOGS/apply.json"
"$PY" -m pto_patch status --model-path "$OUT" --json > "$LOGS/status.json"
"$PY" -m pto_patch restore --model-path "$OUT" --json > "$LOGS/restore.json"
"""


def test_overlay_of_a_read_only_mount(pristine: Path):
    if shutil.which("unshare") is None or shutil.which("mount") is None:
        pytest.skip("unshare or mount is not installed")
    root = world_readable_dir()
    try:
        src, mnt, out, logs = root / "src", root / "mnt", root / "overlay", root / "logs"
        shutil.copytree(pristine, src)
        mnt.mkdir()
        logs.mkdir()
        before = picture(src)
        env = {**os.environ, "SRC": str(src), "MNT": str(mnt), "OUT": str(out), "LOGS": str(logs)}
        env.update(PY=sys.executable, HF_HOME=str(root / "hf"), PYTHONPATH=str(REPO))
        done = subprocess.run(
            ["unshare", "-m", "sh", "-c", MOUNT_SCRIPT], capture_output=True, text=True, env=env, timeout=300
        )
        if done.returncode != 0 and not (logs / "plain.rc").exists():
            pytest.skip(f"no read-only bind mount here: {done.stderr.strip()[-200:]}")
        assert done.returncode == 0, done.stderr[-2000:]
        plain = json.loads((logs / "plain.json").read_text())
        assert (logs / "plain.rc").read_text().strip() == "1" and "--overlay" in plain["hint"]
        applied = json.loads((logs / "apply.json").read_text())
        assert applied["overlay_of"] == str(mnt) and applied["dry_run"] is False
        assert json.loads((logs / "status.json").read_text())["overlay"]["source_changed"] == []
        assert json.loads((logs / "restore.json").read_text())["removed_folder"] is True
        assert not out.exists() and picture(src) == before
    finally:
        shutil.rmtree(root)


def test_overlay_as_another_user_on_a_folder_without_write_bits(pristine: Path):
    if os.geteuid() != 0:
        pytest.skip("needs root to run a command as another user")
    nobody = 65534
    root = world_readable_dir()
    try:
        src, work = root / "src", root / "work"
        shutil.copytree(pristine, src)
        make_read_only(src)
        work.mkdir()
        os.chown(work, nobody, nobody)
        before = picture(src)
        env = {**os.environ, "HF_HOME": str(work / "hf"), "PYTHONPATH": str(REPO), "HOME": str(work)}

        def as_nobody(*args: str) -> subprocess.CompletedProcess:
            return subprocess.run(
                [sys.executable, "-m", "pto_patch", *args, "--json"],
                capture_output=True,
                text=True,
                env=env,
                cwd=work,
                timeout=300,
                user=nobody,
                group=nobody,
                extra_groups=[],
            )

        try:
            probe = subprocess.run(
                [sys.executable, "-c", "import pto_patch"],
                user=nobody,
                group=nobody,
                extra_groups=[],
                capture_output=True,
                env=env,
                cwd=work,
                timeout=60,
            )
        except PermissionError as exc:
            pytest.skip(f"user nobody cannot run this Python: {exc}")
        if probe.returncode != 0:
            pytest.skip(f"user nobody cannot import pto_patch here: {probe.stderr.decode()[-200:]}")
        plain = as_nobody("apply", "--model-path", str(src))
        assert plain.returncode == 1 and "--overlay" in json.loads(plain.stdout)["hint"], plain.stderr
        applied = as_nobody("apply", "--model-path", str(src), "--overlay", str(work / "overlay"))
        assert applied.returncode == 0, applied.stdout + applied.stderr
        assert as_nobody("status", "--model-path", str(work / "overlay")).returncode == 0
        assert as_nobody("restore", "--model-path", str(work / "overlay")).returncode == 0
        assert not (work / "overlay").exists() and picture(src) == before
    finally:
        make_writable(root)
        shutil.rmtree(root)
