"""Every command, end to end, on the stack a CI lane installs (.ci/stack_lane): the reference's own stack
(Python 3.10, torch 2.9.0, transformers 5.8.1) and the top of the declared ranges (Python 3.12, torch 2.14).

The lane names its stack in PTO_PATCH_STACK ("python=3.10 torch=2.9.0 transformers=5.8.1"); the first test
fails when the interpreter runs anything else, so a lane cannot pass on the wrong stack. Without the variable
(the main suite) the module is skipped: the main suite covers the same commands on its own stack.

Each command runs through the CLI in a fresh process, as a user types it: demo; make-tiny, apply,
`verify --use_pto --ops all` and restore (byte for byte); compiled verify under eager, aot_eager and
inductor; graph decode with the counting torchair stand-in at batch 1 and 2 (at most 2 graphs per mode and
batch, tokens equal to eager); `verify --ocr` on the bundled pages; a short tune and bench.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
from pathlib import Path

import pytest

from pto_patch.model.spec import load_spec
from tests.folder_snapshot import snapshot
from tests.torchair_runs import run_with_torchair

STACK = os.environ.get("PTO_PATCH_STACK")
pytestmark = [
    pytest.mark.stack_lane,
    pytest.mark.skipif(not STACK, reason="PTO_PATCH_STACK is not set: run by .ci/stack_lane"),
]
FAST = ["--dtype", "fp32", "--warmup", "1", "--iters", "1", "--json"]
ALL_OPS = tuple(load_spec("gutenocr_3b").injections)  # what `--ops all` switches on in a whole patch


def run(args: list[str], home: Path, torchair: bool = False):
    """The CLI in a fresh process; with `torchair`, the counting stand-in first on the path."""
    return run_with_torchair(args, home, torchair=torchair)


def document(done) -> dict:
    assert done.stdout.strip(), done.stderr[-3000:]
    return json.loads(done.stdout)


def test_the_lane_runs_on_the_stack_it_names():
    import huggingface_hub
    import torch
    import transformers

    have = {
        "python": platform.python_version(),
        "torch": torch.__version__.split("+")[0],
        "transformers": transformers.__version__,
        "huggingface_hub": huggingface_hub.__version__,
    }
    wanted = dict(item.split("=", 1) for item in STACK.split())
    other = {
        name: have[name]
        for name, value in wanted.items()
        if have[name] != value and not have[name].startswith(value + ".")
    }
    assert other == {}, f"the lane names {wanted}, the interpreter runs {have}"


def test_demo_passes(tmp_path: Path):
    done, _ = run(["demo"], tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert done.stdout.rstrip().endswith("PASSED")


@pytest.fixture(scope="module")
def patched(tmp_path_factory) -> Path:
    home = tmp_path_factory.mktemp("stack")
    folder = home / "tiny"
    done, _ = run(["make-tiny", str(folder)], home)
    assert done.returncode == 0, done.stderr[-3000:]
    done, _ = run(["apply", "--model-path", str(folder), "--json"], home)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return folder


def test_apply_verify_every_op_and_restore_byte_for_byte(tmp_path: Path):
    folder = tmp_path / "tiny"
    assert run(["make-tiny", str(folder)], tmp_path)[0].returncode == 0
    before = snapshot(folder)
    done, _ = run(["apply", "--model-path", str(folder), "--json"], tmp_path)
    assert done.returncode == 0, done.stdout[-3000:]
    done, _ = run(["verify", "--model-path", str(folder), "--use_pto", "--ops", "all", *FAST], tmp_path)
    report = document(done)
    assert done.returncode == 0 and report["passed"], report["failures"]
    assert report["compared"] is True and sorted(report["switched_on"]) == sorted(ALL_OPS)
    ops = report["pto"]["ops"]
    ran = {op for op, entry in ops.items() if entry["calls"] > 0 and entry["fallbacks"] == 0}
    # an op folded into a block runs inside it: that block must have run
    assert all(op in ran or ops[op]["inside"] in ran for op in ALL_OPS), ops
    assert report["accuracy"]["token_match_rate"] == 1.0
    done, _ = run(["restore", "--model-path", str(folder), "--json"], tmp_path)
    assert done.returncode == 0, done.stdout[-3000:]
    assert snapshot(folder) == before


@pytest.fixture(scope="module")
def eager_texts(patched: Path, tmp_path_factory) -> tuple[str, str]:
    home = tmp_path_factory.mktemp("eager")
    done, _ = run(["verify", "--model-path", str(patched), "--use_pto", "--output_length", "16", *FAST], home)
    report = document(done)
    assert done.returncode == 0, report["failures"]
    return report["accuracy"]["baseline_text"], report["accuracy"]["pto_text"]


@pytest.mark.parametrize("backend", ["eager", "aot_eager", "inductor"])
def test_compiled_verify_passes_under_each_backend(patched: Path, tmp_path: Path, backend: str, eager_texts):
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    done, _ = run(
        ["verify", "--model-path", str(patched), "--use_pto", "--use_compile", "--backend", backend]
        + ["--output_length", "16", *FAST],
        tmp_path,
    )
    report = document(done)
    assert done.returncode == 0 and report["passed"], report["failures"]
    assert report["compilation"]["backend"] == backend
    assert (report["accuracy"]["baseline_text"], report["accuracy"]["pto_text"]) == eager_texts


@pytest.mark.parametrize("batch", [1, 2])
def test_graph_decode_captures_at_most_two_graphs_per_mode(
    patched: Path, tmp_path: Path, batch: int, eager_texts
):
    done, graphs = run(
        ["verify", "--model-path", str(patched), "--use_pto", "--use_acl_graph", "--batch", str(batch)]
        + ["--output_length", "16", *FAST],
        tmp_path,
        torchair=True,
    )
    report = document(done)
    assert done.returncode == 0 and report["passed"], report["failures"]
    compilation = report["compilation"]
    assert compilation["backend"] == "torchair" and compilation["cache"] == "static"
    assert 1 <= len(graphs) <= 2 * 2, graphs  # what the stand-in torchair was handed, both modes
    for name in ("baseline", "pto"):
        mode = compilation["modes"][name]
        assert mode["graphs"] <= 2 and list(mode["decode_graphs"].values()) == [1], mode
        assert mode["timed_graphs"] == 0 and mode["decode_steps"] >= 15, mode
    if batch == 1:
        assert (report["accuracy"]["baseline_text"], report["accuracy"]["pto_text"]) == eager_texts
    assert report["accuracy"]["token_match_rate"] == 1.0


def test_ocr_verify_on_the_bundled_pages(patched: Path, tmp_path: Path):
    done, _ = run(
        ["verify", "--model-path", str(patched), "--use_pto", "--ocr", "--output_length", "8", *FAST],
        tmp_path,
    )
    report = document(done)
    assert done.returncode == 0 and report["passed"], report["failures"]
    assert report["comparisons"], "an OCR verify that compared nothing"


def test_a_short_tune_and_bench(patched: Path, tmp_path: Path):
    copy = tmp_path / "tiny"
    shutil.copytree(patched, copy)
    done, _ = run(
        ["tune", "--model-path", str(copy), "--batches", "1", "--budget-s", "120", "--device", "cpu"]
        + ["--dtype", "fp32", "--output_length", "4", "--iters", "3", "--json"],
        tmp_path,
    )
    report = document(done)
    assert done.returncode in (0, 3), report["failures"]
    (entry,) = report["batches"]
    assert entry["baseline_runs"] > 0 and all(a["runs"] > 0 for a in entry["alternatives"]), entry
    done, _ = run(
        ["bench", "--model-path", str(copy), "--batches", "1", "--output_length", "4", "--dtype", "fp32"]
        + ["--warmup", "1", "--iters", "2", "--json", "--output-dir", str(tmp_path / "bench")],
        tmp_path,
    )
    report = document(done)
    assert done.returncode == 0 and report["passed"], report["failures"]
