"""Loading the patched folder once: remote code, eager attention, the rope fixes, and what loaded.

A checkpoint key that is missing, unexpected or of the wrong shape, or a tied lm_head that loaded
as its own tensor, is a failure: baseline and PTO runs of a random-weight model can agree.
"""

from __future__ import annotations

import importlib.metadata
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pto_patch import __version__
from pto_patch.errors import ModelFolderError
from pto_patch.model.spec import ModelSpec
from pto_patch.patching.folder_check import CheckedFolder
from pto_patch.run.device import DeviceChoice, dtype_key, resolve_dtype, synchronize
from pto_patch.run.hub_kernels import describe_hub_kernels, load_arguments
from pto_patch.run.report import LoadInfo, OtherPatcher


def _text_config(config):
    return getattr(config, "text_config", None) or config


def fix_rope_config(config, section: list[int]) -> list[str]:
    """The reference's fix: every rope dict the attention may read carries `section` (the plan's, from the
    folder's config.json: `model.rope_section`).

    4.x reads `rope_scaling["mrope_section"]`, 5.x `rope_parameters["mrope_section"]` (5.20+ silently
    defaults to [16, 24, 24], wrong for any other head size).
    """
    fixes = []
    scopes = [config] + ([config.text_config] if getattr(config, "text_config", None) is not None else [])
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


# make-tiny's tokenizer has a few hundred tokens; every trained Qwen2.5-VL checkpoint has 151,000+.
RANDOM_VOCABULARY_BELOW = 1000


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
    state: CheckedFolder
    kernels: Any = None  # the folder's pto_kernels module when --use_pto
    other_patchers: list[OtherPatcher] = field(default_factory=list)

    @property
    def random_weights(self) -> bool:
        """A make-tiny model's random weights: its timing holds for its widths only, its text means nothing."""
        return len(self.tokenizer) < RANDOM_VOCABULARY_BELOW

    @property
    def text_layers(self) -> int | None:
        """The text decoder's layer count (what a decoder-layer block's calls are per)."""
        return getattr(_text_config(self.model.config), "num_hidden_layers", None)


def _keys(info: dict[str, Any], name: str) -> list[str]:
    value = info.get(name) or []
    return sorted(str(item if not isinstance(item, tuple) else item[0]) for item in value)


def load_model(
    spec: ModelSpec,
    folder: Path,
    device: DeviceChoice,
    dtype_name: str,
    *,
    checked: CheckedFolder,
    rope_section: list[int],
    kernels=None,
    hub_kernels: bool = False,
) -> LoadedModel:
    """Load the model in `folder` once (remote code, eager attention, hub kernels only with `hub_kernels`:
    see `pto_patch.run.hub_kernels`), from what its caller read of the folder: its patch state
    (`checked`), the MRoPE section its config.json calls for (`model.rope_section`) and, for a PTO run,
    its own kernel package (`kernels`, `patching.folder_kernels`: imported before the modeling code)."""
    torch_dtype = resolve_dtype(dtype_name)

    from transformers import AutoConfig, AutoModelForImageTextToText, AutoTokenizer
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()  # the rendered report is the output

    started = time.perf_counter()
    try:
        config = AutoConfig.from_pretrained(folder, trust_remote_code=True)
        rope_fixes = fix_rope_config(config, rope_section)
        model, info = AutoModelForImageTextToText.from_pretrained(
            folder,
            config=config,
            trust_remote_code=True,
            attn_implementation="eager",
            dtype=torch_dtype,
            output_loading_info=True,
            # A wrong-shaped tensor then shows in load_info (verify fails, exit 3) instead of raising.
            ignore_mismatched_sizes=True,
            **load_arguments(hub_kernels),
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
        hub_kernels=describe_hub_kernels(model, hub_kernels),
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
        state=checked,
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
