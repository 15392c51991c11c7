"""Peak memory of `verify --ocr --pages DIR` against the number of pages: flat, since pages are decoded one
at a time (run/ocr/pages.py). Each run is a fresh process; its peak resident set comes from wait4.

    python benchmarks/bench_ocr_memory.py --pages 1,300,3000 [--json FILE]

Pages are letter size (1232 x 1596, the bundled prose page, 5.9 MB as RGB), so a run that held every
page decoded would grow by that much a page. The tiny model (make-tiny, patched) reads them; each page
is read with the three tasks in both modes, two new tokens each.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def write_pages(folder: Path, count: int, template: Path) -> None:
    folder.mkdir(parents=True)
    for index in range(count):
        name = f"page{index:05d}"
        os.link(template / "prose.png", folder / f"{name}.png")
        shutil.copyfile(template / "prose.txt", folder / f"{name}.txt")


def peak_rss_mb(args: list[str]) -> tuple[float, float, int]:
    """(peak resident MB, seconds, exit code) of one pto-patch process."""
    started = time.perf_counter()
    process = subprocess.Popen(
        [sys.executable, "-m", "pto_patch", *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    return usage.ru_maxrss / 1024, time.perf_counter() - started, process.returncode


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pages", default="1,300,3000")
    parser.add_argument("--json", type=Path)
    options = parser.parse_args()
    from pto_patch.patching import engine
    from pto_patch.run.ocr.pages import bundled_pages
    from pto_patch.run.ocr.pages import write_pages as write_bundled
    from pto_patch.tiny.model import make_tiny

    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        model = scratch / "tiny"
        make_tiny(model)
        engine.apply_patch(model_path=model)
        template = scratch / "template"
        write_bundled([page for page in bundled_pages() if page.name == "prose"], template)
        for count in [int(n) for n in options.pages.split(",")]:
            folder = scratch / f"pages-{count}"
            write_pages(folder, count, template)
            args = ["verify", "--model-path", str(model), "--ocr", "--pages", str(folder)]
            args += [
                "--output_length",
                "2",
                "--dtype",
                "fp32",
                "--report-file",
                str(scratch / f"r{count}.json"),
            ]
            peak, seconds, code = peak_rss_mb(args)
            rows.append(
                {"pages": count, "peak_rss_mb": round(peak, 1), "seconds": round(seconds, 1), "exit": code}
            )
            print(f"{count:6d} pages: peak RSS {peak:8.1f} MB, {seconds:7.1f} s, exit {code}", flush=True)
            shutil.rmtree(folder)
    first = rows[0]["peak_rss_mb"]
    for row in rows[1:]:
        print(f"{row['pages']} pages over {rows[0]['pages']}: +{row['peak_rss_mb'] - first:.1f} MB")
    if options.json:
        options.json.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
