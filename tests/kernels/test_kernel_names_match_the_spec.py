"""The kernel package is copied into model folders and imports nothing of pto-patch, so it keeps its
own lists of ops, backends and switch names; they must be the spec's and the runner's."""

from __future__ import annotations

import json

import pto_kernels
import pytest
from pto_kernels import _dispatch

from pto_patch.errors import SpecError
from pto_patch.model.spec import OPS, SWITCHES, ModelSpec, known_specs, load_spec, specs_dir
from pto_patch.run.op_choice import KERNEL_BACKENDS


def test_ops_agree():
    assert pto_kernels.OPS == _dispatch.OPS == OPS


def test_backends_agree():
    assert pto_kernels.BACKENDS == _dispatch.BACKENDS == KERNEL_BACKENDS


def test_switch_names_agree():
    assert pto_kernels.SWITCHES == SWITCHES
    for switch in SWITCHES.values():
        assert getattr(pto_kernels, switch) is False  # a module global the guards read, off by default


@pytest.mark.parametrize("name", known_specs())
def test_every_spec_names_the_kernel_package_switches(name: str):
    spec = load_spec(name)
    assert {op: injection.switch for op, injection in spec.injections.items()} == {
        op: SWITCHES[op] for op in spec.injections
    }


def test_a_spec_naming_another_switch_is_refused():
    data = json.loads((specs_dir() / "gutenocr_3b.json").read_text(encoding="utf-8"))
    data["injections"]["mrope"]["switch"] = "USE_PTO_ROPE"
    with pytest.raises(SpecError, match="names switch 'USE_PTO_ROPE'") as refused:
        ModelSpec.from_json(data)
    assert "USE_PTO_MROPE" in refused.value.hint
