"""shape_checks: which nodes are a scripted check and its condition, and a kernel lowering a
check that passes to nothing and refusing one that raises or reads a size symbol."""

import pytest
import torch

import nncfuse
from nncfuse.config import Options
from nncfuse.tensorexpr import shape_checks
from nncfuse.tensorexpr.lowerings import LoweringError


def checked(x):
    if x.dim() != 2 or x.size(1) != 3:
        raise ValueError(f"expected a matrix of 3 columns (got {x.dim()}D)")
    return torch.relu(x)


def checked_graph(shape=(2, 3), reads_rank_after=False):
    """`checked`'s graph, its input typed as a contiguous float tensor of `shape`; with
    `reads_rank_after`, its output also the rank plus one."""
    graph = torch.jit.script(checked).graph.copy()
    typed = torch._C.TensorType.create_from_tensor(torch.empty(shape))
    next(graph.inputs()).setType(typed)
    next(graph.outputs()).setType(typed)  # (relu's: complete, as the fuser's graphs are)
    if reads_rank_after:
        rank = next(n for n in graph.nodes() if n.kind() == "aten::dim").output()
        one = graph.insertConstant(1)
        total = graph.create("aten::add", [rank, one], 1)
        total.insertBefore(graph.return_node())
        total.output().setType(torch._C.IntType.get())
        graph.registerOutput(total.output())
    return graph


def _nodes(graph):
    """The graph's nodes by kind, an If's kind with its number of outputs."""
    return {n.kind() + (str(n.outputsSize()) if n.kind() == "prim::If" else ""): n
            for n in graph.nodes()}


def test_recognizes_the_check_and_its_condition():
    graph = checked_graph()
    nodes = _nodes(graph)
    check, either = nodes["prim::If0"], nodes["prim::If1"]
    assert shape_checks.is_check(check) and shape_checks.raising_block(check) == 0
    assert not shape_checks.is_check(either) and shape_checks.is_check_value(either)
    assert not shape_checks.is_check_node(nodes["aten::relu"])
    assert [n.kind() for n in shape_checks.condition(check)] == [
        "aten::dim", "aten::ne", "prim::If"]
    leaves = shape_checks.leaves(check)
    assert next(graph.inputs()) in leaves
    assert all(v.node().kind() in ("prim::Constant", "prim::Param") for v in leaves)
    for node in shape_checks.condition(check):
        assert shape_checks.owning_check(node) == check


def test_a_value_read_outside_its_check_has_no_owner():
    graph = checked_graph(reads_rank_after=True)
    assert shape_checks.owning_check(_nodes(graph)["aten::dim"]) is None
    assert shape_checks.owning_check(_nodes(graph)["aten::ne"]) is not None


def test_if_that_does_more_than_raise_is_no_check():
    graph = checked_graph()
    check = next(n for n in graph.nodes() if shape_checks.is_check(n))
    raising = list(check.blocks())[0]
    relu = graph.create("aten::relu", [next(graph.inputs())], 1)
    relu.insertBefore(next(iter(raising.nodes())))
    assert not shape_checks.is_check(check)


Shape = shape_checks.Shape


@pytest.mark.parametrize("kind, operands, want", [
    ("aten::dim", [Shape((2, 3))], 2), ("aten::size", [Shape((2, 3)), -1], 3),
    ("aten::size", [Shape((2, 3))], [2, 3]), ("aten::len", [Shape((4, 1))], 4),
    ("aten::len", [[4, 1, 7]], 3), ("aten::__getitem__", [[4, 1, 7], -2], 1),
    ("aten::floordiv", [-7, 2], -4), ("aten::ne", [2, 2], False),
    ("aten::__or__", [False, True], True),
])
def test_evaluate(kind, operands, want):
    assert shape_checks.evaluate(kind, operands) == want


@pytest.mark.parametrize("kind, operands", [
    ("aten::size", [Shape((2, 3)), 2]), ("aten::len", [Shape(())]),
    ("aten::__getitem__", [[1, 2], 2]), ("aten::floordiv", [1, 0])])
def test_evaluate_raises_where_eager_does(kind, operands):
    with pytest.raises(ValueError):
        shape_checks.evaluate(kind, operands)


@pytest.mark.parametrize("use_llvm", [True, False])
def test_kernel_lowers_a_passing_check_to_nothing(use_llvm):
    kernel = nncfuse.TensorExprKernel(checked_graph(), Options.from_env(use_llvm=use_llvm))
    x = torch.randn(2, 3)
    torch.testing.assert_close(kernel.run([x]), torch.relu(x))
    assert kernel.lowered.name == "fused_relu"


def test_kernel_refuses_a_check_that_raises_at_its_types():
    with pytest.raises(LoweringError, match="raises"):
        nncfuse.TensorExprKernel(checked_graph((2, 4)))


def test_dynamic_kernel_refuses_a_check_of_a_size_symbol():
    graph = checked_graph()
    with pytest.raises(LoweringError, match="size symbol"):
        nncfuse.TensorExprKernel(graph, dynamic=True)
    # sizes of 3 static (the policy's choice where they did not change): a constant again
    kernel = nncfuse.TensorExprKernel(graph, dynamic=True, static_sizes=frozenset({3}))
    x = torch.randn(5, 3)
    torch.testing.assert_close(kernel.run([x]), torch.relu(x))
