"""doctor's device checks (pto_patch/run/diagnosis/device_checks.py): what a first 910B run must check.

On this CPU they run through stand-ins: the torch and fused backends' kernels, and (slow) PyPTO's own kernels
through its CPU interpreter, under the counting torchair's npugraph_ex (tests/counting_torchair, loaded from
its file so it registers nothing). That proves each check's logic, that each fails on the fault it names,
and that the PyPTO kernels' logic passes them; the device facts themselves (a PyPTO kernel inside a real ACL
graph capture, the kernel's task order on the device, the int64 word the device kernel reads, npugraph_ex
keeping the writes in place) stay unverified until a 910B runs doctor.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import types

import pytest
import torch

from pto_patch.run.diagnosis import device_checks, doctor
from tests.test_doctor import narrow  # noqa: F401 - the fixture
from tests.torchair_runs import COUNTING_TORCHAIR

TOLERANCE = doctor.TOLERANCE["float32"]


@pytest.fixture(scope="module")
def npugraph_ex():
    """The counting torchair's npugraph_ex backend (torch-npu 2.13.0's, as it mirrors), unregistered."""
    spec = importlib.util.spec_from_file_location(
        "_doctor_torchair", COUNTING_TORCHAIR / "torchair" / "__init__.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module._npugraph_ex


@pytest.fixture()
def setup(narrow):  # noqa: F811
    kernels = doctor.import_kernels()
    gen = torch.Generator().manual_seed(3)
    cpu, fp32 = torch.device("cpu"), torch.float32
    here = {k: doctor._moved(v, torch, cpu, fp32) for k, v in doctor._modules(torch, gen).items()}
    given = {k: doctor._moved(v, torch, cpu, fp32) for k, v in doctor._inputs(torch, 2, gen).items()}
    return kernels, here, given | {"eps": doctor.EPS, "section": doctor.SECTION}


@pytest.mark.parametrize("backend", ["torch", "fused"])
def test_every_device_check_passes_through_the_stand_ins(setup, npugraph_ex, backend):
    kernels, modules, inputs = setup
    torch._dynamo.reset()
    found = device_checks.run_all(kernels, modules, inputs, backend, TOLERANCE, graph_backend=npugraph_ex)
    assert [(c.name, c.status) for c in found] == [(name, "ok") for name in device_checks.CHECKS], found


@pytest.mark.slow
@pytest.mark.skipif(
    importlib.util.find_spec("pypto") is None or shutil.which("g++") is None,
    reason="pypto's CPU interpreter (extra `pto`, g++) is not here",
)
def test_every_device_check_passes_on_pypto_s_interpreter(narrow, npugraph_ex, monkeypatch):  # noqa: F811
    """The PyPTO kernels themselves (rms_norm; the cache-writing prologue with its length task) through the
    interpreter, in bf16, a cache of 64 positions: the checks pass on the kernels' logic. The interpreter runs
    the tasks one after another and on the host's words, so the device's task order and word layout, and a
    real ACL graph capture, stay for the 910B (about 16 s here)."""
    monkeypatch.setattr(doctor, "CORE_CACHE", 64)
    monkeypatch.setattr(doctor, "CORE_VALID", 30)
    kernels = doctor.import_kernels()
    gen = torch.Generator().manual_seed(3)
    cpu, bf16 = torch.device("cpu"), torch.bfloat16
    here = {k: doctor._moved(v, torch, cpu, bf16) for k, v in doctor._modules(torch, gen).items()}
    given = {k: doctor._moved(v, torch, cpu, bf16) for k, v in doctor._inputs(torch, 1, gen).items()}
    settings = given | {"eps": doctor.EPS, "section": doctor.SECTION}
    torch._dynamo.reset()
    tolerance = doctor.TOLERANCE["bfloat16"]
    found = device_checks.run_all(kernels, here, settings, "pypto", tolerance, graph_backend=npugraph_ex)
    assert [(c.name, c.status) for c in found] == [(name, "ok") for name in device_checks.CHECKS], found


def test_without_an_npu_each_check_says_what_it_would_check_and_that_it_did_not_run(narrow, capsys):  # noqa: F811
    from pto_patch.cli.doctor_render import doctor_text

    report = doctor.run_doctor("cpu", "fp32", with_pypto=False, tokens=1)
    assert [c.name for c in report.device_checks] == list(device_checks.CHECKS)
    for check in report.device_checks:
        assert check.status == "not run" and check.checks == device_checks.CHECKS[check.name]
        assert check.reason.startswith("no NPU here (cpu)")
    document = json.loads(json.dumps(report.to_json()))
    assert {c["status"] for c in document["device_checks"]} == {"not run"}
    doctor_text(report)
    text = capsys.readouterr().out
    for name in device_checks.CHECKS:
        assert f"not run {name}: " in text
    assert "ok   capture_replay" not in text
    assert "PASSED (4 device check(s) did not run: not passed, not failed)" in text


def _faulty(kernels, fault):
    """`kernels` with its cache-writing prologue replaced, on every backend but the reference, by `fault`."""
    real = kernels.ops.attention_prologue_cached

    def prologue(*args):
        if kernels.backends().get("attention_prologue") == "torch":
            return real(*args)
        *head, key_cache, value_cache, position, advance = args
        return fault(lambda at: real(*head, key_cache, value_cache, at, False), position)

    ops = types.SimpleNamespace(attention_prologue_cached=prologue)
    return types.SimpleNamespace(
        **{name: getattr(kernels, name) for name in dir(kernels) if not name.startswith("__")} | {"ops": ops}
    )


def _advanced_first(write, position):
    position.add_(1)  # the length task ran before the rows' position was read
    return write(position)


def _high_word_read(write, position):
    out = write(torch.zeros_like(position))  # the high word (0) read as the position
    position.add_(1)
    return out


def _length_into_high_word(write, position):
    out = write(position)
    words = position.view(torch.int32)
    words[1] += words[0] + 1  # the advanced length written into the high word
    return out


@pytest.mark.parametrize(
    ("fault", "failed"),
    [
        (_advanced_first, {"position_read_first"}),
        (_high_word_read, {"position_read_first", "position_low_word"}),
        (_length_into_high_word, {"position_low_word"}),
    ],
)
def test_a_prologue_that_writes_the_wrong_row_or_word_fails_the_check_naming_it(setup, fault, failed):
    kernels, modules, inputs = setup
    found = device_checks.position_checks(_faulty(kernels, fault), modules, inputs, "fused", TOLERANCE)
    assert {c.name for c in found if c.status == "failed"} == failed, found
    assert all(c.reason for c in found if c.status == "failed")
    if fault is _advanced_first:
        assert "plus one: the length was written first" in found[0].reason


def test_a_replay_that_returns_the_captures_outputs_fails_capture_replay(setup, npugraph_ex):
    kernels, modules, inputs = setup
    torch._dynamo.reset()

    def stale(gm, example_inputs, options=None):
        run, kept = npugraph_ex(gm, example_inputs, options), []

        def replay(*args):
            if not kept:
                kept.append([t.clone() for t in run(*args)])
            return kept[0]

        return replay

    check = device_checks.capture_replay(kernels, modules, inputs, "fused", TOLERANCE, graph_backend=stale)
    assert check.status == "failed" and check.reason.startswith("the replay differs from eager"), check


def test_a_graph_that_writes_copies_of_the_caches_fails_cache_in_place(setup, npugraph_ex):
    kernels, modules, inputs = setup
    torch._dynamo.reset()

    def on_copies(gm, example_inputs, options=None):
        run = npugraph_ex(gm, example_inputs, options)
        return lambda *args: run(*[a.clone() if isinstance(a, torch.Tensor) else a for a in args])

    check = device_checks.cache_in_place(kernels, modules, inputs, "fused", graph_backend=on_copies)
    assert check.status == "failed" and "key cache differs" in check.reason, check


def test_a_check_that_raises_is_an_error_and_the_others_still_run(setup, npugraph_ex):
    kernels, modules, inputs = setup
    torch._dynamo.reset()

    def broken(gm, example_inputs, options=None):
        raise RuntimeError("no ACL graph here")

    found = device_checks.run_all(kernels, modules, inputs, "fused", TOLERANCE, graph_backend=broken)
    statuses = {c.name: c.status for c in found}
    assert statuses == {
        "capture_replay": "error", "position_read_first": "ok", "position_low_word": "ok", "cache_in_place": "error",
    }  # fmt: skip
    report = doctor.DoctorReport({}, {}, {}, "npu:0", "float32", 1, [], device_checks=found)
    assert not report.passed and any(
        f.startswith("device check capture_replay on fused: error") for f in report.failures
    )
