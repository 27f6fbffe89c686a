"""autocast_casts: the casts eager's CPU autocast makes, written as nodes; ops casting one
value to one dtype read one cast, unless something writes between them."""

import pytest
import torch

import nncfuse
from nncfuse.jit.fuser.autocast_casts import make_autocast_casts_explicit


def _typed(source: str) -> torch._C.Graph:
    """`source`'s graph with every tensor typed as profiling would type it: Float(8, 8)."""
    graph = torch._C.parse_ir(source)
    t = torch._C.TensorType.create_from_tensor(torch.empty(8, 8))
    values = list(graph.inputs()) + [v for n in graph.nodes() for v in n.outputs()]
    for value in values:
        if value.type().kind() == "TensorType":
            value.setType(t)
    return graph


def _casts(graph: torch._C.Graph) -> int:
    return sum(n.kind() == "aten::to" for n in graph.nodes())


THREE_LINEARS = """
    graph(%h : Tensor, %w1 : Tensor, %w2 : Tensor):
      %none : NoneType = prim::Constant()
      %g : Tensor = aten::relu(%h)
      %a : Tensor = aten::linear(%g, %w1, %none)
      %b : Tensor = aten::linear(%g, %w2, %none)
      %c : Tensor = aten::matmul(%g, %w1)
      return (%a, %b, %c)"""

WRITE_BETWEEN = """
    graph(%h : Tensor, %w1 : Tensor, %w2 : Tensor):
      %none : NoneType = prim::Constant()
      %one : int = prim::Constant[value=1]()
      %g : Tensor = aten::relu(%h)
      %a : Tensor = aten::linear(%g, %w1, %none)
      %g.1 : Tensor = aten::add_(%g, %w1, %one)
      %b : Tensor = aten::linear(%g, %w2, %none)
      return (%a, %b)"""


def test_ops_casting_one_value_read_one_cast():
    graph = _typed(THREE_LINEARS)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        make_autocast_casts_explicit(graph)
    assert _casts(graph) == 1  # %g's (the weights, graph inputs: through the cast cache)


def test_a_write_between_two_ops_makes_a_second_cast():
    graph = _typed(WRITE_BETWEEN)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        make_autocast_casts_explicit(graph)
    assert _casts(graph) == 2


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_the_shared_cast_fuses_with_the_values_producer(dtype):
    def f(x, w1, w2, w3):
        h = torch.relu(x) * 2.0
        return (torch.nn.functional.linear(h, w1), torch.nn.functional.linear(h, w2),
                torch.nn.functional.linear(h, w3))

    torch.manual_seed(0)
    args = [torch.randn(16, 32)] + [torch.randn(32, 32) for _ in range(3)]
    fused = nncfuse.jit(f)
    with torch.no_grad(), torch.autocast("cpu", dtype=dtype):
        for _ in range(3):
            got, want = fused(*args), f(*args)
        report = nncfuse.explain(fused, *args)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype == dtype
        torch.testing.assert_close(g, w, rtol=2e-2, atol=2e-2)
    assert not [u for u in report.unfused if u.kind == "aten::to"], str(report)
