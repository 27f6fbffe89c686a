"""`explicit_promotions`: an op's promotion of floating operands written out as casts before it
(so that autodiff's gradients keep each operand's dtype), and ops that mix dtypes otherwise
refused."""

import pytest
import torch

from nncfuse.jit.training.promotions import explicit_promotions


def _graph(body: str, b: str = "BFloat16(4, strides=[1], requires_grad=1, device=cpu)"):
    return torch._C.parse_ir(f"""
        graph(%a : Float(4, strides=[1], requires_grad=1, device=cpu), %b : {b}):
          %one : int = prim::Constant[value=1]()
          {body}
          return (%y)""")


def test_a_promoted_operand_is_cast_to_the_result_dtype_first():
    graph = _graph("%y : Float(4, strides=[1], requires_grad=1, device=cpu) = "
                   "aten::add(%a, %b, %one)")
    explicit_promotions(graph)
    add = graph.findNode("aten::add")
    cast = add.inputsAt(1).node()
    assert cast.kind() == "aten::_autocast_to_full_precision"
    assert cast.inputsAt(0).debugName() == "b"
    assert add.inputsAt(1).type().dtype() == torch.float32
    assert add.inputsAt(0).debugName() == "a"  # (already the result's dtype)


def test_operands_of_one_dtype_are_left_alone():
    graph = _graph("%y : Float(4, strides=[1], requires_grad=1, device=cpu) = "
                   "aten::mul(%a, %b)", b="Float(4, strides=[1], requires_grad=1, device=cpu)")
    before = str(graph)
    explicit_promotions(graph)
    assert str(graph) == before


def test_a_norm_of_a_reduced_input_computes_in_float32():
    # A layer norm of a bfloat16 input with float32 weights gives bfloat16 in eager.
    graph = _graph("""%s : int[] = prim::Constant[value=[4]]()
          %eps : float = prim::Constant[value=1e-05]()
          %on : bool = prim::Constant[value=1]()
          %y : BFloat16(4, strides=[1], requires_grad=1, device=cpu) = """ + (
        "aten::layer_norm(%b, %s, %a, %a, %eps, %on)"))
    explicit_promotions(graph)
    norm = graph.findNode("aten::layer_norm")
    assert norm.inputsAt(0).node().kind() == "aten::_autocast_to_full_precision"
    assert norm.output().type().dtype() == torch.float32
    (use,) = norm.output().uses()
    assert use.user.kind() == "aten::_autocast_to_reduced_precision"
    assert use.user.output().type().dtype() == torch.bfloat16
    assert graph.return_node().inputsAt(0) == use.user.output()
    graph.lint()


def test_an_op_mixing_dtypes_otherwise_is_refused_where_grad_is_needed():
    body = """%d : int[] = prim::Constant[value=[0]]()
          %off : bool = prim::Constant[value=0]()
          %f : int = prim::Constant[value=6]()
          %y : Float(requires_grad=1, device=cpu) = aten::sum(%b, %d, %off, %f)"""
    with pytest.raises(ValueError, match="mixes floating dtypes"):
        explicit_promotions(_graph(body))
    # Nothing requires grad: nothing to refuse.
    graph = torch._C.parse_ir(str(_graph(body)).replace("requires_grad=1", "requires_grad=0"))
    explicit_promotions(graph)


def test_an_in_place_op_is_left_alone():
    # A float16 input written in place with a float32 0-dim value: eager writes the input
    # (in its own dtype), which then requires grad. A cast's copy written instead would leave
    # the input as it was.
    graph = torch._C.parse_ir("""
        graph(%x : Half(7, strides=[1], requires_grad=0, device=cpu),
              %s : Float(requires_grad=1, device=cpu)):
          %one : int = prim::Constant[value=1]()
          %y : Half(7, strides=[1], requires_grad=1, device=cpu) = aten::add_(%x, %s, %one)
          return (%y)""")
    before = str(graph)
    explicit_promotions(graph)
    assert str(graph) == before


def written_with_a_wider_value(x, s):
    before = 3 - x
    x.add_(s)
    return before, x.sum(-1, keepdim=True)


def test_an_input_written_in_place_under_autograd_is_written_as_eagers():
    import nncfuse

    fused = nncfuse.jit(written_with_a_wider_value, min_group_size=1)
    for _ in range(4):
        x0, s0 = torch.randn(7).half(), torch.randn(())
        x, s = x0.clone(), s0.clone().requires_grad_()
        got = fused(x, s)
        xe, se = x0.clone(), s0.clone().requires_grad_()
        want = written_with_a_wider_value(xe, se)
        assert torch.equal(x, xe) and x.requires_grad and not torch.equal(x, x0)
        torch.testing.assert_close(got, want)
        torch.testing.assert_close(torch.autograd.grad(got[1].sum(), (x, s)),
                                   torch.autograd.grad(want[1].sum(), (xe, se)))
