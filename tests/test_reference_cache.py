"""The reference's generations kept between runs: a second verify of the same folder and inputs loads no
reference and judges the same; anything its answer depends on, changed, is a miss; a foreign or broken
entry is a miss, never an error."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from pto_patch.run import reference_cache
from pto_patch.run.verify import VerifyOptions, verify_model

pytestmark = pytest.mark.usefixtures("kernel_package_restored")  # verify runs in process


def _options(folder: Path, **extra) -> VerifyOptions:
    settings = {"simple_prompt": True, "output_length": 6, "warmup": 0, "iters": 1, **extra}
    return VerifyOptions(model_path=folder, **settings)


@pytest.fixture()
def own_cache(tmp_path, monkeypatch) -> Path:
    folder = tmp_path / "cache"
    monkeypatch.setenv("PTO_PATCH_CACHE", str(folder))
    return folder


def test_a_second_verify_takes_the_reference_from_the_cache(patched_tiny, own_cache):
    first = verify_model(_options(patched_tiny))
    assert first.passed, first.failures
    assert first.reference["generations"] == 1 and first.reference["kept"] == 0
    assert len(list((own_cache / "references").glob("*.pt"))) == 1
    second = verify_model(_options(patched_tiny))
    assert second.passed, second.failures
    assert second.reference["generations"] == 0 and second.reference["kept"] == 1
    assert second.reference["load_s"] == 0  # no reference model loaded
    assert second.reference["text"] == first.reference["text"]
    assert second.judged["pto"].steps_judged == first.judged["pto"].steps_judged
    # another length or another dtype is another answer
    longer = verify_model(_options(patched_tiny, output_length=7))
    assert longer.reference["generations"] == 1
    fp32 = verify_model(_options(patched_tiny, dtype="fp32"))
    assert fp32.reference["generations"] == 1


def test_changed_weights_are_a_miss(patched_tiny, own_cache, tmp_path):
    import torch
    from safetensors.torch import load_file, save_file

    copy = tmp_path / "copy"
    shutil.copytree(patched_tiny, copy, symlinks=True)
    assert verify_model(_options(copy)).reference["generations"] == 1
    shard = next(copy.glob("*.safetensors"))
    tensors = load_file(shard)
    name = next(n for n, t in tensors.items() if t.is_floating_point() and t.numel() > 1)
    tensors[name] = torch.flip(tensors[name], dims=[0]).contiguous()  # same shape and bytes, other order
    shard.unlink()
    save_file(tensors, shard, metadata={"format": "pt"})
    again = verify_model(_options(copy))
    assert again.reference["generations"] == 1 and again.reference["kept"] == 0


def test_a_broken_or_foreign_entry_is_a_miss(patched_tiny, own_cache):
    verify_model(_options(patched_tiny))
    (entry,) = (own_cache / "references").glob("*.pt")
    entry.write_bytes(entry.read_bytes()[:100])  # cut short
    cut = verify_model(_options(patched_tiny))
    assert cut.passed and cut.reference["generations"] == 1  # ran again, and kept whole again
    import torch

    torch.save({"new_tokens": torch.zeros(1, 3, dtype=torch.long), "texts": ["x"]}, entry)  # not a trace
    foreign = verify_model(_options(patched_tiny))
    assert foreign.passed and foreign.reference["generations"] == 1


def test_the_key_holds_every_input_byte():
    import torch

    inputs = {"input_ids": torch.tensor([[1, 2, 3]]), "pixel_values": torch.zeros(2, 4)}
    key = reference_cache.input_key("ref", inputs, 8)
    other_pixel = {**inputs, "pixel_values": inputs["pixel_values"].clone()}
    other_pixel["pixel_values"][1, 3] = 1e-7
    assert reference_cache.input_key("ref", other_pixel, 8) != key
    assert reference_cache.input_key("ref", inputs, 9) != key
    assert reference_cache.input_key("other", inputs, 8) != key
    assert reference_cache.input_key("ref", dict(inputs), 8) == key


def test_it_can_be_turned_off(patched_tiny, own_cache, monkeypatch):
    monkeypatch.setenv(reference_cache.OFF_ENV, "0")
    verify_model(_options(patched_tiny))
    assert not (own_cache / "references").exists()


def test_a_kept_generation_comes_back_with_every_field_of_its_trace(own_cache):
    """Each StepTrace field is kept (a field added to the trace and not to the entry fails here: a kept
    reference without it could not judge a vLLM run, which reads every step's log normalizer)."""
    import dataclasses

    import torch

    from pto_patch.run.judging import ReferenceGeneration, TraceRecorder

    recorder = TraceRecorder()
    for step in range(3):
        recorder(None, torch.randn(2, 40) * (step + 1))
    new_tokens = torch.tensor([[1, 2, 3], [4, 0, 5]])
    trace = recorder.finish(new_tokens, [0])
    key = reference_cache.input_key("ref", {"input_ids": new_tokens}, 3)
    reference_cache.keep(key, ReferenceGeneration(new_tokens, ["a", "b"], trace, 1.5))
    kept = reference_cache.load(key)
    assert kept is not None and torch.equal(kept.new_tokens, new_tokens) and kept.texts == ["a", "b"]
    for field in dataclasses.fields(trace):
        want, got = getattr(trace, field.name), getattr(kept.trace, field.name)
        assert len(got) == len(want), field.name
        for a, b in zip(want, got, strict=True):
            assert torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b, field.name
