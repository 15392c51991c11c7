"""verify --engine vllm up to the point vLLM would start: refusals, usage errors, token comparison; and the
make-tiny widths vLLM's CPU attention needs. The runs through vLLM itself: tests/vllm_lane/."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pto_patch.errors import EXIT_USAGE, PtoPatchError, SpecError
from pto_patch.hub.tiny_model import TextWidths, make_tiny, model_config
from pto_patch.patching import engine
from pto_patch.run.report import json_document
from pto_patch.serving.vllm_verify import VllmVerifyOptions, compare_tokens, verify_with_vllm


def _cli(args: list[str], **extra: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", **extra}
    env.pop("GUTENOCR_MODEL_PATH", None)
    return subprocess.run(
        [sys.executable, "-m", "pto_patch", *args], env=env, capture_output=True, text=True, timeout=300
    )


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("vllm-verify") / "tiny"
    make_tiny(folder, widths=TextWidths(hidden_size=256, heads=4, kv_heads=2))
    return folder


def test_make_tiny_widths_give_a_head_dim_vllm_takes_and_scale_the_section(tiny: Path):
    config = json.loads((tiny / "config.json").read_text())
    assert (config["hidden_size"], config["num_attention_heads"], config["num_key_value_heads"]) == (
        256,
        4,
        2,
    )
    assert config["rope_scaling"]["mrope_section"] == [8, 12, 12]
    assert model_config()["hidden_size"] == 64  # the defaults are unchanged


def test_make_tiny_refuses_widths_the_section_does_not_scale_to():
    with pytest.raises(SpecError) as raised:
        model_config_for(TextWidths(hidden_size=250, heads=5))
    assert raised.value.exit_code == EXIT_USAGE and "head_dim 50" in raised.value.message


def model_config_for(widths: TextWidths):
    from pto_patch.hub.tiny_model import _sizes
    from pto_patch.model.spec import load_spec

    return _sizes(load_spec("gutenocr_3b"), False, None, widths)


def test_a_patched_folder_is_refused_with_one_line_and_a_hint(tmp_path: Path):
    folder = tmp_path / "patched"
    make_tiny(folder)
    engine.apply_patch(model_path=folder)
    done = _cli(["verify", "--engine", "vllm", "--use_pto", "--model-path", str(folder)])
    assert done.returncode == 1, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 2 and "is patched by pto-patch" in lines[0] and "pto-patch restore" in lines[1]
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(
    "args, named",
    [
        (["--engine", "sglang"], "--engine 'sglang'"),
        (["--multiprocessing"], "--multiprocessing only applies with --engine vllm"),
        (["--engine", "vllm", "--atol", "0.1"], "--atol"),
    ],
)
def test_usage_errors_exit_2(tiny: Path, args: list[str], named: str):
    done = _cli(["verify", "--model-path", str(tiny), *args])
    assert done.returncode == 2, done.stderr
    assert named in done.stderr and "Traceback" not in done.stderr


def test_an_unknown_op_fails_as_in_verify(tiny: Path):
    done = _cli(
        ["verify", "--engine", "vllm", "--use_pto", "--ops", "rms_norm,gelu", "--model-path", str(tiny)]
    )
    assert done.returncode == 2 and "unknown op(s) gelu" in done.stderr and "Traceback" not in done.stderr


def test_a_decoder_layer_block_is_a_usage_error_naming_what_vllm_runs(tiny: Path):
    done = _cli(
        ["verify", "--engine", "vllm", "--use_pto", "--ops", "rms_norm,mlp_block", "--model-path", str(tiny)]
    )
    assert done.returncode == 2 and "decoder-layer block(s) mlp_block" in done.stderr, done.stderr
    assert "rms_norm, mrope, swiglu_mlp" in done.stderr and "Traceback" not in done.stderr


def test_an_unknown_backend_in_the_environment_is_a_usage_error(tiny: Path):
    done = _cli(
        ["verify", "--engine", "vllm", "--use_pto", "--model-path", str(tiny)], PTO_KERNELS_BACKEND="gpu"
    )
    assert done.returncode == 2 and "PTO_KERNELS_BACKEND='gpu'" in done.stderr


def test_without_vllm_installed_verify_says_how_to_install_it(tiny: Path, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a)
    )
    with pytest.raises(PtoPatchError) as raised:
        verify_with_vllm(VllmVerifyOptions(model_path=tiny, use_pto=True))
    assert "vLLM is not installed" in raised.value.message and "pto-patch[vllm]" in raised.value.hint


def test_token_comparison_passes_only_on_equal_tokens():
    assert compare_tokens([[1, 2, 3]], [[1, 2, 3]])["passed"] is True
    parted = compare_tokens([[1, 2, 3], [4, 5, 6]], [[1, 2, 3], [4, 9, 6]])
    assert parted["passed"] is False and parted["token_match_rate"] == round(4 / 6, 4)
    assert parted["first_difference"] == {"sequence": 1, "step": 1, "baseline": 5, "pto": 9}


def _report(tokens_equal: bool):
    from pto_patch.serving.vllm_verify import VllmVerifyReport

    mode = {"load_s": 6.1, "latency_s": 0.06, "tokens_per_s": 130.0, "worker_pids": [11], "ops": {}}
    ops = {
        op: {"calls": 5, "backends": {"fused": 5}, "fallbacks": 0}
        for op in ("rms_norm", "mrope", "swiglu_mlp")
    }
    pto = {**mode, "ops": ops, "layers": {"RMSNorm": {"built": 5, "pto": 5}}}
    accuracy = compare_tokens([[1, 2]], [[1, 2]] if tokens_equal else [[1, 3]])
    return VllmVerifyReport(
        model_path="/m", vllm_version="0.32.0", device="cpu", dtype="float32",
        input={"kind": "text", "prompt": "Hello", "image": None, "prompt_tokens": 9, "batch": 1, "output_length": 2},
        multiprocessing=False, compiled=True, baseline=mode, pto=pto, switched_on=["rms_norm", "mrope", "swiglu_mlp"],
        kernel_backend="fused", accuracy=accuracy, failures=[] if tokens_equal else ["greedy tokens differ"],
    )  # fmt: skip


@pytest.mark.parametrize("tokens_equal", [True, False])
def test_the_text_report_shows_calls_layers_agreement_and_the_verdict(tokens_equal, capsys):
    from pto_patch.cli import render

    report = _report(tokens_equal)
    render.show(report, as_json=False)
    shown = capsys.readouterr()
    assert "compiled" in shown.out and "RMSNorm 5/5" in shown.out and "fused 5" in shown.out
    assert ("PASSED" in shown.out) is tokens_equal and ("exit code 3" in shown.out) is not tokens_equal
    assert report.exit_code == (0 if tokens_equal else 3)
    assert json_document(report)["engine"] == "vllm" and json_document(report)["passed"] is tokens_equal


def _engine_run(stats: dict, tokens: list[list[int]]) -> dict:
    worker = {
        "pid": 7,
        "stats": stats,
        "layers": {},
        "registry": {},
        "device": "cpu",
        "pto_kernels_path": "/k",
    }
    return {
        "engine_pid": 7, "workers": [worker], "token_ids": tokens, "texts": ["x"], "prompt_tokens": 9,
        "import_s": 1.0, "load_s": 1.0, "latency_s": 0.1, "latencies_s": [0.1], "tokens_per_s": 80.0,
        "vllm_version": "0.32.0",
    }  # fmt: skip


def _entry(calls: int, fallbacks: int = 0) -> dict:
    error = "fused: RuntimeError: boom" if fallbacks else None
    return {
        "calls": calls,
        "backends": {"fused": calls},
        "fallbacks": fallbacks,
        "first_fallback_error": error,
    }


@pytest.mark.parametrize("strict", [False, True])
def test_what_vllms_runs_report_decides_the_verdict(tiny: Path, monkeypatch, strict: bool):
    """Stray calls in the baseline, an op that never ran and a fallback: each its own failure (the fallback
    only with --strict); the runs themselves are canned here, the lane runs vLLM."""
    from pto_patch.serving import vllm_verify

    runs = {
        "baseline": _engine_run({"rms_norm": _entry(3)}, [[1, 2, 3]]),
        "pto": _engine_run({"rms_norm": _entry(4, fallbacks=1), "mrope": _entry(0), "swiglu_mlp": _entry(2)}, [[1, 2, 3]]),
    }  # fmt: skip
    monkeypatch.setattr(vllm_verify, "_check_vllm", lambda: None)
    monkeypatch.setattr(vllm_verify, "_run_engine", lambda mode, request, env, work: runs[mode])
    report = verify_with_vllm(VllmVerifyOptions(model_path=tiny, use_pto=True, strict=strict))
    assert "pto_kernels ran with the plugin's ops off: {'rms_norm': 3}" in report.failures
    assert "mrope: switched on but never ran in vLLM's worker(s)" in report.failures
    fallback = "rms_norm: 1 call(s) fell back to torch (fused: RuntimeError: boom)"
    assert (fallback in report.failures) is strict and (fallback in report.warnings) is not strict
    assert report.accuracy["tokens_equal"] and report.exit_code == 3


def test_a_clean_report_passes(tiny: Path, monkeypatch):
    from pto_patch.serving import vllm_verify

    ops = {op: _entry(5) for op in ("rms_norm", "mrope", "swiglu_mlp")}
    runs = {"baseline": _engine_run({}, [[1, 2]]), "pto": _engine_run(ops, [[1, 2]])}
    seen_env = {}
    monkeypatch.setattr(vllm_verify, "_check_vllm", lambda: None)
    monkeypatch.setattr(
        vllm_verify,
        "_run_engine",
        lambda mode, request, env, work: seen_env.setdefault(mode, env) and runs[mode],
    )
    report = verify_with_vllm(VllmVerifyOptions(model_path=tiny, use_pto=True, kernel_backend="torch"))
    assert report.passed and report.exit_code == 0 and report.kernel_backend == "torch"
    assert "PTO_KERNELS_VLLM_OPS" not in seen_env["baseline"]
    assert seen_env["pto"]["PTO_KERNELS_VLLM_OPS"] == "rms_norm,mrope,swiglu_mlp"
    assert seen_env["pto"]["PTO_KERNELS_BACKEND"] == "torch"


def test_layers_left_to_vllm_ascends_kernel_are_named_and_not_a_failure(tiny: Path, monkeypatch, capsys):
    """On an NPU, vllm-ascend's npu_mrope runs GutenOCR's MRoPE: verify says so per layer class instead of
    failing the op as never run; a layer that ran nothing it can name is still a failure."""
    from pto_patch.cli import render
    from pto_patch.serving import vllm_verify

    ascend = "vllm_ascend.ops.rotary_embedding.AscendMRotaryEmbedding (mrope_section [16, 24, 24]: one torch_npu.npu_mrope kernel)"
    ops = {"rms_norm": _entry(5), "mrope": _entry(0), "swiglu_mlp": _entry(5)}
    pto = _engine_run(ops, [[1, 2]])
    pto["workers"][0]["layers"] = {
        "RMSNorm": {"built": 5, "pto": 5, "runs": {"pto_kernels": 5}},
        "MRotaryEmbedding": {"built": 1, "pto": 0, "runs": {ascend: 1}},
    }
    runs = {"baseline": _engine_run({}, [[1, 2]]), "pto": pto}
    monkeypatch.setattr(vllm_verify, "_check_vllm", lambda: None)
    monkeypatch.setattr(vllm_verify, "_run_engine", lambda mode, request, env, work: runs[mode])
    report = verify_with_vllm(VllmVerifyOptions(model_path=tiny, use_pto=True))
    assert (
        report.passed
        and f"mrope: every layer left to the class underneath: 1 run {ascend}" in report.warnings
    )
    render.show(report, as_json=False)
    assert "MRotaryEmbedding: 1 layer(s) run vllm_ascend.ops" in capsys.readouterr().out
    pto["workers"][0]["layers"]["MRotaryEmbedding"]["runs"] = {"pto_patch.serving.vllm_layers.PtoX": 1}
    report = verify_with_vllm(VllmVerifyOptions(model_path=tiny, use_pto=True))
    assert "mrope: switched on but never ran in vLLM's worker(s)" in report.failures
