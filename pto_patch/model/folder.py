"""Find the model folder and read its config.json, validated, with errors that say what and where."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pto_patch.errors import ModelFolderError
from pto_patch.model import hub_cache
from pto_patch.model.spec import ModelSpec

DOWNLOAD_RECORD = ".pto_patch_download.json"  # what `download` recorded of the snapshot


@dataclass(frozen=True)
class ModelConfig:
    path: Path
    raw_bytes: bytes
    data: dict[str, Any]


def resolve_model_folder(model_path: Path | str | None, spec: ModelSpec) -> Path:
    """--model-path, else the spec's environment variable, else the current folder; it must hold config.json."""
    if model_path is not None:
        folder, origin = Path(model_path), "--model-path"
    elif os.environ.get(spec.model_path_env):
        folder, origin = Path(os.environ[spec.model_path_env]), f"${spec.model_path_env}"
    else:
        folder, origin = Path.cwd(), "the current folder"
    folder = folder.expanduser()
    if folder.is_file() or (folder.is_symlink() and folder.name == "config.json"):
        raise ModelFolderError(
            f"{folder} (from {origin}) is a file; the model path is the folder that holds config.json",
            f"pass its folder: --model-path {folder.parent}",
        )
    if not folder.is_dir():
        raise ModelFolderError(
            f"model folder {folder} (from {origin}) does not exist",
            f"pass --model-path DIR or set {spec.model_path_env}; `pto-patch download` fetches the model",
        )
    config = folder / "config.json"
    if config.is_symlink() and not config.exists():
        raise ModelFolderError(
            f"{config} is a link to {os.readlink(config)}, which does not exist",
            "the download is incomplete: run `pto-patch download` again, or fix the link",
        )
    if config.exists() and not config.is_file():
        raise ModelFolderError(
            f"{config} is not a file", "point --model-path at a model folder whose config.json is a file"
        )
    if not config.is_file() and hub_cache.is_cache_repo(folder):
        snapshots = hub_cache.snapshots_of(folder)
        if not snapshots:
            raise ModelFolderError(
                f"{folder} (from {origin}) is a Hugging Face cache repo folder, not a model folder",
                "it holds no snapshot yet: download the model first (`pto-patch download`)",
            )
        raise ModelFolderError(
            f"{folder} (from {origin}) is a Hugging Face cache repo folder, not a model folder",
            f"pass one of its snapshots: --model-path {snapshots[0]}",
        )
    if not config.is_file():
        raise ModelFolderError(
            f"{folder} (from {origin}) has no config.json, so it is not a model folder",
            f"pass --model-path DIR or set {spec.model_path_env} to the downloaded model's folder",
        )
    return folder.resolve()


def read_model_config(folder: Path, spec: ModelSpec) -> ModelConfig:
    path = Path(folder) / "config.json"
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ModelFolderError(f"cannot read {path}: {exc.strerror}", "check the file's permissions") from exc
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelFolderError(
            f"{path} is not valid JSON ({exc})",
            "download the model again with `pto-patch download`",
        ) from exc
    if not isinstance(data, dict):
        raise ModelFolderError(f"{path} holds no JSON object", "download the model again")
    if data.get("model_type") != spec.model_type:
        raise ModelFolderError(
            f"{path} says model_type {data.get('model_type')!r}, but model '{spec.name}' needs "
            f"{spec.model_type!r}",
            f"point --model-path at a {spec.model_type} checkpoint, or choose another --model",
        )
    return ModelConfig(path=path, raw_bytes=raw, data=data)


def read_download_record(folder: Path) -> dict[str, Any] | None:
    """What `download` recorded in the folder (repo id, commit, ...), or None if nothing readable is there."""
    try:
        record = json.loads((Path(folder) / DOWNLOAD_RECORD).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def check_writable(folder: Path, command: str) -> None:
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ModelFolderError(
            f"{folder} is read-only, and {command} writes into it",
            f"copy the model folder somewhere writable (or get write permission), then run {command} again",
        )
