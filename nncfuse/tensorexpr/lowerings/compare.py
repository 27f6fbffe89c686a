"""Comparisons and selection: eq, ne, lt, le, gt, ge, isnan, logical_not, where, masked_fill,
maximum, minimum, max/min (binary), clamp, clamp_min, clamp_max.

Eager converts every operand to the promoted ("common") type before it
compares, so a float16 tensor is compared with a number rounded to float16,
not with the number itself (`Ctx.operands` does that). Operands that are
numbers are converted with eager's range check (`casts.checked`) where eager
has one: the values of `where` and `masked_fill`, the bounds of `clamp`.

Selecting and min/max commute with rounding (rounding is monotonic), so
those compute in float32 for float16/bfloat16 and round only the result.
"""

from __future__ import annotations

from .. import expr as E
from ..dtype import BOOL, Dtype
from .casts import checked, convert
from .registry import (
    Arg,
    Ctx,
    LoweringError,
    Promotion,
    ScalarArg,
    TensorArg,
    compute_type,
    pointwise,
    register,
)

# aten op -> comparison; the aliases (`greater`, ...) are other spellings of the same.
_COMPARISONS = {
    "aten::eq": "==",
    "aten::ne": "!=",
    "aten::lt": "<",
    "aten::le": "<=",
    "aten::gt": ">",
    "aten::ge": ">=",
    "aten::not_equal": "!=",
    "aten::less": "<",
    "aten::less_equal": "<=",
    "aten::greater": ">",
    "aten::greater_equal": ">=",
}


def _operand(ctx: Ctx, arg: Arg, common: Dtype) -> E.Expr:
    """`arg` converted to the common type as eager does (numbers range-checked), then widened
    to the computation type."""
    if isinstance(arg, ScalarArg):
        value = checked(ctx, arg, common)
    else:
        value = convert(ctx.load(arg), common)
    return E.cast(compute_type(common), value)


def _register_comparison(kind: str, op: str) -> None:
    @pointwise(kind, Promotion.ALWAYS_BOOL, overloads=("Tensor", "Scalar"))
    def lower(ctx: Ctx, a: E.Expr, b: E.Expr) -> E.Expr:
        return E.Cmp(op, a, b)


for _kind, _op in _COMPARISONS.items():
    _register_comparison(_kind, _op)


@pointwise("aten::isnan", Promotion.ALWAYS_BOOL, operands=(0,), overloads=("",))
def isnan(ctx: Ctx, x: E.Expr) -> E.Expr:
    return E.Cmp("!=", x, x)


@pointwise("aten::logical_not", Promotion.ALWAYS_BOOL, operands=(0,), overloads=("",))
def logical_not(ctx: Ctx, x: E.Expr) -> E.Expr:
    return E.cmp("==", x, E.as_expr(0, x.dtype))


@register("aten::where", overloads=("self", "ScalarSelf", "ScalarOther", "Scalar"))
def where(ctx: Ctx) -> E.Expr:
    cond = ctx.args[0]
    if not isinstance(cond, TensorArg):
        raise LoweringError("where's condition is not a tensor")
    ctx.promote_to_output(ctx.args[1:3], Promotion.DEFAULT)
    common = ctx.out_dtype
    on_true, on_false = (_operand(ctx, a, common) for a in ctx.args[1:3])
    # A uint8 condition (deprecated, still accepted) selects where nonzero.
    return E.cast(ctx.out_dtype, E.Select(ctx.load(cond, BOOL), on_true, on_false))


@register("aten::masked_fill", overloads=("Scalar", "Tensor"))
def masked_fill(ctx: Ctx) -> E.Expr:
    x, mask, value = ctx.args[:3]
    if not isinstance(x, TensorArg) or x.dtype != ctx.out_dtype:
        raise LoweringError("masked_fill keeps the type of its input")
    if not isinstance(mask, TensorArg) or not mask.dtype.is_bool:
        raise LoweringError("masked_fill needs a bool mask")
    if isinstance(value, TensorArg) and value.shape != ():
        raise LoweringError("masked_fill needs a 0-dim value tensor")
    # The value is converted as a number (a tensor through .item()), with the range check.
    return E.Select(ctx.load(mask), checked(ctx, value, x.dtype), ctx.load(x))


_MINMAX = {
    "aten::maximum": E.Max,
    "aten::max": E.Max,
    "aten::minimum": E.Min,
    "aten::min": E.Min,
}


def _register_minmax(kind: str, op: type[E.BinaryOp]) -> None:
    # max/min: only the binary forms ("other"); maximum/minimum have no overload name.
    overloads = ("other",) if kind in ("aten::max", "aten::min") else ("",)

    @pointwise(kind, overloads=overloads)
    def lower(ctx: Ctx, a: E.Expr, b: E.Expr) -> E.Expr:
        return op(a, b)


for _kind, _fn in _MINMAX.items():
    _register_minmax(_kind, _fn)


def _clamp(ctx: Ctx, low: int | None, high: int | None) -> E.Expr:
    """`min(max(x, low), high)` over the operands at those positions (None: no bound).

    Eager's CPU kernels propagate NaN from the input and from any bound
    (vec::maximum/minimum, and a NaN-filled result for NaN number bounds),
    which `Max` and `Min` do. Number bounds are range-checked as eager does.
    """
    bounds = [k for k in (low, high) if k is not None and not ctx.is_none(k)]
    if not bounds:
        raise LoweringError("clamp without bounds")
    ctx.promote_to_output([ctx.args[0], *(ctx.args[k] for k in bounds)], Promotion.DEFAULT)
    common = ctx.out_dtype
    value = _operand(ctx, ctx.args[0], common)
    for k in bounds:
        bound = _operand(ctx, ctx.args[k], common)
        value = E.Max(value, bound) if k == low else E.Min(value, bound)
    return E.cast(ctx.out_dtype, value)


@register(("aten::clamp", "aten::clip"), overloads=("", "Tensor"))
def clamp(ctx: Ctx) -> E.Expr:
    return _clamp(ctx, 1, 2)


@register("aten::clamp_min", overloads=("", "Tensor"))
def clamp_min(ctx: Ctx) -> E.Expr:
    return _clamp(ctx, 1, None)


@register("aten::clamp_max", overloads=("", "Tensor"))
def clamp_max(ctx: Ctx) -> E.Expr:
    return _clamp(ctx, None, 1)
