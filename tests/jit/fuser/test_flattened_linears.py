"""The backend's linears of inputs of more than two dims (AOTAutograd's flatten, GEMM, view
back) run as the linear of the input itself, so that what follows the GEMM can be oneDNN's
epilogue; only where the GEMM's result has no other reader and the views are the flatten
and its inverse."""

import pytest
import torch
from torch import nn

from nncfuse.jit.fuser.flattened_linears import unflatten_linears
from nncfuse.tensorexpr import stmt as S
from nncfuse.tensorexpr.external import onednn_dtype_ok
from tests.fused import backend_kernel_stmts


def _type(sizes: tuple[int, ...]) -> str:
    strides = [1] * len(sizes)
    for k in range(len(sizes) - 2, -1, -1):
        strides[k] = strides[k + 1] * sizes[k + 1]
    return f"Float({', '.join(map(str, sizes))}, strides={strides}, requires_grad=0, device=cpu)"


def _graph(back: tuple[int, ...], returns: str = "%y") -> torch._C.Graph:
    x, flat, w, b, y2, y = (_type(s) for s in (
        (2, 3, 8), (6, 8), (4, 8), (4,), (6, 4), back))
    return torch._C.parse_ir(f"""graph(%x : {x}, %w : {w}, %b : {b}):
      %s : int[] = prim::Constant[value=[6, 8]]()
      %t : int[] = prim::Constant[value={list(back)}]()
      %x2 : {flat} = aten::view(%x, %s)
      %y2 : {y2} = aten::linear(%x2, %w, %b)
      %y : {y} = aten::view(%y2, %t)
      %r : (Tensor, Tensor) = prim::TupleConstruct({returns}, %x2)
      return (%r)""")


def test_the_views_around_a_linear_go_and_the_result_is_the_same():
    graph = _graph((2, 3, 4))
    before = torch._C._create_function_from_graph("before", graph.copy())
    assert unflatten_linears(graph) == 1
    linear = next(n for n in graph.nodes() if n.kind() == "aten::linear")
    assert linear.inputsAt(0).debugName() == "x"  # (reads x itself)
    assert [n.kind() for n in graph.nodes()].count("aten::view") == 1  # (%x2 is returned)
    after = torch._C._create_function_from_graph("after", graph)
    x, w, b = torch.randn(2, 3, 8), torch.randn(4, 8), torch.randn(4)
    x[0, 0, :3] = torch.tensor([float("nan"), float("inf"), -0.0])
    for got, want in zip(after(x, w, b), before(x, w, b)):
        assert got.shape == want.shape
        torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("back,returns", [((3, 2, 4), "%y"), ((2, 3, 4), "%y2")],
                         ids=["another_shape", "the_gemm_read_twice"])
def test_other_views_are_left_alone(back, returns):
    graph = _graph(back, returns)
    assert unflatten_linears(graph) == 0


@pytest.mark.skipif(not onednn_dtype_ok(torch.bfloat16), reason="oneDNN takes no bfloat16 here")
def test_the_backends_gelu_after_a_linear_is_onednns_epilogue():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.GELU()).eval()
    x = torch.randn(2, 16, 64)
    x[0, 0, :3] = torch.tensor([float("nan"), float("inf"), -0.0])
    stmts = backend_kernel_stmts(model, x)
    calls = [s for s in stmts if isinstance(s, S.ExternalCall)]
    assert len(calls) == 1 and "gelu" in calls[0].args, calls  # (the GELU is the call's)
    assert len(stmts) == 1, stmts  # (no loop after it)
