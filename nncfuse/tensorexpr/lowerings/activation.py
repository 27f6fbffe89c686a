"""Activations: relu, sigmoid."""

from __future__ import annotations

from .. import expr as E
from . import Ctx, LoweringError, Promotion, pointwise


@pointwise("aten::relu", operands=(0,), overloads=("",))
def relu(ctx: Ctx, x: E.Expr) -> E.Expr:
    if x.dtype.is_bool:
        raise LoweringError("relu of a bool tensor")
    return E.Max(x, E.as_expr(0, x.dtype))


@pointwise("aten::sigmoid", Promotion.INT_TO_FLOAT, operands=(0,), overloads=("",))
def sigmoid(ctx: Ctx, x: E.Expr) -> E.Expr:
    one = E.as_expr(1, x.dtype)
    return one / (one + E.call("exp", -x))
