"""What the CPU interpreter prints on stderr: pypto's drawing-script tracebacks dropped, the rest kept."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "kernels"))

from pto_kernels.backends.interpreter_output import without_drawing_tracebacks  # noqa: E402

SCRIPTS = "/venv/lib/python3.11/site-packages/pypto/lib/scripts"
DRAWING = (
    "Traceback (most recent call last):\n"
    f'  File "{SCRIPTS}/draw_pipe_swim_lane.py", line 17, in <module>\n'
    "    import matplotlib\n"
    "ModuleNotFoundError: No module named 'matplotlib'\n"
)


def test_drawing_tracebacks_go_and_everything_else_stays():
    other = (
        "Traceback (most recent call last):\n"
        '  File "/venv/lib/python3.11/site-packages/pypto/frontend/parser/entry.py", line 9, in run\n'
        "    compile()\n"
        "RuntimeError: g++ failed\n"
    )
    elsewhere = DRAWING.replace(SCRIPTS, "/home/me/scripts")  # not pypto's own script: kept
    another_module = DRAWING.replace("'matplotlib'", "'numpy'")
    text = "warning: slow\n" + DRAWING * 12 + other + elsewhere + another_module
    assert without_drawing_tracebacks(text) == "warning: slow\n" + other + elsewhere + another_module
    assert without_drawing_tracebacks(DRAWING.replace("'matplotlib'", "'matplotlib.pyplot'")) == ""
