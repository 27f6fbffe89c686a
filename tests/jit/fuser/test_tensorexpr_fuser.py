"""The fuser pass on real scripted functions: what groups form, what stays out, the guards."""

import torch

import nncfuse


def optimized(fn, *args, **options):
    fused = nncfuse.jit(fn, **options)
    for _ in range(2):
        fused(*args)
    return fused, fused.graph_for(*args)


def kinds(block_or_graph):
    return [n.kind() for n in block_or_graph.nodes()]


def ancestors(node):
    """Kinds of the nodes whose blocks enclose `node`, innermost first."""
    out = []
    while (owner := node.owningBlock().owningNode()) is not None:
        out.append(owner.kind())
        node = owner
    return out


def group_ops(group):
    return [n.kind() for n in group.g("Subgraph").nodes() if n.kind() != "prim::Constant"]


def seed(a):
    b = torch.conv2d(a, torch.ones(1, 1, 1, 1))
    x = torch.mul(b, b)
    y = torch.sin(x)
    return torch.mul(y, y)


def test_seed_program_forms_one_group_starting_with_the_conv():
    _, graph = optimized(seed, torch.randn(1, 1, 16, 16))
    (group,) = nncfuse.fusion_groups(graph)
    assert group_ops(group) == ["aten::conv2d", "aten::mul", "aten::sin", "aten::mul"]
    assert "aten::conv2d" not in kinds(graph)  # its weight is a constant of the group


def test_guard_structure_typecheck_if_fallback():
    _, graph = optimized(seed, torch.randn(1, 1, 16, 16))
    check = graph.findNode("prim::TypeCheck")
    branch = graph.findNode("prim::If")
    assert check is not None and branch is not None
    assert branch.input().node() == check
    fused_block, fallback_block = list(branch.blocks())
    assert [nncfuse.fusion_groups(graph)[0].kind()] == kinds(fused_block)
    fallback = [k for k in kinds(fallback_block) if k != "prim::Constant"]
    assert fallback == ["aten::conv2d", "aten::mul", "aten::sin", "aten::mul"]
    ty = check.tys("types")[0]
    assert (ty.dtype(), ty.sizes(), ty.strides()) == (
        torch.float32,
        [1, 1, 16, 16],
        [256, 256, 16, 1],
    )


def test_non_fusible_op_splits_groups():
    def f(a, b):
        x = torch.sigmoid(a) * b
        y = torch.mm(x, b)
        return torch.tanh(y) + y

    _, graph = optimized(f, torch.randn(8, 8), torch.randn(8, 8))
    groups = nncfuse.fusion_groups(graph)
    assert [group_ops(g) for g in groups] == [  # the mm starts a group, reading x
        ["aten::sigmoid", "aten::mul"],
        ["aten::mm", "aten::tanh", "aten::add"],
    ]


def test_min_group_size_undoes_small_groups():
    def f(a):
        return torch.relu(torch.mm(a, a)) + 1.0

    assert len(nncfuse.fusion_groups(optimized(f, torch.randn(4, 4))[1])) == 1
    assert nncfuse.fusion_groups(optimized(f, torch.randn(4, 4), min_group_size=4)[1]) == []


def test_groups_inside_if_and_loop_bodies():
    def f(a, flag: bool, n: int):
        if flag:
            a = torch.exp(a) * 2.0
        else:
            a = torch.sin(a) - 1.0
        for _ in range(n):
            a = torch.tanh(a) * a
        return a

    a = torch.randn(5, 7)
    fused, graph = optimized(f, a, True, 3)
    enclosing = [ancestors(g) for g in nncfuse.fusion_groups(graph)]
    # The else branch never ran while profiling: no types there, so no group.
    assert sorted(enclosing) == [["prim::If", "prim::If"], ["prim::If", "prim::Loop"]]
    for flag in (True, False):
        torch.testing.assert_close(fused(a, flag, 3), f(a, flag, 3))


def test_in_place_ops_are_never_reordered_wrongly():
    def f(a, b):
        x = a * 2.0
        y = x.sin()
        b.add_(1.0)  # mutates an input after x is read
        return y * b, x + b

    a, b = torch.randn(6), torch.randn(6)
    fused = nncfuse.jit(f)
    for _ in range(3):
        b1, b2 = b.clone(), b.clone()
        got = fused(a, b1)
        want = f(a, b2)
        torch.testing.assert_close(got, want)
        torch.testing.assert_close(b1, b2)


def test_in_place_ops_on_temporaries_are_functionalized_and_fused():
    def f(a):
        x = a * 2.0
        x.relu_()
        return x.sin()

    _, graph = optimized(f, torch.randn(32))
    (group,) = nncfuse.fusion_groups(graph)
    assert group_ops(group) == ["aten::mul", "aten::relu", "aten::sin"]


def test_requires_grad_inputs_fuse_through_autograd_and_are_correct():
    def f(a, b):
        return torch.sigmoid(a * b) + b

    a = torch.randn(4, requires_grad=True)
    b = torch.randn(4)
    fused, graph = optimized(f, a, b)
    # the forward graph of the autograd path (jit/training/autograd.py), where nothing requires grad
    assert len(nncfuse.fusion_groups(graph)) == 1
    out = fused(a, b)
    out.sum().backward()
    s = torch.sigmoid(a * b).detach()
    torch.testing.assert_close(a.grad, s * (1 - s) * b)
    with torch.no_grad():
        _, graph2 = optimized(f, a, b)
        assert len(nncfuse.fusion_groups(graph2)) == 1


def test_adjacent_independent_groups_merge_into_one_kernel():
    def f(a, b):
        x = torch.exp(a) * 2.0
        y = torch.sin(b) - 1.0
        return x, y

    a, b = torch.randn(16), torch.randn(16)
    fused, graph = optimized(f, a, b)
    (group,) = nncfuse.fusion_groups(graph)
    assert sorted(group_ops(group)) == ["aten::exp", "aten::mul", "aten::sin", "aten::sub"]
    for got, want in zip(fused(a, b), f(a, b)):
        torch.testing.assert_close(got, want)


def test_a_group_that_fails_to_compile_runs_unfused(monkeypatch, capsys):
    from nncfuse.tensorexpr.lowerings import registry as lowerings

    def broken(ctx):
        raise RuntimeError("lowering exploded")

    lowering = lowerings.REGISTRY["aten::sin"]
    monkeypatch.setitem(lowerings.REGISTRY, "aten::sin", lowering.__class__(
        lowering.kind, broken, lowering.overloads))
    monkeypatch.setenv("NNCFUSE_LOG_LEVEL", "guard")
    fused, graph = optimized(seed, torch.randn(1, 1, 8, 8))
    assert nncfuse.fusion_groups(graph) == []
    assert "lowering exploded" in capsys.readouterr().err
    assert [str(f) for f in fused.compile_failures] == ["RuntimeError: lowering exploded"]
    assert "aten::sin" in fused.compile_failures[0].ops
    a = torch.randn(1, 1, 8, 8)
    torch.testing.assert_close(fused(a), seed(a))


def test_identical_groups_compile_once(monkeypatch):
    from nncfuse.jit.fuser import guard

    compiled = []
    real = guard.TensorExprKernel
    monkeypatch.setattr(guard, "TensorExprKernel", lambda *a: compiled.append(1) or real(*a))

    def f(a, b):
        return torch.cos(a * 3.0) - b, torch.cos(b * 3.0) - a

    def g(x, y):  # the same computation with other names: the same kernel
        return torch.cos(x * 3.0) - y, torch.cos(y * 3.0) - x

    a, b = torch.randn(7, 3), torch.randn(7, 3)
    ff, _ = optimized(f, a, b)  # (kept: a kernel is shared while a function uses it)
    before = len(compiled)
    fg, graph = optimized(g, a, b)
    assert len(compiled) == before and before >= 1
    for got, want in zip(fg(a, b), g(a, b)):
        torch.testing.assert_close(got, want)
