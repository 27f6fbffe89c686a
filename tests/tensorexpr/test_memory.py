"""Pure elementwise groups materialize no intermediates: a fused call allocates its outputs only,
so its peak memory is at most eager's (which allocates every intermediate too)."""

import pytest
import torch

import nncfuse
from nncfuse.jit.fuser.runtime import kernel_of


def gelu(x):
    return 0.5 * x * (1 + torch.tanh(0.7978845608 * (x + 0.044715 * x * x * x)))


def shared(a):
    return torch.exp(a) + torch.exp(a + 0.001) + (torch.exp(a + 0.002) + torch.exp(a + 0.003))


def bias(x, b, r):
    return torch.relu(x + b) + r


def chain(x):
    y = x
    for _ in range(5):
        y = torch.lerp(y, y * y, 0.25)
    return y


CASES = [
    (gelu, lambda: (torch.randn(4096),)),
    (shared, lambda: (torch.rand(1000),)),
    (bias, lambda: (torch.randn(64, 32), torch.randn(32), torch.randn(64, 32))),
    (chain, lambda: (torch.randn(333),)),
]


@pytest.mark.parametrize("fn,inputs", CASES, ids=[c[0].__name__ for c in CASES])
def test_no_temporaries(fn, inputs):
    args = inputs()
    f = nncfuse.jit(fn)
    f(*args)
    torch.testing.assert_close(f(*args), fn(*args))
    (group,) = nncfuse.fusion_groups(f.graph_for(*args))
    kernel = kernel_of(group)
    assert "Allocate" not in str(kernel.stmt)
    assert kernel.call.source.count("empty_strided(") == 1  # the output, nothing else
