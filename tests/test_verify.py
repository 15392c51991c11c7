"""`pto-patch verify`: the pieces on their own, then the command end to end on the tiny model.

End-to-end runs go through the CLI in a fresh process each: transformers caches remote code per
process (`transformers_modules`), and the patched folder's `pto_kernels` lives in `sys.modules`.
Every such process gets its own HF_HOME and HF_MODULES_CACHE.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import inspect
import json
import math
import sys
from pathlib import Path

import pytest
import torch

from pto_patch.cli import app as cli
from pto_patch.errors import EXIT_ERROR, EXIT_USAGE, ModelFolderError, PtoPatchError
from pto_patch.model.spec import OPS, load_spec
from pto_patch.patching import engine
from pto_patch.patching.folder_check import check_folder
from pto_patch.patching.folder_kernels import import_folder_kernels
from pto_patch.patching.manifest import MANIFEST_DIR, STATE_IN_PROGRESS, Manifest
from pto_patch.run import bench, device, loading, verify
from pto_patch.run.device import parse_device, resolve_device, resolve_dtype
from pto_patch.run.generation import DEFAULT_TOLERANCES, Generation, compare, tolerances
from pto_patch.run.graph.compiling import apply_compile
from pto_patch.run.image_inputs import sample_image
from pto_patch.run.inputs import OCR_PROMPT
from pto_patch.run.loading import fix_rope_config, load_failures
from pto_patch.run.ocr.options import OcrOptions
from pto_patch.run.op_choice import dynamic_choice, op_failures
from pto_patch.run.options import RunOptions
from pto_patch.run.patchers import OTHER_PATCHER_HINT, other_patcher_checks
from pto_patch.run.report import BatchRun, BenchResult, LoadInfo, ModeMetrics, ModeRun, OpReport, OtherPatcher
from pto_patch.run.verify import VerifyOptions
from pto_patch.serving.vllm_verify import VllmVerifyOptions
from pto_patch.tiny.model import make_tiny
from tests.helpers.changes import WRONG_RMS_NORM
from tests.helpers.cli import json_out, run_cli, run_process

FAST = ["--warmup", "0", "--iters", "1", "--output_length", "8"]
SCHEMAS = Path(__file__).resolve().parents[1] / "skills" / "pto-patch" / "references" / "json-schemas.md"
REPORT_KEYS = {
    "schema_version",
    "model_path",
    "device",
    "dtype",
    "versions",
    "baseline",
    "pto",
    "accuracy",
    "load_info",
    "passed",
}
MODE_KEYS = {"load_s", "latency_s", "tokens", "tokens_per_s", "peak_memory_mb"}
ACCURACY_KEYS = {"max_abs_logit_diff", "max_rel_logit_diff", "token_match_rate", "text_equal", "passed"}


# Changes run on the loaded model (tests.helpers.cli.AFTER_LOAD), the way a run-time patcher (Liger's
# `model=` path, `kernels`' kernelize) changes it; start_run looks load_model up at call time.
# Instance level: one decoder layer's MLP gets a plain forward (what Liger's `model=` path does).
PATCH_ONE_MLP = """
mlp = dict(model.named_modules())["model.language_model.layers.0.mlp"]
mlp.forward = lambda x: mlp.down_proj(mlp.act_fn(mlp.gate_proj(x)) * mlp.up_proj(x))
"""
# Class level: the RMSNorm class (text and vision tower) gets a plain forward after import.
PATCH_RMS_NORM_CLASS = """
import torch


def forward(self, hidden_states):
    dtype = hidden_states.dtype
    hidden_states = hidden_states.to(torch.float32)
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    return self.weight * (hidden_states * torch.rsqrt(variance + self.variance_epsilon)).to(dtype)


type(model.model.language_model.norm).forward = forward
"""
# A forward hook pair on the final text norm turns its guard's switch on around that one call, whatever
# verify switched: the guard then calls the kernel while verify believes every switch is off.
STRAY_GUARD_CALL = """
import sys

kernels, norm, saved = sys.modules.get("pto_kernels"), model.model.language_model.norm, []


def switch_on(module, args):
    saved.append(kernels.USE_PTO_RMS_NORM)
    kernels.USE_PTO_RMS_NORM = True


def switch_back(module, args, output):
    kernels.USE_PTO_RMS_NORM = saved.pop()


if kernels is not None:  # the patched model's load (the unpatched reference has no kernel package)
    norm.register_forward_pre_hook(switch_on)
    norm.register_forward_hook(switch_back)
"""


# --- pieces ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("cpu", ("cpu", None)),
        ("cuda", ("cuda", None)),
        ("cuda:1", ("cuda", 1)),
        ("npu", ("npu", None)),
        ("npu:2", ("npu", 2)),
        ("3", ("npu", 3)),  # the reference's bare card number
        (" NPU:0 ", ("npu", 0)),
    ],
)
def test_parse_device(text, expected):
    assert parse_device(text) == expected


@pytest.mark.parametrize("text", ["gpu", "cpu:0", "cuda:x", "npu:-1", ""])
def test_parse_device_rejects(text):
    with pytest.raises(PtoPatchError) as caught:
        parse_device(text)
    assert caught.value.exit_code == EXIT_USAGE


def test_default_device_prefers_npu_then_cuda_then_cpu(monkeypatch):
    for npu, cuda, expected in ((True, True, "npu:0"), (False, True, "cuda:0"), (False, False, "cpu")):
        monkeypatch.setattr(device, "npu_available", lambda value=npu: value)
        monkeypatch.setattr(device, "cuda_available", lambda value=cuda: value)
        assert resolve_device(None).name == expected


def test_npu_requested_without_torch_npu_is_an_error(monkeypatch):
    monkeypatch.setattr(device, "npu_available", lambda: False)
    with pytest.raises(PtoPatchError, match="torch_npu"):
        resolve_device("0")


def test_dtype_names_and_tolerances():
    assert resolve_dtype("bf16") is torch.bfloat16
    assert resolve_dtype("float16") is torch.float16
    assert resolve_dtype("fp32") is torch.float32
    with pytest.raises(PtoPatchError):
        resolve_dtype("int8")
    assert tolerances("fp32", None, None)[0] < tolerances("bf16", None, None)[0]
    assert tolerances("bf16", 0.5, None) == (0.5, DEFAULT_TOLERANCES["bfloat16"][1])
    # a compiled bf16 run rounds at other places than eager: it alone gets the looser rtol
    assert tolerances("bf16", None, None, compiled=True)[1] > tolerances("bf16", None, None)[1]
    assert tolerances("fp32", None, None, compiled=True) == tolerances("fp32", None, None)
    assert tolerances("bf16", None, 0.01, compiled=True)[1] == 0.01


def test_an_unknown_dtype_is_a_usage_error_not_a_crash(patched_tiny: Path, capsys):
    with pytest.raises(PtoPatchError) as caught:
        tolerances("int8", None, None)
    assert caught.value.exit_code == EXIT_USAGE
    with pytest.raises(SystemExit) as stopped:
        cli.main(["verify", "--model-path", str(patched_tiny), "--dtype", "int8", "--json"])
    error = json.loads(capsys.readouterr().out)
    assert stopped.value.code == error["exit_code"] == EXIT_USAGE
    assert error["error"] == "--dtype 'int8' is not supported"
    assert all(name in error["hint"] for name in ("bf16", "fp16", "fp32"))


def _interrupt(folder: Path) -> None:
    """Leave `folder` as an apply killed half-way leaves it: the manifest still in progress."""
    Manifest.load(folder).with_state(STATE_IN_PROGRESS).save(folder)


@pytest.mark.parametrize("use_pto", [True, False])
def test_an_interrupted_apply_is_refused(patched_copy: Path, use_pto: bool):
    _interrupt(patched_copy)
    with pytest.raises(ModelFolderError, match="interrupted apply") as caught:
        check_folder(patched_copy, use_pto=use_pto, allow_modified=True)
    assert "pto-patch restore" in caught.value.hint


def test_a_patch_folder_without_a_manifest_is_an_interrupted_apply(patched_copy: Path):
    Manifest.path_in(patched_copy).unlink()  # apply stopped after the backups, before the manifest
    assert (patched_copy / MANIFEST_DIR).is_dir()
    with pytest.raises(ModelFolderError, match="interrupted apply"):
        check_folder(patched_copy, use_pto=False, allow_modified=False)


def test_verify_refuses_an_interrupted_apply(patched_copy: Path, capsys):
    _interrupt(patched_copy)
    with pytest.raises(SystemExit) as stopped:
        cli.main(["verify", "--model-path", str(patched_copy), "--use_pto", "--json", *FAST])
    error = json.loads(capsys.readouterr().out)
    assert stopped.value.code == error["exit_code"] == EXIT_ERROR
    assert "interrupted apply" in error["error"] and "pto-patch restore" in error["hint"]


def test_the_cli_parameters_are_the_options_fields():
    """verify and bench hand their parameters to the options dataclasses by name; the shared ones
    are declared once, in RunOptions."""
    shared = {field.name for field in dataclasses.fields(RunOptions)}
    for command, options_class in ((cli.verify, VerifyOptions), (cli.bench, bench.BenchOptions)):
        assert issubclass(options_class, RunOptions)
        fields = {field.name for field in dataclasses.fields(options_class)}
        engine_choice = {"engine", "multiprocessing"} if command is cli.verify else set()  # see below
        # --ocr and its options go to run.ocr.options.OcrOptions (split_ocr_options), the rest here
        ocr_choice = set(inspect.signature(command).parameters) & {
            f.name for f in dataclasses.fields(OcrOptions)
        }
        assert "ocr" in ocr_choice
        assert set(inspect.signature(command).parameters) - {"as_json"} - engine_choice - ocr_choice == fields
        assert shared <= fields
    # verify --engine vllm takes verify's parameters by the same names (pto_patch/serving/vllm_verify.py)
    vllm_fields = {field.name for field in dataclasses.fields(VllmVerifyOptions)}
    assert vllm_fields <= set(inspect.signature(cli.verify).parameters)


def _schema_section(title: str) -> str:
    return SCHEMAS.read_text(encoding="utf-8").split(f"\n## {title}\n")[1].split("\n## ")[0]


def _sample_metrics() -> ModeMetrics:
    return ModeMetrics(
        load_s=1.0,
        latency_s=0.5,
        tokens=8,
        tokens_per_s=16.0,
        peak_memory_mb=10.0,
        batch=1,
        new_tokens_per_sequence=8,
        latencies_s=[0.4, 0.6],
        prefill_s=0.1,
        decode_step_s=0.05,
    )


def test_every_per_mode_key_is_documented():
    section = _schema_section("verify")
    assert [key for key in _sample_metrics().to_json() if f"`{key}`" not in section] == []


def test_every_key_of_the_bench_files_is_documented():
    """bench_baseline.json / bench_pypto.json: the header and each run's keys beyond verify's per-mode ones."""
    metrics = _sample_metrics()
    runs = [BatchRun(1, ModeRun(metrics), ModeRun(metrics, {}), ("mrope",), None)]
    result = BenchResult(
        model_path="m",
        device="cpu",
        dtype="float32",
        versions={},
        input={"kind": "text"},
        load_info=LoadInfo([], [], [], None),
        weight_bytes_per_token=1000,
        copy_bandwidth_bytes_s=1e9,
        peak_memory_source="rss",
        runs=runs,
    )
    section = _schema_section("bench")
    for mode in ("baseline", "pto"):
        doc = result.mode_document(mode)
        keys = set(doc) | set(doc["runs"][0]) - set(metrics.to_json())
        assert sorted(key for key in keys if f"`{key}`" not in section) == []


def test_dynamic_config_follows_the_reference_table():
    every = ("rms_norm", "mrope", "swiglu_mlp")

    def on(batch, available=every):
        return [row["op"] for row in dynamic_choice(batch, available) if row["enabled"]]

    assert on(1) == ["swiglu_mlp", "mrope"]
    assert on(4) == ["swiglu_mlp", "mrope"]
    assert on(8) == ["swiglu_mlp"]
    assert on(1, ("rms_norm", "mrope")) == ["mrope"]  # never an op the folder lacks
    assert all(row["reason"] for row in dynamic_choice(8, every))


def _generation(tokens, logits):
    return Generation(new_tokens=torch.tensor(tokens), first_logits=torch.tensor(logits), seconds=0.0)


class _Decoder:
    def batch_decode(self, rows, skip_special_tokens=True):
        return [" ".join(str(int(t)) for t in row) for row in rows]


def test_compare_logits_tolerance_nan_and_token_match():
    base = _generation([[1, 2, 3, 4]], [[10.0, -2.0, 0.5]])
    same = compare(base, _generation([[1, 2, 3, 4]], [[10.0, -2.0, 0.5]]), _Decoder(), 0.1, 0.0)
    assert same.passed and same.text_equal and same.token_match_rate == 1.0
    assert same.max_abs_logit_diff == 0.0

    off = compare(base, _generation([[1, 2, 9]], [[10.0, -2.0, 0.8]]), _Decoder(), 0.1, 0.0)
    assert not off.passed
    assert off.max_abs_logit_diff == pytest.approx(0.3)
    assert off.max_rel_logit_diff == pytest.approx(0.03)
    assert off.token_match_rate == 0.5  # 2 of 4 positions, the missing one counts as a mismatch
    assert not off.text_equal
    assert compare(base, _generation([[1, 2, 3, 4]], [[10.0, -2.0, 0.8]]), _Decoder(), 0.0, 0.05).passed

    nan = compare(base, _generation([[1, 2, 3, 4]], [[10.0, float("nan"), 0.5]]), _Decoder(), 1e9, 1e9)
    assert not nan.passed


def test_op_checks():
    def report(on, calls, fallbacks=0):
        return OpReport(switched_on=on, backend="fused", calls=calls, fallbacks=fallbacks)

    failures, warnings = op_failures({"rms_norm": report(True, 0)}, strict=False)
    assert failures and "never ran" in failures[0]
    failures, warnings = op_failures({"mrope": report(True, 5, fallbacks=2)}, strict=False)
    assert not failures and warnings
    failures, warnings = op_failures({"mrope": report(True, 5, fallbacks=2)}, strict=True)
    assert failures and not warnings
    failures, _ = op_failures({"swiglu_mlp": report(False, 3)}, strict=False)
    assert failures
    assert op_failures({"swiglu_mlp": report(True, 3)}, strict=True) == ([], [])


def test_rope_fix_fills_a_missing_mrope_section():
    from transformers import Qwen2_5_VLConfig

    config = Qwen2_5_VLConfig(
        text_config={"hidden_size": 2048, "num_attention_heads": 16, "num_key_value_heads": 2},
    )
    for scope in (config, config.text_config):
        for key in ("rope_parameters", "rope_scaling"):
            rope = getattr(scope, key, None)
            if isinstance(rope, dict):
                rope.pop("mrope_section", None)
    fixes = fix_rope_config(config, [16, 24, 24])
    assert fixes
    rope = config.text_config.rope_parameters
    assert rope["mrope_section"] == [16, 24, 24]
    assert fix_rope_config(config, [16, 24, 24]) == []  # already right: no change


def _config_folder(folder: Path, rope_scaling: dict | None) -> Path:
    """A folder whose config.json has head_dim 16 (64 / 4 heads) and `rope_scaling` where given."""
    data = {"model_type": "qwen2_5_vl", "hidden_size": 64, "num_attention_heads": 4}
    if rope_scaling is not None:
        data["rope_scaling"] = rope_scaling
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(data))
    return folder


def test_the_runs_rope_section_is_config_jsons_where_it_fits_else_the_specs(tmp_path: Path):
    from pto_patch.model.rope_section import folder_mrope_section

    spec = load_spec("gutenocr_3b")
    own = _config_folder(tmp_path / "own", {"type": "mrope", "mrope_section": [2, 3, 3]})
    assert folder_mrope_section(own, spec) == [2, 3, 3]  # head_dim 16: the folder's own fits
    with pytest.raises(PtoPatchError, match="mrope_section \\[16, 24, 24\\] does not fit head_dim 16"):
        folder_mrope_section(
            _config_folder(tmp_path / "none", None), spec
        )  # the spec's [16, 24, 24] does not


def test_rope_fix_refuses_a_section_that_cannot_fit(tmp_path: Path):
    from pto_patch.model.rope_section import folder_mrope_section

    folder = _config_folder(tmp_path, {"type": "mrope", "mrope_section": [4, 4, 4]})  # sums to 12, not 8
    with pytest.raises(PtoPatchError, match="mrope_section"):
        folder_mrope_section(folder, load_spec("gutenocr_3b"))


@pytest.mark.skipif(importlib.util.find_spec("torchair") is not None, reason="torchair is installed here")
def test_acl_graph_without_torchair_falls_back_to_torch_compile_with_a_warning():
    model = torch.nn.Linear(2, 2)
    plain_forward = model.forward
    warnings: list[str] = []
    options = VerifyOptions(use_acl_graph=True, compile_backend="eager")
    setup = apply_compile(model, options, warnings)
    # a graph run still: the decode step compiled alone, with fixed shapes, over a static cache
    assert setup.backend == "eager" and setup.dynamic is False and setup.cache == "static"
    assert setup.description.startswith("torch.compile") and "'eager'" in setup.description
    assert len(warnings) == 1 and "torchair" in warnings[0]
    assert model.forward is not plain_forward
    assert apply_compile(torch.nn.Linear(2, 2), VerifyOptions(), warnings) is None


def test_the_folder_copy_of_pto_kernels_is_imported(patched_tiny: Path, monkeypatch):
    from pto_patch.resources import kernels_dir

    monkeypatch.setattr(sys, "path", [str(kernels_dir()), *sys.path])
    saved = {name: module for name, module in sys.modules.items() if name.split(".")[0] == "pto_kernels"}
    try:
        for name in saved:
            del sys.modules[name]
        import pto_kernels as other

        assert Path(other.__file__).parent == kernels_dir() / "pto_kernels"
        module = import_folder_kernels(patched_tiny)
        assert Path(module.__file__).resolve().parent == (patched_tiny / "pto_kernels").resolve()
        assert sys.modules["pto_kernels"] is module
        assert not (patched_tiny / "pto_kernels" / "__pycache__").exists()
    finally:
        for name in [n for n in sys.modules if n.split(".")[0] == "pto_kernels"]:
            del sys.modules[name]
        sys.modules.update(saved)


def test_every_reference_option_spelling_parses(monkeypatch, tmp_path: Path):
    seen = []

    def capture(options):
        seen.append(options)
        raise PtoPatchError("stopped by the test")

    monkeypatch.setattr(verify, "run_verify", capture)
    reference = [
        "--model_path", str(tmp_path), "--use_pto", "--output_length", "7", "--use_compile", "--backend",
        "eager", "--mode", "default", "--use_acl_graph", "--use_dynamic_config", "--simple_prompt",
        "--device", "0", "--warmup", "2", "--iters", "3", "--batch", "4", "--dtype", "fp16",
        "--prompt", "hi", "--ops", "mrope", "--report_file", str(tmp_path / "r.json"),
        "--allow_modified", "--kernel_backend", "torch", "--atol", "0.5", "--rtol", "0.25", "--strict",
    ]  # fmt: skip
    dashed = [
        "--model-path", str(tmp_path), "--use-pto", "--output-length", "7", "--use-compile", "--backend",
        "eager", "--mode", "default", "--use-acl-graph", "--use-dynamic-config", "--simple-prompt",
        "--device", "0", "--warmup", "2", "--iters", "3", "--batch", "4", "--dtype", "fp16",
        "--prompt", "hi", "--ops", "mrope", "--report-file", str(tmp_path / "r.json"),
        "--allow-modified", "--kernel-backend", "torch", "--atol", "0.5", "--rtol", "0.25", "--strict",
    ]  # fmt: skip
    for argv in (reference, dashed):
        with pytest.raises(SystemExit) as stopped:
            cli.main(["verify", *argv])
        assert stopped.value.code == 1
    assert len(seen) == 2 and seen[0] == seen[1]
    options = seen[0]
    assert options.model_path == tmp_path and options.use_pto and options.output_length == 7
    assert options.use_compile and options.compile_backend == "eager" and options.compile_mode == "default"
    assert options.use_acl_graph and options.use_dynamic_config and options.simple_prompt
    assert (options.device, options.warmup, options.iters, options.batch) == ("0", 2, 3, 4)
    assert (options.dtype, options.prompt, options.ops) == ("fp16", "hi", "mrope")
    assert options.report_file == tmp_path / "r.json" and options.allow_modified and options.strict
    assert (options.kernel_backend, options.atol, options.rtol) == ("torch", 0.5, 0.25)

    with pytest.raises(SystemExit):
        cli.main(["verify"])
    defaults = seen[-1]
    assert (defaults.warmup, defaults.iters, defaults.batch, defaults.output_length) == (5, 5, 1, 50)
    assert defaults.dtype == "bf16" and not defaults.use_pto and defaults.prompt is None


# --- end to end -----------------------------------------------------------------------------------


def test_apply_then_verify_passes_text_and_report_has_every_key(patched_tiny: Path, tmp_path: Path):
    report_file = tmp_path / "out" / "report.json"
    done = run_process(
        [
            "verify",
            "--model-path",
            str(patched_tiny),
            "--use_pto",
            "--json",
            "--report-file",
            str(report_file),
        ]
        + FAST,
        tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:] + done.stdout[-3000:]
    printed = json_out(done)
    written = json.loads(report_file.read_text(encoding="utf-8"))
    for doc in (printed, written):
        assert REPORT_KEYS <= set(doc)
        assert MODE_KEYS <= set(doc["baseline"]) and MODE_KEYS <= set(doc["pto"])
        assert ACCURACY_KEYS <= set(doc["accuracy"])
        assert {"missing_keys", "unexpected_keys"} <= set(doc["load_info"])
        assert {"pto_patch", "torch", "transformers"} <= set(doc["versions"])
        assert set(doc["pto"]["ops"]) == set(OPS)  # every op is reported, switched on or not
        for entry in doc["pto"]["ops"].values():
            assert {"backend", "calls", "fallbacks"} <= set(entry)
    assert printed["passed"] is True and printed["failures"] == [] and printed["command"] == "verify"
    assert printed["input"]["kind"] == "text" and printed["dtype"] == "bfloat16"
    assert printed["switched_on"] == ["rms_norm", "mrope", "swiglu_mlp"]  # a run's default
    assert all(printed["pto"]["ops"][op]["calls"] > 0 for op in printed["switched_on"])
    assert printed["pto_kernels_path"] == str((patched_tiny / "pto_kernels").resolve())
    assert printed["load_info"]["missing_keys"] == [] and printed["load_info"]["unexpected_keys"] == []
    assert printed["baseline"]["tokens"] == 8 and printed["pto"]["tokens"] == 8
    assert printed["other_patchers"] == []  # a clean patched model: only the guards decide
    assert math.isfinite(printed["accuracy"]["max_abs_logit_diff"])


def test_apply_then_verify_passes_with_an_image(patched_tiny: Path, tmp_path: Path):
    image = tmp_path / "page.png"
    sample_image(112, 84).save(image)
    done = run_process(
        [
            "verify",
            "--model-path",
            str(patched_tiny),
            "--use_pto",
            "--image",
            str(image),
            "--json",
            "--dtype",
            "fp32",
        ]
        + FAST,
        tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:] + done.stdout[-3000:]
    doc = json_out(done)
    assert doc["passed"] and doc["input"]["kind"] == "image" and doc["input"]["image_tokens"] == 12
    assert doc["input"]["prompt"] == OCR_PROMPT
    assert all(doc["pto"]["ops"][op]["calls"] > 0 for op in doc["switched_on"])
    assert doc["accuracy"]["text_equal"] is True and doc["accuracy"]["token_match_rate"] == 1.0


def test_a_wrong_kernel_fails_with_exit_3(patched_copy: Path, tmp_path: Path):
    with open(patched_copy / "pto_kernels" / "__init__.py", "a", encoding="utf-8") as handle:
        handle.write(WRONG_RMS_NORM)
    done = run_process(
        [
            "verify",
            "--model-path",
            str(patched_copy),
            "--use_pto",
            "--allow-modified",
            "--json",
            "--ops",
            "rms_norm",
        ]
        + FAST,
        tmp_path,
    )
    assert done.returncode == 3, done.stderr[-3000:] + done.stdout[-3000:]
    doc = json_out(done)
    assert doc["passed"] is False and doc["accuracy"]["passed"] is False
    assert any("logits differ" in failure for failure in doc["failures"])
    assert doc["allow_modified"] is True and doc["modified_files"] == ["pto_kernels/__init__.py"]
    assert doc["pto"]["ops"]["rms_norm"]["calls"] > 0


WRONG_MLP_BLOCK = """

_correct_mlp_block_wrapper = mlp_block_wrapper


def mlp_block_wrapper(residual, attn_output, o_proj, norm, mlp):
    return _correct_mlp_block_wrapper(residual, attn_output, o_proj, norm, mlp) * 1.25
"""


def test_the_decoder_blocks_pass_verify_and_report_their_calls_per_layer(patched_tiny: Path, tmp_path: Path):
    done = run_process(
        ["verify", "--model-path", str(patched_tiny), "--use_pto", "--ops", "all", "--json"] + FAST, tmp_path
    )
    assert done.returncode == 0, done.stderr[-3000:] + done.stdout[-3000:]
    doc = json_out(done)
    ops, layers = doc["pto"]["ops"], 2  # make-tiny's decoder layers
    assert doc["passed"] and doc["accuracy"]["token_match_rate"] == 1.0
    for block in ("attention_prologue", "mlp_block"):
        assert ops[block]["calls"] > 0 and ops[block]["calls_per_layer"] == ops[block]["calls"] / layers
    # the ops whose work a block does are switched on too, and reported as run inside it, not as failures
    assert ops["mrope"]["calls"] == 0 and ops["mrope"]["inside"] == "attention_prologue"
    assert ops["swiglu_mlp"]["inside"] == ops["residual_rms_norm"]["inside"] == "mlp_block"
    assert ops["rms_norm"]["calls"] > 0 and ops["rms_norm"]["inside"] is None  # the final and vision norms
    assert not any("never ran" in failure for failure in doc["failures"])


def test_a_wrong_decoder_block_fails_with_exit_3(patched_copy: Path, tmp_path: Path):
    with open(patched_copy / "pto_kernels" / "__init__.py", "a", encoding="utf-8") as handle:
        handle.write(WRONG_MLP_BLOCK)
    args = ["verify", "--model-path", str(patched_copy), "--use_pto", "--allow-modified", "--json"]
    done = run_process(args + ["--ops", "mlp_block"] + FAST, tmp_path)
    assert done.returncode == 3, done.stderr[-3000:] + done.stdout[-3000:]
    doc = json_out(done)
    assert doc["passed"] is False and any("logits differ" in failure for failure in doc["failures"])
    assert doc["pto"]["ops"]["mlp_block"]["calls"] > 0


def test_ops_the_folder_was_not_patched_with_are_refused_before_loading(tmp_path: Path, monkeypatch):
    folder = tmp_path / "partial"
    make_tiny(folder)
    engine.apply_patch(model_path=folder, ops="rms_norm")
    monkeypatch.setattr(loading, "load_model", lambda *a, **k: pytest.fail("loaded before refusing"))
    for command in ("verify", "bench", "tune"):
        with pytest.raises(PtoPatchError) as refused:
            run = {"verify": verify.run_verify, "bench": bench.run_bench}.get(command)
            if run is verify.run_verify:
                run(VerifyOptions(model_path=folder, ops="swiglu_mlp"))
            elif run is bench.run_bench:
                run(bench.BenchOptions(model_path=folder, ops="rms_norm,swiglu_mlp"))
            else:
                from pto_patch.tune.tuning import TuneOptions, run_tune

                run_tune(TuneOptions(model_path=folder, ops="swiglu_mlp"))
        error = refused.value
        assert error.exit_code == EXIT_USAGE, command
        assert (
            "patched with rms_norm only" in error.message and "swiglu_mlp is not patched in" in error.message
        )
        assert f"apply --model-path {folder.resolve()} --ops rms_norm,swiglu_mlp" in error.hint
    # `all` is every op patched in: nothing to refuse
    from pto_patch.model.spec import OpsAsked

    state = check_folder(folder.resolve(), use_pto=True, allow_modified=False)
    spec = load_spec("gutenocr_3b")
    assert OpsAsked.read("all", spec).may_switch_on(spec, state.patched_ops) == ("rms_norm",)


def test_a_switched_on_op_that_never_runs_fails_with_exit_3(tmp_path: Path):
    folder = tmp_path / "partial"
    make_tiny(folder)
    engine.apply_patch(model_path=folder, ops="rms_norm,swiglu_mlp")  # no MRoPE injection in the code
    manifest = folder / MANIFEST_DIR / "manifest.json"  # a manifest that claims MRoPE: its guard is absent
    data = json.loads(manifest.read_text())
    data["ops"] = ["rms_norm", "mrope", "swiglu_mlp"]
    manifest.write_text(json.dumps(data))
    done = run_process(
        ["verify", "--model-path", str(folder), "--use_pto", "--ops", "rms_norm,mrope,swiglu_mlp", "--json"]
        + FAST,
        tmp_path,
    )
    assert done.returncode == 3, done.stderr[-3000:] + done.stdout[-3000:]
    doc = json_out(done)
    assert doc["pto"]["ops"]["mrope"]["switched_on"] and doc["pto"]["ops"]["mrope"]["calls"] == 0
    assert any(failure.startswith("mrope") and "never ran" in failure for failure in doc["failures"])
    assert doc["pto"]["ops"]["rms_norm"]["calls"] > 0


def test_a_tampered_modeling_file_is_refused(patched_copy: Path, capsys):
    with open(patched_copy / "modeling_qwen2_5_vl.py", "a", encoding="utf-8") as handle:
        handle.write("\nprint('not what apply wrote')\n")
    assert run_cli("verify", "--model-path", str(patched_copy), "--use_pto", *FAST) == 1
    out, err = capsys.readouterr()
    assert "modeling_qwen2_5_vl.py" in err and "--allow-modified" in err
    assert "not what apply wrote" not in out  # the code never ran


def test_missing_checkpoint_keys_fail(patched_copy: Path, tmp_path: Path):
    from safetensors.torch import load_file, save_file

    index_path = patched_copy / "model.safetensors.index.json"
    index = json.loads(index_path.read_text(encoding="utf-8"))
    key = next(name for name in sorted(index["weight_map"]) if name.endswith("mlp.gate_proj.weight"))
    shard = patched_copy / index["weight_map"][key]
    tensors = load_file(shard)
    tensors[key.replace("gate_proj", "gate_projection")] = tensors.pop(key)
    save_file(tensors, shard, metadata={"format": "pt"})
    index["weight_map"][key.replace("gate_proj", "gate_projection")] = index["weight_map"].pop(key)
    index_path.write_text(json.dumps(index), encoding="utf-8")

    done = run_process(["verify", "--model-path", str(patched_copy), "--use_pto", "--json"] + FAST, tmp_path)
    assert done.returncode == 3, done.stderr[-3000:] + done.stdout[-3000:]
    doc = json_out(done)
    layer = key.split(".layers.")[1].split(".")[0]
    assert any(f"layers.{layer}.mlp.gate_proj" in name for name in doc["load_info"]["missing_keys"])
    assert any("gate_projection" in name for name in doc["load_info"]["unexpected_keys"])
    assert any("missing" in failure for failure in doc["failures"])


def _change_checkpoint(folder: Path, change) -> None:
    """Apply `change(tensors, weight_map)` to the shard holding the embeddings, and save shard and index."""
    from safetensors.torch import load_file, save_file

    index_path = folder / "model.safetensors.index.json"
    index = json.loads(index_path.read_text(encoding="utf-8"))
    embed = next(name for name in index["weight_map"] if name.endswith("embed_tokens.weight"))
    shard = folder / index["weight_map"][embed]
    tensors = load_file(shard)
    change(tensors, index["weight_map"], embed)
    save_file(tensors, shard, metadata={"format": "pt"})
    index_path.write_text(json.dumps(index), encoding="utf-8")


def test_load_failures_name_every_kind_of_bad_load():
    assert load_failures(LoadInfo([], [], [], None)) == []
    assert load_failures(LoadInfo([], [], [], True)) == []
    untied = load_failures(LoadInfo([], [], [], lm_head_tied=False))
    assert untied == ["config ties lm_head to the embeddings, but the loaded lm_head is a separate tensor"]
    assert not LoadInfo([], [], [], lm_head_tied=False).ok
    mismatched = load_failures(LoadInfo([], [], ["a.weight", "b.weight"], None))
    assert len(mismatched) == 1 and mismatched[0].startswith("2 checkpoint key(s) with mismatched shapes")
    assert "a.weight" in mismatched[0]


def test_a_config_tied_lm_head_loaded_as_its_own_tensor_fails(patched_copy: Path, tmp_path: Path):
    """The GutenOCR #5 trap: config.json ties lm_head, but the model runs a separate lm_head tensor.

    A checkpoint that carries `lm_head.weight` with values of its own does that: transformers 5 then
    leaves the two untied and reports no missing or unexpected key, and the baseline and PTO runs agree.
    """

    def add_own_lm_head(tensors, weight_map, embed):
        tensors["lm_head.weight"] = (0.5 - tensors[embed].float()).to(tensors[embed].dtype)
        weight_map["lm_head.weight"] = weight_map[embed]

    _change_checkpoint(patched_copy, add_own_lm_head)
    assert json.loads((patched_copy / "config.json").read_text(encoding="utf-8"))["tie_word_embeddings"]
    done = run_process(["verify", "--model-path", str(patched_copy), "--use_pto", "--json"] + FAST, tmp_path)
    assert done.returncode == 3, done.stderr[-3000:] + done.stdout[-3000:]
    doc = json_out(done)
    assert doc["load_info"]["lm_head_tied"] is False
    assert doc["load_info"]["missing_keys"] == doc["load_info"]["unexpected_keys"] == []
    assert doc["failures"] == [
        "config ties lm_head to the embeddings, but the loaded lm_head is a separate tensor"
    ]
    assert doc["accuracy"]["passed"] is True  # agreement alone would have passed


def test_a_checkpoint_tensor_of_the_wrong_shape_fails(patched_copy: Path, tmp_path: Path):
    def cut_one_row(tensors, weight_map, embed):
        tensors[embed] = tensors[embed][:-1].clone()

    _change_checkpoint(patched_copy, cut_one_row)
    done = run_process(["verify", "--model-path", str(patched_copy), "--json"] + FAST, tmp_path)
    assert done.returncode == 3, done.stderr[-3000:] + done.stdout[-3000:]
    doc = json_out(done)
    embed = doc["load_info"]["mismatched_keys"]
    assert len(embed) == 1 and embed[0].endswith("embed_tokens.weight")
    failure = next(f for f in doc["failures"] if "mismatched shapes" in f)
    assert failure.startswith("1 checkpoint key(s)") and embed[0] in failure


def test_a_kernel_call_while_every_switch_is_off_fails(patched_tiny: Path, tmp_path: Path):
    done = run_process(
        ["verify", "--model-path", str(patched_tiny), "--use_pto", "--json"] + FAST,
        tmp_path,
        after_load=STRAY_GUARD_CALL,
    )
    assert done.returncode == 3, done.stderr[-3000:] + done.stdout[-3000:]
    doc = json_out(done)
    stray = [f for f in doc["failures"] if f.startswith("kernels ran with every switch off: ")]
    assert len(stray) == 1 and "'rms_norm'" in stray[0]
    assert "mrope" not in stray[0] and "swiglu_mlp" not in stray[0]
    assert doc["other_patchers"] == []  # hooks leave the guarded forward in place


@pytest.mark.parametrize("kind", ["folder", "not an image", "truncated"])
def test_a_bad_image_is_refused_before_the_model_loads(
    kind: str, patched_tiny: Path, tmp_path: Path, monkeypatch, capsys
):
    image = tmp_path / "page.png"
    if kind == "folder":
        image.mkdir()
    elif kind == "not an image":
        image.write_text("a page of text, not of pixels\n", encoding="utf-8")
    else:
        sample_image(56, 56).save(image)
        image.write_bytes(image.read_bytes()[:-40])

    def no_load(*args, **kwargs):
        raise AssertionError("the model was loaded before the image was checked")

    monkeypatch.setattr(loading, "load_model", no_load)
    with pytest.raises(SystemExit) as stopped:
        cli.main(["verify", "--model-path", str(patched_tiny), "--image", str(image), "--json"])
    error = json.loads(capsys.readouterr().out)
    assert stopped.value.code == error["exit_code"] == EXIT_ERROR
    expected = "is not a file" if kind == "folder" else "is not an image PIL can read ("
    assert error["error"].startswith(f"--image {image} {expected}"), error
    assert "\n" not in error["error"] and "PNG or JPEG" in error["hint"]


def test_dynamic_config_switches_on_by_batch(patched_tiny: Path, tmp_path: Path):
    done = run_process(
        ["verify", "--model-path", str(patched_tiny), "--use_pto", "--use_dynamic_config", "--batch", "5"]
        + FAST
        + ["--json"],
        tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:] + done.stdout[-3000:]
    doc = json_out(done)
    assert doc["switched_on"] == ["swiglu_mlp"]
    assert {row["op"]: row["enabled"] for row in doc["dynamic_config"]} == {
        "swiglu_mlp": True,
        "mrope": False,
        "rms_norm": False,
    }
    assert doc["pto"]["ops"]["mrope"]["calls"] == 0 and doc["pto"]["ops"]["swiglu_mlp"]["calls"] > 0
    assert doc["baseline"]["tokens"] == 5 * 8


def test_verify_compares_by_default_and_a_baseline_only_run_never_passes(patched_tiny: Path, tmp_path: Path):
    done = run_process(["verify", "--model-path", str(patched_tiny), "--json"] + FAST, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    doc = json_out(done)  # no --use_pto: compared all the same
    assert doc["compared"] and doc["passed"] is True and doc["accuracy"] is not None
    assert doc["switched_on"] == ["rms_norm", "mrope", "swiglu_mlp"]
    alone = run_process(["verify", "--model-path", str(patched_tiny), "--baseline-only"] + FAST, tmp_path)
    assert alone.returncode == 0, alone.stderr[-3000:]
    assert "PASSED" not in alone.stdout and "BASELINE ONLY" in alone.stdout
    both = run_process(
        ["verify", "--model-path", str(patched_tiny), "--baseline-only", "--use_pto"], tmp_path
    )
    assert both.returncode == EXIT_USAGE and "--baseline-only and --use_pto" in both.stderr


def test_an_unpatched_folder_is_refused_unless_baseline_only(tmp_path: Path):
    folder = tmp_path / "plain"
    make_tiny(folder)
    refused = run_process(["verify", "--model-path", str(folder)] + FAST, tmp_path)
    assert (
        refused.returncode == 1
        and "pto-patch apply" in refused.stderr
        and "--baseline-only" in refused.stderr
    )
    done = run_process(["verify", "--model-path", str(folder), "--baseline-only", "--json"] + FAST, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    doc = json_out(done)
    assert doc["pto"] is None and doc["accuracy"] is None
    assert doc["passed"] is None and doc["compared"] is False  # no verdict for a comparison not made


# --- other patchers -------------------------------------------------------------------------------


def test_other_patcher_checks_fail_only_switched_on_ops():
    bypass = OtherPatcher("swiglu_mlp", "model.layers.0.mlp", "forward set on the instance: x.f", True)
    through = OtherPatcher("rms_norm", "model.norm", "forward set on the instance, still guarded", False)
    failures, warnings = other_patcher_checks([bypass, bypass, through], ("swiglu_mlp",))
    assert len(failures) == 1 and failures[0].startswith("swiglu_mlp: 2 module(s) bypass")
    assert "model.layers.0.mlp" in failures[0] and OTHER_PATCHER_HINT in failures[0]
    assert len(warnings) == 1 and "model.norm" in warnings[0]
    failures, warnings = other_patcher_checks([bypass], ("rms_norm",))
    assert failures == [] and "swiglu_mlp" in warnings[0]
    assert other_patcher_checks([], ("swiglu_mlp",)) == ([], [])


def test_an_instance_forward_replaced_after_loading_fails_verify(patched_tiny: Path, tmp_path: Path):
    done = run_process(
        ["verify", "--model-path", str(patched_tiny), "--use_pto", "--json"] + FAST,
        tmp_path,
        after_load=PATCH_ONE_MLP,
    )
    assert done.returncode == 3, done.stderr[-3000:] + done.stdout[-3000:]
    doc = json_out(done)
    assert doc["other_patchers"] == [
        {
            "op": "swiglu_mlp",
            "module": "model.language_model.layers.0.mlp",
            "how": doc["other_patchers"][0]["how"],
            "bypasses": True,
        }
    ]
    assert doc["other_patchers"][0]["how"].startswith("forward set on the instance")
    failure = next(f for f in doc["failures"] if f.startswith("swiglu_mlp:"))
    assert "1 module(s)" in failure and "model.language_model.layers.0.mlp" in failure
    assert OTHER_PATCHER_HINT in failure


def test_a_class_forward_replaced_after_import_fails_verify(patched_tiny: Path, tmp_path: Path):
    done = run_process(
        ["verify", "--model-path", str(patched_tiny), "--use_pto", "--json"] + FAST,
        tmp_path,
        after_load=PATCH_RMS_NORM_CLASS,
    )
    assert done.returncode == 3, done.stderr[-3000:] + done.stdout[-3000:]
    doc = json_out(done)
    modules = [entry["module"] for entry in doc["other_patchers"]]
    assert {entry["op"] for entry in doc["other_patchers"]} == {"rms_norm"}
    assert all(
        entry["bypasses"] and entry["how"].startswith("class forward replaced")
        for entry in doc["other_patchers"]
    )
    assert "model.language_model.norm" in modules
    assert any(module.startswith("model.visual.") for module in modules)  # the vision tower's norms too
    failure = next(f for f in doc["failures"] if f.startswith("rms_norm:"))
    assert f"{len(modules)} module(s)" in failure


def test_baseline_only_another_patcher_is_a_warning(patched_tiny: Path, tmp_path: Path):
    done = run_process(
        ["verify", "--model-path", str(patched_tiny), "--baseline-only"] + FAST,
        tmp_path,
        after_load=PATCH_ONE_MLP,
    )
    assert done.returncode == 0, done.stderr[-3000:] + done.stdout[-3000:]
    assert "other patchers: swiglu_mlp: 1 module(s) bypass the guard" in " ".join(done.stdout.split())
    assert "warning: swiglu_mlp: 1 module(s) bypass the injected guard" in " ".join(done.stderr.split())
