"""Arithmetic: add, sub, mul, div, neg, pow."""

from __future__ import annotations

from .. import expr as E
from . import Ctx, LoweringError, Promotion, pointwise


def _alpha(ctx: Ctx, value: E.Expr, k: int = 2) -> E.Expr:
    """`value * alpha` for the optional `alpha` operand at position `k`."""
    if k >= len(ctx.args):
        return value
    alpha = ctx.const(k)
    if alpha == 1:
        return value
    if value.dtype.is_bool:
        raise LoweringError("alpha on bool tensors")
    return value * E.as_expr(alpha, value.dtype)


@pointwise("aten::add", overloads=("Tensor", "Scalar"))
def add(ctx: Ctx, a: E.Expr, b: E.Expr) -> E.Expr:
    if a.dtype.is_bool:
        return E.Or(a, _alpha(ctx, b))
    return a + _alpha(ctx, b)


@pointwise("aten::sub", overloads=("Tensor", "Scalar"))
def sub(ctx: Ctx, a: E.Expr, b: E.Expr) -> E.Expr:
    if a.dtype.is_bool:
        raise LoweringError("subtraction of bool tensors")
    return a - _alpha(ctx, b)


@pointwise("aten::mul", overloads=("Tensor", "Scalar"))
def mul(ctx: Ctx, a: E.Expr, b: E.Expr) -> E.Expr:
    return E.And(a, b) if a.dtype.is_bool else a * b


@pointwise("aten::div", Promotion.INT_TO_FLOAT, overloads=("Tensor", "Scalar"))
def div(ctx: Ctx, a: E.Expr, b: E.Expr) -> E.Expr:
    return a / b


@pointwise("aten::neg", operands=(0,), overloads=("",))
def neg(ctx: Ctx, a: E.Expr) -> E.Expr:
    if a.dtype.is_bool:
        raise LoweringError("negation of a bool tensor")
    return -a


# pow(x, c) for these constant exponents is computed as eager computes it.
_POW_SPECIAL = {
    2: lambda x: x * x,
    3: lambda x: x * x * x,
    0.5: lambda x: E.call("sqrt", x),
    -0.5: lambda x: E.as_expr(1, x.dtype) / E.call("sqrt", x),
    -1: lambda x: E.as_expr(1, x.dtype) / x,
    -2: lambda x: E.as_expr(1, x.dtype) / (x * x),
    1: lambda x: x,
}


@pointwise("aten::pow", overloads=("Tensor_Scalar",))
def pow_scalar(ctx: Ctx, x: E.Expr, exponent: E.Expr) -> E.Expr:
    if not x.dtype.is_float:
        raise LoweringError("integer pow")
    arg = ctx.args[1]
    const = getattr(arg, "const", None)
    if const is not None and not isinstance(const, bool) and const in _POW_SPECIAL:
        return _POW_SPECIAL[const](x)
    return E.call("pow", x, exponent)
