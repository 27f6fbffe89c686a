"""Views, slices, cat and stack inside fusion groups: index arithmetic, against eager.

Every case runs through `nncfuse.jit` on both backends and compares with
eager bit for bit, strides of the outputs included, and checks which ops
ended up inside a group. Returned views of inputs must stay eager's views.
"""

import warnings

import pytest
import torch

import nncfuse
from nncfuse.jit.fuser.supported import why_not_fusible
from nncfuse.tensorexpr import expr as E
from nncfuse.tensorexpr.ir_visitor import walk
from tests.fused import BACKENDS, assert_exact


def fused_kinds(graph):
    """The node kinds inside the fusion groups of an optimized graph."""
    kinds = set()
    for group in nncfuse.fusion_groups(graph):
        kinds |= {n.kind() for n in group.g("Subgraph").nodes()}
    return kinds


def run(fn, *args, use_llvm=True, traced=False):
    """(fused result, eager result, kinds fused) of `fn` on fresh copies of `args`."""
    def fresh():
        return [a.clone() if isinstance(a, torch.Tensor) and a.is_contiguous() else a
                for a in args]

    target = fn
    if traced:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            target = torch.jit.trace(fn, tuple(args), check_trace=False)
    f = nncfuse.jit(target, min_group_size=1, use_llvm=use_llvm)
    f(*fresh())
    got = f(*args)
    return got, fn(*fresh()), fused_kinds(f.graph_for(*args))


def same(got, want):
    got = got if isinstance(got, tuple) else (got,)
    want = want if isinstance(want, tuple) else (want,)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert_exact(g, w)
        assert g.shape == w.shape
        for size, a, b in zip(w.shape, g.stride(), w.stride()):
            assert size <= 1 or a == b, (g.stride(), w.stride())


def rand(*shape):
    return torch.randn(*shape)


def case_view(x):
    return (x * 2).view(-1, 3) + 1


def case_view_unit_dims(x):
    return (x * 2).view(2, 1, 12, 1).relu()


def case_view_regroups(x):
    return (x * 2).view(3, 8) - 1


def case_reshape_of_transposed(x):
    return (x.t() * 2).reshape(-1)


def case_flatten(x):
    return (x * 2).flatten(1).relu()


def case_unflatten(x):
    return (x * 2).unflatten(1, (2, 3)).relu()


def case_squeeze_unsqueeze(x):
    return (x * 2).unsqueeze(-1).squeeze(-1).unsqueeze(0).squeeze().squeeze(1).neg()


def case_squeeze_dims(x):
    return (x + 1).squeeze((0, 2)) * 2


def case_permute(x):
    return (x + 1).permute(2, 0, 1).relu()


def case_transpose_negative(x):
    return (x + 1).transpose(0, -1) * 2


def case_t(x):
    return (x + 1).t()


def case_t_1d(x):
    return (x + 1).t() * 2


def case_movedim(x):
    return x.movedim(0, -1) * 2


def case_contiguous(x):
    return (x.t() + 1).contiguous()


def case_slice_steps(x):
    return (x + 1)[1:, ::2] * 3


def case_slice_negative(x):
    return x[-3:-1] * 2


def case_slice_empty(x):
    return x[:, 10:] * 2


def case_slice_long_step(x):
    return x[::10] * 2


def case_select(x):
    return (x * 2)[1] + x[:, -1].unsqueeze(-1)


def case_narrow(x):
    return (x * 2).narrow(1, -3, 2)


def case_expand_after_view(x, y):
    return (x * 2).view(4, 1, 6).expand(4, 3, 6) + y


def case_broadcast_after_view(x, b):
    return x.t() + b


def case_transposed_input(x):
    return x.reshape(-1) * 2


def case_sliced_input(x):
    return x.t()[1:] * 2


def case_zero_size(x):
    return (x * 2).view(-1, 3).t() + 1


def case_cat(x, y):
    return torch.cat([x + 1, y * 2], 1).relu()


def case_cat_dim0_three(x, y):
    return torch.cat([x, y * 2, x.neg()]) * 2


def case_cat_negative_dim(x, y):
    return torch.cat((x.t(), y), -1) - 1


def case_cat_empty_parts(x, y, e):
    return torch.cat([x + 1, e, y + 1, e[:, :0]], 1)


def case_cat_legacy_empty(x, e):
    return torch.cat([x * 2, e])


def case_cat_then_transpose(x, y):
    return torch.cat([x + 1, y], 1).t() * 2


def case_cat_then_view(x, y):
    return torch.cat([x + 1, y], 1).view(-1) * 2


def case_stack(x, y):
    return torch.stack([x + 1, y * 2], 1).relu()


def case_stack_last(x, y):
    return torch.stack([x, y, x], -1) * 2


# name: (function, inputs, kinds that must be fused)
CASES = {
    "view": (case_view, [rand(4, 6)], {"aten::view"}),
    "view_unit_dims": (case_view_unit_dims, [rand(4, 6)], {"aten::view"}),
    "view_regroups": (case_view_regroups, [rand(4, 6)], {"aten::view"}),
    "reshape_of_transposed": (case_reshape_of_transposed, [rand(4, 6)],
                              {"aten::reshape", "aten::t"}),
    "flatten": (case_flatten, [rand(2, 3, 4)], {"aten::flatten"}),
    "unflatten": (case_unflatten, [rand(4, 6)], {"aten::unflatten"}),
    "squeeze_unsqueeze": (case_squeeze_unsqueeze, [rand(4, 1, 6)],
                          {"aten::unsqueeze", "aten::squeeze"}),
    "squeeze_dims": (case_squeeze_dims, [rand(1, 5, 1, 3)], {"aten::squeeze"}),
    "permute": (case_permute, [rand(2, 3, 4)], {"aten::permute"}),
    "transpose_negative": (case_transpose_negative, [rand(2, 3, 4)], {"aten::transpose"}),
    "t": (case_t, [rand(4, 6)], {"aten::t"}),
    "t_1d": (case_t_1d, [rand(5)], {"aten::t"}),
    "movedim": (case_movedim, [rand(2, 3, 4)], {"aten::movedim"}),
    "contiguous": (case_contiguous, [rand(4, 6)], {"aten::contiguous"}),
    "slice_steps": (case_slice_steps, [rand(5, 7)], {"aten::slice"}),
    "slice_negative": (case_slice_negative, [rand(5, 7)], {"aten::slice"}),
    "slice_empty": (case_slice_empty, [rand(5, 7)], {"aten::slice"}),
    "slice_long_step": (case_slice_long_step, [rand(5, 7)], {"aten::slice"}),
    "select": (case_select, [rand(5, 5)], {"aten::select"}),
    "narrow": (case_narrow, [rand(4, 6)], {"aten::narrow"}),
    "expand_after_view": (case_expand_after_view, [rand(4, 6), rand(3, 6)],
                          {"aten::view", "aten::expand"}),
    "broadcast_after_view": (case_broadcast_after_view, [rand(4, 6), rand(4)], {"aten::t"}),
    "transposed_input": (case_transposed_input, [rand(6, 4).t()], {"aten::reshape"}),
    "sliced_input": (case_sliced_input, [rand(4, 12)[:, ::2]], {"aten::t", "aten::slice"}),
    "zero_size": (case_zero_size, [rand(0, 6)], {"aten::view", "aten::t"}),
    "cat": (case_cat, [rand(4, 5), rand(4, 3)], {"aten::cat", "prim::ListConstruct"}),
    "cat_dim0_three": (case_cat_dim0_three, [rand(2, 3), rand(4, 3)], {"aten::cat"}),
    "cat_negative_dim": (case_cat_negative_dim, [rand(3, 4), rand(4, 2)], {"aten::cat", "aten::t"}),
    "cat_empty_parts": (case_cat_empty_parts, [rand(3, 2), rand(3, 4), rand(3, 0)], {"aten::cat"}),
    "cat_legacy_empty": (case_cat_legacy_empty, [rand(3, 2), rand(0)], {"aten::cat"}),
    "cat_then_transpose": (case_cat_then_transpose, [rand(3, 2), rand(3, 4)],
                           {"aten::cat", "aten::t"}),
    "cat_then_view": (case_cat_then_view, [rand(3, 2), rand(3, 4)], {"aten::cat", "aten::view"}),
    "stack": (case_stack, [rand(4, 5), rand(4, 5)], {"aten::stack"}),
    "stack_last": (case_stack_last, [rand(4, 5), rand(4, 5)], {"aten::stack"}),
}


@pytest.mark.parametrize("use_llvm", BACKENDS)
@pytest.mark.parametrize("name", list(CASES))
def test_view_ops_fuse_and_match_eager(name, use_llvm):
    fn, args, kinds = CASES[name]
    got, want, fused = run(fn, *args, use_llvm=use_llvm)
    same(got, want)
    assert kinds <= fused, fused


@pytest.mark.parametrize("name", ["view", "permute", "slice_steps", "cat", "stack"])
def test_traced_view_ops_fuse(name):
    fn, args, kinds = CASES[name]
    got, want, fused = run(fn, *args, traced=True)
    same(got, want)
    assert kinds <= fused, fused


def cat_twice(x, y):
    c = torch.cat([x + 1, y], 1)
    return c * c


@pytest.mark.parametrize("use_llvm", BACKENDS)
def test_cat_read_twice_writes_its_parts_in_place(use_llvm):
    got, want, fused = run(cat_twice, rand(3, 2), rand(3, 4), use_llvm=use_llvm)
    same(got, want)
    assert "aten::cat" in fused


DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8,
          torch.int16, torch.int32, torch.int64, torch.bool]


def views_of_every_kind(x):
    return torch.cat([x.t(), x[1:], x.view(2, 8).view(4, 4)[::2]], 0)


@pytest.mark.parametrize("use_llvm", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_every_dtype(dtype, use_llvm):
    x = (torch.randn(4, 4) * 50).to(dtype)
    got, want, fused = run(views_of_every_kind, x, use_llvm=use_llvm)
    same(got, want)
    assert {"aten::cat", "aten::t", "aten::slice", "aten::view"} <= fused


def cat_mixed(x, y):
    return torch.cat([x, y], 0)


@pytest.mark.parametrize("use_llvm", BACKENDS)
def test_cat_promotes(use_llvm):
    x, y = torch.tensor([[1, -2]], dtype=torch.int8), torch.tensor([[0.5, 300.0]])
    got, want, fused = run(cat_mixed, x, y, use_llvm=use_llvm)
    same(got, want)
    assert "aten::cat" in fused


def test_cat_loops_have_no_selects():
    """`partition_loops` gives each part its own loop: no select, no clamp is left."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        traced = torch.jit.trace(CASES["cat"][0], (rand(4, 5), rand(4, 3)), check_trace=False)
    kernel = nncfuse.TensorExprKernel(traced.graph)
    assert not [n for n in walk(kernel.stmt) if isinstance(n, (E.Select, E.Max, E.Min))
                and n.dtype.scalar.is_int]
    assert not [n for n in walk(kernel.stmt) if isinstance(n, E.Select)]


# -- returned views ------------------------------------------------------------------------


def shares_memory(a, b):
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def returns_transpose(x):
    return x.transpose(0, 1)


def returns_slice(x):
    return x[1:]


def returns_view(x):
    return x.view(-1)


def returns_chain(x):
    return x.t().unsqueeze(0)[:, 1:]


def returns_also_used(x):
    return x.t() + 1, x.t()


def returns_contiguous(x):
    return x.contiguous(), x.contiguous() * 2


RETURNED_VIEWS = {
    "transpose": returns_transpose,
    "slice": returns_slice,
    "view": returns_view,
    "chain": returns_chain,
    "also_used": returns_also_used,
    "contiguous": returns_contiguous,
}


@pytest.mark.parametrize("name", list(RETURNED_VIEWS))
def test_returned_views_of_inputs_stay_views(name):
    fn = RETURNED_VIEWS[name]
    x = rand(4, 6)
    f = nncfuse.jit(fn, min_group_size=1)
    f(x)
    got = f(x)
    want = fn(x)
    same(got, want)
    got = got if isinstance(got, tuple) else (got,)
    want = want if isinstance(want, tuple) else (want,)
    for g, w in zip(got, want):
        assert shares_memory(g, x) == shares_memory(w, x)


def view_of_computed(x):
    y = x + 1
    return y, y.t(), y[:, ::2]


def test_returned_views_of_computed_values_share_its_memory():
    x = rand(4, 6)
    got, want, fused = run(view_of_computed, x)
    same(got, want)
    assert shares_memory(got[0], got[1]) and shares_memory(got[0], got[2])
    assert "aten::add" in fused


def view_strides(x):
    return (x + 1).t(), (x * 2)[:, ::2], (x - 1).view(2, 12)


@pytest.mark.parametrize("use_llvm", BACKENDS)
def test_returned_views_of_computed_values_have_eager_strides(use_llvm):
    got, want, fused = run(view_strides, rand(4, 6), use_llvm=use_llvm)
    same(got, want)
    assert {"aten::t", "aten::slice", "aten::view"} <= fused


def view_then_write(x):
    y = x.view(-1)
    x.add_(1)
    return y * 2


def transpose_then_write(x):
    y = x.t()
    z = y + 1
    x.mul_(2)
    return z + y


def write_through_a_view(x):
    y = x.t()
    z = y * 2
    y.add_(1)
    return z + x.t(), x[1:]


def write_to_a_computed_base(x):
    b = x * 2
    v = b.view(-1)
    b.mul_(3)
    return v + 1, b[:, 1:]


@pytest.mark.parametrize(
    "fn", [view_then_write, transpose_then_write, write_through_a_view, write_to_a_computed_base]
)
def test_writes_to_a_views_base(fn):
    x = rand(4, 6)
    f = nncfuse.jit(fn, min_group_size=1)
    f(x.clone())
    got = f(x.clone())
    same(got, fn(x.clone()))


def heads_merge(x):
    return x.transpose(1, 2).reshape(2, 6, 12)


def transposed_contiguous(x):
    return x.t().contiguous()


def permuted_flatten(x):
    return x.permute(0, 2, 1).flatten(1)


def copy_then_write(x):
    y = x.transpose(1, 2).reshape(2, 6, 12)  # a copy in eager: writing it leaves x alone
    y.add_(1)
    return y, x * 2


def copy_then_view(x):
    y = x.transpose(1, 2).reshape(2, 6, 12)
    return y.view(12, 12), y  # two views of the fresh copy: they share its memory


def still_a_view(x):
    return x.reshape(2, 6, 12), x.contiguous()  # the input's layout: eager's views


COPYING_VIEWS = [heads_merge, transposed_contiguous, permuted_flatten, copy_then_write,
                 copy_then_view, still_a_view]


@pytest.mark.parametrize("fn", COPYING_VIEWS, ids=lambda f: f.__name__)
@pytest.mark.parametrize("use_llvm", BACKENDS)
def test_views_that_copy_in_eager_are_a_kernel(fn, use_llvm):
    """A reshape, flatten or contiguous whose input's strides no view of its result has is a
    fresh tensor in eager too: a group of views that copies (a transpose feeding one) fuses at
    the default `min_group_size`, with eager's bits (NaN, infinities, -0.0), and the outputs
    share memory with the input and each other as eager's do."""
    x = {transposed_contiguous: rand(12, 12), permuted_flatten: rand(2, 12, 6),
         still_a_view: rand(2, 6, 12)}.get(fn, rand(2, 3, 6, 4))
    x.view(-1)[:4] = torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0])
    f = nncfuse.jit(fn, use_llvm=use_llvm)
    f(x.clone())
    xs, xe = x.clone(), x.clone()
    got, want = f(xs), fn(xe)
    same(got, want)
    same(xs, xe)
    got = got if isinstance(got, tuple) else (got,)
    want = want if isinstance(want, tuple) else (want,)
    assert [shares_memory(g, xs) for g in got] == [shares_memory(w, xe) for w in want]
    assert shares_memory(got[0], got[-1]) == shares_memory(want[0], want[-1])
    groups = nncfuse.fusion_groups(f.graph_for(x.clone()))
    assert bool(groups) == (fn in (heads_merge, transposed_contiguous, permuted_flatten,
                                   copy_then_view)), \
        fn.__name__


def view_by_number(x, n: int):
    return x.view(n, -1) * 2


def test_sizes_from_numbers_are_not_fused():
    """A view size that is a number argument is no size of a tensor: nothing guards it."""
    x = rand(4, 2, 3)
    f = nncfuse.jit(view_by_number, min_group_size=1)
    f(x, 4)
    same(f(x, 4), view_by_number(x, 4))
    same(f(x, 2), view_by_number(x, 2))
    kinds = fused_kinds(f.graph_for(x, 4))
    assert "aten::view" not in kinds and "aten::mul" in kinds
    f = nncfuse.jit(view_by_number, min_group_size=1, profiling_runs=1)
    f(x, 4)
    view = next(n for n in f.graph_for(x, 4).nodes() if n.kind() == "aten::view")
    assert "not a constant" in why_not_fusible(view)


def transpose_add(x, y):
    return (x + 1).transpose(0, 1) + y


def test_transpose_reads_input_once():
    """(x + 1).transpose(0, 1) + y is one nest that reads x once per element."""
    x, y = rand(8, 4), rand(4, 8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        traced = torch.jit.trace(transpose_add, (x, y), check_trace=False)
    kernel = nncfuse.TensorExprKernel(traced.graph)
    text = str(kernel.stmt)
    assert text.count("x[") == 1, text
    assert_exact(kernel.run([x, y]), transpose_add(x, y))


# -- OpInfo samples -------------------------------------------------------------------------

OPINFO_VIEWS = [
    "view", "reshape", "flatten", "unflatten", "squeeze", "unsqueeze", "permute", "transpose",
    "t", "movedim", "contiguous", "narrow", "select", "view_as", "reshape_as", "mT",
    "expand", "cat", "stack", "flip", "roll", "tril", "triu", "nn.functional.pad",
    "repeat", "index_select", "gather",
]
KINDS = {"nn.functional.pad": ("aten::pad", "aten::constant_pad_nd")}


def _computed(t):
    """`t` through an exact fusible op, so that the view is of a value computed in the group."""
    return ~t if t.dtype == torch.bool else -t


def _opinfo_call(op, sample, computed=True):
    """(tensors, function of them calling `op` on the sample, its tensors computed in the group
    first if `computed`)."""
    from nncfuse import testing

    pre = _computed if computed else (lambda t: t)

    if isinstance(sample.input, (list, tuple)):
        tensors = list(sample.input)

        def call(*ts):
            return op.op([pre(t) for t in ts], *sample.args, **sample.kwargs)

        return tensors, call
    tensors, rebuild = testing._split(sample)

    def call(*ts):
        a, k = rebuild((pre(ts[0]), *ts[1:]))
        return op.op(*a, **k)

    return tensors, call


@pytest.mark.parametrize("computed", [True, False], ids=["computed", "input"])
@pytest.mark.parametrize("name", OPINFO_VIEWS)
def test_opinfo_samples(name, computed):
    """OpInfo's samples of the view ops, applied to a value computed in the group (fused), or
    to an input (then eager's result is a view of it, and so must ours be)."""
    pytest.importorskip("expecttest")
    from torch.testing._internal.common_methods_invocations import op_db

    from nncfuse import testing

    ops = [op for op in op_db if op.name == name and op.variant_test_name in ("", "constant",
                                                                             "multiple")]
    kinds = KINDS.get(name, ("aten::" + name,))
    total = fused = 0
    failures = []
    for op in ops:
        for dtype in (torch.float32, torch.int64, torch.bool):
            for k, sample in enumerate(testing.samples(op, dtype)):
                if k >= 6:
                    break
                tensors, call = _opinfo_call(op, sample, computed)
                if not tensors:
                    continue
                try:
                    want = call(*tensors)
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        traced = torch.jit.trace(call, tuple(tensors), check_trace=False)
                except Exception:  # noqa: BLE001 - eager or the tracer rejects the sample
                    continue
                if not isinstance(want, torch.Tensor):
                    continue
                f = nncfuse.jit(traced, min_group_size=1)
                f(*tensors)
                got = f(*tensors)
                message = testing._same(got, want)
                if not message and not computed and any(
                    shares_memory(want, t) != shares_memory(got, t) for t in tensors
                ):
                    message = "shares memory with an input where eager does not, or the reverse"
                if message:
                    failures.append(f"{op.name}[{dtype}] #{k}: {message}")
                total += 1
                fused += any(kind in kinds for kind in fused_kinds(f.graph_for(*tensors)))
    assert not failures, "\n".join(failures[:10])
    if not computed:
        return
    # narrow's samples with a tensor start (narrow.Tensor) stay unfused: it is a run-time value
    assert total and fused >= (0.5 if name == "narrow" else 0.8) * total, f"{fused}/{total} fused"


# -- padding, flips, rolls, triangles ----------------------------------------------------------


def pad_constant(x):
    return torch.nn.functional.pad(x * 2, (1, 2, 0, 1), value=3.5) + 1


def pad_negative(x):
    return torch.constant_pad_nd(x + 1, [-1, 2, 1, -2])


def flip_roll(x):
    return (x * 2).flip(0, -1) + x.roll(2, 1) + x.roll((1, -7), (0, 1))


def roll_flat(x):
    return (x + 1).roll(3)


def triangles(x):
    return (x + 1).tril() + x.triu(1) * 2 + x.tril(-2)


MORE = {
    "pad_constant": (pad_constant, [rand(3, 4)], {"aten::pad"}),
    "pad_negative": (pad_negative, [rand(3, 5)], {"aten::constant_pad_nd"}),
    "pad_empty": (pad_constant, [rand(0, 4)], {"aten::pad"}),
    "flip_roll": (flip_roll, [rand(3, 5)], {"aten::flip", "aten::roll"}),
    "roll_flat": (roll_flat, [rand(3, 5)], {"aten::roll"}),
    "triangles": (triangles, [rand(2, 4, 5)], {"aten::tril", "aten::triu"}),
}


@pytest.mark.parametrize("use_llvm", BACKENDS)
@pytest.mark.parametrize("name", list(MORE))
def test_pad_flip_roll_triangles(name, use_llvm):
    fn, args, kinds = MORE[name]
    got, want, fused = run(fn, *args, use_llvm=use_llvm)
    same(got, want)
    assert kinds <= fused, fused


@pytest.mark.parametrize("dtype", [torch.int8, torch.float16, torch.bool])
def test_pad_flip_roll_triangles_dtypes(dtype):
    x = (torch.randn(3, 5) * 50).to(dtype)
    for fn in (flip_roll, triangles):
        if dtype == torch.bool:
            continue
        got, want, _ = run(fn, x)
        same(got, want)
    got, want, fused = run(pad_negative, x) if dtype != torch.bool else run(triangles_bool, x)
    same(got, want)


def triangles_bool(x):
    return x.tril() | x.flip(0).triu()


# -- chunk, split, unbind: one slice per part ---------------------------------------------------


def chunk_split_unbind(x):
    a, b = (x + 1).chunk(2, 1)
    c, d, e = x.split([1, 2, 3], -1)
    p, q = torch.split(x * 2, 3, 1)
    u, v, w, z = (x * 2)[:, :4].unbind(1)
    return a * b + c + e + p.relu() * q + d[:, :1], u + v * w - z


def chunk_uneven(x):
    a, b, c = (x - 1).chunk(3, 0)
    return a * 2, b + 1, c.neg()


def chunk_of_input_returned(x):
    a, b = x.chunk(2, 1)
    return a, b * 2


@pytest.mark.parametrize("use_llvm", BACKENDS)
def test_chunk_split_unbind_fuse(use_llvm):
    got, want, fused = run(chunk_split_unbind, rand(4, 6), use_llvm=use_llvm)
    same(got, want)
    assert {"aten::slice", "aten::select"} <= fused
    assert not {"aten::chunk", "aten::split", "aten::unbind"} & fused
    got, want, fused = run(chunk_uneven, rand(5, 3), use_llvm=use_llvm)
    same(got, want)
    assert "aten::slice" in fused


def test_returned_chunk_of_an_input_is_a_view():
    x = rand(4, 6)
    got, want, fused = run(chunk_of_input_returned, x)
    same(got, want)
    assert shares_memory(got[0], x) and not shares_memory(got[1], x)
    assert {"aten::slice", "aten::mul"} <= fused


def two_views_of_computed(x):
    y = x + 1
    return y.t(), y.view(-1)


def test_two_returned_views_of_a_computed_value_share_memory():
    got, want, fused = run(two_views_of_computed, rand(4, 6))
    same(got, want)
    assert shares_memory(got[0], got[1])
    assert "aten::add" in fused


def test_the_kernel_refuses_to_copy_shared_views():
    """Without the fuser moving them out, two returned views of one value cannot be copies."""
    graph = torch._C.parse_ir("""
        graph(%x : Float(4, 6, strides=[6, 1], requires_grad=0, device=cpu)):
          %one : int = prim::Constant[value=1]()
          %y : Float(4, 6, strides=[6, 1], requires_grad=0, device=cpu) = aten::add(%x, %one, %one)
          %a : Float(6, 4, strides=[1, 6], requires_grad=0, device=cpu) = aten::t(%y)
          %b : Float(4, 6, strides=[6, 1], requires_grad=0, device=cpu) = aten::t(%a)
          return (%a, %b)
    """)
    with pytest.raises(Exception, match="shares memory"):
        nncfuse.TensorExprKernel(graph)


def test_reshape_indices_agree_with_row_major_order():
    """The grouped div/mod of `reshape_indices` against unravel(ravel(...)) on random shapes."""
    import itertools
    import random

    from nncfuse.tensorexpr.lowerings.shapes import reshape_indices
    from nncfuse.tensorexpr.passes.simplify import simplify

    rng = random.Random(0)
    for _ in range(60):
        dims = [rng.choice([1, 2, 3, 4, 6]) for _ in range(rng.randint(1, 4))]
        n = 1
        for d in dims:
            n *= d
        factors = [f for f in range(1, n + 1) if n % f == 0]
        out, rest = [], n
        while rest > 1 and len(out) < 3:
            f = rng.choice([f for f in factors if rest % f == 0])
            out.append(f)
            rest //= f
        out = [*out, rest] if rest > 1 or not out else out
        rng.shuffle(out)
        for idx in itertools.islice(itertools.product(*(range(d) for d in out)), 40):
            got = [simplify(e).value for e in
                   reshape_indices(dims, out, [E.imm(i) for i in idx])]
            flat = torch.arange(n).reshape(out)[idx].item()
            want = [int(i) for i in torch.unravel_index(torch.tensor(flat), dims)]
            want = [0 if d == 1 else w for d, w in zip(dims, want)]
            assert got == want, (dims, out, idx)


# -- repeat, index_select, gather -----------------------------------------------------------


def repeat_ops(x):
    return (x * 2).repeat(2, 1, 3) + 1


def index_ops(x, idx, g):
    return (x + 1).index_select(1, idx) * (x * 2).gather(1, g)


def index_select_first(x, idx):
    return (x - 1).index_select(0, idx).relu()


def extremal(*shape):
    x = torch.randn(*shape)
    x.view(-1)[:4] = torch.tensor([float("nan"), float("inf"), float("-inf"), -0.0])
    return x


@pytest.mark.parametrize("use_llvm", BACKENDS)
def test_repeat_and_indexed_loads_fuse(use_llvm):
    x = extremal(4, 6)
    got, want, fused = run(repeat_ops, x, use_llvm=use_llvm)
    same(got, want)
    assert "aten::repeat" in fused
    for idx, g in [
        (torch.tensor([5, 0, 0, 3]), torch.randint(0, 6, (4, 4))),
        (torch.tensor([1, 2, 3, 4], dtype=torch.int32), torch.randint(0, 6, (4, 4),
                                                                     dtype=torch.int32)),
        (torch.tensor([5, 4, 3, 2, 1, 0, 2, 2])[::2], torch.randint(0, 6, (4, 8))[:, ::2]),
    ]:
        got, want, fused = run(index_ops, x, idx, g, use_llvm=use_llvm)
        same(got, want)
        assert {"aten::index_select", "aten::gather"} <= fused, fused
    got, want, fused = run(index_select_first, x.t(), torch.tensor([2, 2, 0]), use_llvm=use_llvm)
    same(got, want)
    assert "aten::index_select" in fused


@pytest.mark.parametrize("use_llvm", BACKENDS)
def test_repeat_and_indexed_loads_of_empty_tensors(use_llvm):
    long = torch.long
    cases = [
        (repeat_ops, torch.randn(0, 6)),
        (index_ops, torch.randn(0, 6), torch.tensor([1, 2, 3, 4]), torch.zeros(0, 4, dtype=long)),
        (index_ops, torch.randn(3, 6), torch.tensor([], dtype=long), torch.zeros(3, 0, dtype=long)),
        (index_select_first, torch.randn(4, 6), torch.tensor([], dtype=long)),
    ]
    for fn, *args in cases:
        got, want, _ = run(fn, *args, use_llvm=use_llvm)
        same(got, want)


@pytest.mark.parametrize("bad", [6, -1])
def test_indexed_loads_out_of_range_raise_as_eager(bad):
    x, g = torch.randn(4, 6), torch.randint(0, 6, (4, 4))
    f = nncfuse.jit(index_ops, min_group_size=1)
    idx = torch.tensor([0, 1, 2, 3])
    for _ in range(2):
        same(f(x, idx, g), index_ops(x, idx, g))
    assert {"aten::index_select", "aten::gather"} <= fused_kinds(f.graph_for(x, idx, g))
    bad_g = g.index_fill(1, torch.tensor([2]), bad)
    for wrong_idx, wrong_g in [(torch.tensor([0, bad, 2, 3]), g), (idx, bad_g)]:
        with pytest.raises((RuntimeError, IndexError)):
            index_ops(x, wrong_idx, wrong_g)
        with pytest.raises((RuntimeError, IndexError)):
            f(x, wrong_idx, wrong_g)


# -- returned views of inputs, next to fused work: eager's storage, offset and strides --------


def returns_many_views(x):
    a, b = x.chunk(2, 1)
    return (x.transpose(0, 1), x[1:], x.select(1, 2), x.unsqueeze(0), x.expand(2, 4, 6),
            x.narrow(1, 1, 3), x[::2, 1::2], x.t()[1], a, x.reshape(2, 12), b * 2 + 1)


@pytest.mark.parametrize("layout", ["contiguous", "offset", "transposed"])
def test_returned_views_keep_eager_storage_offsets_and_strides(layout):
    x = {"contiguous": rand(4, 6), "offset": rand(6, 9)[1:5, 2:8],
         "transposed": rand(6, 4).t()}[layout]
    f = nncfuse.jit(returns_many_views)
    f(x)
    got, want = f(x), returns_many_views(x)
    assert nncfuse.fusion_groups(f.graph_for(x))
    for g, w in zip(got, want):
        assert_exact(g, w)
        if shares_memory(w, x):
            assert g.data_ptr() == w.data_ptr() and g.stride() == w.stride(), (g.stride(), w)
        assert shares_memory(g, x) == shares_memory(w, x)
