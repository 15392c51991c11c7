"""Qwen2.5-VL source files of several transformers releases, taken from their PyPI wheels.

Each release's `modeling_qwen2_5_vl.py` and `configuration_qwen2_5_vl.py` are cached under
~/.cache/pto-patch-tests/transformers/<version>/ (override the root with PTO_PATCH_TEST_CACHE);
the wheel itself is not kept. `release_folder` raises ReleaseUnavailable (with the reason) when
the wheel cannot be fetched, e.g. when PyPI is unreachable; the fixture turns that into a skip.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

# What pip prints when PyPI cannot be reached: only then is a missing release a skip, not a failure.
PYPI_UNREACHABLE = (
    "NewConnectionError",
    "Failed to establish a new connection",
    "Temporary failure in name resolution",
    "Name or service not known",
    "Network is unreachable",
    "ConnectTimeout",
    "ReadTimeout",
    "ProxyError",
    "Max retries exceeded",
    "Connection refused",
)

# The codemod tests' releases; the load tests' are tests/release_envs.py's ENV_RELEASES.
RELEASES = ("4.57.6", "5.0.0", "5.8.1", "5.16.1", "5.24.0", "5.25.0")
MODEL_DIR = "transformers/models/qwen2_5_vl"
FILES = ("modeling_qwen2_5_vl.py", "configuration_qwen2_5_vl.py")
DOWNLOAD_TIMEOUT_S = 300


class ReleaseUnavailable(Exception):
    """The release's wheel could not be fetched or lacks the files."""


def cache_root() -> Path:
    base = os.environ.get("PTO_PATCH_TEST_CACHE") or Path.home() / ".cache" / "pto-patch-tests"
    return Path(base) / "transformers"


def installed_folder() -> Path:
    """The installed transformers' qwen2_5_vl folder, found without importing transformers."""
    spec = importlib.util.find_spec("transformers")
    if spec is None or not spec.submodule_search_locations:
        raise ReleaseUnavailable("transformers is not installed")
    return Path(next(iter(spec.submodule_search_locations))) / "models" / "qwen2_5_vl"


def release_folder(version: str) -> Path:
    """The cached folder holding `FILES` of transformers `version`, fetched on first use."""
    folder = cache_root() / version
    if all((folder / name).is_file() for name in FILES):
        return folder
    with tempfile.TemporaryDirectory() as tmp:
        command = [
            sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
            "--disable-pip-version-check", "--quiet", f"transformers=={version}", "-d", tmp,
        ]  # fmt: skip
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=DOWNLOAD_TIMEOUT_S)
        except subprocess.TimeoutExpired as exc:
            raise ReleaseUnavailable(
                f"pip download transformers=={version} timed out (PyPI unreachable?)"
            ) from exc
        wheels = list(Path(tmp).glob("transformers-*.whl"))
        if done.returncode != 0 or not wheels:
            reason = (done.stderr.strip().splitlines() or ["no wheel"])[-1]
            if any(marker in done.stdout + done.stderr for marker in PYPI_UNREACHABLE):
                raise ReleaseUnavailable(f"PyPI unreachable: pip download transformers=={version}: {reason}")
            raise RuntimeError(f"pip download transformers=={version} failed: {done.stderr[-2000:]}")
        staging = Path(tmp) / "files"
        staging.mkdir()
        with zipfile.ZipFile(wheels[0]) as wheel:
            for name in FILES:
                try:
                    (staging / name).write_bytes(wheel.read(f"{MODEL_DIR}/{name}"))
                except KeyError as exc:  # a real failure: the release moved the model, not a network problem
                    raise RuntimeError(f"transformers {version} wheel has no {MODEL_DIR}/{name}") from exc
        folder.parent.mkdir(parents=True, exist_ok=True)
        # Copy beside, then rename into place: a concurrent run never sees a half-copied folder.
        partial = folder.parent / f".{folder.name}.{os.getpid()}.partial"
        shutil.copytree(staging, partial)
        if folder.exists() and not all((folder / name).is_file() for name in FILES):
            shutil.rmtree(folder, ignore_errors=True)
        try:
            os.replace(partial, folder)
        except OSError:  # another run put a complete copy there first
            shutil.rmtree(partial, ignore_errors=True)
    return folder
