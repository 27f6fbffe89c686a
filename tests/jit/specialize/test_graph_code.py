"""graph_code.py: an optimized graph as generated Python, against the interpreter and eager."""

import torch

import nncfuse
from nncfuse.jit.specialize.graph_code import TypeCheck, graph_code
from nncfuse.jit.specialize.plans import CodePlan, GraphPlan


def _plan_of(fn, *args):
    """The plan `fn` (an nncfuse.jit function, called enough to optimize) runs for `args`."""
    for _ in range(3):
        fn(*args)
    return list(fn.policy.plans.values())[-1]


def _mlp_step(x, w, b):
    h = torch.nn.functional.linear(torch.relu(x * 2.0 + 1.0), w)
    return torch.sigmoid(h + b) * h, h.t()


def test_a_graph_of_kernels_and_ops_runs_as_generated_code_like_eager():
    fn = nncfuse.jit(_mlp_step)
    x, w, b = torch.randn(8, 16), torch.randn(32, 16), torch.randn(32)
    plan = _plan_of(fn, x, w, b)
    assert isinstance(plan, CodePlan)
    assert plan.code is not None and "check(" in plan.code.source  # the TypeCheck as code
    for args in [(x, w, b), (torch.randn(8, 16), w, torch.randn(32))]:
        got, want = fn(*args), _mlp_step(*args)
        for g, e in zip(got, want):
            torch.testing.assert_close(g, e)


def test_extremal_values_and_other_layouts_as_eager():
    fn = nncfuse.jit(_mlp_step)
    x, w, b = torch.randn(8, 16), torch.randn(32, 16), torch.randn(32)
    _plan_of(fn, x, w, b)
    x[0, :4] = torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0])
    for args in [(x, w, b), (torch.randn(16, 8).t(), w, b), (torch.randn(0, 16), w, b)]:
        got, want = fn(*args), _mlp_step(*args)
        for g, e in zip(got, want):
            torch.testing.assert_close(g, e, equal_nan=True)


def test_a_failed_type_check_takes_the_unfused_branch():
    typ = "Float(4, strides=[1], requires_grad=0, device=cpu)"
    graph = torch._C.parse_ir(f"""
graph(%x : Tensor):
  %one : int = prim::Constant[value=1]()
  %y : {typ}, %ok : bool = prim::TypeCheck[types=[{typ}]](%x)
  %r : Tensor = prim::If(%ok)
    block0():
      %a : Tensor = aten::mul(%y, %y)
      -> (%a)
    block1():
      %b : Tensor = aten::add(%x, %x, %one)
      -> (%b)
  return (%r)
""")
    code = graph_code(graph)
    assert code is not None
    x = torch.arange(4.0)
    torch.testing.assert_close(code(x), x * x)  # the checked branch
    y = torch.arange(6.0)
    torch.testing.assert_close(code(y), y + y)  # other sizes: the other branch
    torch.testing.assert_close(code(x), x * x)
    torch.testing.assert_close(code(x.double()), x.double() + x.double())


def test_type_check_passes_what_the_interpreter_passes_and_fails_the_rest():
    types = [torch._C.parse_ir(
        "graph(%x : Float(2, 3, strides=[3, 1], requires_grad=0, device=cpu)):\n  return (%x)"
    ).inputs().__next__().type()]
    check = TypeCheck(types)
    assert not check.check(torch.randn(3, 2).t())  # strides differ
    assert not check.check(torch.randn(2, 3, dtype=torch.float64))
    assert check.check(torch.randn(2, 3))  # from now on Dynamo's check
    assert check.check(torch.randn(2, 3))
    assert not check.check(torch.randn(2, 4))
    assert not check.check(torch.randn(3, 2).t())
    with torch.no_grad():  # the grad mode of the first pass: a parameter's flag is its own
        param = torch.nn.Parameter(torch.randn(2, 3))
        assert TypeCheck(types).check(param)


def test_graphs_with_a_node_it_cannot_spell_run_in_the_interpreter():
    graph = torch._C.parse_ir("""
graph(%x : Tensor, %n : int):
  %t : bool = prim::Constant[value=1]()
  %r : Tensor = prim::Loop(%n, %t, %x)
    block0(%i : int, %acc : Tensor):
      %one : int = prim::Constant[value=1]()
      %s : Tensor = aten::add(%acc, %acc, %one)
      -> (%t, %s)
  return (%r)
""")
    assert graph_code(graph) is None
    plan = CodePlan(GraphPlan(graph, None))
    x = torch.ones(3)
    torch.testing.assert_close(plan.run((x, 2)), x * 4)


def _decode_ops(ids, table, w, cache, pos, x):
    e = torch.embedding(table, ids)                      # [1, 1, 8]
    h = torch.mm(e.view(1, 8), w.t())                    # [1, 8]
    q = h.view(1, 1, 2, 4).transpose(1, 2)               # [1, 2, 1, 4]
    cache = cache.index_copy(2, pos, q)                  # [1, 2, 5, 4]
    k = cache.unsqueeze(2).expand(1, 2, 2, 5, 4).permute(0, 2, 1, 3, 4)
    s = torch.bmm(x, x.transpose(1, 2))
    return h, cache, k, s


def test_the_ops_called_through_their_bindings_give_the_interpreters_results():
    from nncfuse.jit.specialize.graph_code import _BINDINGS

    graph = torch.jit.script(_decode_ops).graph
    kinds = {n.kind() for n in graph.nodes()}
    assert {kind for kind, _ in _BINDINGS} <= kinds  # every binding is exercised
    code = graph_code(graph)
    assert code is not None
    args = (torch.tensor([[3]]), torch.randn(10, 8), torch.randn(8, 8), torch.zeros(1, 2, 5, 4),
            torch.tensor([2]), torch.randn(3, 4, 5))
    want = torch._C._create_function_from_graph("f", graph)(*args)
    for g, e in zip(code(*args), want):
        assert torch.equal(g, e) and g.stride() == e.stride()
