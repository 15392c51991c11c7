"""libcst codemods that turn transformers' Qwen2.5-VL / Qwen3-VL modeling code into pto-patch's remote code.

`rewrite_modeling` and `rewrite_configuration` run the ordered steps of `gather_codemods` on a
source text and return the new text (line endings kept); any step that cannot find its anchor
raises `AnchorNotFoundError` and nothing is returned. Which guards a source holds is
`pto_patch.model.injections_found` (stdlib `ast`, no libcst).
"""

from __future__ import annotations

import dataclasses
import hashlib

import libcst as cst

from pto_patch.errors import AnchorNotFoundError, SpecError
from pto_patch.patching.codemods.absolute_imports import AbsoluteImports
from pto_patch.patching.codemods.banner import Banner
from pto_patch.patching.codemods.checkpoint_conversion import CheckpointConversion
from pto_patch.patching.codemods.context import Codemod, PatchContext
from pto_patch.patching.codemods.inject_attention_core import InjectAttentionCore
from pto_patch.patching.codemods.inject_attention_prologue import InjectAttentionPrologue
from pto_patch.patching.codemods.inject_mlp_block import InjectMlpBlock
from pto_patch.patching.codemods.inject_mrope import InjectMrope
from pto_patch.patching.codemods.inject_residual_rms_norm import InjectResidualRmsNorm
from pto_patch.patching.codemods.inject_rms_norm import InjectRmsNorm
from pto_patch.patching.codemods.inject_swiglu_mlp import InjectSwigluMlp
from pto_patch.patching.codemods.rename_classes import RenameClasses
from pto_patch.patching.codemods.sub_model_from_config import SubModelFromConfig

__all__ = [
    "PatchContext",
    "gather_codemods",
    "rewrite_configuration",
    "rewrite_modeling",
]

# In the order they run: mlp_block before residual_rms_norm, whose add + norm then sits in mlp_block's else.
INJECTIONS: dict[str, type[Codemod]] = {
    "rms_norm": InjectRmsNorm,
    "mrope": InjectMrope,
    "swiglu_mlp": InjectSwigluMlp,
    "attention_prologue": InjectAttentionPrologue,
    "attention_core": InjectAttentionCore,
    "mlp_block": InjectMlpBlock,
    "residual_rms_norm": InjectResidualRmsNorm,
}


def gather_codemods(ctx: PatchContext, *, configuration: bool = False) -> list[Codemod]:
    """The steps for the modeling file (or, with `configuration`, its configuration file), in order."""
    if configuration:
        return [AbsoluteImports(), RenameClasses(), Banner()]
    return [
        # First: the rest then sees the absolute import of an imported RMSNorm class, as written.
        AbsoluteImports(),
        # Injections look targets up by the release's own class names, before any rename.
        *(codemod() for op, codemod in INJECTIONS.items() if op in ctx.ops),
        # Needs the original class names (to look up transformers' mappings), so before renaming.
        CheckpointConversion(),
        # Names the sub-models' classes as written; the rename after it renames them with the rest.
        SubModelFromConfig(),
        # After everything that finds classes by their original names.
        RenameClasses(),
        # Last: a header nothing else moves.
        Banner(),
    ]


def _sha256(source: str) -> str:
    return hashlib.sha256(source.encode("utf-8")).hexdigest()


def _parse(source: str, ctx: PatchContext, file_name: str) -> cst.Module:
    try:
        return cst.parse_module(source)
    except cst.ParserSyntaxError as exc:
        raise AnchorNotFoundError(
            f"{ctx.where(file_name)} is not valid Python: {exc.message} (line {exc.raw_line})",
            "the source file is damaged; reinstall transformers",
        ) from exc


def _run(source: str, ctx: PatchContext, file_name: str, codemods: list[Codemod]) -> str:
    module = _parse(source, ctx, file_name)
    for codemod in codemods:
        module = codemod.transform(module, ctx, file_name)
    return module.code


def rewrite_modeling(source: str, ctx: PatchContext) -> str:
    """The patched modeling file for `source` (transformers' modeling_qwen2_5_vl.py text)."""
    unknown = [op for op in ctx.ops if op not in INJECTIONS]
    if unknown:
        raise SpecError(f"unknown op(s) {', '.join(unknown)}", f"choose from: {', '.join(INJECTIONS)}")
    ctx = dataclasses.replace(ctx, source_sha256=ctx.source_sha256 or _sha256(source))
    return _run(source, ctx, ctx.spec.modeling_file, gather_codemods(ctx))


def rewrite_configuration(source: str, ctx: PatchContext) -> str:
    """The patched configuration file for `source` (transformers' configuration_qwen2_5_vl.py text)."""
    ctx = dataclasses.replace(ctx, source_sha256=_sha256(source))
    return _run(source, ctx, ctx.spec.configuration_file, gather_codemods(ctx, configuration=True))
