"""pto_kernels.apply_tuning: switch on what a tuning chose for a batch size, only where it was made."""

import copy
import json

import pto_kernels
import pytest
import torch
from pto_kernels import tuning


def _document(**changes) -> dict:
    here = tuning.environment("cpu")
    doc = {
        "format": tuning.FORMAT,
        "format_version": tuning.FORMAT_VERSION,
        "header": {
            "device": here["device"],
            "versions": here["versions"],
            "spec": "gutenocr_3b",
            "ops_patched": ["rms_norm", "mrope", "swiglu_mlp"],
        },
        "batches": [
            {"batch": 1, "chosen": {"mrope": "fused", "swiglu_mlp": "torch"}},
            {"batch": 8, "chosen": {}},
        ],
    }
    for key, value in changes.items():
        doc["header"][key] = value
    return doc


def test_applies_the_choice_for_the_batch_with_its_backends():
    choice = pto_kernels.apply_tuning(_document(), 1, device="cpu")
    assert choice.ops == {"mrope": "fused", "swiglu_mlp": "torch"} and choice.batch == 1
    assert pto_kernels.switched_on() == ("mrope", "swiglu_mlp")
    assert pto_kernels.backends()["swiglu_mlp"] == "torch" and pto_kernels.backend() == "per-op"
    mlp = torch.nn.Module()
    mlp.gate_proj, mlp.up_proj, mlp.down_proj = (torch.nn.Linear(8, 8, bias=False) for _ in range(3))
    mlp.act_fn = torch.nn.SiLU()
    pto_kernels.swiglu_mlp_wrapper(mlp, torch.randn(1, 2, 8))
    assert pto_kernels.stats()["swiglu_mlp"]["backends"] == {"torch": 1}
    assert choice.describe() == "batch 1 (tuned at 1): mrope=fused, swiglu_mlp=torch"


def test_nothing_on_is_a_choice():
    pto_kernels.enable(["rms_norm"], backend="fused")
    choice = pto_kernels.apply_tuning(_document(), 8, device="cpu")
    assert choice.ops == {} and pto_kernels.switched_on() == ()
    assert choice.describe() == "batch 8 (tuned at 8): nothing on"


@pytest.mark.parametrize(("asked", "tuned"), [(4, 1), (16, 8), (1, 1)])
def test_untuned_batch_takes_the_nearest_tuned_batch_below(asked, tuned):
    choice = pto_kernels.apply_tuning(_document(), asked, device="cpu")
    assert choice.batch == tuned
    assert choice.requested_batch == (None if asked == tuned else asked)


def test_batch_below_every_tuned_batch_takes_the_smallest():
    doc = _document()
    doc["batches"] = [{"batch": 4, "chosen": {"rms_norm": "fused"}}, {"batch": 8, "chosen": {}}]
    assert pto_kernels.apply_tuning(doc, 2, device="cpu").batch == 4


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"device": {"kind": "cpu", "name": "Some Other CPU 9000"}}, "Some Other CPU 9000"),
        ({"device": {"kind": "npu", "name": "Ascend910B1"}}, "device npu"),
        ({"versions": {"torch": "2.0.0"}}, "torch 2.0.0"),
    ],
    ids=["other-cpu", "npu", "torch-release"],
)
def test_a_tuning_from_elsewhere_is_refused_in_one_line(change, named):
    doc = _document()
    if "versions" in change:
        doc["header"]["versions"] = dict(doc["header"]["versions"], **change["versions"])
    else:
        doc["header"].update(change)
    pto_kernels.enable(["rms_norm"], backend="fused")
    with pytest.raises(pto_kernels.TuningMismatchError) as caught:
        pto_kernels.apply_tuning(doc, 1, device="cpu")
    message = str(caught.value)
    assert named in message and "\n" not in message and "pto-patch tune" in message
    assert pto_kernels.switched_on() == ("rms_norm",)  # left as it was


def test_other_transformers_or_missing_pypto_is_a_mismatch():
    doc = _document()
    doc["header"]["versions"] = dict(doc["header"]["versions"], transformers="4.0.0", pypto=None)
    here = tuning.environment("cpu")
    message = tuning.load(doc).mismatch(here)
    assert "transformers 4.0.0" in message
    if here["versions"]["pypto"] is not None:
        assert "pypto not installed" in message


def test_reads_a_path(tmp_path):
    path = tmp_path / "tuning.json"
    path.write_text(json.dumps(_document()))
    assert pto_kernels.apply_tuning(path, 1, device="cpu").ops == {"mrope": "fused", "swiglu_mlp": "torch"}


@pytest.mark.parametrize(
    ("damage", "says"),
    [
        (lambda doc: doc.update(format="something-else"), "not a pto-patch tuning file"),
        (lambda doc: doc.update(format_version=99), "format version 99"),
        (lambda doc: doc["header"].pop("device"), "not a complete tuning file"),
        (lambda doc: doc["batches"].append({"batch": 2, "chosen": {"layernorm": "fused"}}), "layernorm"),
        (lambda doc: doc["batches"][0]["chosen"].update(mrope="cuda"), "mrope=cuda"),
        (lambda doc: doc.update(batches=[]), "no tuned batch"),
    ],
    ids=["format", "version", "no-device", "unknown-op", "unknown-backend", "empty"],
)
def test_damaged_tuning_is_a_tuning_error(damage, says):
    doc = copy.deepcopy(_document())
    damage(doc)
    with pytest.raises(pto_kernels.TuningError, match=says):
        pto_kernels.apply_tuning(doc, 1, device="cpu")


def test_unreadable_file_is_a_tuning_error(tmp_path):
    with pytest.raises(pto_kernels.TuningError, match="no tuning file"):
        pto_kernels.apply_tuning(tmp_path / "missing.json", 1)
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(pto_kernels.TuningError, match="not readable JSON"):
        pto_kernels.apply_tuning(tmp_path / "bad.json", 1)


def test_enable_with_a_backend_per_op_checks_names():
    pto_kernels.enable(["rms_norm", "mrope"], backend={"rms_norm": "torch"})
    assert pto_kernels.backends() == {op: "torch" if op == "rms_norm" else "auto" for op in pto_kernels.OPS}
    with pytest.raises(ValueError, match="rmsnorm"):
        pto_kernels.enable(["rms_norm"], backend={"rmsnorm": "torch"})
    with pytest.raises(ValueError, match="cuda"):
        pto_kernels.enable(["rms_norm"], backend={"rms_norm": "cuda"})
