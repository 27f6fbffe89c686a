"""Unary math and activations: the cases OpInfo's samples leave out.

Activation parameters given to the graph at run time as well as constants,
both gelu approximations, signed zeros and NaN, integer inputs promoted to
float, and parameters eager rejects. Each case runs fused (LLVM and the
interpreter) and is compared with eager: bit for bit where eager's result
does not depend on a math library, within assert_close's tolerances where it
does.
"""

import math
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

import nncfuse
from tests.fused import BACKENDS, FLOATS, assert_exact, check, run_fused

SPECIAL = [0.0, -0.0, math.nan, math.inf, -math.inf, 0.5, -0.5, 1.5, -2.5, 3.0, -3.0, 6.0, 1e-3]


def special(dtype, n=67):
    """Signed zeros, NaN, infinities, ties and random values; odd length, for vector tails."""
    x = torch.randn(n, dtype=torch.float64) * 4
    x[: len(SPECIAL)] = torch.tensor(SPECIAL, dtype=torch.float64)
    return x.to(dtype)








# -- signed zeros and NaN --------------------------------------------------------


EXACT_UNARY = {
    "abs": torch.abs,
    "sign": torch.sign,
    "floor": torch.floor,
    "ceil": torch.ceil,
    "round": torch.round,
    "trunc": torch.trunc,
    "frac": torch.frac,
    "relu": torch.relu,
    "relu6": F.relu6,
    "hardtanh_zero": lambda x: F.hardtanh(x, 0.0, 0.0),
    "hardsigmoid": F.hardsigmoid,
    "hardswish": F.hardswish,
    "hardshrink": lambda x: F.hardshrink(x, 0.5),
    "threshold": lambda x: F.threshold(x, 0.0, -7.0),
    "leaky_relu": lambda x: F.leaky_relu(x, 0.25),
}


@pytest.mark.parametrize("use_llvm", BACKENDS)
@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("name", list(EXACT_UNARY))
def test_zeros_nan_and_ties_exact(name, dtype, use_llvm):
    check(EXACT_UNARY[name], special(dtype), use_llvm=use_llvm)


def test_sign_of_zero_nan_and_bool():
    x = torch.tensor([-0.0, 0.0, math.nan, -math.inf, 2.0])
    got = run_fused(torch.sign, x)
    assert_exact(got, torch.tensor([0.0, 0.0, 0.0, -1.0, 1.0]))
    b = torch.tensor([True, False, True])
    assert_exact(run_fused(torch.sign, b), b)
    i = torch.tensor([-128, -1, 0, 1, 127], dtype=torch.int8)
    assert_exact(run_fused(torch.sign, i), torch.sign(i))


def test_round_is_half_to_even():
    x = torch.tensor([0.5, 1.5, 2.5, -0.5, -1.5, 2.4999998, 8388609.0, -0.0])
    assert_exact(run_fused(torch.round, x), torch.tensor(
        [0.0, 2.0, 2.0, -0.0, -2.0, 2.0, 8388609.0, -0.0]
    ))


# -- integers ------------------------------------------------------------------------


INT_DTYPES = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64]


@pytest.mark.parametrize("dtype", INT_DTYPES, ids=str)
@pytest.mark.parametrize("fn", [torch.floor, torch.ceil, torch.round, torch.trunc, torch.abs,
                                torch.sign, torch.relu, F.relu6], ids=lambda f: f.__name__)
def test_integer_ops_keep_their_type(fn, dtype):
    info = torch.iinfo(dtype)
    x = torch.tensor([info.min, info.min + 1, -1 if info.min else 0, 0, 1, 7, info.max])
    check(fn, x.to(dtype))


@pytest.mark.parametrize("dtype", [*INT_DTYPES, torch.bool], ids=str)
@pytest.mark.parametrize("fn", [torch.sqrt, torch.exp, torch.log1p, torch.sigmoid,
                                torch.lgamma, torch.erfc, torch.rsqrt], ids=lambda f: f.__name__)
def test_integer_inputs_promote_to_float(fn, dtype):
    x = torch.arange(-5, 60, dtype=torch.int64)
    x = (x > 3) if dtype == torch.bool else x.clamp(min=0 if dtype == torch.uint8 else -5)
    x = x.to(dtype)
    got = run_fused(fn, x)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, fn(x), equal_nan=True)


def test_int_threshold_and_hardtanh_truncate_float_parameters():
    x = torch.arange(-6, 7, dtype=torch.int16)
    check(lambda t: F.threshold(t, 1.9, -7.3), x)
    check(lambda t: F.hardtanh(t, -1.9, 2.7), x)
    u = torch.arange(0, 9, dtype=torch.uint8)
    check(lambda t: F.threshold(t, -6, 9), u)  # -6 wraps to 250, as in eager
    check(lambda t: F.hardtanh(t, -0.5, 3.5), u)  # -0.5 truncates to 0: accepted


# -- parameters: constants and run-time numbers ------------------------------------


def leaky_relu(x, slope: float):
    return torch.ops.aten.leaky_relu(x, slope)


def elu(x, alpha: float, scale: float, input_scale: float):
    return torch.ops.aten.elu(x, alpha, scale, input_scale)


def softplus(x, beta: float, threshold: float):
    return torch.ops.aten.softplus(x, beta, threshold)


def hardtanh(x, lo: float, hi: float):
    return torch.ops.aten.hardtanh(x, lo, hi)


def threshold(x, limit: float, value: float):
    return torch.ops.aten.threshold(x, limit, value)


def hardshrink(x, lambd: float):
    return torch.ops.aten.hardshrink(x, lambd)


PARAMETRIZED = [
    (leaky_relu, (0.1,)),
    (leaky_relu, (-2.0,)),
    (elu, (0.8, 1.3, 0.7)),
    (elu, (1.0, 1.0507009873554805, 1.0)),
    (softplus, (3.0, 0.2)),
    (softplus, (0.5, 20.0)),
    (hardtanh, (-0.3, 0.7)),
    (hardtanh, (0.7, -0.3)),
    (threshold, (0.10002, -4.3228044509887695)),
    (hardshrink, (0.10002,)),
]


def _exact(fn):
    return fn not in (elu, softplus)


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("fn,params", PARAMETRIZED, ids=lambda v: getattr(v, "__name__", ""))
def test_parameters_at_run_time(fn, params, dtype):
    """Parameters passed as numbers are kernel arguments, converted as eager converts them.

    Eager raises for a float64 parameter that does not fit a narrower type;
    the kernel checks the number before running and raises the same error.
    """
    x = special(dtype)
    f = nncfuse.jit(fn, min_group_size=1)
    for values in (params, tuple(p * 0.5 for p in params)):  # one kernel, other values
        f(x, *values)
        got, want = f(x, *values), fn(x, *values)
        if _exact(fn):
            assert_exact(got, want)
        else:
            torch.testing.assert_close(got, want, equal_nan=True)
    assert nncfuse.fusion_groups(f.graph_for(x, *params))
    huge = tuple(1e300 for _ in params)
    try:
        want = fn(x, *huge)
    except RuntimeError as e:
        with pytest.raises(RuntimeError, match=str(e)):
            f(x, *huge)
    else:
        torch.testing.assert_close(f(x, *huge), want, equal_nan=True)


def int_threshold(x, limit: int, value: int):
    return torch.ops.aten.threshold(x, limit, value)


def int_hardtanh(x, lo: int, hi: int):
    return torch.ops.aten.hardtanh(x, lo, hi)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64], ids=str)
@pytest.mark.parametrize("fn", [int_threshold, int_hardtanh], ids=lambda f: f.__name__)
def test_int_parameters_at_run_time_fuse(fn, dtype):
    """Every int64 fits these types, so integer parameters given at run time fuse."""
    x = (special(torch.float64) * 3).to(dtype) if dtype.is_floating_point else torch.arange(
        -9, 10, dtype=dtype
    )
    for values in ((-2, 3), (1, -7)):
        assert_exact(run_fused(fn, x, *values), fn(x, *values))


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("fn,params", PARAMETRIZED, ids=lambda v: getattr(v, "__name__", ""))
def test_parameters_as_constants(fn, params, dtype):
    x = special(dtype)
    check(lambda t: fn(t, *params), x, exact=_exact(fn))


def test_float16_threshold_compares_in_float_but_hardshrink_rounds_lambd():
    x = torch.tensor([0.10002] * 5, dtype=torch.float16)
    limit = float(x[0]) - 1e-6  # below x, but rounds to x in float16
    got_t = run_fused(lambda t: F.threshold(t, limit, 5.0), x)
    got_h = run_fused(lambda t: F.hardshrink(t, limit), x)
    assert_exact(got_t, x)  # x > limit: kept
    assert_exact(got_h, torch.zeros_like(x))  # x <= float16(limit): zeroed


def test_nan_hardtanh_limit_gives_nan():
    x = special(torch.float32)
    check(lambda t: F.hardtanh(t, math.nan, 1.0), x)
    check(hardtanh, x.double(), -1.0, math.nan)  # a run-time limit: float64 only


def test_parameters_eager_rejects_are_rejected():
    i8 = torch.arange(-3, 3, dtype=torch.int8)
    u8 = torch.arange(0, 4, dtype=torch.uint8)
    for fn, x in [
        (lambda t: F.threshold(t, 300, 1), i8),
        (lambda t: F.threshold(t, -1.5, 2), u8),
        (lambda t: F.hardtanh(t, -1.0, 1.0), u8),
        (lambda t: F.hardtanh(t, -200.0, 1.0), i8),
        (lambda t: F.leaky_relu(t, 1e39), torch.randn(4)),
        (lambda t: F.hardshrink(t, 7e4), torch.randn(4).half()),
    ]:
        with pytest.raises(RuntimeError, match="overflow|negative limits"):
            fn(x)
        with pytest.raises(RuntimeError, match="overflow|negative limits"):
            run_fused(fn, x)


# -- gelu ------------------------------------------------------------------------------


@pytest.mark.parametrize("use_llvm", BACKENDS)
@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu(approximate, dtype, use_llvm):
    x = torch.cat([special(dtype), torch.linspace(-12, 12, 301, dtype=dtype)])
    check(lambda t: F.gelu(t, approximate=approximate), x, exact=False, use_llvm=use_llvm)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_gelu_follows_eager_between_onednn_and_aten(dtype):
    """Eager runs contiguous gelu through oneDNN (bfloat16/float16 where oneDNN supports
    them): with its AVX-512 kernel gelu(inf) is NaN there; ATen's gelu(inf) is inf."""
    x = torch.tensor([math.inf, -math.inf, 3e38, -3e38, 1.0, -6.0, 7.0, 0.0], dtype=dtype)
    gelu = lambda t: F.gelu(t)
    check(gelu, x, exact=False)  # oneDNN where eager uses it
    check(gelu, x[:1], exact=False)  # one element: ATen
    check(gelu, torch.stack([x, x], 1)[:, 0], exact=False)  # strided: ATen
    with torch.backends.mkldnn.flags(enabled=False):  # read when a kernel is built: new shape
        check(gelu, x[:7], exact=False)  # ATen
    assert F.gelu(x[:1])[0].isinf()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_a_dynamic_gelu_follows_eager_at_every_size(dtype):
    """A dynamic kernel profiled on an empty input serves inputs of many elements, which
    eager sends to oneDNN, and of one, which it does not: gelu(inf) follows each (the fuzzer's
    seed 5862 got ATen's inf where eager's oneDNN gives NaN)."""
    def f(t):
        return F.gelu(t * 1.0)

    fused = nncfuse.jit(f, dynamic=True)
    fused(torch.empty(1, 8, 0, 3, dtype=dtype))  # (profiled once: its kernel serves the rest)
    x = torch.tensor([math.inf, -math.inf, 3e38, -3e38, 1.0, -6.0, 7.0, 0.0], dtype=dtype)
    for sizes in [(1, 13, 5, 8), (1, 2, 2, 2), (1, 1, 1, 1), (1, 3, 1, 8)]:
        t = x.repeat(math.prod(sizes))[:math.prod(sizes)].reshape(sizes)
        torch.testing.assert_close(fused(t), f(t), equal_nan=True, rtol=1e-2, atol=1e-2)
    from nncfuse.jit.fuser import runtime

    nodes = [n for n in fused.graph_for(t).nodes() if runtime.is_fused_op(n)]
    assert nodes and all(runtime.kernel_of(n).dynamic for n in nodes)  # (the premise)


GELU_UNDER_ONEDNN_ISA = """
import math, torch, torch.nn.functional as F
from tests.fused import check
for dtype in (torch.float32, torch.bfloat16, torch.float16):
    x = torch.tensor([math.inf, -math.inf, 3e38, -3e38, 1.0, -6.0, 7.0, 0.0], dtype=dtype)
    check(lambda t: F.gelu(t), x, exact=False)
print(F.gelu(torch.tensor([math.inf, 0.0]))[0].item())
"""


@pytest.mark.parametrize("isa", ["avx2", "avx512_core"])
def test_gelu_follows_onednn_isa(isa):
    """oneDNN picks its kernel by its own ISA (ONEDNN_MAX_CPU_ISA caps it): with AVX2 eager's
    float32 gelu(inf) is inf, as on CPUs without AVX-512; with AVX-512 it is NaN."""
    env = {**os.environ, "ONEDNN_MAX_CPU_ISA": isa}
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    done = subprocess.run([sys.executable, "-c", GELU_UNDER_ONEDNN_ISA], env=env, cwd=root,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    if isa == "avx2":
        assert done.stdout.split()[-1] == "inf"


def test_gelu_approximations_differ_as_in_eager():
    x = torch.linspace(-4, 4, 257, dtype=torch.float64)
    exact = run_fused(lambda t: F.gelu(t), x)
    approx = run_fused(lambda t: F.gelu(t, approximate="tanh"), x)
    torch.testing.assert_close(exact, F.gelu(x))
    torch.testing.assert_close(approx, F.gelu(x, approximate="tanh"))
    assert (exact - approx).abs().max() > 1e-5


# -- math functions and transcendental activations at the extremes ------------------


AT_EXTREMES = [
    torch.sqrt, torch.rsqrt, torch.exp, torch.expm1, torch.log, torch.log2, torch.log10,
    torch.log1p, torch.sin, torch.cos, torch.tan, torch.asin, torch.acos, torch.atan,
    torch.sinh, torch.cosh, torch.tanh, torch.erf, torch.erfc, torch.lgamma, torch.sigmoid,
    F.silu, F.mish, F.softplus, F.elu,
]


@pytest.mark.parametrize("use_llvm", BACKENDS)
@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("fn", AT_EXTREMES, ids=lambda f: f.__name__)
def test_math_at_extremes(fn, dtype, use_llvm):
    """Within tolerance: eager's own results vary by an ulp between its vector and scalar loops."""
    big = [-100.0, 100.0, -1e4, 1e4, 88.0, -88.0, -1.0, 1.0, -2.0, 1e30, -1e30, 1e-30]
    x = torch.cat([special(dtype), torch.tensor(big, dtype=dtype)])
    check(fn, x, exact=False, use_llvm=use_llvm)
