"""Generated bad inputs: every file the tool reads x every way a user (or a faulty disk) can spoil it.

Each file is reached through the command that reads it (verify reads the whole model folder through
`plan_run` before anything loads; status and restore read the manifest; apply a spec given by path;
verify --ocr the truth files and the saved answers), and spoiled five ways:

- deep: JSON nested 100,000 levels (the parser's RecursionError must never escape);
- huge: a sparse file past the reader's limit (nothing may read it whole);
- truncated: the file's first half (a safetensors shard: 0 bytes);
- wrong types: well-formed JSON of the wrong shape (a list for an object; a config size that is a string,
  a header that claims 2^62 bytes);
- special: a FIFO in its place (a read would block forever), and a link to a character device.

Every case must end in exactly one `error:` line and one `hint:` line, the documented exit code, no
traceback, and the folder byte for byte as it was (hashed before and after, special files by their
mode). The counts are printed at the end of the run.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
from collections.abc import Callable
from pathlib import Path

import pytest

from pto_patch.errors import EXIT_ERROR, EXIT_USAGE
from pto_patch.model import input_files
from tests.robustness_counts import COUNTS
from tests.test_engine import run_cli

DEEP = ("[" * 100_000 + "]" * 100_000).encode()


def tree_digest(root: Path) -> dict[str, str]:
    """Every entry under `root`: a regular file by its bytes, a link by its target, anything else by its
    mode (a FIFO is never opened)."""
    found = {}
    for path in sorted(root.rglob("*")):
        info = path.lstat()
        key = path.relative_to(root).as_posix()
        if stat.S_ISLNK(info.st_mode):
            found[key] = "link " + os.readlink(path)
        elif stat.S_ISREG(info.st_mode):
            found[key] = f"{oct(info.st_mode)} " + hashlib.sha256(path.read_bytes()).hexdigest()
        else:
            found[key] = oct(info.st_mode)
    return found


# --- how each file is spoiled ---------------------------------------------------------------------


def _deep(path: Path) -> None:
    path.write_bytes(DEEP)


def _huge(path: Path) -> None:
    path.unlink(missing_ok=True)
    with open(path, "wb") as handle:
        handle.truncate(input_files.MAX_JSON_BYTES + 1)  # sparse: no disk taken


def _truncated(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _wrong_type(path: Path) -> None:
    path.write_text(json.dumps([1, 2, 3]))


def _fifo(path: Path) -> None:
    path.unlink(missing_ok=True)
    os.mkfifo(path)


def _device_link(path: Path) -> None:
    path.unlink(missing_ok=True)
    path.symlink_to("/dev/zero")


JSON_FAULTS: dict[str, Callable[[Path], None]] = {
    "deep": _deep,
    "huge": _huge,
    "truncated": _truncated,
    "wrong types": _wrong_type,
    "fifo": _fifo,
    "device link": _device_link,
}


def _claims_2_62(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes((1 << 62).to_bytes(8, "little") + data[8:])


def _zero_bytes(path: Path) -> None:
    path.write_bytes(b"")


def _header_deep(path: Path) -> None:
    header = b'{"a": ' + DEEP + b"}"
    path.write_bytes(len(header).to_bytes(8, "little") + header)


def _header_list(path: Path) -> None:
    header = b"[1, 2]"
    path.write_bytes(len(header).to_bytes(8, "little") + header)


def _header_short_file(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 16])  # the header describes bytes no longer there


SAFETENSORS_FAULTS: dict[str, Callable[[Path], None]] = {
    "deep": _header_deep,
    "huge": _claims_2_62,
    "truncated": _zero_bytes,
    "truncated tensors": _header_short_file,
    "wrong types": _header_list,
    "fifo": _fifo,
    "device link": _device_link,
}


def _config_size_string(path: Path) -> None:
    data = json.loads(path.read_text())
    data.setdefault("text_config", {})["num_hidden_layers"] = "36"
    data["num_hidden_layers"] = "36"
    path.write_text(json.dumps(data))


def _config_layers_1e6(path: Path) -> None:
    data = json.loads(path.read_text())
    data.setdefault("text_config", {})["num_hidden_layers"] = 1_000_000
    data["num_hidden_layers"] = 1_000_000
    path.write_text(json.dumps(data))


def _tokenizer_no_model(path: Path) -> None:
    path.write_text(json.dumps({"version": "1.0", "model": "garbage"}))


def _garbage(path: Path) -> None:
    path.write_bytes(os.urandom(4096))


# The model folder's files verify reads, each with its faults (beyond JSON_FAULTS where named).
FOLDER_FILES: dict[str, dict[str, Callable[[Path], None]]] = {
    "config.json": {
        **JSON_FAULTS,
        "size a string": _config_size_string,
        "1e6 layers": _config_layers_1e6,
    },
    "tokenizer.json": {**JSON_FAULTS, "garbage": _garbage, "no model": _tokenizer_no_model},
    "tokenizer_config.json": JSON_FAULTS,
    "generation_config.json": JSON_FAULTS,
    "preprocessor_config.json": JSON_FAULTS,
    "chat_template.json": JSON_FAULTS,
    "model.safetensors.index.json": JSON_FAULTS,
    "model-00001-of-00002.safetensors": SAFETENSORS_FAULTS,
}

CASES = [
    (name, fault) for name, faults in FOLDER_FILES.items() for fault in faults
]  # the folder's files, read by verify before the load


@pytest.fixture(scope="module")
def tiny_template(tmp_path_factory) -> Path:
    from pto_patch.tiny.model import make_tiny

    folder = tmp_path_factory.mktemp("template") / "model"
    make_tiny(folder)
    return folder


@pytest.fixture(scope="module")
def patched_template(tiny_template: Path, tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("patched") / "model"
    shutil.copytree(tiny_template, folder, symlinks=True)
    assert run_cli("apply", "--model-path", str(folder)) == 0
    return folder


def _copy(template: Path, tmp_path: Path) -> Path:
    folder = tmp_path / "model"
    shutil.copytree(template, folder, symlinks=True)
    return folder


def assert_one_clear_line(code: int, err: str, expected: int, case: str) -> None:
    lines = err.strip().splitlines()
    assert "Traceback" not in err and "unexpected error" not in err, (case, err)
    assert len(lines) == 2 and lines[0].startswith("error: ") and lines[1].startswith("hint: "), (case, err)
    assert code == expected, (case, code, err)
    COUNTS["generated_clear"] += 1


def _refuse_loading(monkeypatch) -> None:
    """A case must be refused before the model loads: loading it fails the test."""
    from pto_patch.run import loading

    def no_load(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(loading, "load_model", no_load)


def _run_case(case: str, root: Path, argv: list[str], expected: int, capsys) -> None:
    COUNTS["generated_cases"] += 1
    capsys.readouterr()
    before = tree_digest(root)
    code = run_cli(*argv)
    err = capsys.readouterr().err
    assert tree_digest(root) == before, case
    assert_one_clear_line(code, err, expected, case)


@pytest.mark.parametrize(("name", "fault"), CASES, ids=[f"{n}-{f}" for n, f in CASES])
def test_a_spoiled_model_file_is_refused_before_the_load(
    tiny_template: Path, tmp_path: Path, capsys, monkeypatch, name: str, fault: str
):
    _refuse_loading(monkeypatch)
    folder = _copy(tiny_template, tmp_path)
    FOLDER_FILES[name][fault](folder / name)
    _run_case(f"{name} {fault}", tmp_path, ["verify", "--model-path", str(folder)], EXIT_USAGE, capsys)


MANIFEST = ".pto_patch/manifest.json"
MANIFEST_CASES = [(command, fault) for command in ("status", "restore", "apply") for fault in JSON_FAULTS]


@pytest.mark.parametrize(("command", "fault"), MANIFEST_CASES, ids=[f"{c}-{f}" for c, f in MANIFEST_CASES])
def test_a_spoiled_manifest_is_one_line_for_every_folder_command(
    patched_template: Path, tmp_path: Path, capsys, command: str, fault: str
):
    """The manifest is pto-patch's own state: a damaged one is an error (exit 1), documented as such."""
    folder = _copy(patched_template, tmp_path)
    JSON_FAULTS[fault](folder / MANIFEST)
    _run_case(
        f"manifest {fault} ({command})", tmp_path, [command, "--model-path", str(folder)], EXIT_ERROR, capsys
    )


def _spec_wrong_field_types(path: Path) -> None:
    from pto_patch.model.spec import spec_path

    data = json.loads(spec_path("gutenocr_3b").read_text())
    for key, value in list(data.items()):
        if isinstance(value, str):
            data[key] = 7
        elif isinstance(value, list | dict):
            data[key] = "x"
    path.write_text(json.dumps(data))


def _valid_spec(path: Path) -> None:
    from pto_patch.model.spec import spec_path

    shutil.copyfile(spec_path("gutenocr_3b"), path)


SPEC_FAULTS = {**JSON_FAULTS, "field types": _spec_wrong_field_types}


@pytest.mark.parametrize("fault", list(SPEC_FAULTS))
def test_a_spoiled_spec_file_is_one_line_before_anything_is_written(
    tiny_template: Path, tmp_path: Path, capsys, fault: str
):
    folder = _copy(tiny_template, tmp_path)
    spec = tmp_path / "spec.json"
    _valid_spec(spec)
    SPEC_FAULTS[fault](spec)
    argv = ["apply", "--model-path", str(folder), "--model", str(spec)]
    _run_case(f"spec {fault}", tmp_path, argv, EXIT_USAGE, capsys)


def _answers_fault_cases():
    return list(JSON_FAULTS)


@pytest.mark.parametrize("fault", _answers_fault_cases())
def test_spoiled_saved_answers_are_one_line_before_the_load(
    tiny_template: Path, tmp_path: Path, capsys, monkeypatch, fault: str
):
    _refuse_loading(monkeypatch)
    folder = _copy(tiny_template, tmp_path)
    answers = tmp_path / "answers.json"
    answers.write_text(json.dumps({"kind": "pto-patch-ocr-answers", "format_version": 3, "pages": {}}))
    JSON_FAULTS[fault](answers)
    argv = ["verify", "--model-path", str(folder), "--ocr", "--against-outputs", str(answers)]
    _run_case(f"answers {fault}", tmp_path, argv, EXIT_USAGE, capsys)


@pytest.mark.parametrize("fault", list(JSON_FAULTS))
def test_a_spoiled_truth_file_is_one_line_before_the_load(
    tiny_template: Path, tmp_path: Path, capsys, monkeypatch, fault: str
):
    from pto_patch.run.ocr.pages import bundled_pages, write_pages

    _refuse_loading(monkeypatch)
    folder = _copy(tiny_template, tmp_path)
    pages = tmp_path / "pages"
    pages.mkdir()
    write_pages(bundled_pages()[:1], pages)
    truth = next(pages.glob("*.lines.json"))
    JSON_FAULTS[fault](truth)
    argv = ["verify", "--model-path", str(folder), "--ocr", "--pages", str(pages)]
    _run_case(f"truth {fault}", tmp_path, argv, EXIT_USAGE, capsys)


def test_the_overlay_source_holding_a_fifo_or_a_device_link_is_refused_without_blocking(
    tiny_template: Path, tmp_path: Path, capsys
):
    for kind, spoil in (("fifo", _fifo), ("device link", _device_link)):
        root = tmp_path / kind.replace(" ", "-")
        root.mkdir()
        folder = _copy(tiny_template, root)
        spoil(folder / "extra.bin")
        argv = ["apply", "--model-path", str(folder), "--overlay", str(root / "out")]
        _run_case(f"overlay source {kind}", root, argv, EXIT_USAGE, capsys)
        assert not (root / "out").exists()
