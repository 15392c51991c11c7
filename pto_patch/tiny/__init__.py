"""The offline tiny models (`make-tiny`, the demo, the tests): a folder of the spec's architecture at
small widths, with random weights, a tokenizer and a processor, built with nothing fetched (`model`; its
parts `tokenizer`, `processor`, and Qwen3-VL's layout in `qwen3_vl`). Imports `patching` (the patch
state) and `model`.
"""
