"""pto-patch: inject fused PyPTO kernels into Qwen2.5-VL and Qwen3-VL modeling code, verifiably and reversibly."""

__version__ = "0.1.0"
