"""The one place that turns errors into messages."""

from __future__ import annotations

import pytest

from pto_patch.cli.console import report_error
from pto_patch.errors import EXIT_DRIFTED, DriftError, PtoPatchError


def test_brackets_in_messages_and_hints_are_printed_literally(capsys):
    code = report_error(PtoPatchError("no device [npu:0] here [/x]", "pip install 'torch-npu==2.9.0.post2'"))
    stderr = capsys.readouterr().err
    assert code == 1
    assert "no device [npu:0] here [/x]" in stderr
    assert "pip install 'torch-npu==2.9.0.post2'" in stderr


def test_typed_errors_carry_their_exit_code(capsys):
    assert report_error(DriftError("edited", "use --force")) == EXIT_DRIFTED
    assert capsys.readouterr().err.splitlines() == ["error: edited", "hint: use --force"]


@pytest.mark.parametrize("as_json", [False, True])
def test_unexpected_errors_say_so_and_point_at_the_debug_variable(capsys, as_json):
    assert report_error(ValueError("boom"), as_json=as_json) == 1
    captured = capsys.readouterr()
    text = captured.out if as_json else captured.err
    assert "unexpected error: ValueError: boom" in text and "PTO_PATCH_DEBUG=1" in text


def test_an_unexpected_multi_line_error_stays_on_one_line(capsys):
    report_error(ImportError("\nAutoImageProcessor requires the Torchvision library.\nSee the docs."))
    lines = capsys.readouterr().err.splitlines()
    assert (
        lines[0]
        == "error: unexpected error: ImportError: AutoImageProcessor requires the Torchvision library."
    )
    assert len(lines) == 2 and lines[1].startswith("hint:")


PLAIN_LINES = [
    "restored /tmp/model: 2 file(s) put back byte for byte, 13 added file(s) removed, in 0.02 s",
    "  your edited copy was kept as modeling_qwen2_5_vl.py.edited",
    "patched /a b/c for ops rms_norm, mrope (source: transformers 5.24.0, /x/y.py)",
    "  undo with: pto-patch restore --model-path /tmp/with spaces/ünï 模型  ",
    "time 12:30, ratio 1:2 and a url https://huggingface.co/x",
    "",
]
# what rich prints otherwise: markup, emoji codes, tabs, control characters, a line break
RICH_LINES = ["[red]x[/] y", "a :smile: b", "path/:x:/y", "a\tb", "bell\x07", "two\nlines", "\\[literal]"]


def rich_prints(text: str, **options) -> str:
    import io

    from rich.console import Console

    file = io.StringIO()
    Console(file=file, highlight=False, soft_wrap=True, **options).print(text)
    return file.getvalue()


@pytest.mark.parametrize("stderr", [False, True])
def test_a_plain_line_is_printed_as_rich_would_print_it_without_rich(capsys, stderr):
    from pto_patch.cli.console import _Console, is_plain

    console = _Console(stderr=stderr)
    for text in PLAIN_LINES:
        assert is_plain(text), text
        console.print(text)
        captured = capsys.readouterr()
        assert (captured.err if stderr else captured.out) == rich_prints(text), text
        assert rich_prints(text, force_terminal=True, color_system="truecolor") == text + "\n"
    assert "rich_console" not in vars(console)  # rich was never needed


def test_a_line_rich_would_change_goes_through_rich_as_text(capsys):
    """Through rich, but as text: markup is only read where a caller asks for it (`markup=True`)."""
    from pto_patch.cli.console import _Console, is_plain

    console = _Console(stderr=False)
    for text in RICH_LINES:
        assert not is_plain(text), text
        console.print(text)
        assert capsys.readouterr().out == rich_prints(text, markup=False), text
    assert any(rich_prints(text, markup=False) != text + "\n" for text in RICH_LINES)
    console.print("[red]x[/] y", markup=True)
    assert capsys.readouterr().out == "x y\n"


@pytest.mark.parametrize("name", ["mk[/]", "a[red]b", "x[/bold]y[", "[link=file:///etc]z"])
def test_markup_in_a_folder_name_is_printed_as_written_by_every_folder_command(tmp_path, capsys, name: str):
    """apply, status and restore over a folder whose path holds rich markup: exit 0, the path as it is."""
    from pto_patch.tiny.model import make_tiny
    from tests.test_engine import run_cli

    folder = tmp_path / name
    make_tiny(folder)
    for command in ("apply", "status", "restore"):
        assert run_cli(command, "--model-path", str(folder)) == 0, command
        captured = capsys.readouterr()
        assert "unexpected error" not in captured.err, (command, captured.err)
        assert str(folder.resolve()) in captured.out.replace("\n", ""), (command, captured.out)


def test_piped_tables_are_not_cut_at_80_columns(monkeypatch, capsys):
    """Output to a pipe or a log gets wide tables (rich would assume 80 columns); $COLUMNS still rules."""
    from rich.table import Table

    from pto_patch.cli.console import PIPED_WIDTH, _Console

    monkeypatch.delenv("COLUMNS", raising=False)
    table = Table()
    for name in ("op", "backend", "status", "rel err", "max abs", "run ms", "1st ms", "compile s"):
        table.add_column(name, no_wrap=True)
    table.add_row(
        "attention_prologue_mixed", "pypto", "fell back", "3.43e-03", "0.00123", "12.34", "4567.8", "12.5"
    )
    piped = _Console(stderr=False)
    piped.print(table)
    shown = capsys.readouterr().out
    assert piped.rich_console.width == PIPED_WIDTH
    assert "attention_prologue_mixed" in shown and "3.43e-03" in shown and "…" not in shown
    monkeypatch.setenv("COLUMNS", "60")
    assert _Console(stderr=False).rich_console.width == 60


def test_a_narrow_terminal_folds_a_number_and_never_cuts_it(monkeypatch, capsys):
    """In a terminal narrower than a table, every cell's text is kept whole (wrapped or folded onto the
    next line), where rich's own default would end it in "…"."""
    from rich.table import Table

    from pto_patch.cli.console import _Console, folding_table

    monkeypatch.setenv("COLUMNS", "40")
    row = ("attention_prologue_mixed", "pypto", "3.43e-03", "0.00123456", "4567.8912")
    for made, cut in ((folding_table(), False), (Table(), True)):
        for name in ("op", "backend", "rel err", "max abs", "1st ms"):
            made.add_column(name)
        made.add_row(*row)
        _Console(stderr=False).print(made)
        shown = capsys.readouterr().out
        assert ("…" in shown) is cut, shown
        if not cut:  # every character of every cell is shown (the headers' aside)
            from collections import Counter

            wanted = Counter("".join(row))
            assert not wanted - Counter(shown), wanted - Counter(shown)
