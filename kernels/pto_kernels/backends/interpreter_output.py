"""What PyPTO's CPU interpreter prints, kept out of a run's output.

Each interpreted call prints a cost-model report on stdout, and pypto 0.2.0's simulation library then
starts `python3 pypto/lib/scripts/draw_pipe_swim_lane.py` to draw the pipes' swim lanes, which imports
matplotlib (no dependency of pypto's): without it every call adds a ModuleNotFoundError traceback to
stderr (12 of them in `doctor --pypto`). While a kernel runs on the CPU, stdout goes nowhere and stderr
to a file; afterwards whatever else reached stderr is passed on, only those drawing tracebacks are
dropped. `PTO_KERNELS_VERBOSE=1` shows everything.
"""

import contextlib
import os
import re
import sys
import tempfile

# A traceback from one of pypto's own drawing scripts that could not import matplotlib.
_DRAWING_TRACEBACK = re.compile(
    r"Traceback \(most recent call last\):\n"
    r"(?:  File \"[^\"\n]*pypto/lib/scripts/[^\"\n]*\.py\".*\n(?:    .*\n)*)+"
    r"ModuleNotFoundError: No module named 'matplotlib[^\n]*'\n"
)


def without_drawing_tracebacks(text: str) -> str:
    return _DRAWING_TRACEBACK.sub("", text)


@contextlib.contextmanager
def quiet_interpreter(device_type: str):
    if device_type != "cpu" or os.environ.get("PTO_KERNELS_VERBOSE"):
        yield
        return
    sys.stdout.flush()
    sys.stderr.flush()
    saved_out, saved_err = os.dup(1), os.dup(2)
    with open(os.devnull, "w") as devnull, tempfile.TemporaryFile() as caught:
        os.dup2(devnull.fileno(), 1)
        os.dup2(caught.fileno(), 2)
        try:
            yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved_out, 1)
            os.dup2(saved_err, 2)
            os.close(saved_out)
            os.close(saved_err)
            caught.seek(0)
            rest = without_drawing_tracebacks(caught.read().decode("utf-8", "replace"))
            if rest:
                sys.stderr.write(rest)
                sys.stderr.flush()
