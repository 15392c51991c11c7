"""One spelling of each option in `--help`.

An option of several spellings (the reference run script's `--output_length` beside `--output-length`,
`--model-path` beside `--model_path`) is listed by its first; the others still parse, and a usage error
still names the one typed. Which spelling is first is the option's declaration (`cli/options.py`,
`cli/commands/`).
"""

from __future__ import annotations

from functools import partial
from typing import Any


def _first_spelling_record(param: Any, help_record: Any, ctx: Any) -> Any:
    spellings = param.opts
    param.opts = spellings[:1]
    try:
        return help_record(ctx)
    finally:
        param.opts = spellings


def list_first_spelling(command: Any) -> Any:
    """`command` with each of its options of several spellings listed in its help by the first (once)."""
    for param in getattr(command, "params", ()):
        if len(param.opts) > 1 and not isinstance(param.get_help_record, partial):
            param.get_help_record = partial(_first_spelling_record, param, param.get_help_record)
    return command
