"""The patch works under every supported transformers release, not only the venv's own.

For each release, a fresh interpreter runs with that release's env (tests/release_envs.py) first on
PYTHONPATH, so its transformers shadows the venv's. In it: make a tiny model, apply the patch (which
must take that release's modeling file), load the patched model as remote code and the stock class
from the same folder, compare logits with the kernel switches off (exactly equal) and on with the
torch backend (close, every op called), text only and with an image; then every op on with the fused
backend against the switches off, bit for bit, in float32 and in bfloat16; then restore, which must
give back the folder byte for byte. The venv's own release is covered by test_patched_model_loads.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.release_envs import ENV_RELEASES, EnvUnavailable, release_env, unmet_requirements

REPO = Path(__file__).resolve().parents[1]
RELEASES = ENV_RELEASES  # the one list (tests/release_envs.py); the venv's own release is not in it
RUN_TIMEOUT_S = 300

# Runs under the release's transformers; prints one JSON line of facts for the asserts.
UNDER_RELEASE = r"""
import inspect, json, sys
from pathlib import Path

release, folder = sys.argv[1], Path(sys.argv[2])
import huggingface_hub, tokenizers, torch, transformers
facts = {
    "version": transformers.__version__,
    "transformers_from": transformers.__file__,
    "hub": huggingface_hub.__version__,
    "tokenizers": tokenizers.__version__,
}

from pto_patch.patching import engine
from pto_patch.patching.manifest import Manifest
from pto_patch.run.image_inputs import build_inputs, sample_image
from pto_patch.tiny.model import make_tiny
from tests.folder_snapshot import snapshot

make_tiny(folder)
before = snapshot(folder)
engine.apply_patch(model_path=folder)
manifest = Manifest.load(folder)
facts["manifest_release"] = manifest.transformers_release
facts["manifest_source"] = manifest.source

from transformers import AutoModelForImageTextToText, Qwen2_5_VLForConditionalGeneration
from pto_patch.model.injections_found import guarded_in_folder
from pto_patch.model.spec import load_spec
from pto_patch.run.hub_kernels import load_arguments
from pto_patch.run.patchers import find_other_patchers

# As pto-patch loads (5.25 would otherwise kernelize, and without `kernels` refuse to load at all).
dtype = {"dtype": torch.float32} if int(transformers.__version__.split(".")[0]) >= 5 else {"torch_dtype": torch.float32}
dtype.update(load_arguments(False))
patched, info = AutoModelForImageTextToText.from_pretrained(
    str(folder), trust_remote_code=True, output_loading_info=True, attn_implementation="eager", **dtype
)
stock = Qwen2_5_VLForConditionalGeneration.from_pretrained(str(folder), attn_implementation="eager", **dtype)
# Anything a release does at load that sets a forward or replaces a patched function shows here.
spec = load_spec("gutenocr_3b")
facts["other_patchers"] = [p.to_json() for p in find_other_patchers(patched, spec, guarded_in_folder(folder, spec))]
facts["forwards_after_load"] = sorted(
    {f"{type(m).__name__}.forward from {getattr(type(m).forward, '__module__', '?')}" for m in patched.modules()
     if type(m).__name__.endswith(("RMSNorm", "MLP")) and "forward" not in m.__dict__}
)
facts["class"] = type(patched).__name__
facts["module"] = type(patched).__module__
facts["missing"] = sorted(info["missing_keys"])
facts["unexpected"] = sorted(info["unexpected_keys"])

sys.path.insert(0, str(folder))
import pto_kernels
facts["kernels_from"] = pto_kernels.__file__

# The ops a run can switch on together: the reference's three; the two blocks that cover a whole decoder
# layer but its attention core (with rms_norm for the final and the vision norms); the residual add + norm.
GROUPS = {
    "reference": pto_kernels.REFERENCE_OPS,
    "blocks": ("rms_norm", "attention_prologue", "mlp_block"),
    "residual": ("residual_rms_norm",),
}


# Each group on with the fused backend against the switches off: the same bits, or where they part.
def fused_pass(model, inputs):
    return {group: fused_group(model, inputs, ops) for group, ops in GROUPS.items()}


def fused_group(model, inputs, group):
    def logits(ops):
        with torch.no_grad(), pto_kernels.enabled(ops=ops, backend="fused"):
            return model(**inputs).logits

    off = logits(())
    pto_kernels.reset_stats()
    on = logits(group)
    stats = {op: s for op, s in pto_kernels.stats().items() if op in group}
    differ = on != off
    return {
        "dtype": str(on.dtype),
        "bit_equal": torch.equal(on, off),
        "max_diff": (on.float() - off.float()).abs().max().item(),
        "elements_differing": int(differ.sum()),
        "positions_differing": sorted({int(i) for i in differ.nonzero()[:, 1].tolist()}),
        # Which op alone already changes the bits (only looked at when all together do).
        "bit_equal_alone": {}
        if torch.equal(on, off)
        else {op: torch.equal(logits((op,)), off) for op in group},
        "backends": {op: s["backends"] for op, s in stats.items()},
        "fallbacks": {op: s["fallbacks"] for op, s in stats.items()},
        "first_fallback_error": {op: s["first_fallback_error"] for op, s in stats.items()},
    }


def compare(name, inputs):
    with torch.no_grad():
        reference = stock(**inputs).logits
        off = patched(**inputs).logits
        on, calls, fallbacks = {}, {}, {}
        for group, ops in GROUPS.items():
            pto_kernels.reset_stats()
            with pto_kernels.enabled(ops, backend="torch"):
                on[group] = (patched(**inputs).logits - reference).abs().max().item()
            stats = pto_kernels.stats()
            calls[group] = {op: stats[op]["calls"] for op in ops}
            fallbacks[group] = {op: stats[op]["fallbacks"] for op in ops}
    facts[name] = {
        "max_diff_off": (off - reference).abs().max().item(),
        "max_diff_on": on,
        "logit_std": reference.std().item(),
        "calls": calls,
        "fallbacks": fallbacks,
        "inputs": sorted(inputs),
        "fused": [fused_pass(patched, inputs)],
    }

text_inputs = {"input_ids": torch.tensor([[1, 5, 9, 42, 7, 3, 11, 2]])}
compare("text", text_inputs)
# The image path of the modeling code, with the image processor taken from its own module: 5.8 - 5.16
# export `transformers.AutoImageProcessor` as a placeholder that needs torchvision.
from transformers.models.auto.image_processing_auto import AutoImageProcessor

prompt, image = "Read the text in the image.", sample_image()
inputs = build_inputs(folder, prompt, image, image_processor=AutoImageProcessor.from_pretrained(str(folder)))
compare("image", inputs)
facts["image"]["stock_takes_mm_token_type_ids"] = "mm_token_type_ids" in inspect.signature(stock.forward).parameters
# What users get: build_inputs loading the image processor itself.
try:
    own = build_inputs(folder, prompt, image)
    facts["build_inputs_own_processor"] = {
        "error": None,
        "same_inputs": sorted(own) == sorted(inputs) and all(torch.equal(own[k], inputs[k]) for k in inputs),
    }
except Exception as exc:
    facts["build_inputs_own_processor"] = {"error": f"{type(exc).__name__}: {str(exc).strip()[:300]}"}

# The fused backend again in bfloat16, the dtype GutenOCR ships and runs in: loaded as users load it.
bf16 = {"dtype": torch.bfloat16} if int(transformers.__version__.split(".")[0]) >= 5 else {"torch_dtype": torch.bfloat16}
bf16.update(load_arguments(False))
patched = AutoModelForImageTextToText.from_pretrained(
    str(folder), trust_remote_code=True, attn_implementation="eager", **bf16
)
for name, name_inputs in (("text", text_inputs), ("image", inputs)):
    facts[name]["fused"].append(fused_pass(patched, name_inputs))

del patched, stock, pto_kernels
sys.modules.pop("pto_kernels", None)
engine.restore_model(model_path=folder)
after = snapshot(folder)
facts["restore_changed"] = sorted(p for p in before.keys() | after.keys() if before.get(p) != after.get(p))
print(json.dumps(facts))
"""


def run_under_release(release: str, tmp_path: Path) -> dict:
    try:
        env = release_env(release)
    except EnvUnavailable as exc:
        pytest.skip(str(exc))
    if env.built_now:
        print(f"built the transformers {release} env in {env.build_s:.1f} s: {env.site}")
    hf_home = tmp_path / "hf"
    variables = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(env.site), str(REPO)]),
        "PYTHONNOUSERSITE": "1",
        "HF_HOME": str(hf_home),
        "HF_MODULES_CACHE": str(hf_home / "modules"),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "TRANSFORMERS_VERBOSITY": "error",
    }
    for name in ("PTO_KERNELS_BACKEND", "PTO_KERNELS_STRICT", "GUTENOCR_MODEL_PATH"):
        variables.pop(name, None)
    done = subprocess.run(
        [sys.executable, "-c", UNDER_RELEASE, release, str(tmp_path / "GutenOCR-tiny")],
        capture_output=True,
        text=True,
        env=variables,
        cwd=tmp_path,
        timeout=RUN_TIMEOUT_S,
    )
    assert done.returncode == 0, f"under transformers {release}:\n{done.stderr[-4000:]}"
    facts = json.loads(done.stdout.strip().splitlines()[-1])
    facts["site"] = str(env.site)
    facts["folder"] = str(tmp_path / "GutenOCR-tiny")
    return facts


_RESULTS: dict[str, dict | BaseException] = {}  # per release: its facts, or why it failed or skipped


@pytest.fixture(params=RELEASES)
def under_release(request, tmp_path_factory) -> tuple[str, dict]:
    """(release, facts): one run per release, shared by the tests below."""
    release = request.param
    unreachable = [r for r in _RESULTS.values() if isinstance(r, pytest.skip.Exception)]
    if release not in _RESULTS and unreachable:  # PyPI was unreachable: do not wait on it again
        _RESULTS[release] = unreachable[0]
    if release not in _RESULTS:
        try:
            _RESULTS[release] = run_under_release(release, tmp_path_factory.mktemp(f"tf{release}"))
        except (pytest.skip.Exception, AssertionError) as exc:  # remembered: one attempt per release
            _RESULTS[release] = exc
        else:
            print(json.dumps(_RESULTS[release], indent=1))
    facts = _RESULTS[release]
    if isinstance(facts, BaseException):
        raise facts
    return release, facts


def check_logits(release: str, name: str, result: dict) -> None:
    where = f"transformers {release}, {name}"
    assert result["logit_std"] > 0.1, f"{where}: constant logits, the comparison would mean nothing"
    assert result["max_diff_off"] == 0.0, (
        f"{where}: switches off differ from stock by {result['max_diff_off']}"
    )
    for group, diff in result["max_diff_on"].items():
        assert diff < 1e-4, f"{where}: torch kernels ({group}) differ from stock by {diff}"
        calls, fallbacks = result["calls"][group], result["fallbacks"][group]
        assert all(count > 0 for count in calls.values()), f"{where}, {group}: {calls}"
        assert not any(fallbacks.values()), f"{where}, {group}: {fallbacks}"


@pytest.mark.slow
def test_patch_takes_the_release_source_and_loads_every_weight(under_release):
    release, facts = under_release
    assert facts["version"] == release
    assert Path(facts["transformers_from"]).is_relative_to(facts["site"])
    assert facts["manifest_release"] == release
    assert Path(facts["manifest_source"]).is_relative_to(facts["site"])
    assert facts["class"] == "GutenOcr3BVLForConditionalGeneration"
    assert facts["module"].startswith("transformers_modules.")
    assert facts["kernels_from"].startswith(facts["folder"])
    assert facts["missing"] == [] and facts["unexpected"] == [], facts


@pytest.mark.slow
def test_no_other_patcher_takes_a_patched_op_at_load(under_release):
    """Fails when a release starts to patch at load time (as 5.25's hub kernels would, on by default):
    every patched class keeps the forward apply wrote, every patched function is still the module's."""
    release, facts = under_release
    assert facts["other_patchers"] == [], f"transformers {release}: {facts['other_patchers']}"
    remote = facts["module"]
    assert facts["forwards_after_load"], facts
    assert all(line.endswith(f"from {remote}") for line in facts["forwards_after_load"]), facts


@pytest.mark.slow
def test_text_logits_match_stock_with_switches_off_and_on(under_release):
    release, facts = under_release
    check_logits(release, "text", facts["text"])


@pytest.mark.slow
def test_image_logits_match_stock_with_switches_off_and_on(under_release):
    release, facts = under_release
    image = facts["image"]
    assert {"pixel_values", "image_grid_thw"} <= set(image["inputs"])
    # 5.8+ place image tokens by mm_token_type_ids; without it positions silently fall back to 1-D.
    assert ("mm_token_type_ids" in image["inputs"]) == image["stock_takes_mm_token_type_ids"]
    check_logits(release, "image", image)
    # the vision tower's norms too
    assert image["calls"]["reference"]["rms_norm"] > facts["text"]["calls"]["reference"]["rms_norm"]


@pytest.mark.slow
def test_fused_backend_gives_the_eager_bits_in_float32_and_bfloat16(under_release):
    """Before 5.20 the fused MRoPE takes the unmixed [3, b, s, d] tables (mrope_pto_correct); only a
    whole model shows that it, with the fused RMSNorm and SwiGLU, reproduces the eager logits exactly."""
    release, facts = under_release
    apart = []
    for name in ("text", "image"):
        passes = facts[name]["fused"]
        assert len(passes) == 2  # float32, bfloat16
        runs = [(group, run) for groups in passes for group, run in groups.items()]
        assert [run["dtype"] for _, run in runs] == ["torch.float32"] * 3 + ["torch.bfloat16"] * 3
        for group, run in runs:
            where = f"transformers {release}, {name}, {run['dtype']}, {group}"
            for op, backends in run["backends"].items():
                assert set(backends) == {"fused"} and backends["fused"] > 0, f"{where}: {op} ran {backends}"
            assert not any(run["fallbacks"].values()), f"{where}: {run['first_fallback_error']}"
            if not run["bit_equal"]:
                positions = run["positions_differing"]
                apart.append(
                    f"{where}: max |diff| {run['max_diff']:.3g} over {run['elements_differing']} logits "
                    f"at {len(positions)} position(s) from {positions[0]}; "
                    f"each op alone equal: {run['bit_equal_alone']}"
                )
    assert apart == [], "\n".join(apart)


@pytest.mark.slow
def test_build_inputs_loads_the_image_processor_itself(under_release):
    release, facts = under_release
    own = facts["build_inputs_own_processor"]
    assert own["error"] is None, (
        f"transformers {release}: build_inputs(folder, prompt, image) raised {own['error']}"
    )
    assert own["same_inputs"]


@pytest.mark.slow
def test_restore_gives_back_the_folder_byte_for_byte(under_release):
    release, facts = under_release
    assert facts["restore_changed"] == [], f"transformers {release}: {facts['restore_changed']}"


def test_unmet_requirements_names_a_version_that_does_not_fit(tmp_path: Path):
    dist_info = tmp_path / "needs_old_hub-1.0.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: needs-old-hub\nVersion: 1.0\n"
        "Requires-Dist: huggingface-hub<0.1\n"
        "Requires-Dist: no-such-package-for-pto-patch\n"
        'Requires-Dist: also-not-installed; extra == "docs"\n'
    )
    unmet = unmet_requirements(tmp_path)
    assert len(unmet) == 2, unmet
    assert any("huggingface-hub<0.1: found" in line for line in unmet), unmet
    assert any("no-such-package-for-pto-patch: not installed" in line for line in unmet), unmet
