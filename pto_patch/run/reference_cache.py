"""The reference's generations kept between runs, so a second verify (another mode, another op set, the
same pages) does not load and run the unpatched model again.

An entry is found only under a key made of everything its answer depends on: every file of the unpatched
view (each file's full sha256: the weights through `patching.weights_digest`, cached by size and mtime,
the modeling code, config and tokenizer files as they are), the dtype, the device, the torch, transformers
and pto-patch versions, the digest of the code that generates and records the trace, the trace's width,
the number of new tokens asked, and every byte of the inputs (token ids, pixels, grids). A changed weight,
file, input or stack is a new key, never a stale answer.

Entries live in pto-patch's cache (`rewrite_cache.cache_dir()/references/`), one file each, written whole
(atomically) or not at all. Reading one is bounded (its size, then `torch.load(weights_only=True)`, which
builds tensors and plain containers only) and checked against the shape a trace has; anything else is a
miss, and the reference runs. A cache that cannot be written only costs the next run its reference.
`PTO_PATCH_REFERENCE_CACHE=0` turns it off.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
from pathlib import Path
from typing import Any

from pto_patch.patching.rewrite_cache import cache_dir
from pto_patch.patching.weights_digest import file_digest

VERSION = 2  # of an entry's form (2: each step's log normalizer)
MAX_ENTRY_BYTES = 512 * 2**20  # a 1,024-token answer at batch 16 with top 20 is a few MB
OFF_ENV = "PTO_PATCH_REFERENCE_CACHE"
_RUN = Path(__file__).resolve().parent
# the code whose behaviour decides a trace: generation, the recorder, the reference
_GENERATING_CODE = ("generation.py", "judging.py", "reference.py", "reference_cache.py")


def enabled() -> bool:
    return os.environ.get(OFF_ENV, "1").strip().lower() not in ("0", "off", "no", "false")


def _files(folder: Path) -> list[Path]:
    found = []
    for root, dirs, names in os.walk(folder, followlinks=True):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        found += [Path(root) / name for name in sorted(names) if not name.startswith(".")]
    return found


def identity(view: Path, dtype: str, device: str, versions: dict[str, str], top_k: int) -> str:
    """What the reference is: the view's files, the dtype, device, stack and the generating code."""
    digest = hashlib.sha256(f"pto-patch reference {VERSION}\0".encode())
    for path in _files(Path(view)):
        digest.update(f"{path.relative_to(view).as_posix()}\0{file_digest(path)}\0".encode())
    for name in _GENERATING_CODE:
        digest.update(f"{name}\0{file_digest(_RUN / name)}\0".encode())
    stack = {key: versions.get(key) for key in ("pto_patch", "torch", "transformers", "python")}
    digest.update(json.dumps([dtype, device, stack, top_k], sort_keys=True).encode())
    return digest.hexdigest()


def input_key(reference_identity: str, inputs: Any, new_tokens: int) -> str:
    """The entry's key: the reference, every input tensor's name, dtype, shape and bytes, the length."""
    import torch

    digest = hashlib.sha256(f"{reference_identity}\0{int(new_tokens)}\0".encode())
    for name in sorted(inputs.keys()):
        value = inputs[name]
        if isinstance(value, torch.Tensor):
            tensor = value.detach().cpu().contiguous()
            digest.update(f"{name}\0{tensor.dtype}\0{tuple(tensor.shape)}\0".encode())
            digest.update(tensor.view(torch.uint8).numpy().tobytes() if tensor.numel() else b"")
        else:
            digest.update(f"{name}\0{value!r}\0".encode())
    return digest.hexdigest()


def _entry(key: str) -> Path:
    return cache_dir() / "references" / f"{key}.pt"


def load(key: str):
    """The kept generation under `key` (a `reference.ReferenceGeneration`), or None."""
    import torch

    from pto_patch.run.judging import ReferenceGeneration, StepTrace

    path = _entry(key)
    try:
        if not path.is_file() or path.stat().st_size > MAX_ENTRY_BYTES:
            return None
        data = torch.load(path, map_location="cpu", weights_only=True)
        trace = StepTrace(
            tokens=list(data["tokens"]),
            top_values=list(data["top_values"]),
            top_indices=list(data["top_indices"]),
            scales=list(data["scales"]),
            log_normalizers=list(data["log_normalizers"]),
            finished_after=[None if last < 0 else int(last) for last in data["finished_after"].tolist()],
        )
        generation = ReferenceGeneration(
            data["new_tokens"], list(data["texts"]), trace, float(data["seconds"])
        )
    except Exception:  # noqa: BLE001 - any unreadable, foreign or half-kept entry is a miss
        return None
    return generation if _whole(generation) else None


def _whole(generation) -> bool:
    import torch

    trace, tokens = generation.trace, generation.new_tokens
    if not isinstance(tokens, torch.Tensor) or tokens.dim() != 2:
        return False
    batch, steps = tokens.shape
    lists = (trace.tokens, trace.top_values, trace.top_indices, trace.scales, trace.log_normalizers)
    return (
        all(len(items) == steps for items in lists)
        and len(trace.finished_after) == batch == len(generation.texts)
        and all(isinstance(text, str) for text in generation.texts)
        and all(isinstance(t, torch.Tensor) and t.shape[0] == batch for items in lists for t in items)
    )


def keep(key: str, generation) -> None:
    """Keep `generation` under `key`, whole or not at all; a cache that cannot be written is skipped."""
    import torch

    from pto_patch.patching.fileio import atomic_write_bytes

    trace = generation.trace
    data = {
        "new_tokens": generation.new_tokens.cpu(),
        "texts": list(generation.texts),
        "seconds": float(generation.seconds),
        "tokens": [t.cpu() for t in trace.tokens],
        "top_values": [t.cpu() for t in trace.top_values],
        "top_indices": [t.cpu() for t in trace.top_indices],
        "scales": [t.cpu() for t in trace.scales],
        "log_normalizers": [t.cpu() for t in trace.log_normalizers],
        "finished_after": torch.tensor([-1 if last is None else last for last in trace.finished_after]),
    }
    buffer = io.BytesIO()
    torch.save(data, buffer)
    try:
        path = _entry(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(path, buffer.getvalue(), mode=0o644)
    except OSError:
        pass
