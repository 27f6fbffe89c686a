"""How long a first call takes in a fresh process: profile (or type) + fuse + compile + run.

    python examples/first_call.py

The functions are three of the benchmark suite's workloads (benchmarks/workloads.py).
"""

import sys
import time
from pathlib import Path

import torch

import nncfuse

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from workloads import bias_relu_residual, gelu_tanh, seed_chain  # noqa: E402

if __name__ == "__main__":
    x = torch.randn(1024, 1024)
    for fn, args in [(seed_chain, (x,)), (gelu_tanh, (x,)), (bias_relu_residual, (x, x[0], x))]:
        fused = nncfuse.jit(fn)
        start = time.perf_counter()
        fused(*args)
        first = time.perf_counter() - start
        start = time.perf_counter()
        fused(*args)
        second = time.perf_counter() - start
        torch.testing.assert_close(fused(*args), fn(*args))
        print(f"{fn.__name__:20s} first call {first * 1e3:6.1f} ms, second {second * 1e3:6.2f} ms")
