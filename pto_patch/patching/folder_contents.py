"""What a model folder holds besides the checkpoint and the patch: kept edits, and everything else.

`restore --force` keeps an edited file beside the original as `<name>.edited` (then `.edited.2`, ...:
a kept copy never overwrites an earlier one). Anything else that is neither a checkpoint file (the
download record's list, or the names a Hugging Face checkpoint ships) nor a file the patch wrote or
added (the manifest's) was put there by someone else: a report written into the folder, a copy, a
cache. `status` and `restore` name both; nothing here deletes anything.
"""

from __future__ import annotations

import fnmatch
import os
import re
from pathlib import Path

from pto_patch.model.folder import DOWNLOAD_RECORD, read_download_record
from pto_patch.patching.manifest import MANIFEST_DIR, Manifest

KEPT_SUFFIX = ".edited"
KEPT_COPY = re.compile(r".+\.edited(\.\d+)?$")
HUB_METADATA = ".cache"  # huggingface_hub's notes of a download into a local folder
# What a Hugging Face checkpoint ships, by name (top level of the folder).
CHECKPOINT_NAMES = (
    "config.json",
    "generation_config.json",
    "*.safetensors",
    "*.safetensors.index.json",
    "pytorch_model*.bin",
    "*.bin.index.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
    "special_tokens_map.json",
    "added_tokens.json",
    "chat_template.json",
    "chat_template.jinja",
    "*preprocessor_config.json",
    "processor_config.json",
    "modeling_*.py",
    "configuration_*.py",
    "*processing_*.py",
    "README*",
    "LICENSE*",
    ".gitattributes",
    DOWNLOAD_RECORD,
    HUB_METADATA,
)


def kept_copy_path(path: Path) -> Path:
    """Where `restore --force` keeps the edited `path`: the first of `.edited`, `.edited.2`, ... free."""
    candidate, number = path.with_name(path.name + KEPT_SUFFIX), 1
    while candidate.exists() or candidate.is_symlink():
        number += 1
        candidate = path.with_name(f"{path.name}{KEPT_SUFFIX}.{number}")
    return candidate


def kept_copies(folder: Path) -> list[str]:
    """Every kept edit in the folder (outside .pto_patch/), '/'-separated, sorted."""
    folder = Path(folder)
    found = []
    for root, dirs, files in os.walk(folder):
        dirs[:] = [name for name in dirs if name not in (MANIFEST_DIR, HUB_METADATA)]
        found += [
            (Path(root) / name).relative_to(folder).as_posix() for name in files if KEPT_COPY.match(name)
        ]
    return sorted(found)


def unexpected_entries(folder: Path, manifest: Manifest | None = None) -> list[str]:
    """Top-level entries put there by neither the checkpoint nor the patch (kept edits aside); a folder
    ends in '/'."""
    folder = Path(folder)
    record = read_download_record(folder) or {}
    downloaded = record.get("files") if isinstance(record.get("files"), dict) else {}
    known = {MANIFEST_DIR} | {path.split("/")[0] for path in downloaded}
    if manifest is not None:
        known |= {entry.path.split("/")[0] for entry in manifest.files}
        known |= {path.split("/")[0] for path in manifest.added_dirs}
    found = []
    for entry in sorted(folder.iterdir(), key=lambda path: path.name):
        name = entry.name
        if name in known or KEPT_COPY.match(name) or any(fnmatch.fnmatch(name, p) for p in CHECKPOINT_NAMES):
            continue
        found.append(name + "/" if entry.is_dir() and not entry.is_symlink() else name)
    return found
