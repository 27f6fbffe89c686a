"""Unary math: exp, log, sin, cos, tanh, sqrt, rsqrt, abs, ..."""

from __future__ import annotations

from .. import expr as E
from . import Ctx, LoweringError, Promotion, pointwise

# aten op -> intrinsic computing it, for ops that are one intrinsic call.
_FLOAT_CALLS = {
    "aten::exp": "exp",
    "aten::log": "log",
    "aten::sin": "sin",
    "aten::cos": "cos",
    "aten::tanh": "tanh",
    "aten::sqrt": "sqrt",
}


def _register_call(kind: str, intrinsic: str) -> None:
    @pointwise(kind, Promotion.INT_TO_FLOAT, operands=(0,), overloads=("",))
    def lower(ctx: Ctx, x: E.Expr) -> E.Expr:
        return E.call(intrinsic, x)


for _kind, _name in _FLOAT_CALLS.items():
    _register_call(_kind, _name)


@pointwise("aten::rsqrt", Promotion.INT_TO_FLOAT, operands=(0,), overloads=("",))
def rsqrt(ctx: Ctx, x: E.Expr) -> E.Expr:
    return E.as_expr(1, x.dtype) / E.call("sqrt", x)


@pointwise("aten::abs", Promotion.COMPLEX_TO_FLOAT, operands=(0,), overloads=("",))
def abs_(ctx: Ctx, x: E.Expr) -> E.Expr:
    if x.dtype.is_bool:
        raise LoweringError("abs of a bool tensor")
    return E.call("abs", x)
