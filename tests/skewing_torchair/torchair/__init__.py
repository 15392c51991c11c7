"""A stand-in torchair whose graphs go wrong on replay: a fault a graph baseline and a graph PTO run share.

Put `tests/skewing_torchair` first on PYTHONPATH, as tests/counting_torchair is put. It is the counting
stand-in (tests/counting_torchair/torchair/__init__.py, loaded from that file, so it mirrors the same torchair:
github Ascend/torchair commit fced884, `python/torchair/npu_fx_compiler.py` `get_npu_backend` and
`python/torchair/_acl_concrete_graph/acl_graph.py`'s capture on the first call of each input-shape key, and
torch-npu 2.13.0's `npugraph_ex` backend under `COUNTING_TORCHAIR_NPUGRAPH_EX=1`), refusing what it refuses,
counting and logging what it counts, with one fault added: from its third call on (the capture, one replay,
then every later replay) each graph adds `SKEWING_TORCHAIR_BIAS` (default 1000) to token
`SKEWING_TORCHAIR_TOKEN`'s (default 0) logit in its logits output, so greedy decode picks that token from the
third step it serves on. The logits output is read as the graph's 3-d floating output with the widest last
dimension (the vocabulary; a decoder's other outputs are 4-d caches or narrower). Real torchair has no such
fault: it stands for a capture or replay bug (a stale buffer, a wrong address) that is the mode's own, so a
judge that compares the graph run only with another graph run cannot see it.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

_COUNTING = Path(__file__).resolve().parents[2] / "counting_torchair" / "torchair" / "__init__.py"
_spec = importlib.util.spec_from_file_location("_counting_torchair", _COUNTING)
_counting = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_counting)

CompilerConfig = _counting.CompilerConfig
get_npu_backend = _counting.get_npu_backend
__all__ = ["CompilerConfig", "get_npu_backend"]

SKEWED_FROM_CALL = 3


def _skewed(outputs, token: int, bias: float):
    import torch

    logits = [o for o in outputs if isinstance(o, torch.Tensor) and o.is_floating_point() and o.dim() == 3]
    if not logits:
        return outputs
    widest = max(o.shape[-1] for o in logits)
    chosen = {id(o) for o in logits if o.shape[-1] == widest}

    def skew(output):
        if id(output) not in chosen:
            return output
        shifted = output.clone()
        shifted[..., token] += bias
        return shifted

    return type(outputs)(skew(o) for o in outputs) if isinstance(outputs, (tuple, list)) else skew(outputs)


def _skewing(acl_graph):
    def compile_graph(gm, example_inputs, settings):
        run = acl_graph(gm, example_inputs, settings)
        calls = 0

        def replay(*args):
            nonlocal calls
            calls += 1
            outputs = run(*args)
            if calls < SKEWED_FROM_CALL:
                return outputs
            token = int(os.environ.get("SKEWING_TORCHAIR_TOKEN", "0"))
            bias = float(os.environ.get("SKEWING_TORCHAIR_BIAS", "1000"))
            return _skewed(outputs, token, bias)

        return replay

    return compile_graph


_counting._acl_graph = _skewing(_counting._acl_graph)  # get_npu_backend and npugraph_ex look it up per call
