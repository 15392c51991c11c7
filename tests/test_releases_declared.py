"""What pyproject declares for torch and transformers is what the suite runs (docs/releases.md).

The lowest release each range allows is one a test runs, and every release the matrix tests fits it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

from tests.release_envs import ENV_RELEASES
from tests.release_sources import RELEASES as SOURCE_RELEASES

REPO = Path(__file__).resolve().parents[1]
tomllib = pytest.importorskip("tomllib")  # Python 3.11+


def requirement(name: str) -> Requirement:
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    found = [Requirement(text) for text in project["dependencies"] if Requirement(text).name == name]
    assert len(found) == 1, f"pyproject.toml names {name} {len(found)} times"
    return found[0]


def floor(req: Requirement) -> Version:
    lows = [Version(spec.version) for spec in req.specifier if spec.operator in (">=", "==", "~=")]
    assert lows, f"{req} has no lower bound"
    return max(lows)


def test_the_lowest_torch_allowed_is_the_one_the_suite_runs():
    import torch

    running = Version(torch.__version__)
    req = requirement("torch")
    assert req.specifier.contains(running.base_version), f"the suite runs torch {running}, outside {req}"
    lowest = floor(req)
    assert (lowest.major, lowest.minor) == (running.major, running.minor), (
        f"pyproject allows torch from {lowest}, the suite runs {running}: test the floor or raise it"
    )


def test_every_tested_transformers_release_fits_the_range_and_the_lowest_is_tested():
    import transformers

    req = requirement("transformers")
    tested = {*ENV_RELEASES, transformers.__version__}
    assert all(req.specifier.contains(release) for release in tested), (req, sorted(tested))
    assert set(ENV_RELEASES) <= set(SOURCE_RELEASES) | {transformers.__version__}  # codemods seen on each
    lowest = floor(req)
    assert any(
        (Version(release).major, Version(release).minor) == (lowest.major, lowest.minor) for release in tested
    ), f"pyproject allows transformers from {lowest}; the suite runs {sorted(tested)}"
