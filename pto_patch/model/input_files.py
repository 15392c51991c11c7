"""Every file pto-patch reads, read within bounds: one place for the rules.

- A file expected to be a regular file must be one: a FIFO, a device, a socket or a link to one is refused
  from its `stat` before anything opens it (opening a FIFO blocks until a writer comes), and what is opened
  is opened with O_NONBLOCK and checked again on the open descriptor (the node may change in between).
- JSON (manifest, config.json, the tokenizer and processor files, specs, truths, saved answers, tuning) is
  read to at most a stated number of bytes and nested at most `MAX_JSON_DEPTH` deep; a RecursionError of the
  parser never escapes.
- A safetensors file is as long as its own header says: a header length past the end of the file, a 0-byte
  shard or a header that is no JSON object are named.

Each problem is an `UnreadableInput` (a ValueError, which the readers already turn into their own one-line
error) saying what is wrong in words a user can act on.
"""

from __future__ import annotations

import json
import os
import stat
import struct
from pathlib import Path
from typing import Any

MAX_JSON_BYTES = 64 * 1024 * 1024  # the largest tokenizer.json of a supported model is ~11 MB
MAX_JSON_DEPTH = 64  # the deepest file any supported checkpoint ships is 6 levels
MAX_SAFETENSORS_HEADER = 100 * 1024 * 1024  # what the safetensors library itself accepts


class UnreadableInput(ValueError):
    """A file the tool reads is not what it must be (not a regular file, too large, too deep, not JSON)."""


def node_kind(info: os.stat_result) -> str | None:
    """What a node that is not a regular file is, in words; None for a regular file."""
    mode = info.st_mode
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def special_file_problem(path: Path) -> str | None:
    """Why `path` (followed through links) is no regular file, or None when it is one or does not exist."""
    try:
        info = os.stat(path)
    except OSError:
        return None  # missing or unreadable: the read says which
    kind = node_kind(info)
    if kind is None:
        return None
    via = " (through a link)" if Path(path).is_symlink() else ""
    return f"{path} is {kind}{via}, not a regular file"


def read_bytes(path: Path, max_bytes: int = MAX_JSON_BYTES) -> bytes:
    """A regular file's bytes, at most `max_bytes` of them. FileNotFoundError and other OSErrors pass
    through; a special file or a file past the limit is an UnreadableInput."""
    problem = special_file_problem(path)
    if problem:
        raise UnreadableInput(problem)
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    try:
        info = os.fstat(fd)
        kind = node_kind(info)
        if kind is not None:
            raise UnreadableInput(f"{path} is {kind}, not a regular file")
        if info.st_size > max_bytes:
            raise UnreadableInput(f"{path} is {info.st_size:,} bytes, more than the {max_bytes:,} allowed")
        with os.fdopen(fd, "rb", closefd=False) as handle:
            data = handle.read(max_bytes + 1)
    finally:
        os.close(fd)
    if len(data) > max_bytes:
        raise UnreadableInput(f"{path} is more than the {max_bytes:,} bytes allowed")
    return data


def json_depth_problem(value: Any, limit: int = MAX_JSON_DEPTH) -> str | None:
    """Whether a parsed value nests deeper than `limit` (walked without recursion)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            if depth > limit:
                return f"nested more than {limit} deep"
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    return None


def parse_json(text: str | bytes, what: str = "the file", max_depth: int = MAX_JSON_DEPTH) -> Any:
    """`json.loads` where every failure is an UnreadableInput naming `what`: bad JSON, bytes that are not
    UTF-8, nesting past `max_depth` (the parser's RecursionError included), an integer too long to convert,
    a NaN or an Infinity (no JSON)."""
    try:
        if isinstance(text, bytes):
            text = text.decode("utf-8-sig")
        value = json.loads(text, parse_constant=_no_constant)
    except RecursionError as exc:
        raise UnreadableInput(f"{what} is nested more than {max_depth} deep") from exc
    except json.JSONDecodeError as exc:
        raise UnreadableInput(f"{what} is not valid JSON ({exc.msg}, line {exc.lineno})") from exc
    except UnicodeDecodeError as exc:
        raise UnreadableInput(f"{what} is not UTF-8 text") from exc
    except ValueError as exc:  # an integer of more digits than Python converts; NaN / Infinity
        raise UnreadableInput(f"{what} is not valid JSON ({exc})") from exc
    problem = json_depth_problem(value, max_depth)
    if problem:
        raise UnreadableInput(f"{what} is {problem}")
    return value


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is no JSON number")


def load_json(path: Path, *, max_bytes: int = MAX_JSON_BYTES, want_object: bool = False) -> Any:
    """The JSON in `path`, read within the bounds above; `want_object`: refuse anything but an object."""
    value = parse_json(read_bytes(path, max_bytes), str(path))
    if want_object and not isinstance(value, dict):
        raise UnreadableInput(f"{path} holds {type(value).__name__}, not a JSON object")
    return value


def safetensors_problem(path: Path) -> str | None:
    """None when `path` is a safetensors file as long as its header says; else what is wrong with it."""
    problem = special_file_problem(path)
    if problem:
        return problem
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as exc:
        return f"{path} cannot be read ({exc.strerror or exc})"
    try:
        with os.fdopen(fd, "rb", closefd=False) as handle:
            size = os.fstat(fd).st_size
            if node_kind(os.fstat(fd)) is not None:
                return f"{path} is not a regular file"
            prefix = handle.read(8)
            if len(prefix) < 8:
                return f"{path} is {size} bytes, shorter than a safetensors header"
            (header_len,) = struct.unpack("<Q", prefix)
            if header_len > min(size - 8, MAX_SAFETENSORS_HEADER):
                return (
                    f"{path}: its header claims {header_len:,} bytes, past the end of the {size:,}-byte file"
                )
            header = parse_json(handle.read(header_len), f"{path}'s safetensors header")
    except UnreadableInput as exc:
        return str(exc)
    except OSError as exc:
        return f"{path} cannot be read ({exc.strerror or exc})"
    finally:
        os.close(fd)
    if not isinstance(header, dict):
        return f"{path}'s safetensors header is no JSON object"
    ends = []
    for key, entry in header.items():
        if key == "__metadata__":
            continue
        offsets = entry.get("data_offsets") if isinstance(entry, dict) else None
        if not (
            isinstance(offsets, list)
            and len(offsets) == 2
            and all(type(o) is int and o >= 0 for o in offsets)
            and offsets[0] <= offsets[1]
        ):
            return f"{path}: tensor {key!r} has no valid data_offsets"
        ends.append(offsets[1])
    expected = 8 + header_len + max(ends, default=0)
    if expected != size:
        return f"{path} is {size:,} bytes, its header describes {expected:,}"
    return None


# --- a model folder, before it loads ---------------------------------------------------------------

# The sizes a config sets, each with the largest value accepted: a model far past them cannot be one this
# tool patches, and building it would only run out of memory first.
CONFIG_SIZE_LIMITS = {
    "num_hidden_layers": 1024,
    "hidden_size": 65536,
    "intermediate_size": 1 << 20,
    "num_attention_heads": 1024,
    "num_key_value_heads": 1024,
    "vocab_size": 1 << 22,
    "max_position_embeddings": 1 << 24,
}
# What a JSON file of a checkpoint must hold at its top level, beyond being an object.
REQUIRED_OBJECTS = {"tokenizer.json": ("model",)}


def config_size_problem(config: dict[str, Any], name: str = "config.json") -> str | None:
    """A size of the config (or of its text_config / vision_config) that is no positive integer within
    its limit."""
    sections = [(name, config)] + [
        (f"{name} {key}", config[key])
        for key in ("text_config", "vision_config")
        if isinstance(config.get(key), dict)
    ]
    for where, section in sections:
        for key, limit in CONFIG_SIZE_LIMITS.items():
            if key not in section:
                continue
            value = section[key]
            if type(value) is not int or not 0 < value <= limit:
                return f"{where} sets {key} to {value!r}: a positive whole number up to {limit:,} is expected"
    return None


def model_folder_problem(folder: Path) -> str | None:
    """What in the model folder would break the load in a way the user cannot read: a special file where
    a file is expected, a JSON file too large, too deep or of the wrong shape, a config size past its
    limit, a safetensors file whose header and size disagree. None when every file is fit to load."""
    folder = Path(folder)
    try:
        entries = sorted(folder.iterdir())
    except OSError:
        return None  # the folder check says why
    for path in entries:
        if path.name.startswith(".") or (path.is_dir() and not path.is_symlink()):
            continue
        problem = special_file_problem(path)
        if problem and not path.is_dir():
            return problem
        if path.suffix == ".json" and path.exists():
            try:
                data = load_json(path, want_object=True)
            except UnreadableInput as exc:
                return str(exc)
            except OSError as exc:
                return f"{path} cannot be read ({exc.strerror or exc})"
            for key in REQUIRED_OBJECTS.get(path.name, ()):
                if not isinstance(data.get(key), dict):
                    return f"{path} has no {key!r} object, so it is no tokenizer file"
            if path.name == "config.json":
                problem = config_size_problem(data)
                if problem:
                    return problem
        elif path.suffix == ".safetensors" and path.exists():
            problem = safetensors_problem(path)
            if problem:
                return problem
    return None
