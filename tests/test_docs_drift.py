"""Docs that cannot drift: every command line, exit code, error message and link the docs quote is real.

The docs are SKILL.md, its references, README.md and every page in docs/ (found by glob, so a page
added later is checked without a change here). Command lines in them (in code blocks and inline
code) are parsed by the real click command behind the Typer app, without running anything. Exit
codes must be ones pto_patch.errors defines. Error messages quoted in code blocks must match a
message or hint some PtoPatchError is raised with (placeholders `{...}` match any text). A relative
link must lead to a file that exists, and its `#anchor` to a heading there; every docs/ page is
linked from the README.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from pto_patch import errors
from tests.helpers.doc_commands import (
    FENCE,
    command_lines,
    rejected,
)

REPO = Path(__file__).resolve().parents[1]
SKILL = REPO / "skills" / "pto-patch"
TROUBLESHOOTING = SKILL / "references" / "troubleshooting.md"
README = REPO / "README.md"
DOCS_DIR = REPO / "docs"
DOCS = (
    SKILL / "SKILL.md",
    TROUBLESHOOTING,
    SKILL / "references" / "layout.md",
    SKILL / "references" / "json-schemas.md",
    README,
    *sorted(DOCS_DIR.glob("*.md")),
)
README_MAX_LINES = 250
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


# --- command lines ----------------------------------------------------------------------------------


def doc_id(doc: Path) -> str:
    return doc.relative_to(REPO).as_posix()


DOC_COMMANDS = [
    pytest.param(doc, args, id=f"{doc_id(doc)}: pto-patch {' '.join(args)}")
    for doc in DOCS
    if doc.is_file()
    for args in command_lines(doc.read_text(encoding="utf-8"))
]


def test_the_docs_hold_command_lines():
    docs = {doc for doc, _ in (param.values for param in DOC_COMMANDS)}
    assert {SKILL / "SKILL.md", TROUBLESHOOTING, README} <= docs
    assert any(doc.parent == DOCS_DIR for doc in docs), "no page in docs/ quotes a command line"
    subcommands = {args[0] for _, args in (param.values for param in DOC_COMMANDS) if args}
    assert {"download", "apply", "status", "verify", "bench", "restore", "skill"} <= subcommands


@pytest.mark.parametrize(("doc", "args"), DOC_COMMANDS)
def test_documented_command_line_parses(doc: Path, args: list[str]):
    problem = rejected(args)
    assert problem is None, f"{doc_id(doc)}: `pto-patch {' '.join(args)}` is rejected by the CLI: {problem}"


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
        "ruff check . && pto-patch demo > out.json\n```\n\n"
        "1. In a list:\n\n   ```\n   pto-patch restore --model-path m\n   ```\n"
    )
    assert command_lines(markdown) == [
        ["download", "--output-dir", "m", "--json"],
        ["demo"],
        ["restore", "--model-path", "m"],
        ["status", "--json"],
    ]
    assert quoted_messages("- a list item:\n\n  ```\n  error: the kernel exploded\n  ```\n") == [
        ("error", "the kernel exploded")
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


@pytest.mark.parametrize("doc", [doc for doc in DOCS if doc.is_file()], ids=doc_id)
def test_quoted_exit_codes_exist(doc: Path):
    unknown = quoted_exit_codes(doc.read_text(encoding="utf-8")) - EXIT_CODES
    assert not unknown, (
        f"{doc_id(doc)} quotes exit code(s) {sorted(unknown)} that pto_patch.errors does not define"
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


QUOTE = re.compile(r"^[ \t]*(error|hint|failed|warning): (.+)$", re.M)


def quoted_messages(markdown: str) -> list[tuple[str, str]]:
    """(kind, text) of every `error:` / `hint:` / `failed:` / `warning:` line in code blocks."""
    return [(kind, text.strip()) for block in FENCE.findall(markdown) for kind, text in QUOTE.findall(block)]


TROUBLESHOOTING_QUOTES = quoted_messages(TROUBLESHOOTING.read_text(encoding="utf-8"))
DOC_QUOTES = [
    pytest.param(doc, kind, text, id=f"{doc_id(doc)}: {text[:60]}")
    for doc in DOCS
    if doc.is_file()
    for kind, text in quoted_messages(doc.read_text(encoding="utf-8"))
]
RAISED, OTHER_STRINGS = code_messages()


def test_troubleshooting_quotes_many_messages():
    kinds = [kind for kind, _ in TROUBLESHOOTING_QUOTES]
    assert kinds.count("error") >= 40 and kinds.count("hint") >= 40 and "failed" in kinds


@pytest.mark.parametrize(("doc", "kind", "text"), DOC_QUOTES)
def test_quoted_message_exists_in_the_code(doc: Path, kind: str, text: str):
    # error / hint lines come from a raised PtoPatchError; failed / warning lines from verify's reports.
    templates = RAISED if kind in ("error", "hint") else OTHER_STRINGS
    assert matches(text, templates), f"{doc_id(doc)} quotes a {kind} the code never prints: {text!r}"


def test_the_message_check_catches_made_up_and_edited_messages():
    assert matches("model folder {folder} (from {origin}) does not exist", RAISED)
    assert not matches("the kernel exploded in {folder}", RAISED)
    assert not matches("model folder {folder} (from {origin}) is missing", RAISED)  # reworded
    assert not matches("{folder}", RAISED)  # no literal text to check


# --- links between pages ------------------------------------------------------------------------------

LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_LINK = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$", re.M)
EXTERNAL = re.compile(r"^[a-z][a-z0-9+.-]*:", re.I)  # https:, mailto:, ...
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.M)
HTML_ANCHOR = re.compile(r"<[^>]+\b(?:id|name)=\"([^\"]+)\"", re.I)
INLINE_CODE = re.compile(r"`+[^`\n]*`+")


def _prose(markdown: str) -> str:
    """`markdown` without fenced blocks and inline code, where a `[x](y)` is no link."""
    return INLINE_CODE.sub("", FENCE.sub("", markdown))


def link_targets(markdown: str) -> list[str]:
    """Every relative link target of `markdown` (inline and reference-style), external ones left out."""
    prose = _prose(markdown)
    targets = LINK.findall(prose) + REFERENCE_LINK.findall(prose)
    return [target for target in targets if not EXTERNAL.match(target)]


def heading_slug(heading: str) -> str:
    """The anchor GitHub gives a heading: link text kept, lower case, punctuation gone, spaces to `-`."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(markdown: str) -> set[str]:
    """The `#anchors` a page offers: one per heading (repeats get `-1`, `-2`, ...), and HTML ids."""
    found, seen = set(HTML_ANCHOR.findall(markdown)), {}
    for heading in HEADING.findall(FENCE.sub("", markdown)):
        slug = heading_slug(heading)
        found.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
        seen[slug] = seen.get(slug, 0) + 1
    return found


def dead_links(doc: Path, markdown: str) -> list[str]:
    """The links of `markdown` (the text of `doc`) that lead to no file, or to no heading in it."""
    dead = []
    for target in link_targets(markdown):
        path, _, anchor = target.partition("#")
        page = (doc.parent / path).resolve() if path else doc
        if path and not page.exists():
            dead.append(f"{target} (no such file)")
        elif anchor and page.suffix == ".md":
            text = page.read_text(encoding="utf-8") if path else markdown
            if anchor.lower() not in anchors(text):
                dead.append(f"{target} (no heading #{anchor} in {page.name})")
    return dead


LINKED_DOCS = [doc for doc in DOCS if doc.is_file()]


@pytest.mark.parametrize("doc", LINKED_DOCS, ids=doc_id)
def test_links_lead_to_pages_and_headings_that_exist(doc: Path):
    dead = dead_links(doc, doc.read_text(encoding="utf-8"))
    assert not dead, f"{doc_id(doc)} links to what is not there: {dead}"


def test_the_link_check_catches_dead_links_and_skips_code(tmp_path: Path):
    (tmp_path / "docs").mkdir()
    page = tmp_path / "docs" / "page.md"
    page.write_text("# A page\n\n## Undo, and never lose a byte\n\n## Undo, and never lose a byte\n")
    readme = tmp_path / "README.md"
    markdown = (
        "See [the page](docs/page.md), [its heading](docs/page.md#undo-and-never-lose-a-byte),\n"
        "[the repeat](docs/page.md#undo-and-never-lose-a-byte-1), [here](#top) and "
        "[the hub](https://huggingface.co).\n"
        "[gone]: docs/gone.md\n\n"
        "A [moved page](docs/moved.md) and [a lost heading](docs/page.md#undo) and "
        "[a third repeat](docs/page.md#undo-and-never-lose-a-byte-2).\n\n"
        "`[not a link](docs/nowhere.md)`\n\n```\n[nor this](docs/nowhere.md)\n```\n"
        '<a id="top"></a>\n'
    )
    assert dead_links(readme, markdown) == [
        "docs/moved.md (no such file)",
        "docs/page.md#undo (no heading #undo in page.md)",
        "docs/page.md#undo-and-never-lose-a-byte-2 (no heading #undo-and-never-lose-a-byte-2 in page.md)",
        "docs/gone.md (no such file)",
    ]


def test_heading_slugs_are_githubs():
    assert heading_slug("Proving it: `verify`, `bench`, `demo`") == "proving-it-verify-bench-demo"
    assert (
        heading_slug("The kernel package (`kernels/pto_kernels/`)") == "the-kernel-package-kernelspto_kernels"
    )
    assert (
        heading_slug("Read-only model stores: `apply --overlay`") == "read-only-model-stores-apply---overlay"
    )


# --- the front page -----------------------------------------------------------------------------------

DOC_PAGES = sorted(DOCS_DIR.glob("*.md"))


def test_the_readme_is_a_front_page():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, (
        f"README.md has {len(lines)} lines, more than {README_MAX_LINES}: move the depth into a docs/ page"
    )
    assert len(DOC_PAGES) >= 4


NUMBER_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten")


def opening_miscounts(opening: str, ops: tuple[str, ...], defaults: tuple[str, ...]) -> list[str]:
    """What the README's opening paragraph says wrong of the ops apply patches: each op that is not on by
    default (a block) named, the default ops counted, all of them counted."""
    wrong = [f"{op} is not named" for op in ops if op not in defaults and f"`{op}`" not in opening]
    for count, what in ((len(defaults), "on by default"), (len(ops), "in all")):
        if not re.search(rf"\b{NUMBER_WORDS[count]}\b", opening):
            wrong.append(f"it does not say {NUMBER_WORDS[count]} ({what})")
    return wrong


def test_the_readme_opening_counts_the_ops_apply_patches():
    from pto_patch.model.spec import default_run_ops, load_spec

    opening = README.read_text(encoding="utf-8").split("\n\n")[1]
    ops = tuple(load_spec("gutenocr_3b").injections)
    defaults = default_run_ops(ops)
    assert opening_miscounts(opening, ops, defaults) == []
    said_three = "dispatches three hot small ops (RMSNorm, MRoPE and the SwiGLU MLP) to PyPTO kernels"
    assert opening_miscounts(said_three, ops, defaults)  # the opening it had, before the blocks


def linked_pages(doc: Path) -> set[Path]:
    """The files `doc` links to (anchors dropped)."""
    found = set()
    for target in link_targets(doc.read_text(encoding="utf-8")):
        path = target.partition("#")[0]
        if path:
            found.add((doc.parent / path).resolve())
    return found


def opening_problem(markdown: str) -> str | None:
    """None when a page opens with a `# title` and then a sentence of prose; else what is wrong."""
    lines = markdown.splitlines()
    if not lines or not re.fullmatch(r"# \S.*", lines[0]):
        return "it does not start with a `# title`"
    first = next((line for line in lines[1:] if line.strip()), "")
    if not first or re.match(r"#|```|\||<|[-*+] ", first):  # a heading, code, a table, HTML, a list
        return "say in a sentence under the title what a reader comes to this page for"
    return None


@pytest.mark.parametrize("page", DOC_PAGES, ids=doc_id)
def test_every_docs_page_is_linked_from_the_readme(page: Path):
    assert page.resolve() in linked_pages(README), (
        f"README.md does not link {doc_id(page)}: add a line to its Documentation list, "
        f"`- [title]({doc_id(page)}): what a reader finds there`"
    )


@pytest.mark.parametrize("page", DOC_PAGES, ids=doc_id)
def test_every_docs_page_starts_with_its_title_and_what_it_is_for(page: Path):
    problem = opening_problem(page.read_text(encoding="utf-8"))
    assert problem is None, f"{doc_id(page)}: {problem}"


def test_the_front_page_checks_catch_an_unlinked_page_and_a_bare_title(tmp_path: Path):
    (tmp_path / "docs").mkdir()
    for name in ("linked.md", "unlinked.md"):
        (tmp_path / "docs" / name).write_text(f"# {name}\n")
    readme = tmp_path / "README.md"
    readme.write_text("- [Linked](docs/linked.md#linkedmd)\n\n`[not a link](docs/unlinked.md)`\n")
    assert linked_pages(readme) == {(tmp_path / "docs" / "linked.md").resolve()}
    assert opening_problem("# Tuning\n\nWhich ops pay off on this device, and how tune decides.\n") is None
    assert opening_problem("# Tuning\n\n**Rewrite cache.** A rewrite depends on its inputs.\n") is None
    assert opening_problem("Tuning\n\nWhich ops pay off.\n") is not None
    assert opening_problem("# Tuning\n\n```\npto-patch tune\n```\n") is not None
    assert opening_problem("# Tuning\n\n## Why\n") is not None
    assert opening_problem("# Tuning\n") is not None
