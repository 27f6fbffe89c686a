"""Arithmetic: the cases OpInfo's samples leave out.

Numbers given to the graph at run time (divisors, exponents, alpha), integer
division by zero (eager raises, so must the fused kernel), Python numbers and
0-dim tensors next to float16 tensors, signed zeros, MIN / -1, ATen's special
exponents, the two branches of lerp and fused multiply-adds. Each case runs
fused (LLVM and the interpreter) and is compared with eager bit for bit,
except where eager's result depends on a math library.
"""

import math
import warnings

import pytest
import torch

import nncfuse
from nncfuse.tensorexpr import capability
from nncfuse.tensorexpr import expr as E
from nncfuse.tensorexpr.buffer import Buf
from nncfuse.tensorexpr.codegen.llvm_codegen import compile_stmt
from nncfuse.tensorexpr.dtype import from_torch
from nncfuse.tensorexpr.ir_eval import IREvaluator
from nncfuse.tensorexpr.loopnest import compute
from nncfuse.tensorexpr.passes.vectorize import vectorize_inner_loops
from tests.fused import BACKENDS, FLOATS, assert_exact, check, run_fused

INTS = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64]
SPECIAL = [0.0, -0.0, math.nan, math.inf, -math.inf, 0.5, -0.5, 1.0, -1.0, 2.5, -3.0, 7.0]
# eager's AVX2 and AVX-512 kernels fuse multiply-adds; its default ones round twice
FMA = capability.fuses_multiply_adds()


def floats(dtype, n=67, scale=4.0):
    """Signed zeros, NaN, infinities and random values; odd length, for vector tails."""
    x = torch.randn(n, dtype=torch.float64) * scale
    x[: len(SPECIAL)] = torch.tensor(SPECIAL, dtype=torch.float64)
    return x.to(dtype)


def ints(dtype, n=67, nonzero=False):
    """Random integers of `dtype` with its extremes, -1, 0 and 1 (0 left out if `nonzero`)."""
    info = torch.iinfo(dtype)
    x = torch.randint(max(info.min, -100), min(info.max, 100) + 1, (n,), dtype=torch.int64)
    x[:5] = torch.tensor([info.min, info.max, -1 if info.min else 2, 0, 1])
    if nonzero:
        x[x == 0] = 3
    return x.to(dtype)








# -- the fma and powi intrinsics ------------------------------------------------------


def run_ir(fn, inputs, out_dtype):
    """`fn` of loads of `inputs`, vectorized, in the interpreter and compiled: both results."""
    n = inputs[0].numel()
    bufs = [Buf.make(f"in{k}", from_torch(t.dtype), [n]) for k, t in enumerate(inputs)]
    loads = lambda i: [E.Load(b, (i,)) for b in bufs]  # noqa: E731
    out, nest = compute("out", from_torch(out_dtype), [n], lambda i: fn(*loads(i)))
    nest = vectorize_inner_loops(nest, vector_bits=256)
    results = [torch.empty(n, dtype=out_dtype) for _ in range(2)]
    IREvaluator(nest, [*bufs, out]).run([*inputs, results[0]])
    jit = compile_stmt(nest, [*bufs, out], "intrinsic")
    jit.cfunc(*(t.data_ptr() for t in [*inputs, results[1]]))
    return results


@pytest.mark.parametrize("dtype", INTS, ids=str)
def test_powi_wraps_and_takes_negative_exponents_as_aten(dtype):
    base = ints(dtype, n=257)
    exponent = ints(dtype, n=257)
    exponent[5:9] = torch.tensor([-1, -2, 62, 63]).to(dtype)
    for got in run_ir(lambda a, b: E.call("powi", a, b), [base, exponent], dtype):
        assert torch.equal(got, torch.pow(base, exponent))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_fma_rounds_once(dtype):
    a, b = torch.randn(2, 131, dtype=dtype)
    c = -(a * b) + torch.randn(131, dtype=dtype) * 1e-6  # cancellation shows a second rounding
    exact = (a.double() * b.double() + c.double()) if dtype == torch.float32 else None
    for got in run_ir(lambda x, y, z: E.call("fma", x, y, z), [a, b, c], dtype):
        if exact is not None:
            assert torch.equal(got, exact.float())  # float32 products are exact in float64
        if FMA:
            assert torch.equal(got, torch.addcmul(c, a, b))


# -- numbers given at run time ---------------------------------------------------------


def div_scalar(x: torch.Tensor, s: float):
    return x / s


def floordiv_scalar(x: torch.Tensor, s: float):
    return torch.div(x, s, rounding_mode="floor")


def pow_scalar(x: torch.Tensor, s: float):
    return x**s


def add_alpha(x: torch.Tensor, y: torch.Tensor, alpha: int):
    return torch.add(x, y, alpha=alpha)


def lerp_weight(x: torch.Tensor, y: torch.Tensor, w: float):
    return torch.lerp(x, y, w)


@pytest.mark.parametrize("use_llvm", BACKENDS)
@pytest.mark.parametrize("s", [3.0, -0.0, 0.5, -0.5, -1.0, 2.0, 3.0, -2.0, 0.3])
def test_numbers_given_at_run_time(s, use_llvm):
    x = floats(torch.float64)
    check(div_scalar, x, s, use_llvm=use_llvm)
    check(floordiv_scalar, x, s, use_llvm=use_llvm)
    check(pow_scalar, x.abs(), s, use_llvm=use_llvm, exact=False)
    check(pow_scalar, torch.tensor([-0.0, -math.inf, 4.0], dtype=torch.float64), s)
    check(lerp_weight, x, floats(torch.float64).flip(0), s, use_llvm=use_llvm)


def test_int_alpha_given_at_run_time():
    check(add_alpha, floats(torch.float64), floats(torch.float64), 3)
    check(add_alpha, ints(torch.int64), ints(torch.int64), -7)


# -- integer division by zero ----------------------------------------------------------

INT_DIVISIONS = {
    "trunc": lambda a, b: torch.div(a, b, rounding_mode="trunc"),
    "floor": lambda a, b: torch.div(a, b, rounding_mode="floor"),
    "floor_divide": torch.floor_divide,
    "remainder": torch.remainder,
    "fmod": torch.fmod,
}


def int_floordiv(x: torch.Tensor, d: int):
    return torch.div(x, d, rounding_mode="floor")


def int_remainder(x: torch.Tensor, d: int):
    return torch.remainder(x, d)


@pytest.mark.parametrize("dtype", INTS, ids=str)
@pytest.mark.parametrize("name", list(INT_DIVISIONS))
def test_integer_division_matches_and_raises_on_zero(name, dtype):
    fn = INT_DIVISIONS[name]
    a, b = ints(dtype), ints(dtype, nonzero=True).flip(0)
    f = nncfuse.jit(torch.jit.trace(fn, (a, b)), min_group_size=1)
    f(a, b)
    assert_exact(f(a, b), fn(a, b))
    assert nncfuse.fusion_groups(f.graph_for(a, b))
    b[7] = 0
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        fn(a, b)
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        f(a, b)


@pytest.mark.parametrize("fn", [int_floordiv, int_remainder])
def test_integer_divisor_given_at_run_time(fn):
    x = ints(torch.int64)
    check(fn, x, -3)
    f = nncfuse.jit(fn, min_group_size=1)
    f(x, 5)
    f(x, 5)
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        f(x, 0)
    # An int32 tensor sees the divisor modulo 2**32, where 2**32 is zero: not fused.
    x32 = x.int()
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        fn(x32, 2**32)
    f(x32, 2**32 + 3)
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        f(x32, 2**32)


def test_divisor_that_wraps_to_zero_raises_like_eager():
    x = ints(torch.int8)
    fn = lambda x: x // 256  # noqa: E731 - 256 becomes 0 as an int8
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        fn(x)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        f = nncfuse.jit(torch.jit.trace(lambda x: x // 255, (x,)), min_group_size=1)
    f(x)
    assert_exact(f(x), x // 255)


def test_empty_dividend_does_not_look_at_the_divisor():
    a, b = torch.empty(0, 3, dtype=torch.int64), torch.tensor([[0, 1, 2]])
    f = nncfuse.jit(torch.jit.trace(torch.remainder, (a, b)), min_group_size=1)
    f(a, b)
    assert f(a, b).shape == (0, 3)


@pytest.mark.parametrize("dtype", [torch.int8, torch.int32, torch.int64], ids=str)
def test_min_divided_by_minus_one_wraps(dtype):
    a = torch.full((20,), torch.iinfo(dtype).min, dtype=dtype)
    b = torch.full((20,), -1, dtype=dtype)
    for name in ("floor", "remainder", "fmod"):
        check(INT_DIVISIONS[name], a, b)
    # Eager's trunc division traps (SIGFPE) here: profile on other values, then divide.
    trunc, two = INT_DIVISIONS["trunc"], torch.full_like(b, 2)
    f = nncfuse.jit(torch.jit.trace(trunc, (a, two)), min_group_size=1)
    f(a, two)
    assert torch.equal(f(a, two), trunc(a, two))
    assert torch.equal(f(a, b), a)


# -- float division and remainders -------------------------------------------------------


@pytest.mark.parametrize("use_llvm", BACKENDS)
@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("name", list(INT_DIVISIONS))
def test_float_division_signed_zeros_and_infinities(name, dtype, use_llvm):
    a, b = floats(dtype), floats(dtype).flip(0)
    pairs = torch.cartesian_prod(torch.arange(len(SPECIAL)), torch.arange(len(SPECIAL)))
    a = torch.cat([a, a[: len(SPECIAL)][pairs[:, 0]]])
    b = torch.cat([b, a[: len(SPECIAL)][pairs[:, 1]]])
    check(INT_DIVISIONS[name], a, b, use_llvm=use_llvm)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_floor_division_of_large_reduced_floats_rounds_each_step(dtype):
    a = torch.tensor([-8200.0, 8200.0, -8192.0, 60000.0, -1e4, 3e4], dtype=dtype)
    b = torch.tensor([3.0, -3.0, 7.0, 0.3, 0.7, -0.9], dtype=dtype)
    check(torch.floor_divide, a.repeat(5), b.repeat(5))


# -- numbers and 0-dim tensors next to float16 ------------------------------------------

REDUCED_MIXED = {
    # add casts the number to float16 first; mul and div read it in float32.
    "add": lambda x: x + 0.1,
    "sub_0dim": lambda x: x - torch.tensor(0.1, dtype=torch.float64),
    "mul": lambda x: x * 0.1,
    "mul_int": lambda x: x * 2049,
    "div": lambda x: x / 0.1,
    "rdiv_0dim": lambda x: torch.div(torch.tensor(0.1, dtype=torch.float64), x),
    "trunc": lambda x: torch.div(x, 0.3, rounding_mode="trunc"),
    "floor": lambda x: torch.div(x, 0.3, rounding_mode="floor"),
    "remainder": lambda x: torch.remainder(x, 0.3),
    "rsub": lambda x: torch.rsub(x, 0.1, alpha=3),
}


@pytest.mark.parametrize("use_llvm", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("name", list(REDUCED_MIXED))
def test_numbers_next_to_reduced_floats(name, dtype, use_llvm):
    # 31 elements: eager's scalar loop (see `add`'s docstring for why that matters)
    x = torch.randn(31, dtype=torch.float64).mul(100).to(dtype)
    check(REDUCED_MIXED[name], x, use_llvm=use_llvm)
    big = torch.randn(515, dtype=torch.float64).mul(100).to(dtype)
    check(REDUCED_MIXED[name], big, use_llvm=use_llvm, exact=name != "rsub")


# -- pow ------------------------------------------------------------------------------


@pytest.mark.parametrize("use_llvm", BACKENDS)
@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("e", [0, 1, 0.5, -0.5, -1, 2, 3, -2, 2.001, 0.3])
def test_pow_special_exponents(e, dtype, use_llvm):
    # Eager's float32 sqrt (MKL's) is not always correctly rounded, ours is.
    exact = e in (0, 1, -1, 2, 3, -2) or (e == 2.001 and dtype == torch.bfloat16)
    check(lambda x: x**e, floats(dtype), use_llvm=use_llvm, exact=exact)
    # float16 computes pow(x, 0.5): +0 at -0, inf at -inf; the others sqrt: -0, nan
    check(lambda x: x**e, torch.tensor([-0.0, -math.inf, math.inf, 0.0, math.nan], dtype=dtype))


@pytest.mark.parametrize("dtype", INTS, ids=str)
def test_integer_pow_wraps_and_negative_exponents(dtype):
    base, exponent = ints(dtype), ints(dtype).abs().flip(0)
    check(torch.pow, base, exponent)
    if dtype != torch.uint8:
        small = torch.tensor([1, -1, -1, 2, 0, -3], dtype=dtype)
        check(torch.pow, small, torch.tensor([-5, -5, -4, -1, 3, -2], dtype=dtype))
    check(lambda x: x**7, base)
    check(lambda x: 3**x, exponent)


def test_square_of_bool_is_int64():
    b = torch.tensor([True, False, True])
    assert run_fused(torch.square, b).dtype == torch.int64


# -- lerp and the multiply-adds -------------------------------------------------------------


@pytest.mark.parametrize("use_llvm", BACKENDS)
@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_lerp_branches_on_the_weight(dtype, use_llvm):
    start, end = floats(dtype, scale=100), floats(dtype, scale=100).flip(0)
    weight = torch.linspace(-1.5, 1.5, start.numel(), dtype=torch.float64)
    weight[:4] = torch.tensor([0.5, -0.5, 0.49999, math.nan])
    check(torch.lerp, start, end, weight.to(dtype), use_llvm=use_llvm, exact=FMA)
    for w in (0.25, 0.5, -0.75, 2.0):
        check(lambda a, b: torch.lerp(a, b, w), start, end, use_llvm=use_llvm, exact=FMA)


@pytest.mark.parametrize("use_llvm", BACKENDS)
@pytest.mark.parametrize("dtype", [*FLOATS, torch.int16, torch.int64], ids=str)
def test_multiply_adds(dtype, use_llvm):
    make = floats if dtype.is_floating_point else ints
    n = 31 if dtype in (torch.float16, torch.bfloat16) else 67  # as in `add`'s docstring
    a, b, c = make(dtype, n), make(dtype, n).flip(0), make(dtype, n).roll(3)
    value = 0.7 if dtype.is_floating_point else 3
    exact = FMA or not dtype.is_floating_point
    check(lambda x, y, z: torch.addcmul(x, y, z, value=value), a, b, c, exact=exact)
    check(lambda x, y: torch.add(x, y, alpha=value), a, b, use_llvm=use_llvm, exact=exact)
    check(lambda x, y: torch.sub(x, y, alpha=value), a, b, use_llvm=use_llvm, exact=exact)


def test_bool_add_and_mul():
    a = torch.tensor([True, False, True, False])
    b = torch.tensor([True, True, False, False])
    check(torch.add, a, b)
    check(torch.mul, a, b)


def test_neg_keeps_signed_zeros():
    check(torch.neg, floats(torch.float32))
    check(torch.neg, ints(torch.uint8))


# -- hypot (one row in ops.CALLS and a lowering) ----------------------------------------


def hypot_grid(dtype):
    """Every pair of zeros, NaN, infinities, extremes (overflow, subnormals) and ordinary
    values, then random pairs over many magnitudes: operands `a` and `b`."""
    info = torch.finfo(dtype)
    values = torch.tensor([0.0, -0.0, math.nan, math.inf, -math.inf, 3.0, -4.0, info.max,
                           -info.max, info.tiny, info.smallest_normal / 8], dtype=dtype)
    a, b = values.repeat_interleave(len(values)), values.repeat(len(values))
    g = torch.Generator().manual_seed(8)
    scale = 2.0 ** torch.randint(-20, 20, (2, 67), generator=g).to(torch.float64)
    r = (torch.randn(2, 67, generator=g, dtype=torch.float64) * scale).to(dtype)
    return torch.cat([a, r[0]]), torch.cat([b, r[1]])


def _hypot_cases(got, want, a, b):
    torch.testing.assert_close(got, want, equal_nan=True)  # an ulp apart at most: libm, SLEEF
    special = ~(a.isfinite() & b.isfinite()) | ((a == 0) & (b == 0))
    assert_exact(got[special], want[special])  # inf beats NaN; +0. for zeros of either sign


@pytest.mark.parametrize("use_llvm", BACKENDS)
@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_hypot_matches_eager_on_extremes(dtype, use_llvm):
    a, b = hypot_grid(dtype)
    got = run_fused(torch.hypot, a, b, use_llvm=use_llvm)
    _hypot_cases(got, torch.hypot(a, b), a, b)


@pytest.mark.parametrize("use_llvm", BACKENDS)
def test_hypot_promotes_like_eager(use_llvm):
    a, b = hypot_grid(torch.float16)
    c = b.to(torch.bfloat16)  # float16 with bfloat16 computes and returns float32
    got = run_fused(torch.hypot, a, c, use_llvm=use_llvm)
    assert got.dtype == torch.float32
    _hypot_cases(got, torch.hypot(a, c), a.float(), c.float())
    k = torch.arange(-33, 34)
    check(torch.hypot, k, floats(torch.float64), exact=False, use_llvm=use_llvm)


def test_hypot_of_integers_raises_like_eager():
    def f(x: torch.Tensor, y: torch.Tensor):
        return torch.hypot(x, y) + 1

    k = torch.arange(5)
    fused = nncfuse.jit(f, min_group_size=1)
    for _ in range(2):
        with pytest.raises(RuntimeError, match="not implemented for 'Long'"):
            fused(k, k)


# -- scripted overloads ------------------------------------------------------------------


def scripted_forms(x: torch.Tensor, y: torch.Tensor, s: float, i: int):
    a = x + s - i * x + 2.0 - x  # add.Scalar, mul.Scalar, sub.Scalar, rsub.Scalar
    b = torch.rsub(x, y, alpha=2) + torch.sub(x, y, alpha=i)  # sub.Tensor with alpha
    c = x / s + torch.true_divide(x, y) + torch.div(x, y, rounding_mode="trunc")
    d = torch.div(x, s, rounding_mode="floor") + torch.floor_divide(x, s) + x // y
    e = x % s + i % (y.abs() + 1.0) + torch.fmod(x, s) + torch.fmod(x, y)
    f = x**s + s**x + 2**x + x**y + torch.square(x) + torch.reciprocal(y)
    g = torch.lerp(x, y, 0.3) + torch.lerp(x, y, y) + torch.addcmul(x, y, x, value=s)
    return a + b + c + d + e + f + g + torch.atan2(x, y) - torch.neg(y)


def test_scripted_overloads_fuse_into_one_group():
    x, y = torch.rand(2, 37, dtype=torch.float64).add(0.5)
    f = nncfuse.jit(scripted_forms, min_group_size=1)
    f(x, y, 1.5, 3)
    got = f(x, y, 1.5, 3)
    torch.testing.assert_close(got, scripted_forms(x, y, 1.5, 3))
    graph = f.graph_for(x, y, 1.5, 3)
    (group,) = nncfuse.fusion_groups(graph)
    unfused = [n.kind() for n in graph.nodes() if n.kind().startswith("aten::")]
    assert not unfused, unfused


# -- a product with a bool mask -------------------------------------------------------


@pytest.mark.parametrize("use_llvm", BACKENDS)
@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_a_product_with_a_bool_mask_is_eagers_product(dtype, use_llvm):
    """`x * mask` (autodiff's hardtanh and ReLU gradients) selects instead of multiplying:
    the same values bit for bit, subnormals, signed zeros, infinities and NaN included,
    mask first or second."""
    x = floats(dtype)
    x[-4:] = torch.tensor([1e-40, -1e-40, 1e-310, -1e-310], dtype=torch.float64).to(dtype)
    mask = torch.rand(x.shape, generator=torch.Generator().manual_seed(0)) < 0.5
    mask[: len(SPECIAL)] = False
    mask[len(SPECIAL): 2 * len(SPECIAL)] = True
    x[len(SPECIAL): 2 * len(SPECIAL)] = x[: len(SPECIAL)]
    check(lambda x, m: -(x * m), x, mask, use_llvm=use_llvm)
    check(lambda x, y: (y > 0) * x * 2.0, x, mask.to(dtype) - 0.5, use_llvm=use_llvm)
