"""plans.py: repeated views folded in an optimized graph (`fold_same_views`), with eager's
results and aliasing."""

import torch

import nncfuse
from nncfuse.jit.specialize.plans import fold_same_views
from nncfuse.jit.training.autograd import AutogradPlan

_HEAD = "graph(%x : Float(4, 8, strides=[8, 1]), %w : Float(8, 8, strides=[8, 1])):\n"
_CONSTANTS = (
    "  %s : int[] = prim::Constant[value=[2, 16]]()\n"
    "  %h : int[] = prim::Constant[value=[-1, 16]]()\n"
    "  %q : int[] = prim::Constant[value=[-1, 4]]()\n"
    "  %z : int = prim::Constant[value=0]()\n"
    "  %o : int = prim::Constant[value=1]()\n"
)


def _graph(body: str) -> torch._C.Graph:
    return torch._C.parse_ir(_HEAD + _CONSTANTS + body)


def _views(graph: torch._C.Graph) -> int:
    return sum(n.kind() in ("aten::view", "aten::t", "aten::transpose") for n in graph.nodes())


def _run(graph: torch._C.Graph, *args):
    return torch._C._create_function_from_graph("f", graph)(*args)


def _inputs():
    return torch.randn(4, 8), torch.randn(8, 8)


def test_repeated_views_fold_and_results_stay():
    body = (
        "  %a : Tensor = aten::view(%x, %s)\n"
        "  %b : Tensor = aten::view(%x, %h)\n"      # the same view: -1 is 2
        "  %c : Tensor = aten::t(%w)\n"
        "  %d : Tensor = aten::t(%w)\n"
        "  %e : Tensor = aten::transpose(%w, %o, %z)\n"  # t(w) again, dims in the other order
        "  %f : Tensor = aten::transpose(%w, %z, %o)\n"
        "  %m : Tensor = aten::mm(%x, %c)\n"
        "  %n : Tensor = aten::mm(%x, %d)\n"
        "  %r : Tensor = aten::mul(%a, %b)\n"
        "  %p : Tensor = aten::mm(%e, %f)\n"
        "  %t : (Tensor, Tensor, Tensor, Tensor) = prim::TupleConstruct(%m, %n, %r, %p)\n"
        "  return (%t)\n"
    )
    graph = _graph(body)
    args = _inputs()
    want = _run(graph.copy(), *args)
    assert fold_same_views(graph) == 3
    assert _views(graph) == 3
    for got, w in zip(_run(graph, *args), want):
        torch.testing.assert_close(got, w, rtol=0, atol=0)


def test_views_that_differ_stay():
    body = (
        "  %a : Tensor = aten::view(%x, %s)\n"
        "  %b : Tensor = aten::view(%x, %q)\n"      # another shape
        "  %c : Tensor = aten::view(%w, %h)\n"      # another input
        "  %d : Tensor = aten::t(%w)\n"
        "  %e : Tensor = aten::t(%x)\n"
        "  %t : (Tensor, Tensor, Tensor, Tensor, Tensor) = "
        "prim::TupleConstruct(%a, %b, %c, %d, %e)\n"
        "  return (%t)\n"
    )
    graph = _graph(body)
    assert fold_same_views(graph) == 0
    assert _views(graph) == 5


def test_a_minus_one_first_is_not_taken_for_the_size():
    # view(x, [-1, 16]) then view(x, [2, 16]): the earlier has the -1, the later is kept too
    body = (
        "  %b : Tensor = aten::view(%x, %h)\n"
        "  %a : Tensor = aten::view(%x, %s)\n"
        "  %r : Tensor = aten::mul(%a, %b)\n"
        "  return (%r)\n"
    )
    graph = _graph(body)
    assert fold_same_views(graph) == 0


def test_two_returned_views_stay_two_tensors():
    body = (
        "  %a : Tensor = aten::view(%x, %s)\n"
        "  %b : Tensor = aten::view(%x, %s)\n"
        "  %c : Tensor = aten::view(%x, %s)\n"      # not returned: folds into a returned one
        "  %r : Tensor = aten::mul(%c, %c)\n"
        "  %t : (Tensor, Tensor, Tensor) = prim::TupleConstruct(%a, %b, %r)\n"
        "  return (%t)\n"
    )
    graph = _graph(body)
    assert fold_same_views(graph) == 1
    a, b, r = _run(graph, *_inputs())
    assert a is not b and a.data_ptr() == b.data_ptr()
    torch.testing.assert_close(r, a * a, rtol=0, atol=0)


def test_a_view_written_to_is_not_folded():
    body = (
        "  %a : Tensor = aten::view(%x, %s)\n"
        "  %b : Tensor = aten::view(%x, %s)\n"
        "  %b2 : Tensor = aten::t_(%b)\n"           # b's own metadata changes, not a's
        "  %r : Tensor = aten::mul(%a, %o)\n"
        "  %t : (Tensor, Tensor) = prim::TupleConstruct(%r, %b2)\n"
        "  return (%t)\n"
    )
    graph = _graph(body)
    args = _inputs()
    want = _run(graph.copy(), *(a.clone() for a in args))
    assert fold_same_views(graph) == 0
    for got, w in zip(_run(graph, *args), want):
        assert got.shape == w.shape
        torch.testing.assert_close(got, w, rtol=0, atol=0)


def _linear_twice(x, w1, w2):
    h = torch.nn.functional.gelu(x @ w1)
    return (h @ w2).sin() + h.sum(-1, keepdim=True)


def test_training_graphs_fold_their_repeated_views_with_eagers_grads():
    torch.manual_seed(0)
    x = torch.randn(2, 8, 16, requires_grad=True)
    w1 = torch.randn(16, 32, requires_grad=True)
    w2 = torch.randn(32, 16, requires_grad=True)
    fused = nncfuse.jit(_linear_twice, autograd="aot")
    for _ in range(3):  # profile, optimize, then the optimized graphs
        got = torch.autograd.grad(fused(x, w1, w2).sum(), (x, w1, w2))
    want = torch.autograd.grad(_linear_twice(x, w1, w2).sum(), (x, w1, w2))
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)
    plan = next(p for p in fused.policy.plans.values() if isinstance(p, AutogradPlan))
    graphs = [g for j in plan.joints() for g in (*j.forward.graphs(), *j.backward.graphs())]
    assert graphs
    for graph in graphs:  # nothing left to fold where the plans were made
        assert fold_same_views(graph.copy()) == 0
