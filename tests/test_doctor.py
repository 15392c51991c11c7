"""`pto-patch doctor`: the stack, PyPTO's pre-flight, and every op on each backend against float64.

Most cases run at narrow widths (the doctor's width table patched); one runs the command as a user does,
at GutenOCR-3B's widths, with --json."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from pto_patch.errors import EXIT_OK, EXIT_USAGE, EXIT_VERIFY_FAILED
from pto_patch.run.diagnosis import doctor
from tests.helpers.json_documents import assert_document

REPO = Path(__file__).resolve().parents[1]
OPS = (
    "rms_norm",
    "mrope",
    "swiglu_mlp",
    "residual_rms_norm",
    "mlp_block",
    "attention_prologue",
    "attention_core",
    "attention_prologue_cached",  # attention_prologue's entry that also writes a static KV cache
)


@pytest.fixture()
def narrow(monkeypatch):
    monkeypatch.setitem(doctor.WIDTHS, "hidden", 64)
    monkeypatch.setitem(doctor.WIDTHS, "intermediate", 128)
    monkeypatch.setitem(doctor.WIDTHS, "q_heads", 4)
    monkeypatch.setitem(doctor.WIDTHS, "kv_heads", 2)
    monkeypatch.setitem(doctor.WIDTHS, "head_dim", 32)
    monkeypatch.setattr(doctor, "SECTION", (4, 6, 6))
    monkeypatch.delenv("PTO_KERNELS_STRICT", raising=False)


def test_every_op_on_every_backend_here_matches_float64(narrow):
    report = doctor.run_doctor("cpu", "bf16", with_pypto=False, tokens=3)
    assert report.backends == ["torch", "fused"]
    assert [(c.op, c.backend) for c in report.checks] == [(op, b) for op in OPS for b in ("torch", "fused")]
    for check in report.checks:
        assert check.status == "ok", check
        assert 0 < check.rel_error <= check.tolerance == 1e-2  # bf16 rounding shows; a copy would be 0
        assert check.run_ms is not None and check.first_call_ms is not None
    assert report.passed and report.exit_code == EXIT_OK
    assert (
        report.stack["torch"] == torch.__version__.split("+")[0] or report.stack["torch"] == torch.__version__
    )
    assert report.pypto["preflight"]["checks"][0]["name"] == "ascend_home"


def test_a_wrong_kernel_fails_with_exit_code_3(narrow, monkeypatch):
    from pto_kernels.backends import fused

    right = fused.rms_norm
    monkeypatch.setattr(fused, "rms_norm", lambda x, w, eps=1e-6: right(x, w.flip(0), eps))
    report = doctor.run_doctor("cpu", "fp32", with_pypto=False, tokens=2)
    wrong = [c for c in report.checks if c.status != "ok"]
    assert wrong[0].op == "rms_norm" and (wrong[0].backend, wrong[0].status) == ("fused", "failed")
    assert {c.backend for c in wrong} == {"fused"}  # the blocks built on the fused RMSNorm fail too
    assert wrong[0].reason.startswith("relative error ") and wrong[0].reason.endswith("over 1e-05")
    assert report.exit_code == EXIT_VERIFY_FAILED
    assert report.failures[0] == f"rms_norm on fused: failed ({wrong[0].reason})"


def test_a_kernel_that_falls_back_is_a_failure_with_its_reason(narrow, monkeypatch):
    from pto_kernels.backends import fused

    def broken(*args):
        raise RuntimeError("no such kernel here")

    monkeypatch.setattr(fused, "swiglu_mlp", broken)
    report = doctor.run_doctor("cpu", "fp32", with_pypto=False, tokens=1)
    fell = [c for c in report.checks if c.status != "ok"]
    assert [(c.op, c.backend, c.status) for c in fell] == [("swiglu_mlp", "fused", "fell back")]
    assert fell[0].reason == "fused: RuntimeError: no such kernel here"
    assert fell[0].rel_error <= fell[0].tolerance  # the torch path served it, right, but not the kernel
    assert not report.passed


def test_pypto_on_a_cpu_is_asked_for_and_skipped_where_its_interpreter_cannot_build(narrow, monkeypatch):
    assert doctor.backends_here("cpu", with_pypto=True) == ["torch", "fused", "pypto"]
    assert doctor.backends_here("npu", with_pypto=False) == ["torch", "fused", "npu", "pypto"]
    monkeypatch.setattr(doctor.shutil, "which", lambda name: None)
    report = doctor.run_doctor("cpu", "bf16", with_pypto=True, tokens=1)
    skipped = [c for c in report.checks if c.backend == "pypto"]
    assert len(skipped) == len(OPS) and {c.status for c in skipped} == {"not run"}
    assert skipped[0].reason == "g++ not found: pypto's CPU interpreter compiles with it"
    assert report.passed  # what did not run is named, not failed


def test_the_cann_version_comes_from_its_install_files(tmp_path):
    assert doctor.cann_version(tmp_path) is None
    (tmp_path / "version.cfg").write_text("# toolkit\nVersion=8.0.RC3\n")
    assert doctor.cann_version(tmp_path) == "8.0.RC3"


def test_bad_tokens_is_a_usage_error(narrow):
    with pytest.raises(doctor.PtoPatchError) as raised:
        doctor.run_doctor("cpu", "bf16", with_pypto=False, tokens=0)
    assert raised.value.exit_code == EXIT_USAGE and "--tokens" in raised.value.message


@pytest.mark.slow
def test_doctor_json_at_gutenocr_widths_names_the_stack_and_checks_every_op(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(REPO), PTO_KERNELS_CACHE_DIR=str(tmp_path / "cache"))
    env.pop("ASCEND_HOME_PATH", None)
    done = subprocess.run(
        [sys.executable, "-m", "pto_patch", "doctor", "--device", "cpu", "--tokens", "1", "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    document = json.loads(done.stdout)
    assert done.returncode == EXIT_OK, done.stderr[-2000:]
    assert_document(document, "doctor")
    assert document["stack"]["torch"] == torch.__version__ and document["stack"]["python"]
    assert document["pypto"]["preflight"]["ready"] is False
    assert document["pypto"]["preflight"]["reason"].startswith(
        "pypto cannot compile for the NPU: ASCEND_HOME_PATH is not set"
    )
    checked = {(c["op"], c["backend"]): c for c in document["checks"]}
    assert set(checked) == {(op, b) for op in OPS for b in ("torch", "fused")}
    assert all(c["status"] == "ok" and c["rel_error"] <= 1e-2 for c in checked.values())


def test_verify_and_bench_reports_carry_the_compile_seconds_apart():
    """The kernel package counts pypto's compile time; the run's op reports show it per op."""
    from pto_patch.run.op_choice import op_reports

    stats = {
        "rms_norm": {
            "calls": 3,
            "backends": {"pypto": 3},
            "pypto_kernels": {"compiles": 1, "compile_s": 2.5},
        },
        "mrope": {"calls": 2, "backends": {"fused": 2}},  # a kernel package from before compile_s
    }
    reports = op_reports(stats, ("rms_norm", "mrope"))
    assert reports["rms_norm"].compile_s == 2.5 and reports["mrope"].compile_s is None
    assert reports["rms_norm"].to_json()["compile_s"] == 2.5


@pytest.mark.parametrize("wrong", ["q 10 % off", "no write", "no advance"])
def test_the_cache_writing_check_catches_a_wrong_q_or_a_missing_write(narrow, monkeypatch, wrong):
    """The check compares q and the rows written, not the untouched caches that would dilute an error,
    and the layer's length exactly (the op advances it where transformers 5.8+ keeps one)."""
    from pto_kernels.backends import fused

    right = fused.attention_prologue_cached

    def sabotaged(*args):
        if wrong == "no write":
            *prologue, _, _, _, _ = args
            return fused.attention_prologue(*prologue)[0]
        if wrong == "no advance":
            return right(*args[:-1], False)
        return right(*args) * 1.1

    monkeypatch.setattr(fused, "attention_prologue_cached", sabotaged)
    report = doctor.run_doctor("cpu", "bf16", with_pypto=False, tokens=1)
    failed = [(c.op, c.backend, c.status) for c in report.checks if c.status != "ok"]
    assert failed == [("attention_prologue_cached", "fused", "failed")]
