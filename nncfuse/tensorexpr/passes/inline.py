"""inline_intermediates: replace the one load of a temporary by the expression defining it.

    for i: aten_mul[i] = t0[i] * t0[i];
    for i: aten_sin[i] = sin(aten_mul[i]);    ->   for i: aten_sin[i] = sin(t0[i] * t0[i]);
    for i: out[i] = aten_sin[i] * aten_sin[i];     for i: out[i] = aten_sin[i] * aten_sin[i];
Each temporary defined by a `compute` nest, not a kernel output, and loaded
exactly once by the later nests is substituted there, and its nest is
dropped. A temporary loaded more than once stays: substituting it would copy
its expression once per load, and chains of such values (`lerp(x, x, x)`
nested) would grow exponentially. `fuse_loops` then puts it in the same loop
as its readers, `eliminate_common_subexpressions` turns its loads into a
`Let`, and `eliminate_dead_stores` drops its stores.

A copy (the definition is one load, as a transpose, an expand or a clone makes
it: `tmp[j, k, l] = mm[k, 64 * j + l]`) is substituted into every load of it,
however many: a load replaces a load, and the copy is not made (Llama's rotary
embedding read each transposed q and k copy three times). Only where the copy
keeps its rows: the source steps by one element (or none) with the copy's
innermost index, so that its readers' vectors stay contiguous (a copy that
transposes its innermost dimension stays, for `tile_transposes`), and no
later nest stores into the source.

    for j, k, l: tmp[j, k, l] = mm[k, 64 * j + l];
    for j, k, l: out[j, k, l] = tmp[j, k, l] * c[k, l] + tmp[j, k, (l + 32) % 64];
becomes
    for j, k, l: out[j, k, l] = mm[k, 64 * j + l] * c[k, l] + mm[k, 64 * j + (l + 32) % 64];

One exception: an expensive definition (a transcendental call, a `Reduce`)
read by a nest that runs more often than the temporary has elements (a
broadcast, such as a row sum read by every element of its row) would be
recomputed for every reuse, so that temporary stays a buffer.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from .. import expr as E
from .. import stmt as S
from ..buffer import Buf
from ..ir_visitor import Mutator, substitute, walk
from ..loopnest import Nest, as_block, buffers_stored, definition, extent, loads
from .simplify import coefficient, simplify


def _expensive(value: E.Expr) -> bool:
    """Whether `value` calls a function that is not `cheap` (its `ops` row), or reduces."""
    return any(
        isinstance(n, E.Reduce) or (isinstance(n, E.Call) and not n.row.cheap) for n in walk(value)
    )


def _runs_more(consumer: S.Stmt, nest: S.Stmt) -> bool:
    """Whether `consumer` runs more iterations than `nest`; with symbolic bounds (a dynamic
    kernel), unless both have the same loop extents."""
    a, b = extent(consumer), extent(nest)
    if a is not None and b is not None:
        return a > b
    trips = [sorted(map(str, (loop.stop - loop.start for loop in Nest.of(n).loops)))
             for n in (consumer, nest)]
    return trips[0] != trips[1]


def _row_copy(indices: tuple[E.Var, ...], value: E.Expr) -> bool:
    """Whether `value`, a nest's stored value at `indices`, is a load of another buffer whose
    element steps by 0 or 1 with the innermost index (and no other index moves with it)."""
    if not isinstance(value, E.Load) or not indices or value.buf.dtype != value.dtype:
        return False
    inner = indices[-1]
    offset: E.Expr = E.imm(0)
    for index, stride in zip(value.indices, value.buf.strides):
        offset = offset + index * stride
    return coefficient(simplify(offset), inner) in (0, 1)  # a view's `a / n * n + a % n`


class _Inline(Mutator):
    def __init__(self, buf: Buf, indices: tuple[E.Var, ...], value: E.Expr):
        self.buf, self.indices, self.value = buf, indices, value

    def mutate_Load(self, e: E.Load) -> E.Expr:
        e = self.generic_mutate(e)
        if e.buf.root is not self.buf:
            return e
        return substitute(self.value, dict(zip(self.indices, e.indices)))


def inline_intermediates(stmt: S.Stmt, outputs: Iterable[Buf] = ()) -> S.Stmt:
    """Inline every temporary defined by a `compute` nest; see the module docstring."""
    keep = {b.root for b in outputs}
    nests = list(as_block(stmt).stmts)
    # Per nest, how often it loads each buffer, kept up to date as values are inlined: one
    # walk of each nest, not one of every later nest per temporary (MobileNetV2's backward
    # graphs have groups of hundreds of nests).
    reads = [Counter(ld.buf.root for ld in loads(n)) for n in nests]
    result: list[S.Stmt] = []
    changed = False
    for k, nest in enumerate(nests):
        found = definition(nest)
        if found is None or found[0] in keep:
            result.append(nest)
            continue
        buf, indices, value = found
        consumers = [j for j in range(k + 1, len(nests)) if buf in reads[j]]
        if sum(reads[j][buf] for j in consumers) != 1:
            if consumers and _row_copy(indices, value) and not any(
                    {buf, value.buf.root} & buffers_stored(n) for n in nests[k + 1:]):
                for j in consumers:  # each load of the copy becomes a load of its source
                    nests[j] = _Inline(buf, indices, value).mutate(nests[j])
                    reads[j][value.buf.root] += reads[j].pop(buf)
                changed = True
                continue
            result.append(nest)
            continue
        if _expensive(value) and any(_runs_more(nests[j], nest) for j in consumers):
            result.append(nest)
            continue
        (j,) = consumers  # its one load becomes `value`, which loads what `value` loads
        nests[j] = _Inline(buf, indices, value).mutate(nests[j])
        del reads[j][buf]
        reads[j].update(ld.buf.root for ld in loads(value))
        changed = True
    if not changed:
        return stmt
    return S.Block(tuple(result))
