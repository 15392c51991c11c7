"""pto-patch verify --engine vllm through vLLM itself: the vLLM lane (.ci/vllm_lane builds its environment).

Skipped where vLLM does not import (the main test environment). Each verify runs vLLM twice, each run in a
process of its own, on a tiny Qwen2.5-VL whose head_dim (64) vLLM's CPU attention takes, and judges both
against the transformers eager run of the same folder. Between them the tests cover eager and compiled
mode, text and one image, the multi-process engine (with a sabotaged kernel, whose calls are counted in
vLLM's worker process), and a fault in vLLM's own RMSNorm that only its baseline runs.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pto_patch.resources import kernel_package_dir
from pto_patch.run.image_inputs import sample_image
from pto_patch.tiny.model import TextWidths, make_tiny

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed here"),
]

OPS = ("rms_norm", "mrope", "swiglu_mlp")
FAST = ["--warmup", "0", "--iters", "1", "--output_length", "8", "--dtype", "fp32", "--json"]
# Every norm output with its hidden dimensions reversed: no greedy token survives it.
SABOTAGE = """

from .backends import fused as _fused, reference as _reference


def _reversed_rms_norm(x, weight, eps=1e-6):
    return _reference.rms_norm(x.flip(-1), weight, eps)


def _reversed_add_rms_norm(x, residual, weight, eps=1e-6):
    normed, summed = _reference.add_rms_norm(x, residual, weight, eps)
    return normed.flip(-1), summed


_fused.rms_norm, _fused.add_rms_norm = _reversed_rms_norm, _reversed_add_rms_norm
"""
# A sitecustomize for vLLM's engine process: vLLM's own RMSNorm (vllm/model_executor/layers/layernorm.py,
# `RMSNorm.forward_native`, which `CustomOp.forward_cpu` runs on a CPU) reverses its output once imported.
# The plugin's PtoRMSNorm never calls it with rms_norm on, so only vLLM's baseline is wrong.
VLLM_FAULT = """
import importlib.abc, importlib.util, sys

TARGET = "vllm.model_executor.layers.layernorm"


def _sabotage(module):
    native = module.RMSNorm.forward_native

    def reversed_native(self, x, residual=None):
        out = native(self, x, residual)
        return out.flip(-1) if residual is None else (out[0].flip(-1), out[1])

    module.RMSNorm.forward_native = reversed_native


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != TARGET:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            _sabotage(module)

        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _Finder())
"""


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("vllm") / "GutenOCR-tiny-hd64"
    make_tiny(folder, widths=TextWidths(hidden_size=256, heads=4, kv_heads=2))
    return folder


@pytest.fixture(scope="module")
def image(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("image") / "line.png"
    sample_image(112, 56).save(path)
    return path


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    for name in ("PTO_KERNELS_VLLM_OPS", "PTO_KERNELS_BACKEND", "GUTENOCR_MODEL_PATH"):
        env.pop(name, None)
    env.setdefault("OMP_NUM_THREADS", "2")
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB; vLLM's default 4 does not fit beside other jobs
    return {**env, **extra}


def _verify(args: list[str], tmp_path: Path, **extra: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "pto_patch", "verify", "--engine", "vllm", *args, *FAST]
    return subprocess.run(command, env=_env(tmp_path, **extra), capture_output=True, text=True, timeout=1500)


def _doc(done: subprocess.CompletedProcess) -> dict:
    assert done.stdout, done.stderr[-3000:]
    return json.loads(done.stdout)


def _assert_every_op_ran_and_tokens_agree(doc: dict) -> None:
    assert doc["passed"], doc["failures"]
    assert doc["switched_on"] == list(OPS)
    assert all(doc["pto"]["ops"][op]["calls"] > 0 for op in OPS), doc["pto"]["ops"]
    assert doc["baseline"]["ops"] == {}  # the plugin registered nothing, pto_kernels was never imported
    assert doc["accuracy"]["tokens_equal"] and doc["accuracy"]["token_match_rate"] == 1.0
    for key in ("RMSNorm", "SiluAndMul", "MRotaryEmbedding"):
        assert doc["pto"]["layers"][key]["pto"] == doc["pto"]["layers"][key]["built"] > 0
        assert doc["pto"]["registry"][key].startswith("pto_patch.serving.vllm_layers.Pto")
    assert doc["baseline"]["registry"] == {}
    # both vLLM runs judged against the transformers eager run, not against each other
    assert doc["reference"]["what"].startswith("the unpatched model through transformers")
    for run in ("baseline", "pto"):
        judged = doc["judged"][run]
        assert judged["passed"] and judged["steps_judged"] > 0, judged
        assert judged["worst_diff"] <= judged["worst_tolerance"]


def test_in_process_eager_text(tiny: Path, tmp_path: Path):
    done = _verify(["--model-path", str(tiny), "--use_pto"], tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    doc = _doc(done)
    _assert_every_op_ran_and_tokens_agree(doc)
    assert doc["multiprocessing"] is False and doc["compiled"] is False and doc["input"]["kind"] == "text"
    assert doc["pto"]["workers_in_engine_process"] is True
    assert doc["pto_kernels_path"] == str(kernel_package_dir().resolve())


def test_in_process_compiled_with_an_image(tiny: Path, image: Path, tmp_path: Path):
    args = ["--model-path", str(tiny), "--use_pto", "--use_compile", "--image", str(image)]
    done = _verify(args, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    doc = _doc(done)
    _assert_every_op_ran_and_tokens_agree(doc)
    assert doc["compiled"] is True and doc["multiprocessing"] is False
    assert doc["input"]["kind"] == "image" and doc["input"]["prompt_tokens"] > 8  # the image's tokens


def test_multi_process_with_a_sabotaged_kernel_fails_with_exit_3(tiny: Path, tmp_path: Path):
    """A copy of pto_kernels whose RMSNorm reverses its output, first on PYTHONPATH: the plugin imports it in
    vLLM's worker process, every op runs there, and the tokens no longer agree."""
    sabotaged = tmp_path / "sabotaged"
    shutil.copytree(kernel_package_dir(), sabotaged / "pto_kernels")
    with open(sabotaged / "pto_kernels" / "__init__.py", "a", encoding="utf-8") as handle:
        handle.write(SABOTAGE)
    args = ["--model-path", str(tiny), "--use_pto", "--kernel-backend", "fused", "--multiprocessing"]
    done = _verify(args, tmp_path, PYTHONPATH=str(sabotaged))
    assert done.returncode == 3, done.stderr[-3000:]
    doc = _doc(done)
    assert not doc["passed"] and not doc["accuracy"]["tokens_equal"]
    assert doc["judged"]["baseline"]["passed"] and not doc["judged"]["pto"]["passed"]
    assert any(
        failure.startswith("pto (vLLM): differs from the unpatched transformers eager model")
        and "the kernels switched on (rms_norm, mrope, swiglu_mlp)" in failure
        for failure in doc["failures"]
    ), doc["failures"]
    assert doc["multiprocessing"] is True and doc["pto"]["workers_in_engine_process"] is False
    assert all(doc["pto"]["ops"][op]["calls"] > 0 for op in OPS)  # counted in the worker process
    assert doc["pto_kernels_path"] == str((sabotaged / "pto_kernels").resolve())


def test_a_vllm_baseline_that_differs_from_eager_fails_naming_vllm(tiny: Path, tmp_path: Path):
    """vLLM's own RMSNorm reversed in its engine process: the baseline differs from the transformers eager
    run (exit 3, naming vLLM, not a kernel), while the PTO run, whose norms are pto_kernels', passes."""
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(VLLM_FAULT, encoding="utf-8")
    args = ["--model-path", str(tiny), "--use_pto", "--kernel-backend", "torch"]
    done = _verify(args, tmp_path, PYTHONPATH=str(hook))
    assert done.returncode == 3, done.stderr[-3000:]
    doc = _doc(done)
    assert not doc["judged"]["baseline"]["passed"] and doc["judged"]["pto"]["passed"], doc["judged"]
    assert len(doc["failures"]) == 1 and doc["failures"][0].startswith("baseline (vLLM)")
    assert "a fault of vLLM, not a kernel's" in doc["failures"][0]


def test_an_unknown_op_in_the_switch_stops_vllm_at_start_up(tiny: Path, tmp_path: Path):
    request = tmp_path / "request.json"
    request.write_text(json.dumps({"model_path": str(tiny), "prompt": "Hello", "dtype": "float32"}))
    command = [
        sys.executable,
        "-m",
        "pto_patch.serving.vllm_engine",
        str(request),
        str(tmp_path / "out.json"),
    ]
    env = _env(tmp_path, PTO_KERNELS_VLLM_OPS="rms_norm,rmsnorm", VLLM_ENABLE_V1_MULTIPROCESSING="0")
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode != 0 and not (tmp_path / "out.json").exists()
    assert "PTO_KERNELS_VLLM_OPS='rms_norm,rmsnorm' names unknown pto_kernels op(s) 'rmsnorm'" in done.stderr


def test_a_device_vllm_does_not_run_on_is_refused(tiny: Path, tmp_path: Path):
    done = _verify(["--model-path", str(tiny), "--device", "npu"], tmp_path)
    assert done.returncode == 1, done.stderr[-3000:]
    doc = _doc(done)
    assert "--device npu: vLLM here runs on cpu" in doc["error"] and "log" in doc["hint"]
