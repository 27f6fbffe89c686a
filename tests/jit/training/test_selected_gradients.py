"""jit/training/selected_gradients.py: where's gradient selected as eager's, not multiplied."""

import pytest
import torch

import nncfuse
from nncfuse.jit.training.selected_gradients import select_masked_gradients
from tests.jit.training.test_autodiff import _groups


def where_then_sqrt(cond, a, b):
    return torch.sqrt(torch.where(cond, a, b)) * 3.0


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_gradient_the_condition_drops_is_zero_even_where_it_is_nan(dtype):
    # sqrt's gradient at 0 is 0 / 0 = NaN for the selected operand there; the other operand's
    # gradient at that element is where's: eager's 0, not NaN * 0.
    fused = nncfuse.jit(where_then_sqrt, autograd="autodiff", min_group_size=1)
    cond = torch.tensor([True, False, True, False, True, False])
    a0 = torch.tensor([0.0, 4.0, 2.0, 0.0, -1.0, 9.0], dtype=dtype)
    b0 = torch.tensor([1.0, 0.0, 0.0, 3.0, 5.0, -2.0], dtype=dtype)
    for _ in range(4):
        a, b = (t.clone().requires_grad_() for t in (a0, b0))
        got = torch.autograd.grad(fused(cond, a, b).sum(), (a, b))
        a, b = (t.clone().requires_grad_() for t in (a0, b0))
        want = torch.autograd.grad(where_then_sqrt(cond, a, b).sum(), (a, b))
        torch.testing.assert_close(got, want, equal_nan=True)
    assert not got[0][1].isnan() and not got[1][0].isnan()  # (the dropped elements: 0)
    assert _groups(fused)[1] > 0  # (the backward still fused)


def test_gradients_of_ordinary_values_are_unchanged():
    fused = nncfuse.jit(where_then_sqrt, autograd="autodiff", min_group_size=1)
    for _ in range(4):
        cond = torch.rand(5, 7) > 0.5
        a, b = (torch.rand(5, 7, dtype=torch.float64, requires_grad=True) + 0.1
                for _ in range(2))
        got = torch.autograd.grad(fused(cond, a, b).sum(), (a, b))
        want = torch.autograd.grad(where_then_sqrt(cond, a, b).sum(), (a, b))
        torch.testing.assert_close(got, want)


def _graph(mask_type):
    return torch._C.parse_ir(f"""graph(%g : Float(4, strides=[1], requires_grad=0, device=cpu),
      %c : {mask_type}(4, strides=[1], requires_grad=0, device=cpu)):
  %m : Float(4, strides=[1], requires_grad=0, device=cpu) = aten::type_as(%c, %g)
  %d : Float(4, strides=[1], requires_grad=0, device=cpu) = aten::mul(%g, %m)
  return (%d)""")


def test_the_rewrite_selects_a_bool_mask_and_leaves_a_float_one():
    graph = _graph("Bool")
    assert select_masked_gradients(graph) == 1
    assert [n.kind() for n in graph.nodes() if n.kind() != "prim::Constant"] == ["aten::where"]
    fn = torch._C._create_function_from_graph("selected", graph)
    g = torch.tensor([float("inf"), float("nan"), -2.0, 3.0])
    c = torch.tensor([False, False, True, True])
    assert torch.equal(fn(g, c), torch.tensor([0.0, 0.0, -2.0, 3.0]))
    kept = _graph("Float")  # (a mask of numbers, dropout's: eager multiplies too)
    assert select_masked_gradients(kept) == 0
    assert "aten::mul" in str(kept)



def sqrt_relu(x):
    return torch.sqrt(torch.relu(x))


def test_a_mask_computed_from_a_value_keeps_torchscripts_product():
    # relu's mask is 0 at a NaN input, where eager's gradient passes on: the product passes a
    # NaN gradient on there (as eager's), where a select would give 0. (An infinite
    # gradient at a masked element, sqrt's at relu's zeros, is still NaN: `eager_gradients`.)
    fused = nncfuse.jit(sqrt_relu, autograd="autodiff", min_group_size=1)
    x0 = torch.tensor([float("nan"), 4.0, 0.25, 9.0])
    for _ in range(4):
        x = x0.clone().requires_grad_()
        got = torch.autograd.grad(fused(x).sum(), x)[0]
        xe = x0.clone().requires_grad_()
        want = torch.autograd.grad(sqrt_relu(xe).sum(), xe)[0]
        torch.testing.assert_close(got, want, equal_nan=True)
    assert want[0].isnan()
    assert _groups(fused)[1] > 0
