"""Expression nodes of the loop IR.

Every node is an immutable dataclass whose constructor checks its typing
invariants: operands of a binary op share one dtype, indices are `int64`,
lane counts agree. There are no implicit casts between expressions; type
promotion is decided when an aten op is lowered and written as `Cast`.
For convenience the arithmetic operators build nodes, and a Python number
next to an expression becomes an immediate of that expression's dtype.

Structural equality holds for all nodes but `Var` (and `Buf`, see
`buffer.py`), which are compared by identity: two loop variables that print
alike are still different variables.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import torch

from . import ops
from .dtype import BOOL, INDEX, Dtype

if TYPE_CHECKING:
    from .buffer import Buf

Number = int | float | bool

#: How `str()` prints expressions ("expr") and statements ("stmt"). The IR sits below its
#: printer, so `ir_printer` installs itself here when imported (the package imports it).
PRINTERS: dict[str, Callable[[Any], str]] = {"expr": repr, "stmt": repr}


class Expr:
    """Base class of expressions; subclasses define `dtype`."""

    dtype: Dtype

    # Arithmetic sugar for building trees; see module docstring.
    def __add__(self, other: ExprLike) -> Expr:
        return Add(self, as_expr(other, self.dtype))

    def __radd__(self, other: ExprLike) -> Expr:
        return Add(as_expr(other, self.dtype), self)

    def __sub__(self, other: ExprLike) -> Expr:
        return Sub(self, as_expr(other, self.dtype))

    def __rsub__(self, other: ExprLike) -> Expr:
        return Sub(as_expr(other, self.dtype), self)

    def __mul__(self, other: ExprLike) -> Expr:
        return Mul(self, as_expr(other, self.dtype))

    def __rmul__(self, other: ExprLike) -> Expr:
        return Mul(as_expr(other, self.dtype), self)

    def __truediv__(self, other: ExprLike) -> Expr:
        return Div(self, as_expr(other, self.dtype))

    def __rtruediv__(self, other: ExprLike) -> Expr:
        return Div(as_expr(other, self.dtype), self)

    def __mod__(self, other: ExprLike) -> Expr:
        return Mod(self, as_expr(other, self.dtype))

    def __neg__(self) -> Expr:
        # -0. - x negates every float exactly (0. - x would turn -0. into +0.).
        zero = -0.0 if self.dtype.is_float else 0
        return Sub(as_expr(zero, self.dtype), self)

    def __str__(self) -> str:
        return PRINTERS["expr"](self)


ExprLike = Expr | Number


def as_expr(value: ExprLike, dtype: Dtype) -> Expr:
    """`value` if it is an Expr, else an immediate of `dtype` (broadcast to its lanes)."""
    if isinstance(value, Expr):
        return value
    imm = Imm.make(value, dtype.scalar)
    return imm if dtype.lanes == 1 else Broadcast(imm, dtype.lanes)


def _check_value(dtype: Dtype, value: Number) -> None:
    if dtype.is_bool:
        ok = isinstance(value, bool)
    elif dtype.is_int:
        ok = isinstance(value, int) and not isinstance(value, bool)
        if ok:
            lo, hi = _int_range(dtype)
            ok = lo <= value <= hi
    else:
        ok = isinstance(value, float)
    if not ok:
        raise TypeError(f"immediate {value!r} does not fit {dtype}")


def _int_range(dtype: Dtype) -> tuple[int, int]:
    if dtype.is_signed:
        return -(1 << (dtype.bits - 1)), (1 << (dtype.bits - 1)) - 1
    return 0, (1 << dtype.bits) - 1


def _round_float(value: float, dtype: Dtype) -> float:
    """`value` rounded to the precision of a float dtype (NaN and Inf kept)."""
    if math.isnan(value) or math.isinf(value) or dtype.name == "float64":
        return float(value)
    if dtype.name == "bfloat16":
        return float(torch.tensor(value, dtype=torch.float64).to(torch.bfloat16).item())
    with np.errstate(over="ignore"):
        return float(np.dtype(dtype.name).type(value))


@dataclass(frozen=True)
class Imm(Expr):
    """A scalar constant. Float values are stored rounded to their dtype."""

    dtype: Dtype
    value: Number

    def __post_init__(self) -> None:
        if self.dtype.lanes != 1:
            raise TypeError("immediates are scalar; use Broadcast for vectors")
        _check_value(self.dtype, self.value)

    @staticmethod
    def make(value: Number, dtype: Dtype) -> Imm:
        """An immediate of `dtype` from any Python number, converted as C would."""
        if dtype.is_bool:
            return Imm(dtype, bool(value))
        if dtype.is_int:
            lo, hi = _int_range(dtype)
            v = int(value)
            return Imm(dtype, (v - lo) % (hi - lo + 1) + lo)
        return Imm(dtype, _round_float(float(value), dtype))


@dataclass(frozen=True, eq=False)
class Var(Expr):
    """A named scalar variable: a loop index, a `Let` binding or a kernel argument."""

    name: str
    dtype: Dtype = INDEX

    def __repr__(self) -> str:
        return f"Var({self.name!r}, {self.dtype!r})"


@dataclass(frozen=True)
class BinaryOp(Expr):
    """Base of arithmetic and bitwise ops: both operands and the result share one dtype.

    Each subclass is one row of `ops.BINARY` (by class name), its `row`.
    """

    a: Expr
    b: Expr
    row: ClassVar[ops.Op]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.row = ops.BINARY[cls.__name__]

    def __post_init__(self) -> None:
        if self.a.dtype != self.b.dtype:
            raise TypeError(
                f"{type(self).__name__} operands differ in type: {self.a.dtype} vs {self.b.dtype}"
            )

    @property
    def dtype(self) -> Dtype:
        return self.a.dtype


@dataclass(frozen=True)
class Add(BinaryOp):
    """a + b; integers wrap around."""


@dataclass(frozen=True)
class Sub(BinaryOp):
    """a - b; integers wrap around."""


@dataclass(frozen=True)
class Mul(BinaryOp):
    """a * b; integers wrap around."""


@dataclass(frozen=True)
class Div(BinaryOp):
    """a / b: IEEE division for floats, truncation toward zero for integers."""


@dataclass(frozen=True)
class Mod(BinaryOp):
    """C remainder: for integers the sign follows `a`; for floats, fmod."""


@dataclass(frozen=True)
class Max(BinaryOp):
    """`b if a < b else a`, and NaN if either operand is NaN (torch.maximum)."""


@dataclass(frozen=True)
class Min(BinaryOp):
    """`b if b < a else a`, and NaN if either operand is NaN (torch.minimum)."""


@dataclass(frozen=True)
class MaxOrdered(BinaryOp):
    """`b if a < b else a` for floats, by an ordered compare: a NaN `b` gives `a`, a NaN
    `a` stays. A max Reduce over it from -inf is the max of the body's non-NaN values
    (-inf if none), one instruction per vector (vmaxps): softmax's row max, where a NaN
    in the row makes every output NaN through its exp anyway."""


@dataclass(frozen=True)
class And(BinaryOp):
    """Bitwise and; logical and on bool."""


@dataclass(frozen=True)
class Or(BinaryOp):
    """Bitwise or; logical or on bool."""


@dataclass(frozen=True)
class Xor(BinaryOp):
    """Bitwise exclusive or."""


@dataclass(frozen=True)
class Shl(BinaryOp):
    """a << b for integers; `b` must be in [0, bits)."""


@dataclass(frozen=True)
class Shr(BinaryOp):
    """a >> b for integers, arithmetic for signed types; `b` must be in [0, bits)."""


@dataclass(frozen=True)
class Cmp(Expr):
    """A comparison yielding bool. Ordered for floats: NaN compares false, except `!=`."""

    op: str
    a: Expr
    b: Expr

    def __post_init__(self) -> None:
        if self.op not in ops.CMP:
            raise ValueError(f"unknown comparison {self.op!r}")
        if self.a.dtype != self.b.dtype:
            raise TypeError(f"Cmp operands differ in type: {self.a.dtype} vs {self.b.dtype}")

    @property
    def row(self) -> ops.Op:
        return ops.CMP[self.op]

    @property
    def dtype(self) -> Dtype:
        return BOOL.with_lanes(self.a.dtype.lanes)


@dataclass(frozen=True)
class Select(Expr):
    """`true_value if cond else false_value`, lane by lane."""

    cond: Expr
    true_value: Expr
    false_value: Expr

    def __post_init__(self) -> None:
        if self.cond.dtype.scalar != BOOL:
            raise TypeError(f"Select condition must be bool, got {self.cond.dtype}")
        if self.true_value.dtype != self.false_value.dtype:
            raise TypeError("Select branches differ in type")
        if self.cond.dtype.lanes != self.true_value.dtype.lanes:
            raise TypeError("Select condition and branches differ in lanes")

    @property
    def dtype(self) -> Dtype:
        return self.true_value.dtype


@dataclass(frozen=True)
class Cast(Expr):
    """Conversion to `dtype` with C semantics (float to int truncates; to bool is `!= 0`)."""

    dtype: Dtype
    value: Expr

    def __post_init__(self) -> None:
        if self.dtype.lanes != self.value.dtype.lanes:
            raise TypeError("Cast cannot change the number of lanes")


@dataclass(frozen=True)
class Bitcast(Expr):
    """Reinterpret the bits of `value` as `dtype` of the same width."""

    dtype: Dtype
    value: Expr

    def __post_init__(self) -> None:
        if self.dtype.lanes != self.value.dtype.lanes or self.dtype.bits != self.value.dtype.bits:
            raise TypeError(f"Bitcast from {self.value.dtype} to {self.dtype} changes width")


@dataclass(frozen=True)
class Call(Expr):
    """An intrinsic math function applied lane by lane, e.g. `sin(x)`."""

    name: str
    args: tuple[Expr, ...]

    def __post_init__(self) -> None:
        row = ops.CALLS.get(self.name)
        if row is None:
            raise ValueError(f"unknown intrinsic {self.name!r}")
        if len(self.args) != row.arity:
            raise TypeError(f"{self.name} takes {row.arity} arguments, got {len(self.args)}")
        dtype = self.args[0].dtype
        if any(a.dtype != dtype for a in self.args):
            raise TypeError(f"{self.name} arguments differ in type")
        if not row.accepts(dtype.scalar):
            raise TypeError(f"{self.name} needs {row.types} arguments, got {dtype}")

    @property
    def row(self) -> ops.Op:
        return ops.CALLS[self.name]

    @property
    def dtype(self) -> Dtype:
        return self.args[0].dtype


def _check_index(value: Expr, what: str) -> None:
    if value.dtype.scalar != INDEX:
        raise TypeError(f"{what} must be {INDEX}, got {value.dtype}")


@dataclass(frozen=True)
class Ramp(Expr):
    """The index vector `[base, base + stride, ..., base + (lanes-1) * stride]`."""

    base: Expr
    stride: Expr
    lanes: int

    def __post_init__(self) -> None:
        for part in (self.base, self.stride):
            _check_index(part, "Ramp base and stride")
            if part.dtype.lanes != 1:
                raise TypeError("Ramp base and stride are scalars")
        if self.lanes < 2:
            raise ValueError("a Ramp has at least two lanes")

    @property
    def dtype(self) -> Dtype:
        return INDEX.with_lanes(self.lanes)


@dataclass(frozen=True)
class Broadcast(Expr):
    """A scalar repeated in every lane."""

    value: Expr
    lanes: int

    def __post_init__(self) -> None:
        if self.value.dtype.lanes != 1:
            raise TypeError("only scalars are broadcast")
        if self.lanes < 2:
            raise ValueError("a Broadcast has at least two lanes")

    @property
    def dtype(self) -> Dtype:
        return self.value.dtype.with_lanes(self.lanes)


@dataclass(frozen=True)
class Load(Expr):
    """Element `indices` of `buf`: one index per dimension, or vectors of indices.

    Vector indices (all with the same lanes) load one element per lane.
    """

    buf: Buf
    indices: tuple[Expr, ...] = field(default=())

    def __post_init__(self) -> None:
        _check_access(self.buf, self.indices)

    @property
    def dtype(self) -> Dtype:
        return self.buf.dtype.with_lanes(_access_lanes(self.indices))


def _access_lanes(indices: tuple[Expr, ...]) -> int:
    return max((i.dtype.lanes for i in indices), default=1)


def _check_access(buf: Buf, indices: tuple[Expr, ...]) -> None:
    if len(indices) != buf.ndim:
        raise TypeError(f"{buf.name} has {buf.ndim} dimensions, accessed with {len(indices)}")
    lanes = _access_lanes(indices)
    for index in indices:
        _check_index(index, f"index of {buf.name}")
        if index.dtype.lanes not in (1, lanes):
            raise TypeError(f"indices of {buf.name} differ in lanes")


def imm(value: Number, dtype: Dtype = INDEX) -> Imm:
    """Shorthand for `Imm.make`."""
    return Imm.make(value, dtype)


def cast(dtype: Dtype, value: Expr) -> Expr:
    """`value` converted to `dtype` (its lanes kept); no node when already of that type."""
    dtype = dtype.with_lanes(value.dtype.lanes)
    return value if value.dtype == dtype else Cast(dtype, value)


def broadcast(value: Expr, lanes: int) -> Expr:
    """`value` widened to `lanes` (no-op for a vector of that width)."""
    if value.dtype.lanes == lanes:
        return value
    return Broadcast(value, lanes)


def cmp(op: str, a: ExprLike, b: ExprLike) -> Cmp:
    if not isinstance(a, Expr):
        a = as_expr(a, b.dtype)  # type: ignore[union-attr]
    return Cmp(op, a, as_expr(b, a.dtype))


def select(cond: Expr, true_value: ExprLike, false_value: ExprLike) -> Select:
    if not isinstance(true_value, Expr):
        true_value = as_expr(true_value, false_value.dtype)  # type: ignore[union-attr]
    return Select(cond, true_value, as_expr(false_value, true_value.dtype))


def call(name: str, *args: Expr) -> Call:
    return Call(name, tuple(args))


def is_const(e: Expr, value: Number | None = None) -> bool:
    """Whether `e` is an immediate (or a broadcast one), optionally equal to `value`."""
    if isinstance(e, Broadcast):
        e = e.value
    return isinstance(e, Imm) and (value is None or e.value == value)


#: The `ops.BINARY` rows a `Reduce` or `LaneReduce` may combine with.
REDUCIBLE = ("Add", "Mul", "Max", "Min", "MaxOrdered", "And", "Or")


def _check_reducible(op: str, dtype: Dtype) -> ops.Op:
    row = ops.BINARY.get(op)
    if op not in REDUCIBLE or row is None:
        raise ValueError(f"cannot reduce with {op!r}")
    if not row.accepts(dtype.scalar) or row.llvm.pick(dtype.scalar) is None:
        raise TypeError(f"cannot reduce {dtype} with {op}")
    return row


@dataclass(frozen=True)
class Reduce(Expr):
    """`init` combined with `body` over every point of a box of reduction variables.

        acc = init
        for (vars[0] = 0; vars[0] < stops[0]; ...)     // the last variable innermost
          acc = op(acc, body)
        value = acc

    `op` names an `ops.BINARY` row (`REDUCIBLE`); the accumulator is the
    combine's first operand, so NaN propagates through Max/Min as in
    torch.maximum. The variables are bound by the node: they are free nowhere
    else. `body` and `init` share one dtype, which may be a vector: then each
    lane accumulates on its own (a reduction vectorized across kept elements).
    """

    op: str
    init: Expr
    body: Expr
    vars: tuple[Var, ...]
    stops: tuple[Expr, ...]

    def __post_init__(self) -> None:
        _check_reducible(self.op, self.body.dtype)
        if self.init.dtype != self.body.dtype:
            raise TypeError(f"Reduce init is {self.init.dtype}, body {self.body.dtype}")
        if not self.vars or len(self.vars) != len(self.stops):
            raise TypeError("Reduce needs one stop per variable, and at least one variable")
        for v, stop in zip(self.vars, self.stops):
            if v.dtype != INDEX or stop.dtype != INDEX:
                raise TypeError("Reduce variables and stops are int64 scalars")

    @property
    def row(self) -> ops.Op:
        return ops.BINARY[self.op]

    @property
    def dtype(self) -> Dtype:
        return self.body.dtype


@dataclass(frozen=True)
class LaneReduce(Expr):
    """The lanes of a vector combined into a scalar with `op`, pairwise by halves:
    `[a, b, c, d]` -> `op(op(a, c), op(b, d))`. The lanes are a power of two."""

    op: str
    value: Expr

    def __post_init__(self) -> None:
        _check_reducible(self.op, self.value.dtype)
        lanes = self.value.dtype.lanes
        if lanes < 2 or lanes & (lanes - 1):
            raise TypeError(f"LaneReduce needs a power-of-two vector, got {lanes} lanes")

    @property
    def row(self) -> ops.Op:
        return ops.BINARY[self.op]

    @property
    def dtype(self) -> Dtype:
        return self.value.dtype.scalar


def identity(op: str, dtype: Dtype) -> Expr:
    """The identity of reduction `op` in `dtype` (broadcast to its lanes)."""
    row = _check_reducible(op, dtype)
    assert row.identity is not None
    value = Imm.make(row.identity(dtype.scalar), dtype.scalar)
    return value if dtype.lanes == 1 else Broadcast(value, dtype.lanes)


def reduce(op: str, body: Expr, axes: Sequence[tuple[Var, Expr | int]],
           init: ExprLike | None = None) -> Expr:
    """`Reduce(op, init, body, ...)` over `axes` (variable, stop); init defaults to the identity."""
    vars_ = tuple(v for v, _ in axes)
    stops = tuple(imm(s) if isinstance(s, int) else s for _, s in axes)
    start = identity(op, body.dtype) if init is None else as_expr(init, body.dtype)
    return Reduce(op, start, body, vars_, stops)


def combine(op: str, a: Expr, b: Expr) -> Expr:
    """The binary node of `ops.BINARY` row `op` over `a` and `b`: one step of a reduction."""
    cls = {c.__name__: c for c in BinaryOp.__subclasses__()}[op]
    return cls(a, b)
