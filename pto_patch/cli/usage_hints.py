"""A hint for the command-line mistakes click reports bare, and the command an error document names.

click says what is wrong with a command line ("Got unexpected extra argument(s) (./tiny)", "No such
option: --use_pto (Possible options: --use_compile)") and suggests by spelling alone. The mistakes a
first session makes have a better answer: a folder given where `--model-path` was meant, a flag of
another command.
"""

from __future__ import annotations

from typing import Any

# Options that belong to one command and are tried on another: (option, commands) -> the hint.
OTHER_COMMANDS_OPTIONS = {
    ("--use_pto", ("bench", "tune")): "{command} always runs the kernels off and on: drop --use_pto",
    ("--use-pto", ("bench", "tune")): "{command} always runs the kernels off and on: drop --use-pto",
    (
        "--baseline-only",
        ("bench", "tune"),
    ): "{command} compares by design; `pto-patch verify --baseline-only` runs the baseline alone",
    ("--report-file", ("bench",)): "bench writes its reports into --output-dir",
    ("--output-dir", ("verify",)): "verify writes its report to --report-file FILE",
    ("--batch", ("bench", "tune")): "{command} takes a list of batch sizes: --batches 1,4,8",
    ("--batches", ("verify",)): "verify runs one batch size: --batch N",
}
GROUPS = ("skill",)


def command_of(args: list[str]) -> str | None:
    """The command a command line runs (`apply`, `skill install`), or None before one is named."""
    words = [arg for arg in args if not arg.startswith("-")]
    if not words:
        return None
    if words[0] in GROUPS and len(words) > 1:
        return f"{words[0]} {words[1]}"
    return words[0]


def usage_hint(exc: Any, args: list[str]) -> str | None:
    """A hint for a click usage error, where a first mistake has a better one than click's."""
    command = command_of(args)
    message = exc.format_message() if hasattr(exc, "format_message") else str(exc)
    option = getattr(exc, "option_name", None)
    if option is not None:
        for (name, commands), hint in OTHER_COMMANDS_OPTIONS.items():
            if option == name and command in commands:
                return hint.format(command=command)
    if message.startswith("Got unexpected extra argument") and command not in (None, "make-tiny"):
        extra = message.rsplit("(", 1)[-1].rstrip(")").split()[0] if "(" in message else "DIR"
        return (
            f"pto-patch {command} takes no folder argument: pass the model folder as --model-path {extra} "
            "(make-tiny is the command that takes one)"
        )
    return None
