"""The backend's bfloat16 GEMMs of a transposed weight (AOTAutograd's decomposition of a
linear) run as the linear, whose weight oneDNN takes packed once it is reused; float32
GEMMs, and GEMMs that are not a linear's, stay as they are."""

import pytest
import torch
from torch import nn

import nncfuse
from nncfuse import backend
from nncfuse.jit.fuser.runtime import kernel_of
from nncfuse.jit.fuser.transposed_gemms import gemms_as_linears
from nncfuse.tensorexpr import stmt as S
from nncfuse.tensorexpr.external import onednn_dtype_ok

_GRAPH = """graph(%w : {w}, %b : {b}, %x : {x}, %c : {o}, %k : {wt}):
  %one : int = prim::Constant[value=1]()
  %two : int = prim::Constant[value=2]()
  %wt : {wt} = aten::t(%w)
  %y : {o} = aten::addmm(%b, %x, %wt, %one, %one)
  %z : {o} = aten::mm(%x, %wt)
  %u : {o} = aten::addmm(%b, %x, %wt, %one, %two)
  %v : {o} = aten::addmm(%c, %x, %wt, %one, %one)
  %q : {o} = aten::addmm(%b, %x, %k, %one, %one)
  %r : (Tensor, Tensor, Tensor, Tensor, Tensor) = prim::TupleConstruct(%y, %z, %u, %v, %q)
  return (%r)
"""


def _graph(dtype: str) -> torch._C.Graph:
    def typ(sizes, strides):
        return f"{dtype}({sizes}, strides=[{strides}], requires_grad=0, device=cpu)"

    return torch._C.parse_ir(_GRAPH.format(
        w=typ("16, 8", "8, 1"), b=typ("16", "1"), x=typ("4, 8", "8, 1"),
        o=typ("4, 16", "16, 1"), wt=typ("8, 16", "1, 8")))  # (%k: a (K, N) weight)


@pytest.mark.parametrize("dtype", ["BFloat16", "Float"])
def test_a_linears_gemms_become_linears_in_bfloat16_only(dtype):
    graph = _graph(dtype)
    fn = torch._C._create_function_from_graph("before", graph.copy())
    count = gemms_as_linears(graph)
    kinds = [n.kind() for n in graph.nodes()]
    if dtype == "Float":
        assert count == 0 and "aten::linear" not in kinds
        return
    # (not the addmm of alpha 2, nor the one whose bias is a matrix)
    assert count == 3 and kinds.count("aten::linear") == 3 and kinds.count("aten::addmm") == 2
    after = torch._C._create_function_from_graph("after", graph)
    w, b, x, c = (torch.randn(*s).bfloat16() for s in ((16, 8), (16,), (4, 8), (4, 16)))
    k = torch.randn(16, 8).bfloat16().t()
    results = list(zip(after(w, b, x, c, k), fn(w, b, x, c, k)))
    for (got, want), ref in zip([*results[:2], results[4]], (
            nn.functional.linear(x, w, b), x @ w.t(), nn.functional.linear(x, k.t(), b))):
        torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)
        torch.testing.assert_close(got, ref, rtol=0, atol=0)  # (what eager's linear gives)


@pytest.mark.skipif(not onednn_dtype_ok(torch.bfloat16), reason="oneDNN takes no bfloat16 here")
def test_the_backends_bfloat16_linears_take_packed_weights():
    torch._dynamo.reset()
    backend.clear_compiled_graphs()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64)).eval()
    x = torch.randn(2, 16, 64)
    x[0, 0, :3] = torch.tensor([float("nan"), float("inf"), -0.0])
    compiled = torch.compile(model, backend="nncfuse")
    for _ in range(3):
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            got, want = compiled(x), model(x)
        assert got.dtype == want.dtype == torch.bfloat16
        torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2, equal_nan=True)
    (graph,) = backend.compiled_graphs()
    calls = [s.fn for g in graph.graphs() for group in nncfuse.fusion_groups(g)
             for s in kernel_of(group).stmt.stmts if isinstance(s, S.ExternalCall)]
    assert calls and all(fn.startswith("nnc_mkldnn_linear_pointwise") for fn in calls), calls
    assert any(fn.endswith("_reused") for fn in calls), calls
    torch._dynamo.reset()
