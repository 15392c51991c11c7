"""PyPTO on an Ascend NPU: the checks before the first kernel compiles there, and the settings it runs with.

What PyPTO 0.2.0's own source does on a device, and what a first run would otherwise meet:
- `import pypto` loads its real runtime (lib/libtile_fwk_runtime.so) only if `ASCEND_HOME_PATH` is set at
  that moment, else a stub (libtile_fwk_runtime_stub.so) that cannot launch anything;
- the AI Core compile runs `bisheng` from PATH and the AICPU control flow builds with CANN's aarch64
  toolchain, `$ASCEND_HOME_PATH/toolkit/toolchain/hcc/bin/aarch64-target-linux-gnu-g++`, against the
  headers under `$ASCEND_HOME_PATH/include/pto`; some failures there end the process instead of raising;
- compile output goes to `./output` of the current folder unless `TILE_FWK_OUTPUT_DIR` is set, and a
  folder that cannot be made is a hard error;
- the on-disk binary cache (`$HOME/ast_data/<soc>`) is off (lib/configs/tile_fwk_config.json), so every
  process compiles every kernel on its first call;
- the workspace is allocated, and the kernel launched, on the current NPU, not the tensors'.

`preflight()` checks all of that without importing pypto (and is tested on fake directory trees);
`prepare()` runs it once per process before the first NPU kernel is built: when it passes, it points
`TILE_FWK_OUTPUT_DIR` at this package's cache folder (unless the user set it), turns the binary cache on
and checks which runtime pypto loaded; when it fails, every NPU kernel raises DeviceNotReadyError with
the one-line reason, and the dispatcher falls back to the torch path, counted, with that reason.
`on_device(tensor)` makes the tensor's NPU current around a launch. Nothing here needs an NPU to import.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

CACHE_ENV = "PTO_KERNELS_CACHE_DIR"
OUTPUT_ENV = "TILE_FWK_OUTPUT_DIR"
ASCEND_ENV = "ASCEND_HOME_PATH"
SET_ENV_HINT = (
    "source CANN's set_env.sh (e.g. /usr/local/Ascend/ascend-toolkit/set_env.sh) before starting Python"
)
RUNTIME_REAL, RUNTIME_STUB = "libtile_fwk_runtime.so", "libtile_fwk_runtime_stub.so"
AICPU_COMPILER = Path("toolkit", "toolchain", "hcc", "bin", "aarch64-target-linux-gnu-g++")
PTO_HEADERS = Path("include", "pto")
TILE_LIB_ENV = "PTO_TILE_LIB_CODE_PATH"  # pto-isa's headers, looked at before ASCEND_HOME_PATH's
BINARY_CACHE_KEY = (
    "pass.enable_binary_cache"  # pypto.config.set_global_config's key (the "global." is its own)
)


class DeviceNotReadyError(RuntimeError):
    """PyPTO cannot compile for the NPU here: the one-line reason says what to fix."""


class CompileDuringCaptureError(RuntimeError):
    """A PyPTO kernel would compile while a device graph is captured: warm it up eagerly first."""


def cache_root(env: Mapping[str, str] = os.environ) -> Path:
    """pto_kernels' cache folder: `$PTO_KERNELS_CACHE_DIR`, else `$XDG_CACHE_HOME/pto_kernels`, else
    `~/.cache/pto_kernels` (the order huggingface_hub follows for its own cache)."""
    explicit = env.get(CACHE_ENV)
    if explicit:
        return Path(explicit).expanduser()
    xdg = env.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "pto_kernels"


def output_dir(env: Mapping[str, str] = os.environ) -> Path:
    """Where pypto writes its compile output: the user's `TILE_FWK_OUTPUT_DIR`, else our cache folder."""
    explicit = env.get(OUTPUT_ENV)
    return Path(explicit).expanduser() if explicit else cache_root(env) / "pypto-output"


def binary_cache_dir(env: Mapping[str, str] = os.environ) -> Path:
    """pypto's own on-disk binary cache folder, `$HOME/ast_data` (0.2 takes no other place)."""
    return Path(env.get("HOME") or Path.home()) / "ast_data"


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str  # what was found, where
    hint: str = ""  # what to do when not ok

    def line(self) -> str:
        return self.detail + (f": {self.hint}" if self.hint and not self.ok else "")


@dataclass(frozen=True)
class Preflight:
    checks: tuple[Check, ...]
    output_dir: str
    binary_cache_dir: str
    settings: dict[str, object] = field(default_factory=dict)  # what prepare() set (empty before)

    @property
    def ready(self) -> bool:
        return all(check.ok for check in self.checks)

    @property
    def reason(self) -> str | None:
        """The first failed check in one line, with what to do; None when every check passed."""
        failed = [check for check in self.checks if not check.ok]
        return f"pypto cannot compile for the NPU: {failed[0].line()}" if failed else None

    def to_json(self) -> dict:
        return {
            "ready": self.ready,
            "reason": self.reason,
            "output_dir": self.output_dir,
            "binary_cache_dir": self.binary_cache_dir,
            "settings": dict(self.settings),
            "checks": [{"name": c.name, "ok": c.ok, "detail": c.detail, "hint": c.hint} for c in self.checks],
        }


def loaded_runtime(maps_text: str | None = None) -> str:
    """Which pypto runtime library this process has loaded: "real", "stub" or "none" (read from the
    process's memory map, /proc/self/maps)."""
    if maps_text is None:
        try:
            maps_text = Path("/proc/self/maps").read_text(encoding="utf-8", errors="replace")
        except OSError:
            return "unknown"
    names = {
        line.rsplit("/", 1)[-1].strip() for line in maps_text.splitlines() if "libtile_fwk_runtime" in line
    }
    if RUNTIME_REAL in names:
        return "real"
    return "stub" if RUNTIME_STUB in names else "none"


def _writable(folder: Path) -> str | None:
    """None if a file can be made in `folder` (made first if missing); else why not."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".pto_kernels_probe_"):
            pass
    except OSError as exc:
        return exc.strerror or str(exc)
    return None


def _is_executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def _headers_check(env: Mapping[str, str], home: str) -> Check:
    """pto-isa's headers where PyPTO looks: `$PTO_TILE_LIB_CODE_PATH/include/pto` first (PyPTO asserts when
    that variable is set and the folder is missing), else `$ASCEND_HOME_PATH/include/pto` (hicann/pypto
    `codegen_cloudnpu.cpp`)."""
    tile_lib = env.get(TILE_LIB_ENV)
    if tile_lib:
        headers, source = Path(tile_lib, PTO_HEADERS), f" (from {TILE_LIB_ENV})"
        hint = f"point {TILE_LIB_ENV} at a pto-isa checkout holding include/pto, or unset it to use CANN's"
    else:
        headers, source = Path(home, PTO_HEADERS), ""
        hint = "install the CANN toolkit that pypto 0.2 was built for"
    there = headers.is_dir()
    return Check("pto_headers", there, f"{headers}{source} {'is there' if there else 'is missing'}", hint)


def preflight(
    env: Mapping[str, str] = os.environ,
    *,
    pypto_imported: bool | None = None,
    maps_text: str | None = None,
    which: Callable[..., str | None] = shutil.which,
) -> Preflight:
    """Every check PyPTO's NPU compile and launch need, in the order a fix is best made; pypto itself is
    not imported. `pypto_imported` (default: whether it is in sys.modules) decides whether the loaded
    runtime library is checked now or after import."""
    checks = []
    home = env.get(ASCEND_ENV)
    if not home:
        checks.append(Check("ascend_home", False, f"{ASCEND_ENV} is not set", SET_ENV_HINT))
    elif not Path(home).is_dir():
        checks.append(Check("ascend_home", False, f"{ASCEND_ENV}={home} is not a folder", SET_ENV_HINT))
    else:
        checks.append(Check("ascend_home", True, f"{ASCEND_ENV}={home}"))
    imported = "pypto" in sys.modules if pypto_imported is None else pypto_imported
    if imported:
        runtime = loaded_runtime(maps_text)
        checks.append(
            Check(
                "runtime",
                runtime == "real",
                f"pypto's {runtime} runtime is loaded",
                f"pypto was imported before {ASCEND_ENV} was set: export it before Python starts"
                if runtime == "stub"
                else "reinstall pypto==0.2.*",
            )
        )
    if home and Path(home).is_dir():
        bisheng = which("bisheng", path=env.get("PATH", ""))
        checks.append(
            Check(
                "bisheng",
                bisheng is not None,
                f"bisheng at {bisheng}" if bisheng else "bisheng (the AI Core compiler) is not on PATH",
                f"add {Path(home, 'compiler', 'ccec_compiler', 'bin')} to PATH ({SET_ENV_HINT})",
            )
        )
        checks.append(_headers_check(env, home))
        aicpu = Path(home, AICPU_COMPILER)
        checks.append(
            Check(
                "aicpu_toolchain",
                _is_executable(aicpu),
                f"{aicpu} {'is there' if _is_executable(aicpu) else 'is missing or not executable'}",
                "install CANN's toolkit with its aarch64 hcc toolchain (pypto builds the AICPU control flow with it)",
            )
        )
    out = output_dir(env)
    problem = _writable(out)
    checks.append(
        Check(
            "output_dir",
            problem is None,
            f"compile output folder {out}" + ("" if problem is None else f" is not writable ({problem})"),
            f"set {OUTPUT_ENV} or {CACHE_ENV} to a writable folder",
        )
    )
    cache = binary_cache_dir(env)
    problem = _writable(cache)
    checks.append(
        Check(
            "binary_cache",
            problem is None,
            f"binary cache folder {cache}" + ("" if problem is None else f" is not writable ({problem})"),
            "make $HOME writable (pypto 0.2 keeps its binary cache in $HOME/ast_data)",
        )
    )
    return Preflight(tuple(checks), str(out), str(cache))


_prepared: Preflight | None = None
_ready = False


def prepare() -> Preflight:
    """Checked once per process, before the first NPU kernel: the settings applied, or
    DeviceNotReadyError with the one-line reason (raised again on every later call)."""
    global _prepared, _ready
    if _ready:  # the hot path: every NPU call of a pypto kernel passes here
        return _prepared
    if _prepared is None:
        _prepared = _prepare()
        _ready = _prepared.ready
    if not _ready:
        raise DeviceNotReadyError(_prepared.reason)
    return _prepared


def _prepare() -> Preflight:
    found = preflight()
    if not found.ready:
        return found
    os.environ.setdefault(OUTPUT_ENV, found.output_dir)  # read by pypto's compiler at each compile
    try:
        pypto = importlib.import_module("pypto")
    except Exception as exc:  # noqa: BLE001 - a CANN that does not match raises OSError and others
        failed = Check("import", False, f"import pypto failed ({type(exc).__name__}: {exc})", SET_ENV_HINT)
        return Preflight((*found.checks, failed), found.output_dir, found.binary_cache_dir)
    after = preflight(pypto_imported=True)
    if not after.ready:
        return after
    pypto.config.set_global_config(BINARY_CACHE_KEY, True)
    settings = {
        OUTPUT_ENV: os.environ[OUTPUT_ENV],
        "binary_cache": bool(pypto.config.get_global_config(BINARY_CACHE_KEY)),
    }
    return Preflight(after.checks, after.output_dir, after.binary_cache_dir, settings)


def prepared() -> Preflight | None:
    """What prepare() found in this process, or None before the first NPU kernel."""
    return _prepared


def reset() -> None:
    """Forget prepare()'s result (tests; or after fixing the environment in a running process)."""
    global _prepared, _ready
    _prepared, _ready = None, False


def capturing(device_type: str) -> bool:
    """True while the current stream of `device_type` is captured into a device graph (ACL graph)."""
    import torch

    probe = getattr(getattr(torch, device_type, None), "is_current_stream_capturing", None)
    return bool(probe()) if callable(probe) else False


@contextlib.contextmanager
def on_device(device) -> Iterator[None]:
    """Make `device` (an NPU torch.device) the current NPU for a launch: pypto 0.2 launches on the current
    NPU's stream and allocates its workspace there. Restores the previous one after."""
    import torch

    npu = torch.npu
    before = npu.current_device()
    index = device.index if device.index is not None else before
    if index == before:
        yield
        return
    npu.set_device(index)
    try:
        yield
    finally:
        npu.set_device(before)
