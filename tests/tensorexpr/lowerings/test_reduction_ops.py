"""Reductions fused, against eager, on both backends: values, dtypes, extremes, fusion."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import nncfuse
from nncfuse.jit.fuser.guard import clear_kernel_cache
from nncfuse.tensorexpr import expr as E
from nncfuse.tensorexpr import stmt as S
from nncfuse.tensorexpr.codegen.llvm_jit import vector_bits
from nncfuse.tensorexpr.ir_visitor import children, walk
from nncfuse.tensorexpr.passes import vectorize_reductions
from tests.fused import BACKENDS, check, run_fused

REDUCED = [torch.float16, torch.bfloat16]


def randn(*shape, dtype=torch.float32):
    return torch.randn(*shape, dtype=torch.float64).to(dtype)


def close(fn, *args, use_llvm=True, **tol):
    """Fused vs eager within `tol` (float sums round differently from eager's cascade)."""
    got = run_fused(fn, *args, use_llvm=use_llvm)
    want = fn(*args)
    assert got.dtype == want.dtype and got.shape == want.shape
    torch.testing.assert_close(got, want, equal_nan=True, **tol)
    return got


def kernel(fn, *args):
    """The kernel of the one fusion group `fn` forms."""
    f = nncfuse.jit(torch.jit.trace(fn, args), min_group_size=1)
    f(*args)
    (group,) = nncfuse.fusion_groups(f.graph_for(*args))
    return nncfuse.TensorExprKernel(group.g("Subgraph"))


def kernel_stmt(fn, *args):
    """The final loop nest of the one fusion group `fn` forms."""
    return kernel(fn, *args).stmt


def loops(stmt):
    return [s for s in stmt.stmts if isinstance(s, S.For)]


def exp_evaluations(node, trips=1):
    """How many elements' exponentials `node` computes when it runs: each `exp` call's
    lanes times the iterations of the loops and reductions around it."""
    if isinstance(node, E.Call) and node.name in ("exp", "exp_nonpos"):
        return trips * node.dtype.lanes + exp_evaluations(node.args[0], trips)
    if isinstance(node, S.For):
        inner = trips * (node.stop.value - node.start.value)
        return exp_evaluations(node.body, inner)
    if isinstance(node, E.Reduce):
        inner = trips * math.prod(stop.value for stop in node.stops)
        return exp_evaluations(node.init, trips) + exp_evaluations(node.body, inner)
    return sum(exp_evaluations(child, trips) for child in children(node))


# -- sum, mean, prod -------------------------------------------------------------------------------

SUMS = {
    "rows": lambda x: x.sum(-1),
    "cols": lambda x: x.sum(0),
    "all": lambda x: x.sum(),
    "dims": lambda x: x.sum((0, 2)),
    "keepdim": lambda x: x.sum(1, keepdim=True),
    "negative": lambda x: x.sum((-1, -3)),
    "mean": lambda x: x.mean(-1),
    "mean_all": lambda x: x.mean(),
    "mean_keepdim": lambda x: x - x.mean((1, 2), keepdim=True),
}


@pytest.mark.parametrize("use_llvm", BACKENDS)
@pytest.mark.parametrize("name", list(SUMS))
def test_sum_mean(name, use_llvm):
    close(SUMS[name], randn(4, 5, 37), use_llvm=use_llvm)


@pytest.mark.parametrize("use_llvm", BACKENDS)
@pytest.mark.parametrize("dtype", REDUCED)
def test_reduced_floats_accumulate_in_float32(dtype, use_llvm):
    x = (torch.rand(8, 300) * 4 + 100).to(dtype)  # a narrow accumulator would drift
    got = close(lambda x: x.sum(-1), x, use_llvm=use_llvm)
    assert got.dtype == dtype
    close(lambda x: x.mean(0), x, use_llvm=use_llvm)
    close(lambda x: x.sum(-1, dtype=torch.float32), x, use_llvm=use_llvm)


@pytest.mark.parametrize("use_llvm", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.uint8, torch.bool])
def test_integer_sums_are_exact(dtype, use_llvm):
    x = torch.randint(0, 2 if dtype == torch.bool else 100, (6, 40)).to(dtype)
    got = check(lambda x: x.sum(-1), x, use_llvm=use_llvm)
    assert got.dtype == torch.int64
    check(lambda x: x.sum(), x, use_llvm=use_llvm)


@pytest.mark.parametrize("use_llvm", BACKENDS)
def test_dtype_argument(use_llvm):
    x = randn(6, 33)
    close(lambda x: x.sum(-1, dtype=torch.float64), x, use_llvm=use_llvm)
    close(lambda x: x.mean(0, dtype=torch.float64), x, use_llvm=use_llvm)
    check(lambda x: (x * 10).to(torch.int32).sum(1, dtype=torch.int32), x, use_llvm=use_llvm)


def test_long_float32_sum_stays_within_eager_tolerance():
    """A serial float32 accumulator drifts here; blocks of vector accumulators do not."""
    torch.manual_seed(0)
    x = torch.rand(1 << 20) + 1e4
    close(lambda x: x.sum(), x)
    close(lambda x: x.mean(), x)
    rows = torch.rand(16, 1 << 16) + 1e4
    close(lambda x: x.sum(-1), rows)
    cols = torch.rand(1 << 15, 32) + 1e4
    close(lambda x: x.sum(0), cols)
    close(lambda x: x[3:].sum() * 2, x)  # chunks and a tail
    stmt = kernel_stmt(lambda x: x.sum(), x)
    assert any(s.parallel for s in loops(stmt)), "a long full reduction runs in chunks"
    exact = x.double().sum()
    got = run_fused(lambda x: x.sum(), x)
    assert abs(got.double() - exact) <= abs(x.sum().double() - exact) + 2 * 1024


@pytest.mark.parametrize("use_llvm", BACKENDS)
def test_empty_and_zero_dim(use_llvm):
    empty = torch.randn(3, 0)
    check(lambda x: x.sum(-1), empty, use_llvm=use_llvm)
    check(lambda x: x.mean(-1), empty, use_llvm=use_llvm)  # NaN, as eager
    check(lambda x: x.sum(0) + 1, empty, use_llvm=use_llvm)  # an empty output
    scalar = torch.tensor(2.5)
    check(lambda x: x.sum() * 2, scalar, use_llvm=use_llvm)
    check(lambda x: x.mean(-1), scalar, use_llvm=use_llvm)
    check(lambda x: x.amax(), scalar, use_llvm=use_llvm)


@pytest.mark.parametrize("use_llvm", BACKENDS)
def test_layouts(use_llvm):
    x = randn(37, 20)
    close(lambda x: x.t().sum(-1), x, use_llvm=use_llvm)  # a transposed input
    close(lambda x: x[:, ::3].sum(0), x, use_llvm=use_llvm)  # strided
    b = randn(20).expand(37, 20)
    close(lambda b: b.sum(0), b, use_llvm=use_llvm)  # broadcast (stride 0)
    close(lambda x: torch.softmax(x.t(), -1), x, use_llvm=use_llvm)


@pytest.mark.parametrize("use_llvm", BACKENDS)
def test_prod(use_llvm):
    x = torch.rand(5, 20) + 0.5
    close(lambda x: x.prod(1), x, use_llvm=use_llvm)
    close(lambda x: x.prod(), x[:3, :6], use_llvm=use_llvm)


# -- amax, amin, any, all ------------------------------------------------------------------------


def extremes(dtype=torch.float32):
    x = randn(6, 37, dtype=dtype)
    x[0, 3] = float("nan")
    x[1, 0] = float("inf")
    x[2, 5] = -float("inf")
    x[3] = -float("inf")
    x[4, :] = -0.0
    x[5, 36] = float("nan")
    return x


@pytest.mark.parametrize("use_llvm", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, *REDUCED])
def test_amax_amin_propagate_nan(dtype, use_llvm):
    x = extremes(dtype)
    for fn in (lambda x: x.amax(-1), lambda x: x.amin(1), lambda x: x.amax(0),
               lambda x: x.amin((0, 1)), lambda x: x.amax(1, keepdim=True)):
        check(fn, x, use_llvm=use_llvm, exact=False)


@pytest.mark.parametrize("use_llvm", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.int8, torch.int32, torch.int64, torch.uint8])
def test_amax_amin_integers(dtype, use_llvm):
    x = torch.randint(-100 if dtype != torch.uint8 else 0, 100, (7, 45)).to(dtype)
    check(lambda x: x.amax(-1), x, use_llvm=use_llvm)
    check(lambda x: x.amin(0), x, use_llvm=use_llvm)


def test_amax_of_empty_raises_as_eager():
    x = torch.randn(0, 3)
    with pytest.raises(IndexError):
        x.amax(0)
    f = nncfuse.jit(torch.jit.trace(lambda x: x.amax(0) * 2, torch.randn(2, 3)), min_group_size=1)
    for _ in range(3):
        with pytest.raises((IndexError, RuntimeError), match="non-zero size"):
            f(x)


@pytest.mark.parametrize("use_llvm", BACKENDS)
def test_any_all(use_llvm):
    x = torch.rand(6, 40)
    x[0] = 1
    x[1] = 0
    check(lambda x: (x > 0.5).any(-1), x, use_llvm=use_llvm)
    check(lambda x: (x > 0.01).all(1), x, use_llvm=use_llvm)
    check(lambda x: x.any(0), x, use_llvm=use_llvm)


# -- var, std, logsumexp --------------------------------------------------------------------------


@pytest.mark.parametrize("use_llvm", BACKENDS)
@pytest.mark.parametrize("correction", [0, 1, 2])
def test_var_std(correction, use_llvm):
    x = randn(5, 6, 33) * 3 + 1e3  # E[x^2] - E[x]^2 would cancel catastrophically here
    close(lambda x: x.var(-1, correction=correction), x, use_llvm=use_llvm)
    close(lambda x: x.std((0, 2), correction=correction, keepdim=True), x, use_llvm=use_llvm)
    close(lambda x: x.var(1, unbiased=False), x, use_llvm=use_llvm)
    close(lambda x: x.std(), x, use_llvm=use_llvm)


@pytest.mark.parametrize("dtype", REDUCED, ids=str)
def test_reduced_float_products_round_each_step_as_eagers(dtype):
    """ATen multiplies `scalar_t`s: a float16 or bfloat16 product rounds at each step, so one
    past the type's range is infinite and one below it 0, where a float32 accumulator holds
    them (a float16 row of -3.19, 65504, -0., 1.: NaN, not 0; fuzz seed 100856). Along a
    strided dim the order is eager's too, and the results are equal."""
    big = torch.finfo(dtype).max
    x = torch.tensor([[-3.19, big, -0.0, 1.0], [1e-3, 1e-3, 1e-3, 1e3], [2.0, 3.0, 0.5, 0.25]],
                     dtype=dtype)
    got = run_fused(lambda x: x.prod(-1) * 1.0, x, use_llvm=True)
    torch.testing.assert_close(got, x.prod(-1) * 1.0, equal_nan=True, rtol=0, atol=0)
    y = (torch.rand(64, 33) * 0.6 + 0.7).to(dtype)
    got = run_fused(lambda y: y.prod(0) * 1.0, y, use_llvm=True)
    torch.testing.assert_close(got, y.prod(0) * 1.0, rtol=0, atol=0)


def test_var_of_rows_no_longer_than_the_correction_is_eagers_0_over_0():
    """A constant float32 row's variance is 0 over `N - correction`: NaN where that is 0, as
    eager's (two elements, correction 2; fuzz seed 62477), inf for a row that varies."""
    x = torch.tensor([[0.0, 0.0], [0.0, 1.0], [3.0, 3.0], [0.5, 0.25]])
    for correction in (0, 1, 2, 3):
        got = run_fused(lambda x: torch.var(x, -1, correction=correction, keepdim=True) * 2,
                        x, use_llvm=True)
        want = torch.var(x, -1, correction=correction, keepdim=True) * 2
        torch.testing.assert_close(got, want, equal_nan=True)


def test_float64_var_stays_eagers_welford_where_a_sum_overflows():
    """Rows of float64's largest values: Welford's mean stays finite (eight elements of
    -max: mean -max, variance 0) where a float64 sum overflows, and turns NaN where a
    deviation overflows (max, -max, ...). Such var/std nodes run unfused (fuzz seed 53395);
    float32's, whose float64 sums cannot overflow, still fuse."""
    big = torch.finfo(torch.float64).max
    x = torch.tensor([[-big] * 8, [big] * 8, [big, -big] * 4, [1.0, 2.0] * 4],
                     dtype=torch.float64)

    def f(x):
        v, m = torch.var_mean(x, -1, correction=0, keepdim=True)
        return v, m, x.std(-1) + 1.0

    fused = nncfuse.jit(torch.jit.trace(f, (x,)), min_group_size=1)
    for _ in range(3):
        got = fused(x)
    for g, w in zip(got, f(x)):
        torch.testing.assert_close(g, w, equal_nan=True, rtol=0, atol=0)
    kinds = [n.kind() for n in fused.graph_for(x).nodes()]
    assert "aten::var_mean" in kinds and "aten::std" in kinds  # unfused
    x32 = x.float().clamp(-1e30, 1e30)
    fused32 = nncfuse.jit(torch.jit.trace(f, (x32,)), min_group_size=1)
    for _ in range(3):
        got = fused32(x32)
    for g, w in zip(got, f(x32)):
        torch.testing.assert_close(g, w, equal_nan=True)
    assert "aten::var_mean" not in [n.kind() for n in fused32.graph_for(x32).nodes()]


@pytest.mark.parametrize("use_llvm", BACKENDS)
def test_logsumexp(use_llvm):
    x = extremes()
    x[0, 3] = 1.0
    x[5, 36] = 2.0
    close(lambda x: torch.logsumexp(x, 1), x, use_llvm=use_llvm)
    close(lambda x: torch.logsumexp(x, (0, 1), keepdim=True), x, use_llvm=use_llvm)


# -- softmax, log_softmax -------------------------------------------------------------------------


@pytest.mark.parametrize("use_llvm", BACKENDS)
@pytest.mark.parametrize("dim", [-1, 0, 1])
@pytest.mark.parametrize("log", [False, True])
def test_softmax(dim, log, use_llvm):
    op = torch.log_softmax if log else torch.softmax
    close(lambda x: op(x, dim), randn(3, 17, 40) * 5, use_llvm=use_llvm)


@pytest.mark.parametrize("use_llvm", BACKENDS)
@pytest.mark.parametrize("log", [False, True])
def test_softmax_extremes_and_dtypes(log, use_llvm):
    op = torch.log_softmax if log else torch.softmax
    x = extremes()
    close(lambda x: op(x, -1), x, use_llvm=use_llvm)
    for dtype in REDUCED:
        close(lambda x: op(x, -1), x.to(dtype), use_llvm=use_llvm)
        got = close(lambda x: op(x, -1, dtype=torch.float32), x.to(dtype), use_llvm=use_llvm)
        assert got.dtype == torch.float32
    close(lambda x: op(x, 0, dtype=torch.float64), x, use_llvm=use_llvm)
    close(lambda x: op(x, 0), torch.tensor(3.0), use_llvm=use_llvm)


def test_softmax_is_one_sweep_over_rows():
    """max, sum and output of a row in one loop: the row is read from memory once, and
    each exponential is computed once, into the output (`reuse_outputs`)."""
    stmt = kernel_stmt(lambda x: torch.softmax(x, -1), torch.randn(64, 1000))
    assert len(loops(stmt)) == 1
    assert "softmax_exp" not in str(stmt)
    assert exp_evaluations(stmt) == 64 * 1000


@pytest.mark.parametrize("fn", [
    lambda x: torch.softmax(x, -1), lambda x: torch.log_softmax(x, -1),
    lambda x: F.layer_norm(x, (1024,)), lambda x: x * x.amax(-1, keepdim=True)])
def test_large_outputs_of_reductions_stay_in_the_caches(fn):
    """No streaming stores in kernels with reductions, however large their outputs (8 MB
    here, from which elementwise kernels stream: codegen/test_parallel.py); a softmax
    computes each exponential once."""
    x = randn(2048, 1024)
    k = kernel(fn, x)
    assert "!nontemporal" not in k.get_code_text("ir")
    assert exp_evaluations(k.stmt) in (0, x.numel())
    close(fn, x)


@pytest.mark.parametrize("use_llvm", BACKENDS)
def test_softmax_exponentials_live_in_whatever_follows(use_llvm):
    x = randn(8, 50)
    close(lambda x: torch.softmax(x, -1) * 2, x, use_llvm=use_llvm)
    close(lambda x: torch.softmax(x, 0) + torch.softmax(x, -1), x, use_llvm=use_llvm)
    close(lambda x: torch.softmax(x, -1).sum(-1), x, use_llvm=use_llvm)
    close(lambda x: torch.softmax(x.t(), -1), x, use_llvm=use_llvm)
    close(lambda x: torch.softmax(x[::2, 3:], -1), x, use_llvm=use_llvm)


# -- layer_norm, RMSNorm --------------------------------------------------------------------------


def layer_norm_within_eagers_bound(x, shape, w, b, eps, use_llvm=True):
    """Fused layer_norm against float64, within twice the first-order float32 error bound
    that eager's own result keeps too.

    Eager (Welford, `RowwiseMoments`, whose combine order depends on the vector
    capability: `ATEN_CPU_CAPABILITY=default` differs from AVX2) and the fused
    kernel (two-pass) round differently; neither is the exact answer. Per
    element, rounding `x - mean` costs `u * (|x| + |mean|)` (u the unit
    roundoff), which `rstd` and `|w|` amplify; the products and the add of `b`
    cost `u * (|y| + |b|)`. Rows with a large mean against their spread (here
    50 +- 2) make the first term dominant, so an absolute or relative
    tolerance alone would be either loose everywhere or fail there.
    """
    fused, eager = layer_norm_excess(x, shape, w, b, eps, use_llvm)
    assert (eager <= 1.0).all(), "the bound is not eager's"
    assert (fused <= 1.0).all(), f"{fused.max().item():.2f}x the bound"


def layer_norm_excess(x, shape, w, b, eps, use_llvm=True):
    """The fused and eager layer_norm's largest error per row, in units of twice the
    bound of `layer_norm_within_eagers_bound`."""
    fn = lambda x: F.layer_norm(x, shape, w, b, eps)  # noqa: E731
    got, want = run_fused(fn, x, use_llvm=use_llvm), fn(x)
    dims = tuple(range(-len(shape), 0))
    x64, w64, b64 = (t.double() if t is not None else None for t in (x, w, b))
    exact = F.layer_norm(x64, shape, w64, b64, eps)
    mean = x64.mean(dims, keepdim=True)
    rstd = (x64.var(dims, unbiased=False, keepdim=True) + eps).rsqrt()
    scale = rstd * (1.0 if w is None else w64.abs())
    u = torch.finfo(x.dtype).eps / 2
    # The variance's own rounding: a sum of n squares summed in a cascade (eager) or in
    # lanes (fused) is off by about log2(n) roundings, which rstd halves; a row with an
    # outlier, whose variance the outlier makes, shows it at every element.
    n = math.prod(shape)
    variance = (math.log2(n) / 2 + 1) * (x64 - mean).abs() * scale
    bound = u * ((x64.abs() + mean.abs()) * scale + (x64 - mean).abs() * scale + variance
                 + (0.0 if b is None else b64.abs()))
    assert got.dtype == want.dtype and got.shape == want.shape
    rows = -len(shape)
    return tuple(((y - exact).abs() / (2 * bound)).flatten(rows).max(-1).values
                 for y in (got, want))


@pytest.mark.parametrize("use_llvm", BACKENDS)
@pytest.mark.parametrize("affine", [False, True])
def test_layer_norm(affine, use_llvm):
    x = randn(4, 6, 40) * 2 + 50
    w, b = (randn(40), randn(40)) if affine else (None, None)
    layer_norm_within_eagers_bound(x, (40,), w, b, 1e-5, use_llvm=use_llvm)
    w2 = randn(6, 40) if affine else None
    layer_norm_within_eagers_bound(x, (6, 40), w2, None, 1e-3, use_llvm=use_llvm)
    close(lambda x: F.layer_norm(x, (40,), w, b, 1e-5), randn(4, 6, 40), use_llvm=use_llvm)


@pytest.mark.parametrize("use_llvm", BACKENDS)
@pytest.mark.parametrize("width", [40, 768])
def test_layer_norm_extremal_rows(width, use_llvm):
    """Rows where a one-pass variance would cancel: constant, a huge offset with small
    noise, an outlier first (or last); and rows with NaN or infinities, NaN as eager's."""
    w, b = randn(width), randn(width)
    noise = randn(6, width)
    x = torch.stack([
        torch.full((width,), 3.0),  # variance 0: the output is the bias
        1e4 + noise[0] * 1e-2,
        -3e4 + noise[1],
        torch.cat([torch.tensor([1e4]), noise[2, 1:]]),
        torch.cat([noise[3, :-1], torch.tensor([-1e4])]),
        noise[4] * 1e-20,  # a spread below eps
    ])
    for affine in ((w, b), (None, None)):
        fused, eager = layer_norm_excess(x, (width,), *affine, 1e-5, use_llvm=use_llvm)
        assert (fused <= 1.0).all(), (fused, eager)
    got = run_fused(lambda x: F.layer_norm(x, (width,), w, b), x, use_llvm=use_llvm)
    assert torch.equal(got[0], b)
    special = noise.clone()
    special[0, 3], special[1, 0], special[2, -1] = float("nan"), float("inf"), -float("inf")
    special[3, :] = float("inf")
    close(lambda x: F.layer_norm(x, (width,), w, b), special, use_llvm=use_llvm)


@pytest.mark.parametrize("use_llvm", BACKENDS)
@pytest.mark.parametrize("dtype", REDUCED)
def test_layer_norm_reduced_floats(dtype, use_llvm):
    x, w, b = randn(8, 64, dtype=dtype), randn(64, dtype=dtype), randn(64, dtype=dtype)
    close(lambda x, w, b: F.layer_norm(x, (64,), w, b), x, w, b, use_llvm=use_llvm)


def test_residual_layer_norm_is_one_sweep():
    x, r, w, b = randn(64, 768), randn(64, 768), randn(768), randn(768)
    fn = lambda x, r, w, b: F.layer_norm(x + r, (768,), w, b)  # noqa: E731
    close(fn, x, r, w, b)
    stmt = kernel_stmt(fn, x, r, w, b)
    assert len(loops(stmt)) == 1


def test_row_statistics_are_read_once_per_row():
    """The output loop of a layer_norm or softmax row loads no statistic per vector:
    `hoist_loads` reads each into a let before the loop."""
    x, w, b = randn(64, 768), randn(768), randn(768)
    for fn, args in ((lambda x, w, b: F.layer_norm(x, (768,), w, b), (x, w, b)),
                     (lambda x: torch.softmax(x, -1), (x,))):
        stmt = kernel_stmt(fn, *args)
        inner = [s for s in walk(stmt) if isinstance(s, S.For)
                 and not any(isinstance(n, S.For) for n in walk(s.body))]
        assert inner and all(isinstance(n, E.Ramp) for s in inner for n in walk(s.body)
                             if isinstance(n, E.Load) for n in n.indices), str(stmt)
        assert any(isinstance(s, S.Let) for s in walk(stmt))


def test_row_reductions_prefetch_the_next_rows_and_column_sums_do_not():
    """A row's first pass also prefetches the row 4 KB ahead, once per line of 64 bytes."""
    ir = kernel(lambda x: torch.softmax(x, -1), randn(64, 128)).get_code_text("ir")
    calls = [line for line in ir.splitlines() if "call void @llvm.prefetch" in line]
    assert calls and len(calls) <= 2 * 128 * 4 // 64  # the max's input and the sum's
    assert "prefetch" not in kernel(lambda x: x.sum(0), randn(64, 128)).get_code_text("ir")


@pytest.mark.parametrize("use_llvm", BACKENDS)
def test_rms_norm_pattern(use_llvm):
    x, w = randn(16, 96), randn(96)
    fn = lambda x, w: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w  # noqa: E731
    close(fn, x, w, use_llvm=use_llvm)
    stmt = kernel_stmt(fn, x, w)
    assert len(loops(stmt)) == 1


def test_producers_inline_into_the_reduction():
    """(x + b).sum(-1) reads x once: no temporary for x + b."""
    stmt = kernel_stmt(lambda x, b: (x + b).sum(-1), randn(64, 100), randn(100))
    assert not [s for s in stmt.stmts if isinstance(s, S.Allocate)]
    close(lambda x, b: (x + b).sum(-1), randn(64, 100), randn(100))


def test_column_sum_vectorizes_across_columns():
    stmt = kernel_stmt(lambda x: x.sum(0), randn(300, 64))
    assert "Ramp(" in str(stmt)
    close(lambda x: x.sum(0), randn(300, 64))


@pytest.mark.parametrize("fn", [
    lambda x: x.sum(0), lambda x: x.mean(0) * 2, lambda x: x.to(torch.float64).sum(0),
    lambda x: (x * 3 + 1).sum(0, keepdim=True), lambda x: x[:, 5:].sum(0),
    lambda x: (x * x[-1]).sum(0), lambda x: x.view(-1, 100)[:, 10:60].sum(0),
    lambda x: (x - 1e3).half().sum(0), lambda x: x.bfloat16().mean(0, keepdim=True)],
    ids=["sum", "mean", "float64", "keepdim", "columns_slice", "broadcast_row",
         "strided_rows", "float16", "bfloat16_mean"])
@pytest.mark.parametrize("rows", [128, 300, 2048])
def test_column_sums_walk_rows_in_memory_order_with_the_same_results(fn, rows, monkeypatch):
    """The sums of each block of rows, a row at a time, then the blocks' totals per column:
    the same additions in the same order as the walk down the columns, so the very same
    results, at any thread count."""
    x = torch.rand(rows, 200) + 1e3  # large sums: a different order would round otherwise
    assert "_rows" in str(kernel_stmt(fn, x))
    before = torch.get_num_threads()
    got = []
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            got.append(run_fused(fn, x))
    finally:
        torch.set_num_threads(before)
    monkeypatch.setattr(vectorize_reductions, "ROW_PARTS_BYTES", 0)
    clear_kernel_cache()  # identical groups share kernels: build this one anew
    assert "_rows" not in str(kernel_stmt(fn, x))
    want = run_fused(fn, x)
    clear_kernel_cache()
    for g in got:
        assert torch.equal(g, want)
    close(fn, x)


def test_column_sums_by_rows_run_on_threads_over_blocks_of_rows():
    stmt = kernel_stmt(lambda x: x.sum(0), randn(4096, 1024))
    (first, *_) = [s for s in stmt.stmts if isinstance(s, S.For)]
    assert first.parallel and "_rows" in str(first)
    # partial sums past ROW_PARTS_BYTES: down the columns, as before
    assert "_rows" not in str(kernel_stmt(lambda x: x.sum(0), randn(1 << 16, 8192)))


def test_row_statistics_fuse_with_consumers_that_broadcast_them():
    fn = lambda x: (x - x.mean(-1, keepdim=True)) / x.amax(-1, keepdim=True)  # noqa: E731
    close(fn, randn(32, 50))
    assert len(loops(kernel_stmt(fn, randn(32, 50)))) == 1


# -- argmax, argmin, norms, batch_norm, group_norm ------------------------------------------------


@pytest.mark.parametrize("use_llvm", BACKENDS)
def test_argmax_argmin_first_index_and_nan(use_llvm):
    x = extremes()
    x[2, 7] = x[2, 9] = 50.0  # a tie: the first index wins
    for fn in (lambda x: x.argmax(-1), lambda x: x.argmin(1), lambda x: x.argmax(0),
               lambda x: x.argmax(), lambda x: x.argmin(1, keepdim=True),
               lambda x: x.argmax(None, keepdim=True)):
        check(fn, x, use_llvm=use_llvm)
    ints = torch.randint(0, 5, (6, 40), dtype=torch.int32)
    check(lambda x: x.argmax(-1), ints, use_llvm=use_llvm)
    check(lambda x: x.argmin(), ints, use_llvm=use_llvm)


@pytest.mark.parametrize("use_llvm", BACKENDS)
@pytest.mark.parametrize("ord", [2, 1, float("inf"), -float("inf"), 0, 3])
def test_vector_norm(ord, use_llvm):
    x = randn(5, 40)
    x[1, :7] = 0.0
    close(lambda x: torch.linalg.vector_norm(x, ord, -1), x, use_llvm=use_llvm)
    close(lambda x: torch.linalg.vector_norm(x, ord), x, use_llvm=use_llvm)
    close(lambda x: torch.norm(x, 2, 0, keepdim=True), x, use_llvm=use_llvm)


@pytest.mark.parametrize("use_llvm", BACKENDS)
@pytest.mark.parametrize("ord", [2, 1, 3, -1, float("inf"), 0])
def test_vector_norm_of_one_element_is_its_magnitude(ord, use_llvm):
    # Eager gives |x| over one element (fuzzer seeds 820075, 820123): sqrt(x * x) overflows.
    x = torch.tensor([[3e38], [-1e30], [float("nan")], [0.0], [-0.0], [2.5]])
    close(lambda x: torch.linalg.vector_norm(x, ord, -1), x, use_llvm=use_llvm)
    close(lambda x: torch.linalg.vector_norm(x, ord, 0, keepdim=True), x[:1], use_llvm=use_llvm)


@pytest.mark.parametrize("use_llvm", BACKENDS)
@pytest.mark.parametrize("affine", [False, True])
def test_batch_norm_inference(affine, use_llvm):
    x = randn(4, 6, 5, 7)
    mean, var = randn(6), torch.rand(6) + 0.5
    w, b = (randn(6), randn(6)) if affine else (None, None)
    close(lambda x: F.batch_norm(x, mean, var, w, b, False, 0.1, 1e-5), x, use_llvm=use_llvm)
    close(lambda x: torch.relu(F.batch_norm(x, mean, var, w, b)) + 1, x[:, :, 0],
          use_llvm=use_llvm)


@pytest.mark.parametrize("use_llvm", BACKENDS)
@pytest.mark.parametrize("groups", [1, 3, 6])
def test_group_norm(groups, use_llvm):
    x = randn(2, 6, 5, 7) * 3 + 10
    w, b = randn(6), randn(6)
    close(lambda x: F.group_norm(x, groups, w, b, 1e-5), x, use_llvm=use_llvm)
    close(lambda x: F.group_norm(x, groups), x[:, :, 0], use_llvm=use_llvm)
    for dtype in REDUCED:
        close(lambda x: F.group_norm(x, groups, w.to(dtype), b.to(dtype)), x.to(dtype),
              use_llvm=use_llvm)


@pytest.mark.parametrize("use_llvm", BACKENDS)
def test_instance_norm(use_llvm):
    x = randn(2, 6, 5, 7) * 3 + 10
    w, b = randn(6), randn(6)
    close(lambda x: F.instance_norm(x, weight=w, bias=b), x, use_llvm=use_llvm)
    close(lambda x: F.instance_norm(x), x[:, :, 0], use_llvm=use_llvm)
    mean, var = randn(6), torch.rand(6) + 0.5
    close(lambda x: F.instance_norm(x, mean, var, w, b, use_input_stats=False), x,
          use_llvm=use_llvm)


def _default_fused(fn, x):
    """`fn(x)` through nncfuse with the default `min_group_size`, and its fusion groups."""
    f = nncfuse.jit(torch.jit.trace(fn, (x,)))
    f(x)
    return f(x), nncfuse.fusion_groups(f.graph_for(x))


@pytest.mark.parametrize("layout", ["contiguous", "channels_last", "transposed"])
def test_instance_norm_alone_is_a_kernel_with_eagers_values(layout):
    """A lone instance_norm (from 4096 elements) is a group of its own at the default
    min_group_size: NaN, infinities and signed zeros in their (sample, channel) planes as eager's,
    whatever the input's layout."""
    x = randn(2, 16, 12, 12) * 3 + 10
    x[0, 1, 2, 3] = float("nan")
    x[0, 2, 0, 0] = float("inf")
    x[1, 3, 5, 5] = -float("inf")
    x[1, 4] = -0.0
    x[1, 5] = 0.5  # a constant plane: variance 0, rstd 1/sqrt(eps)
    if layout == "channels_last":
        x = x.contiguous(memory_format=torch.channels_last)
    elif layout == "transposed":
        x = x.transpose(2, 3)
    fn = lambda x: F.instance_norm(x, eps=1e-5)  # noqa: E731
    got, groups = _default_fused(fn, x)
    assert groups, "a lone instance_norm of 4608 elements did not fuse"
    torch.testing.assert_close(got, fn(x), equal_nan=True)
    _, groups = _default_fused(fn, randn(2, 4, 8, 8))  # 512 elements: eager's op is as fast
    assert not groups


def test_float_max_min_vectors_keep_nans_with_avx512_max_min():
    """vmaxps/vminps for the compare-and-select of max/min (AVX-512 hosts): NaN in either
    operand gives NaN, as eager; the row max of a softmax too. Of two equal zeros, the
    first operand, as the compare and select elsewhere (the interpreter's): eager's vector
    loop gives the second, its scalar tail the first."""
    nan, inf = float("nan"), float("inf")
    vals = torch.tensor([nan, inf, -inf, 0.0, -0.0, 1.0, -1.0, 1e-45])
    a, b = vals.repeat_interleave(8).repeat(4), vals.repeat(32)  # every pair, 16-lane vectors
    for fn in (torch.maximum, torch.minimum, lambda a, b: torch.stack([a, b]).amax(0),
               lambda a, b: (a + b).view(16, 16).amin(1)):
        got = close(fn, a, b)
        assert torch.equal(got.signbit(), run_fused(fn, a, b, use_llvm=False).signbit())
    close(lambda a: torch.softmax(a.view(16, 16), -1), a)
    if vector_bits() >= 512:
        ir = kernel(torch.maximum, a, b).get_code_text("ir")
        assert "llvm.x86.avx512.max.ps.512" in ir


@pytest.mark.parametrize("dtype", [torch.uint8, torch.float32])
def test_column_sums_of_converted_products_walk_rows_in_steps(dtype):
    """Column sums of float products of converted integers (dequantizing products), over many
    columns: fused multiply-adds, several rows a step; of floats, the order `_by_rows`
    reproduces. Eager's results either way (NaN, infinities, zero-size rows)."""
    def fn(x, w):
        return (x.view(-1, 1) * w.to(torch.float32)).sum(0)
    for rows in (100, 0, 7, 300):
        x = torch.randn(rows)
        w = torch.randint(0, 256, (rows, 256)).to(dtype)
        if rows:
            x[0], x[-1] = float("nan"), float("inf")
        torch.testing.assert_close(run_fused(fn, x, w), fn(x, w), equal_nan=True)
    # (of 100 rows: a long sum is blocked, and its columns walk the rows, `_by_rows`)
    stmt = str(kernel_stmt(fn, torch.randn(100), torch.randint(0, 256, (100, 256)).to(dtype)))
    assert ("fma(" in stmt) == (dtype == torch.uint8), stmt
