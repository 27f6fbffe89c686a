"""A program whose output is a transposed view of a value it computes: its gradient was traced
transposed (as the output), and the backward graph's `view` of it needs that layout; given
contiguous (as `_Fused` made every gradient) or in any other layout, the backward raised
'view size is not compatible with input tensor's size and stride'."""

import pytest
import torch

import nncfuse
import nncfuse.backend  # noqa: F401 - registers the backend


def heads(x, w):
    """Llama's q: a GEMM's output as (batch, heads, seq, dim), scaled."""
    return (x @ w).view(1, 8, 2, 16).transpose(1, 2) * 2.0


def _inputs(dtype=torch.float32):
    torch.manual_seed(0)
    return (torch.randn(8, 32, dtype=dtype, requires_grad=True),
            torch.randn(32, 32, dtype=dtype, requires_grad=True))


def _compiled(how):
    if how == "jit":
        return nncfuse.jit(heads)
    torch._dynamo.reset()
    return torch.compile(heads, backend="nncfuse")


@pytest.mark.parametrize("how", ["jit", "backend"])
@pytest.mark.parametrize("layout", ["contiguous", "as the output", "permuted"])
def test_gradients_in_any_layout(how, layout):
    f = _compiled(how)
    x, w = _inputs()
    for _ in range(3):
        out = f(x, w)
    upstream = torch.randn(out.shape)
    if layout == "as the output":
        upstream = torch.empty_like(out).copy_(upstream)
    elif layout == "permuted":
        upstream = upstream.permute(3, 2, 1, 0).contiguous().permute(3, 2, 1, 0)
    got = torch.autograd.grad(out, (x, w), upstream)
    want = torch.autograd.grad(heads(x, w), (x, w), upstream)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)
    torch._dynamo.reset()


@pytest.mark.parametrize("how", ["jit", "backend"])
def test_gradcheck(how):
    assert torch.autograd.gradcheck(_compiled(how), _inputs(torch.float64))
    torch._dynamo.reset()


def test_a_gradient_in_the_traced_layout_is_not_copied():
    """Strides of dims of size 1 do not change what a view sees: such a gradient is passed as
    it is (a copy per backward would cost a step a pass over every such gradient)."""
    from nncfuse.jit.training.autograd import _as_traced

    g = torch.randn(4, 1, 8).transpose(0, 1)  # shape (1, 4, 8), strides (8, 8, 1)
    assert _as_traced(g, (1, 4, 8), torch.float32, (32, 8, 1)) is g
    moved = _as_traced(g.transpose(1, 2), (1, 8, 4), torch.float32, (32, 4, 1))
    assert moved.stride() == (32, 4, 1) and torch.equal(moved, g.transpose(1, 2))
    assert torch.equal(_as_traced(None, (2, 3), torch.float32, (1, 2)), torch.zeros(2, 3))
