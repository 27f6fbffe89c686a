"""Eager vs nncfuse on the walkthrough's fused chain (mul, sin, mul), side by side.

    python benchmarks/seed.py

The fusible part of the seed program is timed (conv2d, outside any group,
costs the same either way): eager runs three ATen kernels with two
temporaries; nncfuse runs one kernel, one sweep over memory.
"""

from __future__ import annotations

import torch
from harness import compare, fmt_time

import nncfuse


def chain(b):
    x = torch.mul(b, b)
    y = torch.sin(x)
    return torch.mul(y, y)


def main() -> None:
    fused = nncfuse.jit(chain)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(f"{'shape':>18} {'eager':>11} {'nncfuse':>11} {'speedup':>8}")
    for shape in [(1, 1, 128, 128), (1024, 1024)]:
        b = torch.randn(shape)
        torch.testing.assert_close(fused(b), chain(b))
        t = compare({"eager": lambda: chain(b), "nncfuse": lambda: fused(b)})
        print(f"{str(shape):>18} {fmt_time(t['eager'])} {fmt_time(t['nncfuse'])} "
              f"{t['eager'] / t['nncfuse']:7.2f}x")


if __name__ == "__main__":
    main()
