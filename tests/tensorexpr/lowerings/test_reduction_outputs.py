"""Reductions with two outputs (max.dim, min.dim, var_mean, std_mean) and eval dropout,
fused, against eager on both backends: values, indices, dtypes, NaN, empty and 0-dim."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import nncfuse
from tests.fused import BACKENDS, assert_exact, run_fused
from tests.tensorexpr.lowerings.test_reduction_ops import REDUCED, extremes, randn


def both(fn, *args, use_llvm=True, exact=True):
    """Each output of `fn` fused equals eager's (bit for bit, or within assert_close)."""
    got, want = run_fused(fn, *args, use_llvm=use_llvm), fn(*args)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        if exact:
            assert_exact(g, w)
        else:
            torch.testing.assert_close(g, w, equal_nan=True)
    return got


MAX_MIN = {
    "max_rows": lambda x: torch.max(x, -1),
    "min_cols": lambda x: torch.min(x, 0),
    "max_keepdim": lambda x: torch.max(x, 1, keepdim=True),
    "min_negative_keepdim": lambda x: torch.min(x, -2, True),
    "values_used": lambda x: (torch.max(x, 1).values * 2, x + 1),
    "indices_used": lambda x: (torch.min(x * 2, 1)[1] + 1,),
    "transposed": lambda x: torch.max(x.t(), 0),
}


@pytest.mark.parametrize("use_llvm", BACKENDS)
@pytest.mark.parametrize("name", list(MAX_MIN))
def test_max_min_dim_nan_and_first_index(name, use_llvm):
    x = extremes()
    x[2, 7] = x[2, 9] = 50.0  # a tie: the first index wins
    x[5, 2] = float("nan")  # NaN: the value, and the index of the first NaN
    both(MAX_MIN[name], x, use_llvm=use_llvm)


@pytest.mark.parametrize("use_llvm", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float64, *REDUCED, torch.int32, torch.uint8])
def test_max_min_dim_dtypes(dtype, use_llvm):
    x = (randn(5, 23) * 4).to(dtype)
    both(lambda x: torch.max(x, -1), x, use_llvm=use_llvm)
    both(lambda x: torch.min(x, 0, keepdim=True), x, use_llvm=use_llvm)


@pytest.mark.parametrize("use_llvm", BACKENDS)
def test_max_min_full_empty_and_zero_dim(use_llvm):
    x = extremes()
    for fn in (lambda x: torch.max(x) + 0, lambda x: torch.min(x * 2)):
        assert_exact(run_fused(fn, x, use_llvm=use_llvm), fn(x))
    both(lambda x: torch.max(x, 1), torch.randn(0, 3), use_llvm=use_llvm)  # empty rows
    both(lambda x: torch.min(x, -1, True), torch.tensor(2.5), use_llvm=use_llvm)


def _max_cols(x):
    return torch.max(x * 2, 0)


def test_max_over_an_empty_dim_stays_eager():
    x = torch.randn(0, 3)
    f = nncfuse.jit(_max_cols, min_group_size=1)
    for _ in range(2):
        with pytest.raises((RuntimeError, IndexError), match="non-zero size"):
            f(x)


@pytest.mark.filterwarnings("ignore:var_mean|std_mean")
@pytest.mark.parametrize("use_llvm", BACKENDS)
@pytest.mark.parametrize("correction", [0, 1, 2, 40])
def test_var_mean_std_mean(correction, use_llvm):
    x = randn(5, 6, 33) * 3 + 1e3  # E[x^2] - E[x]^2 would cancel catastrophically here
    both(lambda x: torch.var_mean(x, -1, correction=correction), x,  # 40 > 33: inf, as eager
         use_llvm=use_llvm, exact=False)
    both(lambda x: torch.std_mean(x, (0, 2), correction=correction, keepdim=True), x,
         use_llvm=use_llvm, exact=False)


@pytest.mark.filterwarnings("ignore:var_mean")
@pytest.mark.parametrize("use_llvm", BACKENDS)
def test_var_mean_overloads_dtypes_and_empty(use_llvm):
    x = randn(4, 37)
    both(lambda x: torch.var_mean(x, 1, unbiased=False), x, use_llvm=use_llvm, exact=False)
    both(lambda x: torch.std_mean(x + 1), x, use_llvm=use_llvm, exact=False)
    both(lambda x: torch.var_mean(x + 1, 1), torch.randn(3, 0), use_llvm=use_llvm)  # NaN
    for dtype in REDUCED:
        both(lambda x: torch.std_mean(x, -1), x.to(dtype), use_llvm=use_llvm, exact=False)


@pytest.mark.parametrize("use_llvm", BACKENDS)
def test_eval_dropout_is_the_identity(use_llvm):
    x = extremes()
    for fn in (lambda x: F.dropout(x, 0.3, training=False) * 2,
               lambda x: F.dropout(x + 1, training=False),
               lambda x: torch.feature_alpha_dropout(x - 1, 0.5, False)):
        assert_exact(run_fused(fn, x, use_llvm=use_llvm), fn(x))


def test_eval_dropout_returns_its_input_itself():
    def f(x):
        y = F.dropout(x, training=False)
        return y, y * 2

    x = torch.randn(3, 4)
    g = nncfuse.jit(f, min_group_size=1)
    g(x)
    y, z = g(x)
    assert y is x or y.data_ptr() == x.data_ptr()  # eager's alias, not a copy
    assert_exact(z, x * 2)


def _train_dropout(x):
    return F.dropout(x * 2, 0.5, training=True)


def test_training_dropout_stays_eager():
    f = nncfuse.jit(_train_dropout, min_group_size=1)
    x = torch.ones(64, 64)
    f(x)
    y = f(x)
    assert set(y.unique().tolist()) <= {0.0, 4.0} and (y == 0).any()
    assert "dropout in training" in str(nncfuse.explain(_train_dropout, x))


# -- a lone reduction under the default min_group_size ------------------------------------------

LONE = {
    "softmax": (lambda x: torch.softmax(x, -1), (256, 768), (8, 128)),
    "log_softmax": (lambda x: torch.log_softmax(x, 1), (256, 768), (8, 128)),
    "layer_norm": (lambda x: F.layer_norm(x, (768,)), (256, 768), (8, 768)),
    # From memory (rows prefetched ahead) and over rows of 4096: 1.1-2x eager.
    "softmax_4096": (lambda x: torch.softmax(x, -1), (64, 4096), (8, 128)),
    "layer_norm_2048": (lambda x: F.layer_norm(x, (768,)), (2048, 768), (8, 768)),
    "layer_norm_4096": (lambda x: F.layer_norm(x, (4096,)), (64, 4096), (8, 4096)),
    "var_mean": (lambda x: torch.var_mean(x, -1), (16, 128), (4, 128)),
    "max_dim": (lambda x: torch.max(x, -1), (64, 128), (8, 128)),
}


@pytest.mark.parametrize("name", list(LONE))
def test_a_lone_reduction_fuses_where_it_beats_eager(name):
    fn, big, small = LONE[name]
    for shape, fuses in ((big, True), (small, False)):
        x = torch.randn(shape)
        traced = torch.jit.trace(fn, (x,), check_trace=False)
        f = nncfuse.jit(traced)  # min_group_size=2
        f(x)
        torch.testing.assert_close(f(x), fn(x))
        assert bool(nncfuse.fusion_groups(f.graph_for(x))) == fuses, shape


@pytest.mark.parametrize("fn, shape", [
    (lambda x: torch.softmax(x, -1), (64, 8192)),  # rows too wide: 1.0-1.1x eager
    (lambda x: F.layer_norm(x, (8192,)), (64, 8192)),  # 1.0x
])
def test_a_lone_reduction_stays_eager_where_eager_is_faster(fn, shape):
    x = torch.randn(shape)
    f = nncfuse.jit(torch.jit.trace(fn, (x,)))
    f(x)
    assert not nncfuse.fusion_groups(f.graph_for(x))


# -- rms_norm (the op; the pattern written out is in test_reduction_ops) ------------------------


@pytest.mark.parametrize("use_llvm", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, *REDUCED])
def test_rms_norm_op(dtype, use_llvm):
    x, w = randn(6, 5, 48, dtype=dtype), randn(48, dtype=dtype)
    for fn in (lambda x: F.rms_norm(x, (48,), w), lambda x: F.rms_norm(x, (5, 48), eps=1e-3),
               lambda x: F.rms_norm(x * 0, (48,))):  # all zeros: eps keeps it finite
        got, want = run_fused(fn, x, use_llvm=use_llvm), fn(x)
        assert got.dtype == want.dtype
        torch.testing.assert_close(got, want)


# -- what the fuzzer found (seeds 5357, 5319, 5007) ---------------------------------------------


@pytest.mark.parametrize("use_llvm", BACKENDS)
def test_var_accumulates_in_float64_as_eager(use_llvm):
    x = torch.zeros(3, 8)
    x[:, 0], x[:, 1] = 2e19, -2e19  # squares overflow float32, not the float64 eager uses
    got = run_fused(lambda x: torch.std(x, 1, correction=0), x, use_llvm=use_llvm)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, torch.std(x, 1, correction=0))
    both(lambda x: torch.var_mean(x, 1), x, use_llvm=use_llvm, exact=False)


def _ulp(x):
    """float32's unit in the last place at each element of `x` (float64)."""
    f = x.float().abs()
    return (torch.nextafter(f, torch.tensor(float("inf"))) - f).double()


@pytest.mark.filterwarnings("ignore:var_mean|std_mean")
@pytest.mark.parametrize("use_llvm", BACKENDS)
def test_var_mean_of_float32_rows_keeps_float64s_accuracy(use_llvm):
    # Rows where float32 sums of the deviations from a float32 mean would be off: a large
    # mean with a small spread (the mean's own rounding is most of each deviation), an
    # outlier, constant rows, float32's range overflowed (1e19) and underflowed (1e-20) by
    # the squares; rows of 2 and 37 elements. Against float64 eager: the variance within a
    # few float32 roundings, the mean within one unit in its last place (and a few float32
    # roundings of the spread), 0 and the
    # constant exactly (as eager's Welford: 0 from float32 sums of deviations from a mean
    # rounded to float32 would take the row's spread for that rounding).
    torch.manual_seed(0)
    rows = {
        "offset": 1e4 + torch.randn(4, 1024, dtype=torch.float64),
        "offset_small_spread": 1e4 + 1e-2 * torch.randn(4, 1024, dtype=torch.float64),
        "outlier": torch.cat([torch.full((4, 1), 1e6, dtype=torch.float64),
                              torch.randn(4, 1023, dtype=torch.float64)], 1),
        "huge": 1e19 * torch.randn(4, 1024, dtype=torch.float64),  # squares past 3.4e38
        "tiny": 1e-20 * torch.randn(4, 1024, dtype=torch.float64),
        "squares_underflow": 1e-30 * torch.randn(4, 1024, dtype=torch.float64),  # not constant
        "two": 1e3 + torch.randn(4, 2, dtype=torch.float64),
        "odd": 1e3 + 3 * torch.randn(4, 37, dtype=torch.float64),
    }
    for name, x in rows.items():
        x = x.float()
        for correction in (0, 1):
            var, mean = run_fused(lambda x: torch.var_mean(x, -1, correction=correction), x,
                                  use_llvm=use_llvm)
            want_var, want_mean = torch.var_mean(x.double(), -1, correction=correction)
            assert ((var.double() - want_var).abs() <= 1e-6 * want_var + _ulp(want_var)).all(), name
            # (float32 sums of deviations: off by a few roundings of the spread's size)
            spread = 4 * 2.0 ** -24 * want_var.sqrt()
            assert ((mean.double() - want_mean).abs() <= _ulp(want_mean) + spread).all(), name
        std, _ = run_fused(lambda x: torch.std_mean(x, 1, keepdim=True), x, use_llvm=use_llvm)
        want = torch.std(x.double(), 1, keepdim=True)
        assert ((std.double() - want).abs() <= 1e-6 * want).all(), name
    const = torch.tensor([[0.1] * 1023 + [0.1], [-0.0] * 1024, [3e38] * 1024, [7.0] * 1024])
    got = both(lambda x: torch.var_mean(x, 1), const, use_llvm=use_llvm)
    assert got[0].tolist() == [0.0] * 4


@pytest.mark.parametrize("use_llvm", BACKENDS)
def test_var_mean_mean_is_welfords_with_infinities(use_llvm):
    inf = float("inf")
    y = torch.tensor([[1.0, inf, 2.0], [1.0, 2.0, inf], [inf, 1.0, 2.0], [1.0, -inf, inf]])
    got = both(lambda y: torch.var_mean(y, 1), y, use_llvm=use_llvm)  # NaN, inf, NaN, NaN
    assert got[1].isinf().tolist() == [False, True, False, False]
    both(lambda y: torch.std_mean(y.t(), 0, keepdim=True), y, use_llvm=use_llvm)
    nan = float("nan")
    z = torch.tensor([[[1.0, nan], [2.0, 3.0]], [[1.0, 2.0], [3.0, -inf]],
                      [[inf, 1.0], [2.0, 3.0]], [[5.0, 1.0], [nan, 3.0]]])
    for dims in ((1, 2), 2):  # flat over two dims (the last element: z[k, 1, 1]), one dim
        got = both(lambda z: torch.var_mean(z, dims), z, use_llvm=use_llvm)
    assert got[1].isinf().tolist() == [[False, False], [False, True], [False, False],
                                       [False, False]]
    both(lambda z: torch.var_mean(z, 1), z.half(), use_llvm=use_llvm)  # checked in float32
    both(lambda z: torch.var_mean(z, 2), z[..., :1], use_llvm=use_llvm)  # rows of one


@pytest.mark.parametrize("use_llvm", BACKENDS)
def test_var_mean_of_long_rows_with_infinities_and_overflow(use_llvm):
    # Vectorized rows: an infinity at the last element only gives an infinite mean; one
    # before it a NaN, as Welford; such rows, and those whose float32 sums overflow, are
    # computed in float64 (bit for bit as eager's), the finite row from float32 sums.
    x = randn(6, 1024)
    x[0, 1023] = x[1, 1022] = x[2, 0] = float("inf")
    x[3, :] = 3e38  # the float64 sums do not overflow, as eager's Welford does not
    x[4, 1000] = float("nan")
    for fn, y in ((lambda x: torch.var_mean(x, 1), x),
                  (lambda x: torch.var_mean(x.t(), 0), x)):  # rows of stride 1 all the same
        got = both(fn, y, use_llvm=use_llvm, exact=False)
        want = fn(y)
        for g, w in zip(got, want):
            assert_exact(g[:5], w[:5])
    assert got[1].isinf().tolist() == [True, False, False, False, False, False]
    assert got[1][3] == 3e38 and got[1][1:3].isnan().all()
    both(lambda x: torch.var_mean(x, 0), x, use_llvm=use_llvm, exact=False)  # strided rows
    both(lambda x: torch.std_mean(x, -1, keepdim=True), randn(3, 7, 65), use_llvm=use_llvm,
         exact=False)


@pytest.mark.parametrize("use_llvm", BACKENDS)
@pytest.mark.parametrize("dtype", REDUCED)
def test_logsumexp_of_reduced_floats_rounds_as_eagers_tensor_ops(dtype, use_llvm):
    x = torch.log_softmax(randn(8, 7), 1).to(dtype)  # each row's answer is about 0
    fn = lambda x: torch.logsumexp(x, 1, keepdim=True)  # noqa: E731
    assert_exact(run_fused(fn, x, use_llvm=use_llvm), fn(x))  # float32 throughout: 5e-4 off


@pytest.mark.parametrize("use_llvm", BACKENDS)
def test_softmax_of_a_zero_dim_tensor(use_llvm):  # seed 20173: 0 / 0 where eager has 1
    for v in (0.0, -3.5, float("inf"), float("nan")):
        x = torch.tensor(v)
        for fn in (lambda x: torch.softmax(x, -1), lambda x: torch.log_softmax(x * 1, 0)):
            assert_exact(run_fused(fn, x, use_llvm=use_llvm), fn(x))


@pytest.mark.parametrize("use_llvm", BACKENDS)
def test_argmax_then_an_elementwise_output_over_other_dims(use_llvm):
    """Seed 20376: the log2 temporary lived in erf's output while argmax, in the same
    loops, still read other rows of it (`reuse_outputs`)."""
    x = torch.rand(7, 2, 2, 1, dtype=torch.float64) * 100

    def fn(x):
        v = torch.log2(x)
        return torch.erf(torch.trunc(v.sum(-1, keepdim=True))), v.argmax(1, keepdim=True).sum(1)

    x[:, 0, 1], x[:, 1, 1] = 1024.0, 8.0  # log2: 10 (the max) and 3; erf(10) = 1 is less
    both(fn, x, use_llvm=use_llvm, exact=False)
