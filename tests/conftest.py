import os
from pathlib import Path

import pytest
import torch

# Subprocesses the tests start import this checkout's nncfuse, not whichever one is installed.
_ROOT = str(Path(__file__).resolve().parents[1])
os.environ["PYTHONPATH"] = os.pathsep.join(
    [_ROOT, *[p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]])


@pytest.fixture(autouse=True)
def _seed_and_env(monkeypatch):
    """Deterministic inputs; no log or switches leaking in from the environment, except
    that the IR is verified after every schedule pass."""
    torch.manual_seed(0)
    for name in ("NNCFUSE_LOG_LEVEL", "NNCFUSE_DONT_USE_LLVM", "NNCFUSE_DISABLE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NNCFUSE_VERIFY", "1")
    yield


def slow_sample(n_full: int) -> int:
    """How many cases a slow sweep runs: all locally, NNCFUSE_SLOW_SAMPLE in CI."""
    return int(os.environ.get("NNCFUSE_SLOW_SAMPLE", n_full))
