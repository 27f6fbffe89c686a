"""One row per operator: what each binary op, comparison and intrinsic means everywhere.

A row (`Op`) holds every fact about an operator that more than one consumer
needs: how `ir_printer` spells it, what the node constructors accept, how
`ir_eval` computes it (numpy), which LLVM instruction or emitter
`llvm_codegen` uses, and whether `simplify` may fold it. Adding an operator
is adding a row (and, for a new node class, the class in `expr.py`).

The table sits just above `dtype`, below the node classes, so that `expr`
can check arity and operand types from it; it therefore names the nodes by
string (`BINARY["Add"]` is `expr.Add`'s row) and imports nothing but numpy
and torch. The LLVM column is a description, not code: instruction names
(LLVM's LangRef spelling) per kind of operand, or the name of an emitter
that `llvm_codegen` defines, so the IR does not depend on llvmlite; a test
checks that codegen knows every name used here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np
import torch

from .dtype import Dtype

#: `Op.precedence` of an operator printed in function-call form, `max(a, b)`.
CALL = 10


@dataclass(frozen=True)
class Emit:
    """How LLVM computes an op, for float, signed and unsigned (and bool) operands.

    Each entry is an LLVM instruction (`fadd`, `sdiv`, `lshr`), a comparison
    predicate (`olt`, `une`, `ult`), or an emitter of `llvm_codegen`:
    `math` (a math function chosen by name: LLVM intrinsic, SLEEF or libm,
    see `vecmath`), `max_nan`/`min_nan` (NaN-propagating selects), `smax`,
    `umax`, `smin`, `umin` (selects), `powi`, `iabs`, `identity`. None: the
    op does not take such operands.
    """

    float: str | None
    signed: str | None = None
    unsigned: str | None = None

    def pick(self, dtype: Dtype) -> str | None:
        if dtype.is_float:
            return self.float
        return self.signed if dtype.is_signed else self.unsigned


@dataclass(frozen=True)
class Op:
    """An operator's facts; see the module docstring.

    `types` is the typing rule: `any` (operands share one dtype, which the
    result has; bool for comparisons), `number` (as `any`, but not bool:
    the interpreter rejects bool arithmetic), `float` or `int` (intrinsics
    of float or integer operands only). `interp_int`, where given, computes
    integer and bool operands instead of `interp`. `cheap`: a few instructions,
    so recomputing it is cheaper than keeping it in a temporary (`inline`).
    `identity`, for the ops a `Reduce` may combine with: the value of a scalar
    dtype that leaves every operand unchanged (`x + -0.` is `x`, also for -0.),
    which starts partial accumulators (vector lanes, cascade blocks).
    """

    name: str
    symbol: str
    precedence: int
    arity: int
    types: str
    interp: Callable[..., Any]
    llvm: Emit
    fold: bool
    interp_int: Callable[..., Any] | None = None
    cheap: bool = True
    identity: Callable[[Dtype], Any] | None = None

    @property
    def infix(self) -> bool:
        return self.precedence < CALL

    def accepts(self, dtype: Dtype) -> bool:
        """Whether operands of `dtype` follow the typing rule."""
        if self.types == "float":
            return dtype.is_float
        if self.types == "int":
            return dtype.is_int
        return not (self.types == "number" and dtype.is_bool)


# -- interpreter functions that numpy lacks -----------------------------------------


def _trunc_div(a: Any, b: Any) -> Any:
    """C's integer `a / b`, truncating toward zero (0 for a zero divisor, never reached)."""
    safe_b = np.where(b == 0, 1, b)
    q = a // safe_b
    fix = (a % safe_b != 0) & ((a < 0) != (safe_b < 0))
    out = (q + fix.astype(q.dtype)).astype(np.asarray(a).dtype)
    return out if np.ndim(out) else out[()]


def _max(a: Any, b: Any) -> Any:
    out = np.where(a < b, b, a)
    if np.issubdtype(out.dtype, np.floating):
        out = np.where(np.isnan(b), b, out)
    return out


def _min(a: Any, b: Any) -> Any:
    out = np.where(b < a, b, a)
    if np.issubdtype(out.dtype, np.floating):
        out = np.where(np.isnan(b), b, out)
    return out


def _powi(a: Any, b: Any) -> Any:
    """Integer `a ** b` by squaring, wrapping around; `b < 0` as ATen's powi (`CALLS`)."""
    a, b = np.asarray(a), np.asarray(b)
    result, base = np.ones_like(a), a
    for bit in range(8 * a.dtype.itemsize):
        result = np.where((b >> bit) & 1 != 0, result * base, result)
        base = base * base
    if np.issubdtype(a.dtype, np.signedinteger):
        at_minus_one = np.where(b & 1 != 0, -1, 1)
        small = np.where(a == 1, 1, np.where(a == -1, at_minus_one, 0))
        result = np.where(b < 0, small, result)
    return result.astype(a.dtype)


def _fma(a: Any, b: Any, c: Any) -> Any:
    """`a * b + c` rounded once, as the fma instruction; numpy has none, so in exact rationals."""
    a, b, c = np.broadcast_arrays(np.asarray(a), np.asarray(b), np.asarray(c))
    out = np.empty(a.shape, a.dtype)
    for k in np.ndindex(a.shape):
        out[k] = _fma_scalar(a[k], b[k], c[k])
    return out


def _fma_scalar(a: Any, b: Any, c: Any) -> Any:
    kind = a.dtype.type
    if not (np.isfinite(a) and np.isfinite(b)):
        return kind(a * b + c)  # an infinite or NaN product is exact
    if not np.isfinite(c):
        return c
    exact = Fraction(float(a)) * Fraction(float(b)) + Fraction(float(c))
    if exact == 0:  # the sign of a zero sum follows IEEE addition
        return kind(float(a) * float(b) + float(c))
    try:
        r = kind(float(exact))  # float() of a Fraction rounds correctly to float64
    except OverflowError:
        return kind(np.inf if exact > 0 else -np.inf)
    if not np.isfinite(r) or Fraction(float(r)) == exact:
        return r
    # Rounding through float64 can round twice: take the nearer neighbour, ties to even.
    other = np.nextafter(r, kind(np.inf if exact > Fraction(float(r)) else -np.inf))
    if np.isfinite(other):
        beyond = Fraction(float(other))
    else:  # r is the largest finite value: rounding treats infinity as one ulp further out
        beyond = 2 * Fraction(float(r)) - Fraction(float(np.nextafter(r, kind(0))))
    near, far = abs(exact - Fraction(float(r))), abs(exact - beyond)
    if far < near or (far == near and int(other.view(f"u{other.itemsize}")) % 2 == 0):
        return other
    return r


def _torch_fn(name: str) -> Callable[..., Any]:
    fn = getattr(torch.special, name, None) or getattr(torch, name)

    def apply(*args: Any) -> Any:
        return fn(*(torch.from_numpy(np.asarray(a)) for a in args)).numpy()

    return apply


def _overflowing_early(fn: Callable[..., Any]) -> Callable[..., Any]:
    """sinh or cosh as SLEEF computes them: infinite once |x| > log(max float), where exp
    overflows, though the true value is finite up to log(2 max). Eager's vector loops
    (and so compiled kernels) use SLEEF; this keeps the interpreter their oracle."""

    def apply(x: Any) -> Any:
        x = np.asarray(x)
        y = fn(x)
        big = np.abs(x) > np.log(np.finfo(x.dtype).max)
        return np.where(big, np.copysign(np.inf, y), y)

    return apply


# -- the table ----------------------------------------------------------------------


def _binary(name: str, symbol: str, precedence: int, types: str, interp: Callable[..., Any],
            llvm: Emit, interp_int: Callable[..., Any] | None = None,
            identity: Callable[[Dtype], Any] | None = None) -> Op:
    return Op(name, symbol, precedence, 2, types, interp, llvm, True, interp_int,
              identity=identity)


def _lowest(dtype: Dtype) -> Any:
    if dtype.is_float:
        return -float("inf")
    if dtype.is_bool:
        return False
    return -(1 << (dtype.bits - 1)) if dtype.is_signed else 0


def _highest(dtype: Dtype) -> Any:
    if dtype.is_float:
        return float("inf")
    if dtype.is_bool:
        return True
    return (1 << (dtype.bits - 1 if dtype.is_signed else dtype.bits)) - 1


def _ones(dtype: Dtype) -> Any:
    return True if dtype.is_bool else -1 if dtype.is_signed and dtype.is_int else _highest(dtype)


#: Binary ops by node class name: `a + b` in C precedence, or `max(a, b)`.
BINARY: dict[str, Op] = {op.name: op for op in (
    _binary("Add", "+", 8, "number", np.add, Emit("fadd", "add", "add"),
            identity=lambda d: -0.0 if d.is_float else 0),
    _binary("Sub", "-", 8, "number", np.subtract, Emit("fsub", "sub", "sub")),
    _binary("Mul", "*", 9, "number", np.multiply, Emit("fmul", "mul", "mul"),
            identity=lambda d: 1.0 if d.is_float else 1),
    # Integer division truncates, and its remainder takes the sign of `a` (C's).
    _binary("Div", "/", 9, "any", np.divide, Emit("fdiv", "sdiv", "udiv"), _trunc_div),
    _binary("Mod", "%", 9, "any", np.fmod, Emit("frem", "srem", "urem")),
    # NaN if either operand is NaN (torch.maximum); max(-0., 0.) is its first operand.
    _binary("Max", "max", CALL, "any", _max, Emit("max_nan", "smax", "umax"),
            identity=_lowest),
    _binary("Min", "min", CALL, "any", _min, Emit("min_nan", "smin", "umin"),
            identity=_highest),
    # `b if a < b else a` alone: a NaN `b` is passed over (x86's maxps), a NaN `a` stays;
    # -inf leaves every `b` but NaN unchanged, so a reduction from it never holds a NaN.
    _binary("MaxOrdered", "max_ordered", CALL, "float", lambda a, b: np.where(a < b, b, a),
            Emit("max_ordered"), identity=_lowest),
    _binary("And", "&", 4, "any", np.bitwise_and, Emit(None, "and", "and"), identity=_ones),
    _binary("Or", "|", 2, "any", np.bitwise_or, Emit(None, "or", "or"),
            identity=lambda d: False if d.is_bool else 0),
    _binary("Xor", "^", 3, "any", np.bitwise_xor, Emit(None, "xor", "xor")),
    _binary("Shl", "<<", 7, "any", np.left_shift, Emit(None, "shl", "shl")),
    _binary("Shr", ">>", 7, "any", np.right_shift, Emit(None, "ashr", "lshr")),
)}


def _cmp(symbol: str, precedence: int, interp: Callable[..., Any], llvm: Emit) -> Op:
    return Op(symbol, symbol, precedence, 2, "any", interp, llvm, True)


#: Comparisons by symbol. Ordered for floats (NaN compares false), but `!=` (NaN is unequal).
CMP: dict[str, Op] = {op.name: op for op in (
    _cmp("==", 5, np.equal, Emit("oeq", "eq", "eq")),
    _cmp("!=", 5, np.not_equal, Emit("une", "ne", "ne")),
    _cmp("<", 6, np.less, Emit("olt", "slt", "ult")),
    _cmp("<=", 6, np.less_equal, Emit("ole", "sle", "ule")),
    _cmp(">", 6, np.greater, Emit("ogt", "sgt", "ugt")),
    _cmp(">=", 6, np.greater_equal, Emit("oge", "sge", "uge")),
)}

_MATH = Emit("math")


def _call(name: str, arity: int, interp: Callable[..., Any], llvm: Emit = _MATH,
          types: str = "float", cheap: bool = False) -> Op:
    return Op(name, name, CALL, arity, types, interp, llvm, False, cheap=cheap)


#: Intrinsic functions by name, applied lane by lane; all take and return one dtype.
#: Calls are never folded: their values come from the machine's math library.
CALLS: dict[str, Op] = {op.name: op for op in (
    _call("sin", 1, np.sin),
    _call("cos", 1, np.cos),
    _call("tan", 1, np.tan),
    _call("asin", 1, np.arcsin),
    _call("acos", 1, np.arccos),
    _call("atan", 1, np.arctan),
    _call("sinh", 1, _overflowing_early(np.sinh)),
    _call("cosh", 1, _overflowing_early(np.cosh)),
    _call("tanh", 1, np.tanh),
    _call("asinh", 1, np.arcsinh),
    _call("acosh", 1, np.arccosh),
    _call("atanh", 1, np.arctanh),
    _call("exp", 1, np.exp),
    # exp of an argument known to be <= 0 or NaN (`x - max` over x's row: softmax), so that
    # code may leave out exp's overflow handling; the same values as exp there.
    _call("exp_nonpos", 1, np.exp),
    _call("exp2", 1, np.exp2),
    _call("expm1", 1, np.expm1),
    _call("log", 1, np.log),
    _call("log2", 1, np.log2),
    _call("log10", 1, np.log10),
    _call("log1p", 1, np.log1p),
    _call("sqrt", 1, np.sqrt),
    # Integers wrap: abs(INT_MIN) == INT_MIN, as in C.
    _call("abs", 1, np.abs, Emit("math", "iabs", "identity"), types="number", cheap=True),
    _call("floor", 1, np.floor, cheap=True),
    _call("ceil", 1, np.ceil, cheap=True),
    _call("trunc", 1, np.trunc, cheap=True),
    _call("rint", 1, np.rint, cheap=True),
    _call("erf", 1, _torch_fn("erf")),
    _call("erfc", 1, _torch_fn("erfc")),
    _call("lgamma", 1, _torch_fn("lgamma")),
    # numpy's power takes a square root for an exponent of 0.5, so pow(-inf, 0.5) is NaN and
    # pow(-0.0, 0.5) is -0.0; C's pow (eager's, SLEEF's) gives inf and 0.0.
    _call("pow", 2, _torch_fn("pow")),
    _call("atan2", 2, np.arctan2),
    _call("hypot", 2, np.hypot),  # sqrt(a*a + b*b) without overflow; inf if either is inf
    _call("fmod", 2, np.fmod),
    _call("copysign", 2, np.copysign, cheap=True),
    _call("nextafter", 2, np.nextafter),
    # ATen's integer power: `a ** b` wrapping around, and for `b < 0` 1 if `a == 1`, +-1 if
    # `a == -1`, else 0. An intrinsic because squaring is a DAG, which trees cannot share.
    _call("powi", 2, _powi, Emit(None, "powi", "powi"), types="int"),
    # `a * b + c` rounded once (ATen's CPU kernels fuse multiply-adds).
    _call("fma", 3, _fma),
)}
