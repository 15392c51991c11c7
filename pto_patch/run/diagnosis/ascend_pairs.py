"""Which torch each published torch_npu release runs with, and which CANN releases Ascend lists for it.

On an Ascend host torch is not the user's choice: each torch_npu release requires one exact torch
(its setup.py pins `torch==X.Y.Z`; torch-npu 2.13.0's wheel metadata says `torch==2.13.0.*`), and
each pairs with CANN releases installed system-wide. pto-patch therefore installs no torch_npu of its
own (no `ascend` extra): the user installs the torch_npu that their CANN supports, and `doctor` says
whether the torch / torch_npu pair it finds is one that torch_npu publishes.

Sources (read 2026-12-03):
- PUBLISHED: the torch-npu releases on PyPI (`pip index versions torch-npu`); each one's torch is the
  release its version starts with (`2.9.0.post2` -> torch 2.9.0), as its setup.py / wheel metadata pin.
- CANN: Ascend/pytorch `COMPATIBILITY.md` (master, commit bcfb2c8e, 2026-08-10; read 2026-12-06), its
  "TorchNPU 版本配套表" (the active releases) and the history table under it, the rows of releases PyPI
  publishes: e.g. 2.12.0, 2.11.0, 2.10.0.post4, 2.9.0.post6 and 2.7.1.post8 -> CANN 9.1.0; 2.9.0.post2,
  2.8.0.post4 and 2.7.1.post4 -> 9.0.0; 2.9.0 and 2.6.0.post5 -> 8.5.0. Releases that file does not list
  (2.13.0 and 2.14.0 among them: its SUPPORT.md has 2.14.0 as planned, unpublished) have no CANN entry here
  (None), not a guess.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

PUBLISHED: tuple[str, ...] = (
    "2.1.0.post8", "2.1.0.post10", "2.1.0.post12", "2.1.0.post13", "2.1.0.post17",
    "2.3.1.post2", "2.3.1.post4", "2.3.1.post6",
    "2.4.0", "2.4.0.post2", "2.4.0.post4",
    "2.5.1", "2.5.1.post1",
    "2.6.0", "2.6.0.post3", "2.6.0.post5",
    "2.7.1", "2.7.1.post2", "2.7.1.post4", "2.7.1.post6", "2.7.1.post8", "2.7.1.post10", "2.7.1.post11",
    "2.8.0", "2.8.0.post2", "2.8.0.post4", "2.8.0.post5",
    "2.9.0", "2.9.0.post2", "2.9.0.post4", "2.9.0.post6", "2.9.0.post8", "2.9.0.post9", "2.9.1",
    "2.10.0", "2.10.0.post2", "2.10.0.post4", "2.10.0.post6", "2.10.0.post7",
    "2.11.0", "2.11.0.post2", "2.11.0.post3",
    "2.12.0", "2.12.0.post2", "2.12.0.post3",
    "2.13.0",
    "2.14.0",
)  # fmt: skip
CANN: dict[str, str] = {
    "2.12.0": "9.1.0", "2.11.0": "9.1.0", "2.10.0.post4": "9.1.0", "2.9.0.post6": "9.1.0", "2.7.1.post8": "9.1.0",
    "2.9.0.post2": "9.0.0", "2.8.0.post4": "9.0.0", "2.7.1.post4": "9.0.0",
    "2.9.0": "8.5.0", "2.8.0.post2": "8.5.0", "2.7.1.post2": "8.5.0", "2.6.0.post5": "8.5.0",
    "2.8.0": "8.3.RC1", "2.7.1": "8.3.RC1", "2.6.0.post3": "8.3.RC1", "2.1.0.post17": "8.3.RC1",
    "2.6.0": "8.2.RC1", "2.5.1.post1": "8.2.RC1", "2.1.0.post13": "8.2.RC1",
    "2.5.1": "8.1.RC1", "2.4.0.post4": "8.1.RC1", "2.3.1.post6": "8.1.RC1", "2.1.0.post12": "8.1.RC1",
    "2.4.0.post2": "8.0.0", "2.3.1.post4": "8.0.0", "2.1.0.post10": "8.0.0",
    "2.4.0": "8.0.RC3", "2.3.1.post2": "8.0.RC3", "2.1.0.post8": "8.0.RC3",  # the history table
}  # fmt: skip


def _base(release: str) -> str | None:
    """'2.9.0.post2' -> '2.9.0'; '2.9.0+cpu' -> '2.9.0'; None where it is no release number."""
    match = re.match(r"(\d+)\.(\d+)\.(\d+)", release or "")
    return ".".join(match.groups()) if match else None


def torch_for(torch_npu: str) -> str | None:
    """The torch release `torch_npu` requires (None when no such torch_npu is published)."""
    return _base(torch_npu) if torch_npu in PUBLISHED else None


def torch_npu_for(torch: str) -> list[str]:
    """The published torch_npu releases for `torch`, oldest first."""
    return [release for release in PUBLISHED if _base(release) == _base(torch)]


@dataclass(frozen=True)
class Pairing:
    status: str  # "published", "mismatch", "unknown torch_npu", "no torch_npu"
    line: str
    hint: str | None
    cann_listed: str | None  # the CANN release Ascend lists for this torch_npu, where its table does

    @property
    def ok(self) -> bool:
        return self.status in ("published", "no torch_npu")

    def to_json(self) -> dict:
        return {"status": self.status, "line": self.line, "hint": self.hint, "cann_listed": self.cann_listed}


def check_pair(torch: str | None, torch_npu: str | None, cann: str | None = None) -> Pairing:
    """Whether `torch` with `torch_npu` is a pair torch_npu publishes, in one line, with a hint when not."""
    if not torch_npu:
        return Pairing("no torch_npu", "torch_npu is not installed: no NPU pairing to check", None, None)
    if torch_npu not in PUBLISHED:
        choices = torch_npu_for(torch or "")
        return Pairing(
            "unknown torch_npu",
            f"torch_npu {torch_npu} is not a release pto-patch's table lists ({len(PUBLISHED)} releases, "
            f"2.1.0.post8 to {PUBLISHED[-1]})",
            f"for torch {torch} install one of torch_npu {', '.join(choices)}"
            if choices
            else "install a published torch_npu and the torch it requires",
            None,
        )
    wanted = torch_for(torch_npu)
    listed = CANN.get(torch_npu)
    cann_note = f"; Ascend lists CANN {listed} for it" if listed else ""
    found_cann = f", CANN {cann}" if cann else ", no CANN found"
    if _base(torch) != wanted:
        choices = torch_npu_for(torch or "")
        hint = f"install torch=={wanted} (torch_npu {torch_npu} requires it)"
        if choices:
            hint += f", or torch_npu {choices[-1]} for torch {torch}, if your CANN supports it"
        return Pairing(
            "mismatch",
            f"torch {torch} with torch_npu {torch_npu}{found_cann}: not a published pair "
            f"(torch_npu {torch_npu} requires torch {wanted}){cann_note}",
            hint,
            listed,
        )
    return Pairing(
        "published",
        f"torch {torch} with torch_npu {torch_npu}{found_cann}: a published pair{cann_note}",
        None,
        listed,
    )
