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

from pto_patch import engine
from pto_patch.errors import EXIT_USAGE, PtoPatchError, SpecError
from pto_patch.tiny_model import TextWidths, make_tiny, model_config
from pto_patch.vllm_verify import VllmVerifyOptions, compare_tokens, verify_with_vllm


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
    from pto_patch.spec import load_spec
    from pto_patch.tiny_model import _sizes

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
    assert done.returncode == 1 and "unknown op(s) gelu" in done.stderr and "Traceback" not in done.stderr


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
