"""verify judges every generated step of both runs against the unpatched model run eagerly.

Each check here has the case that makes it fail: a kernel wrong at decode steps only (prefill right)
fails, naming the step; the same folder without the fault passes; the unpatched view holds the
folder's original bytes and none of what apply added; a score that rises outside the reference's top
scores is caught.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from pto_patch.patching.originals import original_files
from pto_patch.patching.patch_state import patch_state
from pto_patch.run.judging import ForcedJudge, TraceRecorder
from pto_patch.run.reference import unpatched_view
from pto_patch.run.verify import VerifyOptions, verify_model
from tests.helpers.changes import decode_fault_copy

pytestmark = pytest.mark.usefixtures("kernel_package_restored")  # verify runs in process


def _options(folder: Path, **extra) -> VerifyOptions:
    return VerifyOptions(
        model_path=folder,
        simple_prompt=True,
        output_length=12,
        warmup=1,
        iters=1,
        kernel_backend="torch",
        ops="rms_norm",
        **extra,
    )


@pytest.fixture()
def decode_fault_folder(patched_tiny, tmp_path) -> Path:
    """A copy of the patched tiny model whose reference RMSNorm is x1.5 at one-row (decode) calls only."""
    return decode_fault_copy(patched_tiny, tmp_path / "fault")


def test_verify_passes_the_unsabotaged_folder(patched_tiny):
    report = verify_model(_options(patched_tiny))
    assert report.passed, report.failures
    assert set(report.judged) == {"baseline", "pto"}
    assert all(judgement.steps_judged >= 2 for judgement in report.judged.values())
    document = report.to_json()
    json.dumps(document, allow_nan=False)  # valid JSON: no NaN or infinity
    assert document["judged"]["pto"]["passed"] is True
    assert document["reference"]["what"].startswith("the unpatched model")
    assert document["random_weights"] is True  # a make-tiny model: its speed is marked indicative


def test_random_weights_are_told_by_the_vocabulary():
    from pto_patch.run.loading import RANDOM_VOCABULARY_BELOW, LoadedModel

    def loaded(tokens: int) -> LoadedModel:
        fields = dict.fromkeys(LoadedModel.__dataclass_fields__)
        return LoadedModel(**{**fields, "tokenizer": [0] * tokens})

    assert loaded(RANDOM_VOCABULARY_BELOW - 1).random_weights
    assert not loaded(151_665).random_weights  # Qwen2.5-VL's vocabulary


def test_a_decode_only_kernel_fault_fails_naming_the_step(decode_fault_folder):
    report = verify_model(_options(decode_fault_folder, allow_modified=True))
    assert not report.passed
    pto = report.judged["pto"]
    assert pto.first_failing_step is not None and pto.first_failing_step >= 1  # the prefill's step is right
    assert report.judged["baseline"].passed  # the kernels off: the model's own code
    message = next(line for line in report.failures if line.startswith("pto (eager)"))
    assert "decode step" in message and "rms_norm" in message


def test_the_unpatched_view_is_the_folder_before_apply(patched_tiny):
    from pto_patch.patching.manifest import Manifest

    manifest = Manifest.load(patched_tiny)
    with unpatched_view(patched_tiny, original_files(patched_tiny, patch_state(patched_tiny))) as view:
        assert not (view / "pto_kernels").exists()
        assert not (view / ".pto_patch").exists()
        for record in manifest.files:
            if record.action == "added":
                assert not (view / record.path).exists(), record.path
            else:
                backup = patched_tiny / record.backup
                assert (view / record.path).read_bytes() == backup.read_bytes()
        config = json.loads((view / "config.json").read_text())
        assert "auto_map" not in config  # the original config: transformers' own classes
    assert not view.exists()


def test_a_broken_backup_refuses_the_reference(patched_tiny, tmp_path):
    from pto_patch.errors import ModelFolderError

    folder = tmp_path / "copy"
    shutil.copytree(patched_tiny, folder, symlinks=True)
    (folder / ".pto_patch" / "backup" / "config.json").write_text("{}")
    with pytest.raises(ModelFolderError, match="backup of config.json"):
        with unpatched_view(folder, original_files(folder, patch_state(folder))):
            pass


def _trace(scores_per_step):
    import torch

    recorder = TraceRecorder()
    for scores in scores_per_step:
        recorder(None, scores)
    tokens = torch.stack([scores.argmax(-1) for scores in scores_per_step], dim=1)
    return recorder.finish(tokens, eos_ids=None)


def test_a_score_rising_outside_the_reference_top_is_caught():
    import torch

    torch.manual_seed(0)
    reference = [torch.randn(1, 100) for _ in range(3)]
    trace = _trace(reference)
    same = ForcedJudge(trace, atol=1e-3, rtol=0.0, run="pto")
    for scores in reference:
        same(None, scores.clone())
    assert same.judgement().passed

    skewed = ForcedJudge(trace, atol=1e-3, rtol=0.0, run="pto")
    low = int(reference[1].argmin())  # a token far outside the reference's top 20
    for step, scores in enumerate(reference):
        scores = scores.clone()
        if step == 1:
            scores[0, low] += 50.0
        forced = skewed(None, scores)
        assert int(forced.argmax()) == int(trace.tokens[step][0])  # teacher forcing
    judgement = skewed.judgement()
    assert not judgement.passed and judgement.first_failing_step == 1
    assert judgement.first_choice_divergence == 1 and judgement.divergence_near_tie is False
