"""Rewrites done before, so that an apply of an already-seen release skips the codemods.

A rewrite's output depends on nothing but its inputs: the source file's bytes, the spec, the ops,
the release named in the banner, the codemods and templates that do the rewriting, and pto-patch's
version. An entry is keyed by the sha256 of all of them together, so an entry is reused only when
every input is byte-identical, and anything that differs is a different key.

Where: `$PTO_PATCH_CACHE`, else `$XDG_CACHE_HOME/pto-patch`, else `~/.cache/pto-patch` (the
convention huggingface_hub follows for its own cache). `apply --no-cache` neither reads nor writes.

An entry is one file, `rewrites/<key>`: a header line naming the format, the key and the sha256 of
the text after it, then the text. It is written to a temporary file beside it and renamed into
place, so a reader sees a whole entry or none; on reuse the header must name this key and the text
must hash to the recorded sha256, else the entry is ignored with one warning line and the rewrite
runs (and replaces it). The cache is never needed: a cache that cannot be read or written (a full
disk, no permission) costs the rewrite again and one warning line, never the apply.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

from pto_patch import __version__
from pto_patch.resources import templates_dir

CACHE_ENV = "PTO_PATCH_CACHE"
FORMAT = b"pto-patch-rewrite-1"
ENTRIES = "rewrites"
_PATCHING_DIR = Path(__file__).resolve().parent
_MODEL_DIR = _PATCHING_DIR.parent / "model"


def cache_dir() -> Path:
    """The user's pto-patch cache folder (hub conventions: an override, then XDG, then ~/.cache)."""
    explicit = os.environ.get(CACHE_ENV)
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "pto-patch"


def _rewriting_code() -> list[Path]:
    """The files whose content decides what a rewrite writes: the codemods, the guard reader, the spec
    model and the injection templates."""
    files = [*sorted((_PATCHING_DIR / "codemods").glob("*.py")), _MODEL_DIR / "injections_found.py"]
    files += [_MODEL_DIR / "spec.py", _MODEL_DIR / "family.py"]
    files += sorted((templates_dir() / "injections").glob("*.py"))
    return files


def rewrite_key(kind: str, source: bytes, context) -> str:
    """The sha256 naming one rewrite: `kind` (which rewrite), the source bytes, the patch context
    (spec, ops, release, source hash, tool version) and the rewriting code, with pto-patch's version."""
    digest = hashlib.sha256()

    def part(data: bytes) -> None:
        digest.update(len(data).to_bytes(8, "big"))
        digest.update(data)

    part(FORMAT)
    part(__version__.encode())
    part(kind.encode())
    part(source)
    spec = {k: v for k, v in dataclasses.asdict(context.spec).items() if k != "source_path"}
    shaping = {
        "spec": spec,
        "ops": list(context.ops),
        "release": context.release,
        "tool_version": context.tool_version,
        "source_sha256": context.source_sha256,
    }
    part(json.dumps(shaping, sort_keys=True, default=str).encode())
    for path in _rewriting_code():
        part(path.name.encode())
        part(path.read_bytes())
    return digest.hexdigest()


class RewriteCache:
    """The entries under `root`; `warn` takes the one-line warnings."""

    def __init__(self, root: Path, warn: Callable[[str], None]):
        self.root = Path(root)
        self.warn = warn

    def entry_path(self, key: str) -> Path:
        return self.root / ENTRIES / key

    def load(self, key: str) -> str | None:
        """The text stored under `key`, or None (absent, unreadable, damaged or not this key's)."""
        path = self.entry_path(key)
        try:
            data = path.read_bytes()
        except (FileNotFoundError, NotADirectoryError):  # absent (a cache folder that cannot be, on store)
            return None
        except OSError as exc:
            self.warn(f"cannot read the rewrite cache entry {path} ({exc.strerror or exc}); rewriting")
            return None
        header, _, text = data.partition(b"\n")
        fields = header.split(b" ")
        if len(fields) != 3 or fields[0] != FORMAT or fields[1] != key.encode():
            self.warn(f"ignoring {path}: not a pto-patch rewrite cache entry for this rewrite; rewriting")
            return None
        if hashlib.sha256(text).hexdigest().encode() != fields[2]:
            self.warn(f"ignoring the damaged rewrite cache entry {path} (its text does not match its hash)")
            return None
        try:
            return text.decode("utf-8")
        except UnicodeDecodeError:
            self.warn(f"ignoring the damaged rewrite cache entry {path} (not UTF-8 text)")
            return None

    def store(self, key: str, text: str) -> None:
        """Save `text` under `key` atomically; a failure is one warning, never an error."""
        path = self.entry_path(key)
        data = text.encode("utf-8")
        header = b" ".join((FORMAT, key.encode(), hashlib.sha256(data).hexdigest().encode()))
        temporary = None
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, temporary = tempfile.mkstemp(prefix=f".{key}.", suffix=".tmp", dir=path.parent)
            with os.fdopen(fd, "wb") as handle:
                handle.write(header + b"\n" + data)
            os.replace(temporary, path)
        except OSError as exc:
            if temporary is not None:
                Path(temporary).unlink(missing_ok=True)
            self.warn(
                f"could not save the rewrite to the cache in {self.root} ({exc.strerror or exc}); "
                "apply goes on without it"
            )

    def rewritten(self, kind: str, source: bytes, context, rewrite: Callable[[], str], *, save: bool) -> str:
        """The cached rewrite of `source`, else `rewrite()` (saved when `save`)."""
        key = rewrite_key(kind, source, context)
        text = self.load(key)
        if text is None:
            text = rewrite()
            if save:
                self.store(key, text)
        return text
