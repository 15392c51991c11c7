"""What pyproject declares is what CI runs, at both ends of every range (docs/releases.md).

- python and torch: the floor is the seed lane's (`.ci/stack_lane seed`: the reference's Python 3.10 and
  torch 2.9.0), the top the top lane's (the highest minor each upper bound admits);
- transformers: the lowest and the highest release the range admits are both in the release matrix (or
  the venv's own);
- huggingface_hub: the floor is the one the 4.57.6 env pins, the top's major is what the venv resolves;
- and the interpreter running this file is inside every range.
"""

from __future__ import annotations

import platform
import re
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from tests.release_envs import ENV_RELEASES, PINS
from tests.release_sources import RELEASES as SOURCE_RELEASES

REPO = Path(__file__).resolve().parents[1]
try:
    import tomllib
except ImportError:  # Python 3.10: pytest itself depends on tomli there
    tomllib = pytest.importorskip("tomli")


def project() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]


def requirement(name: str) -> Requirement:
    found = [Requirement(text) for text in project()["dependencies"] if Requirement(text).name == name]
    assert len(found) == 1, f"pyproject.toml names {name} {len(found)} times"
    return found[0]


def floor(specifier: SpecifierSet) -> Version:
    lows = [Version(spec.version) for spec in specifier if spec.operator in (">=", "==", "~=")]
    assert lows, f"{specifier} has no lower bound"
    return max(lows)


def ceiling(specifier: SpecifierSet) -> Version:
    highs = [Version(spec.version) for spec in specifier if spec.operator == "<"]
    assert highs, f"{specifier} has no upper bound: its top cannot be tested"
    return min(highs)


def minor(version: Version | str) -> tuple[int, int]:
    version = Version(str(version))
    return version.major, version.minor


def lane(name: str) -> dict[str, str]:
    """The Python, torch and transformers `.ci/stack_lane NAME` installs."""
    text = (REPO / ".ci" / "stack_lane").read_text(encoding="utf-8")
    match = re.search(rf"^\s*{name}\) python=(\S+); torch=(\S+); transformers=(\S*) ;;", text, re.MULTILINE)
    assert match, f".ci/stack_lane has no {name} lane"
    return dict(zip(("python", "torch", "transformers"), match.groups(), strict=True))


def lanes_ci_runs() -> str:
    return (REPO / ".ci" / "run").read_text(encoding="utf-8")


def test_ci_runs_both_stack_lanes():
    text = lanes_ci_runs()
    assert "stack_lane seed" in text and "stack_lane top" in text


def test_python_floor_and_top_are_the_lanes_pythons():
    specifier = SpecifierSet(project()["requires-python"])
    assert minor(floor(specifier)) == minor(lane("seed")["python"])
    top = ceiling(specifier)
    assert minor(lane("top")["python"]) == (top.major, top.minor - 1), (specifier, lane("top"))


def test_torch_floor_is_the_reference_stacks_and_the_top_is_the_top_lanes():
    specifier = requirement("torch").specifier
    assert floor(specifier) == Version(lane("seed")["torch"]) == Version("2.9.0")
    top = ceiling(specifier)
    assert minor(lane("top")["torch"]) == (top.major, top.minor - 1), (specifier, lane("top"))
    assert specifier.contains(lane("top")["torch"])


def test_the_seed_lane_is_the_reference_stack():
    assert lane("seed") == {"python": "3.10", "torch": "2.9.0", "transformers": "5.8.1"}


def test_every_tested_transformers_release_fits_and_both_ends_are_tested():
    import transformers

    specifier = requirement("transformers").specifier
    tested = {*ENV_RELEASES, transformers.__version__}
    assert all(specifier.contains(release) for release in tested), (specifier, sorted(tested))
    assert set(ENV_RELEASES) <= set(SOURCE_RELEASES) | {transformers.__version__}  # codemods seen on each
    assert floor(specifier) in {Version(release) for release in tested}, (specifier, sorted(tested))
    top = ceiling(specifier)
    assert any(minor(release) == (top.major, top.minor - 1) for release in tested), (
        specifier,
        sorted(tested),
    )


def test_huggingface_hub_floor_is_pinned_in_the_matrix_and_the_top_major_resolved():
    import huggingface_hub

    specifier = requirement("huggingface_hub").specifier
    pinned = {
        Version(p.split("==")[1]) for pins in PINS.values() for p in pins if p.startswith("huggingface_hub==")
    }
    lowest = floor(specifier)
    assert any(minor(v) == minor(lowest) for v in pinned), (specifier, sorted(pinned))
    top = ceiling(specifier)
    have = Version(huggingface_hub.__version__)
    assert specifier.contains(have), (specifier, have)
    import transformers

    if minor(transformers.__version__) < (5, 24):  # the seed lane's 5.8.1 caps the hub below 2.0
        pytest.skip(f"transformers {transformers.__version__} caps huggingface_hub below the top major")
    assert have.major == top.major - 1, (specifier, have)


def test_this_interpreter_is_inside_every_declared_range():
    import torch
    import transformers

    assert SpecifierSet(project()["requires-python"]).contains(platform.python_version())
    assert requirement("torch").specifier.contains(Version(torch.__version__).base_version)
    assert requirement("transformers").specifier.contains(transformers.__version__)
