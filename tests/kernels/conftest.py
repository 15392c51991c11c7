import sys
from pathlib import Path

import pytest

KERNELS_DIR = Path(__file__).resolve().parents[2] / "kernels"
if str(KERNELS_DIR) not in sys.path:
    sys.path.insert(0, str(KERNELS_DIR))


@pytest.fixture(autouse=True)
def _fresh_kernel_state(monkeypatch):
    """Every test starts with switches off, backend auto, zeroed stats and no strict mode."""
    import pto_kernels

    monkeypatch.delenv("PTO_KERNELS_STRICT", raising=False)
    monkeypatch.delenv("PTO_KERNELS_BACKEND", raising=False)
    pto_kernels.disable()
    pto_kernels.enable(ops=(), backend="auto")
    pto_kernels.reset_stats()
    yield
    pto_kernels.disable()
    pto_kernels.enable(ops=(), backend="auto")
