"""`pto-patch demo`: the whole story on an embedded tiny model, offline, in under a minute.

make-tiny -> apply -> status -> verify --use_pto (a generated test image through the OCR path)
-> restore -> the folder's hashes equal the originals. Without --keep nothing is left behind:
the model, the image and transformers' remote-code copies all live in one folder that is removed.

The demo verifies in bfloat16, GutenOCR-3B's own dtype. On the CPU the `fused` backend reproduces
the eager code's bits, so baseline and PTO logits agree exactly there.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pto_patch.errors import PtoPatchError
from pto_patch.patching.folder_hashes import folder_hashes
from pto_patch.patching.folder_kernels import forget_folder_kernels
from pto_patch.run.report import DemoResult

MODEL_DIR = "gutenocr-tiny"
IMAGE_NAME = "demo-page.png"
MODULES_DIR = "hf-modules"
IMAGE_SIZE = (112, 84)  # multiples of 28: 12 image tokens on the tiny model
# Enough warm-up and timed runs that one slow run does not decide the ratio, well under a minute.
VERIFY_SETTINGS = {"warmup": 3, "iters": 8, "output_length": 16, "dtype": "bf16"}

StepCallback = Callable[[str, Any, float], None]


def _prepare_directory(directory: Path | None) -> tuple[Path, list[Path]]:
    """The working folder, and what to remove afterwards (only what the demo created)."""
    if directory is None:
        work = Path(tempfile.mkdtemp(prefix="pto-patch-demo-"))
        return work, [work]
    work = Path(directory).expanduser().resolve()
    if work.exists() and not work.is_dir():
        raise PtoPatchError(f"--dir {work} exists and is not a folder", "pick a folder path")
    clashes = [name for name in (MODEL_DIR, IMAGE_NAME, MODULES_DIR) if (work / name).exists()]
    if clashes:
        raise PtoPatchError(
            f"--dir {work} already holds {', '.join(clashes)}",
            "pick an empty or new folder, or remove them",
        )
    if not work.exists():
        work.mkdir(parents=True)
        return work, [work]
    return work, [work / MODEL_DIR, work / IMAGE_NAME, work / MODULES_DIR]


def _isolate_modules_cache(work: Path, notes: list[str]) -> tuple[str | None, dict[str, str | None]]:
    """Point transformers' remote-code cache into the demo folder (read when transformers is imported)."""
    saved = {"HF_MODULES_CACHE": os.environ.get("HF_MODULES_CACHE")}
    if "transformers" in sys.modules:
        notes.append("transformers was already imported: its remote-code cache stays where it was")
        return None, saved
    cache = work / MODULES_DIR
    os.environ["HF_MODULES_CACHE"] = str(cache)
    return str(cache), saved


def run_demo(
    directory: Path | None = None, keep: bool = False, on_step: StepCallback | None = None
) -> DemoResult:
    from pto_patch.patching import engine
    from pto_patch.run import image_inputs
    from pto_patch.run.verify import VerifyOptions, verify_model
    from pto_patch.tiny import model as tiny_model

    started = time.perf_counter()
    work, created = _prepare_directory(directory)
    notes: list[str] = []
    steps: list[tuple[str, float]] = []
    modules_cache, saved_env = _isolate_modules_cache(work, notes)
    folder = work / MODEL_DIR

    def step(name: str, action: Callable[[], Any]) -> Any:
        begun = time.perf_counter()
        result = action()
        seconds = time.perf_counter() - begun
        steps.append((name, seconds))
        if on_step is not None:
            on_step(name, result, seconds)
        return result

    report = None
    try:
        step("make-tiny", lambda: tiny_model.make_tiny(folder))
        before = folder_hashes(folder)
        step("apply", lambda: engine.apply_patch(model_path=folder))
        step("status", lambda: engine.model_status(model_path=folder))
        image = work / IMAGE_NAME
        image_inputs.sample_image(*IMAGE_SIZE).save(image)
        options = VerifyOptions(model_path=folder, use_pto=True, image=image, **VERIFY_SETTINGS)
        report = step("verify --use_pto", lambda: verify_model(options))
        step("restore", lambda: engine.restore_model(model_path=folder))
        after = folder_hashes(folder)
        differences = sorted(path for path in set(before) | set(after) if before.get(path) != after.get(path))
        return DemoResult(
            directory=str(work),
            kept=keep,
            seconds=time.perf_counter() - started,
            steps=steps,
            files_compared=len(before),
            hash_differences=differences,
            verify=report,
            modules_cache=modules_cache,
            notes=notes,
        )
    finally:
        forget_folder_kernels(folder)
        if saved_env["HF_MODULES_CACHE"] is None:
            os.environ.pop("HF_MODULES_CACHE", None)
        else:
            os.environ["HF_MODULES_CACHE"] = saved_env["HF_MODULES_CACHE"]
        if not keep:
            for path in created:
                if path.is_dir() and not path.is_symlink():
                    shutil.rmtree(path, ignore_errors=True)
                elif path.exists() or path.is_symlink():
                    path.unlink()
