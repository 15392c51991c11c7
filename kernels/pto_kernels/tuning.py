"""Tuning files: which ops (on which backends) measured faster than the eager model, per batch size.

`pto-patch tune` measures the patched model on one device and writes `.pto_patch/tuning.json` in the
model folder. `pto_kernels.apply_tuning(path_or_dict, batch_size, device, dtype)` switches on what it chose for that
batch size, after checking that the file was made on this device, in this dtype, with these torch /
transformers / pypto releases: a tuning made elsewhere raises TuningMismatchError with a one-line
reason and is never applied.

    import pto_kernels
    choice = pto_kernels.apply_tuning(
        "GutenOCR-3B/.pto_patch/tuning.json", batch_size=4, device=model.device, dtype=model.dtype
    )
    print(choice.describe())    # e.g. "batch 4 (tuned at 4): swiglu_mlp=fused"
"""

from __future__ import annotations

import importlib.metadata
import json
import platform
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ._dispatch import BACKENDS, OPS

FORMAT = "pto-patch-tuning"
FORMAT_VERSION = 1
TUNING_FILE = ".pto_patch/tuning.json"  # relative to the model folder
# Releases a tuning depends on; a different one (or one installed on one side only) is a mismatch.
VERSIONED = ("torch", "transformers", "pypto", "torch_npu")
# Other spellings of the dtype names a tuning header records (torch's: "bfloat16", "float16", "float32").
DTYPE_ALIASES = {
    "bf16": "bfloat16",
    "fp16": "float16",
    "half": "float16",
    "fp32": "float32",
    "float": "float32",
}


class TuningError(ValueError):
    """A tuning file that cannot be read or does not hold a tuning."""


class TuningMismatchError(TuningError):
    """A tuning made on another device or with other releases than the ones here."""


# --- where we are ---------------------------------------------------------------------------------


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown cpu"


def device_identity(device: Any = None) -> dict[str, str]:
    """{"kind", "name"} of `device` (a str, torch.device or None: NPU, else CUDA, else CPU)."""
    import torch

    if device is None:
        npu = getattr(torch, "npu", None)  # present only where torch_npu was loaded
        if npu is not None and npu.is_available():
            device = "npu"
        elif torch.cuda.is_available():
            device = "cuda"
        else:
            device = "cpu"
    device = torch.device(device)
    if device.type == "cpu":
        return {"kind": "cpu", "name": _cpu_name()}
    index = device.index or 0
    if device.type == "cuda":
        return {"kind": "cuda", "name": torch.cuda.get_device_name(index)}
    if device.type == "npu":
        return {"kind": "npu", "name": npu_name(index)}
    return {"kind": device.type, "name": device.type}


def npu_name(index: int) -> str:
    """The name of NPU `index`: torch_npu's get_device_name(index) checks the index but names the current
    device (torch_npu/npu/__init__.py), its device properties name the one asked for."""
    import torch

    return str(torch.npu.get_device_properties(index).name)


def release_versions() -> dict[str, str | None]:
    """The installed releases a tuning depends on (None where not installed); read from metadata,
    since importing torch_npu can break torch."""
    found: dict[str, str | None] = {}
    for dist in VERSIONED:
        try:
            found[dist] = importlib.metadata.version(dist.replace("_", "-"))
        except importlib.metadata.PackageNotFoundError:
            found[dist] = None
    return found


def environment(device: Any = None) -> dict[str, Any]:
    return {"device": device_identity(device), "versions": release_versions()}


def dtype_name(dtype: Any) -> str:
    """torch's name of `dtype`: a torch.dtype or a name ("bf16", "bfloat16", "torch.bfloat16")."""
    name = str(dtype).removeprefix("torch.")
    return DTYPE_ALIASES.get(name, name)


# --- the file -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BatchChoice:
    """What to switch on at one batch size: op -> backend (empty: nothing on, the eager model)."""

    batch: int
    ops: dict[str, str] = field(default_factory=dict)
    requested_batch: int | None = None  # the batch size asked for, where it was not tuned itself
    decided: str | None = None  # how tune decided, e.g. "nothing measured faster"

    def describe(self) -> str:
        chosen = ", ".join(f"{op}={backend}" for op, backend in self.ops.items()) or "nothing on"
        asked = self.batch if self.requested_batch is None else self.requested_batch
        return f"batch {asked} (tuned at {self.batch}): {chosen}"


@dataclass(frozen=True)
class Tuning:
    device: dict[str, str]
    versions: dict[str, str | None]
    spec: str
    ops_patched: tuple[str, ...]
    batches: tuple[BatchChoice, ...]
    source: str = "<dict>"
    header: dict[str, Any] = field(default_factory=dict)  # the whole header, as written

    def mismatch(self, here: Mapping[str, Any]) -> str | None:
        """Why this tuning does not apply `here` (an `environment()`), in one line; None if it does."""
        reasons = []
        if (
            self.device.get("kind") != here["device"]["kind"]
            or self.device.get("name") != here["device"]["name"]
        ):
            reasons.append(
                f"device {self.device.get('kind')} '{self.device.get('name')}' "
                f"(this is {here['device']['kind']} '{here['device']['name']}')"
            )
        for dist in VERSIONED:
            made, now = self.versions.get(dist), here["versions"].get(dist)
            if made != now:
                reasons.append(f"{dist} {made or 'not installed'} (here {now or 'not installed'})")
        if not reasons:
            return None
        return f"tuning {self.source} was made with {'; '.join(reasons)}: run `pto-patch tune` here"

    def dtype_mismatch(self, dtype: Any) -> str | None:
        """Why this tuning does not apply to a model in `dtype` (one line); None if it does, or if the
        header records no dtype (files written before tune recorded it)."""
        made = self.header.get("dtype")
        if made is None:
            return None
        if dtype is None:
            return f"tuning {self.source} was measured in {made}: pass dtype= (the model's, e.g. model.dtype)"
        if dtype_name(dtype) != made:
            return (
                f"tuning {self.source} was measured in {made}, this model is {dtype_name(dtype)}: "
                f"run `pto-patch tune --dtype {dtype_name(dtype)}` here"
            )
        return None

    def for_batch(self, batch_size: int) -> BatchChoice:
        """The choice tuned at `batch_size`; else at the largest tuned batch below it; else the smallest."""
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        tuned = sorted(self.batches, key=lambda choice: choice.batch)
        below = [choice for choice in tuned if choice.batch <= batch_size]
        choice = below[-1] if below else tuned[0]
        if choice.batch == batch_size:
            return choice
        return BatchChoice(choice.batch, dict(choice.ops), batch_size, choice.decided)


def _read(source: str | Path | Mapping[str, Any]) -> tuple[Mapping[str, Any], str]:
    if isinstance(source, Mapping):
        return source, "<dict>"
    path = Path(source)
    try:
        return json.loads(path.read_text(encoding="utf-8")), str(path)
    except FileNotFoundError as exc:
        raise TuningError(f"no tuning file at {path}") from exc
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise TuningError(f"tuning file {path} is not readable JSON ({exc})") from exc


def load(source: str | Path | Mapping[str, Any]) -> Tuning:
    """A tuning from a path or from its parsed JSON; TuningError if it is not one this package reads."""
    data, where = _read(source)
    try:
        if data.get("format") != FORMAT:
            raise TuningError(f"{where} is not a pto-patch tuning file (format {data.get('format')!r})")
        if data.get("format_version") != FORMAT_VERSION:
            raise TuningError(
                f"{where} has tuning format version {data.get('format_version')!r}; "
                f"this pto_kernels reads {FORMAT_VERSION}"
            )
        header = data["header"]
        batches = []
        for entry in data["batches"]:
            ops = dict(entry["chosen"])
            for op, backend in ops.items():
                if op not in OPS or backend not in BACKENDS:
                    raise TuningError(f"{where}: batch {entry['batch']} chooses unknown {op}={backend}")
            decided = entry.get("decided")
            batches.append(
                BatchChoice(int(entry["batch"]), ops, decided=None if decided is None else str(decided))
            )
        if not batches:
            raise TuningError(f"{where} holds no tuned batch size")
        return Tuning(
            device={"kind": str(header["device"]["kind"]), "name": str(header["device"]["name"])},
            versions={dist: header["versions"].get(dist) for dist in VERSIONED},
            spec=str(header["spec"]),
            ops_patched=tuple(header["ops_patched"]),
            batches=tuple(batches),
            source=where,
            header=dict(header),
        )
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        if isinstance(exc, TuningError):
            raise
        raise TuningError(f"{where} is not a complete tuning file (bad or missing {exc})") from exc


def choose(
    source: str | Path | Mapping[str, Any], batch_size: int, device: Any = None, dtype: Any = None
) -> BatchChoice:
    """What `source` chose for `batch_size` on `device` (default: NPU, else CUDA, else CPU) for a model in
    `dtype` (a torch.dtype such as model.dtype, or a name such as "bf16"); `pto_kernels.apply_tuning`
    switches it on.

    Raises TuningMismatchError (one line: what differs) if the tuning was made on another device, in
    another dtype (or `dtype` is not given while the tuning records one), or with other torch /
    transformers / pypto / torch_npu releases.
    """
    tuning = load(source)
    reason = tuning.mismatch(environment(device)) or tuning.dtype_mismatch(dtype)
    if reason is not None:
        raise TuningMismatchError(reason)
    return tuning.for_batch(batch_size)
