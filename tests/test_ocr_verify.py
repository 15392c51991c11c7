"""`verify --ocr` and `bench --ocr` end to end on the tiny model (random weights: mechanics only).

Every (page, task) of both runs is judged at every step against the unpatched model read eagerly
(the reference). A random-weight model reads nothing, so a sabotaged kernel cannot be shown to read
worse against the bundled truth; for the CER rules the tests make a truth it can read: a page whose
NAME.txt is what the reference answered for it in an earlier run (saved with --save-outputs). Against
that truth the reference scores 0, an honest run 0 too, and a kernel that computes something else
reads worse.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from pto_patch.cli import app as cli
from pto_patch.errors import EXIT_USAGE
from pto_patch.run.ocr.pages import bundled_pages, write_pages
from tests.helpers.changes import WRONG_RMS_NORM, decode_fault_copy
from tests.helpers.cli import json_out, run_process
from tests.helpers.doc_commands import command_lines, rejected

FAST = ["--warmup", "0", "--iters", "1", "--output_length", "8", "--dtype", "fp32"]
DOC = Path(__file__).resolve().parents[1] / "docs" / "ocr-pages.md"


@pytest.fixture(scope="module")
def saved_run(patched_tiny: Path, tmp_path_factory) -> tuple[dict, Path]:
    """verify --use_pto --ocr on the bundled pages, its answers saved."""
    tmp = tmp_path_factory.mktemp("ocr-saved")
    answers = tmp / "answers.json"
    done = run_process(
        [
            "verify",
            "--model-path",
            str(patched_tiny),
            "--use_pto",
            "--ocr",
            "--json",
            "--save-outputs",
            str(answers),
        ]
        + FAST,
        tmp,
    )
    assert done.returncode == 0, done.stderr[-3000:] + done.stdout[-3000:]
    return json_out(done), answers


def one_page_with_the_reference_as_truth(answers: Path, folder: Path, page_name: str = "form") -> Path:
    saved = json.loads(answers.read_text())
    read = {(a["page"], a["task"], a["mode"]): a["answer"] for a in saved["answers"]}
    page = next(p for p in bundled_pages() if p.name == page_name)
    page.text = read[(page_name, "TEXT", "reference")].strip()
    assert page.text, "the tiny model's reference answered nothing for the page"
    page.text2d, page.lines = page.text, []
    write_pages([page], folder)
    return folder


def test_verify_ocr_scores_every_page_task_and_mode(saved_run):
    doc, answers = saved_run
    assert doc["command"] == "verify" and doc["ocr"] is True and doc["passed"] is True
    assert [page["name"] for page in doc["pages"]] == ["prose", "two_columns", "form"]
    cells = {(r["page"], r["task"], r["mode"]): r for r in doc["readings"]}
    assert len(cells) == len(doc["readings"]) == 3 * 3 * 3  # pages x tasks x (reference, baseline, pto)
    for reading in doc["readings"]:
        assert 0 <= reading["cer"] and 0 <= reading["wer"] and reading["new_tokens"] <= 8
        if reading["task"] == "LINES":
            assert reading["parsed"] in (True, False) and reading["box_f1"] is not None
    assert doc["random_weights"] is True and "mean nothing" in doc["notes"][0]
    assert all(doc["ops"][op]["calls"] > 0 for op in doc["switched_on"])
    assert set(doc["summary"]) == {"reference", "baseline", "pto"} and len(doc["comparisons"]) == 18
    assert all(c["agreement_cer"] == 0 and c["cer_rise"] == 0 for c in doc["comparisons"])  # fp32: identical
    assert doc["mode"] == "eager" and "every (page, task) (9)" in doc["rule"]
    assert doc["reference"]["generations"] + doc["reference"]["kept"] == 9  # kept: from the reference cache
    for reading in doc["readings"]:  # every step of each judged reading, none of the reference's
        judged = reading["judged"]
        if reading["mode"] == "reference":
            assert judged is None
        else:
            assert judged["passed"] and judged["steps_judged"] == reading["new_tokens"] >= 1
    saved = json.loads(answers.read_text())
    assert len(saved["answers"]) == 27 and saved["output_length"] == 8 and saved["device"] == "cpu"


def test_a_kernel_that_reads_worse_fails_with_exit_3(saved_run, patched_tiny: Path, tmp_path: Path):
    pages = one_page_with_the_reference_as_truth(saved_run[1], tmp_path / "pages")
    args = ["--use_pto", "--ocr", "--json", "--pages", str(pages), "--ops", "rms_norm"] + FAST
    honest = run_process(["verify", "--model-path", str(patched_tiny), *args], tmp_path)
    assert honest.returncode == 0, honest.stderr[-3000:] + honest.stdout[-3000:]
    text = {r["mode"]: r["cer"] for r in json_out(honest)["readings"] if r["task"] == "TEXT"}
    assert text == {"reference": 0.0, "baseline": 0.0, "pto": 0.0}

    sabotaged = tmp_path / "sabotaged"
    shutil.copytree(patched_tiny, sabotaged, symlinks=True)
    with open(sabotaged / "pto_kernels" / "__init__.py", "a", encoding="utf-8") as handle:
        handle.write(WRONG_RMS_NORM)
    done = run_process(["verify", "--model-path", str(sabotaged), "--allow-modified", *args], tmp_path)
    assert done.returncode == 3, done.stderr[-3000:] + done.stdout[-3000:]
    doc = json_out(done)
    assert doc["passed"] is False
    assert any("pto against reference: page form, TEXT reads worse" in failure for failure in doc["failures"])
    assert any(
        failure.startswith("page form, TEXT: pto (eager): logits differ from the unpatched eager model's")
        and "the kernels switched on (rms_norm)" in failure
        for failure in doc["failures"]
    )
    text = {r["mode"]: r["cer"] for r in doc["readings"] if r["task"] == "TEXT"}
    assert text["reference"] == text["baseline"] == 0.0 and text["pto"] > 0.05


@pytest.mark.usefixtures("kernel_package_restored")  # verify --ocr runs in process
def test_a_decode_only_kernel_fault_fails_every_page_naming_the_step(patched_tiny: Path, tmp_path: Path):
    """The fault a CER-only verify --ocr passed (exit 0, agreement CER 1.3): right at the prefill, wrong at
    every decode step. Each (page, task) is judged against the eager reference, so it fails naming them."""
    from pto_patch.run.ocr.options import OcrOptions
    from pto_patch.run.ocr.verify import run_ocr_verify
    from pto_patch.run.verify import VerifyOptions

    pages = tmp_path / "pages"
    write_pages([p for p in bundled_pages() if p.name == "prose"], pages)
    options = dict(output_length=8, dtype="fp32", kernel_backend="torch", ops="rms_norm", use_pto=True)
    ocr = OcrOptions(ocr=True, pages=pages)
    honest = run_ocr_verify(VerifyOptions(model_path=patched_tiny, **options), ocr)
    assert honest.passed, honest.failures
    folder = decode_fault_copy(patched_tiny, tmp_path / "fault")
    report = run_ocr_verify(VerifyOptions(model_path=folder, allow_modified=True, **options), ocr)
    assert not report.passed
    judged = [r for r in report.readings if r.mode == "pto"]
    assert judged and all(r.judged.first_failing_step >= 1 for r in judged)  # prefill right, decode wrong
    assert all(r.judged.passed for r in report.readings if r.mode == "baseline")
    lines = [f for f in report.failures if f.startswith("page prose, ") and "pto (eager)" in f]
    assert len(lines) == 3 and all("decode step" in line and "rms_norm" in line for line in lines)


def test_saved_answers_round_trip(saved_run, patched_tiny: Path, tmp_path: Path):
    doc, answers = saved_run
    base = ["verify", "--model-path", str(patched_tiny), "--ocr", "--json", "--baseline-only"] + FAST
    done = run_process([*base, "--against-outputs", str(answers)], tmp_path)
    assert done.returncode == 0, done.stderr[-3000:] + done.stdout[-3000:]
    again = json_out(done)
    trusted = [r for r in again["readings"] if r["mode"] == "trusted baseline"]
    here = {(r["page"], r["task"]): r for r in again["readings"] if r["mode"] == "baseline"}
    assert len(trusted) == 9 and len(here) == 9
    assert all(r["answer"] == here[(r["page"], r["task"])]["answer"] for r in trusted)
    assert [c["agreement_cer"] for c in again["comparisons"]] == [0.0] * 9
    assert again["against_outputs"]["device"] == "cpu" and not again["warnings"]
    assert again["compared"] is True and again["passed"] is True  # compared with the trusted run

    # Answers read from other weights are refused before the model loads, unless two checkpoints are asked.
    elsewhere = json.loads(answers.read_text())
    elsewhere["weights_digest"] = "0" * 64
    (tmp_path / "elsewhere.json").write_text(json.dumps(elsewhere))
    other = [*base, "--against-outputs", str(tmp_path / "elsewhere.json")]
    refused = run_process(other, tmp_path)
    assert refused.returncode == EXIT_USAGE and "read with other weights" in json_out(refused)["error"]
    asked = json_out(run_process([*other, "--other-weights"], tmp_path))
    assert any("two checkpoints" in warning for warning in asked["warnings"])

    # Answers scored against another truth are refused before the model loads.
    pages = tmp_path / "pages"
    write_pages([p for p in bundled_pages() if p.name == "prose"], pages)
    (pages / "prose.txt").write_text("another text\n")
    refused = run_process([*base, "--pages", str(pages), "--against-outputs", str(answers)], tmp_path)
    assert refused.returncode == EXIT_USAGE and "another truth" in json_out(refused)["error"]


def test_a_trusted_device_that_reads_better_fails_this_one(saved_run, patched_tiny: Path, tmp_path: Path):
    answers = saved_run[1]
    pages = tmp_path / "pages"
    write_pages([p for p in bundled_pages() if p.name == "prose"], pages)
    prose = next(p for p in bundled_pages() if p.name == "prose")
    better = json.loads(answers.read_text())
    for answer in better["answers"]:
        if answer["page"] == "prose" and answer["task"] == "TEXT" and answer["mode"] == "reference":
            answer["answer"] = prose.text  # a device that reads the page exactly
    trusted = tmp_path / "trusted.json"
    trusted.write_text(json.dumps(better))
    done = run_process(
        ["verify", "--model-path", str(patched_tiny), "--ocr", "--json", "--pages", str(pages)]
        + ["--against-outputs", str(trusted)]
        + FAST,
        tmp_path,
    )
    assert done.returncode == 3, done.stderr[-3000:] + done.stdout[-3000:]
    doc = json_out(done)
    assert any(
        "baseline against trusted reference: page prose, TEXT reads worse" in f for f in doc["failures"]
    )


def test_bench_ocr_splits_a_page_into_vision_prefill_and_decode(patched_tiny: Path, tmp_path: Path):
    pages = tmp_path / "pages"
    write_pages([p for p in bundled_pages() if p.name == "two_columns"], pages)
    plot = tmp_path / "split.png"
    done = run_process(
        ["bench", "--model-path", str(patched_tiny), "--ocr", "--json", "--pages", str(pages)]
        + ["--batches", "1", "--warmup", "0", "--iters", "1", "--output_length", "6"]
        + ["--plot", str(plot), "--output-dir", str(tmp_path / "out")],
        tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:] + done.stdout[-3000:]
    doc = json_out(done)
    assert doc["command"] == "bench" and doc["ocr"] is True and doc["random_weights"] is True
    assert [(r["page"], r["batch"], r["mode"]) for r in doc["runs"]] == [
        ("two_columns", 1, "baseline"),
        ("two_columns", 1, "pto"),
    ]
    for run in doc["runs"]:
        assert run["image_tokens"] > 0 and run["new_tokens_per_sequence"] == 6
        assert 0 < run["vision_s"] < run["first_token_s"] < run["latency_s"]
        assert run["decode_tokens_per_s"] > 0 and run["pages_per_minute"] > 0
        parts = run["vision_s"] + run["prefill_s"] + run["decode_s"]
        assert abs(parts - run["latency_s"]) < 1e-3
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and doc["plot"] == str(plot)
    assert json.loads((tmp_path / "out" / "bench_ocr_pages.json").read_text())["runs"] == doc["runs"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["verify", "--pages", "nowhere"], "--pages only applies to a run over pages"),
        (["bench", "--plot", "x.png"], "--plot only applies to a run over pages"),
        (["verify", "--ocr", "--image", "x.png"], "--image does not apply"),
        (["verify", "--ocr", "--engine", "vllm"], "transformers engine only"),
        (["verify", "--ocr", "--pages", "nowhere"], "--pages nowhere is not a folder"),
        (["verify", "--ocr", "--against-outputs", "nowhere.json"], "no such file"),
    ],
)
def test_ocr_usage_errors_are_one_line_with_a_hint(argv, message, tmp_path: Path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as stopped:
        cli.main([*argv, "--model-path", str(tmp_path / "no-model"), "--json"])
    assert stopped.value.code == EXIT_USAGE
    error = json.loads(capsys.readouterr().out)
    assert message in error["error"] and error["hint"]


def test_the_ocr_page_quotes_only_commands_that_parse():
    found = command_lines(DOC.read_text(encoding="utf-8"))
    assert {args[0] for args in found} >= {"verify", "bench", "make-tiny"}
    assert any("--ocr" in args and "--against-outputs" in args for args in found)
    for args in found:
        assert rejected(args) is None, f"`pto-patch {' '.join(args)}` is rejected: {rejected(args)}"


def test_ocr_verify_compares_by_default_and_a_baseline_alone_verifies_nothing(
    patched_tiny: Path, tmp_path: Path
):
    """The decision every verify path shares: PTO is compared unless --baseline-only; a baseline alone is
    no PASSED and no verdict; both flags together are a usage error, before anything loads."""
    base = ["verify", "--model-path", str(patched_tiny), "--ocr"] + FAST
    pages = tmp_path / "pages"
    write_pages([p for p in bundled_pages() if p.name == "prose"], pages)
    base += ["--pages", str(pages)]
    done = run_process([*base, "--json"], tmp_path)
    doc = json_out(done)
    assert done.returncode == 0 and doc["compared"] is True and doc["passed"] is True, doc["failures"]
    assert {r["mode"] for r in doc["readings"]} == {"reference", "baseline", "pto"} and doc["comparisons"]
    alone = run_process([*base, "--baseline-only"], tmp_path)
    assert alone.returncode == 0 and "BASELINE ONLY" in alone.stdout and "PASSED" not in alone.stdout
    alone_doc = json_out(run_process([*base, "--baseline-only", "--json"], tmp_path))
    assert alone_doc["passed"] is None and alone_doc["compared"] is False and alone_doc["comparisons"] == []
    both = run_process([*base, "--baseline-only", "--use_pto", "--json"], tmp_path)
    assert both.returncode == EXIT_USAGE and "ask for opposite runs" in json_out(both)["error"]
