"""Gradients where TorchScript's autodiff formulas are not eager's (`eager_gradients.py`): a max
of tied operands, clamp's tensor bounds, hardtanh's and threshold's boundaries, softplus at its
threshold, pow's exponent at 0 ** 0. Through `nncfuse.jit`, fused (the op between others, in a
differentiable graph's place) and alone (the unfused program), each call like eager's."""

import pytest
import torch
import torch.nn.functional as F

import nncfuse
from nncfuse.jit.training.eager_gradients import hide, restore

X = [-6.0, -3.0, -1.0, -0.5, -0.0, 0.0, 0.5, 1.0, 3.0, 6.0, 2.0, float("inf"), float("-inf"),
     float("nan")]
Y = [-6.0, -2.0, -1.0, -0.5, 0.0, -0.0, 0.25, 1.0, 3.0, 7.0, 2.0, 1.0, -1.0, 0.0]

#: each op on (a, b), the values at the ties and boundaries above
OPS = {
    "max": "torch.max({a}, {b})",
    "min": "torch.min({a}, {b})",
    "maximum": "torch.maximum({a}, {b})",
    "max_of_itself": "torch.max({a}, {a})",
    "clamp_tensors": "torch.clamp({a}, {b}, {b} + 1.0)",
    "clamp_min_tensor": "torch.clamp_min({a}, {b})",
    "hardtanh": "F.hardtanh({a}, -1.0, 1.0)",
    "threshold": "F.threshold({a}, 0.5, 2.0)",
    "softplus": "F.softplus({a}, 2.0, 1.0)",
    "pow_tensors": "torch.pow({a}, {b})",
}


def _function(expr, fused):
    """f(x, y, o): the op on x * o and y * o (o ones: exact), between two ops that fuse with it
    (`fused`), or alone."""
    body = expr.format(a="(x * o)", b="(y * o)")
    body = f"(({body}) * o).sin()" if fused else body
    source = f"def f(x: torch.Tensor, y: torch.Tensor, o: torch.Tensor):\n    return {body}\n"
    scope = {"torch": torch, "F": F}
    exec(source, scope)  # noqa: S102 - the test's own source
    return scope["f"], torch.jit.CompilationUnit(source).f


def _grads(fn, weights):
    x = torch.tensor(X, requires_grad=True)
    y = torch.tensor(Y, requires_grad=True)
    out = fn(x, y, torch.ones(len(X)))
    gx, gy = torch.autograd.grad((out * weights).sum(), (x, y), allow_unused=True)
    return [torch.zeros(len(X)) if g is None else g for g in (gx, gy)]


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "alone"])
@pytest.mark.parametrize("name", list(OPS))
def test_gradients_are_eagers_where_torchscripts_formula_differs(name, fused):
    eager, script = _function(OPS[name], fused)
    weights = torch.linspace(-2.0, 3.0, len(X))
    want = _grads(eager, weights)
    fn = nncfuse.jit(script, min_group_size=1)
    for _ in range(3):  # profiled, then optimized (twice)
        got = _grads(fn, weights)
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, equal_nan=True)


def test_hide_and_restore_give_back_the_same_ops():
    graph = torch._C.parse_ir("""
        graph(%x : Float(4, requires_grad=1), %y : Float(4, requires_grad=1)):
          %lo : float = prim::Constant[value=-1.]()
          %hi : float = prim::Constant[value=1.]()
          %a : Tensor = aten::max(%x, %y)
          %b : Tensor = aten::hardtanh(%a, %lo, %hi)
          %c : Tensor = aten::clamp(%b, %x, %y)
          %d : Tensor = aten::sin(%c)
          return (%d)""")
    before = [n.kind() for n in graph.nodes() if n.kind() != "prim::Constant"]
    assert hide(graph) == 3
    hidden = [n.kind() for n in graph.nodes() if n.kind() != "prim::Constant"]
    assert "aten::max" not in hidden and "aten::sin" in hidden
    assert restore(graph) == 3
    assert [n.kind() for n in graph.nodes() if n.kind() != "prim::Constant"] == before
