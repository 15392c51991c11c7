"""Limits and order: every option value a run's work depends on, checked against a stated limit before the
model loads (issue 51, item 6).

- `--atol` and `--rtol` are finite and not negative (a NaN tolerance passes nothing and prints a NaN that is
  not JSON; an infinite one passes everything);
- `--mode` is a torch.compile mode this torch knows (else torch refuses it only after the load), and `--mode`
  or `--cache static` without `--use_compile` or `--use_acl_graph` is refused, never silently ignored (an
  eager run has neither);
- `--output_length` is at most the model's `max_position_embeddings` (config.json, its text_config first):
  the cache a run fills holds the prompt and every new token, so a longer run can never be what the model
  was built for, and one of 1e9 tokens would only run until memory ran out.
Each a usage error (exit 2) in one line with a hint.
"""

from __future__ import annotations

import math
from typing import Any

from pto_patch.errors import UsageError


def check_tolerances(options: Any) -> None:
    for flag, name in (("--atol", "atol"), ("--rtol", "rtol")):
        value = getattr(options, name, None)
        if value is not None and not (math.isfinite(value) and value >= 0):
            raise UsageError(
                f"{flag} must be a finite number, 0 or more, got {value}",
                f"pass {flag} 0.05, say, or leave it out for the dtype's default",
            )


def compile_modes() -> tuple[str, ...]:
    """The modes this torch's torch.compile takes (torch._inductor.list_mode_options)."""
    from torch._inductor import list_mode_options

    return tuple(list_mode_options())


def check_compile_values(options: Any) -> None:
    compiled = options.use_compile or options.use_acl_graph
    if options.compile_mode is not None and not compiled:
        raise UsageError(
            f"--mode {options.compile_mode} changes a compiled run only, and this run is not compiled",
            "add --use_compile, or drop --mode",
        )
    if options.cache == "static" and not compiled:
        raise UsageError(
            "--cache static is the cache of a compiled run; this run is eager and would ignore it",
            "add --use_compile (or --use_acl_graph), or drop --cache",
        )
    if options.compile_mode is not None and options.compile_mode not in compile_modes():
        raise UsageError(
            f"--mode '{options.compile_mode}' is not a torch.compile mode",
            f"choose from: {', '.join(compile_modes())}",
        )
