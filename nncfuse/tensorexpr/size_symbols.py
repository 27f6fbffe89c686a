"""size_symbols: the sizes of a dynamic kernel as symbols bound from its inputs at run time.

A dynamic kernel is lowered from a graph typed for one example signature,
with every size other than 1 replaced by a symbol `s0, s1, ...` (an INDEX
`Var`): one symbol per distinct size value among the tensor inputs, so that
inputs whose sizes were equal share a symbol. Sizes of 1 stay immediates
(they broadcast), and so do the sizes the policy keeps static (the dims that
did not change, such as the extent of a reduction). Strides become
expressions of the symbols: an input's layout class is row-major over its
dims that are not broadcast (stride 0).

    x : Float(8, 1000), y : Float(1000)      x : [s0, s1] strides [s1, 1]
                                     ->      y : [s1] strides [1]
    out : Float(8, 1000)                     out : [s0, s1] strides [s1, 1]

What the kernel relies on is its guard (`InputGuard`, one per tensor input):
the dtype, the CPU, requires_grad, the rank, which dims are 1, which dims
equal which symbol, and the strides as expressions of the symbols (checked on
dims longer than 1, the only ones whose stride matters). Not the sizes.
`codegen/entry.py` defines it and `SizeSymbol` (the calling convention), checks
it on every call, binds the symbols and passes them to the compiled code; this
module, above codegen, makes them.

Only ops whose output sizes are broadcasts of their inputs' (elementwise ops,
casts) can be lowered this way, and views whose sizes follow from their
input's (`graph_lowering.view_sizes`: a `-1` in a view's sizes, a flatten, a
slice along a static dim), whose output sizes may be products of symbols
(`derive`):

    x : [s0, 64] .view(-1, 4, 16) .flatten(1)   ->   [s0, 4, 16]  ->  [s0, 64]
    x : [s0, 256] .flatten()                    ->   [s0 * 256]

`graph_lowering` checks that, and any size it cannot express (a view's constant
size where a symbol is, a reduction along a symbol) raises `LoweringError`:
the group then gets a static kernel.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

import torch

from . import expr as E
from . import stmt as S
from .buffer import Buf
from .codegen.entry import InputGuard, Size, SizeSymbol
from .dtype import INDEX
from .lowerings import LoweringError
from .lowerings.external import trial
from .lowerings.shapes import monomial
from .meta import TensorMeta


def _mul(a: Size, b: Size) -> Size:
    """`a * b`, folded where either is the int 1."""
    if isinstance(a, int) and isinstance(b, int):
        return a * b
    if isinstance(a, int) and a == 1:
        return b
    if isinstance(b, int) and b == 1:
        return a
    return E.as_expr(a, INDEX) * E.as_expr(b, INDEX)


def evaluate(size: Size, values: dict[E.Var, int]) -> int:
    """`size`, an int or a product/sum of symbols, at the symbols' `values`."""
    if isinstance(size, int):
        return size
    if isinstance(size, E.Imm):
        return int(size.value)  # type: ignore[arg-type]
    if isinstance(size, E.Var):
        return values[size]
    if isinstance(size, E.Mul):
        return evaluate(size.a, values) * evaluate(size.b, values)
    if isinstance(size, E.Add):
        return evaluate(size.a, values) + evaluate(size.b, values)
    raise LoweringError(f"size expression {size} is not supported")


def row_major(meta: TensorMeta) -> bool:
    """Whether `meta`'s strides are row-major where they matter (dims above 1, elements)."""
    expect = 1
    for size, stride in zip(reversed(meta.sizes), reversed(meta.strides)):
        if size == 0:
            return True
        if size > 1 and stride != expect:
            return False
        expect *= size
    return True


class SizeSymbols:
    """The symbols of one kernel, made from its tensor inputs' example metadata."""

    def __init__(
        self, inputs: Sequence[tuple[int, TensorMeta]], static: frozenset[int] = frozenset()
    ):
        """`static`: sizes that stay ints (dims that did not change: a reduction's extent)."""
        self._by_value: dict[int, E.Var] = {}
        self.static = static
        self.symbols: list[SizeSymbol] = []
        self.guards: list[InputGuard] = []
        #: (a sum, a symbol) equal at the example and taken as equal: checked at run time
        self.equal: list[tuple[E.Expr, E.Var]] = []
        for position, meta in inputs:
            for d, size in enumerate(meta.sizes):
                if size != 1 and size not in static and size not in self._by_value:
                    var = E.Var(f"s{len(self.symbols)}")
                    self._by_value[size] = var
                    self.symbols.append(SizeSymbol(var, position, d))
        self.values = {s: v for v, s in self._by_value.items()}
        for position, meta in inputs:
            self.guards.append(InputGuard(position, self.sizes(meta), self._strides(meta),
                                          meta.dtype, meta.requires_grad))

    def sizes(self, meta: TensorMeta, derived: bool = False) -> tuple[Size, ...]:
        """`meta`'s sizes, each 1, static or its symbol; with `derived` (a cat's output, whose
        lengths along its dim are static: the cat checks), a size no input has stays an int,
        else it is a LoweringError."""
        out: list[Size] = []
        for size in meta.sizes:
            if size == 1 or size in self.static:
                out.append(size)
            elif size in self._by_value:
                out.append(self._by_value[size])
            elif derived:  # static from now on, for the nodes that use the cat's output
                self.static = self.static | {size}
                out.append(size)
            else:
                raise LoweringError(f"size {size} is not the size of an input")
        return tuple(out)

    def derive(self, example: Sequence[int], sizes: Sequence[Size]) -> tuple[Size, ...]:
        """A view's output `sizes` (ints, symbols or products of them: `view_sizes`), whose
        values at the example are `example`: learnt, so that nodes after the view map those
        values to them (`sizes`). LoweringError where that would be ambiguous: an int that is
        also a symbol's value, a product whose value is 1, static or another product's."""
        out: list[Size] = []
        for value, size in zip(example, sizes, strict=True):
            if isinstance(size, E.Add):  # a cat's length along a dim of symbolic lengths
                out.append(self._sum(value, size))
                continue
            if not isinstance(size, int) and not monomial(size)[1]:
                size = monomial(size)[0]  # a product of ints
            if evaluate(size, self.values) != value:
                raise LoweringError(f"view size {size} is not {value} at the example")
            if isinstance(size, int):
                if size != 1 and size in self._by_value:
                    raise LoweringError(f"view size {size} is also a size symbol's value")
                if size != 1:
                    self.static = self.static | {size}
            elif value == 1 or value in self.static:
                raise LoweringError(f"view size {size} has the static value {value}")
            elif value not in self._by_value:
                self._by_value[value] = size
            elif monomial(self._by_value[value]) != monomial(size):
                raise LoweringError(f"view sizes {size} and {self._by_value[value]} are equal")
            else:
                size = self._by_value[value]  # the same product: the same expression
            out.append(size)
        return tuple(out)

    def _sum(self, value: int, size: E.Add) -> Size:
        """`size`, a sum of products of symbols whose value at the example is `value`, learnt
        as `derive` learns a product (the same sum, or a LoweringError where that value
        already stands for another size). Where it stands for an input's symbol, the sum is
        that symbol, and the kernel checks that they are equal when it runs (`equal`): a
        decode step's cache grown by a row (`s1 + 1`) and its mask (`s0`), which are."""
        if evaluate(size, self.values) != value:
            raise LoweringError(f"size {size} is not {value} at the example")
        if value == 1 or value in self.static:
            raise LoweringError(f"size {size} has the static value {value}")
        known = self._by_value.setdefault(value, size)  # type: ignore[arg-type]
        if known != size:
            if not isinstance(known, E.Var):
                raise LoweringError(f"sizes {size} and {known} are equal at the example")
            if (size, known) not in self.equal:
                self.equal.append((size, known))
        return known

    def at_least(self, var: E.Var, minimum: int) -> None:
        """Make the kernel's entry run the fallback when symbol `var` is below `minimum`
        (`SizeSymbol.minimum`); LoweringError if the example is."""
        if self.values[var] < minimum:
            raise LoweringError(f"size {var} is below {minimum} at the example")
        self.symbols = [replace(s, minimum=max(s.minimum, minimum)) if s.var is var else s
                        for s in self.symbols]

    def _strides(self, meta: TensorMeta) -> tuple[Size, ...]:
        """An input's strides as expressions: row-major over its non-broadcast dims, or else
        (`_strided`) what a view of a row-major tensor has."""
        sizes = self.sizes(meta)
        out: list[Size] = []
        acc: Size = 1
        empty = 0 in meta.sizes  # no element is read: any strides will do
        for size, sym, stride in zip(reversed(meta.sizes), reversed(sizes), reversed(meta.strides)):
            if size != 1 and stride == 0 and not empty:
                out.append(0)
                continue
            if size > 1 and stride != evaluate(acc, self.values) and not empty:
                return self._strided(meta, sizes)
            out.append(acc)
            acc = _mul(acc, sym)
        return tuple(reversed(out))

    def _strided(self, meta: TensorMeta, sizes: Sequence[Size]) -> tuple[Size, ...]:
        """The strides of an input laid out otherwise (a transpose, a slice of the last dim,
        a head split of one: `q` of attention, (1, 4, s0, 64) with strides (768 * s0, 64,
        768, 1)), per dim above 1: its example stride over the symbols among the sizes of
        the dims inside it in memory (a smaller stride), times those symbols; 0 for a
        broadcast. LoweringError if that does not divide (the layout gets a static kernel).

            (s0, s1) strides (1, s0)           ->  1, s0            (a transpose)
            (1, 4, s0, 64) strides (.., 64, 768, 1)  ->  .., 64, 768, 1   (static: a slice)
        """
        out: list[Size] = []
        for d, (size, stride) in enumerate(zip(meta.sizes, meta.strides)):
            if size == 1 or stride == 0:
                out.append(0 if size != 1 else stride)
                continue
            inner: Size = 1
            for e, (other, sym) in enumerate(zip(meta.strides, sizes)):
                if e != d and meta.sizes[e] > 1 and 0 < other < stride and not isinstance(sym, int):
                    inner = _mul(inner, sym)
            value = evaluate(inner, self.values)
            if value == 0 or stride % value:
                raise LoweringError("an input's layout is not a view of a row-major tensor")
            out.append(_mul(stride // value, inner))
        return tuple(out)

    def dense(self, meta: TensorMeta) -> tuple[Size, ...]:
        """`meta`'s strides (an output's) as expressions of its symbolic sizes: dense in the
        order of its strides (row-major, or permuted as eager lays out the result of a
        transpose); else LoweringError."""
        sizes = self.sizes(meta)
        order = sorted(range(len(sizes)), key=lambda d: (meta.strides[d], -d))
        out: list[Size] = [1] * len(sizes)
        acc: Size = 1
        empty = 0 in meta.sizes
        for d in order:  # innermost first
            if meta.sizes[d] > 1 and meta.strides[d] != evaluate(acc, self.values) and not empty:
                raise LoweringError("an output's layout is not dense")
            out[d] = acc
            acc = _mul(acc, sizes[d])
        return tuple(out)

    def at(self, buf: Buf, values: Mapping[E.Var, int] | None = None
           ) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """`buf`'s sizes and strides at `values` of the symbols (by default the example's)."""
        values = self.values if values is None else values
        return (tuple(evaluate(d, values) for d in buf.dims),  # type: ignore[arg-type]
                tuple(evaluate(d, values) for d in buf.strides))  # type: ignore[arg-type]

    def external(self, call: S.ExternalCall, meta: TensorMeta,
                 constants: dict[Buf, torch.Tensor]) -> S.ExternalCall:
        """`call`, tried at the example (`lower_external`), with its result declared in the
        symbols (`meta`: the graph's type of it): its sizes and dense strides, checked
        against what the routine returns at the example and at other values of the symbols
        (a GEMM's result sizes are its operands'); else LoweringError."""
        sizes, strides = self.sizes(meta), self.dense(meta)
        buf = Buf.make(call.buf.name, call.buf.dtype, sizes, strides)
        want = self.at(buf)
        got = (tuple(d.value for d in call.buf.dims), tuple(d.value for d in call.buf.strides))
        other: dict[E.Var, int] = {}
        taken = set(self.static) | set(self.values.values())
        for var, value in self.values.items():
            other[var] = value + 3
            while other[var] in taken:
                other[var] += 1
            taken.add(other[var])
        result = trial(call, constants, lambda b: self.at(b, other))
        for (sizes_a, strides_a), (sizes_b, strides_b) in (
                (want, got), (self.at(buf, other), (tuple(result.shape), result.stride()))):
            if sizes_a != sizes_b or any(
                    n > 1 and a != b for n, a, b in zip(sizes_a, strides_a, strides_b)):
                raise LoweringError(f"{call.fn}'s result is not {sizes} (strides {strides}) "
                                    "at every size")
        return replace(call, buf=buf)
