"""registry: how each fusible aten op becomes a loop-IR expression, and the table of them.

A lowering turns one TorchScript node into the expression for one element of
its output, given the output's index variables. Operands arrive as `Arg`s:
tensors (`TensorArg`, a buffer to load with broadcasting), numbers
(`ScalarArg`, an immediate or a kernel parameter) and other constants
(`ConstArg`, e.g. None or a dtype). Most ops register through `pointwise`,
which does what every elementwise op shares: type promotion as eager
PyTorch does it (`torch._prims_common.elementwise_dtypes`), loading and
casting operands to the computation type (float32 for float16/bfloat16), and
rounding the result to the output type, which must match what profiling saw.

Each op family (one module each) registers its lowerings here; importing the
`lowerings` package imports them all.
"""

from __future__ import annotations

import enum
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from .. import expr as E
from .. import stmt as S
from ..buffer import Buf
from ..dtype import BOOL, FLOAT32, FLOAT64, INT64, Dtype, from_torch
from ..loopnest import compute

__all__ = ["Promotion", "register", "pointwise", "lowering_for", "LoweringError", "VIEWS"]


class Promotion(enum.Enum):
    """How an elementwise op types its result (the kinds of `torch._prims_common`)."""

    DEFAULT = 0  # the promoted type
    NO_OPMATH = 1  # the promoted type, computed in it even when float16/bfloat16
    INT_TO_FLOAT = 2  # integer and bool results become the default float type
    ALWAYS_BOOL = 3  # comparisons: computed in the promoted type, result bool
    COMPLEX_TO_FLOAT = 4  # abs: as DEFAULT for the real types the IR has
    BOOL_TO_LONG = 5  # bool results become int64


def _category(dtype: torch.dtype) -> int:
    if dtype == torch.bool:
        return 0
    return 2 if dtype.is_floating_point else 1


def _python_category(value: Any) -> int:
    return 0 if isinstance(value, bool) else 1 if isinstance(value, int) else 2


def elementwise_dtypes(
    operands: Sequence[tuple[torch.dtype, int] | bool | int | float], kind: Promotion
) -> tuple[torch.dtype, torch.dtype]:
    """(computation dtype, result dtype) of an elementwise op, as eager PyTorch decides them.

    `operands` are tensors as `(dtype, ndim)` and Python numbers as themselves.
    Tensors with dimensions outrank 0-dim tensors, which outrank numbers, unless
    a lower rank has a higher category (bool < integer < float): then a
    number gives the default dtype of its category. This is
    `torch._prims_common.elementwise_dtypes`, without importing it (it pulls in
    sympy, a quarter of a second at start-up).
    """
    tensors = [op for op in operands if isinstance(op, tuple)]
    highest = max(
        [_category(d) for d, _ in tensors] + [_python_category(op) for op in operands
                                              if not isinstance(op, tuple)]
    )

    def highest_dtype(ndim_filter: Callable[[int], bool]) -> torch.dtype | None:
        out = None
        for d, ndim in tensors:
            if _category(d) == highest and ndim_filter(ndim):
                out = d if out is None else torch.promote_types(out, d)
        return out

    if highest == 0:
        result = torch.bool
    else:
        result = highest_dtype(lambda n: n > 0) or highest_dtype(lambda n: n == 0) or (
            torch.get_default_dtype() if highest == 2 else torch.int64
        )
    if kind is Promotion.INT_TO_FLOAT and not result.is_floating_point:
        result = torch.get_default_dtype()
    if kind is Promotion.BOOL_TO_LONG and result == torch.bool:
        return torch.int64, torch.int64
    compute = result
    if kind is not Promotion.NO_OPMATH and result in (torch.float16, torch.bfloat16):
        compute = torch.float32
    return compute, torch.bool if kind is Promotion.ALWAYS_BOOL else result


class LoweringError(Exception):
    """A node cannot be lowered: it runs unfused instead."""


class Arg:
    """An operand of a node."""


@dataclass(frozen=True)
class TensorArg(Arg):
    buf: Buf
    shape: tuple[int, ...]
    #: a tensor constant of fixed sizes in a dynamic kernel: it broadcasts only against dims
    #: of its own (static) sizes, and is not viewed (its sizes are no symbols)
    fixed: bool = False

    @property
    def dtype(self) -> Dtype:
        return self.buf.dtype

    def example(self) -> tuple[torch.dtype, int]:
        return self.dtype.torch, len(self.shape)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


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

    @property
    def numel(self) -> int:
        return 1


@dataclass(frozen=True)
class ConstArg(Arg):
    value: Any


@dataclass(frozen=True)
class ListArg(Arg):
    """A list of tensors built in the group (`prim::ListConstruct`), for cat and stack."""

    items: tuple[Arg, ...]


def scalar_dtype(value: Any) -> Dtype:
    """The IR type of a Python number used as an operand."""
    if isinstance(value, bool):
        return BOOL
    if isinstance(value, int):
        return INT64
    return FLOAT64


@dataclass(frozen=True)
class RuntimeCheck:
    """Before the kernel runs: raise `RuntimeError(message)`, as eager would, unless
    `holds(value)` for the value of kernel input `param` (a tensor or a number)."""

    param: Buf | E.Var
    holds: Callable[[Any], bool]
    message: str


def _nonzero(value: Any) -> bool:
    return not bool((value == 0).any()) if isinstance(value, torch.Tensor) else value != 0


@dataclass
class Ctx:
    """What a lowering sees: the node, its operands, and the output element being computed.

    `inputs` are the kernel's input buffers and parameters (for run-time checks),
    `checks` collects the checks the kernel runs before its code, `nests` the
    nests of the node's intermediates (`intermediate`), run before its own.
    """

    node: Any
    args: list[Arg]
    out_dtype: Dtype
    out_shape: tuple[int, ...]
    indices: tuple[E.Expr, ...] = field(default=())
    inputs: frozenset[Buf | E.Var] = field(default=frozenset())
    checks: list[RuntimeCheck] = field(default_factory=list)
    nests: list[S.Stmt] = field(default_factory=list)
    output: int = 0  # which output of a multi-output node (max.dim: values 0, indices 1)
    shared: dict[str, Any] = field(default_factory=dict)  # what a node's outputs share

    def intermediate(
        self, name: str, dtype: Dtype, dims: Sequence[int], fn: Callable[..., E.Expr]
    ) -> TensorArg:
        """A temporary over `dims`, `fn(*indices)` at each element, computed by its own nest
        (appended to `nests`, which the kernel runs before this node's): for values every
        element of the output reuses, such as the max of a softmax row."""
        op = str(self.node.kind()).split("::")[-1]
        buf, nest = compute(f"{op}_{name}", dtype, dims, fn)
        self.nests.append(nest)
        return TensorArg(buf, tuple(dims))

    def arg(self, k: int) -> Arg | None:
        """Operand `k`, or None when the node has fewer operands."""
        return self.args[k] if k < len(self.args) else None

    def is_none(self, k: int) -> bool:
        """Whether operand `k` is absent or the constant None."""
        a = self.arg(k)
        return a is None or (isinstance(a, ConstArg) and a.value is None)

    def require_nonzero(self, arg: Arg) -> None:
        """Integer division by `arg`: eager raises on a zero divisor, so must the kernel.

        An empty output divides nothing, and eager does not look at the divisor.
        """
        if math.prod(self.out_shape) == 0:
            return
        if isinstance(arg, ScalarArg) and arg.const is not None:
            if arg.const == 0:
                raise LoweringError("division by a constant zero")
            return
        self.require(arg, _nonzero, "ZeroDivisionError")

    def require(self, arg: Arg, holds: Callable[[Any], bool], message: str) -> None:
        """Check `holds` on the value of `arg`, a kernel input, before the kernel runs.

        For what eager checks at run time and raises on; an operand computed
        inside the group cannot be checked, so then LoweringError.
        """
        param = arg.buf.root if isinstance(arg, TensorArg) else getattr(arg, "expr", None)
        if param not in self.inputs:
            raise LoweringError(f"{message}: a value computed inside the group cannot be checked")
        check = RuntimeCheck(param, holds, message)
        if check not in self.checks:
            self.checks.append(check)

    def load(self, arg: Arg, dtype: Dtype | None = None) -> E.Expr:
        """The element of `arg` that broadcasts to the current output index, as `dtype`."""
        if isinstance(arg, TensorArg):
            offset = len(self.indices) - len(arg.shape)
            if offset < 0:
                raise LoweringError("operand has more dimensions than the output")
            if arg.fixed and any(size != 1 and self.out_shape[offset + k] != size
                                 for k, size in enumerate(arg.shape)):
                raise LoweringError("a tensor constant broadcast along a size symbol")
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

    def load_at(self, arg: Arg, indices: Sequence[E.Expr], dtype: Dtype | None = None) -> E.Expr:
        """The element of tensor `arg` at `indices`, one per dimension of `arg`, as `dtype`.

        For lowerings that move data (views, slices, cat): they compute where in
        their input an output element comes from. Dimensions of size 1 are read
        at 0 whatever the index says (that is how they broadcast).
        """
        if not isinstance(arg, TensorArg):
            raise LoweringError(f"cannot index a non-tensor {arg}")
        if arg.fixed:
            raise LoweringError("a tensor constant of fixed sizes moved in a dynamic kernel")
        if len(indices) != len(arg.shape):
            raise LoweringError(f"{len(indices)} indices for a {len(arg.shape)}-dim tensor")
        idx = tuple(E.imm(0) if size == 1 else i for i, size in zip(indices, arg.shape))
        value: E.Expr = E.Load(arg.buf, idx)
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
        compute, result = elementwise_dtypes([a.example() for a in operands], kind)
        return from_torch(compute), from_torch(result)

    def promote_to_output(self, args: Sequence[Arg], kind: Promotion) -> Dtype:
        """The computation dtype of `args`, tensors or numbers, whose promotion must give the
        profiled output type (else LoweringError)."""
        for a in args:
            if not isinstance(a, (TensorArg, ScalarArg)):
                raise LoweringError("operand is neither a tensor nor a number")
        compute, result = self.promote(args, kind)
        if result != self.out_dtype:
            raise LoweringError(f"promotion gives {result}, eager gave {self.out_dtype}")
        return compute

    def operands(
        self, args: Sequence[Arg], kind: Promotion, scalar_opmath: bool = False
    ) -> tuple[list[E.Expr], Dtype]:
        """`args` loaded and converted as eager converts them, and the computation type.

        Raises LoweringError unless promotion gives the profiled output type.
        Like TensorIterator, each operand is converted to the promoted type
        first (a float64 number next to a float16 tensor becomes a float16),
        then to the computation type (float32 for float16 and bfloat16). With
        `scalar_opmath`, a second operand of one element skips the first
        step: ATen's mul and div kernels read it at float32 precision.
        """
        compute = self.promote_to_output(args, kind)
        promoted = self.promote(args, Promotion.NO_OPMATH)[1]
        values = []
        for k, a in enumerate(args):
            value = self.load(a)
            opmath = scalar_opmath and k == 1 and a.numel == 1
            if promoted.is_reduced_float and value.dtype != promoted and not opmath:
                # c10::Half and c10::BFloat16 are built from a float: round twice.
                value = E.cast(promoted, E.cast(FLOAT32, value))
            values.append(E.cast(compute_type(compute), value))
        return values, compute_type(compute)


Lowerer = Callable[[Ctx], E.Expr]


@dataclass(frozen=True)
class Lowering:
    kind: str
    fn: Lowerer
    overloads: frozenset[str] | None
    #: the lowering compiles its non-tensor operands in (sizes, dims, indices): the fuser
    #: takes the node only when they are constants
    constant_operands: bool = False
    #: how many tensor outputs the node has; each is lowered with `Ctx.output` set
    outputs: int = 1
    #: why a node of this kind may not fuse though its schema matches (None: it may)
    problem: Callable[[Any], str | None] | None = None
    #: whether a node of this kind makes a group on its own, below `min_group_size`: where
    #: its one kernel was measured faster than eager's one op (a softmax between two GEMMs)
    alone: Callable[[Any], bool] | None = None
    #: whether the lowering takes symbolic sizes (a dynamic kernel's): its output sizes follow
    #: from its inputs' whatever the sizes (elementwise ops, reductions and normalizations,
    #: which raise where a size they need is symbolic; views whose constant operands are
    #: dims, or sizes `graph_lowering.view_sizes` derives). By default, those without
    #: `constant_operands`.
    dynamic: bool = False


REGISTRY: dict[str, Lowering] = {}
#: Kinds that two families lower, each its own overloads (max.other and max.dim).
_BY_OVERLOAD: dict[tuple[str, str], Lowering] = {}

#: Kinds whose eager result is a view of their first input (or may be: reshape, contiguous).
#: Inside a group they are index arithmetic; a group does not return one of an input.
VIEWS: set[str] = set()
#: Kinds of elementwise lowerings (`pointwise`): their operands broadcast through `Ctx.load`.
POINTWISE: set[str] = set()


def register(
    kinds: str | Sequence[str],
    overloads: Sequence[str] | None = None,
    constant_operands: bool = False,
    view: bool = False,
    outputs: int = 1,
    problem: Callable[[Any], str | None] | None = None,
    alone: Callable[[Any], bool] | None = None,
    dynamic: bool | None = None,
):
    """Decorator: `fn(ctx) -> Expr` lowers nodes of `kinds` with the given schema overloads.

    `constant_operands`, `outputs`, `problem`, `alone`, `dynamic`: see `Lowering`; `view`: the
    kinds go into `VIEWS`. A kind registered again with other overloads keeps both lowerings,
    each its own.
    """
    names = [kinds] if isinstance(kinds, str) else list(kinds)
    takes_symbols = not constant_operands if dynamic is None else dynamic

    def wrap(fn: Lowerer) -> Lowerer:
        for name in names:
            lowering = Lowering(
                name, fn, frozenset(overloads) if overloads else None, constant_operands, outputs,
                problem, alone, takes_symbols,
            )
            before = REGISTRY.get(name)
            if before is not None and before.overloads and lowering.overloads:
                for ov in before.overloads:
                    _BY_OVERLOAD.setdefault((name, ov), before)
                for ov in lowering.overloads:
                    _BY_OVERLOAD[(name, ov)] = lowering
                lowering = replace(lowering, overloads=before.overloads | lowering.overloads)
            REGISTRY[name] = lowering
            if view:
                VIEWS.add(name)
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
    scalar_opmath: bool = False,
):
    """Decorator for elementwise ops: `fn(ctx, *operand_values)` computes in the compute type.

    `operands` are the positions of the inputs that take part in type
    promotion; the values passed to `fn` are those inputs loaded and
    converted to the computation type (`Ctx.operands`, which also explains
    `scalar_opmath`). `fn` may read other inputs with `ctx.const`.
    """

    def wrap(fn: Callable[..., E.Expr]) -> Callable[..., E.Expr]:
        def lower(ctx: Ctx) -> E.Expr:
            present = [ctx.args[k] for k in operands if k < len(ctx.args)]
            values, _ = ctx.operands(present, promotion, scalar_opmath)
            return E.cast(ctx.out_dtype, fn(ctx, *values))

        register(kinds, overloads)(lower)
        POINTWISE.update([kinds] if isinstance(kinds, str) else kinds)
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
    return _BY_OVERLOAD.get((node.kind(), overload), lowering), ""
