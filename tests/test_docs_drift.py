"""Docs that cannot drift: every command line, exit code and error message the docs quote is real.

Command lines found in SKILL.md, the references and README.md (in code blocks and inline code)
are parsed by the real click command behind the Typer app, without running anything. Exit codes
must be ones pto_patch.errors defines. Error messages quoted in troubleshooting.md must match a
message or hint some PtoPatchError is raised with (placeholders `{...}` match any text).
"""

from __future__ import annotations

import ast
import re
import shlex
from pathlib import Path

import pytest
import typer
import typer.main

from pto_patch import errors
from pto_patch.cli.app import app

try:  # recent typer releases vendor click
    from typer._click import exceptions as click_exceptions
except ImportError:  # pragma: no cover - older typer uses click itself
    from click import exceptions as click_exceptions

REPO = Path(__file__).resolve().parents[1]
SKILL = REPO / "skills" / "pto-patch"
TROUBLESHOOTING = SKILL / "references" / "troubleshooting.md"
DOCS = (
    SKILL / "SKILL.md",
    TROUBLESHOOTING,
    SKILL / "references" / "layout.md",
    SKILL / "references" / "json-schemas.md",
    REPO / "README.md",
    *sorted((REPO / "docs").glob("*.md")),
)
PROG = "pto-patch"
ERROR_CLASSES = {
    name
    for name, value in vars(errors).items()
    if isinstance(value, type) and issubclass(value, errors.PtoPatchError)
}
EXIT_CODES = {value for name, value in vars(errors).items() if name.startswith("EXIT_")}
# Messages and hints kept in module-level constants (e.g. download.OFFLINE_HINT).
HINT_CONSTANT = re.compile(r"_HINT$")
PLACEHOLDER = re.compile(r"\{[^{}]*\}")
SENTINEL = "\x00"
MIN_LITERAL_CHARS = 6

FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)
INLINE = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")
SHELL_BREAKS = {"|", "||", "&&", ";", "&", ">", ">>", "<", "2>", "(", ")"}


# --- command lines ----------------------------------------------------------------------------------


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


DOC_COMMANDS = [
    pytest.param(doc, args, id=f"{doc.name}: pto-patch {' '.join(args)}")
    for doc in DOCS
    if doc.is_file()
    for args in command_lines(doc.read_text(encoding="utf-8"))
]


def test_the_docs_hold_command_lines():
    docs = {doc.name for doc, _ in (param.values for param in DOC_COMMANDS)}
    assert {"SKILL.md", "troubleshooting.md", "README.md"} <= docs
    subcommands = {args[0] for _, args in (param.values for param in DOC_COMMANDS) if args}
    assert {"download", "apply", "status", "verify", "bench", "restore", "skill"} <= subcommands


@pytest.mark.parametrize(("doc", "args"), DOC_COMMANDS)
def test_documented_command_line_parses(doc: Path, args: list[str]):
    problem = rejected(args)
    assert problem is None, f"{doc.name}: `pto-patch {' '.join(args)}` is rejected by the CLI: {problem}"


@pytest.mark.parametrize(
    "line",
    [
        "pto-patch apply --model-dir x",  # renamed option
        "pto-patch verify --use-pto-kernels",
        "pto-patch patch --model-path x",  # unknown command
        "pto-patch skill uninstall",
        "pto-patch bench --batches",  # option without its value
        "pto-patch make-tiny",  # missing argument
    ],
)
def test_the_check_rejects_what_the_cli_rejects(line: str):
    (args,) = command_lines(f"```\n{line}\n```")
    assert rejected(args) is not None


def test_the_check_finds_commands_in_shell_lines_and_inline_code():
    markdown = (
        "Run `pto-patch status --json` first.\n\n```\n"
        "HF_HUB_OFFLINE=1 pto-patch download --output-dir m --json | python x.py  # a comment\n"
        "ruff check . && pto-patch demo > out.json\n```\n"
    )
    assert command_lines(markdown) == [
        ["download", "--output-dir", "m", "--json"],
        ["demo"],
        ["status", "--json"],
    ]


# --- exit codes -------------------------------------------------------------------------------------

EXIT_CODE_MENTION = re.compile(
    r"exit(?:s|ed)?(?:\s+(?:code|status))?\s*(?:is\s+|of\s+|=\s*|:\s*)?`?(\d+)`?|\"exit_code\":\s*(\d+)",
    re.I,
)
TABLE_ROW_CODE = re.compile(r"^\|\s*(\d+)\s*\|", re.M)


def quoted_exit_codes(markdown: str) -> set[int]:
    codes = {int(a or b) for a, b in EXIT_CODE_MENTION.findall(markdown)}
    for section in re.split(r"^#+ ", markdown, flags=re.M):
        heading = section.split("\n", 1)[0].lower()
        if "exit code" in heading:
            codes |= {int(code) for code in TABLE_ROW_CODE.findall(section)}
    return codes


@pytest.mark.parametrize("doc", [doc for doc in DOCS if doc.is_file()], ids=lambda doc: doc.name)
def test_quoted_exit_codes_exist(doc: Path):
    unknown = quoted_exit_codes(doc.read_text(encoding="utf-8")) - EXIT_CODES
    assert not unknown, (
        f"{doc.name} quotes exit code(s) {sorted(unknown)} that pto_patch.errors does not define"
    )


def test_skill_documents_every_exit_code():
    assert quoted_exit_codes((SKILL / "SKILL.md").read_text(encoding="utf-8")) >= EXIT_CODES


def test_the_exit_code_check_catches_a_made_up_code():
    assert 7 in quoted_exit_codes("It exits with exit code 7.") - EXIT_CODES
    assert (
        9 in quoted_exit_codes("## Exit codes\n\n| code | meaning |\n|---|---|\n| 9 | odd |\n") - EXIT_CODES
    )


# --- error messages ----------------------------------------------------------------------------------


def _template(node: ast.expr) -> str | None:
    """The text of a string expression with `{...}` for every computed part."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(
            part.value if isinstance(part, ast.Constant) else "{" + ast.unparse(part.value) + "}"
            for part in node.values
        )
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _template(node.left), _template(node.right)
        return None if left is None or right is None else left + right
    return "{" + ast.unparse(node) + "}"


def code_messages() -> tuple[set[str], set[str]]:
    """(error and hint templates of every PtoPatchError raised, every other string in pto_patch)."""
    raised, other = set(), set()
    for path in sorted((REPO / "pto_patch").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in ERROR_CLASSES
            ):
                arguments = list(node.args[:2]) + [
                    k.value for k in node.keywords if k.arg in ("message", "hint")
                ]
                raised |= {text for text in map(_template, arguments) if text is not None}
            elif isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and HINT_CONSTANT.search(t.id) for t in node.targets
            ):
                raised |= {text for text in [_template(node.value)] if text is not None}
            if isinstance(node, ast.Constant | ast.JoinedStr | ast.BinOp):
                text = _template(node)
                if text is not None:
                    other.add(text)
    return raised, other


def _literal_chars(text: str) -> int:
    return len(PLACEHOLDER.sub("", text).strip())


def matches(quoted: str, templates: set[str]) -> bool:
    """Whether `quoted` (with `{name}` placeholders) is what one of `templates` prints."""
    if _literal_chars(quoted) < MIN_LITERAL_CHARS:
        return False
    text = PLACEHOLDER.sub(SENTINEL, quoted)
    for template in templates:
        if _literal_chars(template) < MIN_LITERAL_CHARS:
            continue  # a bare placeholder would match anything
        pattern = "".join(
            "(.*?)" if PLACEHOLDER.fullmatch(piece) else re.escape(piece)
            for piece in re.split(f"({PLACEHOLDER.pattern})", template)
            if piece
        )
        if re.fullmatch(pattern, text, re.S):
            return True
    return False


QUOTE = re.compile(r"^(error|hint|failed|warning): (.+)$", re.M)


def quoted_messages(markdown: str) -> list[tuple[str, str]]:
    """(kind, text) of every `error:` / `hint:` / `failed:` / `warning:` line in code blocks."""
    return [(kind, text.strip()) for block in FENCE.findall(markdown) for kind, text in QUOTE.findall(block)]


TROUBLESHOOTING_QUOTES = quoted_messages(TROUBLESHOOTING.read_text(encoding="utf-8"))
RAISED, OTHER_STRINGS = code_messages()


def test_troubleshooting_quotes_many_messages():
    kinds = [kind for kind, _ in TROUBLESHOOTING_QUOTES]
    assert kinds.count("error") >= 40 and kinds.count("hint") >= 40 and "failed" in kinds


@pytest.mark.parametrize(
    ("kind", "text"), TROUBLESHOOTING_QUOTES, ids=[t[:60] for _, t in TROUBLESHOOTING_QUOTES]
)
def test_quoted_message_exists_in_the_code(kind: str, text: str):
    # error / hint lines come from a raised PtoPatchError; failed / warning lines from verify's reports.
    templates = RAISED if kind in ("error", "hint") else OTHER_STRINGS
    assert matches(text, templates), f"troubleshooting.md quotes a {kind} the code never prints: {text!r}"


def test_the_message_check_catches_made_up_and_edited_messages():
    assert matches("model folder {folder} (from {origin}) does not exist", RAISED)
    assert not matches("the kernel exploded in {folder}", RAISED)
    assert not matches("model folder {folder} (from {origin}) is missing", RAISED)  # reworded
    assert not matches("{folder}", RAISED)  # no literal text to check
