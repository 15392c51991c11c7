"""Sizes a --pages folder controls, checked before the work (issue 51, item 6): the count of pages, the
count of a page's truth lines, and box matching that never holds every pair of boxes at once."""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path

import pytest

from pto_patch.errors import EXIT_USAGE, PtoPatchError
from pto_patch.run.ocr import pages as ocr_pages
from pto_patch.run.ocr.pages import Line, bundled_pages, load_pages, write_pages
from pto_patch.run.ocr.scoring import match_boxes


def _refused(folder: Path) -> str:
    with pytest.raises(PtoPatchError) as caught:
        load_pages(folder)
    assert caught.value.exit_code == EXIT_USAGE and caught.value.hint
    return caught.value.message


def test_a_folder_of_more_pages_than_the_limit_is_refused(tmp_path: Path, monkeypatch):
    write_pages(bundled_pages()[:2], tmp_path)
    assert len(load_pages(tmp_path)) == 2
    monkeypatch.setattr(ocr_pages, "MAX_PAGES", 1)
    assert _refused(tmp_path) == f"--pages {tmp_path} holds 2 pages, past the 1 one run reads"


def test_a_page_of_more_lines_than_the_limit_is_refused(tmp_path: Path, monkeypatch):
    write_pages(bundled_pages()[:1], tmp_path)
    lines = tmp_path / "prose.lines.json"
    count = len(json.loads(lines.read_text()))
    monkeypatch.setattr(ocr_pages, "MAX_LINES", count - 1)
    assert (
        _refused(tmp_path)
        == f"--pages: {lines} holds {count:,} lines, past the {count - 1:,} a page may have"
    )


def test_box_matching_keeps_only_the_pairs_that_overlap():
    """1,000 x 1,000 boxes that never overlap: a list of every pair was a million tuples (~100 MB)."""
    found = [Line("a", (i * 10.0, 0.0, i * 10.0 + 5, 5.0)) for i in range(1000)]
    truth = [Line("a", (i * 10.0, 100.0, i * 10.0 + 5, 105.0)) for i in range(1000)]
    tracemalloc.start()
    try:
        assert match_boxes(found, truth) == 0
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 5 * 1024 * 1024, peak
    assert match_boxes(found, found) == 1000  # each box matches itself one to one
