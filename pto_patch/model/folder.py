"""Find the model folder and read its config.json, validated, with errors that say what and where."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pto_patch.errors import EXIT_USAGE, ModelFolderError, UsageError
from pto_patch.model import hub_cache, input_files
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
            input_files.special_file_problem(config) or f"{config} is not a file",
            "point --model-path at a model folder whose config.json is a file",
            exit_code=EXIT_USAGE,
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
        raw = input_files.read_bytes(path)
    except input_files.UnreadableInput as exc:
        raise ModelFolderError(
            str(exc), "put the checkpoint's config.json back (`pto-patch download`)"
        ) from exc
    except OSError as exc:
        raise ModelFolderError(f"cannot read {path}: {exc.strerror}", "check the file's permissions") from exc
    try:
        data = input_files.parse_json(raw, str(path))
    except input_files.UnreadableInput as exc:
        raise ModelFolderError(
            str(exc), "download the model again with `pto-patch download`", exit_code=EXIT_USAGE
        ) from exc
    if not isinstance(data, dict):
        raise ModelFolderError(f"{path} holds no JSON object", "download the model again")
    problem = input_files.config_size_problem(data, str(path))
    if problem:
        raise ModelFolderError(problem, f"fix {path}, or download the model again", exit_code=EXIT_USAGE)
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
        record = input_files.load_json(Path(folder) / DOWNLOAD_RECORD)
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def check_model_inputs(folder: Path) -> None:
    """Every file of the folder a load reads, fit to be read (`input_files.model_folder_problem`)."""
    problem = input_files.model_folder_problem(folder)
    if problem:
        raise ModelFolderError(
            problem, "replace the file with the checkpoint's own (`pto-patch download`)", exit_code=EXIT_USAGE
        )


def check_folder_auto_map(folder: Path, spec: ModelSpec) -> None:
    """Refuse a config.json whose auto_map reaches outside the folder (model/spec_data), before the load
    imports the classes it names (`trust_remote_code`)."""
    from pto_patch.model.spec_data import folder_auto_map_problem

    path = Path(folder) / "config.json"
    if not path.is_file():
        return  # the folder check says so
    modules = [spec.modeling_file.removesuffix(".py"), spec.configuration_file.removesuffix(".py")]
    problem = folder_auto_map_problem(input_files.load_json(path), modules)
    if problem:
        raise ModelFolderError(
            f"{folder}: {problem}",
            "the config.json apply writes names the folder's own modules only: "
            f"run `pto-patch restore --model-path {folder}`, then apply again",
            exit_code=EXIT_USAGE,
        )


def check_writable(folder: Path, command: str) -> None:
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ModelFolderError(
            f"{folder} is read-only, and {command} writes into it",
            f"copy the model folder somewhere writable (or get write permission), then run {command} again",
        )


def max_positions(folder: Path) -> int | None:
    """The model's max_position_embeddings (its text_config's first), or None where it sets none."""
    path = Path(folder) / "config.json"
    try:
        config = input_files.load_json(path, want_object=True)
    except (input_files.UnreadableInput, OSError):
        return None  # the folder check says why
    for section in (config.get("text_config"), config):
        if isinstance(section, dict) and type(section.get("max_position_embeddings")) is int:
            return section["max_position_embeddings"]
    return None


def check_output_length(output_length: int, folder: Path) -> None:
    limit = max_positions(folder)
    if limit is not None and output_length > limit:
        raise UsageError(
            f"--output_length {output_length:,} is past the model's max_position_embeddings {limit:,}: "
            "the cache holds the prompt and every new token",
            f"pass --output_length {min(limit, 1024)} or less",
        )
