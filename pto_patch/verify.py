"""`pto-patch verify`: load the patched folder once, run it with the kernels off and on, compare.

The run mirrors the reference system's run script (warm-up, timed runs, a JSON report), and adds
what it lacked: the patched code must be exactly what `apply` wrote, every checkpoint key must load
(a random-weight model never passes), each switched-on op must actually run, and the PTO run must
compute what the baseline computes within the dtype's tolerance.

The building blocks (device and dtype resolution, loading, inputs, one measured mode) are shared
with `pto-patch bench` and `pto-patch demo`.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import json
import os
import re
import resource
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pto_patch import __version__
from pto_patch.errors import EXIT_OK, EXIT_USAGE, EXIT_VERIFY_FAILED, ModelFolderError, PtoPatchError
from pto_patch.spec import OPS, ModelSpec, load_spec, parse_ops

SCHEMA_VERSION = 1
DEFAULT_PROMPT = "你好"  # the reference run script's default
# GutenOCR's full-page reading prompt (its model card's "read all text" task).
OCR_PROMPT = (
    "Read all text in the image and return a single TEXT string, linearized left-to-right/top-to-bottom."
)
WARMUP_NEW_TOKENS = 10  # each warm-up run, as in the reference
KERNEL_BACKENDS = ("auto", "pypto", "npu", "torch", "fused")

# name -> torch dtype attribute
DTYPE_NAMES = {
    "bf16": "bfloat16",
    "bfloat16": "bfloat16",
    "fp16": "float16",
    "float16": "float16",
    "half": "float16",
    "fp32": "float32",
    "float32": "float32",
    "float": "float32",
}
# First-step logits pass when max|pto - base| <= atol + rtol * max|base| (per dtype, overridable).
DEFAULT_TOLERANCES = {
    "float32": (1e-3, 1e-4),
    "float16": (2e-2, 1e-2),
    "bfloat16": (1e-1, 5e-2),
}

# The reference system's per-batch recommendation (`--use_dynamic_config`), as data:
# (op, predicate on the batch size, reason).
DYNAMIC_CONFIG_TABLE = (
    (
        "swiglu_mlp",
        lambda batch: True,
        "SwiGLU MLP gained at every batch size measured (+7.8/13.7/15.7/3.1 % at batch 1/4/8/16)",
    ),
    (
        "mrope",
        lambda batch: batch <= 4,
        "MRoPE pays off only at batch 4 or less",
    ),
    (
        "rms_norm",
        lambda batch: False,
        "RMSNorm was slower end to end (with MRoPE: 11.1 -> 8.6 tok/s at batch 1)",
    ),
)


# --- options --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RunOptions:
    """What verify and bench both run: the model and its input, where, in which dtype, how often,
    which kernels and how compiled. Each command's options extend it."""

    model: str = "gutenocr_3b"
    model_path: Path | None = None
    prompt: str | None = None
    image: Path | None = None
    simple_prompt: bool = False
    device: str | None = None
    dtype: str = "bf16"
    warmup: int = 5
    iters: int = 5
    output_length: int = 50
    ops: str | None = None
    kernel_backend: str | None = None
    use_compile: bool = False
    compile_backend: str = "inductor"
    compile_mode: str | None = None
    use_acl_graph: bool = False
    use_dynamic_config: bool = False
    allow_modified: bool = False

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        return {key: (str(value) if isinstance(value, Path) else value) for key, value in data.items()}


@dataclass(frozen=True)
class VerifyOptions(RunOptions):
    batch: int = 1
    use_pto: bool = False
    atol: float | None = None
    rtol: float | None = None
    strict: bool = False
    report_file: Path | None = None


def check_counts(warmup: int, iters: int, batch: int, output_length: int) -> None:
    if warmup < 0:
        raise PtoPatchError(
            f"--warmup must be 0 or more, got {warmup}", "pass --warmup 0", exit_code=EXIT_USAGE
        )
    for name, value in (("--iters", iters), ("--batch", batch), ("--output_length", output_length)):
        if value < 1:
            raise PtoPatchError(
                f"{name} must be at least 1, got {value}", f"pass {name} 1", exit_code=EXIT_USAGE
            )


# --- device and dtype -----------------------------------------------------------------------------


@dataclass(frozen=True)
class DeviceChoice:
    name: str  # "cpu", "cuda:0", "npu:1"
    kind: str  # "cpu", "cuda", "npu"
    reason: str


_DEVICE_RE = re.compile(r"^(cpu|cuda|npu)(?::(\d+))?$")


def parse_device(text: str) -> tuple[str, int | None]:
    """'cpu' -> ('cpu', None); 'cuda:1' -> ('cuda', 1); '3' -> ('npu', 3), as the reference's card number."""
    value = text.strip().lower()
    if value.isdigit():
        return "npu", int(value)
    match = _DEVICE_RE.match(value)
    if not match or (match.group(1) == "cpu" and match.group(2) is not None):
        raise PtoPatchError(
            f"--device '{text}' is not a device",
            "use cpu, cuda, cuda:N, npu, npu:N, or a bare NPU card number",
            exit_code=EXIT_USAGE,
        )
    index = match.group(2)
    return match.group(1), (int(index) if index is not None else None)


def npu_available() -> bool:
    """True when torch_npu imports and sees a device. torch_npu is only ever imported here, lazily."""
    if importlib.util.find_spec("torch_npu") is None:
        return False
    try:
        import torch
        import torch_npu  # noqa: F401

        return bool(torch.npu.is_available())
    except Exception:  # torch_npu without CANN raises a range of errors on import
        return False


def cuda_available() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def resolve_device(text: str | None) -> DeviceChoice:
    if text is None or not text.strip():
        if npu_available():
            return DeviceChoice("npu:0", "npu", "default: an NPU is present")
        if cuda_available():
            return DeviceChoice("cuda:0", "cuda", "default: no NPU, CUDA is present")
        return DeviceChoice("cpu", "cpu", "default: no NPU or CUDA device found")
    kind, index = parse_device(text)
    if kind == "cpu":
        return DeviceChoice("cpu", "cpu", "requested")
    if kind == "npu":
        if not npu_available():
            raise PtoPatchError(
                f"--device {text} asks for an Ascend NPU, but torch_npu is not importable or sees no NPU",
                "on a host with CANN: pip install 'pto-patch[ascend]'; elsewhere pass --device cpu",
            )
        import torch

        count = torch.npu.device_count()
    else:
        if not cuda_available():
            raise PtoPatchError(
                f"--device {text} asks for CUDA, but this torch build sees no CUDA device",
                "pass --device cpu, or install a CUDA build of torch",
            )
        import torch

        count = torch.cuda.device_count()
    index = 0 if index is None else index
    if index >= count:
        raise PtoPatchError(
            f"--device {text}: there are only {count} {kind} device(s)",
            f"pick an index below {count}",
        )
    return DeviceChoice(f"{kind}:{index}", kind, "requested")


def dtype_key(name: str) -> str:
    """The torch dtype attribute for a --dtype name ('bf16' -> 'bfloat16'); a usage error otherwise."""
    key = DTYPE_NAMES.get(name.strip().lower())
    if key is None:
        raise PtoPatchError(
            f"--dtype '{name}' is not supported",
            "use bf16, fp16 or fp32 (or bfloat16, float16, half, float32, float)",
            exit_code=EXIT_USAGE,
        )
    return key


def resolve_dtype(name: str):
    import torch

    return getattr(torch, dtype_key(name))


def tolerances(dtype_name: str, atol: float | None, rtol: float | None) -> tuple[float, float]:
    default_atol, default_rtol = DEFAULT_TOLERANCES[dtype_key(dtype_name)]
    return (default_atol if atol is None else atol, default_rtol if rtol is None else rtol)


def synchronize(device: DeviceChoice) -> None:
    import torch

    if device.kind == "cuda":
        torch.cuda.synchronize(device.name)
    elif device.kind == "npu":
        torch.npu.synchronize(device.name)


# --- peak memory ----------------------------------------------------------------------------------

RSS_SOURCE = "process peak RSS (monotonic over the process: a later mode's figure includes earlier ones)"


def reset_peak_memory(device: DeviceChoice) -> None:
    import torch

    if device.kind == "cuda":
        torch.cuda.reset_peak_memory_stats(device.name)
    elif device.kind == "npu":
        torch.npu.reset_peak_memory_stats(device.name)


def peak_memory_mb(device: DeviceChoice) -> float:
    import torch

    if device.kind == "cuda":
        return torch.cuda.max_memory_allocated(device.name) / 2**20
    if device.kind == "npu":
        return torch.npu.max_memory_allocated(device.name) / 2**20
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 1024  # bytes on macOS, KiB on Linux


def peak_memory_source(device: DeviceChoice) -> str:
    if device.kind == "cpu":
        return RSS_SOURCE
    return f"{device.kind} allocator peak (reset before each mode)"


# --- report ---------------------------------------------------------------------------------------


@dataclass
class ModeMetrics:
    """One mode's timing over the timed runs (after warm-up)."""

    load_s: float
    latency_s: float
    tokens: int  # new tokens per timed run, all sequences of the batch together
    tokens_per_s: float
    peak_memory_mb: float
    batch: int
    new_tokens_per_sequence: int
    latencies_s: list[float] = field(default_factory=list)
    prefill_s: float | None = None  # prompt in, first new token out
    decode_step_s: float | None = None  # each further token

    @property
    def latency_median_s(self) -> float:
        return statistics.median(self.latencies_s) if self.latencies_s else self.latency_s

    def to_json(self) -> dict[str, Any]:
        return {
            "prefill_s": None if self.prefill_s is None else round(self.prefill_s, 5),
            "decode_step_ms": None if self.decode_step_s is None else round(self.decode_step_s * 1000, 4),
            "load_s": round(self.load_s, 4),
            "latency_s": round(self.latency_s, 5),
            "tokens": self.tokens,
            "tokens_per_s": round(self.tokens_per_s, 3),
            "peak_memory_mb": round(self.peak_memory_mb, 1),
            "batch": self.batch,
            "new_tokens_per_sequence": self.new_tokens_per_sequence,
            "latencies_s": [round(x, 5) for x in self.latencies_s],
            "latency_median_s": round(self.latency_median_s, 5),
            "tokens_per_s_median": round(self.tokens / self.latency_median_s, 3)
            if self.latency_median_s
            else 0.0,
        }


@dataclass
class OpReport:
    switched_on: bool
    backend: str | None
    calls: int
    fallbacks: int
    backends: dict[str, int] = field(default_factory=dict)
    first_fallback_error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class OtherPatcher:
    """Something besides the injected guard that decides what runs for an op: one module instance
    whose forward was swapped, a swapped module-level function, or a note (`op` None)."""

    op: str | None
    module: str  # the module's path in the model, or `<remote module>.<function>`; "" for the model
    how: str
    bypasses: bool  # the guard is not reached there, so the PTO kernel never runs there

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Accuracy:
    max_abs_logit_diff: float
    max_rel_logit_diff: float  # max |pto - base| over max |base|
    token_match_rate: float
    text_equal: bool
    passed: bool
    atol: float
    rtol: float
    logits_within_tolerance: bool
    baseline_text: str
    pto_text: str

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        for key in ("max_abs_logit_diff", "max_rel_logit_diff", "token_match_rate"):
            value = data[key]
            data[key] = value if value != value else round(value, 8)  # keep NaN visible
        return data


@dataclass
class LoadInfo:
    missing_keys: list[str]
    unexpected_keys: list[str]
    mismatched_keys: list[str]
    lm_head_tied: bool | None  # None when the config does not tie it

    @property
    def ok(self) -> bool:
        return (
            not self.missing_keys
            and not self.unexpected_keys
            and not self.mismatched_keys
            and (self.lm_head_tied is not False)
        )

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class Checked:
    """`passed` and the exit code of a report that lists its `failures` (verify's and bench's)."""

    failures: list[str]

    @property
    def passed(self) -> bool:
        return not self.failures

    @property
    def exit_code(self) -> int:
        return EXIT_OK if self.passed else EXIT_VERIFY_FAILED


@dataclass
class VerifyReport(Checked):
    model_path: str
    device: str
    device_reason: str
    dtype: str
    versions: dict[str, str]
    input: dict[str, Any]
    load_info: LoadInfo
    baseline: ModeMetrics
    pto: ModeMetrics | None = None
    ops: dict[str, OpReport] = field(default_factory=dict)
    accuracy: Accuracy | None = None
    failures: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    patched_ops: list[str] = field(default_factory=list)
    switched_on: list[str] = field(default_factory=list)
    kernel_backend: str | None = None
    dynamic_config: list[dict[str, Any]] | None = None
    pto_kernels_path: str | None = None
    modified_files: list[str] = field(default_factory=list)
    allow_modified: bool = False
    rope_fixes: list[str] = field(default_factory=list)
    compile: str | None = None
    peak_memory_source: str = ""
    options: dict[str, Any] = field(default_factory=dict)
    report_file: str | None = None
    other_patchers: list[OtherPatcher] = field(default_factory=list)

    def ratios(self) -> dict[str, float | None]:
        if self.pto is None:
            return {}
        return {
            "latency_s": _ratio(self.pto.latency_s, self.baseline.latency_s),
            "tokens_per_s": _ratio(self.pto.tokens_per_s, self.baseline.tokens_per_s),
            "peak_memory_mb": _ratio(self.pto.peak_memory_mb, self.baseline.peak_memory_mb),
            "load_s": _ratio(self.pto.load_s, self.baseline.load_s),
        }

    def to_json(self) -> dict[str, Any]:
        pto = None
        if self.pto is not None:
            pto = self.pto.to_json()
            pto["ops"] = {op: report.to_json() for op, report in self.ops.items()}
        return {
            "schema_version": SCHEMA_VERSION,
            "command": "verify",
            "passed": self.passed,
            "failures": list(self.failures),
            "warnings": list(self.warnings),
            "model_path": self.model_path,
            "device": self.device,
            "device_reason": self.device_reason,
            "dtype": self.dtype,
            "versions": dict(self.versions),
            "input": dict(self.input),
            "load_info": self.load_info.to_json(),
            "baseline": self.baseline.to_json(),
            "pto": pto,
            "ratios": {key: (None if v is None else round(v, 4)) for key, v in self.ratios().items()},
            "accuracy": None if self.accuracy is None else self.accuracy.to_json(),
            "patched_ops": list(self.patched_ops),
            "switched_on": list(self.switched_on),
            "kernel_backend": self.kernel_backend,
            "dynamic_config": self.dynamic_config,
            "pto_kernels_path": self.pto_kernels_path,
            "allow_modified": self.allow_modified,
            "modified_files": list(self.modified_files),
            "rope_fixes": list(self.rope_fixes),
            "other_patchers": [patcher.to_json() for patcher in self.other_patchers],
            "compile": self.compile,
            "peak_memory_source": self.peak_memory_source,
            "load_note": "the model is loaded once; both modes share that load time",
            "options": dict(self.options),
            "report_file": self.report_file,
        }


def _ratio(numerator: float, denominator: float) -> float | None:
    return numerator / denominator if denominator else None


def versions() -> dict[str, str]:
    import torch
    import transformers

    found = {"pto_patch": __version__, "torch": torch.__version__, "transformers": transformers.__version__}
    for dist in ("pypto", "torch_npu"):  # read from metadata: importing torch_npu can break torch
        try:
            found[dist] = importlib.metadata.version(dist.replace("_", "-"))
        except importlib.metadata.PackageNotFoundError:
            continue
    found["python"] = ".".join(str(x) for x in sys.version_info[:3])
    return found


def write_report(document: dict[str, Any], path: Path) -> None:
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        text = json.dumps(document, indent=2, ensure_ascii=False, default=str) + "\n"
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise PtoPatchError(
            f"cannot write the report {path}: {exc.strerror}", "pick a writable path for --report-file"
        ) from exc


# --- the patched folder: manifest check and the kernel package ------------------------------------


@dataclass(frozen=True)
class FolderState:
    folder: Path
    patched: bool
    patched_ops: tuple[str, ...]
    modified_files: tuple[str, ...]


def check_folder(folder: Path, *, use_pto: bool, allow_modified: bool) -> FolderState:
    """Refuse to run half-patched code, or code that differs from what apply wrote (unless allowed)."""
    from pto_patch.manifest import MANIFEST_DIR, STATE_IN_PROGRESS, Manifest, drifted_files

    # An interrupted apply, as `status` sees it: a manifest still in progress, or a .pto_patch/
    # folder that never got one.
    manifest = Manifest.load(folder) if Manifest.exists_in(folder) else None
    if (folder / MANIFEST_DIR).is_dir() and (manifest is None or manifest.state == STATE_IN_PROGRESS):
        raise ModelFolderError(
            f"{folder} holds an interrupted apply; refusing to run its half-patched files",
            f"run `pto-patch restore --model-path {folder}` (or `pto-patch apply` again)",
        )
    if manifest is None:
        if use_pto:
            raise ModelFolderError(
                f"{folder} is not patched (no .pto_patch/manifest.json): --use_pto has nothing to switch on",
                f"run `pto-patch apply --model-path {folder}` first, or drop --use_pto for a baseline run",
            )
        return FolderState(folder, False, (), ())
    drifted = tuple(drifted_files(folder, manifest))
    if drifted and not allow_modified:
        shown = ", ".join(drifted[:4]) + (" ..." if len(drifted) > 4 else "")
        raise PtoPatchError(
            f"{folder}: {len(drifted)} patched file(s) differ from what apply wrote ({shown}); "
            "refusing to execute them",
            "run `pto-patch restore` then `pto-patch apply` again, or pass --allow-modified to run them",
        )
    return FolderState(folder, True, tuple(manifest.ops), drifted)


def import_folder_kernels(folder: Path):
    """Import `pto_kernels` from the model folder (the copy apply wrote), never another copy.

    The patched modeling code finds it with `sys.modules.get("pto_kernels")`.
    """
    package_dir = (folder / "pto_kernels").resolve()
    if not (package_dir / "__init__.py").is_file():
        raise ModelFolderError(
            f"{folder} has no pto_kernels/ package although it is patched",
            "run `pto-patch restore` then `pto-patch apply` again",
        )
    loaded = sys.modules.get("pto_kernels")
    if loaded is not None and _module_dir(loaded) != package_dir:
        for name in [n for n in sys.modules if n == "pto_kernels" or n.startswith("pto_kernels.")]:
            del sys.modules[name]
    if str(folder) in sys.path:
        sys.path.remove(str(folder))
    sys.path.insert(0, str(folder))
    importlib.invalidate_caches()
    # No __pycache__ inside the model folder: restore must find exactly the bytes apply wrote.
    saved, sys.dont_write_bytecode = sys.dont_write_bytecode, True
    try:
        module = importlib.import_module("pto_kernels")
    finally:
        sys.dont_write_bytecode = saved
    if _module_dir(module) != package_dir:
        raise PtoPatchError(
            f"`import pto_kernels` found {module.__file__}, not the model folder's copy {package_dir}",
            "remove the other pto_kernels from PYTHONPATH",
        )
    for name in ("enable", "disable", "stats", "reset_stats"):
        if not callable(getattr(module, name, None)):
            raise PtoPatchError(
                f"{package_dir} lacks pto_kernels.{name}(): not the kernel package this pto-patch ships",
                "run `pto-patch restore` then `pto-patch apply` again",
            )
    return module


def _module_dir(module) -> Path | None:
    file = getattr(module, "__file__", None)
    return Path(file).resolve().parent if file else None


# --- loading --------------------------------------------------------------------------------------


def _text_config(config):
    return getattr(config, "text_config", None) or config


def _head_dim(text_config) -> int:
    head_dim = getattr(text_config, "head_dim", None)
    return int(head_dim) if head_dim else int(text_config.hidden_size) // int(text_config.num_attention_heads)


def fix_rope_config(config, spec: ModelSpec) -> list[str]:
    """The reference's fix: make sure the rope dict the attention reads carries an mrope_section.

    4.x reads `rope_scaling["mrope_section"]`, 5.x `rope_parameters["mrope_section"]` (5.20+ silently
    defaults to [16, 24, 24], wrong for any other head size).
    """
    fixes = []
    scopes = [config] + ([config.text_config] if getattr(config, "text_config", None) is not None else [])
    head_dim = _head_dim(_text_config(config))
    section = None
    for scope in scopes:
        for key in ("rope_parameters", "rope_scaling"):
            rope = getattr(scope, key, None)
            if isinstance(rope, dict) and rope.get("mrope_section"):
                section = [int(x) for x in rope["mrope_section"]]
                break
        if section:
            break
    if section is None or 2 * sum(section) != head_dim:
        if 2 * sum(spec.mrope_section) != head_dim:
            raise ModelFolderError(
                f"config.json's mrope_section {section} does not fit head_dim {head_dim}",
                "set rope_scaling.mrope_section in config.json to three numbers summing to head_dim / 2",
            )
        section = list(spec.mrope_section)
    for scope in scopes:
        for key in ("rope_parameters", "rope_scaling"):
            rope = getattr(scope, key, None)
            if isinstance(rope, dict) and rope.get("mrope_section") != section:
                rope["mrope_section"] = list(section)
                fixes.append(f"config {type(scope).__name__}.{key}.mrope_section = {section}")
    return fixes


def fix_rope_layers(model, config) -> list[str]:
    """Where a loaded layer keeps its own rope_scaling dict without mrope_section, give it one (4.x)."""
    section = None
    for key in ("rope_parameters", "rope_scaling"):
        rope = getattr(_text_config(config), key, None)
        if isinstance(rope, dict) and rope.get("mrope_section"):
            section = list(rope["mrope_section"])
    if section is None:
        return []
    fixed = 0
    for module in model.modules():
        rope = getattr(module, "rope_scaling", None)
        if isinstance(rope, dict) and "mrope_section" not in rope:
            rope["mrope_section"] = list(section)
            fixed += 1
        elif rope is None and hasattr(module, "rope_scaling") and hasattr(module, "q_proj"):
            module.rope_scaling = {"type": "mrope", "mrope_section": list(section)}
            fixed += 1
    return [f"{fixed} attention layer(s) given rope_scaling.mrope_section = {section}"] if fixed else []


@dataclass
class LoadedModel:
    spec: ModelSpec
    folder: Path
    device: DeviceChoice
    dtype_name: str
    model: Any
    tokenizer: Any
    load_s: float
    load_info: LoadInfo
    rope_fixes: list[str]
    state: FolderState
    kernels: Any = None  # the folder's pto_kernels module when --use_pto
    other_patchers: list[OtherPatcher] = field(default_factory=list)


def _keys(info: dict[str, Any], name: str) -> list[str]:
    value = info.get(name) or []
    return sorted(str(item if not isinstance(item, tuple) else item[0]) for item in value)


def load_model(
    spec: ModelSpec,
    folder: Path,
    device: DeviceChoice,
    dtype_name: str,
    *,
    use_pto: bool,
    allow_modified: bool,
) -> LoadedModel:
    """Check the folder, import its kernel package, and load the model once (remote code, eager attention)."""
    state = check_folder(folder, use_pto=use_pto, allow_modified=allow_modified)
    kernels = None
    if use_pto:
        kernels = import_folder_kernels(folder)
        kernels.disable()
        kernels.reset_stats()

    from transformers import AutoConfig, AutoModelForImageTextToText, AutoTokenizer
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()  # the rendered report is the output

    torch_dtype = resolve_dtype(dtype_name)
    started = time.perf_counter()
    try:
        config = AutoConfig.from_pretrained(folder, trust_remote_code=True)
        rope_fixes = fix_rope_config(config, spec)
        model, info = AutoModelForImageTextToText.from_pretrained(
            folder,
            config=config,
            trust_remote_code=True,
            attn_implementation="eager",
            dtype=torch_dtype,
            output_loading_info=True,
            # A wrong-shaped tensor then shows in load_info (verify fails, exit 3) instead of raising.
            ignore_mismatched_sizes=True,
        )
    except (OSError, ValueError, KeyError) as exc:
        first_line = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ModelFolderError(
            f"transformers could not load {folder}: {first_line}",
            "check the folder is complete (`pto-patch status`), or download it again",
        ) from exc
    rope_fixes += fix_rope_layers(model, config)
    model.to(device.name)
    model.eval()
    synchronize(device)
    load_s = time.perf_counter() - started
    tokenizer = AutoTokenizer.from_pretrained(folder)
    tied = None
    if getattr(_text_config(config), "tie_word_embeddings", getattr(config, "tie_word_embeddings", False)):
        out_emb, in_emb = model.get_output_embeddings(), model.get_input_embeddings()
        tied = out_emb is not None and in_emb is not None and out_emb.weight is in_emb.weight
    load_info = LoadInfo(
        missing_keys=_keys(info, "missing_keys"),
        unexpected_keys=_keys(info, "unexpected_keys"),
        mismatched_keys=_keys(info, "mismatched_keys"),
        lm_head_tied=tied,
    )
    return LoadedModel(
        spec=spec,
        folder=folder,
        device=device,
        dtype_name=dtype_key(dtype_name),
        model=model,
        tokenizer=tokenizer,
        load_s=load_s,
        load_info=load_info,
        rope_fixes=rope_fixes,
        state=state,
        kernels=kernels,
    )


def load_failures(load_info: LoadInfo) -> list[str]:
    failures = []
    if load_info.missing_keys:
        failures.append(
            f"{len(load_info.missing_keys)} checkpoint key(s) missing (random weights), e.g. "
            f"{load_info.missing_keys[0]}"
        )
    if load_info.unexpected_keys:
        failures.append(
            f"{len(load_info.unexpected_keys)} unexpected checkpoint key(s) (not loaded), e.g. "
            f"{load_info.unexpected_keys[0]}"
        )
    if load_info.mismatched_keys:
        failures.append(
            f"{len(load_info.mismatched_keys)} checkpoint key(s) with mismatched shapes (random weights), "
            f"e.g. {load_info.mismatched_keys[0]}"
        )
    if load_info.lm_head_tied is False:
        failures.append("config ties lm_head to the embeddings, but the loaded lm_head is a separate tensor")
    return failures


# --- inputs ---------------------------------------------------------------------------------------


def build_inputs(loaded: LoadedModel, prompt: str | None, image: Path | None, simple_prompt: bool):
    """Tokenised inputs for one sequence (through the model's chat template and image processor),
    plus a description for the report."""
    from pto_patch import ocr_inputs

    tokenizer = loaded.tokenizer
    if image is not None:
        prompt = OCR_PROMPT if prompt is None else prompt
        picture = ocr_inputs._as_rgb_image(Path(image))
        inputs = ocr_inputs.build_inputs(loaded.folder, prompt, picture, tokenizer=tokenizer)
        image_id = tokenizer.convert_tokens_to_ids(ocr_inputs.IMAGE_TOKEN)
        description = {
            "kind": "image",
            "image": str(image),
            "image_size": list(picture.size),
            "image_tokens": int((inputs["input_ids"] == image_id).sum()),
        }
    else:
        prompt = DEFAULT_PROMPT if prompt is None else prompt
        if simple_prompt:  # the raw prompt, no chat template
            encoded = tokenizer(prompt, return_tensors="pt")
            inputs = {"input_ids": encoded["input_ids"], "attention_mask": encoded["attention_mask"]}
        else:
            inputs = ocr_inputs.build_inputs(loaded.folder, prompt, None, tokenizer=tokenizer)
        description = {"kind": "text"}
    description.update(
        prompt=prompt,
        chat_template=not (simple_prompt and image is None),
        prompt_tokens=int(inputs["input_ids"].shape[1]),
    )
    return inputs, description


def batched(inputs: dict[str, Any], batch: int, device: DeviceChoice) -> dict[str, Any]:
    """The same sequence `batch` times (per-image tensors are stacked per sequence)."""
    result = {}
    for key, value in inputs.items():
        if key in ("pixel_values", "image_grid_thw"):
            result[key] = value.repeat(batch, *([1] * (value.dim() - 1)))
        else:
            result[key] = value.repeat(batch, 1)
        result[key] = result[key].to(device.name)
    return result


# --- generation -----------------------------------------------------------------------------------


@dataclass
class Generation:
    new_tokens: Any  # [batch, n] tensor on the CPU
    first_logits: Any  # [batch, vocab] float32 on the CPU, or None
    seconds: float
    prefill_s: float | None = None
    decode_step_s: float | None = None


class _StepClock:
    """A generate() streamer that only notes when each token comes out (the first put is the prompt)."""

    def __init__(self, device: DeviceChoice):
        self.device = device
        self.times: list[float] = []

    def put(self, value) -> None:
        synchronize(self.device)
        self.times.append(time.perf_counter())

    def end(self) -> None:
        pass


def _token_ids(tokenizer, model) -> tuple[list[int] | None, int | None]:
    config = getattr(model, "generation_config", None)
    eos = getattr(config, "eos_token_id", None) if config is not None else None
    if eos is None:
        eos = tokenizer.eos_token_id
    eos_list = [eos] if isinstance(eos, int) else (list(eos) if eos is not None else None)
    pad = getattr(config, "pad_token_id", None) if config is not None else None
    if pad is None:
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (eos_list or [None])[0]
    return eos_list, pad


def generate(loaded: LoadedModel, inputs, new_tokens: int, *, fixed_length: bool, logits: bool) -> Generation:
    """Greedy generation; `fixed_length` suppresses end-of-sequence so every timed run is as long."""
    import torch
    from transformers import GenerationConfig

    eos, pad = _token_ids(loaded.tokenizer, loaded.model)
    config = GenerationConfig(
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens if fixed_length else None,
        do_sample=False,
        num_beams=1,
        eos_token_id=eos,
        pad_token_id=pad,
        output_logits=logits,
        return_dict_in_generate=True,
    )
    prompt_length = inputs["input_ids"].shape[1]
    clock = _StepClock(loaded.device)
    synchronize(loaded.device)
    started = time.perf_counter()
    with torch.no_grad():  # as generate itself does; inference_mode would be stricter than users' runs
        out = loaded.model.generate(**inputs, generation_config=config, streamer=clock)
    synchronize(loaded.device)
    seconds = time.perf_counter() - started
    first = out.logits[0].float().cpu() if logits and out.logits else None
    token_times = clock.times[1:]  # one per new token
    prefill = token_times[0] - started if token_times else None
    step = (token_times[-1] - token_times[0]) / (len(token_times) - 1) if len(token_times) > 1 else None
    return Generation(
        new_tokens=out.sequences[:, prompt_length:].cpu(),
        first_logits=first,
        seconds=seconds,
        prefill_s=prefill,
        decode_step_s=step,
    )


def _metrics(loaded: LoadedModel, runs: list[Generation], batch: int, peak_mb: float) -> ModeMetrics:
    latencies = [run.seconds for run in runs]
    latency = statistics.fmean(latencies)
    prefills = [run.prefill_s for run in runs if run.prefill_s is not None]
    steps = [run.decode_step_s for run in runs if run.decode_step_s is not None]
    tokens = int(runs[-1].new_tokens.numel())
    return ModeMetrics(
        load_s=loaded.load_s,
        latency_s=latency,
        tokens=tokens,
        tokens_per_s=tokens / latency if latency > 0 else 0.0,
        peak_memory_mb=peak_mb,
        batch=batch,
        new_tokens_per_sequence=int(runs[-1].new_tokens.shape[1]),
        latencies_s=latencies,
        prefill_s=statistics.fmean(prefills) if prefills else None,
        decode_step_s=statistics.fmean(steps) if steps else None,
    )


def measure_modes(
    loaded: LoadedModel,
    inputs,
    switches: dict[str, Callable[[], None]],
    *,
    batch: int,
    new_tokens: int,
    warmup: int,
    iters: int,
) -> dict[str, ModeMetrics]:
    """Time each mode (`switches` maps a mode to the call that selects it) on the same inputs.

    Warm-up runs (10 new tokens each) per mode, then `iters` rounds of one timed run per mode, the
    order reversed every other round: on a shared machine both modes see the same load drift.
    """
    names = list(switches)
    for name in names:
        switches[name]()
        for _ in range(warmup):
            generate(loaded, inputs, WARMUP_NEW_TOKENS, fixed_length=True, logits=False)
    runs: dict[str, list[Generation]] = {name: [] for name in names}
    peaks = dict.fromkeys(names, 0.0)
    for round_index in range(iters):
        for name in names if round_index % 2 == 0 else reversed(names):
            switches[name]()
            reset_peak_memory(loaded.device)
            runs[name].append(generate(loaded, inputs, new_tokens, fixed_length=True, logits=False))
            peaks[name] = max(peaks[name], peak_memory_mb(loaded.device))
    return {name: _metrics(loaded, runs[name], batch, peaks[name]) for name in names}


def compare(base: Generation, pto: Generation, tokenizer, atol: float, rtol: float) -> Accuracy:
    import torch

    a, b = base.first_logits, pto.first_logits
    diff = (b - a).abs()
    max_abs = float(torch.nan_to_num(diff, nan=float("inf")).max()) if diff.numel() else 0.0
    scale = float(a.abs().max()) if a.numel() else 0.0
    max_rel = max_abs / scale if scale > 0 else (0.0 if max_abs == 0 else float("inf"))
    within = max_abs <= atol + rtol * scale  # NaN counts as an infinite difference

    width = max(base.new_tokens.shape[1], pto.new_tokens.shape[1])
    if width == 0:
        match_rate = 1.0
    else:
        padded = []
        for tokens in (base.new_tokens, pto.new_tokens):
            extra = width - tokens.shape[1]
            padded.append(torch.nn.functional.pad(tokens, (0, extra), value=-1) if extra else tokens)
        match_rate = float((padded[0] == padded[1]).float().mean())
    base_texts = tokenizer.batch_decode(base.new_tokens, skip_special_tokens=True)
    pto_texts = tokenizer.batch_decode(pto.new_tokens, skip_special_tokens=True)
    return Accuracy(
        max_abs_logit_diff=max_abs,
        max_rel_logit_diff=max_rel,
        token_match_rate=match_rate,
        text_equal=base_texts == pto_texts,
        passed=within,
        atol=atol,
        rtol=rtol,
        logits_within_tolerance=within,
        baseline_text=base_texts[0] if base_texts else "",
        pto_text=pto_texts[0] if pto_texts else "",
    )


# --- which ops, compile ---------------------------------------------------------------------------


def dynamic_choice(batch: int, available: tuple[str, ...]) -> list[dict[str, Any]]:
    """The reference's per-batch recommendation, restricted to the ops the folder was patched for."""
    rows = []
    for op, wanted, reason in DYNAMIC_CONFIG_TABLE:
        enabled = bool(wanted(batch)) and op in available
        why = reason if op in available else f"{reason}; not patched into this folder"
        rows.append({"op": op, "enabled": enabled, "reason": f"batch {batch}: {why}"})
    return rows


def choose_ops(
    options_ops: str | None, spec: ModelSpec, state: FolderState, batch: int, use_dynamic_config: bool
) -> tuple[tuple[str, ...], list[dict[str, Any]] | None]:
    """The ops to switch on: --ops, else those apply patched in; --use_dynamic_config filters by batch."""
    if options_ops is not None:
        ops = parse_ops(options_ops, spec)
    else:
        ops = state.patched_ops or parse_ops(None, spec)
    if not use_dynamic_config:
        return ops, None
    table = dynamic_choice(batch, ops)
    return tuple(op for op in OPS if any(row["op"] == op and row["enabled"] for row in table)), table


def apply_compile(model, options: RunOptions, warnings: list[str]) -> str | None:
    """Wrap model.forward: torchair's ACL graph where asked and present, else torch.compile."""
    if not (options.use_compile or options.use_acl_graph):
        return None
    import torch

    if options.use_acl_graph:
        try:
            import torchair

            config = torchair.CompilerConfig()
            config.mode = "reduce-overhead"
            backend = torchair.get_npu_backend(compiler_config=config)
        except Exception as exc:  # torchair missing, or present without torch_npu / CANN
            warnings.append(
                f"--use_acl_graph: torchair is not usable here ({type(exc).__name__}); "
                f"using torch.compile(backend={options.compile_backend!r}) instead"
            )
        else:
            model.forward = torch.compile(model.forward, backend=backend, dynamic=False)
            return "torchair npu backend, reduce-overhead (ACL graph)"
    model.forward = torch.compile(model.forward, backend=options.compile_backend, mode=options.compile_mode)
    return f"torch.compile(backend={options.compile_backend!r}, mode={options.compile_mode!r})"


def switch_on(kernels, ops: tuple[str, ...], backend: str) -> None:
    if ops:
        kernels.enable(ops=ops, backend=backend)
    else:
        kernels.disable()


def op_reports(stats: dict[str, Any], switched_on: tuple[str, ...]) -> dict[str, OpReport]:
    reports = {}
    for op in OPS:
        entry = stats.get(op) or {}
        reports[op] = OpReport(
            switched_on=op in switched_on,
            backend=entry.get("backend"),
            calls=int(entry.get("calls", 0)),
            fallbacks=int(entry.get("fallbacks", 0)),
            backends={str(k): int(v) for k, v in (entry.get("backends") or {}).items()},
            first_fallback_error=entry.get("first_fallback_error"),
        )
    return reports


def op_failures(reports: dict[str, OpReport], strict: bool) -> tuple[list[str], list[str]]:
    failures, warnings = [], []
    for op, report in reports.items():
        if report.switched_on and report.calls == 0:
            failures.append(f"{op} was switched on but never ran (0 calls): the injection is not reached")
        if not report.switched_on and report.calls:
            failures.append(f"{op} ran {report.calls} time(s) although it was switched off")
        if report.fallbacks:
            message = f"{op} fell back to torch {report.fallbacks} time(s)" + (
                f": {report.first_fallback_error}" if report.first_fallback_error else ""
            )
            (failures if strict else warnings).append(message + ("" if strict else " (fails under --strict)"))
    return failures, warnings


# --- other patchers -------------------------------------------------------------------------------

OTHER_PATCHER_HINT = "load the model without the other patcher, or `pto-patch restore` and apply after it"


def _code_of(function):
    function = getattr(function, "__func__", function)  # a bound method's function
    return getattr(function, "__code__", None)


def guarded_ops(function, switches: dict[str, str]) -> set[str]:
    """The ops whose guard `function` carries: it binds `pto_kernels` and reads a USE_PTO_* switch."""
    code = _code_of(function)
    if code is None or "pto_kernels" not in code.co_varnames:
        return set()
    return {switches[c] for c in code.co_consts if isinstance(c, str) and c in switches}


def _wraps_guard(function, op: str, switches: dict[str, str]) -> bool:
    """`function` declares (functools.wraps) that it wraps a guarded forward, directly or further down."""
    for _ in range(16):
        function = getattr(function, "__wrapped__", None)
        if function is None:
            return False
        if op in guarded_ops(function, switches):
            return True
    return False


def _describe(function) -> str:
    function = getattr(function, "__func__", function)
    name = getattr(function, "__qualname__", None) or type(function).__qualname__
    return f"{getattr(function, '__module__', None) or '?'}.{name}"


def _guard_targets(module, switches: dict[str, str]) -> dict[str, str]:
    """{name: op} for each class or function of the patched module that carried a guard when apply wrote
    it: read from the module's source (so a forward replaced since still counts), and by behaviour."""
    from pto_patch.codemods import find_injections

    targets: dict[str, str] = {}
    try:
        source = Path(module.__file__).read_text(encoding="utf-8")
    except (OSError, TypeError, AttributeError):
        source = None
    if source is not None:
        for op, names in find_injections(source, switches).items():
            targets.update(dict.fromkeys(names, op))
    for name, value in vars(module).items():
        function = value.__dict__.get("forward") if isinstance(value, type) else value
        for op in guarded_ops(function, switches):
            targets.setdefault(name, op)
    return targets


def find_other_patchers(model, spec: ModelSpec) -> list[OtherPatcher]:
    """Every place in the loaded model where something other than the injected guard runs for an op.

    Run-time patchers (Liger's `model=` path, Hugging Face `kernels`' kernelize) set `forward` on
    module instances; others replace a class's `forward` or a module-level function after import.
    """
    import inspect

    import torch

    switches = {injection.switch: op for op, injection in spec.injections.items()}
    module = sys.modules.get(type(model).__module__)
    if module is None:
        return []
    targets = _guard_targets(module, switches)
    classes = {
        value: targets[name]
        for name, value in vars(module).items()
        if name in targets and inspect.isclass(value) and issubclass(value, torch.nn.Module)
    }
    found: list[OtherPatcher] = []
    for name, op in targets.items():
        value = vars(module).get(name)
        if value is None or (inspect.isclass(value) and value in classes):
            continue
        if inspect.isclass(value) or op not in guarded_ops(value, switches):
            found.append(
                OtherPatcher(
                    op, f"{module.__name__}.{name}", f"module global replaced by {_describe(value)}", True
                )
            )
    functions = {name for name, op in targets.items() if not inspect.isclass(vars(module).get(name))}
    for path, layer in model.named_modules():
        op = next((op for cls, op in classes.items() if isinstance(layer, cls)), None)
        if op is not None:
            found.extend(_forward_patchers(path or "<model>", layer, op, switches))
        found.extend(_kernelized_functions(path or "<model>", layer, module, functions, targets, switches))
    if "kernels" in sys.modules:
        try:
            use_kernels = bool(getattr(model, "use_kernels", False))
        except Exception:  # a property of a transformers release we do not know
            use_kernels = False
        if use_kernels:
            try:
                version = importlib.metadata.version("kernels")
            except importlib.metadata.PackageNotFoundError:
                version = "?"
            found.append(
                OtherPatcher(
                    None, "", f"model loaded with use_kernels=True (kernels {version} imported)", False
                )
            )
    return found


def _forward_patchers(path: str, layer, op: str, switches: dict[str, str]) -> list[OtherPatcher]:
    """The one instance's effective forward: set on the instance, or its class's (maybe replaced) forward."""
    hub_layer = getattr(type(layer), "kernel_layer_name", None)
    by = f" (kernelized: hub kernel layer {hub_layer!r})" if hub_layer else ""
    instance_forward = layer.__dict__.get("forward")
    if instance_forward is not None:
        if op in guarded_ops(instance_forward, switches):
            how = f"forward set on the instance{by}, still the guarded forward"
            return [OtherPatcher(op, path, how, False)]
        if _wraps_guard(instance_forward, op, switches):  # e.g. accelerate's hooks call through
            how = f"forward set on the instance{by}: {_describe(instance_forward)} wraps the guarded forward"
            return [OtherPatcher(op, path, how, False)]
        return [
            OtherPatcher(op, path, f"forward set on the instance{by}: {_describe(instance_forward)}", True)
        ]
    class_forward = type(layer).forward
    if op in guarded_ops(class_forward, switches):
        return []
    return [OtherPatcher(op, path, f"class forward replaced: {_describe(class_forward)}", True)]


def _kernelized_functions(path, layer, module, functions, targets, switches) -> list[OtherPatcher]:
    """Functions `use_kernelized_func` keeps on an instance (transformers 5.x: `_hidden_kernels`).

    They bypass the guard only where the layer's forward calls them instead of the module global.
    """
    hidden = layer.__dict__.get("_hidden_kernels")
    if not isinstance(hidden, dict):
        return []
    code = _code_of(type(layer).forward)
    calls_global = code.co_names if code is not None else ()
    found = []
    for name, function in hidden.items():
        if name not in functions or function is vars(module).get(name):
            continue
        op = targets[name]
        if op in guarded_ops(getattr(function, "forward", function), switches):
            continue
        how = f"use_kernelized_func holds {_describe(function)} for {name}"
        found.append(OtherPatcher(op, path, how, name not in calls_global))
    return found


def other_patcher_checks(
    patchers: list[OtherPatcher], switched_on: tuple[str, ...]
) -> tuple[list[str], list[str]]:
    """A bypassed instance of an op this run switches on fails; anything else is a warning."""
    failures, warnings = [], []
    bypassed: dict[str, list[OtherPatcher]] = {}
    for patcher in patchers:
        if patcher.bypasses and patcher.op is not None:
            bypassed.setdefault(patcher.op, []).append(patcher)
        elif patcher.op is None:
            warnings.append(f"another patcher is active: {patcher.how}")
    others = [p for p in patchers if not p.bypasses and p.op is not None]
    if others:
        warnings.append(
            f"{len(others)} module(s) have a forward set by another patcher that still runs the guard, "
            f"e.g. {others[0].module} ({others[0].how})"
        )
    for op, found in bypassed.items():
        first = found[0]
        message = (
            f"{op}: {len(found)} module(s) bypass the injected guard, first {first.module} ({first.how}); "
            f"the PTO kernel cannot run there: {OTHER_PATCHER_HINT}"
        )
        if op in switched_on:
            failures.append(message)
        else:
            warnings.append(message + " (fails verify --use_pto when the op is switched on)")
    return failures, warnings


# --- verify ---------------------------------------------------------------------------------------


def check_options(options: RunOptions, spec: ModelSpec, batch: int) -> None:
    """Reject bad option values (usage errors) before any folder, device or model is touched."""
    check_counts(options.warmup, options.iters, batch, options.output_length)
    dtype_key(options.dtype)
    if options.kernel_backend is not None and options.kernel_backend not in KERNEL_BACKENDS:
        raise PtoPatchError(
            f"--kernel-backend '{options.kernel_backend}' is unknown",
            f"choose from: {', '.join(KERNEL_BACKENDS)}",
            exit_code=EXIT_USAGE,
        )
    if options.ops is not None:
        parse_ops(options.ops, spec)


def start_run(options: RunOptions, *, batch: int, use_pto: bool) -> tuple[LoadedModel, list[str], list[str]]:
    """What verify and bench start from: options checked, the folder checked, the model loaded once.

    Returns the loaded model, the failures found so far (checkpoint keys) and the warnings.
    """
    from pto_patch.model_folder import resolve_model_folder

    spec = load_spec(options.model)
    check_options(options, spec, batch)
    folder = resolve_model_folder(options.model_path, spec)
    if options.image is not None:
        check_image(Path(options.image))
    device = resolve_device(options.device)
    loaded = load_model(
        spec, folder, device, options.dtype, use_pto=use_pto, allow_modified=options.allow_modified
    )
    warnings: list[str] = []
    if loaded.state.modified_files:
        warnings.append(
            "--allow-modified: ran patched files that differ from what apply wrote: "
            + ", ".join(loaded.state.modified_files)
        )
    failures = load_failures(loaded.load_info)
    loaded.other_patchers = find_other_patchers(loaded.model, spec)
    # Every op this run may switch on (--use_dynamic_config only ever switches a subset of these on).
    may_switch_on = choose_ops(options.ops, spec, loaded.state, batch, False)[0] if use_pto else ()
    more_failures, more_warnings = other_patcher_checks(loaded.other_patchers, may_switch_on)
    return loaded, failures + more_failures, warnings + more_warnings


def check_image(image: Path) -> None:
    """Refuse an --image that is missing, a folder, or not a picture PIL can decode, before any load."""
    from PIL import Image

    if not image.exists():
        raise PtoPatchError(f"--image {image} does not exist", "pass the path of a PNG or JPEG file")
    if not image.is_file():
        raise PtoPatchError(f"--image {image} is not a file", "pass the path of a PNG or JPEG file")
    try:
        with Image.open(image) as opened:
            opened.verify()
    except Exception as exc:  # PIL raises OSError, SyntaxError, struct.error ... for bad or truncated data
        reason = (str(exc).splitlines() or [""])[0] or type(exc).__name__
        raise PtoPatchError(
            f"--image {image} is not an image PIL can read ({reason})", "pass a PNG or JPEG file"
        ) from exc


def kernel_backend_name(options: RunOptions) -> str:
    """The backend the kernels are asked for: --kernel-backend, else $PTO_KERNELS_BACKEND, else auto."""
    return options.kernel_backend or os.environ.get("PTO_KERNELS_BACKEND") or "auto"


def run_verify(options: VerifyOptions) -> VerifyReport:
    loaded, failures, warnings = start_run(options, batch=options.batch, use_pto=options.use_pto)
    spec, folder, device = loaded.spec, loaded.folder, loaded.device
    atol, rtol = tolerances(options.dtype, options.atol, options.rtol)
    if not options.use_pto:
        ignored = [
            flag
            for flag, used in (
                ("--ops", options.ops),
                ("--use_dynamic_config", options.use_dynamic_config),
                ("--kernel-backend", options.kernel_backend),
                ("--strict", options.strict),
            )
            if used
        ]
        if ignored:
            warnings.append(f"{', '.join(ignored)} only matter with --use_pto; ran the baseline only")
    compile_note = apply_compile(loaded.model, options, warnings)
    inputs, description = build_inputs(loaded, options.prompt, options.image, options.simple_prompt)
    inputs = batched(inputs, options.batch, device)
    kernel_backend = kernel_backend_name(options)

    switched_on: tuple[str, ...] = ()
    table = None
    if options.use_pto:
        switched_on, table = choose_ops(
            options.ops, spec, loaded.state, options.batch, options.use_dynamic_config
        )

    # The accuracy runs: switches off, then on, on the same inputs; then the timed runs of both modes.
    kernels = loaded.kernels
    if kernels is not None:
        kernels.disable()
        kernels.reset_stats()
    base_run = generate(loaded, inputs, options.output_length, fixed_length=False, logits=True)
    if kernels is not None:
        stray = {op: entry["calls"] for op, entry in kernels.stats().items() if entry.get("calls")}
        if stray:
            failures.append(f"kernels ran with every switch off: {stray}")
    switches: dict[str, Callable[[], None]] = {"baseline": kernels.disable if kernels else lambda: None}
    pto_run, stats = None, {}
    try:
        if options.use_pto:
            switches["pto"] = lambda: switch_on(kernels, switched_on, kernel_backend)
            switches["pto"]()
            pto_run = generate(loaded, inputs, options.output_length, fixed_length=False, logits=True)
        timed = measure_modes(
            loaded,
            inputs,
            switches,
            batch=options.batch,
            new_tokens=options.output_length,
            warmup=options.warmup,
            iters=options.iters,
        )
    finally:
        if kernels is not None:
            stats = kernels.stats()  # only the PTO runs count: the switches are off for the baseline
            kernels.disable()
    baseline = timed["baseline"]

    report = VerifyReport(
        model_path=str(folder),
        device=device.name,
        device_reason=device.reason,
        dtype=loaded.dtype_name,
        versions=versions(),
        input=description,
        load_info=loaded.load_info,
        baseline=baseline,
        failures=failures,
        warnings=warnings,
        patched_ops=list(loaded.state.patched_ops),
        switched_on=list(switched_on),
        kernel_backend=kernel_backend if options.use_pto else None,
        dynamic_config=table,
        pto_kernels_path=str(_module_dir(loaded.kernels)) if loaded.kernels is not None else None,
        modified_files=list(loaded.state.modified_files),
        allow_modified=options.allow_modified,
        rope_fixes=loaded.rope_fixes,
        compile=compile_note,
        peak_memory_source=peak_memory_source(device),
        options=options.to_json(),
        other_patchers=list(loaded.other_patchers),
    )

    if options.use_pto:
        report.pto = timed["pto"]
        report.ops = op_reports(stats, switched_on)
        more_failures, more_warnings = op_failures(report.ops, options.strict)
        report.failures += more_failures
        report.warnings += more_warnings
        report.accuracy = compare(base_run, pto_run, loaded.tokenizer, atol, rtol)
        if not report.accuracy.logits_within_tolerance:
            report.failures.append(
                f"first-step logits differ by {report.accuracy.max_abs_logit_diff:.4g} "
                f"(> atol {atol:g} + rtol {rtol:g} x max|logit|)"
            )
        if not switched_on:
            report.warnings.append("no op was switched on, so the PTO run equals the baseline")
    else:
        text = loaded.tokenizer.decode(base_run.new_tokens[0], skip_special_tokens=True)
        report.input["baseline_text"] = text

    if options.report_file is not None:
        report.report_file = str(options.report_file)
        write_report(report.to_json(), options.report_file)
    return report
