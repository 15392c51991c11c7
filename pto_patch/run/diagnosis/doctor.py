"""`pto-patch doctor`: what this machine runs the kernels with, and whether each op's kernels compute
what the reference computes here, at GutenOCR-3B's widths.

The report names the stack (python, torch, torch_npu, CANN, pypto and which runtime it loaded, torchair,
transformers, vllm, vllm-ascend), the devices, PyPTO's NPU pre-flight (pto_kernels.backends.pypto_device), and
per op and backend one run of pto_kernels' entry through its wrapper, as a patched model calls it, on
random inputs of GutenOCR-3B's widths (hidden 2048, MLP 11008, 16 q / 2 kv heads of 128, mrope_section
[16, 24, 24]) against the reference backend in float64 on the CPU: the relative error (as the kernel
tests measure it), the largest absolute error, the run time (median) and the first call's time, and for
pypto the seconds pypto spent compiling. A backend that falls back to the torch path is a failure
named with its reason. Nothing is written anywhere.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import os
import platform
import shutil
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pto_patch.errors import EXIT_OK, EXIT_USAGE, EXIT_VERIFY_FAILED, PtoPatchError
from pto_patch.resources import kernels_dir
from pto_patch.run import device as devices
from pto_patch.run.diagnosis import device_checks
from pto_patch.run.diagnosis.ascend_pairs import check_pair
from pto_patch.run.diagnosis.device_checks import DeviceCheck

KERNEL_PACKAGE = "pto_kernels"
# GutenOCR-3B's text decoder (rootsautomation/GutenOCR-3B config.json)
WIDTHS = {"hidden": 2048, "intermediate": 11008, "q_heads": 16, "kv_heads": 2, "head_dim": 128}
SECTION = (16, 24, 24)
# the attention core: a static cache of 512 positions, 300 of them valid, at most 16 new rows
CORE_CACHE, CORE_VALID, CORE_MAX_ROWS = 512, 300, 16
# checks of an op's other entry, by the name the report gives them -> the op they are counted under:
# the prologue that also writes a decode step's k and v into a static cache (one row, at CORE_VALID)
ENTRY_CHECKS = {"attention_prologue_cached": "attention_prologue"}
EPS = 1e-6
# relative error (norm of the difference over the norm of the float64 reference) a kernel may reach
TOLERANCE = {"bfloat16": 1e-2, "float16": 2e-3, "float32": 1e-5}
DISTRIBUTIONS = ("torch", "torch-npu", "pypto", "transformers", "vllm", "vllm-ascend")
TIMED_CALLS = 3


@dataclass
class OpCheck:
    op: str
    backend: str
    status: (
        str  # "ok", "failed" (over the tolerance), "fell back" (served by the torch path), "error", "not run"
    )
    rel_error: float | None = None
    max_abs_error: float | None = None
    tolerance: float | None = None
    run_ms: float | None = None  # median of the timed calls after the first
    first_call_ms: float | None = None  # compiles included
    compile_s: float | None = (
        None  # pypto: seconds inside its compiles (the CPU interpreter compiles every call)
    )
    reason: str | None = None


@dataclass
class DoctorReport:
    stack: dict[str, Any]
    devices: dict[str, Any]
    pypto: dict[str, Any]
    device: str
    dtype: str
    tokens: int
    backends: list[str]
    checks: list[OpCheck] = field(default_factory=list)
    kernels_path: str | None = None
    seconds: float = 0.0
    device_checks: list[DeviceCheck] = field(default_factory=list)  # what a first 910B run must check

    @property
    def passed(self) -> bool:
        return all(check.status in ("ok", "not run") for check in (*self.checks, *self.device_checks))

    @property
    def exit_code(self) -> int:
        return EXIT_OK if self.passed else EXIT_VERIFY_FAILED

    @property
    def failures(self) -> list[str]:
        return [
            f"{c.op} on {c.backend}: {c.status}" + (f" ({c.reason})" if c.reason else "")
            for c in self.checks
            if c.status not in ("ok", "not run")
        ] + [
            f"device check {c.name} on {c.backend}: {c.status}" + (f" ({c.reason})" if c.reason else "")
            for c in self.device_checks
            if c.status not in ("ok", "not run")
        ]

    def to_json(self) -> dict[str, Any]:
        from pto_patch.run.report import document

        return document(
            "doctor",
            {
                "passed": self.passed,
                "stack": self.stack,
                "devices": self.devices,
                "pypto": self.pypto,
                "device": self.device,
                "dtype": self.dtype,
                "tokens": self.tokens,
                "backends": self.backends,
                "kernels_path": self.kernels_path,
                "checks": self.checks,
                "device_checks": self.device_checks,
                "failures": self.failures,
                "seconds": self.seconds,
            },
        )


# --- the stack ------------------------------------------------------------------------------------


def _version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def cann_version(home: Path) -> str | None:
    """The CANN toolkit's version from the files its installer leaves (None where none is found)."""
    for name in ("version.cfg", "ascend_toolkit_install.info", "version.info"):
        path = home / name
        try:
            lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            continue
        for line in lines:
            key, _, value = line.partition("=")
            if key.strip().lower() in ("version", "toolkit_version", "runtime_running_version"):
                return value.strip().strip("[]").strip('"') or None
    return None


def stack(kernels) -> dict[str, Any]:
    """Every release the kernels run with (metadata only where importing could break torch)."""
    found: dict[str, Any] = {
        "python": platform.python_version(),
        "python_executable": sys.executable,
        "platform": platform.platform(),
    }
    for dist in DISTRIBUTIONS:
        found[dist.replace("-", "_")] = _version(dist)
    home = os.environ.get("ASCEND_HOME_PATH")
    found["ascend_home_path"] = home
    found["cann"] = cann_version(Path(home)) if home else None
    # torchair ships inside torch_npu; torch_npu puts a lazy stand-in in sys.modules: look, do not import
    found["torchair"] = "with torch_npu" if found["torch_npu"] else None
    found["torch_npu_pair"] = check_pair(found["torch"], found["torch_npu"], found["cann"]).to_json()
    found["pypto_runtime"] = _pypto_runtime(kernels)
    return found


def _pypto_runtime(kernels) -> str | None:
    if importlib.util.find_spec("pypto") is None:
        return None
    try:
        importlib.import_module("pypto")
    except Exception as exc:  # noqa: BLE001 - ASCEND_HOME_PATH set without a CANN raises OSError
        return f"import failed ({type(exc).__name__}: {exc})"
    return _part(kernels, "backends.pypto_device").loaded_runtime()


def device_list(kernels) -> dict[str, Any]:
    import torch

    cpu = _part(kernels, "tuning").device_identity("cpu")["name"]
    found: dict[str, Any] = {"cpu": cpu, "npu": [], "cuda": []}
    if devices.npu_available():
        found["npu"] = [str(torch.npu.get_device_properties(i).name) for i in range(torch.npu.device_count())]
    if devices.cuda_available():
        found["cuda"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return found


# --- the kernels ----------------------------------------------------------------------------------


def import_kernels():
    """The `pto_kernels` already imported, else the first on sys.path, else pto-patch's bundled copy."""
    try:
        return importlib.import_module(KERNEL_PACKAGE)
    except ImportError:
        sys.path.append(str(kernels_dir()))
        importlib.invalidate_caches()
        return importlib.import_module(KERNEL_PACKAGE)


def _part(kernels, name: str):
    """One of the kernel package's modules (imported on first use, as the package itself does)."""
    return importlib.import_module(f"{kernels.__name__}.{name}")


def backends_here(kind: str, with_pypto: bool) -> list[str]:
    """The backends an op can run on here: the reference and fused torch paths everywhere, torch_npu's ops
    and pypto on an NPU, and pypto's CPU interpreter when asked (slow)."""
    found = ["torch", "fused"]
    if kind == "npu":
        found += ["npu", "pypto"]
    elif with_pypto:
        found.append("pypto")
    return found


def _linear(torch, in_features: int, out_features: int, gen, bias: bool = False):
    layer = torch.nn.Linear(in_features, out_features, bias=bias)
    with torch.no_grad():
        layer.weight.copy_(torch.randn(out_features, in_features, generator=gen) * in_features**-0.5)
        if bias:
            layer.bias.copy_(torch.randn(out_features, generator=gen) * 0.5)
    return layer


def _modules(torch, gen):
    """An MLP, an attention's projections and an RMSNorm of GutenOCR-3B's widths (float32, CPU)."""
    hidden, inter = WIDTHS["hidden"], WIDTHS["intermediate"]
    q_width, kv_width = WIDTHS["q_heads"] * WIDTHS["head_dim"], WIDTHS["kv_heads"] * WIDTHS["head_dim"]
    mlp = torch.nn.Module()
    mlp.gate_proj, mlp.up_proj = _linear(torch, hidden, inter, gen), _linear(torch, hidden, inter, gen)
    mlp.down_proj, mlp.act_fn = _linear(torch, inter, hidden, gen), torch.nn.SiLU()
    attention = torch.nn.Module()
    attention.q_proj = _linear(torch, hidden, q_width, gen, bias=True)
    attention.k_proj = _linear(torch, hidden, kv_width, gen, bias=True)
    attention.v_proj = _linear(torch, hidden, kv_width, gen, bias=True)
    attention.o_proj = _linear(torch, q_width, hidden, gen)
    attention.head_dim = WIDTHS["head_dim"]
    norm = torch.nn.Module()
    norm.weight = torch.nn.Parameter(1.0 + 0.2 * torch.randn(hidden, generator=gen))
    norm.variance_epsilon = EPS
    return {"mlp": mlp, "attention": attention, "norm": norm}


def _inputs(torch, tokens: int, gen) -> dict[str, Any]:
    hidden, dim = WIDTHS["hidden"], WIDTHS["head_dim"]
    positions = torch.randint(0, 4096, (3, 1, tokens), generator=gen).double()
    inv_freq = 1.0 / (1e6 ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    angles = positions[..., None] * inv_freq
    angles = torch.cat((angles, angles), dim=-1)
    q_width = WIDTHS["q_heads"] * dim
    return {
        "hidden_states": torch.randn(1, tokens, hidden, generator=gen) * 2.0 + 0.3,
        "residual": torch.randn(1, tokens, hidden, generator=gen) * 3.0,
        "attn_output": torch.randn(1, tokens, q_width, generator=gen),
        "q": torch.randn(1, WIDTHS["q_heads"], tokens, dim, generator=gen),
        "k": torch.randn(1, WIDTHS["kv_heads"], tokens, dim, generator=gen),
        "cos": angles.cos(),
        "sin": angles.sin(),
        "query": torch.randn(1, WIDTHS["q_heads"], min(tokens, CORE_MAX_ROWS), dim, generator=gen),
        "key_cache": torch.randn(1, WIDTHS["kv_heads"], CORE_CACHE, dim, generator=gen),
        "value_cache": torch.randn(1, WIDTHS["kv_heads"], CORE_CACHE, dim, generator=gen),
        "kv_lens": torch.tensor([CORE_VALID]),
        "position": torch.tensor([CORE_VALID]),  # where attention_prologue_cached writes
    }


def _moved(value, torch, device, dtype):
    if isinstance(value, torch.Tensor):  # lengths stay integers
        return value.to(device=device, dtype=dtype if value.is_floating_point() else value.dtype)
    if isinstance(value, torch.nn.Module):
        import copy

        return copy.deepcopy(value).to(device=device, dtype=dtype)
    return value


class _Length(int):
    """The layer's length after attention_prologue_cached ran: compared exactly, apart from the outputs
    (one number among them would dilute, or swamp, their relative error)."""

    def __new__(cls, position):
        return super().__new__(cls, int(position.reshape(-1)[0]))


def _split_length(output):
    if isinstance(output, tuple) and output and isinstance(output[-1], _Length):
        return output[:-1], output[-1]
    return output, None


def _call(kernels, op: str, m: dict[str, Any], i: dict[str, Any]):
    """One call of `op`'s wrapper, as a patched decoder layer makes it."""
    if op == "rms_norm":
        return kernels.rms_norm_wrapper(i["hidden_states"], m["norm"].weight, EPS)
    if op == "mrope":
        return kernels.mrope_pto_correct(i["q"], i["k"], i["cos"], i["sin"], list(SECTION))
    if op == "swiglu_mlp":
        return kernels.swiglu_mlp_wrapper(m["mlp"], i["hidden_states"])
    if op == "residual_rms_norm":
        return kernels.residual_rms_norm_wrapper(i["hidden_states"], i["residual"], m["norm"])
    if op == "mlp_block":
        return kernels.mlp_block_wrapper(
            i["residual"], i["attn_output"], m["attention"].o_proj, m["norm"], m["mlp"]
        )
    if op == "attention_prologue":
        return kernels.attention_prologue_wrapper(
            m["attention"], m["norm"], i["hidden_states"], i["cos"], i["sin"], list(SECTION)
        )
    if op == "attention_prologue_cached":  # the first token, into copies of the caches at CORE_VALID
        caches = (i["key_cache"].clone(), i["value_cache"].clone())
        position = i["position"].clone()  # a 5.8+ layer's own length: the op advances it by the row
        query = device_checks.prologue_cached(kernels, m, i | _prologue_settings(), caches, position)
        at = CORE_VALID  # q and the rows written: the rest of the caches would dilute the error
        return query, caches[0][:, :, at], caches[1][:, :, at], _Length(position)
    if op == "attention_core":
        scale = WIDTHS["head_dim"] ** -0.5
        return kernels.attention_core_wrapper(
            i["query"], i["key_cache"], i["value_cache"], i["kv_lens"], scale
        )
    raise ValueError(op)


def _prologue_settings() -> dict[str, Any]:  # read at call time: the tests narrow the widths
    return {"eps": EPS, "section": SECTION}


def _flat(torch, output) -> Any:
    parts = output if isinstance(output, tuple | list) else (output,)
    return torch.cat([part.detach().reshape(-1).to("cpu", torch.float64) for part in parts])


def _synchronize(torch, device) -> None:
    if device.type == "npu":
        torch.npu.synchronize(device)
    elif device.type == "cuda":
        torch.cuda.synchronize(device)


def check_op(
    kernels, op: str, backend: str, expected, modules, inputs, device, dtype, timed_calls: int
) -> OpCheck:
    """Run `op` on `backend` (strict off: a failure falls back and is named) and compare with float64."""
    import torch

    check = OpCheck(op, backend, "error", tolerance=TOLERANCE[str(dtype).removeprefix("torch.")])
    counted = ENTRY_CHECKS.get(op, op)
    kernels.reset_stats()
    times = []
    try:
        with torch.no_grad(), kernels.enabled((counted,), backend=backend):
            for _ in range(1 + timed_calls):
                _synchronize(torch, device)
                start = time.perf_counter()
                output = _call(kernels, op, modules, inputs)
                _synchronize(torch, device)
                times.append(time.perf_counter() - start)
            stats = kernels.stats()[counted]
    except Exception as exc:  # noqa: BLE001 - the torch path itself failed: reported, not raised
        check.reason = f"{type(exc).__name__}: {exc}"
        return check
    check.first_call_ms = times[0] * 1e3
    check.run_ms = statistics.median(times[1:]) * 1e3 if len(times) > 1 else None
    if backend == "pypto":
        check.compile_s = stats["pypto_kernels"]["compile_s"]
    output, length = _split_length(output)
    got = _flat(torch, output)
    diff = (got - expected).abs()
    finite = bool(torch.isfinite(got).all())
    check.max_abs_error = float(diff.max()) if finite else float("inf")
    check.rel_error = float((got - expected).norm() / expected.norm()) if finite else float("inf")
    if stats["fallbacks"]:
        check.status, check.reason = "fell back", stats["first_fallback_error"]
    elif length is not None and length != CORE_VALID + 1:
        check.status = "failed"
        check.reason = f"the layer's length left at {length}, not advanced to {CORE_VALID + 1}"
    elif check.rel_error <= check.tolerance:
        check.status = "ok"
    else:
        check.status = "failed"
        check.reason = f"relative error {check.rel_error:.3g} over {check.tolerance:g}"
    return check


def run_doctor(device: str | None, dtype_name: str, with_pypto: bool, tokens: int = 4) -> DoctorReport:
    """The stack, the devices, PyPTO's pre-flight, and each op on each backend usable here."""
    if tokens < 1:
        raise PtoPatchError(
            f"--tokens must be 1 or more, got {tokens}", "pass --tokens 4", exit_code=EXIT_USAGE
        )
    started = time.perf_counter()
    choice = devices.resolve_device(device)
    dtype = devices.resolve_dtype(dtype_name)
    kernels = import_kernels()
    import torch

    backends = backends_here(choice.kind, with_pypto)
    report = DoctorReport(
        stack=stack(kernels),
        devices=device_list(kernels),
        pypto={"preflight": _part(kernels, "backends.pypto_device").preflight().to_json()},
        device=choice.name,
        dtype=str(dtype).removeprefix("torch."),
        tokens=tokens,
        backends=backends,
        kernels_path=str(Path(kernels.__file__).resolve().parent),
    )
    gen = torch.Generator().manual_seed(29)
    modules, inputs = _modules(torch, gen), _inputs(torch, tokens, gen)
    target = torch.device(choice.name)
    here = {name: _moved(value, torch, target, dtype) for name, value in modules.items()}
    given = {name: _moved(value, torch, target, dtype) for name, value in inputs.items()}
    interpreter_missing = choice.kind == "cpu" and "pypto" in backends and shutil.which("g++") is None
    cpu, f64 = torch.device("cpu"), torch.float64
    wide = {name: _moved(value, torch, cpu, f64) for name, value in (modules | inputs).items()}
    entries = [name for name in ENTRY_CHECKS if hasattr(getattr(kernels, "ops", None), name)]
    for op in (*kernels.OPS, *entries):  # an older kernel package has no such entry: not checked
        expected = _reference(kernels, op, wide, torch)
        for backend in backends:
            if backend == "pypto" and importlib.util.find_spec("pypto") is None:
                report.checks.append(
                    OpCheck(op, backend, "not run", reason="pypto is not installed (extra `pto`)")
                )
                continue
            if backend == "pypto" and interpreter_missing:
                report.checks.append(
                    OpCheck(
                        op,
                        backend,
                        "not run",
                        reason="g++ not found: pypto's CPU interpreter compiles with it",
                    )
                )
                continue
            calls = 0 if backend == "pypto" and choice.kind == "cpu" else TIMED_CALLS  # the interpreter: once
            report.checks.append(check_op(kernels, op, backend, expected, here, given, target, dtype, calls))
    if choice.kind == "npu":
        settings = given | _prologue_settings()
        report.device_checks = device_checks.run_all(
            kernels, here, settings, "pypto", TOLERANCE[report.dtype]
        )
    else:
        report.device_checks = device_checks.not_run(
            f"no NPU here ({choice.name}): it needs a 910B with torch_npu's npugraph_ex, CANN and pypto"
        )
    prepared = _part(kernels, "backends.pypto_device").prepared()
    if prepared is not None:
        report.pypto["prepared"] = prepared.to_json()
    report.seconds = time.perf_counter() - started
    return report


def _reference(kernels, op: str, wide: dict[str, Any], torch):
    """`op` on the reference backend in float64 on the CPU (`wide`: the modules and inputs in float64):
    what every backend is measured against."""
    with torch.no_grad(), kernels.enabled((ENTRY_CHECKS.get(op, op),), backend="torch"):
        return _flat(torch, _split_length(_call(kernels, op, wide, wide))[0])
