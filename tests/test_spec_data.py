"""A spec is data (issue 51, item 4): wrong types, names that shadow the modeling code's, and auto_map entries
or file names that reach outside the model folder are refused in one line, exit 2 (model/spec_data.py)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from pto_patch.errors import EXIT_USAGE, SpecError
from pto_patch.model.spec import all_specs, load_spec, spec_path
from tests.spec_pipeline import run_in_process

BASE = json.loads(spec_path("gutenocr_3b").read_text())


def _auto_map(value: str):
    return lambda d: d["auto_map"].update(AutoModel=value)


def _renames(new: str):
    return lambda d: d.update(class_renames=[["Qwen2_5_VL", new]])


CASES = {
    "absolute module": (_auto_map("/tmp/evil.Evil"), "auto_map 'AutoModel' names '/tmp/evil.Evil'"),
    "hub repo": (_auto_map("other/repo--modeling_x.Cls"), "names 'other/repo--modeling_x.Cls', not a class"),
    "another module": (_auto_map("os.system"), "not a class in the model folder's modeling_qwen2_5_vl.py"),
    "dotted path": (_auto_map("modeling_qwen2_5_vl.sub.Cls"), "names 'modeling_qwen2_5_vl.sub.Cls'"),
    "not a string": (_auto_map(["modeling_qwen2_5_vl.A", None]), "auto_map 'AutoModel' names ["),
    "torch": (_renames("torch"), "new class prefix 'torch' is a module the modeling code may import"),
    "isinstance": (_renames("isinstance"), "new class prefix 'isinstance' is a Python builtin"),
    "Exception": (_renames("Exception"), "new class prefix 'Exception' is a Python builtin"),
    "math": (_renames("math"), "'math' is a module the modeling code may import"),
    "lower case": (_renames("myModel"), "'myModel' does not start with a capital letter"),
    "modeling path": (
        lambda d: d.update(modeling_file="../../evil.py"),
        "modeling_file '../../evil.py' is not",
    ),
    "absolute file": (lambda d: d.update(configuration_file="/etc/x.py"), "configuration_file '/etc/x.py'"),
    "auto_map type": (lambda d: d.update(auto_map=5), "auto_map must be an object"),
    "injections type": (lambda d: d.update(injections=[1]), "injections must be an object of op: injection"),
    "classes type": (
        lambda d: d["injections"]["rms_norm"].update(classes=5),
        "injection 'rms_norm': classes must be a list of Python names, not 5",
    ),
    "function name": (
        lambda d: d["injections"]["mrope"].update(functions=["os.system"]),
        "functions must be a list of Python names",
    ),
    "mrope type": (lambda d: d.update(mrope_section="abc"), "mrope_section must be a list of whole numbers"),
    "mrope values": (
        lambda d: d.update(mrope_section=[16, "x", 24]),
        "mrope_section must be a list of positive",
    ),
    "tiny type": (lambda d: d.update(tiny=3), "tiny must be an object, not int"),
    "tie type": (lambda d: d.update(tie_word_embeddings="yes"), "tie_word_embeddings must be true or false"),
    "disagreements": (lambda d: d.update(disagreements=[1]), "disagreements must be a list of strings"),
    "name type": (lambda d: d.update(name=["a"]), "name must be a string, not list"),
}


def _spec_file(tmp_path: Path, edit) -> Path:
    data = copy.deepcopy(BASE)
    edit(data)
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize("case", CASES)
def test_a_spec_is_data(case, tmp_path: Path):
    edit, said = CASES[case]
    with pytest.raises(SpecError) as refused:
        load_spec(str(_spec_file(tmp_path, edit)))
    assert refused.value.exit_code == EXIT_USAGE and said in refused.value.message, refused.value.message
    assert "\n" not in refused.value.message and refused.value.hint


def test_every_bundled_spec_passes():
    assert len(all_specs()) >= 10


def test_verify_refuses_a_spec_that_imports_from_elsewhere_before_anything_loads(
    patched_tiny: Path, tmp_path: Path, capsys
):
    spec = _spec_file(tmp_path, CASES["hub repo"][0])
    code = run_in_process("verify", "--model", str(spec), "--model-path", str(patched_tiny))
    err = capsys.readouterr().err
    assert code == EXIT_USAGE and "auto_map 'AutoModel' names 'other/repo--modeling_x.Cls'" in err, err
    assert "Traceback" not in err and "unexpected error" not in err


def test_a_folder_whose_config_auto_map_was_edited_to_reach_out_is_refused(
    patched_copy: Path, capsys, monkeypatch
):
    from pto_patch.run import loading

    monkeypatch.setattr(loading, "load_model", lambda *a, **k: pytest.fail("loaded before the check"))
    config = patched_copy / "config.json"
    data = json.loads(config.read_text())
    data["auto_map"]["AutoModelForImageTextToText"] = "/tmp/evil.Evil"
    config.write_text(json.dumps(data))
    code = run_in_process("verify", "--model-path", str(patched_copy), "--allow-modified")
    err = capsys.readouterr().err
    assert (
        code == EXIT_USAGE
        and "config.json's auto_map 'AutoModelForImageTextToText' names '/tmp/evil.Evil'" in err
    )
    assert "Traceback" not in err
