"""Unary math: transcendentals, roots, abs, rounding, frac and sign.

Each op computes what ATen's CPU kernel computes (`UnaryOpsKernel.cpp`):
integer and bool inputs of the float functions are converted to the default
float type first, float16/bfloat16 compute in float32, and the rounding
functions leave integers unchanged. The transcendentals are the IR's
intrinsics: in vector loops SLEEF routines (1.0-ULP, or 3.5-ULP for the
float32 functions of `vecmath.FAST_F32`; float32 exp and erf are inline).
Eager calls SLEEF's 1.0-ULP routines or MKL's VML, and a scalar libm for the
tail of a loop, so the two agree to a few ulps, not bit for bit. The rest is
exact but for float16/bfloat16 rsqrt (see there).
"""

from __future__ import annotations

from .. import expr as E
from .registry import Ctx, LoweringError, Promotion, pointwise

#: aten op -> the intrinsic computing it, for float functions of one call.
_FLOAT_CALLS = {
    "aten::exp": "exp",
    "aten::expm1": "expm1",
    "aten::log": "log",
    "aten::log2": "log2",
    "aten::log10": "log10",
    "aten::log1p": "log1p",
    "aten::sin": "sin",
    "aten::cos": "cos",
    "aten::tan": "tan",
    "aten::asin": "asin",
    "aten::acos": "acos",
    "aten::atan": "atan",
    "aten::sinh": "sinh",
    "aten::cosh": "cosh",
    "aten::tanh": "tanh",
    "aten::sqrt": "sqrt",
    "aten::erf": "erf",
    "aten::erfc": "erfc",
    "aten::lgamma": "lgamma",
}

#: Rounding ops -> intrinsic; on integers eager returns a copy of the input.
_ROUNDING = {
    "aten::floor": "floor",
    "aten::ceil": "ceil",
    "aten::trunc": "trunc",
    "aten::round": "rint",  # half to even, as std::nearbyint in the default rounding mode
}


def _register_float_call(kind: str, intrinsic: str) -> None:
    @pointwise(kind, Promotion.INT_TO_FLOAT, operands=(0,), overloads=("",))
    def lower(ctx: Ctx, x: E.Expr) -> E.Expr:
        return E.call(intrinsic, x)


def _register_rounding(kind: str, intrinsic: str) -> None:
    @pointwise(kind, operands=(0,), overloads=("",))
    def lower(ctx: Ctx, x: E.Expr) -> E.Expr:
        if x.dtype.is_bool:
            raise LoweringError(f"{kind} of a bool tensor")  # eager raises
        return E.call(intrinsic, x) if x.dtype.is_float else x


for _kind, _name in _FLOAT_CALLS.items():
    _register_float_call(_kind, _name)
for _kind, _name in _ROUNDING.items():
    _register_rounding(_kind, _name)


@pointwise("aten::rsqrt", Promotion.INT_TO_FLOAT, operands=(0,), overloads=("",))
def rsqrt(ctx: Ctx, x: E.Expr) -> E.Expr:
    # As eager's vector loop: 1 / sqrt(x) in float. Its scalar tail (the last few elements)
    # rounds sqrt(x) to float16/bfloat16 first (c10's std::sqrt overload): an ulp apart.
    return E.as_expr(1.0, x.dtype) / E.call("sqrt", x)


@pointwise("aten::abs", Promotion.COMPLEX_TO_FLOAT, operands=(0,), overloads=("",))
def abs_(ctx: Ctx, x: E.Expr) -> E.Expr:
    if x.dtype.is_bool:
        raise LoweringError("abs of a bool tensor")  # eager raises
    if x.dtype.is_int and not x.dtype.is_signed:
        return x
    return E.call("abs", x)  # integers wrap: abs(INT_MIN) == INT_MIN, as in C


@pointwise("aten::frac", operands=(0,), overloads=("",))
def frac(ctx: Ctx, x: E.Expr) -> E.Expr:
    if not x.dtype.is_float:
        raise LoweringError("frac of an integer tensor")  # eager raises
    return x - E.call("trunc", x)


@pointwise("aten::sign", operands=(0,), overloads=("",))
def sign(ctx: Ctx, x: E.Expr) -> E.Expr:
    """`(0 < x) - (x < 0)`: +0 for zeros of either sign and for NaN, as eager gives."""
    if x.dtype.is_bool:
        return x
    one, zero = E.as_expr(1, x.dtype), E.as_expr(0, x.dtype)
    if x.dtype.is_int and not x.dtype.is_signed:
        return E.select(E.cmp(">", x, zero), one, zero)
    negative = E.select(E.cmp("<", x, zero), E.as_expr(-1, x.dtype), zero)
    return E.select(E.cmp(">", x, zero), one, negative)
