"""pto-patch verify --engine vllm through vLLM itself: the vLLM lane (.ci/vllm_lane builds its environment).

Skipped where vLLM does not import (the main test environment). Each verify runs vLLM twice, each run in a
process of its own, on a tiny Qwen2.5-VL whose head_dim (64) vLLM's CPU attention takes. Between them the
tests cover eager and compiled mode, text and one image, and the multi-process engine (with a sabotaged
kernel, whose calls are counted in vLLM's worker process).
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

from pto_patch.hub.tiny_model import TextWidths, make_tiny
from pto_patch.resources import kernel_package_dir
from pto_patch.run.image_inputs import sample_image

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
    assert any("greedy tokens differ" in failure for failure in doc["failures"])
    assert doc["multiprocessing"] is True and doc["pto"]["workers_in_engine_process"] is False
    assert all(doc["pto"]["ops"][op]["calls"] > 0 for op in OPS)  # counted in the worker process
    assert doc["pto_kernels_path"] == str((sabotaged / "pto_kernels").resolve())


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
