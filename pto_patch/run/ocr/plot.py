"""`bench --ocr --plot FILE`: a PNG of where each page's time goes, one stacked bar per page, batch and mode.

Drawn with Pillow and its bundled font (no matplotlib, no system font). The bars share one time
axis, so the modes' lengths compare directly; each segment is vision, prefill or decode.
"""

from __future__ import annotations

import io
from pathlib import Path

PARTS = (("vision", (66, 133, 244)), ("prefill", (251, 188, 5)), ("decode", (52, 168, 83)))
WIDTH = 1000
LABEL_WIDTH = 260
ROW = 34
BAR = 22
TOP = 70
BOTTOM = 80
RIGHT = 110


def draw_time_plot(runs):
    """The picture (a PIL image) of `runs` (PageRun)."""
    from PIL import Image, ImageDraw, ImageFont

    font = ImageFont.load_default(size=15)
    title_font = ImageFont.load_default(size=18)
    height = TOP + ROW * max(len(runs), 1) + BOTTOM
    image = Image.new("RGB", (WIDTH, height), "white")
    draw = ImageDraw.Draw(image)
    draw.text((16, 14), "Where a page's time goes (median of the timed runs)", fill="black", font=title_font)
    x = 16
    for name, colour in PARTS:
        draw.rectangle((x, 44, x + 14, 58), fill=colour)
        draw.text((x + 20, 42), name, fill="black", font=font)
        x += 20 + draw.textlength(name, font=font) + 24
    longest = max((run.latency_s for run in runs), default=0.0) or 1.0
    span = WIDTH - LABEL_WIDTH - RIGHT
    for index, run in enumerate(runs):
        y = TOP + index * ROW
        draw.text((16, y + 3), f"{run.page}  b{run.batch}  {run.mode}", fill="black", font=font)
        left = LABEL_WIDTH
        parts = (run.vision_s, run.prefill_s, run.decode_s)
        if any(part is None for part in parts):
            parts = (None, None, run.latency_s)
        for (_name, colour), seconds in zip(PARTS, parts, strict=True):
            if not seconds:
                continue
            right = left + seconds / longest * span
            draw.rectangle((left, y, max(right, left + 1), y + BAR), fill=colour)
            left = right
        draw.text((left + 6, y + 3), f"{run.latency_s:.2f} s", fill="black", font=font)
    axis_y = TOP + ROW * len(runs) + 8
    draw.line((LABEL_WIDTH, axis_y, LABEL_WIDTH + span, axis_y), fill="black")
    for step in range(5):
        tick = LABEL_WIDTH + span * step / 4
        draw.line((tick, axis_y, tick, axis_y + 5), fill="black")
        draw.text((tick - 12, axis_y + 8), f"{longest * step / 4:.2f}", fill="black", font=font)
    draw.text((LABEL_WIDTH + span / 2 - 28, axis_y + 30), "seconds", fill="black", font=font)
    return image


def write_time_plot(runs, path: Path) -> bool:
    """Write the picture as a PNG, atomically (a reader never sees half a file); False where the write
    failed and it was kept in the cache (run/kept_results)."""
    from pto_patch.run.user_files import write_user_file

    buffer = io.BytesIO()
    draw_time_plot(runs).save(buffer, format="PNG")
    return write_user_file(Path(path), buffer.getvalue(), "--plot")
