"""Bitwise ops: and, or, xor, not, shifts, on integers and bool.

Scripted code spells `&`, `|`, `^`, `<<`, `>>` as `__and__`, `__or__`,
`__xor__`, `__lshift__`, `__rshift__`; they are the same ops. Number
operands are converted to the promoted type with wrap-around, as eager does
(`x << 257` on int8 shifts by 1).
"""

from __future__ import annotations

from .. import expr as E
from .registry import Ctx, LoweringError, pointwise

# Overload names: `bitwise_and.Scalar` but `bitwise_left_shift.Tensor_Scalar`, `__lshift__.Scalar`.
_BINARY_OVERLOADS = ("Tensor", "Scalar", "Scalar_Tensor")
_SHIFT_OVERLOADS = (*_BINARY_OVERLOADS, "Tensor_Scalar")

_LOGICAL = {"and": E.And, "or": E.Or, "xor": E.Xor}


def _require_integral(x: E.Expr, what: str) -> None:
    if x.dtype.is_float:
        raise LoweringError(f"{what} of floating-point values")


def _register_logical(name: str, op: type[E.BinaryOp]) -> None:
    @pointwise((f"aten::bitwise_{name}", f"aten::__{name}__"), overloads=_BINARY_OVERLOADS)
    def lower(ctx: Ctx, a: E.Expr, b: E.Expr) -> E.Expr:
        _require_integral(a, f"bitwise_{name}")
        return op(a, b)


for _name, _op in _LOGICAL.items():
    _register_logical(_name, _op)


@pointwise("aten::bitwise_not", operands=(0,), overloads=("",))
def bitwise_not(ctx: Ctx, a: E.Expr) -> E.Expr:
    _require_integral(a, "bitwise_not")
    return E.Xor(a, E.as_expr(True if a.dtype.is_bool else -1, a.dtype))


def _shift_in_range(a: E.Expr, b: E.Expr) -> E.Expr:
    """Whether shift amount `b` is in [0, bits of `a`): what C (and the IR) define."""
    if a.dtype.is_bool:
        raise LoweringError("shift of bool values")
    _require_integral(a, "shift")
    below = E.cmp("<", b, a.dtype.bits)
    if not b.dtype.is_signed:
        return below
    return E.And(E.cmp(">=", b, 0), below)


# ATen's lshift/rshift kernels: a shift by a negative amount or by at least the
# width gives 0 to the left, and fills with the sign bit to the right.
@pointwise(("aten::bitwise_left_shift", "aten::__lshift__"), overloads=_SHIFT_OVERLOADS)
def left_shift(ctx: Ctx, a: E.Expr, b: E.Expr) -> E.Expr:
    ok = _shift_in_range(a, b)
    return E.select(ok, E.Shl(a, E.select(ok, b, 0)), 0)


@pointwise(("aten::bitwise_right_shift", "aten::__rshift__"), overloads=_SHIFT_OVERLOADS)
def right_shift(ctx: Ctx, a: E.Expr, b: E.Expr) -> E.Expr:
    ok = _shift_in_range(a, b)
    if a.dtype.is_signed:
        return E.Shr(a, E.select(ok, b, a.dtype.bits - 1))
    return E.select(ok, E.Shr(a, E.select(ok, b, 0)), 0)

