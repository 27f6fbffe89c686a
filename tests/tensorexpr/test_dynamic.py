"""Dynamic kernels: sizes are symbols bound from the inputs on each call (`size_symbols`)."""

import re

import pytest
import torch

from nncfuse.config import Options
from nncfuse.tensorexpr import expr as E
from nncfuse.tensorexpr.ir_visitor import walk
from nncfuse.tensorexpr.kernel import TensorExprKernel
from nncfuse.tensorexpr.lowerings import LoweringError, reductions
from nncfuse.tensorexpr.passes.tile_transposes import TILE


def graph_of(fn, *examples):
    graph = torch.jit.trace(fn, examples).graph.copy()
    torch._C._jit_pass_inline(graph)
    return graph


def dynamic_kernels(fn, *examples):
    graph = graph_of(fn, *examples)
    return [TensorExprKernel(graph, Options.from_env(use_llvm=llvm), dynamic=True)
            for llvm in (True, False)]


def chain(x, y):
    return ((x * y + 1.0).sigmoid() * x).to(torch.float64)


# sizes along every dim, 0 and 1 included (a 1 where the kernel has a symbol fails the guard:
# the entry then runs the fallback, as it does for a change of rank or layout)
SIZES = [(8, 1000), (3, 7), (0, 5), (5, 0), (1, 9), (2, 1), (64, 2100), (33, 17)]


@pytest.mark.parametrize("llvm", [True, False])
def test_one_kernel_matches_eager_at_many_sizes_with_broadcasting(llvm):
    kernel = dynamic_kernels(chain, torch.randn(8, 1000), torch.randn(1000))[not llvm]
    for rows, cols in SIZES:
        x, y = torch.randn(rows, cols), torch.randn(cols)
        want = chain(x, y)
        got = kernel.run([x, y])
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)  # float32 sigmoid
        assert got.stride() == want.stride() and got.dtype == want.dtype


def test_dumps_print_the_size_symbols_and_vector_tails_are_computed_at_run_time():
    kernel = dynamic_kernels(chain, torch.randn(4, 8, 100), torch.randn(4, 8, 100))[0]
    text = str(kernel.stmt)
    assert "s0" in text and "s2" in text and "100" not in text
    # a vector loop and its tail, at the capability's lanes (AVX2, float64: 4; default: 2)
    assert "Ramp" in text and re.search(r"\) / (2|4|8|16|32);", text), text
    assert "parallel if" in text  # the choice to use threads is made per call
    assert "s0 = sh0[0]" in kernel.call.source


def test_inputs_of_equal_sizes_share_a_symbol_and_the_guard_checks_it():
    x = torch.randn(6, 6)
    kernel = dynamic_kernels(lambda a, b: a * b + a, x, x)[0]
    assert [s.var.name for s in kernel.lowered.symbols] == ["s0"]
    for a, b in [(torch.randn(5, 5), torch.randn(5, 5)), (torch.randn(5, 7), torch.randn(5, 7))]:
        torch.testing.assert_close(kernel.run([a, b]), a * b + a)  # (5, 7): the fallback


def test_layout_class_is_guarded():
    kernel = dynamic_kernels(lambda a, b: a - b * 2, torch.randn(4, 9), torch.randn(4, 9))[0]
    a = torch.randn(9, 4).t()  # not row-major: the fallback runs
    b = torch.randn(1, 9).expand(4, 9)  # broadcast (stride 0): the fallback runs
    for x, y in [(a, a), (b, a), (torch.randn(4, 9, 2)[..., 0], a), (torch.randn(9), a)]:
        torch.testing.assert_close(kernel.run([x, y]), x - y * 2)


def test_broadcast_input_layout_is_symbolic_too():
    x = torch.randn(1, 50).expand(6, 50)
    kernel = dynamic_kernels(lambda a, b: a + b.sin(), x, torch.randn(6, 50))[0]
    for rows, cols in [(6, 50), (3, 10), (9, 0)]:
        a, b = torch.randn(1, cols).expand(rows, cols), torch.randn(rows, cols)
        torch.testing.assert_close(kernel.run([a, b]), a + b.sin())


def test_scalars_and_zero_dim_tensors():
    def fn(x, s, z):
        return x * s + z

    kernel = dynamic_kernels(fn, torch.randn(10), torch.tensor(2.0), torch.tensor(3.0))[0]
    for n in (10, 0, 300):
        x = torch.randn(n)
        torch.testing.assert_close(kernel.run([x, torch.tensor(-1.5), torch.tensor(0.5)]),
                                   fn(x, torch.tensor(-1.5), torch.tensor(0.5)))


_CONST = torch.arange(16.0)


@pytest.mark.parametrize("fn", [
    lambda x: x.amax(0) * 2,  # a reduction that eager refuses over an empty dim
    lambda x: x.view(2, 8) * 2,  # constant sizes
    lambda x: x * _CONST,  # a tensor constant of fixed sizes
    lambda x: x * _CONST[:16],  # a slice of one (its sizes no symbols)
])
def test_what_cannot_take_symbolic_sizes_raises_lowering_error(fn):
    graph = graph_of(fn, torch.randn(16))
    with pytest.raises(LoweringError):
        TensorExprKernel(graph, Options.from_env(), dynamic=True)
    TensorExprKernel(graph, Options.from_env())  # static: fine


_MASKS = torch.tensor([15, 240, 3, 48], dtype=torch.int32)
_SCALES = torch.tensor([1.0, 1 / 16, 0.5, -2.0])


def _masked(x, b):
    return ((x.to(torch.int32) & _MASKS).to(torch.float32) * _SCALES) + b


@pytest.mark.parametrize("llvm", [True, False])
@pytest.mark.parametrize("fn", [_masked, lambda x, b: (x * _SCALES).sum(1) + b[0]])
def test_tensor_constants_along_static_dims(llvm, fn):
    """Tensor constants of fixed sizes read by elementwise ops along dims that stay static: one
    kernel for every length of the dim that changes; any other use (a slice of one, one
    broadcast along a symbol: above) gives a static kernel."""
    x, b = torch.randint(0, 256, (10, 4)).float(), torch.randn(4)
    kernel = TensorExprKernel(graph_of(fn, x, b), Options.from_env(use_llvm=llvm),
                              dynamic=True, static_sizes=frozenset({4}))
    assert kernel.lowered.symbols
    for n in (10, 0, 1, 37):
        x = torch.randint(0, 256, (n, 4)).float()
        if fn is not _masked and n:
            x[0, 1], x[-1, 2] = float("nan"), float("-inf")
        torch.testing.assert_close(kernel.run([x, b]), fn(x, b), equal_nan=True)


def _head_split(x, b):
    return (x + b).view(2, -1, 4, 16).transpose(1, 2).relu() * 2


def _merge_flatten(x):
    return (x.sin() * 3).flatten(1)


def _unflatten_slice(x):
    return x.unflatten(1, (4, -1))[:, 1:, 2:].cos() + x[:, 0:1].unsqueeze(2)


def _select_reshape(x):
    return x.select(2, 3).reshape(-1, 2) - x[..., 0].view_as(x[..., 1]).reshape(-1, 2)


def _expand(x, y):
    return x.expand(2, -1, 64) * y


@pytest.mark.parametrize("llvm", [True, False])
@pytest.mark.parametrize("fn, example, static, calls", [
    (_head_split, [(2, 10, 64), (64,)], {2, 64},
     [[(2, 7, 64), (64,)], [(2, 0, 64), (64,)], [(2, 33, 64), (64,)], [(2, 1, 64), (64,)]]),
    (_merge_flatten, [(5, 4, 16)], {4, 16}, [[(7, 4, 16)], [(0, 4, 16)], [(300, 4, 16)]]),
    (_unflatten_slice, [(5, 64)], {64}, [[(9, 64)], [(0, 64)], [(1, 64)]]),
    (_select_reshape, [(6, 2, 4)], {2, 4}, [[(9, 2, 4)], [(1, 2, 4)], [(0, 2, 4)]]),
    (_expand, [(1, 10, 1), (2, 10, 64)], {2, 64}, [[(1, 3, 1), (2, 3, 64)]]),
])
def test_views_of_constant_sizes_take_the_symbol_of_the_dim_that_changes(
        llvm, fn, example, static, calls):
    """A -1 in a view's sizes, a flatten, an unflatten, an expand and slices along dims that
    stay static: one kernel for every length of the dim that changes (the others static)."""
    examples = [torch.randn(s) for s in example]
    kernel = TensorExprKernel(graph_of(fn, *examples), Options.from_env(use_llvm=llvm),
                              dynamic=True, static_sizes=frozenset(static))
    assert kernel.lowered.symbols, "the changing dim is a symbol"
    for shapes in [example, *calls]:
        args = [torch.randn(s) for s in shapes]
        got, want = kernel.run(args), fn(*args)
        torch.testing.assert_close(got, want)
        assert got.shape == want.shape and (got.stride() == want.stride() or not got.numel())


@pytest.mark.parametrize("fn", [
    lambda x: x.view(4, 10, 16) * 2,  # the changing dim is a constant in the view
    lambda x: x.view(-1, 5, 16)[:, 0] * 2,  # -1 is not a product of the symbols
    lambda x: x.flatten() * 2,  # the index would be divided by the symbol
    lambda x: x[:, 1:] * 2,  # a slice along the changing dim
    lambda x: x[:, :, 0:10] + 1,  # the symbol's value as a slice's length
])
def test_views_whose_sizes_do_not_follow_from_the_inputs_stay_static(fn):
    graph = graph_of(fn, torch.randn(4, 10, 16))
    with pytest.raises(LoweringError):
        TensorExprKernel(graph, Options.from_env(), dynamic=True, static_sizes=frozenset({16}))
    TensorExprKernel(graph, Options.from_env())  # static: fine


_REDUCTIONS = [
    lambda x: (x * 2).sum(-1),
    lambda x: (x * 2).mean(-1, keepdim=True),
    lambda x: torch.softmax(x * 2, -1),
    lambda x: torch.log_softmax(x, -1) * 2,
    lambda x: (x * 2).sum(0),
    lambda x: x.sum() + x,
    lambda x: x.double().mean(1),
]


@pytest.mark.parametrize("llvm", [True, False])
@pytest.mark.parametrize("fn", _REDUCTIONS, ids=["sum", "mean", "softmax", "log_softmax", "sum0",
                                                  "sum_all", "mean_double"])
def test_sum_mean_softmax_over_a_symbolic_dim(monkeypatch, llvm, fn):
    """The reduced extent is a symbol too (`SYMBOLIC_EXTENTS`): empty rows give eager's 0
    (sum), NaN (mean) and an empty softmax; infinities as eager. Vectorized, with a tail
    computed at run time."""
    graph = graph_of(fn, torch.randn(6, 10))
    monkeypatch.setattr(reductions, "SYMBOLIC_EXTENTS", False)
    with pytest.raises(LoweringError):  # off: static kernels
        TensorExprKernel(graph, Options.from_env(), dynamic=True)
    monkeypatch.setattr(reductions, "SYMBOLIC_EXTENTS", True)
    kernel = dynamic_kernels(fn, torch.randn(6, 10))[not llvm]
    assert len(kernel.lowered.symbols) == 2
    reduces = [n for n in walk(kernel.stmt) if isinstance(n, E.Reduce)]
    assert any(r.dtype.lanes > 1 for r in reduces), kernel.stmt
    for shape in [(6, 10), (3, 17), (5, 0), (0, 4), (2, 1000), (64, 2100), (7, 3)]:
        x = torch.randn(shape)
        if x.numel():
            x.view(-1)[::7] = float("inf")
        got, want = kernel.run([x]), fn(x)
        torch.testing.assert_close(got, want, equal_nan=True, rtol=1e-5, atol=1e-5)
        assert got.stride() == want.stride() or not got.numel()


@pytest.mark.parametrize("fn", [lambda x: x.amax(-1), lambda x: x.max(-1)[0],
                                lambda x: x.argmax(-1), lambda x: x.norm(float("inf"), -1)])
def test_reductions_that_raise_on_an_empty_symbolic_dim_stay_static(monkeypatch, fn):
    monkeypatch.setattr(reductions, "SYMBOLIC_EXTENTS", True)
    graph = graph_of(fn, torch.randn(6, 10))
    with pytest.raises(LoweringError):
        TensorExprKernel(graph, Options.from_env(), dynamic=True)


def _transpose_add(x, y):
    return (x + 1).transpose(0, 1) + y


@pytest.mark.parametrize("llvm", [True, False])
@pytest.mark.parametrize("static", [frozenset({256}), frozenset()])
def test_transposes_over_symbolic_sizes_are_tiled_with_tails(llvm, static):
    """tile_transposes tiles a symbolic extent: whole tiles, then the rows and columns past
    the last one; every size (0, 1, not a multiple of the tile, non-contiguous) as eager."""
    example = (torch.randn(300, 256), torch.randn(256, 300))
    kernel = TensorExprKernel(graph_of(_transpose_add, *example),
                              Options.from_env(use_llvm=llvm), dynamic=True, static_sizes=static)
    assert "_tile" in str(kernel.stmt) and f"s0 / {TILE}" in str(kernel.stmt), kernel.stmt
    sizes = [(300, 256), (0, 256), (1, 256), (TILE - 1, 256), (TILE, 256), (TILE + 33, 256),
             (2 * TILE + 3, 256)]
    if not static:
        sizes += [(70, 2), (2, 70), (65, 0), (100, 67)]
    for rows, cols in sizes:
        x, y = torch.randn(rows, cols), torch.randn(cols, rows)
        for a, b in [(x, y), (torch.randn(cols, rows).t(), torch.randn(rows, cols).t())]:
            got, want = kernel.run([a, b]), _transpose_add(a, b)  # the second: the fallback
            torch.testing.assert_close(got, want, rtol=0, atol=0)
            assert got.stride() == want.stride() or not got.numel()


_W, _B = torch.randn(48, 32), torch.randn(48)


def _linear_gelu(x, w, b):
    return torch.nn.functional.gelu(torch.nn.functional.linear(x, w, b)) * 2


def _linear_residual(x, w, b, r):
    return torch.nn.functional.linear(x, w, b) + r


def _mm(a, b):
    return torch.mm(a, b).relu() * 2


def _bmm(c, d):
    return (torch.bmm(c, d) * 3).sum(0)


def _matmul_scale(q, k):
    return torch.matmul(q, k) * 0.125 + 1


@pytest.mark.parametrize("llvm", [True, False])
@pytest.mark.parametrize("fn, example, static, calls", [
    (_linear_gelu, [(1, 40, 32), (48, 32), (48,)], {32, 48},
     [[(1, 7, 32), (48, 32), (48,)], [(1, 0, 32), (48, 32), (48,)],
      [(1, 2, 32), (48, 32), (48,)], [(1, 300, 32), (48, 32), (48,)]]),
    (_linear_residual, [(40, 32), (48, 32), (48,), (40, 48)], {32, 48},
     [[(9, 32), (48, 32), (48,), (9, 48)], [(0, 32), (48, 32), (48,), (0, 48)]]),
    (_mm, [(6, 5), (5, 7)], {5}, [[(2, 5), (5, 11)], [(0, 5), (5, 0)], [(9, 5), (5, 9)]]),
    (_bmm, [(3, 6, 5), (3, 5, 9)], {5, 3}, [[(3, 4, 5), (3, 5, 8)], [(3, 0, 5), (3, 5, 0)]]),
    (_matmul_scale, [(2, 4, 9, 16), (2, 4, 16, 9)], {2, 4, 16},
     [[(2, 4, 33, 16), (2, 4, 16, 33)], [(2, 4, 0, 16), (2, 4, 16, 0)]]),
], ids=["linear_gelu", "linear_residual", "mm", "bmm", "matmul"])
def test_external_calls_take_symbolic_sizes(llvm, fn, example, static, calls):
    """A GEMM's result buffer is declared in the symbols (tried at the example and at other
    sizes); the routine (oneDNN or ATen) runs at whatever size the call has."""
    examples = [torch.randn(s) for s in example]
    kernel = TensorExprKernel(graph_of(fn, *examples), Options.from_env(use_llvm=llvm),
                              dynamic=True, static_sizes=frozenset(static))
    assert kernel.lowered.externals and kernel.lowered.symbols
    assert any(not isinstance(d, E.Imm) for c in kernel.lowered.externals for d in c.buf.dims)
    for shapes in [example, *calls]:
        args = [torch.randn(s) for s in shapes]
        got, want = kernel.run(args), fn(*args)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
        assert got.shape == want.shape and (got.stride() == want.stride() or not got.numel())


def test_an_external_call_whose_sizes_do_not_follow_stays_static():
    def conv(x, w):
        return torch.nn.functional.conv2d(x, w).relu()  # the output's H is H - 2

    graph = graph_of(conv, torch.randn(1, 3, 12, 12), torch.randn(4, 3, 3, 3))
    with pytest.raises(LoweringError):
        TensorExprKernel(graph, Options.from_env(), dynamic=True, static_sizes=frozenset({3, 4}))


def _strided(q, k):
    return (q * 2 + k.transpose(-2, -1)).relu()


@pytest.mark.parametrize("llvm", [True, False])
def test_inputs_that_are_views_of_row_major_tensors_take_symbolic_strides(llvm):
    """A head split of a slice (attention's q) and a transpose as inputs: their strides are
    expressions of the symbols of the dims inside them in memory, checked on every call."""
    def q_of(n):
        return torch.randn(1, n, 96)[..., 32:64].reshape(1, n, 2, 16).transpose(1, 2)

    def k_of(n):
        return torch.randn(1, 2, n, 16).transpose(-2, -1).contiguous().transpose(-2, -1)

    kernel = TensorExprKernel(graph_of(_strided, q_of(9), k_of(9).transpose(-2, -1)),
                              Options.from_env(use_llvm=llvm), dynamic=True,
                              static_sizes=frozenset({2, 16}))
    assert kernel.lowered.symbols
    guards = {g.position: g.strides for g in kernel.lowered.guards}
    assert guards[0][1:] == (16, 96, 1), guards  # the slice: static strides
    for n in (9, 4, 0, 33, 1):
        args = [q_of(n), k_of(n).transpose(-2, -1)]
        torch.testing.assert_close(kernel.run(args), _strided(*args))
    q = torch.randn(1, 2, 5, 16)  # contiguous: another layout, the fallback runs
    k = k_of(5).transpose(-2, -1)
    torch.testing.assert_close(kernel.run([q, k]), _strided(q, k))


@pytest.mark.parametrize("kind, dynamic", [
    ("aten::relu", True), ("aten::add", True), ("aten::where", True), ("aten::to", True),
    ("aten::sum", True), ("aten::softmax", True), ("aten::layer_norm", True),
    ("aten::transpose", True), ("aten::reshape", True), ("aten::slice", True),
    ("aten::expand", True), ("aten::cat", True),
    ("aten::flip", False), ("aten::gather", False), ("aten::stack", False),
    ("aten::batch_norm", False), ("aten::dropout", False), ("aten::linear", False),
])
def test_each_lowering_says_whether_it_takes_symbolic_sizes(kind, dynamic):
    from nncfuse.tensorexpr.lowerings.registry import REGISTRY

    assert REGISTRY[kind].dynamic is dynamic  # (GEMMs: lowered as external calls instead)


@pytest.mark.parametrize("llvm", [True, False])
@pytest.mark.parametrize("fn, rows", [
    (lambda x: (x * 2).sum(-1), True),
    (lambda x: torch.softmax(x, -1) + 1, True),
    (lambda x: (x + 1).sum(0), False),
], ids=["row_sum", "softmax", "column_sum"])
def test_reductions_over_a_symbolic_extent_are_vectorized_with_run_time_tails(llvm, fn, rows):
    """Every part of a vectorized reduction over a symbol may be empty: lengths around the
    vector widths and the blocks of a cascaded sum (64 vectors of 64 lanes), as eager."""
    kernel = dynamic_kernels(fn, torch.randn(3, 100) if rows else torch.randn(100, 3))[not llvm]
    assert "Ramp" in str(kernel.stmt), kernel.stmt
    lengths = [0, 1, 15, 16, 17, 63, 64, 65, 255, 4096, 4096 * 2 + 37]
    for n in lengths if llvm else lengths[:-2]:
        x = torch.randn(3, n) if rows else torch.randn(n, 3)
        torch.testing.assert_close(kernel.run([x]), fn(x), rtol=1e-5, atol=1e-4)


def _grown_and_masked(cache, new, mask):
    """A decode step's cache grown by a row (`s1 + 1`), repeated (an unsqueeze, a reshape
    that keeps that length whole), and a mask of the same length, another input (`s0`)."""
    return torch.cat([cache, new], dim=0).unsqueeze(0).expand(2, -1, -1) + mask


@pytest.mark.parametrize("llvm", [True, False])
def test_a_cats_length_equal_to_an_input_size_is_checked_when_the_kernel_runs(llvm):
    """At the example the grown cache's length equals the mask's: the kernel takes them as
    one size (`SizeSymbols.equal`) and checks it at each call; where they differ the
    fallback runs and raises eager's error."""
    kernel = dynamic_kernels(_grown_and_masked, torch.randn(6, 8), torch.randn(1, 8),
                             torch.randn(7, 1))[not llvm]
    assert kernel.dynamic and kernel.lowered.equal
    for n in (6, 9, 33, 1):
        args = [torch.randn(n, 8), torch.randn(1, 8), torch.randn(n + 1, 1)]
        torch.testing.assert_close(kernel.run(args), _grown_and_masked(*args))
    with pytest.raises(RuntimeError, match="must match the size"):
        kernel.run([torch.randn(9, 8), torch.randn(1, 8), torch.randn(7, 1)])
