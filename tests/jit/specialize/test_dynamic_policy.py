"""The dynamic-shapes policy: static first, dynamic on the sizes that change, bounded."""

import pytest
import torch

import nncfuse
from nncfuse.jit.fuser import guard
from nncfuse.jit.specialize import policy
from nncfuse.jit.specialize.plans import UnfusedPlan


def chain(a, b):
    return torch.sigmoid(a * b) + torch.tanh(b)


def count_compiles(monkeypatch):
    compiled = []
    real = guard.TensorExprKernel

    def kernel(*args):
        k = real(*args)
        compiled.append(k.dynamic)  # each kernel compiled: dynamic or not
        return k

    monkeypatch.setattr(guard, "TensorExprKernel", kernel)
    guard.clear_kernel_cache()
    return compiled


def distinct_plans(f):
    return {id(p) for p in f._plans.values()}


@pytest.mark.parametrize("meta", [True, False], ids=["meta", "profiled"])
def test_thirty_lengths_compile_two_kernels_and_all_run_fused(monkeypatch, meta):
    monkeypatch.setattr(policy, "_meta_is_cheap", lambda: meta)
    compiled = count_compiles(monkeypatch)
    f = nncfuse.jit(chain)
    for n in range(1000, 1030):
        a, b = torch.randn(n), torch.randn(n)
        for _ in range(2):
            torch.testing.assert_close(f(a, b), chain(a, b))
    assert compiled == [False, True]  # a static kernel, then one dynamic kernel
    assert len(distinct_plans(f)) == 2
    for n in range(1000, 1030):
        assert nncfuse.fusion_groups(f.graph_for(torch.randn(n), torch.randn(n)))


def test_dynamic_true_compiles_one_kernel_from_the_first_call(monkeypatch):
    compiled = count_compiles(monkeypatch)
    f = nncfuse.jit(chain, dynamic=True)
    for rows, cols in [(4, 5), (7, 3), (0, 9), (30, 200)]:
        a, b = torch.randn(rows, cols), torch.randn(cols)
        torch.testing.assert_close(f(a, b), chain(a, b))
    assert compiled == [True]


def test_dynamic_false_is_static_per_signature_and_unfused_past_the_bound(monkeypatch):
    compiled = count_compiles(monkeypatch)
    f = nncfuse.jit(chain, dynamic=False, max_specializations=3)
    with pytest.warns(UserWarning, match="max_specializations=3") as caught:
        for n in range(10, 15):
            a, b = torch.randn(n), torch.randn(n)
            torch.testing.assert_close(f(a, b), chain(a, b))
    assert sum("max_specializations" in str(w.message) for w in caught) == 1  # once
    assert compiled == [False] * 3
    assert isinstance(f._plans[policy.signature((torch.randn(14), torch.randn(14)))],
                      UnfusedPlan)


def test_fusion_strategy_static_then_dynamic(monkeypatch):
    compiled = count_compiles(monkeypatch)
    f = nncfuse.jit(chain, dynamic=[("STATIC", 2), ("DYNAMIC", 1)])
    for n in range(20, 30):
        a, b = torch.randn(n), torch.randn(n)
        torch.testing.assert_close(f(a, b), chain(a, b))
    assert compiled == [False, False, True]
    b3 = torch.randn(3, 3)  # another size class, past every bound: unfused
    torch.testing.assert_close(f(b3, b3), chain(b3, b3))
    assert nncfuse.fusion_groups(f.graph_for(b3, b3)) == []


def test_a_dim_of_one_and_shared_sizes_are_part_of_the_class(monkeypatch):
    compiled = count_compiles(monkeypatch)
    f = nncfuse.jit(chain, dynamic=True)
    cases = [((6, 8), (6, 8)), ((5, 9), (5, 9)), ((1, 9), (5, 9)), ((7, 7), (7, 7))]
    for sa, sb in cases:
        a, b = torch.randn(sa), torch.randn(sb)
        torch.testing.assert_close(f(a, b), chain(a, b))
    assert compiled == [True, True, True]  # (6, 8) and (5, 9) share one


def test_groups_that_cannot_be_dynamic_get_static_kernels(monkeypatch):
    def reduce(a):
        return (a * 2).amax(0) + 1  # a symbol may be 0, where eager's amax raises

    compiled = count_compiles(monkeypatch)
    f = nncfuse.jit(reduce, dynamic=True, min_group_size=1)
    for n in (4, 5, 6):
        a = torch.randn(n, 3)
        torch.testing.assert_close(f(a), reduce(a))
    assert compiled == [False] * 3  # no dynamic kernel: a static one per size


def _layer_norm(x, w, b):
    return torch.nn.functional.layer_norm(x * 2.0, (64,), w, b, 1e-5) + 1.0


def _softmax(x):
    return torch.softmax(x * 2.0, -1) + 1.0


def _sum(x):
    return (x * 2).sum(-1, keepdim=True) - x


def _transpose(x, y):
    return (x + 1).transpose(0, 1) + y


def _views(x, y):
    return (x * 2).unsqueeze(1) + y.unsqueeze(0).sin()


def _cat(x, y):
    return torch.cat([x + 1, y * 2], 1).relu()


def _permute(x):
    return (x.sin().permute(2, 0, 1) * 3).relu().squeeze(1)


def _heads(x, b):  # a transformer's head split and merge, the sequence length changing
    q = (x + b).view(3, -1, 4, 16).transpose(1, 2)
    return (q.relu() * 2).transpose(1, 2).reshape(3, -1, 64), (x * 3).flatten(1)[1:]


ROWS = [8, 13, 5, 0, 40, 1, 2, 77]


@pytest.mark.parametrize("fn, make", [
    (_layer_norm, lambda n: (torch.randn(n, 64), torch.randn(64), torch.randn(64))),
    (_softmax, lambda n: (torch.randn(n, 48),)),
    (_sum, lambda n: (torch.randn(n, 3, 33),)),
    (_transpose, lambda n: (torch.randn(n, 24), torch.randn(24, n))),
    (_views, lambda n: (torch.randn(n, 6), torch.randn(n + 3, 6))),
    (_permute, lambda n: (torch.randn(n, 1, n + 2),)),
    (_cat, lambda n: (torch.randn(n, 24), torch.randn(n, 9))),
    (_heads, lambda n: (torch.randn(3, n, 64), torch.randn(64))),
], ids=["layer_norm", "softmax", "sum", "transpose", "unsqueeze", "permute_squeeze", "cat",
        "heads"])
def test_reductions_and_views_over_dynamic_rows(monkeypatch, fn, make):
    """Static first; then the dims that changed are symbols and the others (a reduction's
    extent) stay static: one dynamic kernel runs all later sizes, 0 included (1 is another
    size class)."""
    compiled = count_compiles(monkeypatch)
    f = nncfuse.jit(fn)
    for n in ROWS:
        args = make(n)
        for got, want in zip(*(r if isinstance(r, tuple) else (r,) for r in (f(*args),
                                                                              fn(*args)))):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
            assert got.stride() == want.stride() or want.numel() == 0
    assert compiled.count(True) == 1
    assert len(compiled) <= 3  # the first size, the dynamic kernel, the class with a 1


def test_a_cat_along_a_dim_that_changes_gets_a_dynamic_kernel(monkeypatch):
    """Its output's length is the sum of its parts' (`s0 + s0`); a part of symbolic length
    must not be empty (it is read at an index clamped into it): at 0 the kernel runs its
    fallback. Where the sum's value is a static size (16 rows: 2 * 8, and 16 columns) the
    group compiles statically."""
    def cat0(x, y):
        return torch.cat([x + 1, y * 2], 0).relu()

    compiled = count_compiles(monkeypatch)
    f = nncfuse.jit(cat0)
    for n in (8, 13, 16, 5, 0, 1, 2):
        x, y = torch.randn(n, 16), torch.randn(n, 16)
        torch.testing.assert_close(f(x, y), cat0(x, y))
    assert compiled.count(True) == 1
    assert len(distinct_plans(f)) <= 4  # 8 static, 13 dynamic, 16 (rows 32), 1 (a dim of 1)


def tail(x):
    return x[-3:] * 2


def front(x):
    return x[1:4].exp()


def tails(x):
    return x[-3:-1] + x[-2:-1]


def cat_then_tail(x):
    return torch.cat([x, x[-1:]]).relu()[-2:]


@pytest.mark.parametrize("fn", [tail, front, tails, cat_then_tail])
def test_slices_of_constant_bounds_along_a_symbolic_dim(monkeypatch, fn):
    """A constant-length slice along a dim of symbolic size is one dynamic kernel whose guard
    bounds the symbol from below: shorter inputs run the fallback, as eager."""
    compiled = count_compiles(monkeypatch)
    f = nncfuse.jit(fn, dynamic=True)
    for n in (9, 6, 4, 3, 2, 1, 0, 12):
        x = torch.randn(n, 5)
        torch.testing.assert_close(f(x), fn(x))
    assert compiled[0] is True


def test_a_kv_cache_cat_serves_every_length_with_one_plan(monkeypatch):
    """A decode step's shape through the backend: a new token's projection (views of
    constant sizes: the dims Dynamo keeps static stay static in the dynamic kernels), a cat
    onto a cache whose length Dynamo made symbolic, a slice of constant bounds along it, a
    reduction over a fixed dim. Twenty lengths take one dynamic plan, each equal to eager."""
    import nncfuse.backend  # noqa: F401 - registers the backend

    def step(x, past, w):
        q = torch.nn.functional.linear(x, w).view(1, 1, 2, 16).transpose(1, 2)
        k = torch.cat([past, q * 0.5], dim=-2)
        scores = (q * k).sum(-1).softmax(-1)
        return scores, k, k[:, :, -1:] + 1

    torch._dynamo.reset()
    nncfuse.backend.clear_compiled_graphs()
    compiled = torch.compile(step, backend="nncfuse")
    x, w = torch.randn(1, 1, 32), torch.randn(32, 32)
    try:
        for n in range(3, 23):
            past = torch.randn(1, 2, n, 16)
            torch._dynamo.mark_dynamic(past, 2)
            for got, want in zip(compiled(x, past, w), step(x, past, w), strict=True):
                torch.testing.assert_close(got, want)
        graphs = [g for g in nncfuse.backend.compiled_graphs() if g.program is not None]
        assert len(graphs) == 1
        plans = graphs[0].policy.plans
        assert len(plans) == 20
        assert len({id(p) for p in plans.values()}) <= 3
        assert not any(isinstance(p, UnfusedPlan) for p in plans.values())
    finally:
        torch._dynamo.reset()


def test_past_every_bound_a_class_that_a_dynamic_plan_generalizes_runs_fused(monkeypatch):
    """(7, 7) is another size class than (6, 8) (its dims are equal), but the dynamic kernel
    for (6, 8) binds a symbol per dim, so its guard admits it: past the bound that plan runs.
    A dim of 1 fails every dynamic guard: that class runs unfused."""
    compiled = count_compiles(monkeypatch)
    f = nncfuse.jit(chain, dynamic=True, max_specializations=1)
    for shape in [(6, 8), (7, 7), (3, 3), (1, 9), (0, 0)]:
        a, b = torch.randn(shape), torch.randn(shape)
        torch.testing.assert_close(f(a, b), chain(a, b))
    assert compiled == [True]
    assert f._plans[policy.signature((a, b))] is f._plans[
        policy.signature((torch.randn(6, 8), torch.randn(6, 8)))]
    assert nncfuse.fusion_groups(f.graph_for(torch.randn(7, 7), torch.randn(7, 7)))
    one = torch.randn(1, 9)
    assert isinstance(f._plans[policy.signature((one, one))], UnfusedPlan)


def test_generalizes_only_splits_dims_of_equal_size():
    from nncfuse.jit.specialize.size_classes import generalizes, size_class

    def cls(*shapes):
        return size_class(tuple(torch.randn(s) for s in shapes))

    assert generalizes(cls((6, 8), (6, 8)), cls((7, 7), (7, 7)))
    assert generalizes(cls((6, 8)), cls((6, 8)))
    assert not generalizes(cls((7, 7), (7, 7)), cls((6, 8), (6, 8)))  # one symbol, two sizes
    assert not generalizes(cls((6, 8)), cls((1, 8)))  # a dim of 1 broadcasts
    assert not generalizes(cls((6, 8)), cls((6, 8, 2)))  # rank
    assert not generalizes(cls((6, 8)), size_class((torch.randn(6, 8).double(),)))  # dtype
    assert not generalizes(cls((6, 8)), size_class((torch.randn(8, 6).t(),)))  # layout


def test_graph_for_a_dynamic_plan_shows_its_symbolic_dims_as_stars():
    f = nncfuse.jit(chain)
    for n in (10, 11):
        f(torch.randn(n, 64), torch.randn(64))
    static = str(f.graph_for(torch.randn(10, 64), torch.randn(64)))
    shown = str(f.graph_for(torch.randn(37, 64), torch.randn(64)))
    assert "Float(10, 64, strides=[64, 1]" in static and "*" not in static
    assert "Float(*, 64, device=cpu)" in shown and "Float(11" not in shown
    assert "Float(*, 64" in shown.split("with ")[1]  # the subgraph's values too
    f(torch.randn(37, 64), torch.randn(64))  # the plan still runs after it was shown


def _around_an_unfused_op(x):
    a = (x * 2).sin() + 1
    return (torch.cumsum(a, 1) + 1).cos() * 3  # cumsum: no lowering, runs between groups


def test_a_plan_whose_kernels_are_dynamic_serves_the_class_with_unfused_nodes_between(
        monkeypatch):
    compiled = count_compiles(monkeypatch)
    f = nncfuse.jit(_around_an_unfused_op)
    for n in (5, 9, 3, 0, 17, 40, 2):
        x = torch.randn(n, 6)
        torch.testing.assert_close(f(x), _around_an_unfused_op(x))
    assert compiled == [False, False, True, True], compiled  # then the dynamic plan serves
    assert len(distinct_plans(f)) == 2


def _split_of_a_changing_dim(x):
    a, b = (x.abs() + 1).log().split([3, 5], -1)  # the fuser spells it as two slices
    return a, b


@pytest.mark.parametrize("dynamic", [True, None])
def test_slices_of_profiled_lengths_outside_groups_keep_a_plan_from_serving_other_sizes(dynamic):
    """Fuzzer seed 13221: the slices a split became, unfused, along a dim that changes: a
    plan with them is not the class's plan, so a length the split does not fit still raises
    as eager does."""
    f = nncfuse.jit(_split_of_a_changing_dim, dynamic=dynamic)
    for n in (8, 8, 8):
        x = torch.rand(n)
        for got, want in zip(f(x), _split_of_a_changing_dim(x)):
            torch.testing.assert_close(got, want)
    for n in (13, 9):
        with pytest.raises(RuntimeError, match="split"):
            f(torch.rand(n))
