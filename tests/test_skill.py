"""The agent skill: its front matter, and `pto-patch skill install / show`."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pto_patch.cli import skill
from pto_patch.errors import PtoPatchError
from tests.helpers.cli import run_cli

REPO = Path(__file__).resolve().parents[1]
SKILL_DIR = REPO / "skills" / "pto-patch"
TRIGGER_WORDS = (
    "NPU",
    "昇腾",
    "Ascend",
    "算子融合",
    "整网集成",
    "auto_map",
    "离线加载",
    "PyPTO",
    "GutenOCR",
    "Qwen2.5-VL",
    "RMSNorm",
    "MRoPE",
    "SwiGLU",
    "fused kernels",
)


def front_matter(text: str) -> dict[str, str]:
    """The `key: value` pairs of a SKILL.md front matter (folded `>-` values joined with spaces)."""
    match = re.match(r"^---\n(.*?)\n---\n", text, re.S)
    assert match, "SKILL.md does not start with a --- front matter ---"
    fields: dict[str, str] = {}
    key = None
    for line in match.group(1).splitlines():
        if line.startswith((" ", "\t")) and key:
            fields[key] = (fields[key] + " " + line.strip()).strip()
        else:
            key, _, value = line.partition(":")
            fields[key.strip()] = "" if value.strip() in (">-", ">", "|") else value.strip()
    return fields


def test_front_matter_names_the_skill_and_its_trigger_words():
    fields = front_matter((SKILL_DIR / "SKILL.md").read_text(encoding="utf-8"))
    assert fields["name"] == "pto-patch"
    description = fields["description"].lower()
    missing = [word for word in TRIGGER_WORDS if word.lower() not in description]
    assert not missing, f"the description lacks trigger words {missing}"


def test_front_matter_parser_sees_a_missing_word():
    fields = front_matter("---\nname: x\ndescription: >-\n  NPU and\n  Ascend\n---\nbody\n")
    assert fields == {"name": "x", "description": "NPU and Ascend"}


def test_skill_folder_holds_references_and_scripts():
    names = {path.relative_to(SKILL_DIR).as_posix() for path in SKILL_DIR.rglob("*") if path.is_file()}
    assert {
        "SKILL.md",
        "references/troubleshooting.md",
        "references/layout.md",
        "references/json-schemas.md",
        "scripts/check_report.py",
    } <= names
    text = (SKILL_DIR / "SKILL.md").read_text(encoding="utf-8")
    for link in re.findall(r"\]\(([^)#]+)\)", text):
        assert (SKILL_DIR / link).is_file(), f"SKILL.md links to {link}, which is not in the skill folder"


def test_install_into_the_default_folder_then_again_is_a_no_op(tmp_path: Path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    first = skill.install_skill()
    destination = tmp_path / ".agents" / "skills" / "pto-patch"
    assert first.action == skill.INSTALLED and first.destination == destination
    assert skill.file_hashes(destination) == skill.file_hashes(SKILL_DIR)
    assert set(first.files) == set(skill.file_hashes(SKILL_DIR))

    second = skill.install_skill()
    assert second.action == skill.UNCHANGED and second.sha256 == first.sha256


def test_a_changed_copy_is_refused_without_force_and_replaced_with_it(tmp_path: Path):
    destination = tmp_path / "skills" / "pto-patch"
    skill.install_skill(destination)
    edited = destination / "references" / "layout.md"
    edited.write_text("my notes\n", encoding="utf-8")
    (destination / "extra.md").write_text("mine\n", encoding="utf-8")

    with pytest.raises(PtoPatchError) as refused:
        skill.install_skill(destination)
    assert "references/layout.md" in refused.value.message and "extra.md" in refused.value.message
    assert "--force" in refused.value.hint and refused.value.exit_code == 1
    assert edited.read_text(encoding="utf-8") == "my notes\n"  # untouched

    replaced = skill.install_skill(destination, force=True)
    assert replaced.action == skill.REPLACED
    assert set(replaced.differed) == {"references/layout.md", "extra.md"}
    assert skill.file_hashes(destination) == skill.file_hashes(SKILL_DIR)


def test_same_bytes_under_new_modification_times_are_unchanged(tmp_path: Path):
    destination = tmp_path / "pto-patch"
    skill.install_skill(destination)
    target = destination / "SKILL.md"
    target.write_bytes(target.read_bytes())  # new mtime, same content
    assert skill.install_skill(destination).action == skill.UNCHANGED


def test_a_folder_that_is_not_a_skill_is_never_replaced(tmp_path: Path):
    destination = tmp_path / "project"
    destination.mkdir()
    (destination / "main.py").write_text("print(1)\n", encoding="utf-8")
    with pytest.raises(PtoPatchError, match="not a skill folder"):
        skill.install_skill(destination, force=True)
    assert (destination / "main.py").is_file()

    a_file = tmp_path / "file"
    a_file.write_text("x", encoding="utf-8")
    with pytest.raises(PtoPatchError, match="not a folder"):
        skill.install_skill(a_file, force=True)


def test_an_empty_folder_is_installed_into(tmp_path: Path):
    (tmp_path / "empty").mkdir()
    assert skill.install_skill(tmp_path / "empty").action == skill.INSTALLED


def test_cli_install_refuses_then_forces(tmp_path: Path, capsys):
    destination = tmp_path / "pto-patch"
    assert run_cli("skill", "install", str(destination)) == 0
    assert str(destination) in capsys.readouterr().out
    (destination / "SKILL.md").write_text("edited\n", encoding="utf-8")
    assert run_cli("skill", "install", str(destination)) == 1
    captured = capsys.readouterr()
    assert "error:" in captured.err and "hint:" in captured.err and captured.out == ""
    assert run_cli("skill", "install", str(destination), "--force") == 0
    assert (destination / "SKILL.md").read_bytes() == (SKILL_DIR / "SKILL.md").read_bytes()


def test_cli_show_prints_skill_md(capsys):
    assert run_cli("skill", "show") == 0
    assert capsys.readouterr().out == (SKILL_DIR / "SKILL.md").read_text(encoding="utf-8")
    assert skill.show_skill() == (SKILL_DIR / "SKILL.md").read_text(encoding="utf-8")
