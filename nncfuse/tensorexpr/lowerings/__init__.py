"""The lowering registry: how each fusible aten op becomes a loop-IR expression.

A lowering turns one TorchScript node into the expression for one element of
its output, given the output's index variables. Operands arrive as `Arg`s:
tensors (`TensorArg`, a buffer to load with broadcasting), numbers
(`ScalarArg`, an immediate or a kernel parameter) and other constants
(`ConstArg`, e.g. None or a dtype). Most ops register through `pointwise`,
which does what every elementwise op shares: type promotion as eager
PyTorch does it (`torch._prims_common.elementwise_dtypes`), loading and
casting operands to the computation type (float32 for float16/bfloat16), and
rounding the result to the output type, which must match what profiling saw.

Importing this package registers the op families (one module each).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND as Promotion
from torch._prims_common import elementwise_dtypes

from .. import expr as E
from ..buffer import Buf
from ..dtype import BOOL, FLOAT32, FLOAT64, INT64, Dtype, from_torch

__all__ = ["Promotion", "register", "pointwise", "lowering_for", "LoweringError"]


class LoweringError(Exception):
    """A node cannot be lowered: it runs unfused instead."""


class Arg:
    """An operand of a node."""


@dataclass(frozen=True)
class TensorArg(Arg):
    buf: Buf
    shape: tuple[int, ...]

    @property
    def dtype(self) -> Dtype:
        return self.buf.dtype

    def example(self) -> torch.Tensor:
        return torch.empty(self.shape, dtype=self.dtype.torch, device="meta")


@dataclass(frozen=True)
class ScalarArg(Arg):
    """A Python number: `expr` is an immediate (then `const` holds it) or a kernel parameter."""

    expr: E.Expr
    const: Any = None

    @property
    def dtype(self) -> Dtype:
        return self.expr.dtype

    def example(self) -> Any:
        if self.const is not None:
            return self.const
        return {"float64": 1.0, "int64": 1, "bool": True}[self.dtype.name]


@dataclass(frozen=True)
class ConstArg(Arg):
    value: Any


def scalar_dtype(value: Any) -> Dtype:
    """The IR type of a Python number used as an operand."""
    if isinstance(value, bool):
        return BOOL
    if isinstance(value, int):
        return INT64
    return FLOAT64


@dataclass(frozen=True)
class NonzeroCheck:
    """Before the kernel runs: raise eager's error if kernel parameter `param` has a zero."""

    param: Buf | E.Var
    message: str = "ZeroDivisionError"


@dataclass
class Ctx:
    """What a lowering sees: the node, its operands, and the output element being computed.

    `inputs` are the kernel's input buffers and parameters (for run-time checks),
    `checks` collects the checks the kernel runs before its code.
    """

    node: Any
    args: list[Arg]
    out_dtype: Dtype
    out_shape: tuple[int, ...]
    indices: tuple[E.Expr, ...] = field(default=())
    inputs: frozenset = field(default=frozenset())
    checks: list = field(default_factory=list)

    def arg(self, k: int) -> Arg | None:
        """Operand `k`, or None when the node has fewer operands."""
        return self.args[k] if k < len(self.args) else None

    def is_none(self, k: int) -> bool:
        """Whether operand `k` is absent or the constant None."""
        a = self.arg(k)
        return a is None or (isinstance(a, ConstArg) and a.value is None)

    def require_nonzero(self, arg: Arg) -> None:
        """Integer division by `arg`: eager raises on a zero divisor, so must the kernel."""
        if isinstance(arg, ScalarArg) and arg.const is not None:
            if arg.const == 0:
                raise LoweringError("division by a constant zero")
            return
        param = arg.buf.root if isinstance(arg, TensorArg) else getattr(arg, "expr", None)
        if param not in self.inputs:
            raise LoweringError("integer division by a value computed inside the group")
        check = NonzeroCheck(param)
        if check not in self.checks:
            self.checks.append(check)

    def load(self, arg: Arg, dtype: Dtype | None = None) -> E.Expr:
        """The element of `arg` that broadcasts to the current output index, as `dtype`."""
        if isinstance(arg, TensorArg):
            offset = len(self.indices) - len(arg.shape)
            if offset < 0:
                raise LoweringError("operand has more dimensions than the output")
            idx = tuple(
                E.imm(0) if size == 1 else self.indices[offset + k]
                for k, size in enumerate(arg.shape)
            )
            value: E.Expr = E.Load(arg.buf, idx)
        elif isinstance(arg, ScalarArg):
            value = arg.expr
        else:
            raise LoweringError(f"cannot load a constant {arg}")
        return value if dtype is None else E.cast(dtype, value)

    def const(self, k: int) -> Any:
        """The Python value of constant operand `k` (None if absent)."""
        if k >= len(self.args):
            return None
        arg = self.args[k]
        if isinstance(arg, ConstArg):
            return arg.value
        if isinstance(arg, ScalarArg) and arg.const is not None:
            return arg.const
        raise LoweringError(f"operand {k} must be a constant")

    def promote(self, operands: Sequence[Arg], kind: Promotion) -> tuple[Dtype, Dtype]:
        """(computation dtype, result dtype) for `operands` as eager PyTorch promotes them."""
        examples = [a.example() for a in operands]
        compute, result = elementwise_dtypes(*examples, type_promotion_kind=kind)
        return from_torch(compute), from_torch(result)


Lowerer = Callable[[Ctx], E.Expr]


@dataclass(frozen=True)
class Lowering:
    kind: str
    fn: Lowerer
    overloads: frozenset[str] | None


REGISTRY: dict[str, Lowering] = {}


def register(kinds: str | Sequence[str], overloads: Sequence[str] | None = None):
    """Decorator: `fn(ctx) -> Expr` lowers nodes of `kinds` with the given schema overloads."""
    names = [kinds] if isinstance(kinds, str) else list(kinds)

    def wrap(fn: Lowerer) -> Lowerer:
        for name in names:
            REGISTRY[name] = Lowering(name, fn, frozenset(overloads) if overloads else None)
        return fn

    return wrap


def compute_type(dtype: Dtype) -> Dtype:
    """float16 and bfloat16 compute in float32."""
    return FLOAT32 if dtype.is_reduced_float else dtype


def pointwise(
    kinds: str | Sequence[str],
    promotion: Promotion = Promotion.DEFAULT,
    operands: Sequence[int] = (0, 1),
    overloads: Sequence[str] | None = None,
):
    """Decorator for elementwise ops: `fn(ctx, *operand_values)` computes in the compute type.

    `operands` are the positions of the inputs that take part in type
    promotion; the values passed to `fn` are those inputs loaded and cast to
    the computation type. `fn` may read other inputs with `ctx.const`.
    """

    def wrap(fn: Callable[..., E.Expr]) -> Callable[..., E.Expr]:
        def lower(ctx: Ctx) -> E.Expr:
            present = [ctx.args[k] for k in operands if k < len(ctx.args)]
            for a in present:
                if not isinstance(a, (TensorArg, ScalarArg)):
                    raise LoweringError("operand is neither a tensor nor a number")
            compute, result = ctx.promote(present, promotion)
            if result != ctx.out_dtype:
                raise LoweringError(f"promotion gives {result}, eager gave {ctx.out_dtype}")
            compute = compute_type(compute)
            value = fn(ctx, *(ctx.load(a, compute) for a in present))
            return E.cast(ctx.out_dtype, value)

        register(kinds, overloads)(lower)
        return fn

    return wrap


_OVERLOAD = re.compile(r"^[\w:]+(?:\.(\w+))?\(")


def schema_overload(node: Any) -> str | None:
    """The overload name of a node's matched schema ('' for the default), or None if unmatched."""
    try:
        schema = node.schema()
    except RuntimeError:
        return None
    if schema == "(no schema)":
        return None
    m = _OVERLOAD.match(schema)
    return (m.group(1) or "") if m else None


def lowering_for(node: Any) -> tuple[Lowering | None, str]:
    """The lowering of `node`, or None and the reason there is none."""
    lowering = REGISTRY.get(node.kind())
    if lowering is None:
        return None, f"no lowering for {node.kind()}"
    overload = schema_overload(node)
    if overload is None:
        return None, f"{node.kind()} has no matching schema"
    if lowering.overloads is not None and overload not in lowering.overloads:
        return None, f"{node.kind()}.{overload} is not supported"
    return lowering, ""


# Register the op families.
from . import activation, arithmetic, bitwise, casts, compare, unary  # noqa: E402,F401
