"""Comparisons and selection: eq, ne, lt, le, gt, ge, isnan, logical_not, where, masked_fill,
maximum, minimum, max/min (binary), clamp, clamp_min, clamp_max.

Eager converts every operand to the promoted ("common") type before it
compares, so a float16 tensor is compared with a number rounded to float16,
not with the number itself: `_operands` does that conversion before the
values are widened to the computation type. Operands that are numbers are
converted with eager's range check (`casts.checked`) where eager has one:
the value of `where`, `masked_fill` and the bounds of `clamp`.

Selecting and min/max commute with rounding (rounding is monotonic), so
those compute in float32 for float16/bfloat16 and round only the result.
"""

from __future__ import annotations

from collections.abc import Sequence

from .. import expr as E
from ..dtype import BOOL, Dtype
from . import Arg, Ctx, LoweringError, Promotion, ScalarArg, TensorArg, compute_type, register
from .casts import checked, convert

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


def _promote(ctx: Ctx, args: Sequence[Arg], check_result: bool = True) -> Dtype:
    """The type eager promotes `args` to; with `check_result`, also the output type."""
    for a in args:
        if not isinstance(a, (TensorArg, ScalarArg)):
            raise LoweringError("operand is neither a tensor nor a number")
    _, common = ctx.promote(args, Promotion.DEFAULT)
    if check_result and common != ctx.out_dtype:
        raise LoweringError(f"promotion gives {common}, eager gave {ctx.out_dtype}")
    return common


def _operand(ctx: Ctx, arg: Arg, common: Dtype, check_numbers: bool) -> E.Expr:
    """`arg` converted to the common type as eager does, then widened to the computation type."""
    if check_numbers and isinstance(arg, ScalarArg):
        value = checked(ctx, arg, common)
    else:
        value = convert(ctx.load(arg), common)
    return E.cast(compute_type(common), value)


def _register_comparison(kind: str, op: str) -> None:
    @register(kind, overloads=("Tensor", "Scalar"))
    def lower(ctx: Ctx) -> E.Expr:
        args = ctx.args[:2]
        common = _promote(ctx, args, check_result=False)
        a, b = (_operand(ctx, arg, common, check_numbers=False) for arg in args)
        return E.cast(ctx.out_dtype, E.Cmp(op, a, b))


for _kind, _op in _COMPARISONS.items():
    _register_comparison(_kind, _op)


def _unary(ctx: Ctx) -> E.Expr:
    """The tensor operand, in its computation type."""
    x = ctx.args[0]
    if not isinstance(x, TensorArg):
        raise LoweringError("operand is not a tensor")
    return ctx.load(x, compute_type(x.dtype))


@register("aten::isnan", overloads=("",))
def isnan(ctx: Ctx) -> E.Expr:
    x = _unary(ctx)
    return E.cast(ctx.out_dtype, E.Cmp("!=", x, x))


@register("aten::logical_not", overloads=("",))
def logical_not(ctx: Ctx) -> E.Expr:
    x = _unary(ctx)
    return E.cast(ctx.out_dtype, E.cmp("==", x, E.as_expr(0, x.dtype)))


@register("aten::where", overloads=("self", "ScalarSelf", "ScalarOther", "Scalar"))
def where(ctx: Ctx) -> E.Expr:
    cond = ctx.args[0]
    if not isinstance(cond, TensorArg):
        raise LoweringError("where's condition is not a tensor")
    common = _promote(ctx, ctx.args[1:3])
    on_true, on_false = (_operand(ctx, a, common, check_numbers=True) for a in ctx.args[1:3])
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
    @register(kind, overloads=("other",) if kind in ("aten::max", "aten::min") else ("",))
    def lower(ctx: Ctx) -> E.Expr:
        args = ctx.args[:2]
        common = _promote(ctx, args)
        a, b = (_operand(ctx, arg, common, check_numbers=False) for arg in args)
        return E.cast(ctx.out_dtype, op(a, b))


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
    common = _promote(ctx, [ctx.args[0], *(ctx.args[k] for k in bounds)])
    value = _operand(ctx, ctx.args[0], common, check_numbers=True)
    for k in bounds:
        bound = _operand(ctx, ctx.args[k], common, check_numbers=True)
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
