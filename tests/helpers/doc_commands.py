"""The pto-patch command lines docs quote (fenced blocks and inline code), and whether the CLI parses them."""

from __future__ import annotations

import re
import shlex

import typer
import typer.main

from pto_patch.cli.app import app

try:  # recent typer releases vendor click
    from typer._click import exceptions as click_exceptions
except ImportError:  # pragma: no cover - older typer uses click itself
    from click import exceptions as click_exceptions

PROG = "pto-patch"
FENCE = re.compile(r"^[ \t]*```[^\n]*\n(.*?)^[ \t]*```", re.S | re.M)  # indented: a block in a list item
INLINE = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")
SHELL_BREAKS = {"|", "||", "&&", ";", "&", ">", ">>", "<", "2>", "(", ")"}


def code_texts(markdown: str) -> list[str]:
    """The text of every fenced block, then every inline code span (also those quoted inside blocks)."""
    blocks = FENCE.findall(markdown)
    prose = FENCE.sub("", markdown)
    return blocks + INLINE.findall(prose) + [span for block in blocks for span in INLINE.findall(block)]


def command_lines(markdown: str) -> list[list[str]]:
    """Argument lists (after `pto-patch`) of every pto-patch invocation in the code of `markdown`."""
    found = []
    for text in code_texts(markdown):
        for line in text.replace("\\\n", " ").splitlines():
            if PROG not in line:
                continue
            lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
            lexer.whitespace_split = True
            lexer.commenters = "#"
            try:
                tokens = list(lexer)
            except ValueError:
                continue
            found += _invocations(tokens)
    return found


def _invocations(tokens: list[str]) -> list[list[str]]:
    """Split a shell line at pipes, `&&`, `;` and redirections; keep the segments that run pto-patch."""
    segments, current = [], []
    for token in tokens:
        if token in SHELL_BREAKS or set(token) <= set("|&;<>()"):
            segments.append(current)
            current = []
        else:
            current.append(token)
    segments.append(current)
    result = []
    for segment in segments:
        while segment and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", segment[0]):
            segment = segment[1:]  # environment assignments before the command
        if segment and segment[0] == PROG:
            args = [token.strip("[]") for token in segment[1:]]  # `[--force]` documents an option
            result.append([arg for arg in args if arg])
    return result


def parse_command_line(args: list[str]) -> None:
    """Parse `args` the way `pto-patch` would, down to the leaf command; run nothing.

    Raises a click UsageError (NoSuchOption, BadParameter, ...) for anything the CLI rejects.
    """
    command = typer.main.get_command(app)
    ctx = command.make_context(PROG, list(args), resilient_parsing=False)
    while hasattr(command, "resolve_command"):
        rest = [*(getattr(ctx, "_protected_args", None) or getattr(ctx, "protected_args", [])), *ctx.args]
        if not rest:
            break
        name, command, rest = command.resolve_command(ctx, rest)
        ctx = command.make_context(name, rest, parent=ctx, resilient_parsing=False)


def rejected(args: list[str]) -> str | None:
    """None when the CLI accepts `args`; otherwise its message."""
    try:
        parse_command_line(args)
    except typer.Exit as exc:  # --help / --version stop parsing, successfully
        return None if exc.exit_code == 0 else f"exit {exc.exit_code}"
    except click_exceptions.ClickException as exc:
        return exc.format_message()
    return None
