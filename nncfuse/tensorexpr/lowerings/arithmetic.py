"""Arithmetic: add, sub, rsub, mul, div (every rounding mode), true_divide, floor_divide,
neg, reciprocal, square, pow, atan2, hypot, fmod, remainder, lerp, addcmul.

Each op computes what ATen's CPU kernel computes (`BinaryOpsKernel.cpp`,
`PowKernel.cpp`, `LerpKernel.cpp`, `PointwiseOpsKernel.cpp`), step by step
where the steps round:

- multiply-adds are fused (`fma`): `add`/`sub` with `alpha` call
  `vec::fmadd`, and the compiler contracts `a + b * c` in the others; but
  eager's default kernels (ATen capability `default`) have no FMA and round
  twice, and so do we there (`_multiply_add`);
- float16/bfloat16 compute in float32 (`Ctx.operands`), but the kernels of
  `div` with a rounding mode, of `pow` by 3 and -2, and the scalar loop of
  `add` with `alpha` compute in the narrow type, so there each step rounds
  to it (`_rounding`);
- float remainders call the `fmod` intrinsic, SLEEF's as in eager's vector
  loops (not `Mod`, C's);
- integer division by zero raises before the kernel runs, and MIN / -1,
  which would trap, wraps (eager's floor division does the same);
- numbers such as `alpha` are converted as `Scalar::to<T>()`, which raises
  where a value does not fit (`casts.checked`): such nodes run unfused.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from .. import capability
from .. import expr as E
from ..dtype import FLOAT64, INT32, INT64, Dtype
from ..ir_eval import evaluate
from .casts import checked
from .registry import (
    Arg,
    Ctx,
    LoweringError,
    Promotion,
    ScalarArg,
    pointwise,
    register,
    schema_overload,
)

Rounding = Callable[[E.Expr], E.Expr]


def _multiply_add(a: E.Expr, b: E.Expr, c: E.Expr) -> E.Expr:
    """`a * b + c` as eager's kernels compute it: rounded once where they have FMA."""
    return E.call("fma", a, b, c) if capability.fuses_multiply_adds() else a * b + c


def _rounding(ctx: Ctx, compute: Dtype, opmath: bool = False) -> Rounding:
    """Rounds an intermediate to the output type where ATen computes in it step by step."""
    narrow = ctx.out_dtype
    if opmath or narrow == compute:
        return lambda e: e
    return lambda e: E.cast(compute, E.cast(narrow, e))


def _number(ctx: Ctx, k: int, dtype: Dtype) -> E.Expr | None:
    """Number operand `k` (alpha, value, weight) as `Scalar::to<dtype>()` gives it; None if 1."""
    arg = ctx.arg(k)
    if arg is None or (isinstance(arg, ScalarArg) and arg.const == 1):
        return None
    if not dtype.is_float and isinstance(arg, ScalarArg) and arg.dtype.is_float:
        raise LoweringError("a float number with integer tensors: eager raises")
    return checked(ctx, arg, dtype)


def _is_constant(arg: Arg) -> bool:
    return isinstance(arg, ScalarArg) and arg.const is not None


def _opmath_scalar(ctx: Ctx, compute: Dtype) -> bool:
    """Whether ATen's mul/div kernels read the second operand at float32 precision."""
    return ctx.out_dtype != compute and ctx.args[1].numel == 1


# -- add, sub, rsub, mul ------------------------------------------------------

# aten op -> (operands swapped, sign of alpha): rsub(a, b) is b - alpha * a.
_ADD_LIKE = {"aten::add": (False, 1), "aten::sub": (False, -1), "aten::rsub": (True, -1)}


@register(tuple(_ADD_LIKE), overloads=("Tensor", "Scalar"))
def add(ctx: Ctx) -> E.Expr:
    """`a + sign * alpha * b`.

    For floats ATen calls `vec::fmadd(b, alpha, a)`, and the compiler fuses
    the scalar loop's `a + alpha * b` as well. For float16 and bfloat16 the
    two differ: the vector loop fuses in float32, the scalar loop's
    c10::Half arithmetic rounds after each step. The vector loop takes 64 of
    those at a time (AVX-512; 32 with AVX2), so small tensors and all tails
    take the scalar loop, which we follow.
    """
    swapped, sign = _ADD_LIKE[ctx.node.kind()]
    (a, b), compute = ctx.operands(ctx.args[:2], Promotion.DEFAULT)
    if swapped:
        a, b = b, a
    alpha = _number(ctx, 2, ctx.out_dtype)
    if compute.is_bool:
        if sign < 0:
            raise LoweringError("subtraction of bool tensors: eager raises")
        return E.Or(a, b if alpha is None else E.And(b, alpha))
    if alpha is None:
        return E.cast(ctx.out_dtype, a + b if sign > 0 else a - b)
    alpha = E.cast(compute, alpha)
    if sign < 0:
        alpha = -alpha
    if compute.is_float and compute == ctx.out_dtype:
        return _multiply_add(b, alpha, a)
    return E.cast(ctx.out_dtype, a + _rounding(ctx, compute)(b * alpha))


@pointwise("aten::mul", overloads=("Tensor", "Scalar"), scalar_opmath=True)
def mul(ctx: Ctx, a: E.Expr, b: E.Expr) -> E.Expr:
    if a.dtype.is_bool:
        return E.And(a, b)
    if a.dtype.is_float:
        for x, mask in ((a, b), (b, a)):
            if isinstance(mask, E.Cast) and mask.value.dtype.is_bool:
                return _masked(x, mask)
    return a * b


#: float type -> (its bits as an integer, the sign bit, the exponent's bits)
_FLOAT_BITS = {32: (INT32, -(1 << 31), 0x7F800000), 64: (INT64, -(1 << 63), 0x7FF << 52)}


def _masked(x: E.Expr, mask: E.Cast) -> E.Expr:
    """`x * mask` of a float `x` and a bool `mask` cast to its type (autodiff's formulas:
    hardtanh's, ReLU's gradient) without the multiply: `x` where `mask`, else the product by
    0, from `x`'s bits (0 of its sign, NaN for an infinity or NaN). The same values; a
    multiply whose operand is subnormal, as deep layers' gradients can be, takes ~6x as long
    on x86, and so does LLVM's folding of the float form of this back into one."""
    if x.dtype.bits not in _FLOAT_BITS:
        return x * mask
    int_type, sign, exponent = _FLOAT_BITS[x.dtype.bits]
    bits = E.Bitcast(int_type.with_lanes(x.dtype.lanes), x)
    finite = E.cmp("!=", E.And(bits, E.imm(exponent, bits.dtype)), E.imm(exponent, bits.dtype))
    zero = E.Bitcast(x.dtype, E.And(bits, E.imm(sign, bits.dtype)))
    return E.select(mask.value, x, E.select(finite, zero, E.imm(math.nan, x.dtype)))


# -- division -----------------------------------------------------------------


def _require_nonzero(ctx: Ctx, divisor: Arg, dtype: Dtype) -> None:
    """Eager raises on a zero integer divisor, checking it after conversion to `dtype`."""
    if _is_constant(divisor):
        if E.Imm.make(divisor.const, dtype).value == 0:  # type: ignore[attr-defined]
            raise LoweringError("integer division by zero: eager raises")
        return
    if divisor.dtype.bits > dtype.bits:
        raise LoweringError("the divisor may become zero in a narrower type")
    ctx.require_nonzero(divisor)


def _quotient(a: E.Expr, b: E.Expr) -> E.Expr:
    """C's truncating `a / b`, with MIN / -1 wrapping to MIN instead of trapping."""
    if not a.dtype.is_signed:
        return a / b
    by_minus_one = E.cmp("==", b, -1)
    return E.select(by_minus_one, -a, a / E.select(by_minus_one, 1, b))


def _remainder(a: E.Expr, b: E.Expr) -> E.Expr:
    """C's `a % b` (the sign of `a`); `x % -1` is 0, where MIN % -1 would trap."""
    if not a.dtype.is_signed:
        return E.Mod(a, b)
    return E.Mod(a, E.select(E.cmp("==", b, -1), 1, b))


def _signs_differ(a: E.Expr, b: E.Expr) -> E.Expr:
    return E.Cmp("!=", E.cmp("<", a, 0), E.cmp("<", b, 0))


def _floor_div_int(a: E.Expr, b: E.Expr) -> E.Expr:
    """c10::div_floor_integer: one less than the quotient if inexact and of differing signs."""
    q = _quotient(a, b)
    if not a.dtype.is_signed:
        return q
    inexact = E.cmp("!=", _remainder(a, b), 0)
    return E.select(E.And(inexact, _signs_differ(a, b)), q - 1, q)


def _floor_div_float(a: E.Expr, b: E.Expr, rnd: Rounding) -> E.Expr:
    """ATen's `div_floor_floating_vec`: Python's `a // b` from fmod, rounding each step.

    Like ATen, `a` stands in for `a - mod` where the quotient overflows (SLEEF's
    fmod is NaN there) and `a` is finite.
    """
    mod = E.call("fmod", a, b)
    quotient = rnd(a / b)
    inf = E.as_expr(math.inf, a.dtype)
    overflows = E.And(E.cmp("==", E.call("abs", quotient), inf), E.cmp("!=", E.call("abs", a), inf))
    div = rnd(E.select(overflows, a, rnd(a - mod)) / b)
    div = E.select(E.And(E.cmp("!=", mod, 0), _signs_differ(b, mod)), rnd(div - 1), div)
    floor = E.call("floor", div)
    floor = E.select(E.cmp(">", div - floor, 0.5), rnd(floor + 1), floor)
    signed_zero = E.call("copysign", E.as_expr(0.0, a.dtype), quotient)
    floor = E.select(E.cmp("==", div, 0), signed_zero, floor)
    return E.select(E.cmp("==", b, 0), quotient, floor)


def _divide(ctx: Ctx, mode: str | None) -> E.Expr:
    """`div` with rounding mode None, "trunc" or "floor"."""
    args = ctx.args[:2]
    if mode is None:
        (a, b), _ = ctx.operands(args, Promotion.INT_TO_FLOAT, scalar_opmath=True)
        return E.cast(ctx.out_dtype, a / b)
    if mode not in ("trunc", "floor"):
        raise LoweringError(f"unknown rounding mode {mode!r}")
    (a, b), compute = ctx.operands(args, Promotion.DEFAULT, scalar_opmath=True)
    if compute.is_bool:
        raise LoweringError("rounding division of bool tensors: eager raises")
    if not compute.is_float:
        _require_nonzero(ctx, args[1], compute)
        return _quotient(a, b) if mode == "trunc" else _floor_div_int(a, b)
    rnd = _rounding(ctx, compute, _opmath_scalar(ctx, compute))
    if mode == "trunc":
        return E.cast(ctx.out_dtype, E.call("trunc", rnd(a / b)))
    return E.cast(ctx.out_dtype, _floor_div_float(a, b, rnd))


@register("aten::div", overloads=("Tensor", "Scalar", "Tensor_mode", "Scalar_mode"))
def div(ctx: Ctx) -> E.Expr:
    return _divide(ctx, ctx.const(2))


@register("aten::true_divide", overloads=("Tensor", "Scalar"))
def true_divide(ctx: Ctx) -> E.Expr:
    return _divide(ctx, None)


@register("aten::floor_divide", overloads=("", "Scalar"))
def floor_divide(ctx: Ctx) -> E.Expr:
    return _divide(ctx, "floor")


def _remainder_operands(ctx: Ctx) -> tuple[E.Expr, E.Expr, Dtype]:
    """The operands of fmod and remainder; integers get eager's zero-divisor check."""
    (a, b), compute = ctx.operands(ctx.args[:2], Promotion.DEFAULT)
    if compute.is_bool:
        raise LoweringError(f"{ctx.node.kind()} of bool tensors: eager raises")
    if not compute.is_float:
        _require_nonzero(ctx, ctx.args[1], compute)
    return a, b, compute


@register("aten::fmod", overloads=("Tensor", "Scalar"))
def fmod(ctx: Ctx) -> E.Expr:
    """C's remainder, with the sign of the dividend."""
    a, b, compute = _remainder_operands(ctx)
    value = E.call("fmod", a, b) if compute.is_float else _remainder(a, b)
    return E.cast(ctx.out_dtype, value)


@register("aten::remainder", overloads=("Tensor", "Scalar", "Scalar_Tensor"))
def remainder(ctx: Ctx) -> E.Expr:
    """Python's remainder, with the sign of the divisor: C's, plus `b` where the signs differ."""
    a, b, compute = _remainder_operands(ctx)
    mod = E.call("fmod", a, b) if compute.is_float else _remainder(a, b)
    wrong_sign = E.And(E.cmp("!=", mod, 0), _signs_differ(mod, b))
    return E.cast(ctx.out_dtype, E.select(wrong_sign, mod + b, mod))


# -- unary ------------------------------------------------------------------------


@pointwise("aten::neg", operands=(0,), overloads=("",))
def neg(ctx: Ctx, a: E.Expr) -> E.Expr:
    if a.dtype.is_bool:
        raise LoweringError("negation of a bool tensor: eager raises")
    return -a


@pointwise("aten::reciprocal", Promotion.INT_TO_FLOAT, operands=(0,), overloads=("",))
def reciprocal(ctx: Ctx, a: E.Expr) -> E.Expr:
    return 1.0 / a


@pointwise("aten::atan2", Promotion.INT_TO_FLOAT, overloads=("",))
def atan2(ctx: Ctx, a: E.Expr, b: E.Expr) -> E.Expr:
    return E.call("atan2", a, b)


@pointwise("aten::hypot", overloads=("",))
def hypot(ctx: Ctx, a: E.Expr, b: E.Expr) -> E.Expr:
    """SLEEF's 0.5-ulp hypot in vector loops, libm's in their tails, as eager's kernel."""
    if not a.dtype.is_float:
        raise LoweringError("hypot of integer tensors: eager raises")
    return E.call("hypot", a, b)


# -- lerp, addcmul ------------------------------------------------------------------


@register("aten::lerp", overloads=("Scalar", "Tensor"))
def lerp(ctx: Ctx) -> E.Expr:
    """ATen's `lerp_vec`: from the nearer end, `fma(w, end - start, start)` if |w| < 0.5,
    else `fma(w - 1, end - start, end)`."""
    weight_is_tensor = schema_overload(ctx.node) == "Tensor"
    values, compute = ctx.operands(ctx.args[: 3 if weight_is_tensor else 2], Promotion.DEFAULT)
    if not compute.is_float:
        raise LoweringError("lerp of integer tensors: eager raises")
    start, end = values[:2]
    weight = values[2] if weight_is_tensor else checked(ctx, ctx.args[2], compute)
    diff = end - start
    if _is_constant(ctx.args[2]):  # choose the branch now
        w = E.as_expr(float(evaluate(weight)), compute)
        if abs(w.value) < 0.5:  # type: ignore[attr-defined]
            return E.cast(ctx.out_dtype, _multiply_add(w, diff, start))
        return E.cast(ctx.out_dtype, _multiply_add(w - 1.0, diff, end))
    small = E.cmp("<", E.call("abs", weight), 0.5)
    coeff = E.select(small, weight, weight - 1.0)
    return E.cast(ctx.out_dtype, _multiply_add(coeff, diff, E.select(small, start, end)))


@register("aten::addcmul", overloads=("",))
def addcmul(ctx: Ctx) -> E.Expr:
    """`self + value * t1 * t2`, the last product fused with the sum."""
    (s, t1, t2), compute = ctx.operands(ctx.args[:3], Promotion.DEFAULT)
    if compute.is_bool:
        raise LoweringError("addcmul of bool tensors: eager raises")
    value = _number(ctx, 3, compute)
    if value is not None:
        t1 = value * t1
    if compute.is_float:
        return E.cast(ctx.out_dtype, _multiply_add(t1, t2, s))
    return E.cast(ctx.out_dtype, s + t1 * t2)


# -- pow --------------------------------------------------------------------------

#: pow(x, e) for a number e, special-cased as ATen does, in its order:
#: (e, compared after conversion to the tensor's type, also for float16, value).
#: 0 and 1 fill and copy for every type; float32, float64 and bfloat16 then
#: call sqrt, rsqrt and reciprocal for 0.5, -0.5 and -1, and multiply for 2,
#: 3 and -2 (bfloat16 after rounding e to bfloat16, and step by step).
_POW_CASES: list[tuple[float, bool, bool, Callable[[E.Expr, Rounding], E.Expr]]] = [
    (0.0, False, True, lambda x, rnd: E.as_expr(1.0, x.dtype)),
    (1.0, False, True, lambda x, rnd: x),
    (0.5, False, False, lambda x, rnd: E.call("sqrt", x)),
    (-0.5, False, False, lambda x, rnd: 1.0 / E.call("sqrt", x)),
    (-1.0, False, False, lambda x, rnd: 1.0 / x),
    (2.0, True, False, lambda x, rnd: x * x),
    (3.0, True, False, lambda x, rnd: rnd(x * x) * x),
    (-2.0, True, False, lambda x, rnd: 1.0 / rnd(x * x)),
]


def _pow_integer(ctx: Ctx, x: E.Expr, exponent: Arg, compute: Dtype) -> E.Expr:
    """Integer (or bool) tensor to a number's power."""
    if not _is_constant(exponent):
        raise LoweringError("an integer power only known at run time")
    e = exponent.const  # type: ignore[attr-defined]
    if e in (0, 1):
        return _POW_CASES[int(e)][3](x, lambda v: v)
    if compute.is_bool or e < 0:
        raise LoweringError("bool tensors, negative integer powers: eager raises")
    return E.call("powi", x, checked(ctx, exponent, compute))


def _pow_number(ctx: Ctx, x: E.Expr, exponent: Arg, compute: Dtype) -> E.Expr:
    """`x ** e` for a number `e` (pow_tensor_scalar_kernel); `x` is in the computation type."""
    if not compute.is_float:
        return _pow_integer(ctx, x, exponent, compute)
    narrow = ctx.out_dtype
    e = E.cast(FLOAT64, ctx.load(exponent))
    converted = E.cast(compute, checked(ctx, exponent, narrow)) if narrow != compute else e
    cases = [
        (converted if after_conversion else e, value, fn)
        for value, after_conversion, half_too, fn in _POW_CASES
        if half_too or narrow.name != "float16"
    ]
    rnd = _rounding(ctx, compute)
    result = E.call("pow", x, E.cast(compute, converted))
    if _is_constant(exponent):
        return next((fn(x, rnd) for v, value, fn in cases if evaluate(v) == value), result)
    for v, value, fn in reversed(cases):
        result = E.select(E.cmp("==", v, value), fn(x, rnd), result)
    return result


@register("aten::pow", overloads=("Tensor_Scalar", "Tensor_Tensor", "Scalar"))
def pow_(ctx: Ctx) -> E.Expr:
    """Tensor to a number's power, or elementwise powers (number or tensor base)."""
    (a, b), compute = ctx.operands(ctx.args[:2], Promotion.DEFAULT)
    if schema_overload(ctx.node) == "Tensor_Scalar":
        return E.cast(ctx.out_dtype, _pow_number(ctx, a, ctx.args[1], compute))
    if compute.is_bool:
        raise LoweringError("pow of bool tensors: eager raises")
    value = E.call("pow" if compute.is_float else "powi", a, b)
    return E.cast(ctx.out_dtype, value)


@register("aten::square", overloads=("",))
def square(ctx: Ctx) -> E.Expr:
    """pow(x, 2), typed as such: the square of a bool tensor is int64."""
    two = ScalarArg(E.imm(2, INT64), 2)
    (x, _), compute = ctx.operands([ctx.args[0], two], Promotion.DEFAULT)
    return E.cast(ctx.out_dtype, _pow_number(ctx, x, two, compute))
