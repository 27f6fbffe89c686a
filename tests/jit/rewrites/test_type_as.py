"""type_as: `aten::type_as` as the `aten::to` it is, so that alias analysis sees that it may
return its input (a write to the input then stays after reads of the result)."""

import torch

import nncfuse
from nncfuse.jit.rewrites.type_as import type_as_to

SOURCE = """
def f(flag: bool, x: torch.Tensor):
    if flag:
        v = x.type_as(x)
    else:
        v = torch.clamp_max(x, x)
    upper = v.triu(1)
    x[..., 2:5].relu_()
    return torch.clamp(upper, 1e-3, 3.0) + upper, x * 1.0
"""


def test_a_write_to_the_input_stays_after_reading_type_as_of_it():
    """The fuzzer's seed 9594, minimized: the triangle is of `x` before the write."""
    scope = {"torch": torch}
    exec(SOURCE, scope)
    eager = scope["f"]
    fused = nncfuse.jit(torch.jit.CompilationUnit(SOURCE).f)
    torch.manual_seed(0)
    x = torch.randn(4, 5, dtype=torch.float64)
    for flag in (True, True, True, False):
        a, b = x.clone(), x.clone()
        torch.testing.assert_close(fused(flag, a), eager(flag, b))
        torch.testing.assert_close(a, b)


def test_type_as_becomes_to():
    graph = torch._C.parse_ir("""
        graph(%x : Tensor, %y : Tensor):
          %v : Tensor = aten::type_as(%x, %y)
          return (%v)""")
    assert type_as_to(graph) == 1
    (node,) = [n for n in graph.nodes() if n.kind() != "prim::Constant"]
    assert node.kind() == "aten::to" and node.schema().startswith("aten::to.other(Tensor(a) self")
    x, y = torch.randn(3), torch.randn(3, dtype=torch.float64)
    fn = torch._C._create_function_from_graph("g", graph)
    assert fn(x, x) is x and fn(x, y).dtype == torch.float64
