"""identities: casts to a value's own type and slices of all of it dropped (Llama's RMSNorm
casts and repeat_kv slices), through nncfuse.jit under autograd: eager's results and
gradients, fewer differentiable graphs, and nothing dropped where a reader could tell."""

import copy

import pytest
import torch

import nncfuse
from nncfuse.jit.training.autodiff import AutodiffPlan, _shapes_fixed
from nncfuse.jit.training.identities import drop_identities
from tests.fused import assert_step_as_eager


class Casts(torch.nn.Module):
    """An RMSNorm as Llama's (cast to float32 and back), a whole slice and a half one sized
    from the input's shape (`x.shape[-1] // 2`: a trace's `aten::Int`), a real cast."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(8))
        self.linear = torch.nn.Linear(8, 8)

    def forward(self, x):
        dtype = x.dtype
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
        h = self.weight * h.to(dtype)
        y = self.linear(h)[:, :]
        half = y[..., : y.shape[-1] // 2]
        return (y * 2.0).sum(-1) + half.sum(-1) + x.to(torch.float64).sum(-1).to(dtype)


def _outers(fused):
    plans = [p for p in fused.policy.plans.values() if isinstance(p, AutodiffPlan)]
    return plans[0].outers()


@pytest.mark.parametrize("how", ["trace", "script"])
def test_identities_go_with_eagers_gradients(how):
    torch.manual_seed(0)
    model = Casts()
    reference = copy.deepcopy(model)
    example = torch.randn(3, 8)
    program = torch.jit.trace(model, (example,)) if how == "trace" else torch.jit.script(model)
    fused = nncfuse.jit(program, autograd="autodiff")
    for _ in range(4):
        assert_step_as_eager(fused, model, reference, torch.randn(3, 8))
    (outer,) = _outers(fused)
    # The float64 cast and its way back stay, and the half slice; the norm's casts and the
    # whole slice go, so the norm, the GEMM and the product are one differentiable graph
    # (and the sum of the three another).
    dtypes = [(n.inputsAt(0).type().dtype(), n.output().type().dtype())
              for n in outer.graph.findAllNodes("aten::to")]
    assert sorted(dtypes, key=str) == [(torch.float32, torch.float64),
                                       (torch.float64, torch.float32)]
    slices = outer.graph.findAllNodes("aten::slice")
    assert [n.output().type().sizes() for n in slices] == [[3, 4]]
    assert len(outer.entries) == 2


_SOURCE = """
graph(%x : Float(2, 4, strides=[4, 1], requires_grad=0, device=cpu)):
  %none : NoneType = prim::Constant()
  %false : bool = prim::Constant[value=0]()
  %true : bool = prim::Constant[value=1]()
  %float : int = prim::Constant[value=6]()
  %double : int = prim::Constant[value=7]()
  %zero : int = prim::Constant[value=0]()
  %one : int = prim::Constant[value=1]()
  %two : int = prim::Constant[value=2]()
  %max : int = prim::Constant[value=9223372036854775807]()
  %y : Float(2, 4, strides=[4, 1], requires_grad=0, device=cpu) = {op}
  {use}
  return (%r)
"""

_SAME = "aten::to(%x, %float, %false, %false, %none)"
_WHOLE = "aten::slice(%x, %one, %zero, %max, %one)"
_READ = "%r : Tensor = aten::mul(%y, %two)"


@pytest.mark.parametrize("op, use, dropped", [
    (_SAME, _READ, 1),
    (_SAME, "%r : Tensor = aten::relu_(%y)", 1),  # (the same tensor in eager: a write is too)
    ("aten::to(%x, %float, %false, %true, %none)", _READ, 0),  # copy=True
    ("aten::to(%x, %float, %false, %false, %two)", _READ, 0),  # a memory format
    ("aten::to(%x, %double, %false, %false, %none)", _READ, 0),  # another dtype, as typed
    (_WHOLE, _READ, 1),
    (_WHOLE, "%r : Tensor = aten::t(%y)", 1),  # a view of it
    (_WHOLE, "%r : Tensor = aten::t_(%y)", 0),  # its sizes written
    (_WHOLE, "%r : Tensor = aten::relu_(%x)", 0),  # its input written
    (_WHOLE, "%r : (Tensor, Tensor) = prim::TupleConstruct(%y, %x)", 0),  # it leaves
    ("aten::slice(%x, %one, %one, %max, %one)", _READ, 0),  # not all of it
    ("aten::slice(%x, %one, %zero, %max, %two)", _READ, 0),  # a step
])
def test_an_identity_goes_only_where_no_reader_can_tell(op, use, dropped):
    source = _SOURCE.format(op=op, use=use)
    if "%double" in op:
        source = source.replace("%y : Float", "%y : Double")
    graph = torch._C.parse_ir(source)
    assert drop_identities(graph) == dropped
    kind = op.split("(")[0]
    assert len(graph.findAllNodes(kind)) == 1 - dropped


def test_no_identity_goes_in_a_graph_with_blocks():
    graph = torch._C.parse_ir("""
graph(%x : Float(2, 4, strides=[4, 1], requires_grad=0, device=cpu), %c : bool):
  %none : NoneType = prim::Constant()
  %false : bool = prim::Constant[value=0]()
  %float : int = prim::Constant[value=6]()
  %y : Float(2, 4, strides=[4, 1], requires_grad=0, device=cpu) = aten::to(
      %x, %float, %false, %false, %none)
  %r : Tensor = prim::If(%c)
    block0():
      -> (%y)
    block1():
      -> (%x)
  return (%r)
""")
    assert drop_identities(graph) == 0


_HALF = ("%s : int = aten::size(%x, %one)\n  %t : Tensor = prim::NumToTensor(%s)\n"
         "  %h : Tensor = aten::floor_divide(%t, %two)")


@pytest.mark.parametrize("body, fixed", [
    (_HALF, True),  # a trace's `x.shape[1] // 2`
    ("%h : Tensor = aten::sum(%x, %none)", False),  # a value of x
    (_HALF + "\n  %z : Tensor = aten::nonzero(%x)", False),  # a shape made of values
    (_HALF + "\n  %z : Tensor[] = aten::where(%x)", False),  # (nonzero's)
])
def test_shapes_are_fixed_where_numbers_read_are_made_of_sizes(body, fixed):
    graph = torch._C.parse_ir(f"""
graph(%x : Float(2, 4)):
  %none : NoneType = prim::Constant()
  %one : int = prim::Constant[value=1]()
  %two : int = prim::Constant[value=2]()
  {body}
  %n : int = aten::Int(%h)
  %r : Tensor = aten::mul(%x, %n)
  return (%r)
""")
    assert _shapes_fixed(graph) is fixed
