"""What a run refuses before it loads anything: ops the folder was not patched with.

verify, bench and tune switch on the ops `--ops` names; an op that apply did not patch in has no
guard to reach, so its run could only end in "switched on but never ran" after the whole load and
both modes. The manifest already says what is patched: one line naming it, and the commands that
would add the rest, come first.
"""

from __future__ import annotations

from pathlib import Path

from pto_patch.errors import EXIT_USAGE, PtoPatchError
from pto_patch.model.spec import OPS, ModelSpec, parse_ops
from pto_patch.patching.patch_state import patch_state


def check_ops_patched(ops_text: str | None, spec: ModelSpec, folder: Path) -> None:
    """Refuse `--ops` naming an op the folder was not patched with (`all` means every patched op).
    A folder that is not patched, or half patched, is left to the folder check, which says so."""
    if ops_text is None or ops_text.strip() == "all":
        return
    wanted = parse_ops(ops_text, spec)
    state = patch_state(folder)
    if not state.patched:
        return
    patched = tuple(state.manifest.ops)
    missing = [op for op in wanted if op not in patched]
    if not missing:
        return
    union = ",".join(op for op in OPS if op in patched or op in wanted)
    present = [op for op in wanted if op in patched]
    instead = f", or pass --ops {','.join(present)}" if present else ""
    raise PtoPatchError(
        f"{folder} is patched with {', '.join(patched)} only; --ops {', '.join(missing)} is not patched in",
        f"run `pto-patch restore --model-path {folder}` then "
        f"`pto-patch apply --model-path {folder} --ops {union}`{instead}",
        exit_code=EXIT_USAGE,
    )
