"""`download` under every huggingface_hub major the supported transformers releases pull in.

The venv's hub (2.x, httpx2) runs tests/test_download.py directly. Here the same file runs in a fresh
interpreter whose path starts with a release environment (tests/release_envs.py): transformers 4.57
brings hub 0.36 (requests), transformers 5.16 hub 1.33 (httpx). Every success and error path of
that file runs against the local hub under each; the end-to-end verify run is left to the venv.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.release_envs import EnvUnavailable, release_env

REPO = Path(__file__).resolve().parents[1]
# transformers release -> the huggingface_hub major its env holds
HUB_RELEASES = {"4.57.6": 0, "5.16.1": 1}
RUN_TIMEOUT_S = 600


def _env(site: Path) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(REPO)])}
    env.pop("HF_HUB_OFFLINE", None)
    return env


@pytest.mark.slow
@pytest.mark.parametrize("release", list(HUB_RELEASES))
def test_download_under_each_hub_major(release: str):
    try:
        site = release_env(release).site
    except EnvUnavailable as exc:
        pytest.skip(str(exc))
    env = _env(site)
    version = subprocess.run(
        [sys.executable, "-c", "import huggingface_hub; print(huggingface_hub.__version__)"],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=120,
    )
    assert version.returncode == 0, version.stderr
    assert int(version.stdout.strip().split(".")[0]) == HUB_RELEASES[release], version.stdout

    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "tests/test_download.py",
            "-k",
            "not end_to_end",
        ],  # fmt: skip
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=RUN_TIMEOUT_S,
    )
    summary = (done.stdout.strip().splitlines() or [""])[-1]
    assert done.returncode == 0, f"hub {version.stdout.strip()}: {done.stdout[-4000:]}{done.stderr[-2000:]}"
    assert " passed" in summary and "skipped" not in summary, summary
