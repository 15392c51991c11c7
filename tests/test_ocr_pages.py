"""The OCR pages and their scoring, without a model: the truth, the metrics, the rules, the files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pto_patch.errors import EXIT_USAGE, PtoPatchError
from pto_patch.run.ocr import options as ocr_options
from pto_patch.run.ocr import outputs as ocr_outputs
from pto_patch.run.ocr.pages import Line, bundled_pages, layout_text2d, load_pages, write_pages
from pto_patch.run.ocr.plot import LABEL_WIDTH, PARTS, ROW, TOP, draw_time_plot
from pto_patch.run.ocr.report import PageRun, Reading
from pto_patch.run.ocr.scoring import TASK_NAMES, iou, parse_lines, score_answer
from pto_patch.run.ocr.verify import MEAN_CER_MARGIN, READING_CER_MARGIN, compare_readings

PAGES = bundled_pages()
INK = 128  # a pixel darker than this in any channel is ink


def lines_json(lines) -> str:
    return json.dumps([line.to_json() for line in lines])


# --- the bundled pages -----------------------------------------------------------------------------


def test_three_realistic_pages_each_with_text_layout_and_boxes():
    assert [page.name for page in PAGES] == ["prose", "two_columns", "form"]
    for page in PAGES:
        assert page.image.size == (1232, 1596)
        assert len(page.lines) >= 10 and len(page.text) >= 300
        assert page.text.split() == " ".join(line.text for line in reading(page)).split()


def reading(page):
    """The lines in the page's reading order: the truth's text, rebuilt from the lines."""
    if page.name != "form":
        return page.lines
    rows: list[list[Line]] = []
    for line in sorted(page.lines, key=lambda ln: ln.bbox[1] + ln.bbox[3]):
        if rows and abs(sum(rows[-1][0].bbox[1::2]) - sum(line.bbox[1::2])) < 16:  # centres 8 px apart
            rows[-1].append(line)
        else:
            rows.append([line])
    return [line for row in rows for line in sorted(row, key=lambda ln: ln.bbox[0])]


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_every_box_holds_its_line_and_no_ink_lies_outside_the_boxes(page):
    gray = page.image.convert("L")
    mask = gray.point(lambda value: 255 if value < INK else 0)
    width, height = page.image.size
    for line in page.lines:
        x1, y1, x2, y2 = line.bbox
        assert 0 <= x1 < x2 <= width and 0 <= y1 < y2 <= height
        inside = mask.crop(line.bbox).getbbox()
        assert inside is not None, f"no ink in the box of {line.text!r}"
        # the ink comes within 5 px of every side of the box: the box is the line's, not a loose frame
        assert inside[0] <= 5 and inside[1] <= 5 and inside[2] >= x2 - x1 - 5 and inside[3] >= y2 - y1 - 5
    from PIL import ImageDraw

    blanked = mask.copy()
    draw = ImageDraw.Draw(blanked)
    for line in page.lines:
        draw.rectangle(line.bbox, fill=0)
    assert blanked.getbbox() is None, "ink outside every truth box"


def test_text2d_keeps_the_columns_side_by_side():
    page = PAGES[1]
    rows = page.text2d.splitlines()
    left, right = page.lines[1], next(ln for ln in page.lines if ln.bbox[0] > page.image.size[0] / 2)
    row = next(r for r in rows if r.startswith(left.text))
    assert row.endswith(right.text) and row.index(right.text) > len(left.text) + 4
    assert "" in rows  # the paragraph gap survives as a blank line


def test_text2d_layout_rows_and_columns_follow_the_boxes():
    lines = [Line("b", (100, 0, 110, 10)), Line("a", (0, 1, 10, 11)), Line("c", (0, 15, 10, 25))]
    assert layout_text2d(lines) == "a" + " " * 9 + "b\nc"
    far = lines + [Line("d", (0, 30, 10, 40)), Line("e", (0, 90, 10, 100))]  # rows 15 px apart, then 60
    assert layout_text2d(far).splitlines()[-3:] == ["d", "", "e"]


# --- scoring ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_the_truth_itself_scores_perfectly(page):
    answers = {"TEXT": page.text, "TEXT2D": page.text2d, "LINES": f"```json\n{lines_json(page.lines)}\n```"}
    for task in TASK_NAMES:
        score = score_answer(task, answers[task], page)
        assert score.cer == 0 and score.wer == 0, task
    lines = score_answer("LINES", answers["LINES"], page)
    assert lines.parsed and lines.box_f1 == 1.0 and lines.lines_found == len(page.lines)


def test_more_damage_reads_worse():
    page = PAGES[0]
    words = page.text.split()
    one = " ".join(words[:5] + words[6:])
    ten = " ".join(w if i % 10 else w[::-1] + "x" for i, w in enumerate(words))
    scores = [score_answer("TEXT", text, page) for text in (page.text, one, ten, "")]
    assert [s.cer for s in scores] == sorted(s.cer for s in scores) and scores[1].cer > 0
    assert scores[-1].cer == 1.0 and scores[-1].wer == 1.0
    assert 0 < scores[1].wer < scores[2].wer
    # TEXT ignores where lines break; TEXT2D does not
    assert score_answer("TEXT", page.text.replace("\n", " "), page).cer == 0
    assert score_answer("TEXT2D", page.text2d.replace("\n", " "), page).cer > 0


def test_lines_answers_parse_in_the_shapes_models_write():
    page = PAGES[2]
    per_row = "\n".join(json.dumps({"text": ln.text, "box": list(ln.bbox)}) for ln in page.lines)
    assert score_answer("LINES", per_row, page).box_f1 == 1.0
    for broken in ("", "not json", '[{"text": "a"}]', '[{"text": 1, "bbox": [0, 0, 1, 1]}]', '{"a": 1}'):
        assert parse_lines(broken) is None, broken
        score = score_answer("LINES", broken, page)
        assert score.parsed is False and score.box_f1 == 0 and score.cer == 1.0


@pytest.mark.parametrize(
    "answer",
    [
        "[" * 3000,  # a model that repeats `[`: deeper than the JSON parser recurses
        "[" * 3000 + "]" * 3000,
        '{"text": "a", "bbox": ' + "[" * 3000 + "}",
        '[{"text": "a", "bbox": [0, 0, ' + "9" * 5000 + ", 1]}]",  # more digits than Python converts
        '[{"text": "a", "bbox": [0, 0, NaN, 1]}]',
        '[{"text": "a", "bbox": [0, 0, Infinity, 1]}]',
        '[{"text": "a", "bbox": [0, 0, 1e400, 1]}]',
        '[{"text": "a", "bbox": [0, 0, 1e300, 1e300]}]',  # finite, and its area overflows
        '[{"text": "a", "bbox": [0, 0, true, 1]}]',
        '[{"text": "a", "bbox": "0 0 1 1"}]',
    ],
)
def test_a_lines_answer_never_crashes_the_scoring(answer):
    page = PAGES[0]
    assert parse_lines(answer) is None
    score = score_answer("LINES", answer, page)
    assert score.parsed is False and score.box_f1 == 0 and score.cer == 1.0


def test_a_bom_is_no_character_of_the_truth(tmp_path: Path):
    write_pages(PAGES[:1], tmp_path)
    truth = tmp_path / "prose.txt"
    truth.write_bytes(b"\xef\xbb\xbf" + truth.read_bytes())
    (page,) = load_pages(tmp_path)
    assert page.text == PAGES[0].text and page.truth_digest == PAGES[0].truth_digest


def test_boxes_match_at_the_stated_iou():
    page = PAGES[0]
    shifted = [
        Line(ln.text, (ln.bbox[0] + 3, ln.bbox[1] + 2, ln.bbox[2] + 3, ln.bbox[3] + 2)) for ln in page.lines
    ]
    away = [Line(ln.text, (ln.bbox[0], ln.bbox[1] + 900, ln.bbox[2], ln.bbox[3] + 900)) for ln in page.lines]
    assert all(iou(a.bbox, b.bbox) >= 0.5 for a, b in zip(shifted, page.lines, strict=True))
    assert score_answer("LINES", lines_json(shifted), page).box_f1 == 1.0
    far = score_answer("LINES", lines_json(away), page)
    assert far.box_f1 == 0 and far.cer == 0  # the right text in the wrong place
    half = score_answer("LINES", lines_json(page.lines[: len(page.lines) // 2]), page)
    assert half.box_precision == 1.0 and 0.45 < half.box_recall < 0.55


# --- the rules -------------------------------------------------------------------------------------


def readings(mode: str, cers: list[float]) -> list[Reading]:
    from pto_patch.run.ocr.scoring import Score

    return [
        Reading(f"p{i}", "TEXT", mode, f"answer {i}", 4, False, Score(cer, cer, 100, 100))
        for i, cer in enumerate(cers)
    ]


def test_pto_fails_when_one_reading_or_the_mean_is_measurably_worse():
    base = readings("baseline", [0.10, 0.20, 0.05, 0.00])
    same = readings("pto", [0.10, 0.20, 0.05, 0.00])
    noise = readings("pto", [0.11, 0.19, 0.06, 0.005])
    one_page = readings("pto", [0.10, 0.20 + READING_CER_MARGIN + 0.01, 0.05, 0.00])
    everywhere = readings("pto", [c + MEAN_CER_MARGIN * 1.5 for c in (0.10, 0.20, 0.05, 0.00)])
    assert compare_readings(base, same, "baseline")[1] == []
    assert compare_readings(base, noise, "baseline")[1] == []
    failed = compare_readings(base, one_page, "baseline")[1]
    assert any("page p1, TEXT reads worse" in message for message in failed)
    assert any("mean CER rises" in message for message in compare_readings(base, everywhere, "baseline")[1])
    better = readings("pto", [0.0, 0.0, 0.0, 0.0])
    assert compare_readings(base, better, "baseline")[1] == []


# --- files and options -----------------------------------------------------------------------------


def test_pages_written_and_read_back_keep_their_truth(tmp_path: Path):
    write_pages(PAGES, tmp_path)
    loaded = load_pages(tmp_path)
    assert sorted(p.name for p in loaded) == sorted(p.name for p in PAGES)
    by_name = {p.name: p for p in PAGES}
    for page in loaded:
        assert page.truth_digest == by_name[page.name].truth_digest
        assert page.digest == by_name[page.name].digest


def _lines(folder: Path, box: str) -> None:
    """A truth file whose second line has the box given as JSON text."""
    (folder / "prose.lines.json").write_text(
        '[{"text": "a", "bbox": [1, 1, 9, 9]}, {"text": "b", "bbox": ' + box + "}]"
    )


def _truncate(path: Path) -> None:
    """A PNG whose header holds and whose last chunks are gone (a copy cut short)."""
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _image(path: Path, size: tuple[int, int]) -> None:
    from PIL import Image

    Image.new("RGB", size, "white").save(path)


def _page_folder(tmp_path: Path) -> Path:
    write_pages(PAGES[:1], tmp_path)
    return tmp_path


@pytest.mark.parametrize(
    ("breakage", "message"),
    [
        (lambda d: (d / "prose.txt").unlink(), "has no prose.txt"),
        (lambda d: (d / "prose.txt").write_text("  \n"), "is empty"),
        (lambda d: (d / "prose.lines.json").write_text("[{"), "is not JSON"),
        (
            lambda d: (d / "prose.lines.json").write_text('[{"text": "a", "bbox": [5, 5, 1, 1]}]'),
            "line 0 of",
        ),
        # Nothing a truth file holds ends as an unexpected error: each is refused, naming file and entry.
        (lambda d: (d / "prose.lines.json").write_text("[" * 5000 + "]" * 5000), "nested too deep"),
        (lambda d: (d / "prose.lines.json").write_text("[" + "9" * 5000 + "]"), "is not JSON"),
        (lambda d: _lines(d, "[NaN, 1, 2, 3]"), "line 1 of"),
        (lambda d: _lines(d, "[0, 0, Infinity, 3]"), "four finite numbers"),
        (lambda d: _lines(d, "[0, 0, 1e400, 3]"), "four finite numbers"),
        (lambda d: _lines(d, "[0, 0, " + "9" * 400 + ", 3]"), "four finite numbers"),
        (lambda d: _lines(d, "[0, 0, 90000, 30]"), "outside the 1232x1596 page"),
        (lambda d: _lines(d, '"0 0 1 1"'), "four finite numbers"),
        (
            lambda d: (d / "prose.lines.json").write_text('[{"text": 5, "bbox": [0, 0, 1, 1]}]'),
            "no text string",
        ),
        (lambda d: (d / "prose.lines.json").write_text("[[1, 2]]"), "is a list, not an object"),
        (lambda d: (d / "prose.png").write_bytes(b"\x89PNG broken"), "not an image PIL can read"),
        (lambda d: _truncate(d / "prose.png"), "not an image PIL can read"),
        (lambda d: _image(d / "prose.png", (6000, 20)), "a size the model cannot take"),
        (lambda d: [f.unlink() for f in d.glob("prose.*")], "holds no .png"),
    ],
)
def test_a_bad_pages_folder_is_a_usage_error(tmp_path: Path, breakage, message):
    folder = _page_folder(tmp_path)
    breakage(folder)
    with pytest.raises(PtoPatchError) as caught:
        load_pages(folder)
    assert message in caught.value.message and caught.value.hint and caught.value.exit_code == EXIT_USAGE


def test_saved_answers_belong_to_their_pages(tmp_path: Path):
    saved = tmp_path / "answers.json"
    answers = [Reading(p.name, t, "baseline", "x", 1, False, None) for p in PAGES for t in TASK_NAMES]
    ocr_outputs.save_answers(saved, {"device": "cpu"}, PAGES, answers)
    run = ocr_outputs.load_answers(saved, PAGES)
    assert run.modes == ["baseline"] and len(run.answers) == 9 and run.redrawn == []
    document = json.loads(saved.read_text())
    document["pages"]["prose"]["digest"] = "0" * 64  # the same truth, drawn by another Pillow
    saved.write_text(json.dumps(document))
    assert ocr_outputs.load_answers(saved, PAGES).redrawn == ["prose"]
    document["pages"]["form"]["truth_digest"] = "0" * 64
    saved.write_text(json.dumps(document))
    with pytest.raises(PtoPatchError, match="another truth"):
        ocr_outputs.load_answers(saved, PAGES)
    for text, message in (("{", "not JSON"), ('{"kind": "other"}', "not a file of saved OCR answers")):
        saved.write_text(text)
        with pytest.raises(PtoPatchError, match=message):
            ocr_outputs.load_answers(saved, PAGES)


def split(**given):
    parameters = {
        "ocr": False,
        "pages": None,
        "save_outputs": None,
        "against_outputs": None,
        "output_length": None,
    }
    parameters.update(given)
    options = ocr_options.split_ocr_options(parameters, plain_output_length=50, ocr_output_length=1024)
    return options, parameters


def test_ocr_options_are_checked_up_front():
    assert split()[1]["output_length"] == 50
    assert split(ocr=True)[1]["output_length"] == 1024
    assert split(ocr=True, output_length=7)[1]["output_length"] == 7
    assert "pages" not in split(ocr=True)[1]
    for given, message in (
        ({"pages": Path("p")}, "--pages only applies"),
        ({"ocr": True, "image": Path("x.png")}, "--image does not apply"),
        ({"ocr": True, "batch": 4}, "one page at a time"),
        ({"ocr": True, "plot": Path("x.jpg")}, "not a .png"),
        ({"ocr": True, "save_outputs": Path(__file__).parent}, "is a folder"),
        ({"ocr": True, "plot": Path(__file__) / "x.png"}, "cannot write in"),  # under a file
    ):
        with pytest.raises(PtoPatchError, match=message) as caught:
            split(**given)
        assert caught.value.exit_code == EXIT_USAGE


def test_the_plot_draws_each_part_in_proportion():
    run = PageRun("p", 1, "pto", 10, 20, 8, 1.0, 0.5, 1.5, 2.5, 4.0, 0.1)
    slow = PageRun("p", 1, "baseline", 10, 20, 8, 1.0, 0.5, 1.5, 6.5, 8.0, 0.1)
    image = draw_time_plot([run, slow])
    span = image.size[0] - LABEL_WIDTH - 110
    y = TOP + 10  # the first bar's middle row
    colours = dict(PARTS)
    for seconds_in, part in ((0.5, "vision"), (1.25, "prefill"), (3.0, "decode")):
        x = LABEL_WIDTH + int(seconds_in / 8.0 * span)
        assert image.getpixel((x, y)) == colours[part], part
    # the first bar ends at half the second's length
    assert image.getpixel((LABEL_WIDTH + int(0.55 * span), y)) == (255, 255, 255)
    assert image.getpixel((LABEL_WIDTH + int(0.9 * span), y + ROW)) == colours["decode"]


# --- the JSON documents ----------------------------------------------------------------------------

SCHEMAS = Path(__file__).resolve().parents[1] / "skills" / "pto-patch" / "references" / "json-schemas.md"


def schema_section(title: str) -> str:
    return SCHEMAS.read_text(encoding="utf-8").split(f"\n## {title}\n")[1].split("\n## ")[0]


def undocumented(keys, section: str) -> list[str]:
    return [key for key in keys if f"`{key}`" not in section and key != "schema_version"]  # every document's


def test_every_key_of_the_ocr_documents_is_documented():
    from pto_patch.run.ocr.report import Comparison, OcrVerifyReport, PageBenchResult, mode_summary
    from pto_patch.run.ocr.scoring import Score
    from pto_patch.run.ocr.verify import MARGINS
    from pto_patch.run.report import LoadInfo

    load = LoadInfo([], [], [], None)
    reading = Reading(
        "p", "LINES", "baseline", "a", 1, False, Score(0.1, 0.2, 10, 9, True, 1, 1, 1.0, 1.0, 1.0)
    )
    report = OcrVerifyReport("m", "cpu", "why", "float32", {}, load, [PAGES[0].describe()], {}, 8, MARGINS)
    report.readings, report.comparisons = (
        [reading],
        [Comparison("p", "LINES", "baseline", "pto", 0.1, 0.2, 0.3)],
    )
    verify = schema_section("verify --ocr")
    doc = report.to_json()
    assert undocumented(doc, verify) == []
    assert (
        undocumented(doc["readings"][0], verify) == [] and undocumented(doc["comparisons"][0], verify) == []
    )
    assert undocumented(doc["pages"][0], verify) == [] and undocumented(MARGINS, verify) == []
    assert undocumented(mode_summary([reading]), verify) == []
    run = PageRun("p", 1, "pto", 10, 20, 8, 1.0, 0.5, 1.5, 2.5, 4.0, 0.1)
    bench = PageBenchResult("m", "cpu", "float32", {}, load, "TEXT", "read", 8, [], runs=[run])
    bench_doc, section = bench.to_json(), schema_section("bench --ocr")
    assert (
        undocumented(bench_doc, section + verify) == [] and undocumented(bench_doc["runs"][0], section) == []
    )
    assert "`latencies_s`" in section and undocumented(run.split(), section) == []


def test_the_text_output_shows_every_reading_and_part(capsys):
    from pto_patch.cli import ocr_render
    from pto_patch.run.ocr.report import OcrVerifyReport, PageBenchResult
    from pto_patch.run.ocr.scoring import Score
    from pto_patch.run.ocr.verify import MARGINS
    from pto_patch.run.report import LoadInfo

    load = LoadInfo([], [], [], None)
    report = OcrVerifyReport(
        "m", "cpu", "why", "float32", {}, load, [PAGES[0].describe()], {"TEXT": "read"}, 8, MARGINS
    )
    report.readings = [
        Reading("prose", "TEXT", "baseline", "a", 8, True, Score(0.25, 0.5, 10, 9)),
        Reading("prose", "LINES", "pto", "b", 3, False, Score(1.0, 1.0, 10, 0, False, 0, 10, 0.0, 0.0, 0.0)),
    ]
    report.failures = ["pto against baseline: page prose, TEXT reads worse"]
    ocr_render.ocr_verify_text(report)
    run = PageRun("prose", 1, "pto", 10, 20, 8, 1.0, 0.5, 1.5, 2.5, 4.0, 0.1)
    ocr_render.page_bench_text(
        PageBenchResult("m", "cpu", "float32", {}, load, "TEXT", "read", 8, [], runs=[run])
    )
    captured = capsys.readouterr()
    assert "0.250 *" in captured.out and "not JSON" in captured.out and "FAILED" in captured.out
    assert "TEXT reads worse" in captured.err
    assert "vision 25.0 %, prefill 12.5 %, decode 62.5 %" in captured.out


def test_a_page_the_processor_resizes_is_named(tmp_path: Path):
    from pto_patch.run.image_inputs import load_image_processor
    from pto_patch.run.ocr.verify import model_input_size, resized_pages
    from pto_patch.tiny.model import make_tiny

    def seen(processor) -> dict:
        """Each page's size as the model sees it, from the grid the processor makes of it."""
        grids = {
            page.name: processor(images=[page.image], return_tensors="pt")["image_grid_thw"][0]
            for page in PAGES
        }
        return {name: model_input_size(grid, processor) for name, grid in grids.items()}

    make_tiny(tmp_path / "tiny")  # its processor caps a page at 256 image tokens
    described = [page.describe() for page in PAGES]
    resized = resized_pages(PAGES, seen(load_image_processor(tmp_path / "tiny")), described)
    assert len(resized) == 3 and "1232x1596 ->" in resized[0]
    config = json.loads((tmp_path / "tiny" / "preprocessor_config.json").read_text())
    config["max_pixels"] = config["size"]["longest_edge"] = 12845056  # Qwen2.5-VL's own limit
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "preprocessor_config.json").write_text(json.dumps(config))
    assert resized_pages(PAGES, seen(load_image_processor(tmp_path / "full")), described) == []
    assert [entry["model_input_size"] for entry in described] == [[1232, 1596]] * 3


def test_thousands_of_pages_are_checked_before_one_is_decoded(tmp_path: Path, monkeypatch):
    """Every page's truth and header first, the pixels one page at a time when read: a broken last page
    of 2,000 is refused with no page decoded, and a good folder holds no page's pixels until read."""
    from PIL import Image, ImageFile

    count = 2000
    for index in range(count):
        Image.new("RGB", (56, 84), (index % 256, 255, 255)).save(tmp_path / f"p{index:04d}.png")
        (tmp_path / f"p{index:04d}.txt").write_text(f"page {index}\n")
    decoded = []
    load = ImageFile.ImageFile.load
    monkeypatch.setattr(ImageFile.ImageFile, "load", lambda image: decoded.append(1) or load(image))
    pages = load_pages(tmp_path)
    assert len(pages) == count and decoded == []
    assert all(page.size == (56, 84) and page.drawn is None for page in pages)
    assert pages[-1].image.getpixel((0, 0)) == ((count - 1) % 256, 255, 255) and decoded
    decoded.clear()
    _truncate(tmp_path / f"p{count - 1:04d}.png")
    with pytest.raises(PtoPatchError) as refused:
        load_pages(tmp_path)
    assert f"p{count - 1:04d}.png is not an image PIL can read" in refused.value.message
    assert decoded == []  # refused from its header and chunks alone
