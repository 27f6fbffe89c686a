"""vectorize_reductions: reduce along a contiguous axis with vector accumulators.

    out[i] = reduce_add(0.f, x[100 * i + r] for r < 100);
->  out[i] = reduce_add(0.f + lanes_add(reduce_add(Broadcast(-0.f, 32),
                 x[Ramp(100 * i + 32 * r, 1, 32)] for r < 3)),
                 x[100 * i + r_1 + 96] for r_1 < 4);
A scalar `Reduce` whose innermost variable addresses its loads with unit
stride runs `lanes` elements at a time: `ACCUMULATORS` registers' worth of
lanes, each an independent partial result (the adds of one lane do not wait
for the others'), combined pairwise at the end (`LaneReduce`), then the
scalar tail. Sums (and products) of more than `BLOCK` vectors per lane are
also blocked: each block starts from zero and the blocks' results are summed,
a two-level cascade, so a float32 sum of millions of elements stays within
eager's (cascade) error instead of drifting as one serial accumulator does.

Axes over dense memory are merged first (`r0 * 64 + r1` -> one axis of
`64 * n`), so that a full reduction is one long contiguous axis. Reductions
over strided (outer) dims are only blocked (a long sum as a sum of
`BLOCK`-point sums) and left to `vectorize_inner_loops`, which vectorizes
across the kept inner dim instead; here, an innermost loop of such
reductions is widened to `ACCUMULATORS` registers of columns first (a tail
of fewer columns is left to `vectorize_inner_loops`); fewer columns than that, in an
outer loop, fill as many registers as they can, and their sums walk `ACCUMULATORS`
rows per step (`row_steps`: the adds that wait for the accumulator are fewer, a
step's float products chained in fused multiply-adds); in a loop of more columns, sums of
products of converted integers walk rows in steps too, for the fused multiply-adds (one
operation a point, not two: int4 products' 64 columns of a row block). A top-level
loop over the columns of a blocked column sum walks the rows instead, in memory order, into
partial sums per block of rows (`_by_rows`, which shows the loops). Run on flat
indices, before `vectorize_inner_loops`.

Over a symbolic extent (a dynamic kernel's) the counts are computed at run
time, and each part may be empty; a sum is blocked whatever its length:

    out[i] = reduce_add(0.f, x[s1 * i + r] for r < s1);
->  out[i] = reduce_add(0.f + lanes_add(<blocks of 64 vectors of 64 lanes, s1 / 64 in all>)
                 + lanes_add(reduce_add(Broadcast(-0.f, 16), x[Ramp(.., 1, 16)]
                     for r < (s1 - 64 * (s1 / 64)) / 16)),
                 x[s1 * i + r_1 + ..] for r_1 < s1 - ..);
"""

from __future__ import annotations

from collections.abc import Callable

from .. import expr as E
from .. import stmt as S
from ..buffer import Buf
from ..dtype import INDEX
from ..ir_visitor import Mutator, children, replace_node, substitute, walk
from ..linear_form import linear
from ..loopnest import as_block
from .parallelize import GRAIN
from .simplify import simplify
from .vectorize import _Unvectorizable, _Widen, lanes_for, vectorize_inner_loops

#: Vector registers per reduction: independent accumulators, to hide the add's latency.
ACCUMULATORS = 4
#: Vectors each lane sums before a block's partial result joins the total (the cascade).
BLOCK = 64


def merge_axes(e: E.Reduce) -> E.Reduce:
    """Adjacent axes whose body is dense across both become one axis (innermost first)."""
    while len(e.vars) >= 2:
        (outer, inner), (n_outer, n_inner) = e.vars[-2:], e.stops[-2:]
        if not (isinstance(n_outer, E.Imm) and isinstance(n_inner, E.Imm)):
            return e
        fused = E.Var(outer.name)
        body = substitute(e.body, {outer: fused / n_inner, inner: fused % n_inner})
        candidate = E.Reduce(e.op, e.init, body, (*e.vars[:-2], fused),
                             (*e.stops[:-2], E.imm(n_outer.value * n_inner.value)))
        candidate = simplify(candidate)
        if not isinstance(candidate, E.Reduce) or any(
            isinstance(n, (E.Div, E.Mod)) and n.dtype == INDEX and any(m is fused for m in walk(n))
            for n in walk(candidate.body)
        ):
            return e
        e = candidate
    return e


def _contiguous(body: E.Expr, var: E.Var) -> bool:
    """Every load that depends on `var` steps one element per increment of it."""
    depends = False
    for n in walk(body):
        if isinstance(n, E.Load) and any(m is var for i in n.indices for m in walk(i)):
            depends = True
            if len(n.indices) != 1 or linear(n.indices[0]).terms.get(var) != 1:
                return False
    return depends


def _blocked(e: E.Reduce) -> E.Reduce:
    """A long sum over one strided axis as a sum of sums of `BLOCK` points (the cascade),
    for a column sum, which `vectorize_inner_loops` then widens across the columns."""
    if len(e.vars) != 1:
        return e
    (var,), (stop,) = e.vars, e.stops
    if e.op != "Add" or isinstance(stop, E.Imm) and stop.value < 2 * BLOCK:  # type: ignore
        return e
    if isinstance(stop, E.Imm):
        blocks, rest = (E.imm(n) for n in divmod(stop.value, BLOCK))  # type: ignore[operator]
    else:  # a symbolic extent: the split is computed at run time
        blocks = stop / BLOCK
        rest = stop - blocks * BLOCK
    block, within = E.Var(var.name), E.Var(var.name)
    zero = E.identity(e.op, e.dtype)
    inner = E.Reduce(e.op, zero, substitute(e.body, {var: block * BLOCK + within}),
                     (within,), (E.imm(BLOCK),))
    total = E.Reduce(e.op, e.init, inner, (block,), (blocks,))
    if E.is_const(rest, 0):
        return total
    tail = E.Var(var.name)
    body = substitute(e.body, {var: tail + blocks * BLOCK})
    return E.Reduce(e.op, total, body, (tail,), (rest,))


class _VectorizeReductions(Mutator):
    def __init__(self, vector_bits: int):
        self.vector_bits = vector_bits
        self.depth = 0  # of the loop being mutated

    def mutate_For(self, s: S.For) -> S.Stmt:
        """An innermost loop over the kept columns of column reductions: `ACCUMULATORS`
        registers' worth of columns at a time, each row's slice loaded in one go. Fewer
        columns than that (a static count), in an outer loop: as many registers as they
        fill (a power of two), each sum walking `ACCUMULATORS` rows per step (`row_steps`;
        int4 products' 32 columns of a group: 0.187 -> 0.153 ms for a 2816 x 1024 weight).
        (A top-level loop keeps the order of its additions: `_by_rows` walks such sums by
        rows, to the same results.)"""
        self.depth += 1
        body = self.mutate(s.body)
        self.depth -= 1
        new = s if body is s.body else S.For(s.var, s.start, s.stop, body, s.parallel)
        columns = [n for n in walk(body) if isinstance(n, E.Reduce)]
        if not columns or any(isinstance(n, (S.For, E.Ramp)) for n in walk(body)):
            return new
        registers = ACCUMULATORS
        if self.depth and isinstance(s.start, E.Imm) and isinstance(s.stop, E.Imm):
            count = s.stop.value - s.start.value  # type: ignore[operator]
            lanes = lanes_for(body, self.vector_bits)
            while registers > 1 and count < registers * lanes:
                registers //= 2
        # (a loop of more columns: only sums of products of converted integers walk rows in
        # steps, whose products then chain in fused multiply-adds: one operation a point)
        new = _RowSteps(s.var, products=registers == ACCUMULATORS).mutate(new)
        return new if registers < 2 else vectorize_inner_loops(new, self.vector_bits * registers)

    def mutate_Reduce(self, e: E.Reduce) -> E.Expr:
        e = self.generic_mutate(e)
        if e.dtype.lanes != 1 or any(isinstance(n, E.Ramp) for n in walk(e.body)):
            return e
        e = merge_axes(e)
        var, stop = e.vars[-1], e.stops[-1]
        if not _contiguous(e.body, var):
            return _blocked(e)
        native = lanes_for(e.body, self.vector_bits)
        if not isinstance(stop, E.Imm):
            return self.symbolic(e, native)
        count = stop.value
        if native < 2 or count < native:  # type: ignore[operator]
            return e
        wide = native
        while wide * 2 <= native * ACCUMULATORS and wide * 2 <= count:  # type: ignore
            wide *= 2
        try:
            parts = [self.vector_reduce(e, wide, count // wide, 0)]  # type: ignore[operator]
            done = count // wide * wide  # type: ignore[operator]
            if count - done >= native:  # type: ignore[operator]
                n = (count - done) // native  # type: ignore[operator]
                parts.append(self.vector_reduce(e, native, n, done))
                done += n * native
        except _Unvectorizable:
            return e
        if done == count:
            return _total(e, parts)
        return _tail(e, _total(e, parts), E.imm(done))

    def symbolic(self, e: E.Reduce, native: int) -> E.Expr:
        """A reduction over a symbolic extent (a dynamic kernel's `s0`): vectors of all the
        accumulators' lanes, then of one register's, then the scalar tail, each count
        computed at run time (any of them may be 0)."""
        count = e.stops[-1]
        if native < 2:
            return e
        wide = native * ACCUMULATORS
        try:
            first = count / wide
            parts = [self.vector_reduce(e, wide, first, E.imm(0))]
            done = first * wide
            second = (count - done) / native
            parts.append(self.vector_reduce(e, native, second, done, block=False))  # < 4
            done = done + second * native
        except _Unvectorizable:
            return e
        return _tail(e, _total(e, parts), simplify(done))

    def vector_reduce(self, e: E.Reduce, lanes: int, vectors: int | E.Expr,
                      offset: int | E.Expr, block: bool = True) -> E.Expr:
        """Partial results of points `offset` to `offset + vectors * lanes` of the innermost
        axis (every point of the outer ones), `lanes` lanes wide; a sum of many vectors (or
        of a symbolic count, unless not `block`) in blocks."""
        var = e.vars[-1]
        outer = {v: E.Var(v.name) for v in e.vars[:-1]}
        source = substitute(e.body, outer)
        outer_vars, outer_stops = tuple(outer.values()), e.stops[:-1]
        zero = E.identity(e.op, e.dtype.with_lanes(lanes))

        def widened(first: E.Expr) -> E.Expr:
            return _Widen(var, E.Ramp(first + offset, E.imm(1), lanes)).expr(source)

        static = isinstance(vectors, int)
        # a symbolic count is blocked whatever it is at run time (the blocks may be none)
        blocked = block and e.op in ("Add", "Mul") and not outer and (
            not static or vectors >= 2 * BLOCK)
        count = E.imm(vectors) if isinstance(vectors, int) else vectors
        if not blocked:
            step = E.Var(var.name)
            return E.Reduce(e.op, zero, widened(step * lanes), (*outer_vars, step),
                            (*outer_stops, count))
        blocks = E.imm(vectors // BLOCK) if isinstance(vectors, int) else vectors / BLOCK
        block, within = E.Var(var.name), E.Var(var.name)
        body = widened((block * BLOCK + within) * lanes)
        inner = E.Reduce(e.op, zero, body, (within,), (E.imm(BLOCK),))
        acc = E.Reduce(e.op, zero, inner, (block,), (blocks,))
        rest = simplify(count - blocks * BLOCK)
        if not E.is_const(rest, 0):
            step = E.Var(var.name)
            body = widened((step + blocks * BLOCK) * lanes)
            acc = E.combine(e.op, acc, E.Reduce(e.op, zero, body, (step,), (rest,)))
        return acc


def _pairwise(op: str, parts: list[E.Expr]) -> E.Expr:
    """`parts` combined as a balanced tree: `(a + b) + (c + d)`."""
    while len(parts) > 1:
        pairs = [E.combine(op, a, b) for a, b in zip(parts[::2], parts[1::2])]
        parts = pairs + parts[len(pairs) * 2:]
    return parts[0]


def _step(parts: list[E.Expr]) -> E.Expr:
    """The sum of a step's points: float products as one product and fused multiply-adds
    (`fma(a, b, c)`, rounded once, as ATen's kernels fuse them: one operation a point, not
    two), other points pairwise."""
    if parts[0].dtype.is_float and all(isinstance(p, E.Mul) for p in parts):
        total = parts[0]
        for p in parts[1:]:
            total = E.call("fma", p.a, p.b, total)  # type: ignore[attr-defined]
        return total
    return _pairwise("Add", parts)


def row_steps(e: E.Reduce, rows: int = ACCUMULATORS) -> E.Reduce:
    """A sum whose innermost axis is walked `rows` points per step: the step's points summed
    (`_step`), then added to the accumulator, whose chain of dependent adds is `rows` times
    shorter (the points' sums do not wait for it); the last `stop % rows` points are a tail.

        reduce_add(-0.f, x[32 * r + j] for r < 10)
    ->  reduce_add(reduce_add(-0.f, x[128 * r_1 + j] + x[128 * r_1 + j + 32]
                                    + (x[128 * r_1 + j + 64] + x[128 * r_1 + j + 96])
                                    for r_1 < 2),
                   x[32 * r + j + 256] for r < 2)
        reduce_add(-0.f, a[r] * x[32 * r + j] for r < 8)
    ->  reduce_add(-0.f, fma(a[4 * r + 3], x[128 * r + j + 96], fma(a[4 * r + 2],
                   x[128 * r + j + 64], fma(a[4 * r + 1], x[128 * r + j + 32],
                   a[4 * r] * x[128 * r + j]))) for r < 2)

    Left as it is: a reduction other than a sum, one that contains another, or one of fewer
    than `2 * rows` points per row."""
    var, stop = e.vars[-1], e.stops[-1]
    if e.op != "Add" or any(isinstance(n, E.Reduce) for n in walk(e.body)) or (
            isinstance(stop, E.Imm) and stop.value < 2 * rows):  # type: ignore[operator]
        return e
    step = E.Var(var.name)
    body = _step([substitute(e.body, {var: step * rows + k}) for k in range(rows)])
    steps = E.imm(stop.value // rows) if isinstance(stop, E.Imm) else stop / rows  # type: ignore
    main = E.Reduce(e.op, e.init, body, (*e.vars[:-1], step), (*e.stops[:-1], steps))
    rest = simplify(stop - steps * rows)
    if E.is_const(rest, 0):
        return main
    return _tail(e, main, simplify(steps * rows))


class _RowSteps(Mutator):
    """The column sums of a loop over columns `var` (each load that moves with a column
    moves by one element), as `row_steps`."""

    def __init__(self, var: E.Var, products: bool = False):
        self.var, self.products = var, products

    def mutate_Reduce(self, e: E.Reduce) -> E.Expr:
        e = self.generic_mutate(e)
        if self.products:
            return row_steps(e) if _converted_product(e) else e
        return row_steps(e) if _contiguous(e.body, self.var) else e


def _converted_product(e: E.Reduce) -> bool:
    """Whether `e` sums float products of which one operand is converted from integers (a
    quantized weight's): fused multiply-adds spare an add per converted point, which bounds
    such sums (float products of floats are left in the order `_by_rows` keeps)."""
    body = e.body
    return isinstance(body, E.Mul) and e.dtype.is_float and any(
        isinstance(v, E.Cast) and not v.value.dtype.is_float for v in (body.a, body.b))


def _total(e: E.Reduce, parts: list[E.Expr]) -> E.Expr:
    """`e`'s initial value combined with the lanes of each vector part."""
    total = e.init
    for part in parts:
        total = E.combine(e.op, total, E.LaneReduce(e.op, part))
    return total


def _tail(e: E.Reduce, total: E.Expr, done: E.Expr) -> E.Expr:
    """The scalar tail of `e`'s innermost axis from point `done` on, from the vectors'
    `total`."""
    fresh = {v: E.Var(v.name) for v in e.vars}
    tail = substitute(e.body, {**fresh, e.vars[-1]: fresh[e.vars[-1]] + done})
    return E.Reduce(e.op, total, tail, tuple(fresh[v] for v in e.vars),
                    (*e.stops[:-1], simplify(e.stops[-1] - done)))


#: Column sums walk their rows in memory order (`_by_rows`) where the partial sums of each
#: block of rows take at most this many bytes (a 2-level cascade's first level).
ROW_PARTS_BYTES = 1 << 20


def _top_reduces(e: E.Expr) -> list[E.Reduce]:
    """The reductions in `e` that no other reduction in it contains."""
    if isinstance(e, E.Reduce):
        return [e]
    return [r for c in children(e) for r in _top_reduces(c)]  # type: ignore[arg-type]


def _by_rows(s: S.For, vectorizer: _VectorizeReductions) -> S.Stmt | None:
    """A top-level loop over the columns of a blocked column sum (`_blocked`), as the sums
    of each block of rows walked in memory order, a whole row at a time, then the blocks'
    totals per column; None where `s` is not one.

        for (j = 0; j < 1024; j++)
          out[j] = reduce_add(0.f, reduce_add(-0.f, x[65536 * r + 1024 * r_1 + j]
                                              for r_1 < 64) for r < 64);
    ->  for (r = 0; r < 64; r++) {
          for (j = 0; j < 1024; j++) out_rows[1024 * r + j] = -0.f;
          for (r_1 = 0; r_1 < 64; r_1++)
            for (j = 0; j < 1024; j++)
              out_rows[1024 * r + j] = out_rows[1024 * r + j] + x[65536 * r + 1024 * r_1 + j];
        }
        for (j = 0; j < 1024; j++)
          out[j] = reduce_add(0.f, out_rows[1024 * r + j] for r < 64);

    Each column adds the same numbers in the same order, so the results are the same;
    the first loop's iterations are independent (threads take blocks of rows: it is
    marked parallel where the work reaches `parallelize.GRAIN`). A walk
    down the columns reads a slice of each row, one page after another, which the
    hardware prefetchers do not follow: 4096 x 1024 float32, 1 thread, 0.86 -> 0.66 ms.
    """
    store = s.body
    if not (isinstance(store, S.Store) and len(store.indices) == 1
            and isinstance(s.start, E.Imm) and isinstance(s.stop, E.Imm)):
        return None
    j, (index,) = s.var, store.indices
    if linear(index).terms.get(j) != 1:
        return None
    value = vectorizer.mutate(store.value)
    tops = _top_reduces(value)
    if len(tops) != 1:
        return None
    total = tops[0]
    tail = None
    if isinstance(total.init, E.Reduce):  # the rows past the last whole block
        total, tail = total.init, total
    inner = total.body
    if not (isinstance(inner, E.Reduce) and len(total.vars) == 1 and len(inner.vars) == 1
            and total.op == inner.op == "Add" and total.dtype.lanes == 1
            and total.dtype.is_float and isinstance(total.stops[0], E.Imm)
            and inner.stops[0] == E.imm(BLOCK) and not _top_reduces(total.init)
            and not _top_reduces(inner.body) and not _top_reduces(inner.init)
            and (tail is None or not _top_reduces(tail.body))):
        return None
    if not _contiguous(inner.body, j):
        return None
    columns = s.stop.value - s.start.value  # type: ignore[operator]
    blocks = total.stops[0].value  # type: ignore[union-attr]
    item = total.dtype.itemsize
    if columns * item < vectorizer.vector_bits // 8 * 2 or \
            blocks * columns * item > ROW_PARTS_BYTES:  # type: ignore[operator]
        return None
    rows = Buf.make(f"{store.buf.name}_rows", total.dtype, [blocks * columns])
    r, r_1 = E.Var(total.vars[0].name), E.Var(inner.vars[0].name)

    def column_loop(body: Callable[[E.Expr, E.Var], S.Stmt]) -> S.For:
        k = E.Var(j.name)
        return S.For(k, s.start, s.stop, body(r * columns + (k - s.start), k))

    zero = column_loop(lambda at, k: S.Store(rows, (at,), inner.init))
    add = column_loop(lambda at, k: S.Store(rows, (at,), E.Load(rows, (at,)) + substitute(
        inner.body, {j: k, total.vars[0]: r, inner.vars[0]: r_1})))
    # (parallelize_outer_loops counts a nested loop's body once: the work is marked here)
    by_rows = S.For(r, E.imm(0), total.stops[0], S.Block((zero, S.For(
        r_1, E.imm(0), inner.stops[0], add))), parallel=blocks * BLOCK * columns >= GRAIN)
    r_2 = E.Var(total.vars[0].name)
    totals = E.Reduce("Add", total.init, E.Load(rows, (r_2 * columns + (j - s.start),)),
                      (r_2,), total.stops)
    new_value = replace_node(value, total, totals)
    out = S.For(j, s.start, s.stop, S.Store(store.buf, store.indices, new_value))
    return S.Block((by_rows, vectorize_inner_loops(out, vectorizer.vector_bits * ACCUMULATORS)))


def vectorize_reductions(stmt: S.Stmt, vector_bits: int = 512) -> S.Stmt:
    """Vectorize reductions along contiguous axes; see the module docstring."""
    vectorizer = _VectorizeReductions(vector_bits)
    tops = as_block(stmt).stmts
    rows = [_by_rows(top, vectorizer) if isinstance(top, S.For) else None for top in tops]
    if not any(rows):
        return simplify(vectorizer.mutate(stmt))
    return simplify(S.Block(tuple(
        vectorizer.mutate(top) if by_rows is None else by_rows
        for top, by_rows in zip(tops, rows))))
