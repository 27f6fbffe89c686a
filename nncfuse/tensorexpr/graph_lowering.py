"""graph_lowering: a TorchScript graph of fusible ops -> one loop nest per node.

`lower_graph(graph)` binds the graph's inputs to buffers and scalar variables,
lowers each node through the registry of `lowerings` to a Compute over its
output (one nest per node: the "Original Stmt"), lays out every output with
the strides eager PyTorch gives it, and collects the kernel's parameters,
outputs, run-time checks and external calls as a frozen `Lowered`.

    graph(%x : Float(4, 8), %y : Float(4, 8)):       for i in 0..4:
      %a = aten::mul(%x, %y)                 ->        for j in 0..8:
      %b = aten::sin(%a)                                  a[i, j] = x[i, j] * y[i, j]
      return (%b)                                      for i in 0..4:
                                                         for j in 0..8:
                                                           b[i, j] = sin(a[i, j])

`kernel.py` schedules and compiles the result.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Any

import torch

from .. import log
from . import expr as E
from . import shape_checks
from . import stmt as S
from .buffer import Buf
from .codegen.entry import InputGuard, InputOutput, SizeSymbol
from .dtype import BOOL, FLOAT64, INT64, from_torch
from .ir_visitor import substitute
from .loopnest import compute, definition
from .lowerings import (
    EXTERNAL_KINDS,
    Arg,
    ConstArg,
    Ctx,
    ListArg,
    LoweringError,
    RuntimeCheck,
    ScalarArg,
    TensorArg,
    lower_external,
    lowering_for,
    scalar_dtype,
)
from .lowerings.registry import POINTWISE
from .lowerings.shapes import add_sizes, monomial, product
from .meta import TensorMeta, blocks_of, infer_types, inputs_of, is_tensor, outputs_of
from .size_symbols import SizeSymbols

_log = log.get_logger(__file__)

@dataclass(frozen=True)
class ComputedOutput:
    """A graph output computed by the kernel into `buf`."""

    buf: Buf


@dataclass(frozen=True)
class Lowered:
    """A graph lowered to one statement, and how its parameters bind to the graph."""

    stmt: S.Stmt  # the loops, after the external calls
    params: tuple[Buf | E.Var, ...]  # inputs, tensor constants, external results, outputs
    inputs: tuple[Buf | E.Var, ...]  # per graph input: its parameter
    constants: tuple[tuple[Buf, torch.Tensor], ...]  # tensor constants, bound at call time
    outputs: tuple[ComputedOutput | InputOutput, ...]  # per graph output
    output_metas: Mapping[Buf, TensorMeta]  # per output buffer
    input_metas: tuple[TensorMeta | None, ...]  # per graph input (None: a number)
    name: str
    checks: tuple[RuntimeCheck, ...]  # run before the kernel
    written: tuple[int, ...] = ()  # graph inputs the kernel stores into (write-backs)
    write_sources: tuple[Buf, ...] = ()  # what write-backs store: kept buffers, not inlined
    externals: tuple[S.ExternalCall, ...] = ()  # run before the loops, from the entry
    symbols: tuple[SizeSymbol, ...] = ()  # a dynamic kernel's sizes, bound from its inputs
    guards: tuple[InputGuard, ...] = ()  # what a dynamic kernel relies on, per tensor input
    equal: tuple[tuple[E.Expr, E.Var], ...] = ()  # sizes it takes as equal: checked too


def _sanitize(name: str) -> str:
    return re.sub(r"\W", "_", name) or "t"


def _scalar_var(value: Any, name: str) -> E.Var:
    kind = value.type().kind()
    dtype = {"FloatType": FLOAT64, "IntType": INT64, "BoolType": BOOL}.get(kind)
    if dtype is None:
        raise LoweringError(f"graph input {name} of type {value.type()} is not supported")
    return E.Var(name, dtype)


def _layout_order(meta: TensorMeta) -> list[int]:
    """Dimensions from the largest stride to the smallest: the order that walks memory."""
    return sorted(range(len(meta.sizes)), key=lambda d: -meta.strides[d])


def _example(value: Any) -> Any:
    meta = TensorMeta.from_type(value.type())
    if meta is not None:
        return meta.empty("meta")
    kind = value.type().kind()
    if kind == "TensorType":
        raise LoweringError(f"graph input %{value.debugName()} has an incomplete tensor type")
    return {"FloatType": 1.0, "IntType": 1, "BoolType": True}.get(kind)


def graph_metas(graph: torch._C.Graph) -> dict[int, TensorMeta]:
    """Metadata of the graph's tensor values: from their types, else from a meta-tensor run."""
    for v in inputs_of(graph):
        if is_tensor(v) and TensorMeta.from_type(v.type()) is None:
            raise LoweringError(f"graph input %{v.debugName()} has an incomplete tensor type")
    metas: dict[int, TensorMeta] = {}
    complete = all(
        TensorMeta.from_type(v.type()) is not None
        for node in graph.nodes()
        for v in outputs_of(node)
        if is_tensor(v)
    )
    if not complete:
        device = next(
            (m.device for v in inputs_of(graph) if (m := TensorMeta.from_type(v.type()))),
            torch.device("cpu"),
        )
        metas = {k: replace(m, device=device) for k, m in infer_types(graph, _example).items()}
    for node in graph.nodes():
        for v in outputs_of(node):
            meta = TensorMeta.from_type(v.type())
            if meta is not None:
                metas[v.unique()] = meta
    for v in inputs_of(graph):
        meta = TensorMeta.from_type(v.type())
        if meta is not None:
            metas[v.unique()] = meta
    return metas


class _GraphLowering:
    """What lowering a graph has built so far: the value of each graph value, and the rest."""

    def __init__(
        self, graph: torch._C.Graph, dynamic: bool = False, static: frozenset[int] = frozenset()
    ):
        self.metas = graph_metas(graph)
        #: a dynamic kernel's size symbols (`size_symbols`), or None for a static one
        self.symbols: SizeSymbols | None = None
        if dynamic:
            self.symbols = SizeSymbols([
                (k, self.metas[v.unique()]) for k, v in enumerate(inputs_of(graph)) if is_tensor(v)
            ], static)
        self.env: dict[int, Arg] = {}  # graph value (unique) -> its operand
        self.names: set[str] = set()
        self.checks: list[RuntimeCheck] = []
        self.constants: list[tuple[Buf, torch.Tensor]] = []
        self.nests: list[S.Stmt] = []
        self.output_metas: dict[Buf, TensorMeta] = {}
        self.ops: list[str] = []
        self.write_backs: list[S.Stmt] = []  # stores into inputs, after every other nest
        self.written: dict[Buf, int] = {}  # input buffer -> its graph input position
        self.write_sources: list[Buf] = []
        self.externals: list[S.ExternalCall] = []
        self.folded: set[int] = set()  # outputs of nodes an external call computes

    def sizes(self, meta: TensorMeta, derived: bool = False) -> tuple[int | E.Expr, ...]:
        """`meta`'s sizes: ints, or in a dynamic kernel each 1, static or its size symbol."""
        return meta.sizes if self.symbols is None else self.symbols.sizes(meta, derived)

    def unique(self, base: str) -> str:
        """`base`, or `base_<n>` if that name is taken."""
        name, n = base, 0
        while name in self.names:
            n += 1
            name = f"{base}_{n}"
        self.names.add(name)
        return name


def _lower_list(state: _GraphLowering, node: Any) -> None:
    """A `prim::ListConstruct` of tensors (for cat and stack) is the list of their operands,
    of constant numbers a constant list (sizes); no loop nest."""
    items = tuple(state.env[v.unique()] for v in inputs_of(node))
    if all(isinstance(a, TensorArg) for a in items):
        state.env[node.output().unique()] = ListArg(items)
    elif all(isinstance(a, ScalarArg) and a.const is not None for a in items):
        state.env[node.output().unique()] = ConstArg([a.const for a in items])  # type: ignore
    else:
        raise LoweringError("a list of something other than tensors or constants")


#: Integer ops on sizes (a group's copies of view sizes: `jit/fuser/sizes.py`), Python's meaning.
_SIZE_OPS = shape_checks.INT_OPS
_SIZE_KINDS = frozenset({"aten::size", *_SIZE_OPS})


def _int_node(node: Any) -> bool:
    return node.outputsSize() == 1 and isinstance(node.output().type(), torch._C.IntType)


def _lower_size(state: _GraphLowering, node: Any) -> None:
    """`aten::size(%t, d)` is `%t`'s size along constant `d` (an int, or in a dynamic kernel
    a size symbol's expression), integer ops on sizes their result; no loop nest. A result
    that is not a constant (a symbol) is an expression the lowerings that need constants
    refuse."""
    args = [state.env[v.unique()] for v in inputs_of(node)]
    if node.kind() == "aten::size":
        source, dim = args
        d = getattr(dim, "const", None)
        if not isinstance(source, TensorArg) or not isinstance(d, int) or not (
                -len(source.shape) <= d < len(source.shape)):
            raise LoweringError("aten::size of a tensor along a constant dim in range")
        size = source.shape[d]
        value = (ScalarArg(E.imm(size, INT64), size) if isinstance(size, int)
                 else ScalarArg(E.cast(INT64, size)))
    else:
        consts = [getattr(a, "const", None) for a in args]
        if not all(isinstance(c, int) and not isinstance(c, bool) for c in consts):
            raise LoweringError(f"{node.kind()} of sizes that are not constants")
        if node.kind() == "aten::floordiv" and consts[1] == 0:
            raise LoweringError("a size divided by zero")
        result = _SIZE_OPS[node.kind()](*consts)
        if not -2**63 <= result < 2**63:
            raise LoweringError(f"{node.kind()} of sizes overflows int64")
        value = ScalarArg(E.imm(result, INT64), result)
    state.env[node.output().unique()] = value


def _lower_check(state: _GraphLowering, node: Any) -> None:
    """A shape check (`shape_checks`) is a constant, from the types of the tensors it reads
    (guarded: a static kernel's TypeCheck, a dynamic one's ranks and static sizes): a check
    value an immediate, a check that passes nothing at all. LoweringError for one that
    raises at these types, or that reads a size symbol (a dynamic kernel's: then a static
    one is built)."""
    if node.kind() == "prim::If":  # the block its condition takes
        cond = state.env[node.input().unique()]
        if not isinstance(cond, ScalarArg) or cond.const is None:
            raise LoweringError("a shape check whose condition is not a constant")
        taken = 0 if cond.const else 1
        if taken == shape_checks.raising_block(node):
            raise LoweringError("a shape check raises for these input types")
        if shape_checks.is_check(node):
            return
        block = blocks_of(node)[taken]  # (`and`, `or`: a value)
        for inner in block.nodes():
            if inner.kind() == "prim::Constant":
                _lower_constant(state, inner)
            else:
                _lower_check(state, inner)
        state.env[node.output().unique()] = state.env[outputs_of(block)[0].unique()]
        return
    operands: list[Any] = []
    for k, v in enumerate(inputs_of(node)):
        arg = state.env.get(v.unique())
        if k == 0 and node.kind() in shape_checks.READS and isinstance(arg, TensorArg):
            operands.append(shape_checks.Shape(arg.shape))
        elif isinstance(arg, ScalarArg) and arg.const is not None:
            operands.append(arg.const)
        elif isinstance(arg, ConstArg) and isinstance(arg.value, list):  # sizes
            operands.append(arg.value)
        else:
            raise LoweringError(f"{node.kind()} in a shape check of values not constants")
    try:
        result = shape_checks.evaluate(node.kind(), operands)
    except ValueError as e:
        raise LoweringError(f"a shape check raises: {e}") from e
    if isinstance(result, list) and all(isinstance(r, int) for r in result):
        state.env[node.output().unique()] = ConstArg(result)
    elif isinstance(result, (bool, int)):
        state.env[node.output().unique()] = ScalarArg(E.imm(result, scalar_dtype(result)), result)
    else:  # a size symbol's expression
        raise LoweringError(f"{node.kind()} in a shape check of a size symbol")


_CATS = ("aten::cat", "aten::concat", "aten::concatenate")


def _cat_sizes(node: Any, args: Sequence[Arg], symbols: SizeSymbols) -> list[int | E.Expr]:
    """In a dynamic kernel, a cat's output sizes: its parts' (of one rank), their lengths
    along its dim added up (`derive` checks them against the example and learns a sum:
    a KV cache's `s0 + 1`). A part whose length is a symbol's must not be empty when the
    kernel runs (`concat` reads it at a clamped index): its symbols are at least 1."""
    dim = node.inputsAt(1).toIValue()
    parts = args[0].items if isinstance(args[0], ListArg) else ()
    if not isinstance(dim, int) or not parts:
        raise LoweringError("a cat of a list not built in the group")
    if not all(isinstance(p, TensorArg) for p in parts):
        raise LoweringError("a cat of something not a tensor")
    ndim = len(parts[0].shape)
    if ndim == 0 or not -ndim <= dim < ndim or any(len(p.shape) != ndim for p in parts):
        raise LoweringError("a cat of parts of different ranks")
    dim %= ndim
    total: int | E.Expr = 0
    for p in parts:
        length = p.shape[dim]
        for var in monomial(length)[1]:
            if not isinstance(var, E.Var):
                raise LoweringError("a cat of a part whose length is a sum (a cat's)")
            symbols.at_least(var, 1)
        total = add_sizes(total, length)
    out = list(parts[0].shape)
    out[dim] = total
    return out


#: Views with constant sizes or indices whose output sizes `view_sizes` derives from the
#: input's symbolic sizes (or raises: then the group gets a static kernel).
_SIZED_VIEWS = frozenset((
    "aten::view", "aten::reshape", "aten::flatten", "aten::unflatten", "aten::view_as",
    "aten::reshape_as", "aten::expand", "aten::expand_as", "aten::slice", "aten::narrow",
    "aten::select",
))


def _inferred(source: Sequence[int | E.Expr], request: Any) -> list[int | E.Expr]:
    """A view's sizes `request` (ints, one may be -1) of an input of sizes `source`: the -1
    is the input's product over the others' (a product of symbols), else LoweringError."""
    if not isinstance(request, (list, tuple)) or not all(isinstance(n, int) for n in request):
        raise LoweringError("a view's sizes are not constants")
    coef, syms = product(source)
    known = math.prod(n for n in request if n != -1)
    out: list[int | E.Expr] = list(request)
    if -1 in request:
        if request.count(-1) > 1 or known == 0 or coef % known:
            raise LoweringError("a view's -1 is not a product of size symbols")
        rest: int | E.Expr = coef // known
        for v in syms:
            rest = v if isinstance(rest, int) and rest == 1 else rest * v
        out[request.index(-1)] = rest
    elif syms:
        raise LoweringError("a view of constant sizes of an input of symbolic sizes")
    return out


def _slice_of_symbol(node: Any, const: Any, source: Sequence[int | E.Expr], d: int,
                     symbols: SizeSymbols | None) -> tuple[int | E.Expr, ...]:
    """A slice along a dim whose size is one symbol, of constant bounds that give a length of
    their own once the dim is long enough (`x[:, -1:]`, `x[:, 0:4]`, `x[:, -3:-1]`): that
    length, the symbol bound from below in the guard; else LoweringError. (A start counted
    from the end is the symbol's expression: `slice_`.)"""
    start, end, step = const(2), const(3), const(4)
    start = 0 if start is None else start
    end = 2**63 - 1 if end is None else end
    var, offset = _symbol_plus(source[d])
    if (node.kind() != "aten::slice" or symbols is None or step not in (1, None)
            or not isinstance(start, int) or not isinstance(end, int) or var is None):
        raise LoweringError(f"{node.kind()} along a dim of symbolic size")
    if start >= 0 and start < end < 2**62:
        length, least = end - start, end  # from the front
    elif start < 0 and (end >= 2**62 or start < end < 0):
        length, least = (-start if end >= 2**62 else end - start), -start  # from the end
    else:
        raise LoweringError("a slice along a dim of symbolic size, of a symbolic length")
    symbols.at_least(var, least - offset)
    return (*source[:d], length, *source[d + 1:])


def _symbol_plus(size: int | E.Expr) -> tuple[E.Var | None, int]:
    """`size` as a symbol plus an int (`s0`, a cat's `s0 + 1`), else (None, 0)."""
    if isinstance(size, E.Var):
        return size, 0
    if isinstance(size, E.Add):
        for a, b in ((size.a, size.b), (size.b, size.a)):
            if isinstance(a, E.Var) and isinstance(b, E.Imm):
                return a, int(b.value)  # type: ignore[arg-type]
    return None, 0


def view_sizes(node: Any, args: Sequence[Arg], symbols: SizeSymbols | None = None
               ) -> tuple[int | E.Expr, ...]:
    """In a dynamic kernel, the output sizes of view `node` (of `_SIZED_VIEWS`) as products of
    its input's sizes and the node's constants; LoweringError where they do not follow.
    `symbols`: the kernel's, which a slice along a symbol's dim bounds (`_slice_of_symbol`)."""
    source = args[0].shape if isinstance(args[0], TensorArg) else None
    if source is None:
        raise LoweringError(f"{node.kind()} of a non-tensor")
    kind, ndim = node.kind(), len(source)

    def const(k: int) -> Any:
        arg = args[k]
        return arg.value if isinstance(arg, ConstArg) else getattr(arg, "const", None)

    def dim(k: int, n: int = ndim) -> int:
        d = const(k)
        if not isinstance(d, int) or not -max(n, 1) <= d < max(n, 1):
            raise LoweringError(f"{kind}: dim {d} out of range")
        return d % max(n, 1)

    if kind in ("aten::view_as", "aten::reshape_as", "aten::expand_as"):
        other = args[1]
        if not isinstance(other, TensorArg):
            raise LoweringError(f"{kind} of a non-tensor")
        target: Any = list(other.shape)
    elif kind in ("aten::view", "aten::reshape"):
        return tuple(_inferred(source, const(1)))
    elif kind == "aten::flatten":
        if ndim == 0:
            return (1,)
        start, end = dim(1), dim(2)
        return (*source[:start], math.prod(source[start:end + 1], start=1), *source[end + 1:])
    elif kind == "aten::unflatten":
        d = dim(1)
        return (*source[:d], *_inferred((source[d],), const(2)), *source[d + 1:])
    elif kind == "aten::expand":
        target = const(1)
        if not isinstance(target, (list, tuple)) or len(target) < ndim:
            raise LoweringError("expand's sizes are not constants")
    else:  # a slice, narrow or select along a dim of static size
        d = dim(1)
        whole = kind == "aten::slice" and const(2) in (0, None) and const(4) in (1, None) and (
            const(3) is None or const(3) >= 2**62)  # x[:, 1:] slices dim 0 whole first
        if whole:
            return tuple(source)
        if not isinstance(source[d], int):
            return _slice_of_symbol(node, const, source, d, symbols)
        out_size = getattr(node.output().type(), "sizes", lambda: None)()
        if kind == "aten::select":
            return (*source[:d], *source[d + 1:])
        if not out_size:
            raise LoweringError(f"{kind} without a complete output type")
        return (*source[:d], out_size[d], *source[d + 1:])
    lead = len(target) - ndim
    return (*target[:lead], *(
        s if t == -1 or t is s or (isinstance(t, int) and isinstance(s, int) and t == s)
        else t if isinstance(s, int) and s == 1 and isinstance(t, int)
        else _no_expand(kind)
        for s, t in zip(source, target[lead:])))


def _no_expand(kind: str) -> int:
    raise LoweringError(f"{kind} to a constant size of a symbolic dim")


def _check_dynamic(node: Any, lowering: Any) -> None:
    """LoweringError unless `node` can take symbolic sizes (a dynamic kernel): its lowering
    says so (`Lowering.dynamic`). Reductions raise later where a size they need is symbolic
    (the policy keeps the dims that do not change static, such as a softmax's extent); a cat
    whose lengths along its dim are symbols too (they may be 0)."""
    if not lowering.dynamic:
        raise LoweringError(f"{node.kind()} does not take symbolic sizes")


def lower_graph(
    graph: torch._C.Graph, dynamic: bool = False, static: frozenset[int] = frozenset()
) -> Lowered:
    """One loop nest per node of `graph`; see the module docstring. `dynamic`: sizes are
    symbols bound at run time (`size_symbols`) except those in `static`, or LoweringError."""
    state = _GraphLowering(graph, dynamic, static)
    inputs = _bind_inputs(state, graph)
    kernel_inputs = frozenset(inputs)
    graph_outputs = {v.unique() for v in outputs_of(graph)}
    for node in graph.nodes():
        if node.kind() == "prim::Constant":
            _lower_constant(state, node)
        elif node.kind() == "prim::ListConstruct":
            _lower_list(state, node)
        elif node.kind() in _SIZE_KINDS and _int_node(node):
            _lower_size(state, node)
        elif shape_checks.is_check_node(node):
            _lower_check(state, node)
        elif dynamic and node.kind() == "aten::copy_":
            raise LoweringError(f"{node.kind()} in a dynamic kernel")
        elif node.kind() == "aten::copy_":
            _lower_write_back(state, node, inputs)
        elif node.kind() in EXTERNAL_KINDS:
            _lower_external(state, node, kernel_inputs, graph_outputs)
        elif any(v.unique() in state.folded for v in outputs_of(node)):
            continue
        else:
            _lower_node(state, node, kernel_inputs, graph_outputs)
    outputs = _collect_outputs(state, graph)
    out_bufs = tuple(dict.fromkeys(o.buf for o in outputs if isinstance(o, ComputedOutput)))
    results = tuple(c.buf for c in state.externals)
    symbols = tuple(state.symbols.symbols) if state.symbols is not None else ()
    return Lowered(
        stmt=S.Block((*state.nests, *state.write_backs)),
        params=(*inputs, *(b for b, _ in state.constants), *results, *out_bufs,
                *(s.var for s in symbols)),
        inputs=inputs,
        constants=tuple(state.constants),
        outputs=outputs,
        output_metas=MappingProxyType(dict(state.output_metas)),
        input_metas=tuple(state.metas[v.unique()] if is_tensor(v) else None
                          for v in inputs_of(graph)),
        name=_kernel_name(state.ops),
        checks=tuple(state.checks),
        written=tuple(sorted(set(state.written.values()))),
        write_sources=tuple(state.write_sources),
        externals=tuple(state.externals),
        symbols=symbols,
        guards=tuple(state.symbols.guards) if state.symbols is not None else (),
        equal=tuple(state.symbols.equal) if state.symbols is not None else (),
    )


def _view_of_input(state: _GraphLowering, arg: TensorArg, indices: Sequence[E.Expr],
                   inputs: Sequence[Buf | E.Var]) -> tuple[Buf, tuple[E.Expr, ...]]:
    """The input buffer and indices that element `indices` of `arg` is, when `arg` is an
    input or a chain of views of one (each nest a single load: index arithmetic)."""
    buf, idx = arg.buf, tuple(indices)
    while buf not in inputs:
        found = next((d for n in state.nests if (d := definition(n)) and d[0] is buf), None)
        if found is None or not isinstance(found[2], E.Load):
            raise LoweringError("a write-back into something other than a view of an input")
        _, vars_, load = found
        idx = tuple(substitute(i, dict(zip(vars_, idx))) for i in load.indices)
        buf = load.buf
    return buf, idx


def _lower_write_back(state: _GraphLowering, node: Any, inputs: Sequence[Buf | E.Var]) -> None:
    """`copy_(dst, src)` with dst a graph input or a view of one (`jit/fuser/inplace.py`): a nest,
    run after all others, storing src (broadcast, cast) into the input's buffer."""
    dst, src = (state.env[node.inputsAt(k).unique()] for k in (0, 1))
    if not isinstance(dst, TensorArg) or not isinstance(src, TensorArg):
        raise LoweringError("copy_ of something other than tensors")
    if len(src.shape) > len(dst.shape) or any(
        s not in (1, d) for s, d in zip(reversed(src.shape), reversed(dst.shape))
    ):
        raise LoweringError("copy_ source does not broadcast to its destination")
    names = "ijklmnopqrstuvwxyz"
    idx = tuple(E.Var(names[k] if k < len(names) else f"i{k}") for k in range(len(dst.shape)))
    base, where = _view_of_input(state, dst, idx, inputs)
    offset = len(dst.shape) - len(src.shape)
    value = E.cast(base.dtype, E.Load(src.buf, tuple(
        E.imm(0) if size == 1 else idx[offset + k] for k, size in enumerate(src.shape))))
    nest: S.Stmt = S.Store(base, where, value)
    for k in reversed(range(len(dst.shape))):
        nest = S.For(idx[k], E.imm(0), E.imm(dst.shape[k]), nest)
    state.write_backs.append(nest)
    state.written[base] = inputs.index(base)
    if src.buf not in inputs:
        state.write_sources.append(src.buf)
    state.env[node.output().unique()] = dst


def _bind_inputs(state: _GraphLowering, graph: torch._C.Graph) -> tuple[Buf | E.Var, ...]:
    """A parameter per graph input: a buffer for a tensor (on the CPU), a variable for a
    number."""
    params: list[Buf | E.Var] = []
    guards = {g.position: g for g in state.symbols.guards} if state.symbols else {}
    for k, value in enumerate(inputs_of(graph)):
        debug = value.debugName()
        name = state.unique(f"t{k}" if debug.isdigit() else _sanitize(debug))
        if is_tensor(value):
            meta = state.metas[value.unique()]
            if meta.device.type != "cpu":
                raise LoweringError(f"input {name} is on {meta.device}, not the CPU")
            sizes, strides = (guards[k].sizes, guards[k].strides) if guards else (
                meta.sizes, meta.strides)
            buf = Buf.make(name, from_torch(meta.dtype), sizes, strides)
            state.env[value.unique()] = TensorArg(buf, sizes)  # type: ignore[arg-type]
            params.append(buf)
        else:
            var = _scalar_var(value, name)
            state.env[value.unique()] = ScalarArg(var)
            params.append(var)
    return tuple(params)


def _lower_constant(state: _GraphLowering, node: Any) -> None:
    """A constant is an operand: a tensor becomes a buffer bound at call time, a number an
    immediate, anything else (None, a dtype, a list) a value lowerings read."""
    value = node.output()
    ivalue = value.toIValue()
    if isinstance(ivalue, torch.Tensor):
        meta = TensorMeta.of(ivalue)
        # (in a dynamic kernel, one of fixed sizes is read only by elementwise ops along dims
        # of the same static sizes: `Ctx.load` checks it)
        fixed = state.symbols is not None and any(size != 1 for size in meta.sizes)
        buf = Buf.make(state.unique("const"), from_torch(meta.dtype), meta.sizes, meta.strides)
        state.constants.append((buf, ivalue))
        state.env[value.unique()] = TensorArg(buf, meta.sizes, fixed)
    elif isinstance(ivalue, (bool, int, float)):
        state.env[value.unique()] = ScalarArg(E.imm(ivalue, scalar_dtype(ivalue)), ivalue)
    else:
        state.env[value.unique()] = ConstArg(ivalue)


def _lower_node(
    state: _GraphLowering, node: Any, kernel_inputs: frozenset[Buf | E.Var], graph_outputs: set[int]
) -> None:
    """The loop nest computing each of `node`'s tensor outputs (one, or the lowering's
    `outputs`); a graph output is laid out with eager's strides and walked in memory order."""
    lowering, reason = lowering_for(node)
    if lowering is None:
        raise LoweringError(reason)
    if state.symbols is not None:
        _check_dynamic(node, lowering)
    outs = outputs_of(node)
    if len(outs) != lowering.outputs or not all(is_tensor(v) for v in outs):
        raise LoweringError(f"{node.kind()} must have {lowering.outputs} tensor output(s)")
    args = [state.env[v.unique()] for v in inputs_of(node)]
    is_cat = node.kind() in _CATS
    if node.kind() not in POINTWISE and any(isinstance(a, TensorArg) and a.fixed for a in args):
        raise LoweringError("a tensor constant of fixed sizes in a dynamic kernel, not read "
                            "by an elementwise op")
    op = node.kind().split("::")[-1]
    state.ops.append(op)
    shared: dict[str, Any] = {}
    for k, out in enumerate(outs):
        is_output = out.unique() in graph_outputs
        meta = state.metas.get(out.unique())
        if meta is None:
            raise LoweringError(f"no type for the output of {node.kind()}")
        if state.symbols is not None and node.kind() in _SIZED_VIEWS:
            sizes = state.symbols.derive(meta.sizes, view_sizes(node, args, state.symbols))
        elif state.symbols is not None and is_cat:
            sizes = state.symbols.derive(meta.sizes, _cat_sizes(node, args, state.symbols))
        else:
            sizes = state.sizes(meta)
        ctx = Ctx(node, args, from_torch(meta.dtype), sizes, (), kernel_inputs,  # type: ignore
                  state.checks, output=k, shared=shared)
        strides = meta.strides if state.symbols is None or not is_output else (
            state.symbols.dense(meta))  # (a view inside the group need not be dense)
        buf, nest = compute(
            state.unique(f"aten_{op}"),
            ctx.out_dtype,
            sizes,
            lambda *idx, ctx=ctx: lowering.fn(replace(ctx, indices=idx)),
            strides=strides if is_output else None,
            order=_layout_order(meta) if is_output else None,
        )
        if is_output:
            state.output_metas[buf] = meta
        state.env[out.unique()] = TensorArg(buf, sizes)  # type: ignore[arg-type]
        state.nests.extend(ctx.nests)  # the node's intermediates (a reduction's row statistics)
        state.nests.append(nest)


def _lower_external(
    state: _GraphLowering, node: Any, kernel_inputs: frozenset[Buf | E.Var], graph_outputs: set[int]
) -> None:
    """A GEMM or convolution: an `ExternalCall` into a buffer of its own, run before the loops
    (`lowerings/external.py`), with the activation or residual add after it when oneDNN
    fuses them; those nodes then lower to nothing."""
    args = [state.env[v.unique()] for v in inputs_of(node)]
    constants = dict(state.constants)
    sources = frozenset(b for b in (*kernel_inputs, *constants) if isinstance(b, Buf))

    def buf_of(value: Any) -> Buf:
        return state.env[value.unique()].buf  # type: ignore[union-attr]

    op = node.kind().split("::")[-1]
    symbols = state.symbols
    fused = lower_external(node, args, sources, constants, graph_outputs,
                           state.unique(f"aten_{op}"), buf_of,
                           *(() if symbols is None else (symbols.at,)))
    meta = state.metas[fused.value]
    # a dynamic kernel's: the result in the symbols, the routine run at another size too
    call = fused.call if symbols is None else symbols.external(fused.call, meta, constants)
    state.ops.append(op)
    how = ("oneDNN post-ops fused into the call" if fused.folded
           else "the epilogue runs over the whole output in the loops")
    _log.debug(f"{node.kind()} as {call.fn}: {how}")
    state.externals.append(call)
    state.folded |= fused.folded
    state.env[fused.value] = TensorArg(call.buf, state.sizes(meta))  # type: ignore[arg-type]
    if fused.bias is not None:
        _add_bias(state, replace(fused, call=call), graph_outputs)


def _add_bias(state: _GraphLowering, fused: Any, graph_outputs: set[int]) -> None:
    """The external node's value as the call's result plus the bias that its loops add
    (broadcast along the leading dims), a nest like any elementwise node's."""
    meta = state.metas[fused.value]
    result, bias = fused.call.buf, fused.bias
    sizes = state.sizes(meta)
    offset = len(meta.sizes) - bias.ndim
    is_output = fused.value in graph_outputs

    def body(*idx: E.Expr) -> E.Expr:
        at = tuple(E.imm(0) if E.is_const(d, 1) else idx[offset + k]
                   for k, d in enumerate(bias.dims))
        return E.Load(result, idx) + E.Load(bias, at)

    strides = meta.strides if state.symbols is None or not is_output else (
        state.symbols.dense(meta))
    buf, nest = compute(state.unique(result.name), result.dtype, sizes, body,
                        strides=strides if is_output else None,
                        order=_layout_order(meta) if is_output else None)
    if is_output:
        state.output_metas[buf] = meta
    state.env[fused.value] = TensorArg(buf, sizes)  # type: ignore[arg-type]
    state.nests.append(nest)


def _collect_outputs(
    state: _GraphLowering, graph: torch._C.Graph
) -> tuple[ComputedOutput | InputOutput, ...]:
    """Per graph output: the buffer that computes it, or the graph input it returns."""
    input_index = {v.unique(): k for k, v in enumerate(inputs_of(graph))}
    outputs: list[ComputedOutput | InputOutput] = []
    for value in outputs_of(graph):
        if value.unique() in input_index:
            outputs.append(InputOutput(input_index[value.unique()]))
            continue
        arg = state.env.get(value.unique())
        if isinstance(arg, TensorArg) and arg.buf in state.written:  # a write-back's result
            if not is_tensor(value) or value.node().inputsAt(0).node().kind() != "prim::Param":
                raise LoweringError("a write-back into a view of an input is returned")
            outputs.append(InputOutput(state.written[arg.buf]))
            continue
        results = [c.buf for c in state.externals]
        if isinstance(arg, TensorArg) and arg.buf in results:  # an external call's result
            outputs.append(InputOutput(len(input_index) + results.index(arg.buf)))
            continue
        if not isinstance(arg, TensorArg) or arg.buf not in state.output_metas:
            raise LoweringError("graph outputs must be tensors computed by the graph")
        outputs.append(ComputedOutput(arg.buf))
    return tuple(outputs)


def _kernel_name(ops: Sequence[str]) -> str:
    """`fused_` and the first four ops (`fused_mul_sin_mul`): the name in logs and op kinds."""
    name = "fused_" + "_".join(ops[:4]) if ops else "fused"
    return _sanitize(name[:60])

