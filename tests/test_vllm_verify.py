"""verify --engine vllm up to the point vLLM would start: refusals, usage errors, token comparison; and the
make-tiny widths vLLM's CPU attention needs. The runs through vLLM itself: tests/vllm_lane/."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from pto_patch.errors import EXIT_USAGE, PtoPatchError, SpecError
from pto_patch.model.spec import load_spec
from pto_patch.patching import engine
from pto_patch.run.report import json_document
from pto_patch.serving.vllm_verify import VllmVerifyOptions, compare_tokens, verify_with_vllm
from pto_patch.tiny.model import TextWidths, make_tiny, model_config
from tests.helpers.cli import run_cli


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
    # the defaults are the spec's, unchanged by another build's widths
    assert model_config()["hidden_size"] == load_spec("gutenocr_3b").tiny["text"]["hidden_size"]


def test_make_tiny_refuses_widths_the_section_does_not_scale_to():
    with pytest.raises(SpecError) as raised:
        model_config_for(TextWidths(hidden_size=250, heads=5))
    assert raised.value.exit_code == EXIT_USAGE and "head_dim 50" in raised.value.message


def model_config_for(widths: TextWidths):
    from pto_patch.model.spec import load_spec
    from pto_patch.tiny.model import _sizes

    return _sizes(load_spec("gutenocr_3b"), False, None, widths)


def test_a_patched_folder_is_refused_with_one_line_and_a_hint(tmp_path: Path, capsys):
    folder = tmp_path / "patched"
    make_tiny(folder)
    engine.apply_patch(model_path=folder)
    assert run_cli("verify", "--engine", "vllm", "--use_pto", "--model-path", str(folder)) == 1
    stderr = capsys.readouterr().err
    lines = stderr.strip().splitlines()
    assert len(lines) == 2 and "is patched by pto-patch" in lines[0] and "pto-patch restore" in lines[1]
    assert "Traceback" not in stderr


@pytest.mark.parametrize(
    "args, named",
    [
        (["--engine", "sglang"], "--engine 'sglang'"),
        (["--multiprocessing"], "--multiprocessing only applies with --engine vllm"),
        (["--engine", "vllm", "--allow-modified"], "--allow-modified"),
    ],
)
def test_usage_errors_exit_2(tiny: Path, args: list[str], named: str, capsys):
    assert run_cli("verify", "--model-path", str(tiny), *args) == 2
    stderr = capsys.readouterr().err
    assert named in stderr and "Traceback" not in stderr


def test_an_unknown_op_fails_as_in_verify(tiny: Path, capsys):
    code = run_cli(
        "verify", "--engine", "vllm", "--use_pto", "--ops", "rms_norm,gelu", "--model-path", str(tiny)
    )
    stderr = capsys.readouterr().err
    assert code == 2 and "unknown op(s) gelu" in stderr and "Traceback" not in stderr


def test_a_decoder_layer_block_is_a_usage_error_naming_what_vllm_runs(tiny: Path, capsys):
    code = run_cli(
        "verify", "--engine", "vllm", "--use_pto", "--ops", "rms_norm,mlp_block", "--model-path", str(tiny)
    )
    stderr = capsys.readouterr().err
    assert code == 2 and "decoder-layer block(s) mlp_block" in stderr, stderr
    assert "rms_norm, mrope, swiglu_mlp" in stderr and "Traceback" not in stderr


def test_an_unknown_backend_in_the_environment_is_a_usage_error(tiny: Path, monkeypatch, capsys):
    monkeypatch.setenv("PTO_KERNELS_BACKEND", "gpu")
    assert run_cli("verify", "--engine", "vllm", "--use_pto", "--model-path", str(tiny)) == 2
    assert "PTO_KERNELS_BACKEND='gpu'" in capsys.readouterr().err


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


@pytest.fixture(scope="module")
def faithful(tiny: Path) -> dict:
    """What a vLLM run that computes exactly what the transformers eager reference computes would hand
    back: the reference's tokens, its prompt ids and each step's top logprobs (from the real reference)."""
    from pto_patch.model.spec import load_spec
    from pto_patch.serving import vllm_verify

    options = VllmVerifyOptions(model_path=tiny, dtype="fp32", output_length=6)
    bare = {"prompt_token_ids": _prompt_ids(tiny)}
    generation, _ = vllm_verify._reference_generation(
        load_spec("gutenocr_3b"), tiny, "Hello", options, "cpu", bare
    )
    trace = generation.trace
    steps = []
    for step in range(trace.steps):
        normalizer = float(trace.log_normalizers[step][0])
        top = zip(trace.top_indices[step][0].tolist(), trace.top_values[step][0].tolist(), strict=True)
        steps.append([[token, value - normalizer] for token, value in top])
    return {
        "prompt_token_ids": bare["prompt_token_ids"],
        "token_ids": [generation.new_tokens[0].tolist()],
        "logprobs": [steps],
    }


def _prompt_ids(folder: Path) -> list[int]:
    from pto_patch.model.spec import load_spec
    from pto_patch.run.image_inputs import build_inputs

    spec = load_spec("gutenocr_3b")
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    inputs = build_inputs(
        folder, "Hello", None, tokenizer=tokenizer, generation_class=spec.family.generation_class
    )
    return inputs["input_ids"][0].tolist()


def _shifted(run: dict, step: int, by: float) -> dict:
    """`run` with every logprob of one step but the top one lowered by `by` (a skewed distribution)."""
    logprobs = json.loads(json.dumps(run["logprobs"]))
    for sequence in logprobs:
        for entry in sequence[step][1:]:
            entry[1] -= by
    return {**run, "logprobs": logprobs}


def _engine_run(stats: dict, faithful: dict) -> dict:
    """A canned engine run: its kernel stats, and the tokens and logprobs of `faithful` (or a skewed copy)."""
    worker = {
        "pid": 7,
        "stats": stats,
        "layers": {},
        "registry": {},
        "device": "cpu",
        "pto_kernels_path": "/k",
    }
    return {
        "engine_pid": 7, "workers": [worker], "texts": ["x"], "prompt_tokens": 9,
        "import_s": 1.0, "load_s": 1.0, "latency_s": 0.1, "latencies_s": [0.1], "tokens_per_s": 80.0,
        "vllm_version": "0.32.0", **faithful,
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
def test_what_vllms_runs_report_decides_the_verdict(tiny: Path, faithful: dict, monkeypatch, strict: bool):
    """Stray calls in the baseline, an op that never ran and a fallback: each its own failure (the fallback
    only with --strict); the runs themselves are canned here, the lane runs vLLM."""
    from pto_patch.serving import vllm_verify

    runs = {
        "baseline": _engine_run({"rms_norm": _entry(3)}, faithful),
        "pto": _engine_run({"rms_norm": _entry(4, fallbacks=1), "mrope": _entry(0), "swiglu_mlp": _entry(2)}, faithful),
    }  # fmt: skip
    monkeypatch.setattr(vllm_verify, "_check_vllm", lambda: None)
    monkeypatch.setattr(vllm_verify, "_run_engine", lambda mode, request, env, work: runs[mode])
    report = verify_with_vllm(VllmVerifyOptions(model_path=tiny, use_pto=True, strict=strict))
    assert "pto_kernels ran with the plugin's ops off: {'rms_norm': 3}" in report.failures
    assert "mrope: switched on but never ran in vLLM's worker(s)" in report.failures
    fallback = "rms_norm: 1 call(s) fell back to torch (fused: RuntimeError: boom)"
    assert (fallback in report.failures) is strict and (fallback in report.warnings) is not strict
    assert report.accuracy["tokens_equal"] and report.exit_code == 3


def test_a_clean_report_passes(tiny: Path, faithful: dict, monkeypatch):
    from pto_patch.serving import vllm_verify

    ops = {op: _entry(5) for op in ("rms_norm", "mrope", "swiglu_mlp")}
    runs = {"baseline": _engine_run({}, faithful), "pto": _engine_run(ops, faithful)}
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


def test_layers_left_to_vllm_ascends_kernel_are_named_and_not_a_failure(
    tiny: Path, faithful: dict, monkeypatch, capsys
):
    """On an NPU, vllm-ascend's npu_mrope runs GutenOCR's MRoPE: verify says so per layer class instead of
    failing the op as never run; a layer that ran nothing it can name is still a failure."""
    from pto_patch.cli import render
    from pto_patch.serving import vllm_verify

    ascend = "vllm_ascend.ops.rotary_embedding.AscendMRotaryEmbedding (mrope_section [16, 24, 24]: one torch_npu.npu_mrope kernel)"
    ops = {"rms_norm": _entry(5), "mrope": _entry(0), "swiglu_mlp": _entry(5)}
    pto = _engine_run(ops, faithful)
    pto["workers"][0]["layers"] = {
        "RMSNorm": {"built": 5, "pto": 5, "runs": {"pto_kernels": 5}},
        "MRotaryEmbedding": {"built": 1, "pto": 0, "runs": {ascend: 1}},
    }
    runs = {"baseline": _engine_run({}, faithful), "pto": pto}
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


def _judged_verify(tiny: Path, runs: dict, monkeypatch):
    from pto_patch.serving import vllm_verify

    monkeypatch.setattr(vllm_verify, "_check_vllm", lambda: None)
    monkeypatch.setattr(vllm_verify, "_run_engine", lambda mode, request, env, work: runs[mode])
    return verify_with_vllm(VllmVerifyOptions(model_path=tiny, use_pto=True, dtype="fp32", output_length=6))


def test_each_vllm_run_is_judged_against_the_transformers_eager_reference(
    tiny: Path, faithful: dict, monkeypatch, capsys
):
    """vLLM against the transformers eager run, not vLLM against vLLM: the two vLLM runs agree with each other
    (both skewed alike at step 3), and verify still fails, naming vLLM and the step."""
    from pto_patch.cli import render

    ops = {op: _entry(5) for op in ("rms_norm", "mrope", "swiglu_mlp")}
    skewed = _shifted(faithful, 3, 0.5)
    report = _judged_verify(
        tiny, {"baseline": _engine_run({}, skewed), "pto": _engine_run(ops, skewed)}, monkeypatch
    )
    assert report.accuracy["tokens_equal"] and report.exit_code == 3
    baseline, pto = report.judged["baseline"], report.judged["pto"]
    assert baseline.first_failing_step == 3 and pto.first_failing_step == 3
    assert baseline.worst_diff == pytest.approx(0.5, abs=1e-4) and baseline.worst_tolerance < 0.5
    assert any(
        "baseline (vLLM)" in f and "decode step 3" in f and "a fault of vLLM, not a kernel's" in f
        for f in report.failures
    )
    assert any("pto (vLLM)" in f and "the mode's fault" in f for f in report.failures)
    doc = json_document(report)
    assert (
        doc["judged"]["baseline"]["first_failing_step"] == 3
        and doc["reference"]["token_ids"] == faithful["token_ids"][0]
    )
    render.show(report, as_json=False)
    shown = capsys.readouterr().out
    assert "transformers eager (reference)" in shown and "reference text:" in shown


def test_a_pto_run_that_differs_from_the_reference_names_the_kernels(tiny: Path, faithful: dict, monkeypatch):
    ops = {op: _entry(5) for op in ("rms_norm", "mrope", "swiglu_mlp")}
    runs = {"baseline": _engine_run({}, faithful), "pto": _engine_run(ops, _shifted(faithful, 1, 0.5))}
    report = _judged_verify(tiny, runs, monkeypatch)
    assert report.judged["baseline"].passed and report.judged["baseline"].steps_judged == 6
    assert report.judged["baseline"].worst_diff < 1e-4  # the reference's own logprobs, recomputed
    assert report.exit_code == 3 and len(report.failures) == 1
    assert "pto (vLLM)" in report.failures[0] and "decode step 1" in report.failures[0]
    assert "the kernels switched on (rms_norm, mrope, swiglu_mlp)" in report.failures[0]


def test_the_near_tie_rule_at_the_first_divergence():
    """Each side's token in the other's top 5: a near tie passes and ends the judging; a token outside the
    reference's top 5 fails at that step (vLLM's check_logprobs_close)."""
    import torch

    from pto_patch.run.judging import StepTrace, judge_free_run

    values = torch.tensor([[4.0, 3.99, 1.0, 0.5, 0.2, 0.1, -1.0, -2.0]])
    trace = StepTrace(
        tokens=[torch.tensor([0])] * 3, top_values=[values] * 3, top_indices=[torch.arange(8)[None]] * 3,
        scales=[torch.tensor([4.0])] * 3, log_normalizers=[torch.logsumexp(values, -1)] * 3, finished_after=[None],
    )  # fmt: skip
    logprobs = [{i: float(v - torch.logsumexp(values, -1)) for i, v in enumerate(values[0])}] * 3
    agree = judge_free_run(trace, [[0, 0, 0]], [logprobs], 1e-3, 1e-4, "pto")
    assert agree.passed and agree.steps_judged == 3 and agree.first_choice_divergence is None
    tie = judge_free_run(trace, [[0, 1, 0]], [logprobs], 1e-3, 1e-4, "pto")
    assert (
        tie.passed and tie.steps_judged == 2 and tie.first_choice_divergence == 1 and tie.divergence_near_tie
    )
    far = judge_free_run(trace, [[0, 7, 0]], [logprobs], 1e-3, 1e-4, "pto")
    assert not far.passed and far.first_failing_step == 1 and far.divergence_near_tie is False
