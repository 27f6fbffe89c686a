"""How long a first call takes in a fresh process: profile (or type) + fuse + compile + run.

    python examples/first_call.py
"""

import time

import torch

import nncfuse


def seed(x):
    y = torch.mul(x, x)
    z = torch.sin(y)
    return torch.mul(z, z)


def gelu_tanh(x):
    return 0.5 * x * (1 + torch.tanh(0.7978845608 * (x + 0.044715 * x**3)))


def bias_relu_residual(x, b, r):
    return torch.relu(x + b) + r


if __name__ == "__main__":
    x = torch.randn(1024, 1024)
    for fn, args in [(seed, (x,)), (gelu_tanh, (x,)), (bias_relu_residual, (x, x[0], x))]:
        fused = nncfuse.jit(fn)
        start = time.perf_counter()
        fused(*args)
        first = time.perf_counter() - start
        start = time.perf_counter()
        fused(*args)
        second = time.perf_counter() - start
        torch.testing.assert_close(fused(*args), fn(*args))
        print(f"{fn.__name__:20s} first call {first * 1e3:6.1f} ms, second {second * 1e3:6.2f} ms")
