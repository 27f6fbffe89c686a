"""The backend's casts of parameters under autocast come from the cast cache: made once per
version of a weight, not on every call; results stay eager autocast's, an updated weight is
seen, and a cast that the program returns or writes is made anew."""

import pytest
import torch
from torch import nn

from nncfuse import backend
from nncfuse.jit.fuser import cast_cache
from nncfuse.jit.fuser.weight_casts import batch_weight_casts, cache_weight_casts


@pytest.fixture(autouse=True)
def _fresh():
    torch._dynamo.reset()
    backend.clear_compiled_graphs()
    cast_cache.clear()
    yield
    torch._dynamo.reset()


def _kinds(compiled) -> list[str]:
    return [n.kind() for g in compiled.graphs() for n in g.nodes()]


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Flatten(),
                         nn.Linear(8 * 6 * 6, 16), nn.GELU(), nn.Linear(16, 4)).eval()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_parameters_are_cast_once_per_version_and_updates_are_seen(dtype):
    model, x = _model(), torch.randn(2, 3, 8, 8)
    x[0, 0, 0, :4] = torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0])
    compiled = torch.compile(model, backend="nncfuse")
    copies = []  # (the cached copies of the two linears' weights after each call)
    for step in range(4):  # (a region each: eager's autocast keeps its copies in one)
        with torch.no_grad(), torch.autocast("cpu", dtype=dtype):
            result, expected = compiled(x), model(x)
            assert result.dtype == expected.dtype == dtype
            torch.testing.assert_close(result, expected, rtol=2e-2, atol=2e-2, equal_nan=True)
        copies.append([cast_cache._copies[model[i].weight][dtype][2] for i in (4, 6)])
        if step == 1:
            with torch.no_grad():
                model[4].weight.mul_(-1.5)  # (a new version: a new copy)
    (graph,) = backend.compiled_graphs()
    (batch,) = [n for g in graph.graphs() for n in g.nodes()
                if n.kind() == cast_cache.BATCH_KIND]
    assert len(list(batch.inputsAt(0).node().inputs())) == 6  # (convolution's, linears')
    assert copies[0][1] is copies[1][1] is copies[2][1] is copies[3][1]  # (never updated)
    assert copies[1][0] is not copies[2][0] and copies[2][0] is copies[3][0]  # (updated once)


def test_a_returned_cast_is_a_fresh_tensor_each_call():
    class Returns(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x):
            return self.lin(x), self.lin.weight.to(torch.bfloat16)

    model, x = Returns().eval(), torch.randn(3, 4)
    compiled = torch.compile(model, backend="nncfuse")
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        for _ in range(3):
            y, w = compiled(x)
            torch.testing.assert_close(w, model.lin.weight.to(torch.bfloat16), rtol=0, atol=0)
            w.add_(1)  # (the caller owns it: the next call's copy must not see this)
            torch.testing.assert_close(y, model(x)[0], rtol=2e-2, atol=2e-2)


def test_parameters_that_do_not_require_grad_are_cached_too():
    model, x = _model().requires_grad_(False), torch.randn(2, 3, 8, 8)
    compiled = torch.compile(model, backend="nncfuse")
    with torch.autocast("cpu", dtype=torch.bfloat16):  # (grad mode on: an inference graph)
        for _ in range(3):
            torch.testing.assert_close(compiled(x), model(x), rtol=2e-2, atol=2e-2)
    (graph,) = backend.compiled_graphs()
    assert "nncfuse::autocast_weights" in _kinds(graph)


_GRAPH = """graph(%w : Float(4, 4), %v : Float(4, 4), %x : BFloat16(2, 4)):
  %none : NoneType = prim::Constant()
  %false : bool = prim::Constant[value=0]()
  %bf16 : int = prim::Constant[value=15]()
  %f32 : int = prim::Constant[value=6]()
  %wb : Tensor = aten::to(%w, %bf16, %false, %false, %none)
  %vb : Tensor = aten::to(%v, %bf16, %false, %false, %none)
  %wf : Tensor = aten::to(%w, %f32, %false, %false, %none)
  %vt : Tensor = aten::t(%vb)
  %y : Tensor = aten::mm(%x, %wb)
  %z : Tensor = aten::mm(%y, %vt)
  return (%z, %vt, %wf)
"""


def test_only_casts_to_reduced_precision_that_do_not_escape_are_cached():
    graph = torch._C.parse_ir(_GRAPH)
    assert cache_weight_casts(graph, [0, 1]) == 1  # (not %v's: a view of it is returned)
    batch_weight_casts(graph)  # (one cached cast: nothing to batch)
    kinds = [n.kind() for n in graph.nodes()]
    assert kinds.count(cast_cache.KIND) == 1 and kinds.count("aten::to") == 2
    (cached,) = [n for n in graph.nodes() if n.kind() == cast_cache.KIND]
    assert cached.inputsAt(0).debugName() == "w"


def test_several_cached_casts_become_one_call():
    pair = "%r : (Tensor, Tensor) = prim::TupleConstruct(%z, %wf)\n  return (%r)"
    graph = torch._C.parse_ir(_GRAPH.replace("return (%z, %vt, %wf)", pair))
    assert cache_weight_casts(graph, [0, 1, 2]) == 2  # (%x is bfloat16: no cast of it)
    batch_weight_casts(graph)
    kinds = [n.kind() for n in graph.nodes()]
    assert cast_cache.KIND not in kinds and kinds.count(cast_cache.BATCH_KIND) == 1
    fn = torch._C._create_function_from_graph("f", graph)
    w, v, x = torch.randn(4, 4), torch.randn(4, 4), torch.randn(2, 4).bfloat16()
    z, wf = fn(w, v, x)
    expected = (x @ w.bfloat16()) @ v.bfloat16().t()
    torch.testing.assert_close(z, expected, rtol=0, atol=0)
    assert torch.equal(wf, w)


def test_a_graph_that_reads_attributes_casts_its_parameters_once_too():
    class Constant(nn.Module):  # (a tensor made in forward: an attribute of Dynamo's graph)
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(8, 32), nn.Linear(32, 8)

        def forward(self, x):
            return self.b(torch.relu(self.a(x))) - torch.tensor([1.0, 2.0, 3.0, 4.0] * 2)

    model, x = Constant().eval(), torch.randn(4, 8)
    compiled = torch.compile(model, backend="nncfuse")
    for _ in range(3):
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            torch.testing.assert_close(compiled(x), model(x), rtol=2e-2, atol=2e-2)
    (graph,) = backend.compiled_graphs()
    assert graph.program.receiver is not None  # (the case: the graph reads an attribute)
    assert "nncfuse::autocast_weights" in _kinds(graph)
