"""Importable environments of other transformers releases, for running the patch under each of them.

`release_env(version)` returns a pip `--target` folder holding that transformers release and the
dependency versions it needs that differ from this venv's (huggingface_hub, tokenizers, ...). Put it
first on PYTHONPATH in a fresh interpreter and that release shadows the venv's transformers; torch,
numpy, safetensors and the rest still come from the venv.

pip runs with `--no-deps`: every package is named in `PINS`, so pip never resolves (and never pulls
torch). After the install, every requirement of every package in the folder is checked against the
folder and the venv, so a pin that no longer fits fails loudly instead of at import time.

Folders are built once and cached under ~/.cache/pto-patch-tests/envs/<version>/ (root overridable
with PTO_PATCH_TEST_CACHE, as for tests/release_sources.py). A lock file serialises concurrent pytest
runs; `complete.json`, written atomically last, marks a finished build and records what it holds, so
a changed pin or another Python rebuilds it.
"""

from __future__ import annotations

import fcntl
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import Version

from tests.release_sources import PYPI_UNREACHABLE, cache_root

# Per release, the packages whose venv versions do not satisfy its requirements (transformers'
# own and, transitively, those of the pinned packages). Found from each wheel's METADATA.
_HUB_0_36 = (
    "huggingface_hub==0.36.2",  # 4.57: huggingface-hub<1.0
    "requests==2.34.2",  # hub 0.x talks HTTP through requests, which the venv lacks
    "charset-normalizer==3.5.3",
    "urllib3==2.8.0",
    "certifi==2026.10.19.post1",
)
_HUB_1 = (
    "huggingface_hub==1.33.0",  # 5.0 - 5.16: huggingface-hub<2.0 (the venv has 2.x)
    "httpx==0.28.1",  # hub 1.x uses httpx, the venv's hub 2.x httpx2
    "httpcore==1.0.9",
    "certifi==2026.10.19.post1",
)
_TOKENIZERS_0_22 = ("tokenizers==0.22.2",)  # 4.57 - 5.8: tokenizers<=0.23.0 (the venv has 0.23.3)
PINS: dict[str, tuple[str, ...]] = {
    "4.57.6": _HUB_0_36 + _TOKENIZERS_0_22,
    "5.0.0": _HUB_1 + _TOKENIZERS_0_22,
    "5.8.1": _HUB_1 + _TOKENIZERS_0_22,
    "5.16.1": _HUB_1,
    "5.24.0": (),  # the first release that takes generate(cache=...); the venv's hub, tokenizers fit
    "5.25.0": (),  # the venv's hub 2.4, tokenizers 0.23 and safetensors 0.8 fit; kernels: see below
}
# Per release, requirements left unmet on purpose. 5.25 requires kernels>=0.19.1,<0.20: its env is what a
# user gets after `pip install --no-deps`, and a test that wants kernels puts tests/stand_in_kernels/ on
# the path (the real kernels 0.19 needs the hub for its layers).
LEFT_OUT: dict[str, tuple[str, ...]] = {"5.25.0": ("kernels",)}
# The venv's own transformers (5.25) pulls in kernels 0.19, which no other release asks for and which
# 5.0 and 5.8 cannot even import beside ("Either a revision or a version must be specified"): every env
# hides the venv's copy, as `pip install transformers==X` leaves none. A `kernels` put first on
# PYTHONPATH (the stand-in) stays visible.
HIDE_VENV_KERNELS = """\
# Written by tests/release_envs.py: this env is what `pip install transformers==X` gives, without `kernels`.
import importlib.util as _util
import os as _os
import sys as _sys

_spec = _util.find_spec("kernels")
if _spec is not None and _spec.origin and _os.path.realpath(_spec.origin).startswith({venv!r}):
    _sys.modules["kernels"] = None  # `import kernels` fails and find_spec says None, as if not installed
"""
ENV_RELEASES = tuple(PINS)  # what the release matrix runs under, beside the venv's own release
# A requirement met by another distribution that ships the same import package.
PROVIDED_BY = {"typer-slim": "typer"}  # 5.0 asks for typer-slim; the venv's typer provides `typer`

PIP_TIMEOUT_S = 600
LOCK_TIMEOUT_S = 900
MARKER = "complete.json"
# Substrings of pip's output that mean the index could not be reached (as opposed to a bad pin).
_UNREACHABLE = PYPI_UNREACHABLE


class EnvUnavailable(Exception):
    """The package index could not be reached; the caller skips."""


class EnvBuildError(Exception):
    """pip failed for another reason, or the built folder does not satisfy its own requirements."""


@dataclass(frozen=True)
class ReleaseEnv:
    release: str
    site: Path  # the --target folder to put first on PYTHONPATH
    build_s: float  # what building it cost when it was built (0 if it was already cached)
    built_now: bool


def envs_root() -> Path:
    return cache_root().parent / "envs"


def _normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _wanted(release: str) -> dict:
    return {
        "release": release,
        "packages": [f"transformers=={release}", *PINS[release]],
        "left_out": list(LEFT_OUT.get(release, ())),
        "python": sys.implementation.cache_tag,  # tokenizers is a compiled wheel
        "platform": sys.platform,
    }


def unmet_requirements(site: Path, left_out: tuple[str, ...] = ()) -> list[str]:
    """Requirements of the packages in `site` that neither `site` nor this interpreter's env meets,
    but for the distributions named in `left_out`."""
    in_site = {_normalized(d.metadata["Name"]): d for d in importlib.metadata.distributions(path=[str(site)])}
    unmet = []
    for dist in in_site.values():
        for text in dist.requires or ():
            requirement = Requirement(text)
            if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
                continue
            name = _normalized(requirement.name)
            if name in {_normalized(n) for n in left_out}:
                continue
            provider = in_site.get(name)
            if provider is not None:
                have = provider.version
            else:
                try:
                    have = importlib.metadata.version(PROVIDED_BY.get(name, name))
                except importlib.metadata.PackageNotFoundError:
                    unmet.append(f"{dist.metadata['Name']} needs {text}: not installed")
                    continue
                if name in PROVIDED_BY:
                    continue  # another distribution; its version numbers are not comparable
            if requirement.specifier and not requirement.specifier.contains(Version(have), prereleases=True):
                unmet.append(f"{dist.metadata['Name']} needs {text}: found {have}")
    return unmet


def _pip_install(packages: list[str], target: Path) -> None:
    command = [
        sys.executable, "-m", "pip", "install", "--no-deps", "--only-binary=:all:", "--no-input",
        "--disable-pip-version-check", "--no-warn-conflicts", "--retries", "1", "--timeout", "20",
        "--target", str(target), *packages,
    ]  # fmt: skip
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=PIP_TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        raise EnvUnavailable(f"pip install {' '.join(packages)} timed out (PyPI unreachable?)") from exc
    if done.returncode == 0:
        return
    output = done.stdout + done.stderr
    last = (done.stderr.strip().splitlines() or ["no output"])[-1]
    if any(marker in output for marker in _UNREACHABLE):
        raise EnvUnavailable(f"PyPI unreachable while installing transformers env: {last}")
    raise EnvBuildError(f"pip install --target {target} {' '.join(packages)} failed: {output[-2000:]}")


def _lock(path: Path):
    handle = open(path, "a+")  # noqa: SIM115 - held until the build is done
    deadline = time.monotonic() + LOCK_TIMEOUT_S
    while True:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return handle
        except BlockingIOError:
            if time.monotonic() > deadline:
                handle.close()
                raise EnvBuildError(f"{path} stayed locked for {LOCK_TIMEOUT_S} s") from None
            time.sleep(1)


def _read_marker(folder: Path) -> dict | None:
    try:
        return json.loads((folder / MARKER).read_text())
    except (OSError, ValueError):
        return None


def _hide_venv_kernels(site: Path) -> None:
    """Write the env's sitecustomize (HIDE_VENV_KERNELS), atomically, when it is missing or differs."""
    import sysconfig

    venv = os.path.realpath(sysconfig.get_paths()["purelib"]) + os.sep
    text = HIDE_VENV_KERNELS.format(venv=venv)
    target = site / "sitecustomize.py"
    if target.is_file() and target.read_text(encoding="utf-8") == text:
        return
    temporary = site / f".sitecustomize.{os.getpid()}.tmp"
    temporary.write_text(text, encoding="utf-8")
    os.replace(temporary, target)


def release_env(release: str) -> ReleaseEnv:
    """The cached --target folder for `release`, built on first use (see the module docstring)."""
    env = _release_env(release)
    _hide_venv_kernels(env.site)
    return env


def _release_env(release: str) -> ReleaseEnv:
    if release not in PINS:
        raise KeyError(f"no pins for transformers {release}; add them to PINS in {__file__}")
    folder = envs_root() / release
    site = folder / "site"
    wanted = _wanted(release)
    marker = _read_marker(folder)
    if marker is not None and {k: marker.get(k) for k in wanted} == wanted and site.is_dir():
        return ReleaseEnv(release, site, 0.0, built_now=False)

    folder.parent.mkdir(parents=True, exist_ok=True)
    handle = _lock(folder.parent / f"{release}.lock")
    try:
        marker = _read_marker(folder)  # another run may have finished it while we waited
        if marker is not None and {k: marker.get(k) for k in wanted} == wanted and site.is_dir():
            return ReleaseEnv(release, site, 0.0, built_now=False)
        started = time.perf_counter()
        shutil.rmtree(folder, ignore_errors=True)
        partial = folder / "site.partial"
        partial.mkdir(parents=True)
        _pip_install(wanted["packages"], partial)
        unmet = unmet_requirements(partial, LEFT_OUT.get(release, ()))
        if unmet:
            raise EnvBuildError(f"transformers {release} env in {partial} is incomplete: " + "; ".join(unmet))
        if any((partial / name).exists() for name in ("torch", "numpy")):
            raise EnvBuildError(f"pip put torch or numpy into {partial}; the env must use the venv's")
        partial.rename(site)
        build_s = time.perf_counter() - started
        temporary = folder / f".{MARKER}.tmp"
        temporary.write_text(json.dumps({**wanted, "build_s": round(build_s, 1)}, indent=2))
        os.replace(temporary, folder / MARKER)
        return ReleaseEnv(release, site, build_s, built_now=True)
    finally:
        handle.close()
