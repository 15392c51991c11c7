"""doctor's torch / torch_npu pairing: the published table, and one line with a hint when a pair is not one."""

from __future__ import annotations

import pytest

from pto_patch.run.diagnosis import ascend_pairs
from pto_patch.run.diagnosis.ascend_pairs import check_pair, torch_for, torch_npu_for


def test_the_reference_stack_is_a_published_pair_and_names_what_it_found():
    pair = check_pair("2.9.0+cpu", "2.9.0.post2", "8.5.1")
    assert pair.ok and pair.status == "published" and pair.hint is None
    assert pair.line == (
        "torch 2.9.0+cpu with torch_npu 2.9.0.post2, CANN 8.5.1: a published pair; Ascend lists CANN 9.0.0 for it"
    )


def test_a_torch_npu_for_another_torch_is_a_mismatch_with_the_torch_it_needs():
    pair = check_pair("2.13.0", "2.9.0.post2", None)
    assert not pair.ok and pair.status == "mismatch"
    assert "torch 2.13.0 with torch_npu 2.9.0.post2, no CANN found: not a published pair" in pair.line
    assert "requires torch 2.9.0" in pair.line and "\n" not in pair.line
    assert pair.hint.startswith("install torch==2.9.0") and "torch_npu 2.13.0 for torch 2.13.0" in pair.hint


def test_an_unknown_torch_npu_release_is_named_with_the_choices_for_this_torch():
    pair = check_pair("2.9.0", "2.9.0.post99", None)
    assert pair.status == "unknown torch_npu" and not pair.ok
    assert "2.9.0.post2" in pair.hint and "2.9.1" not in pair.hint


def test_no_torch_npu_is_nothing_to_check():
    assert check_pair("2.13.0", None).status == "no torch_npu" and check_pair("2.13.0", None).ok


def test_the_table_pairs_each_release_with_its_own_torch_and_cites_cann_only_where_its_source_does():
    assert torch_for("2.10.0.post4") == "2.10.0" and torch_for("2.13.0") == "2.13.0"
    assert torch_for("3.0.0") is None
    assert torch_npu_for("2.14.1") == [] and torch_npu_for("2.14.0") == ["2.14.0"]
    assert set(ascend_pairs.CANN) <= set(ascend_pairs.PUBLISHED)
    assert check_pair("2.8.0", "2.8.0.post2").cann_listed == "8.5.0"


@pytest.mark.parametrize(
    ("torch_npu", "cann"),
    [("2.9.0.post2", "9.0.0"), ("2.7.1.post4", "9.0.0"), ("2.8.0.post4", "9.0.0"), ("2.12.0", "9.1.0"),
     ("2.10.0.post4", "9.1.0"), ("2.9.0", "8.5.0"), ("2.1.0.post8", "8.0.RC3"), ("2.13.0", None), ("2.14.0", None),
     ("2.9.0.post4", None)],
)  # fmt: skip
def test_the_cann_listed_is_ascend_pytorch_compatibility_md_s(torch_npu, cann):
    """Ascend/pytorch COMPATIBILITY.md (master bcfb2c8e): 2.13.0 and 2.14.0 have no row, nor 2.9.0.post4."""
    pair = check_pair(torch_for(torch_npu), torch_npu)
    assert pair.cann_listed == cann
    assert (f"Ascend lists CANN {cann} for it" in pair.line) == (cann is not None)


def test_doctor_reports_the_pair_in_its_stack(monkeypatch):
    from pto_patch.run.diagnosis import doctor

    versions = {"torch": "2.9.0", "torch-npu": "2.12.0.post3"}
    monkeypatch.setattr(doctor, "_version", lambda dist: versions.get(dist))
    monkeypatch.setattr(doctor, "_pypto_runtime", lambda kernels: None)
    monkeypatch.delenv("ASCEND_HOME_PATH", raising=False)
    found = doctor.stack(kernels=None)
    assert found["torch_npu_pair"]["status"] == "mismatch"
    assert found["torch_npu_pair"]["hint"].startswith("install torch==2.12.0")
