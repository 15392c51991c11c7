"""Hugging Face hub kernels and the patch, under transformers 5.25 (which turns them on at load by default).

Each scenario runs the real CLI (`pto_patch.cli.app.main`) in a fresh interpreter with the 5.25 env
(tests/release_envs.py) first on PYTHONPATH:
- no `kernels` package, as pip leaves 5.25 here: make-tiny, apply, `verify --use_pto --ops all`, restore;
- the stand-in `kernels` 0.19 (tests/stand_in_kernels/) with a mapping that replaces RMSNorm on this
  CPU, as the default mapping does on cuda: verify without --hub-kernels still runs every op through the
  guards; with --hub-kernels the report names what the hub kernels replaced, and PTO mode fails naming
  them; the baseline alone with --hub-kernels passes and names them too.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.release_envs import EnvUnavailable, release_env

REPO = Path(__file__).resolve().parents[1]
STAND_IN = Path(__file__).resolve().parent / "stand_in_kernels"
RELEASE = "5.25.0"
RUN_TIMEOUT_S = 300
VERIFY = ("verify", "--dtype", "fp32", "--warmup", "0", "--iters", "1", "--output_length", "4")

# Runs each CLI call in this interpreter; prints one JSON line: per call its exit code and report.
SCENARIO = r"""
import json, sys
from pathlib import Path

folder, calls = Path(sys.argv[1]), json.loads(sys.argv[2])
if "kernels" in json.loads(sys.argv[3]):
    import kernels

    # What the default mapping does to RMSNorm on cuda and rocm, mapped for this CPU.
    repo = kernels.LayerRepository("kernels-community/liger-kernels", layer_name="LigerRMSNorm", version=4)
    kernels.register_kernel_mapping({"RMSNorm": {"cpu": repo}})

import transformers
from pto_patch.cli.app import main
from tests.folder_snapshot import snapshot

facts = {"transformers": transformers.__version__, "kernels_from": None, "calls": []}
try:
    import kernels

    facts["kernels_from"] = kernels.__file__
except ImportError:
    pass
snapshots = {}
for index, argv in enumerate(calls):
    if argv == ["snapshot"]:
        snapshots[len(snapshots)] = snapshot(folder)
        continue
    report = folder.parent / f"report-{index}.json"
    argv = [a.replace("{folder}", str(folder)) for a in argv]
    if argv[0] == "verify":
        argv += ["--report-file", str(report)]
    try:
        main(argv)
    except SystemExit as exc:
        code = exc.code
    facts["calls"].append(
        {"argv": argv, "exit": code, "report": json.loads(report.read_text()) if report.is_file() else None}
    )
if len(snapshots) == 2:
    before, after = snapshots[0], snapshots[1]
    facts["restore_changed"] = sorted(p for p in before.keys() | after.keys() if before.get(p) != after.get(p))
print(json.dumps(facts))
"""


def run_scenario(tmp_path: Path, calls: list[list[str]], *, stand_in: bool) -> dict:
    try:
        env = release_env(RELEASE)
    except EnvUnavailable as exc:
        pytest.skip(str(exc))
    paths = [str(STAND_IN)] if stand_in else []
    variables = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([*paths, str(env.site), str(REPO)]),
        "PYTHONNOUSERSITE": "1",
        "HF_HOME": str(tmp_path / "hf"),
        "HF_MODULES_CACHE": str(tmp_path / "hf" / "modules"),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "TRANSFORMERS_VERBOSITY": "error",
    }
    for name in ("PTO_KERNELS_BACKEND", "PTO_KERNELS_STRICT", "GUTENOCR_MODEL_PATH", "USE_HUB_KERNELS"):
        variables.pop(name, None)
    done = subprocess.run(
        [sys.executable, "-c", SCENARIO, str(tmp_path / "GutenOCR-tiny"), json.dumps(calls),
         json.dumps(["kernels"] if stand_in else [])],
        capture_output=True, text=True, env=variables, cwd=tmp_path, timeout=RUN_TIMEOUT_S,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    facts = json.loads(done.stdout.strip().splitlines()[-1])
    assert facts["transformers"] == RELEASE
    return facts


def calls_of(report: dict) -> dict[str, int]:
    return {op: entry["calls"] for op, entry in report["pto"]["ops"].items()}


@pytest.mark.slow
def test_without_kernels_apply_verify_every_op_and_restore(tmp_path: Path):
    facts = run_scenario(
        tmp_path,
        [["make-tiny", "{folder}"], ["snapshot"], ["apply", "--model-path", "{folder}"],
         [*VERIFY, "--model-path", "{folder}", "--use_pto", "--ops", "all"],
         ["restore", "--model-path", "{folder}"], ["snapshot"]],
        stand_in=False,
    )  # fmt: skip
    assert facts["kernels_from"] is None  # as pip leaves 5.25 here: no `kernels`
    make_tiny, apply, verify, restore = facts["calls"]
    assert make_tiny["exit"] == apply["exit"] == restore["exit"] == 0, facts
    report = verify["report"]
    assert verify["exit"] == 0 and report["passed"], report["failures"]
    assert report["versions"]["transformers"] == RELEASE
    assert report["load_info"]["hub_kernels"].startswith("off (loaded with use_kernels=False")
    assert report["other_patchers"] == []
    ran = calls_of(report)
    # every op ran, itself or inside the decoder-layer block that covers it
    assert all(count > 0 or report["pto"]["ops"][op]["inside"] for op, count in ran.items()), ran
    assert ran["rms_norm"] > 0
    assert facts["restore_changed"] == []


@pytest.mark.slow
def test_hub_kernels_that_replace_rms_norm_stay_out_unless_asked_for(tmp_path: Path):
    folder = "{folder}"
    facts = run_scenario(
        tmp_path,
        [["make-tiny", folder], ["apply", "--model-path", folder],
         [*VERIFY, "--model-path", folder, "--use_pto"],
         [*VERIFY, "--model-path", folder, "--use_pto", "--hub-kernels"],
         [*VERIFY, "--model-path", folder, "--baseline-only", "--hub-kernels"]],
        stand_in=True,
    )  # fmt: skip
    assert facts["kernels_from"].startswith(str(STAND_IN))
    _, _, guards_only, pto_beside_hub, baseline_beside_hub = facts["calls"]

    # The default: hub kernels off at load, so the guards decide and PTO mode runs its ops.
    report = guards_only["report"]
    assert guards_only["exit"] == 0 and report["passed"], report["failures"]
    assert report["load_info"]["hub_kernels"].startswith("off")
    assert report["other_patchers"] == []
    ran = calls_of(report)
    assert "rms_norm" in report["switched_on"]
    assert all(ran[op] > 0 for op in report["switched_on"]), ran

    # Asked for: the report says what they replaced, and PTO mode fails naming the op and the layers.
    report = pto_beside_hub["report"]
    assert pto_beside_hub["exit"] == 3 and not report["passed"]
    assert "RMSNorm -> " in report["load_info"]["hub_kernels"]
    assert "LigerRMSNorm" in report["load_info"]["hub_kernels"]
    bypassed = [p for p in report["other_patchers"] if p["bypasses"]]
    assert bypassed and {p["op"] for p in bypassed} == {"rms_norm"}, report["other_patchers"]
    assert any(p["module"].endswith("input_layernorm") for p in bypassed)
    assert any(f.startswith("rms_norm: ") and "drop --hub-kernels" in f for f in report["failures"]), report[
        "failures"
    ]

    # The baseline alone beside them: nothing is switched on, so it runs (no verdict: it compared nothing),
    # and says what they replaced.
    report = baseline_beside_hub["report"]
    assert baseline_beside_hub["exit"] == 0 and report["compared"] is False, report["failures"]
    assert report["passed"] is None and report["failures"] == []
    assert report["load_info"]["hub_kernels"] == pto_beside_hub["report"]["load_info"]["hub_kernels"]
    assert any("fails verify --use_pto" in w for w in report["warnings"]), report["warnings"]


def test_hub_kernels_without_a_kernels_package_is_a_usage_error(tmp_path: Path, capsys, monkeypatch):
    """Without a `kernels` transformers can use (here: none importable, as after `pip install --no-deps`):
    one line, exit 2."""
    import importlib.metadata

    from transformers.utils import import_utils

    from pto_patch.cli.app import main
    from pto_patch.patching import engine
    from pto_patch.tiny.model import make_tiny

    monkeypatch.setitem(sys.modules, "kernels", None)  # `import kernels` fails, as if not installed
    monkeypatch.setattr(import_utils, "is_kernels_available", lambda *a, **k: False)
    version = importlib.metadata.version

    def no_kernels(name):
        if name == "kernels":
            raise importlib.metadata.PackageNotFoundError(name)
        return version(name)

    monkeypatch.setattr(importlib.metadata, "version", no_kernels)

    make_tiny(tmp_path / "tiny")
    engine.apply_patch(model_path=tmp_path / "tiny")
    kernels_before = sys.modules.get("pto_kernels")
    with pytest.raises(SystemExit) as exit_info:
        main(
            [
                "verify",
                "--model-path",
                str(tmp_path / "tiny"),
                "--use_pto",
                "--hub-kernels",
                "--dtype",
                "fp32",
            ]
        )
    assert exit_info.value.code == 2
    # refused before the folder's kernels were imported
    assert sys.modules.get("pto_kernels") is kernels_before
    err = capsys.readouterr().err
    assert "--hub-kernels: no `kernels` package is installed" in err
    assert "pip install 'kernels>=0.19.1,<0.20'" in err
    assert "Traceback" not in err
