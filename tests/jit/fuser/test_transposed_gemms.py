"""The backend's bfloat16 GEMMs of a transposed weight (AOTAutograd's decomposition of a
linear) run as the linear, whose weight oneDNN takes packed once it is reused; float32
GEMMs, and GEMMs that are not a linear's, stay as they are."""

import pytest
import torch
from torch import nn

from nncfuse.jit.fuser.transposed_gemms import gemms_as_linears
from nncfuse.tensorexpr import stmt as S
from nncfuse.tensorexpr.external import onednn_dtype_ok
from tests.fused import backend_kernel_stmts

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
        w=typ("64, 32", "32, 1"), b=typ("64", "1"), x=typ("16, 32", "32, 1"),
        o=typ("16, 64", "64, 1"), wt=typ("32, 64", "1, 32")))  # (%k: a (K, N) weight)


@pytest.mark.parametrize("dtype", ["BFloat16", "Float"])
def test_a_linears_gemms_become_linears_where_the_packed_weight_pays(dtype):
    graph = _graph(dtype)
    fn = torch._C._create_function_from_graph("before", graph.copy())
    count = gemms_as_linears(graph)
    kinds = [n.kind() for n in graph.nodes()]
    if dtype == "Float":  # (16 x 32 x 64 multiply-adds: too few for float32's packed GEMM)
        assert count == 0 and "aten::linear" not in kinds
        return
    # (not the addmm of alpha 2, nor the one whose bias is a matrix)
    assert count == 3 and kinds.count("aten::linear") == 3 and kinds.count("aten::addmm") == 2
    after = torch._C._create_function_from_graph("after", graph)
    w, b, x, c = (torch.randn(*s).bfloat16() for s in ((64, 32), (64,), (16, 32), (16, 64)))
    k = torch.randn(64, 32).bfloat16().t()
    results = list(zip(after(w, b, x, c, k), fn(w, b, x, c, k)))
    for (got, want), ref in zip([*results[:2], results[4]], (
            nn.functional.linear(x, w, b), x @ w.t(), nn.functional.linear(x, k.t(), b))):
        torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)
        torch.testing.assert_close(got, ref, rtol=0, atol=0)  # (what eager's linear gives)


@pytest.mark.skipif(not onednn_dtype_ok(torch.bfloat16), reason="oneDNN takes no bfloat16 here")
def test_the_backends_bfloat16_linears_take_packed_weights():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64)).eval()
    x = torch.randn(2, 16, 64)
    x[0, 0, :3] = torch.tensor([float("nan"), float("inf"), -0.0])
    calls = [s.fn for s in backend_kernel_stmts(model, x) if isinstance(s, S.ExternalCall)]
    assert calls and all(fn.startswith("nnc_mkldnn_linear_pointwise") for fn in calls), calls
    assert any(fn.endswith("_reused") for fn in calls), calls


@pytest.mark.skipif(not onednn_dtype_ok(torch.float32), reason="oneDNN takes no float32 here")
@pytest.mark.parametrize("mkl_fast", [False, True])
def test_float32_linears_gemms_become_linears_where_mkls_gemm_is_slower(monkeypatch, mkl_fast):
    from nncfuse.tensorexpr.lowerings import external as lowering

    monkeypatch.setattr(lowering, "mkl_sgemm_fast", lambda: mkl_fast)

    def typ(*sizes, t=False):
        strides = [1, sizes[0]] if t else [sizes[1], 1] if len(sizes) == 2 else [1]
        return f"Float({', '.join(map(str, sizes))}, strides={strides}, requires_grad=0, " \
               "device=cpu)"

    graph = torch._C.parse_ir(f"""graph(%w : {typ(256, 256)}, %b : {typ(256)},
      %x : {typ(128, 256)}, %k : {typ(256, 256)}):
  %one : int = prim::Constant[value=1]()
  %wt : {typ(256, 256, t=True)} = aten::t(%w)
  %y : {typ(128, 256)} = aten::addmm(%b, %x, %wt, %one, %one)
  %z : {typ(128, 256)} = aten::mm(%x, %k)
  %r : (Tensor, Tensor) = prim::TupleConstruct(%y, %z)
  return (%r)""")
    # (128 x 256 x 256 multiply-adds: at least REUSED_SGEMM_WORK; the (K, N) mm is left alone)
    assert gemms_as_linears(graph) == (0 if mkl_fast else 1)


def test_a_weight_gradients_gemm_of_a_transposed_operand_stays_a_gemm():
    """A backward graph's `mm(t(dy), x)` of a saved activation `x` (a graph input read as
    (K, N)): oneDNN's linear of two transposed operands is slower than `mm`; left as it is."""
    typ = "BFloat16({}, strides=[{}], requires_grad=0, device=cpu)"
    graph = torch._C.parse_ir(f"""graph(%dy : {typ.format("32, 256", "256, 1")},
                                       %x : {typ.format("32, 1024", "1024, 1")}):
      %dyt : {typ.format("256, 32", "1, 256")} = aten::t(%dy)
      %dw : {typ.format("256, 1024", "1024, 1")} = aten::mm(%dyt, %x)
      return (%dw)""")
    assert gemms_as_linears(graph) == 0
    assert "aten::mm" in [n.kind() for n in graph.nodes()]
