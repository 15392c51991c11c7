"""The backends, one module per way of computing the ops: `reference` (the eager torch math, as
transformers writes it), `fused` (fewer, fused torch ops), `npu` (torch_npu's fused ops) and the PyPTO
kernels (`pypto`: the entries the dispatcher calls; `pypto_runtime`: the jit, the kernel cache and the
launch every PyPTO kernel uses; `pypto_ops`: the reference's three ops; `pypto_pieces`: the in-kernel pieces
the kernels share; `pypto_blocks`: the decoder-layer blocks; `pypto_prologue`: the attention prologue's, the
static KV cache's write among them; `pypto_attention`: the attention core; `pypto_device`: PyPTO's
pre-flight on an NPU).

A backend imports other backends and the tile tables (`..tiling`), never what picks, counts or declares the
backends (`.._dispatch`, `..ops`, `..serving_ops`, `..tuning`, the package's face): tests/test_layering.py
checks it. Importing this package imports none of them; the dispatcher imports each on first use.
"""
