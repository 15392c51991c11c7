"""The truth of every verify: the unpatched model, eager, on the same inputs, dtype and device.

A patched folder's own baseline (its kernels switched off) runs the patched modeling file and, in a
compiled or captured mode, the compiler; a fault either brings to both of a mode's runs cannot be seen by
comparing them with each other. So every comparing run first loads the model as it was before apply
(`unpatched_view`: the folder's files as a folder of links, with what apply added left out and what it
modified taken from its backup, checked against the manifest's hash; an overlay's source folder as it
is), generates greedily with no compile and no kernel package, and keeps each step's top scores
(`judging.StepTrace`). The mode's runs are then judged against that trace, step by step.

The view holds no copy of the weights; the reference model is let go (`Reference.close`) before the
patched one loads, so peak memory stays one model's. Its generations are kept between runs under a key
of everything they depend on (`run.reference_cache`): a second verify of the same folder and inputs
loads no reference.
"""

from __future__ import annotations

import gc
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pto_patch.patching.manifest import MANIFEST_DIR
from pto_patch.patching.originals import Originals
from pto_patch.run import progress
from pto_patch.run.device import empty_cache, synchronize
from pto_patch.run.judging import ReferenceGeneration, TraceRecorder
from pto_patch.run.loading import LoadedModel

VIEW_SUFFIX = "-unpatched"  # the view's folder name: transformers names a folder's remote code after it


def _link_tree(
    source: Path, target: Path, prefix: str, modified: dict[str, Path], added: frozenset[str]
) -> None:
    target.mkdir(parents=True, exist_ok=True)
    for entry in sorted(os.listdir(source)):
        relative = f"{prefix}{entry}"
        if not prefix and entry == MANIFEST_DIR:
            continue
        if relative in added:
            continue
        if relative in modified:
            os.symlink(os.path.abspath(modified[relative]), target / entry)
            continue
        below = f"{relative}/"
        path = source / entry
        if path.is_dir() and not path.is_symlink() and any(p.startswith(below) for p in (*modified, *added)):
            _link_tree(path, target / entry, below, modified, added)
            if not any((target / entry).iterdir()):
                (target / entry).rmdir()  # a folder apply added (pto_kernels/)
            continue
        os.symlink(os.path.abspath(path), target / entry)


@contextmanager
def unpatched_view(folder: Path, originals: Originals) -> Iterator[Path]:
    """A temporary folder that holds `folder` as it was before apply (links, no copies), removed after;
    `originals`: where its files before apply lie, as its caller read them (a run's plan:
    `patching.originals.original_files`)."""
    folder = Path(folder).resolve()
    if originals.source is not None:  # an overlay: its source is the unpatched model
        yield originals.source
        return
    holder = Path(tempfile.mkdtemp(prefix="pto-patch-reference-"))
    try:
        view = holder / f"{folder.name}{VIEW_SUFFIX}"
        _link_tree(folder, view, "", originals.modified, originals.added)
        yield view
    finally:
        shutil.rmtree(holder, ignore_errors=True)


class Reference:
    """The unpatched model, eager; `generate` gives a trace to judge runs against. The model loads at the
    first generation the cache does not hold (`run.reference_cache`): a run whose every generation was
    kept loads none. Its tokenizer, folder, spec and device encode the inputs (as a LoadedModel's do)."""

    def __init__(self, spec, device, dtype: str, view: Path):
        from transformers import AutoTokenizer

        from pto_patch.run import reference_cache
        from pto_patch.run.device import dtype_key
        from pto_patch.run.judging import TRACE_TOP_K
        from pto_patch.run.loading import versions

        self.view, self.dtype = view, dtype
        self.folder, self.spec, self.device = view, spec, device
        self.tokenizer = AutoTokenizer.from_pretrained(view)
        self._loaded: LoadedModel | None = None
        self.generations = self.kept = 0
        self.seconds = 0.0
        self.identity = (
            reference_cache.identity(view, dtype_key(dtype), device.name, versions(), TRACE_TOP_K)
            if reference_cache.enabled()
            else None
        )

    @property
    def loaded(self) -> LoadedModel:
        if self._loaded is None:
            from pto_patch.model.rope_section import folder_mrope_section
            from pto_patch.patching.folder_check import check_folder
            from pto_patch.run import loading

            progress.phase("loading the unpatched model (the reference)")
            self._loaded = loading.load_model(
                self.spec,
                self.view,
                self.device,
                self.dtype,
                checked=check_folder(self.view, use_pto=False, allow_modified=False),
                rope_section=folder_mrope_section(self.view, self.spec),
            )
        return self._loaded

    @property
    def load_s(self) -> float:
        return self._loaded.load_s if self._loaded is not None else 0.0

    def generate(self, inputs, new_tokens: int) -> ReferenceGeneration:
        from pto_patch.run import reference_cache

        key = reference_cache.input_key(self.identity, inputs, new_tokens) if self.identity else None
        kept = reference_cache.load(key) if key else None
        if kept is not None:
            self.kept += 1
            return kept
        generation = self._generate(inputs, new_tokens)
        if key:
            reference_cache.keep(key, generation)
        return generation

    def _generate(self, inputs, new_tokens: int) -> ReferenceGeneration:
        from pto_patch.run.generation import eos_ids, generate

        loaded = self.loaded
        recorder = TraceRecorder()
        started = time.perf_counter()
        run = generate(loaded, inputs, new_tokens, fixed_length=False, logits=False, processor=recorder)
        self.seconds += time.perf_counter() - started
        self.generations += 1
        trace = recorder.finish(run.new_tokens, eos_ids(loaded.tokenizer, loaded.model))
        texts = loaded.tokenizer.batch_decode(run.new_tokens, skip_special_tokens=True)
        return ReferenceGeneration(run.new_tokens, texts, trace, run.seconds)

    def describe(self) -> dict[str, Any]:
        return {
            "what": "the unpatched model (the folder as before apply), eager, no kernel package, no compile",
            "load_s": round(self.load_s, 4),
            "generations": self.generations,
            "kept": self.kept,  # generations taken from the reference cache (run.reference_cache)
            "seconds": round(self.seconds, 4),
        }

    def close(self) -> None:
        """Let the model go, so the patched one loads into its memory."""
        if self._loaded is None:
            return
        device = self._loaded.device
        self._loaded.model = None
        self._loaded = None
        gc.collect()
        synchronize(device)
        empty_cache(device)


@contextmanager
def open_reference(plan) -> Iterator[Reference]:
    """Load the planned folder's unpatched model (plan: `run.start.RunPlan`) for the length of the block."""
    from pto_patch.patching import folder_lock

    # the folder's state is the plan's (half-patched, drifted or unpatched folders were refused there)
    with folder_lock.shared(plan.folder):
        plan.check_unchanged()
        with unpatched_view(plan.folder, plan.read.originals) as view:
            reference = Reference(plan.spec, plan.device, plan.options.dtype, view)
            try:
                yield reference
            finally:
                reference.close()
