"""A torch.compile backend whose graphs go wrong from their third call: a fault a compiled baseline and a
compiled PTO run share, which a verify comparing the two with each other cannot see.

It runs each traced graph as it is (what torch's own `eager` backend does, torch/_dynamo/backends/
debugging.py in torch 2.13.0), and from each graph's third call on adds a bias to token 0's logit in its
logits output, with the skew of the skewing torchair stand-in (tests/skewing_torchair, loaded from its
file): the prefill and the first two decode steps are right, greedy decode then picks token 0. No real
backend does this on purpose; it stands for a compiler fault (a miscompiled fusion, a stale buffer).
`register()` makes it `--backend pto_test_skewing` in this process.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

NAME = "pto_test_skewing"
SKEWED_FROM_CALL = 3
_SKEWING_TORCHAIR = Path(__file__).resolve().parents[1] / "skewing_torchair" / "torchair" / "__init__.py"


def _skew():
    spec = importlib.util.spec_from_file_location("_skewing_torchair", _SKEWING_TORCHAIR)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module._skewed


def register(token: int = 0, bias: float = 1000.0) -> None:
    from torch._dynamo import register_backend

    skewed = _skew()

    def backend(gm, example_inputs):
        calls = 0

        def run(*args):
            nonlocal calls
            calls += 1
            outputs = gm.forward(*args)
            return outputs if calls < SKEWED_FROM_CALL else skewed(outputs, token, bias)

        return run

    register_backend(backend, name=NAME)
