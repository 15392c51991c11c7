"""The Qwen3-VL family end to end, on every transformers release of the matrix that ships models/qwen3_vl.

Per release, in fresh interpreters with that release first on PYTHONPATH (tests/release_envs.py; the venv's
own release needs none): make-tiny of qwen3_vl_4b_instruct, apply every op the family takes, load the
patched folder as remote code beside the stock Qwen3VLForConditionalGeneration and compare logits (switches
off: exactly equal; each group on with the torch backend: close, every op called, q_norm / k_norm among the
RMSNorm calls), then `pto-patch verify --use_pto --ops all` with an image through the CLI, then restore, which
must give the folder back byte for byte.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.folder_snapshot import snapshot
from tests.helpers.cli import run_cli
from tests.release_envs import EnvUnavailable, release_env
from tests.release_sources import RELEASES

pytest.importorskip("torch")
pytest.importorskip("transformers")

REPO = Path(__file__).resolve().parents[1]
MODEL = "qwen3_vl_4b_instruct"
FAMILY_FROM = (4, 57)  # the first release with models/qwen3_vl
RUN_TIMEOUT_S = 600
INSTALLED = importlib.metadata.version("transformers")
MATRIX = tuple(
    r for r in dict.fromkeys((*RELEASES, INSTALLED)) if tuple(map(int, r.split(".")[:2])) >= FAMILY_FROM
)

# Under the release: make-tiny, apply, logits against the stock class. Prints one JSON line of facts.
LOAD_AND_COMPARE = r"""
import json, sys
from pathlib import Path
import torch, transformers
from pto_patch.tiny.model import make_tiny
from pto_patch.patching import engine
from pto_patch.patching.manifest import Manifest
from pto_patch.run.hub_kernels import load_arguments
from pto_patch.run.image_inputs import build_inputs, sample_image
from tests.folder_snapshot import snapshot

model, folder = sys.argv[1], Path(sys.argv[2])
make_tiny(folder, model=model)
facts = {"version": transformers.__version__, "before": snapshot(folder)}
engine.apply_patch(model_path=folder, model=model, ops="all")
manifest = Manifest.load(folder)
facts["manifest_release"], facts["ops"] = manifest.transformers_release, list(manifest.ops)
config = json.loads((folder / "config.json").read_text())["text_config"]
import ast, importlib.util


def classes(path):
    return {node.name for node in ast.walk(ast.parse(Path(path).read_text())) if isinstance(node, ast.ClassDef)}


stock_dir = Path(importlib.util.find_spec("transformers.models.qwen3_vl").submodule_search_locations[0])
stock_names = classes(stock_dir / "modeling_qwen3_vl.py") | classes(stock_dir / "configuration_qwen3_vl.py")
written = classes(folder / "modeling_qwen3_vl.py") | classes(folder / "configuration_qwen3_vl.py")
facts["classes_sharing_a_transformers_name"] = sorted(
    name for name in written if name in stock_names or hasattr(transformers, name)
)

from transformers import AutoModelForImageTextToText, Qwen3VLForConditionalGeneration

load_kwargs = {"dtype": torch.float32} if int(transformers.__version__.split(".")[0]) >= 5 else {"torch_dtype": torch.float32}
load_kwargs |= load_arguments(False)  # 5.25 kernelizes by default and refuses without `kernels` installed
patched, info = AutoModelForImageTextToText.from_pretrained(
    str(folder), trust_remote_code=True, output_loading_info=True, attn_implementation="eager", **load_kwargs
)
stock = Qwen3VLForConditionalGeneration.from_pretrained(str(folder), attn_implementation="eager", **load_kwargs)
facts["class"], facts["module"] = type(patched).__name__, type(patched).__module__
facts["missing"], facts["unexpected"] = sorted(info["missing_keys"]), sorted(info["unexpected_keys"])
facts["layers"] = config["num_hidden_layers"]
sys.path.insert(0, str(folder))
import pto_kernels

GROUPS = {
    "reference": ("rms_norm", "mrope", "swiglu_mlp"),
    "blocks": ("rms_norm", "mrope", "mlp_block"),
    "residual": ("residual_rms_norm",),
}


def compare(name, inputs):
    with torch.no_grad():
        reference = stock(**inputs).logits
        off = patched(**inputs).logits
        result = {"max_diff_off": (off - reference).abs().max().item(), "logit_std": reference.std().item()}
        for group, ops in GROUPS.items():
            pto_kernels.reset_stats()
            with pto_kernels.enabled(ops, backend="torch"):
                on = patched(**inputs).logits
            stats = pto_kernels.stats()
            result[group] = {
                "max_diff_on": (on - reference).abs().max().item(),
                "calls": {op: stats[op]["calls"] for op in ops},
                "fallbacks": {op: stats[op]["fallbacks"] for op in ops},
            }
    facts[name] = result


compare("text", {"input_ids": torch.tensor([[1, 5, 9, 42, 7, 3, 11, 2]])})
from transformers.models.auto.image_processing_auto import AutoImageProcessor

compare(
    "image",
    build_inputs(
        folder, "Read the text.", sample_image(), image_processor=AutoImageProcessor.from_pretrained(str(folder)),
        generation_class="Qwen3VLForConditionalGeneration",
    ),
)
print(json.dumps(facts))
"""


def environment(release: str, home: Path) -> dict[str, str]:
    paths = [str(REPO)]
    if release != INSTALLED:
        try:
            env = release_env(release)
        except EnvUnavailable as exc:
            pytest.skip(str(exc))
        paths.insert(0, str(env.site))
    variables = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(paths),
        "PYTHONNOUSERSITE": "1",
        "HF_HOME": str(home / "hf"),
        "HF_MODULES_CACHE": str(home / "hf" / "modules"),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "TRANSFORMERS_VERBOSITY": "error",
    }
    for name in ("PTO_KERNELS_BACKEND", "PTO_KERNELS_STRICT"):
        variables.pop(name, None)
    return variables


def run(args: list[str], variables: dict[str, str], home: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *args],
        capture_output=True,
        text=True,
        env=variables,
        cwd=home,
        timeout=RUN_TIMEOUT_S,
    )


_RESULTS: dict[str, dict | BaseException] = {}


@pytest.fixture(params=MATRIX)
def family_run(request, tmp_path_factory) -> tuple[str, dict]:
    """(release, facts): one pass per release, shared by the tests below."""
    release = request.param
    if release not in _RESULTS:
        home = tmp_path_factory.mktemp(f"qwen3vl-{release}")
        folder = home / "Qwen3-VL-tiny"
        try:
            variables = environment(release, home)
            done = run(["-c", LOAD_AND_COMPARE, MODEL, str(folder)], variables, home)
            assert done.returncode == 0, f"under transformers {release}:\n{done.stderr[-4000:]}"
            facts = json.loads(done.stdout.strip().splitlines()[-1])
            from pto_patch.run.image_inputs import sample_image

            sample_image(112, 84).save(home / "page.png")
            verify = run(
                ["-m", "pto_patch", "verify", "--model", MODEL, "--model-path", str(folder), "--use_pto"]
                + ["--ops", "all", "--image", str(home / "page.png"), "--json", "--dtype", "fp32"]
                + ["--warmup", "0", "--iters", "1", "--output_length", "2"],
                variables,
                home,
            )
            facts["verify_rc"], facts["verify_stderr"] = verify.returncode, verify.stderr[-3000:]
            facts["verify"] = json.loads(verify.stdout) if verify.stdout.strip().startswith("{") else None
            restore = run(
                ["-m", "pto_patch", "restore", "--model", MODEL, "--model-path", str(folder)], variables, home
            )
            assert restore.returncode == 0, restore.stderr[-3000:]
            facts["after"] = snapshot(folder)
            _RESULTS[release] = facts
        except (pytest.skip.Exception, AssertionError) as exc:
            _RESULTS[release] = exc
    facts = _RESULTS[release]
    if isinstance(facts, BaseException):
        raise facts
    return release, facts


def test_apply_takes_the_release_source_and_loads_every_weight(family_run):
    release, facts = family_run
    assert facts["version"] == facts["manifest_release"] == release
    assert facts["ops"] == [
        "rms_norm",
        "mrope",
        "swiglu_mlp",
        "residual_rms_norm",
        "mlp_block",
        "attention_core",
    ]
    assert facts["class"] == "Qwen3Vl4BInstructForConditionalGeneration"
    assert facts["module"].startswith("transformers_modules.")
    assert facts["missing"] == [] and facts["unexpected"] == []
    assert facts["classes_sharing_a_transformers_name"] == []


@pytest.mark.parametrize("inputs", ["text", "image"])
def test_logits_match_stock_with_switches_off_and_on(family_run, inputs):
    release, facts = family_run
    result = facts[inputs]
    where = f"transformers {release}, {inputs}"
    assert result["logit_std"] > 0.1, f"{where}: constant logits, the comparison would mean nothing"
    assert result["max_diff_off"] == 0.0, f"{where}: switches off differ from stock"
    for group in ("reference", "blocks", "residual"):
        assert result[group]["max_diff_on"] < 1e-4, f"{where}, {group}: {result[group]}"
        assert all(count > 0 for count in result[group]["calls"].values()), (
            f"{where}, {group}: {result[group]}"
        )
        assert not any(result[group]["fallbacks"].values()), f"{where}, {group}: {result[group]}"


def test_rms_norm_calls_include_the_q_and_k_norms(family_run):
    """One text forward: per layer input, post-attention, q and k norm, plus the final norm (no vision RMSNorm:
    Qwen3-VL's tower uses LayerNorm). With mlp_block on, the post-attention norm moves into the block."""
    release, facts = family_run
    layers = facts["layers"]
    assert facts["text"]["reference"]["calls"]["rms_norm"] == 4 * layers + 1, release
    assert facts["text"]["blocks"]["calls"]["rms_norm"] == 3 * layers + 1, release


def test_verify_with_every_op_passes_on_an_image(family_run):
    release, facts = family_run
    assert facts["verify_rc"] == 0, facts["verify_stderr"]
    report = facts["verify"]
    assert report["passed"] and report["input"]["kind"] == "image"
    assert report["switched_on"] == [
        "rms_norm",
        "mrope",
        "swiglu_mlp",
        "residual_rms_norm",
        "mlp_block",
        "attention_core",
    ]
    ops = report["pto"]["ops"]
    assert all(ops[op]["calls"] > 0 for op in ("rms_norm", "mrope", "mlp_block")), ops
    load = report["load_info"]
    assert load["missing_keys"] == load["unexpected_keys"] == load["mismatched_keys"] == []


def test_restore_gives_back_the_folder_byte_for_byte(family_run):
    release, facts = family_run
    assert facts["after"] == facts["before"], release


# --- the family's other shipped specs, on the venv's release ---------------------------------------------

OTHER_SPECS = ("qwen3_vl_2b_instruct", "qwen3_vl_8b_instruct", "chandra")


@pytest.mark.parametrize("model", OTHER_SPECS)
def test_each_shipped_spec_loads_every_weight_and_computes_the_stock_logits(model: str, tmp_path: Path):
    done = run(
        ["-c", LOAD_AND_COMPARE, model, str(tmp_path / model)], environment(INSTALLED, tmp_path), tmp_path
    )
    assert done.returncode == 0, done.stderr[-4000:]
    facts = json.loads(done.stdout.strip().splitlines()[-1])
    assert (
        facts["missing"] == []
        and facts["unexpected"] == []
        and facts["classes_sharing_a_transformers_name"] == []
    )
    for inputs in ("text", "image"):
        result = facts[inputs]
        assert result["logit_std"] > 0.1 and result["max_diff_off"] == 0.0, (model, inputs, result)
        for group in ("reference", "blocks", "residual"):
            assert result[group]["max_diff_on"] < 1e-4, (model, inputs, group, result[group])
            assert all(count > 0 for count in result[group]["calls"].values()), (model, inputs, result[group])
    assert facts["text"]["reference"]["calls"]["rms_norm"] == 4 * facts["layers"] + 1


# --- what the family refuses, and a release without it -------------------------------------------------


def test_attention_prologue_is_refused_with_its_reason(tmp_path: Path, capsys):
    from pto_patch.tiny.model import make_tiny

    folder = make_tiny(tmp_path / "tiny", model=MODEL, layers=1).path
    before = snapshot(folder)
    refused = run_cli("apply", "--model", MODEL, "--model-path", str(folder), "--ops", "attention_prologue")
    assert refused == 2  # a bad --ops value
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 2 and "attention_prologue is not available for Qwen3-VL" in lines[0], lines
    assert "q_norm" in lines[0] and lines[1].startswith("hint: leave it out")
    assert snapshot(folder) == before


def test_a_spec_naming_a_refused_op_or_an_unknown_family_is_a_spec_error(tmp_path: Path):
    from pto_patch.errors import SpecError
    from pto_patch.model.spec import load_spec, specs_dir

    data = json.loads((specs_dir() / f"{MODEL}.json").read_text())
    cases = {
        "refused": {"injections": {**data["injections"], "attention_prologue": {
            "switch": "USE_PTO_ATTENTION_PROLOGUE", "classes": ["Qwen3VLTextDecoderLayer"]}}},
        "unknown family": {"family": "qwen4_vl"},
        "family in another directory": {"transformers_model_dir": "qwen2_5_vl"},
    }  # fmt: skip
    messages = {}
    for name, change in cases.items():
        path = tmp_path / f"{name.replace(' ', '_')}.json"
        path.write_text(json.dumps({**data, **change}))
        with pytest.raises(SpecError) as raised:
            load_spec(str(path))
        messages[name] = raised.value.message
    assert "cannot take 'attention_prologue'" in messages["refused"]
    assert "unknown family 'qwen4_vl'" in messages["unknown family"]
    assert "lives in transformers' models/qwen3_vl" in messages["family in another directory"]


def test_a_release_without_the_family_names_the_family_and_the_release(tmp_path: Path, monkeypatch):
    from pto_patch.errors import SourceNotFoundError
    from pto_patch.model import locate
    from pto_patch.model.spec import load_spec

    package = tmp_path / "site" / "transformers"
    (package / "models" / "qwen2_5_vl").mkdir(parents=True)  # an older release: Qwen2.5-VL only
    monkeypatch.setattr(locate, "installed_transformers_dir", lambda: package)
    monkeypatch.setattr(locate, "installed_transformers_release", lambda: "4.52.4")
    with pytest.raises(SourceNotFoundError) as raised:
        locate.locate_sources(tmp_path / "model", load_spec(MODEL))
    assert "transformers 4.52.4 has no Qwen3-VL" in raised.value.message
    assert "transformers>=4.57" in raised.value.hint
