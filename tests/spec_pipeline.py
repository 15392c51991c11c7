"""make-tiny -> apply -> verify --use_pto (with an image) -> restore for one spec, through the CLI.

apply, status and restore run in this process; verify runs in a fresh one (transformers caches remote
code per process, and the folder's `pto_kernels` lives in `sys.modules`), with its own HF_HOME.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pto_patch.cli.app import main
from pto_patch.model.spec import load_spec
from pto_patch.run.image_inputs import sample_image
from tests.folder_snapshot import snapshot

# One warm-up-free timed run of two new tokens: enough to compare logits, tokens and calls per op.
QUICK = ["--warmup", "0", "--iters", "1", "--output_length", "2"]
# A short prompt keeps the full-width prefill cheap; the image still goes through the vision tower.
SHORT_PROMPT = ["--prompt", "Read the text."]


def run_in_process(*args: str) -> int:
    with pytest.raises(SystemExit) as exit_info:
        main(list(args))
    return exit_info.value.code


def run_in_fresh_process(args: list[str], home: Path) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "HF_HOME": str(home / "hf"),
        "HF_MODULES_CACHE": str(home / "hf-modules"),
        "HF_HUB_OFFLINE": "1",
    }
    env.pop("PTO_KERNELS_BACKEND", None)
    return subprocess.run(
        [sys.executable, "-m", "pto_patch", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=home,
        timeout=1800,
    )


def page_image(folder: Path) -> Path:
    path = folder / "page.png"
    if not path.exists():
        sample_image(112, 84).save(path)
    return path


def apply_verify_restore(
    model: str, folder: Path, home: Path, extra_verify: list[str] = (), capsys=None
) -> dict:
    """apply, verify --use_pto with an image, restore; the folder ends byte-identical. Returns verify's report."""
    spec = load_spec(model)
    before = snapshot(folder)
    assert run_in_process("apply", "--model", model, "--model-path", str(folder)) == 0
    modeling = (folder / spec.modeling_file).read_text(encoding="utf-8")
    assert f"class {spec.renamed(spec.family.generation_class)}(" in modeling
    done = run_in_fresh_process(
        [
            "verify",
            "--model",
            model,
            "--model-path",
            str(folder),
            "--use_pto",
            "--image",
            str(page_image(home)),
            "--json",
            *QUICK,
            *extra_verify,
        ],
        home,
    )
    assert done.returncode == 0, done.stderr[-3000:] + done.stdout[-3000:]
    report = json.loads(done.stdout)
    assert report["passed"] and report["input"]["kind"] == "image"
    assert report["accuracy"]["passed"] and report["accuracy"]["logits_within_tolerance"]
    ops = report["pto"]["ops"]
    assert all(ops[op]["calls"] > 0 for op in report["switched_on"]), ops
    assert report["switched_on"] == ["rms_norm", "mrope", "swiglu_mlp"], (
        "a run's default: the reference's ops"
    )
    load_info = report["load_info"]
    assert load_info["missing_keys"] == load_info["unexpected_keys"] == load_info["mismatched_keys"] == []
    assert run_in_process("restore", "--model", model, "--model-path", str(folder)) == 0
    assert snapshot(folder) == before
    if capsys is not None:
        capsys.readouterr()
    return report
