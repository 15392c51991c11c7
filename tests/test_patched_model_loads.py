"""After apply, the tiny model loads as remote code with every checkpoint weight, and computes what
the stock transformers class computes. Each check runs in a fresh process, since transformers
caches remote code per process and per modules folder."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

LOAD_AND_COMPARE = r"""
import json, sys
import torch
from transformers import AutoModelForImageTextToText, Qwen2_5_VLForConditionalGeneration

folder = sys.argv[1]
patched, info = AutoModelForImageTextToText.from_pretrained(
    folder, trust_remote_code=True, output_loading_info=True, attn_implementation="eager", dtype=torch.float32
)
stock = Qwen2_5_VLForConditionalGeneration.from_pretrained(folder, attn_implementation="eager", dtype=torch.float32)
ids = torch.tensor([[1, 5, 9, 42, 7, 3, 11, 2]])
with torch.no_grad():
    off = patched(input_ids=ids).logits
    reference = stock(input_ids=ids).logits
sys.path.insert(0, folder)
import pto_kernels
pto_kernels.reset_stats()
with pto_kernels.enabled(backend="torch"), torch.no_grad():
    on = patched(input_ids=ids).logits
print(json.dumps({
    "class": type(patched).__name__,
    "module": type(patched).__module__,
    "kernels_from": pto_kernels.__file__,
    "missing": sorted(info["missing_keys"]),
    "unexpected": sorted(info["unexpected_keys"]),
    "max_diff_off": (off - reference).abs().max().item(),
    "max_diff_on": (on - reference).abs().max().item(),
    "calls": {op: s["calls"] for op, s in pto_kernels.stats().items()},
    "logit_std": reference.std().item(),
}))
"""


def run_fresh(script: str, folder: Path, tmp_path: Path) -> dict:
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(
        [sys.executable, "-c", script, str(folder)], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_patched_tiny_model_loads_every_weight_and_matches_stock(patched_tiny: Path, tmp_path: Path):
    result = run_fresh(LOAD_AND_COMPARE, patched_tiny, tmp_path)
    assert result["class"] == "GutenOcr3BVLForConditionalGeneration"
    assert result["module"].startswith("transformers_modules.")
    assert result["kernels_from"].startswith(str(patched_tiny))
    assert result["missing"] == [] and result["unexpected"] == []
    assert result["logit_std"] > 0.1  # a model that says something, not a constant
    assert result["max_diff_off"] == 0.0  # switches off: the original code runs unchanged
    assert result["max_diff_on"] < 1e-4
    assert all(result["calls"][op] > 0 for op in ("rms_norm", "mrope", "swiglu_mlp")), result[
        "calls"
    ]  # enabled()
