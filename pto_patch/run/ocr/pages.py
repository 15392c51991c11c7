"""Pages with known truth: three pages pto-patch renders itself, or the user's own (`--pages DIR`).

A bundled page is drawn with Pillow's bundled font (no system font needed) at the size of a letter
page scanned at about 145 dpi (1232 x 1596 pixels, multiples of the 28-pixel patch group, so the
image processor does not rescale it). Because pto-patch places every line itself, the truth is known
exactly: the text in reading order, its layout-preserving TEXT2D form, and each line with its pixel
box, in the shape GutenOCR's evaluation data uses (`{"text": ..., "bbox": [x1, y1, x2, y2]}`).

A user's folder holds `NAME.png` (or .jpg / .jpeg) with `NAME.txt` (the text), and optionally
`NAME.lines.json` (a list of lines with `text` and `bbox`) and `NAME.text2d.txt`. Without a
text2d file, TEXT2D is laid out from the lines' boxes, or else scored against NAME.txt.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pto_patch.errors import EXIT_USAGE, PtoPatchError
from pto_patch.model import input_files

PAGE_SIZE = (1232, 1596)
MARGIN = 112
BODY_SIZE = 24
TITLE_SIZE = 36
LINE_GAP = 1.45  # line pitch, times the body size
COLUMN_GAP = 56
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")
MAX_TRUTH_BYTES = 64 * 1024 * 1024  # a truth file: a page's text, or its lines with boxes
MAX_PAGES = 10_000  # pages in one --pages folder (streamed; each read by every task in both modes)
MAX_LINES = 10_000  # truth lines (boxes) of one page: the bundled pages hold tens
MAX_TEXT2D_BLANK_LINES = 1  # runs of empty rows collapse to one blank line, as in GutenOCR's TEXT2D


@dataclass(frozen=True)
class Line:
    text: str
    bbox: tuple[int, int, int, int]  # x1, y1, x2, y2 in the page's pixels

    def to_json(self) -> dict[str, Any]:
        return {"text": self.text, "bbox": list(self.bbox)}


@dataclass
class Page:
    """One page and its truth; `lines` is empty where the user gave no NAME.lines.json.

    A bundled page keeps its drawn image (three pages); a user's page keeps only its path and header
    size, and is decoded each time `image` is read, so a folder of thousands of pages costs one page's
    pixels at a time.
    """

    name: str
    text: str
    text2d: str
    lines: list[Line] = field(default_factory=list)
    source: str = "bundled"
    text2d_source: str = "rendered"
    size: tuple[int, int] = PAGE_SIZE  # width, height, read from the header for a user's page
    drawn: Any = field(default=None, repr=False)  # a bundled page's PIL image
    path: Path | None = None  # a user's page: decoded from here when read
    _digest: str | None = field(default=None, repr=False)

    @property
    def image(self):
        """The page as a PIL RGB image: the drawn one, or decoded from its file now (not kept)."""
        if self.drawn is not None:
            image = self.drawn
        else:
            image = _decode_image(self.path)
            if image.size != self.size:
                raise _bad(
                    f"--pages: {self.path} changed during the run ({self.size} -> {image.size})",
                    "leave the pages folder alone while a run reads it",
                )
        if self._digest is None:
            self._digest = hashlib.sha256(image.tobytes()).hexdigest()
        return image

    @property
    def digest(self) -> str:
        """sha256 of the pixels (another Pillow or FreeType may draw a bundled page a little differently)."""
        if self._digest is None:
            self.image  # noqa: B018 - decoding sets it
        return self._digest

    @property
    def truth_digest(self) -> str:
        """sha256 of the truth: a saved run's answers are only ever scored against this truth."""
        truth = [self.text, self.text2d, [line.to_json() for line in self.lines]]
        return hashlib.sha256(json.dumps(truth).encode()).hexdigest()

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "source": self.source,
            "size": list(self.size),
            "truth_chars": len(self.text),
            "truth_lines": len(self.lines),
            "text2d_from": self.text2d_source,
            "digest": self.digest,
            "truth_digest": self.truth_digest,
        }


# --- the bundled pages ----------------------------------------------------------------------------

PROSE_TITLE = "Notes on the Harbour Survey"
PROSE = (
    "The survey of the eastern harbour began on the fourth of May, when the tide tables agreed with "
    "the pilots' own reckoning for the first time that spring. Each morning two boats left the north "
    "quay at seven and sounded the channel in strips of forty metres, marking every reading on a "
    "copy of the 1911 chart.",
    "By the end of the second week the soundings showed that the bar had moved some sixty metres "
    "toward the lighthouse, and that the deepest water now ran close under the breakwater. The "
    "harbour master asked for the buoys to be moved before the autumn traffic.",
    "The third part of this report lists the readings by strip and date, with the depth corrected "
    "to the lowest tide, so that the chart can be redrawn without going back to the field books.",
)
COLUMNS_TITLE = "Quarterly Bulletin of the Reading Room"
COLUMNS_LEFT = (
    "The reading room will close for two weeks in August while the shelves in the east gallery are "
    "replaced. Readers who have books on loan may return them at the front desk as usual.",
    "During the closure the catalogue stays open online, and requests for copies are still taken by "
    "post; they will be answered in the order in which they arrive.",
)
COLUMNS_RIGHT = (
    "This quarter the library received 312 new volumes, most of them maps and parish records given "
    "by the county archive. They are listed in the supplement at the back of this bulletin.",
    "The winter lectures start on 9 October. Tickets are free but must be booked, since the lecture "
    "hall holds only eighty people.",
)
FORM_TITLE = "INVOICE  No. 2024-0117"
FORM_FIELDS = (
    ("Date:", "12 March 2024"),
    ("Customer:", "Harbour Works Ltd."),
    ("Address:", "4 North Quay, Port Ellen"),
    ("Order:", "PO-55231"),
)
FORM_TABLE = (
    ("Item", "Qty", "Unit price", "Amount"),
    ("Chart paper, A0", "20", "3.40", "68.00"),
    ("Marker buoy, red", "4", "118.00", "472.00"),
    ("Mooring chain, 10 m", "2", "96.25", "192.50"),
    ("Survey day rate", "9", "61.00", "549.00"),
)
FORM_TOTAL = ("Total due (EUR):", "1,281.50")


class _Canvas:
    """A white page onto which lines are drawn; each drawn line is kept with its box."""

    def __init__(self):
        from PIL import Image, ImageDraw, ImageFont

        self.image = Image.new("RGB", PAGE_SIZE, "white")
        self.draw = ImageDraw.Draw(self.image)
        self.body = ImageFont.load_default(size=BODY_SIZE)
        self.title = ImageFont.load_default(size=TITLE_SIZE)
        self.lines: list[Line] = []

    def width_of(self, text: str, font=None) -> float:
        return self.draw.textlength(text, font=font or self.body)

    def line(self, x: float, y: float, text: str, font=None) -> None:
        font = font or self.body
        self.draw.text((x, y), text, fill="black", font=font)
        x1, y1, x2, y2 = self.draw.textbbox((x, y), text, font=font)
        self.lines.append(Line(text, (int(x1), int(y1), int(x2), int(y2))))

    def wrap(self, text: str, width: float) -> list[str]:
        rows, current = [], ""
        for word in text.split():
            candidate = f"{current} {word}".strip()
            if current and self.width_of(candidate) > width:
                rows.append(current)
                current = word
            else:
                current = candidate
        return rows + ([current] if current else [])

    def paragraphs(self, x: float, y: float, width: float, paragraphs: tuple[str, ...]) -> float:
        pitch = BODY_SIZE * LINE_GAP
        for paragraph in paragraphs:
            for row in self.wrap(paragraph, width):
                self.line(x, y, row)
                y += pitch
            y += pitch  # a blank line between paragraphs
        return y


def _finish(name: str, canvas: _Canvas, reading_order: list[str]) -> Page:
    return Page(
        name=name,
        text="\n".join(reading_order),
        text2d=layout_text2d(canvas.lines),
        lines=list(canvas.lines),
        size=canvas.image.size,
        drawn=canvas.image,
    )


def _prose_page() -> Page:
    canvas = _Canvas()
    canvas.line(MARGIN, MARGIN, PROSE_TITLE, canvas.title)
    canvas.paragraphs(MARGIN, MARGIN + TITLE_SIZE * 2.2, PAGE_SIZE[0] - 2 * MARGIN, PROSE)
    return _finish("prose", canvas, [line.text for line in canvas.lines])


def _columns_page() -> Page:
    canvas = _Canvas()
    canvas.line(MARGIN, MARGIN, COLUMNS_TITLE, canvas.title)
    top = MARGIN + TITLE_SIZE * 2.2
    width = (PAGE_SIZE[0] - 2 * MARGIN - COLUMN_GAP) / 2
    canvas.paragraphs(MARGIN, top, width, COLUMNS_LEFT)
    canvas.paragraphs(MARGIN + width + COLUMN_GAP, top, width, COLUMNS_RIGHT)
    # Reading order: the title, then the left column top to bottom, then the right one (as drawn).
    return _finish("two_columns", canvas, [line.text for line in canvas.lines])


def _form_page() -> Page:
    canvas = _Canvas()
    canvas.line(MARGIN, MARGIN, FORM_TITLE, canvas.title)
    pitch = BODY_SIZE * LINE_GAP
    y = MARGIN + TITLE_SIZE * 2.2
    reading = [FORM_TITLE]  # a form reads row by row: a label with its value, a table row's cells
    for label, value in FORM_FIELDS:
        canvas.line(MARGIN, y, label)
        canvas.line(MARGIN + 200, y, value)
        reading.append(f"{label} {value}")
        y += pitch
    y += pitch * 1.5
    columns = (MARGIN, MARGIN + 420, MARGIN + 600, MARGIN + 820)
    for row in FORM_TABLE:
        for x, cell in zip(columns, row, strict=True):
            canvas.line(x, y, cell)
        reading.append(" ".join(row))
        y += pitch
    y += pitch
    canvas.line(columns[2], y, FORM_TOTAL[0])
    canvas.line(columns[3], y, FORM_TOTAL[1])
    reading.append(" ".join(FORM_TOTAL))
    return _finish("form", canvas, reading)


def bundled_pages() -> list[Page]:
    """The three bundled pages: prose, a two-column bulletin, an invoice form with a table."""
    return [_prose_page(), _columns_page(), _form_page()]


# --- TEXT2D from boxes ----------------------------------------------------------------------------


def layout_text2d(lines: list[Line]) -> str:
    """The lines placed on a character grid: one text row per row of lines, a column per mean width.

    Lines whose vertical centres lie within half a line height of each other share a row, left to
    right, at least one space apart; a gap of more than one and a half line pitches (the median gap
    between rows) becomes one blank line.
    """
    lines = [line for line in lines if line.text.strip()]
    if not lines:
        return ""
    height = max(statistics.median(line.bbox[3] - line.bbox[1] for line in lines), 1.0)
    char_width = max(
        statistics.median((line.bbox[2] - line.bbox[0]) / max(len(line.text), 1) for line in lines), 1.0
    )
    origin_x = min(line.bbox[0] for line in lines)
    rows: list[tuple[float, list[Line]]] = []
    for line in sorted(lines, key=lambda item: (item.bbox[1] + item.bbox[3]) / 2):
        centre = (line.bbox[1] + line.bbox[3]) / 2
        if rows and centre - rows[-1][0] <= height / 2:
            rows[-1][1].append(line)
        else:
            rows.append((centre, [line]))
    gaps = [after[0] - before[0] for before, after in zip(rows, rows[1:], strict=False)]
    pitch = statistics.median(gaps) if gaps else height
    out, previous = [], None
    for centre, row in rows:
        if previous is not None and centre - previous > 1.5 * pitch:
            out += [""] * MAX_TEXT2D_BLANK_LINES
        text = ""
        for line in sorted(row, key=lambda item: item.bbox[0]):
            column = round((line.bbox[0] - origin_x) / char_width)
            text += " " * max(column - len(text), 1 if text else 0) + line.text
        out.append(text.rstrip())
        previous = centre
    return "\n".join(out)


# --- the user's pages -----------------------------------------------------------------------------


def _bad(message: str, hint: str) -> PtoPatchError:
    return PtoPatchError(message, hint, exit_code=EXIT_USAGE)


def _read_text(path: Path) -> str:
    """A truth file's text; a byte-order mark is no character of the truth."""
    try:
        return input_files.read_bytes(path, MAX_TRUTH_BYTES).decode("utf-8-sig")
    except input_files.UnreadableInput as exc:
        raise _bad(f"--pages: {exc}", "pass a truth file of plain text or JSON, within the limit") from exc
    except UnicodeDecodeError as exc:
        raise _bad(f"--pages: {path} is not UTF-8 text", "save the truth as UTF-8") from exc
    except OSError as exc:
        raise _bad(f"--pages: cannot read {path}: {exc.strerror}", "check the file's permissions") from exc


def load_json_text(text: str) -> Any:
    """`json.loads`, where every way the text can fail is a ValueError: nesting too deep for the
    parser (RecursionError), an integer of more digits than Python converts (ValueError), bad JSON."""
    try:
        return json.loads(text)
    except RecursionError as exc:
        raise ValueError("nested too deep") from exc
    except json.JSONDecodeError as exc:
        raise ValueError(f"{exc.msg}, line {exc.lineno}") from exc


def finite_box(box: Any) -> tuple[float, float, float, float] | None:
    """Four finite numbers (no booleans, no NaN, no infinity or 1e400), or None."""
    if not isinstance(box, list) or len(box) != 4:
        return None
    values = []
    for value in box:
        if not isinstance(value, int | float) or isinstance(value, bool):
            return None
        try:
            number = float(value)
        except OverflowError:  # an integer past float's range
            return None
        if not math.isfinite(number):
            return None
        values.append(number)
    return values[0], values[1], values[2], values[3]


BOX_SLACK = 0.02  # a truth box may reach this far past the page's edge (rounding), then is clipped to it


def _line_problem(item: Any, size: tuple[int, int]) -> tuple[str, Line | None]:
    """What is wrong with one entry of a NAME.lines.json, or its line."""
    if not isinstance(item, dict):
        return f"is a {type(item).__name__}, not an object", None
    if not isinstance(item.get("text"), str):
        return "has no text string", None
    raw = item.get("bbox", item.get("box"))
    box = finite_box(raw)
    if box is None:
        return "has no bbox of four finite numbers", None
    x1, y1, x2, y2 = box
    if x2 <= x1 or y2 <= y1:
        return f"has an empty box {raw} (x1 < x2 and y1 < y2 needed)", None
    width, height = size
    slack_x, slack_y = BOX_SLACK * width, BOX_SLACK * height
    if x1 < -slack_x or y1 < -slack_y or x2 > width + slack_x or y2 > height + slack_y:
        return f"has a box {raw} outside the {width}x{height} page", None
    clipped = (max(x1, 0), max(y1, 0), min(x2, width), min(y2, height))
    return "", Line(item["text"], tuple(int(round(v)) for v in clipped))


def _read_lines(path: Path, size: tuple[int, int]) -> list[Line]:
    """A page's truth lines; any entry that is not a text with a box on the page is refused by index."""
    hint = 'write a JSON list of {"text": "...", "bbox": [x1, y1, x2, y2]} in the page\'s pixels'
    try:
        data = load_json_text(_read_text(path))
    except ValueError as exc:
        raise _bad(f"--pages: {path} is not JSON ({exc})", hint) from exc
    if not isinstance(data, list):
        raise _bad(f"--pages: {path} holds no list of lines", hint)
    if len(data) > MAX_LINES:
        raise _bad(
            f"--pages: {path} holds {len(data):,} lines, past the {MAX_LINES:,} a page may have",
            "split the page, or keep its lines under the limit",
        )
    lines = []
    for index, item in enumerate(data):
        problem, line = _line_problem(item, size)
        if line is None:
            raise _bad(f"--pages: line {index} of {path} {problem}", hint)
        lines.append(line)
    return lines


def _unreadable(path: Path, exc: BaseException) -> PtoPatchError:
    reason = (str(exc).splitlines() or [""])[0] or type(exc).__name__
    return _bad(f"--pages: {path} is not an image PIL can read ({reason})", "pass PNG or JPEG pages")


def _aspect_problem(width: int, height: int) -> str | None:
    """What the model's image processor would refuse of this size: its own rule where it imports."""
    try:
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize
    except ImportError:
        try:
            from transformers.models.qwen2_vl.image_processing_qwen2_vl import smart_resize
        except ImportError:
            return None  # the run's own processor says it later
    try:
        smart_resize(height, width)
    except ValueError as exc:
        return str(exc).splitlines()[0]
    return None


def read_image_header(path: Path) -> tuple[int, int]:
    """A page's (width, height) from its header, after checking what can be checked without decoding
    it: that PIL reads the header, that the file's chunks are whole (PNG), that the size is one the
    model's image processor takes, and that it is no decompression bomb."""
    import warnings

    from PIL import Image

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(path) as opened:
                size = opened.size
                opened.verify()
    except Exception as exc:  # PIL raises OSError, SyntaxError, struct.error ... for bad data
        raise _unreadable(path, exc) from exc
    if min(size) < 1:
        raise _bad(f"--pages: {path} is {size[0]}x{size[1]} pixels", "pass pages with some pixels")
    problem = _aspect_problem(*size)
    if problem is not None:
        raise _bad(
            f"--pages: {path} is {size[0]}x{size[1]}, a size the model cannot take ({problem})",
            "crop or pad the page to a document's proportions",
        )
    return size


def _decode_image(path: Path):
    from PIL import Image

    try:
        with Image.open(path) as opened:
            return opened.convert("RGB")
    except Exception as exc:  # a file whose header held and whose data does not
        raise _unreadable(path, exc) from exc


def load_pages(folder: Path | None) -> list[Page]:
    """The bundled pages, or every image in `folder` with its truth; bad input is a usage error.

    Every page's truth and image header is checked before the first page is decoded (a broken last
    page is refused at once); the pixels are decoded one page at a time, when a page is read.
    """
    if folder is None:
        return bundled_pages()
    folder = Path(folder)
    layout_hint = "put NAME.png with NAME.txt (and optionally NAME.lines.json) in the folder"
    if not folder.is_dir():
        raise _bad(f"--pages {folder} is not a folder", layout_hint)
    for entry in sorted(folder.iterdir()):  # a page or truth that is a FIFO or a device is never opened
        if problem := input_files.special_file_problem(entry):
            if not entry.is_dir():
                raise _bad(f"--pages: {problem}", "keep only page images and their truth files there")
    images = sorted(p for p in folder.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file())
    if not images:
        raise _bad(f"--pages {folder} holds no .png, .jpg or .jpeg page", layout_hint)
    if len(images) > MAX_PAGES:
        raise _bad(
            f"--pages {folder} holds {len(images):,} pages, past the {MAX_PAGES:,} one run reads",
            "split the pages into folders of fewer and run once per folder",
        )
    names = [p.stem for p in images]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise _bad(f"--pages: more than one image is named {twice[0]}", "keep one image per page name")
    pages = []
    for path in images:
        truth = path.with_suffix(".txt")
        if not truth.is_file():
            raise _bad(f"--pages: {path.name} has no {truth.name} beside it", layout_hint)
        text = _read_text(truth).strip()
        if not text:
            raise _bad(f"--pages: {truth} is empty", "write the page's text into it")
        size = read_image_header(path)
        lines_path = folder / f"{path.stem}.lines.json"
        lines = _read_lines(lines_path, size) if lines_path.is_file() else []
        text2d_path = folder / f"{path.stem}.text2d.txt"
        if text2d_path.is_file():
            text2d, text2d_source = _read_text(text2d_path).strip("\n"), text2d_path.name
        elif lines:
            text2d, text2d_source = layout_text2d(lines), f"{lines_path.name} (laid out)"
        else:
            text2d, text2d_source = text, truth.name
        pages.append(
            Page(
                name=path.stem,
                text=text,
                text2d=text2d,
                lines=lines,
                source=str(path),
                text2d_source=text2d_source,
                size=size,
                path=path,
            )
        )
    return pages


def write_pages(pages: list[Page], folder: Path) -> list[Path]:
    """Write pages as a `--pages` folder (NAME.png, NAME.txt, NAME.lines.json, NAME.text2d.txt)."""
    from pto_patch.patching.fileio import atomic_write_bytes, make_dirs

    folder = Path(folder)
    make_dirs(folder)
    written = []
    for page in pages:
        png = io.BytesIO()
        page.image.save(png, format="PNG")
        files = {
            f"{page.name}.png": png.getvalue(),
            f"{page.name}.txt": page.text.encode() + b"\n",
            f"{page.name}.text2d.txt": page.text2d.encode() + b"\n",
        }
        if page.lines:
            files[f"{page.name}.lines.json"] = json.dumps(
                [ln.to_json() for ln in page.lines], indent=1
            ).encode()
        for name, data in files.items():
            atomic_write_bytes(folder / name, data, mode=0o644)
            written.append(folder / name)
    return written
