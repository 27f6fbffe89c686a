"""fold_tuples: a tuple unpacked where it is packed, as the values packed; in training's
graphs and in every program the policy specializes (a traced submodule's results)."""

import torch

import nncfuse
from nncfuse.jit.rewrites.fold_tuples import fold_tuples


def test_fold_tuples_uses_the_values_packed():
    graph = torch._C.parse_ir("""
        graph(%a : Tensor, %b : Tensor):
          %t : (Tensor, Tensor) = prim::TupleConstruct(%a, %b)
          %x : Tensor, %y : Tensor = prim::TupleUnpack(%t)
          %z : Tensor = aten::mul(%x, %y)
          %w : Tensor = aten::sin(%z)
          return (%w, %t)""")
    fold_tuples(graph)
    kinds = [n.kind() for n in graph.nodes()]
    assert kinds == ["prim::TupleConstruct", "aten::mul", "aten::sin"]  # (the tuple returned)
    mul = next(n for n in graph.nodes() if n.kind() == "aten::mul")
    assert [v.debugName() for v in mul.inputs()] == ["a", "b"]


class _Pair(torch.nn.Module):
    def forward(self, x):
        return torch.tanh(x) * 2.0, x + 1.0


class _Caller(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.pair = _Pair()

    def forward(self, x):
        a, b = self.pair(x)
        return torch.sigmoid(a) - b


def test_a_traced_submodules_results_fuse_with_their_readers():
    x = torch.randn(64, 32)
    model = _Caller()
    traced = torch.jit.trace(model, (x,))
    fused = nncfuse.jit(traced)
    for _ in range(3):
        torch.testing.assert_close(fused(x), model(x))
    report = nncfuse.explain(fused, x)
    assert len(report.groups) == 1 and report.coverage == 1.0, str(report)
