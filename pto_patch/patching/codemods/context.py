"""What every codemod is told about the patch it is part of, and what a codemod is."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from pto_patch.patching.patch_context import PatchContext

if TYPE_CHECKING:
    import libcst as cst

__all__ = ["Codemod", "PatchContext"]


class Codemod(Protocol):
    """One rewrite step: `transform` returns the rewritten module or raises a PtoPatchError."""

    def transform(self, module: cst.Module, ctx: PatchContext, file_name: str) -> cst.Module: ...
