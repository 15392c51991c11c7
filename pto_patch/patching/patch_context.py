"""What every rewrite is told about the patch it is part of (a plain dataclass: no libcst, so the
engine can key the rewrite cache without importing the codemods)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pto_patch import __version__
from pto_patch.model.spec import OPS, ModelSpec


@dataclass(frozen=True)
class PatchContext:
    """One patch: the model spec, the ops to inject, and where the source came from.

    `release` is the transformers release the source file belongs to (for messages and the banner).
    `source_sha256` is the modeling source's sha256 as the engine read it; when None, the banner
    hashes the text it was given.
    """

    spec: ModelSpec
    ops: tuple[str, ...] = OPS
    release: str = "unknown"
    tool_version: str = __version__
    source_sha256: str | None = None
    source_folder: Path | None = None  # set when the file is the model folder's own, not transformers'

    def where(self, file_name: str) -> str:
        if self.source_folder is not None:
            return f"{file_name} in {self.source_folder}"
        return f"{file_name} of transformers {self.release}"
