"""jit/specialize/decompose.py: the rules AOTAutograd traces with, against the ATen ops they
replace, and
the gradients of programs whose backward graphs they change (backend and nncfuse.jit)."""

import copy
import warnings

import pytest
import torch

import nncfuse
from nncfuse.jit.specialize.decompose import _select_backward, _slice_backward, decompositions

aten = torch.ops.aten
BIG = 9223372036854775807  # a slice's open end, as Python's x[a:] traces


@pytest.mark.parametrize("sizes, dim, start, end", [
    ((3, 8), 1, 0, 4), ((3, 8), 1, 4, BIG), ((3, 8), -1, -3, -1), ((3, 8), 0, 1, 2),
    ((2, 3, 8), 1, -100, 100), ((3, 8), 1, 5, 2), ((3, 8), 1, 8, BIG), ((4,), 0, 1, 3),
])
def test_slice_backward_is_atens(sizes, dim, start, end):
    """Negative, clamped, empty and open-ended slices: the same tensor as ATen's, -0.0 kept."""
    grad = torch.randn(aten.slice(torch.empty(sizes), dim, start, end).shape)
    grad.view(-1)[:1] = -0.0
    want = aten.slice_backward(grad, sizes, dim, start, end, 1)
    got = _slice_backward(grad, sizes, dim, start, end, 1)
    assert got.shape == want.shape and got.stride() == want.stride()
    assert torch.equal(got, want) and torch.equal(got.signbit(), want.signbit())


@pytest.mark.parametrize("sizes, dim, index", [((3, 8), 1, 0), ((3, 8), 1, -1), ((3, 8), 0, 2),
                                               ((2, 3, 8), -2, 1), ((5,), 0, 4)])
def test_select_backward_is_atens(sizes, dim, index):
    grad = torch.randn(torch.empty(sizes).select(dim, index).shape)
    want = aten.select_backward(grad, sizes, dim, index)
    got = _select_backward(grad, sizes, dim, index)
    assert got.shape == want.shape and torch.equal(got, want)


def test_what_a_pad_cannot_say_stays_the_aten_op():
    """A step, a gradient copy_ would broadcast, an index out of range: NotImplemented, which
    makes the tracer keep the ATen op."""
    assert _slice_backward(torch.randn(3, 4), (3, 8), 1, 0, 8, 2) is NotImplemented
    assert _slice_backward(torch.randn(3, 1), (3, 8), 1, 0, 4, 1) is NotImplemented
    assert _select_backward(torch.randn(3), (3, 8), 1, 8) is NotImplemented
    assert decompositions()[aten.slice_backward.default] is _slice_backward


def rotary(x, cos, sin):
    """Llama's rotary embedding: halves sliced, one negated, concatenated."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return (x * cos + rotated * sin)[:, 1:] + x.select(1, 0).unsqueeze(1)


def _inputs(dtype=torch.float32):
    torch.manual_seed(0)
    x = torch.randn(2, 5, 16, dtype=dtype, requires_grad=True)
    return x, torch.randn(5, 16, dtype=dtype).cos(), torch.randn(5, 16, dtype=dtype).sin()


def _unfused_kinds(graphs):
    return {n.kind() for g in graphs for n in g.nodes()}  # top level: outside the groups


def test_backend_rotary_gradient_fuses_its_slices_backward():
    import nncfuse.backend as backend

    torch._dynamo.reset()
    backend.clear_compiled_graphs()
    x, cos, sin = _inputs()
    weights = torch.randn(2, 4, 16)
    compiled = torch.compile(rotary, backend="nncfuse")
    for _ in range(2):
        x.grad = None
        (compiled(x, cos, sin) * weights).sum().backward()
        got = x.grad.clone()
    x.grad = None
    (rotary(x, cos, sin) * weights).sum().backward()
    torch.testing.assert_close(got, x.grad)
    (forward, backward) = backend.compiled_graphs()
    assert backward.reason is None
    outside = _unfused_kinds(backward.graphs())
    assert not outside & {"aten::slice_backward", "aten::select_backward", "aten::zeros",
                          "aten::constant_pad_nd"}, outside
    assert nncfuse.fusion_groups(backward.graphs()[0])
    torch._dynamo.reset()


def test_backend_gradcheck_through_slices_and_select():
    import nncfuse.backend  # noqa: F401 - registers the backend

    torch._dynamo.reset()
    x, cos, sin = _inputs(torch.float64)
    assert torch.autograd.gradcheck(torch.compile(rotary, backend="nncfuse"), (x, cos, sin))
    torch._dynamo.reset()


def test_backend_dynamic_sizes_keep_atens_slice_backward():
    """Symbolic sizes: the rule declines (NotImplemented); the gradients are still eager's."""
    import nncfuse.backend  # noqa: F401

    torch._dynamo.reset()
    compiled = torch.compile(rotary, backend="nncfuse", dynamic=True)
    for n in (5, 7):
        torch.manual_seed(n)
        x = torch.randn(2, n, 16, requires_grad=True)
        cos, sin = torch.randn(n, 16), torch.randn(n, 16)
        compiled(x, cos, sin).sum().backward()
        got, x.grad = x.grad, None
        rotary(x, cos, sin).sum().backward()
        torch.testing.assert_close(got, x.grad)
    torch._dynamo.reset()


class Rotary(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(16, 16)

    def forward(self, x, cos, sin):
        return rotary(self.proj(x), cos, sin)


def test_jit_rotary_module_gradients_match_eager():
    x, cos, sin = _inputs()
    x = x.detach()
    model = Rotary()
    reference = copy.deepcopy(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fused = nncfuse.jit(torch.jit.trace(model, (x, cos, sin)))
    for _ in range(3):
        model.zero_grad()
        fused(x, cos, sin).square().sum().backward()
    reference(x, cos, sin).square().sum().backward()
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, q.grad)
