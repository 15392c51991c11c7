"""Files the user names (--report-file, --save-outputs, --plot): refused before anything loads when the run
could not or must not write them, and written in one rename (run/user_files.py)."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from pto_patch.errors import EXIT_USAGE, PtoPatchError
from pto_patch.run.user_files import check_target, write_user_file
from tests.spec_pipeline import run_in_process


def _refused(path: Path, flag: str = "--save-outputs", inputs=None) -> str:
    with pytest.raises(PtoPatchError) as raised:
        check_target(path, flag, inputs)
    assert raised.value.exit_code == EXIT_USAGE and "\n" not in raised.value.message
    return raised.value.message


def test_a_node_that_is_not_a_regular_file_is_refused(tmp_path: Path):
    assert (
        _refused(Path("/dev/null")) == "--save-outputs /dev/null is a device, not a file pto-patch may write"
    )
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert "is a FIFO" in _refused(fifo, "--report-file")
    assert "is a folder" in _refused(tmp_path, "--plot")
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(str(tmp_path / "sock"))
        assert "is a socket" in _refused(tmp_path / "sock")
    link = tmp_path / "link"
    link.symlink_to("/dev/null")
    assert "is a device" in _refused(link)  # judged by what it points at
    check_target(tmp_path / "new" / "answers.json", "--save-outputs")  # a new file in a new folder: fine
    (tmp_path / "old.json").write_text("{}")
    check_target(tmp_path / "old.json", "--save-outputs")  # a regular file is replaced whole


def test_an_input_is_never_a_target(tmp_path: Path):
    trusted = tmp_path / "answers.json"
    trusted.write_text("{}")
    message = _refused(tmp_path / "." / "answers.json", inputs={"--against-outputs": trusted})
    assert message.endswith("is also --against-outputs: the run would replace what it reads")


def test_a_place_in_the_hub_cache_or_an_unwritable_one_is_refused(tmp_path: Path, monkeypatch):
    hub = tmp_path / "hub"
    snapshot = hub / "models--rootsautomation--GutenOCR-3B" / "snapshots" / "abc"
    snapshot.mkdir(parents=True)
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    assert "is inside the Hugging Face cache" in _refused(snapshot / "answers.json")
    (tmp_path / "a-file").write_text("")
    assert "cannot write in" in _refused(tmp_path / "a-file" / "answers.json")


def test_the_write_is_one_rename_and_never_goes_through_a_node(tmp_path: Path, monkeypatch):
    target = tmp_path / "report.json"
    target.write_text("old")
    from pto_patch.patching import fileio

    def failing(path, data, mode=None):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(fileio, "atomic_write_bytes", failing)
    monkeypatch.setenv("PTO_PATCH_CACHE", str(tmp_path / "cache"))
    assert write_user_file(target, b"new", "--report-file") is False  # kept (tests/test_kept_results.py)
    assert target.read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == [
        "cache",
        "report.json",
    ]
    monkeypatch.undo()
    assert write_user_file(target, b"new", "--report-file") is True
    assert target.read_text() == "new"
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(PtoPatchError, match="became a FIFO during the run"):
        write_user_file(fifo, b"x", "--report-file")


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        (["--report-file", "/dev/null"], "--report-file /dev/null is a device"),
        (["--ocr", "--save-outputs", "{a}", "--against-outputs", "{a}"], "is also --against-outputs"),
        (["--ocr", "--save-outputs", "{a}", "--report-file", "{a}"], "name the same file"),
    ],
)
def test_verify_refuses_before_the_folder_is_read(extra, said, tmp_path: Path, capsys):
    answers = tmp_path / "answers.json"
    answers.write_text("{}")
    args = [a.replace("{a}", str(answers)) for a in extra]
    code = run_in_process("verify", "--model-path", str(tmp_path / "no-such-folder"), *args)
    err = capsys.readouterr().err
    assert code == EXIT_USAGE and said in err and "does not exist" not in err, err
    assert answers.read_text() == "{}"


# --- report folders (bench --output-dir, the default place under $PTO_PATCH_CACHE) -------------------


def _loads_nothing(monkeypatch) -> None:
    from pto_patch.run import loading

    def load_model(*args, **kwargs):
        raise AssertionError("the model was loaded before the report place was checked")

    monkeypatch.setattr(loading, "load_model", load_model)


def _unwritable(monkeypatch, folder: Path) -> None:
    """The OS refuses new files in `folder` (a read-only mount: root's mode bits say nothing of it)."""
    import tempfile

    made = tempfile.mkstemp

    def mkstemp(*args, **kwargs):
        if Path(kwargs.get("dir") or "") == folder:
            raise OSError(30, "Read-only file system")
        return made(*args, **kwargs)

    monkeypatch.setattr(tempfile, "mkstemp", mkstemp)


@pytest.mark.parametrize("command", [["bench"], ["bench", "--ocr"]])
@pytest.mark.parametrize(
    ("case", "said"),
    [
        ("a file", "is a file, not a folder"),
        ("under a file", "lies under the file"),
        ("read-only", "cannot write in"),
        ("another run's reports", "of another run"),
        ("cache under a file", "the reports folder"),
    ],
)
def test_bench_refuses_a_report_place_before_anything_loads(
    command, case, said, patched_tiny: Path, tmp_path: Path, monkeypatch, capsys
):
    _loads_nothing(monkeypatch)
    out = tmp_path / "out"
    args = ["--output-dir", str(out)]
    if case == "a file":
        out.write_text("")
    elif case == "under a file":
        (tmp_path / "f").write_text("")
        args = ["--output-dir", str(tmp_path / "f" / "out")]
    elif case == "read-only":
        out.mkdir()
        _unwritable(monkeypatch, out)
    elif case == "another run's reports":
        out.mkdir()
        taken = "bench_ocr_pages.json" if "--ocr" in command else "bench_pypto.json"
        (out / taken).write_text("{}")
    else:
        (tmp_path / "f").write_text("")
        monkeypatch.setenv("PTO_PATCH_CACHE", str(tmp_path / "f" / "cache"))
        args = []
    code = run_in_process(*command, "--model-path", str(patched_tiny), *args)
    err = capsys.readouterr().err
    assert code == EXIT_USAGE and said in err and "Traceback" not in err, err
    assert "--report-file" not in err  # bench has no such option


def test_two_runs_into_one_folder_never_replace_each_other(tmp_path: Path):
    from pto_patch.run.user_files import write_new_user_file

    first = write_new_user_file(tmp_path / "bench_pypto.json", b"first", "--output-dir")
    second = write_new_user_file(tmp_path / "bench_pypto.json", b"second", "--output-dir")
    assert first.read_bytes() == b"first" and second == tmp_path / "bench_pypto-2.json"
    assert second.read_bytes() == b"second"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bench_pypto-2.json", "bench_pypto.json"]
