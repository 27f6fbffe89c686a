"""fuse_stored_reductions: a vector reduction over what the loop before it just stored
accumulates in that loop.

    {
      for (j = 0; j < 64; j++)
        out[Ramp(1024 * i + 16 * j, 1, 16)] = exp(x[Ramp(1024 * i + 16 * j, 1, 16)] - m);
    }
    rsum[i] = 1.f / (0.f + lanes_add(reduce_add(Broadcast(-0.f, 64),
                                                out[Ramp(1024 * i + 64 * r, 1, 64)] for r < 16)));
->  Allocate(rsum_acc, float, {64});
    {
      rsum_acc[Ramp(0, 1, 16)] = Broadcast(-0.f, 16);  ... (4 slices of 16 lanes)
      for (j = 0; j < 16; j++) {
        {
          float<16> v = exp(x[Ramp(1024 * i + 64 * j, 1, 16)] - m);
          out[Ramp(1024 * i + 64 * j, 1, 16)] = v;
          rsum_acc[Ramp(0, 1, 16)] = rsum_acc[Ramp(0, 1, 16)] + v;
        }
        ... (the loop's next 3 vectors, into the accumulator's next 3 slices)
      }
    }
    rsum[i] = 1.f / (0.f + lanes_add((rsum_acc[Ramp(0, 1, 16)] + rsum_acc[Ramp(32, 1, 16)])
                                     + (rsum_acc[Ramp(16, 1, 16)] + rsum_acc[Ramp(48, 1, 16)])));
    Free(rsum_acc);

A softmax stores each row's exps, then sums them (`vectorize_reductions`' vector
accumulators): a second pass over the row, whose short loop and horizontal sum
wait for the first. Here each part of such a reduction (a `lanes_add` of vector
`Reduce`s whose bodies are unit-stride loads of the buffer that a loop of
unit-stride vector stores before it stores, over ranges that loop covers; a long
sum's blocks too, each block's sum from zero as `vectorize_reductions` makes them)
becomes accumulator buffers (`W` lanes, as slices of the store loop's vectors)
that the loop adds each stored vector to, and the `lanes_add` the same pairwise
halving of their slices: the same additions in the same order, so the same
results. A scalar tail is left as it is: it reads back the stored values (as does
anything between the loop and the reductions, which may only be loops storing
elsewhere in that buffer: the scalar tail of the stores). Run last (after `hoist_loads` and
`insert_allocations`: the accumulator is allocated in the loop body, where
llvm_codegen keeps a small constant buffer in registers). Softmax 4096 x 1024,
1 thread: 1.48 -> 1.28 ms (kernel alone; plain copy 1.18); 1024 x 4096 1.75 -> 1.28.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .. import expr as E
from .. import stmt as S
from ..buffer import Buf
from ..ir_visitor import Mutator, replace_node, substitute, walk
from ..linear_form import linear
from .simplify import coefficient, simplify

#: Rows shorter than this many elements stay as they are: measured slower (softmax 16384 x 256,
#: 1 thread, kernel alone: 1.17-1.22 -> 1.25-1.38 ms; 32768 x 128 1.35 -> 1.38), while from
#: 512 on it pays (8192 x 512: 1.25-1.43 -> 1.20-1.26; 5461 x 768: 1.30-1.34 -> 1.21-1.25).
MIN_ELEMENTS = 512


@dataclass(frozen=True)
class _Loop:
    """A loop `for (var = start; var < stop; var++)` (after the `lets` of its Block) whose
    body, Lets then `store`, stores one `lanes`-wide vector at `base + lanes * var`."""

    lets: tuple[S.Let, ...]  # the loop's enclosing Block's bindings, before it
    loop: S.For
    body: tuple[S.Stmt, ...]  # the Lets of the body, then the store
    store: S.Store
    base: E.Expr  # the store's index at var = 0
    lanes: int
    start: int
    stop: int


@dataclass(frozen=True)
class _Segment:
    """A vector `Reduce` over what the loop stores: `count` vectors of `lanes` from element
    `offset` past the loop's base, one after the other, or in `blocks` of `block` vectors
    each summed from the identity (`vectorize_reductions`' cascade; `blocks` 0 if not)."""

    reduce: E.Reduce
    offset: int
    lanes: int
    count: int
    blocks: int = 0
    block: int = 0


@dataclass(frozen=True)
class _Part:
    """A `LaneReduce` over a lane-wise combination of segments (`vectorize_reductions`'
    parts of one reduction: a blocked sum and the vectors past its blocks)."""

    lane_reduce: E.LaneReduce
    segments: tuple[_Segment, ...]


def _store_loop(s: S.Stmt) -> _Loop | None:
    """`s` as a loop of vector (or scalar) stores (in a Block of Lets, as `hoist_loads`
    leaves it)."""
    lets: tuple[S.Let, ...] = ()
    if isinstance(s, S.Block) and s.stmts and isinstance(s.stmts[-1], S.For) \
            and all(isinstance(c, S.Let) for c in s.stmts[:-1]):
        lets, s = s.stmts[:-1], s.stmts[-1]  # type: ignore[assignment]
    if not (isinstance(s, S.For) and not s.parallel and isinstance(s.start, E.Imm)
            and isinstance(s.stop, E.Imm)):
        return None
    body = s.body.stmts if isinstance(s.body, S.Block) else (s.body,)
    store = body[-1] if body else None
    if not (isinstance(store, S.Store) and all(isinstance(c, S.Let) for c in body[:-1])):
        return None
    (index,) = store.indices
    if isinstance(index, E.Ramp) and E.is_const(index.stride, 1):
        lanes, first = index.lanes, index.base
    elif index.dtype.lanes == 1:  # a scalar tail
        lanes, first = 1, index
    else:
        return None
    if coefficient(first, s.var) != lanes:
        return None
    base = simplify(substitute(first, {s.var: E.imm(0)}))
    return _Loop(lets, s, body, store, base, lanes, s.start.value, s.stop.value)  # type: ignore


def _offset(index: E.Expr, zero: dict[E.Var, E.Expr], loop: _Loop) -> int | None:
    """The constant element offset of `index` at `zero` from the loop's base, if any."""
    offset = linear(simplify(substitute(index, zero) - loop.base))
    return None if offset.terms else offset.const


def _one_axis(n: E.Expr, op: str) -> bool:
    """Whether `n` is an `op` Reduce over one axis of constant extent from a constant."""
    return (isinstance(n, E.Reduce) and n.op == op and len(n.vars) == 1
            and isinstance(n.stops[0], E.Imm) and isinstance(n.init, E.Broadcast)
            and isinstance(n.init.value, E.Imm))


def _segment(n: E.Expr, op: str, loop: _Loop) -> _Segment | None:
    """`n` as a segment over the loop's stores (a flat or a blocked vector Reduce)."""
    if not _one_axis(n, op):
        return None
    assert isinstance(n, E.Reduce)
    lanes, var, count = n.dtype.lanes, n.vars[0], n.stops[0].value
    body, blocks, block = n.body, 0, 0
    if isinstance(body, E.Reduce):  # blocked: the blocks' sums, each from the identity
        if not _one_axis(body, op):
            return None
        blocks, block, outer = count, body.stops[0].value, var  # type: ignore[attr-defined]
        count, var, body = blocks * block, body.vars[0], body.body  # type: ignore
    if not (isinstance(body, E.Load) and body.buf.root is loop.store.buf.root):
        return None
    (index,) = body.indices
    if not (isinstance(index, E.Ramp) and E.is_const(index.stride, 1)):
        return None
    zero = {var: E.imm(0)}
    if coefficient(index.base, var) != lanes:
        return None
    if blocks:
        if coefficient(index.base, outer) != lanes * block:
            return None
        zero[outer] = E.imm(0)
    offset = _offset(index.base, zero, loop)
    if offset is None:
        return None
    return _Segment(n, offset, lanes, count, blocks, block)  # type: ignore[arg-type]


def _combination(e: E.Expr, op: str, loop: _Loop) -> list[_Segment] | None:
    """The segments `e` combines lane-wise with `op`, if that is all it is."""
    segment = _segment(e, op, loop)
    if segment is not None:
        return [segment]
    if isinstance(e, E.BinaryOp) and type(e).__name__ == op:
        a, b = _combination(e.a, op, loop), _combination(e.b, op, loop)
        return None if a is None or b is None else a + b
    return None


def _parts(value: E.Expr, loop: _Loop) -> list[_Part] | None:
    """The reductions in `value` over what `loop` stores, each within its range; None if
    their segments overlap or leave the loop's range."""
    parts = []
    for n in walk(value):
        if not isinstance(n, E.LaneReduce):
            continue
        segments = _combination(n.value, n.op, loop)
        if segments is None:
            continue  # (a scalar tail reads back the stored values)
        if not all(s.lanes % loop.lanes == 0 and s.offset % loop.lanes == 0
                   and (s.lanes // loop.lanes) & (s.lanes // loop.lanes - 1) == 0
                   for s in segments):
            return None
        parts.append(_Part(n, tuple(segments)))
    segments = sorted((s for p in parts for s in p.segments), key=lambda s: s.offset)
    first, end = loop.start * loop.lanes, loop.stop * loop.lanes
    bounds = [(s.offset, s.offset + s.lanes * s.count) for s in segments]
    if any(a[1] > b[0] for a, b in zip(bounds, bounds[1:])) or \
            not all(first <= lo <= hi <= end for lo, hi in bounds):
        return None
    return parts


def _copy(loop: _Loop, at: E.Expr, acc: Buf | None, slot: int, op: str) -> S.Stmt:
    """The loop's body at iteration `at` (fresh Let variables), adding the stored vector
    to slice `slot` of `acc` if given."""
    mapping: dict[E.Var, E.Expr] = {loop.loop.var: at}
    out: list[S.Stmt] = []
    for let in loop.body[:-1]:
        fresh = E.Var(let.var.name, let.var.dtype)
        out.append(S.Let(fresh, simplify(substitute(let.value, mapping))))
        mapping[let.var] = fresh
    store = loop.store
    value = simplify(substitute(store.value, mapping))
    index = simplify(substitute(store.indices[0], mapping))
    if acc is None:
        return S.Block.make(*out, S.Store(store.buf, (index,), value))
    v = E.Var("v", value.dtype)
    window = (E.Ramp(E.imm(slot * loop.lanes), E.imm(1), loop.lanes),)
    return S.Block((*out, S.Let(v, value), S.Store(store.buf, (index,), v),
                    S.Store(acc, window, E.combine(op, E.Load(acc, window), v))))


def _halves(values: list[E.Expr], op: str) -> E.Expr:
    """`values`, vectors of one width, combined as `LaneReduce` combines the halves of
    their concatenation, down to one vector."""
    while len(values) > 1:
        half = len(values) // 2
        values = [E.combine(op, a, b) for a, b in zip(values[:half], values[half:])]
    return values[0]


def _elsewhere(s: S.Stmt, loop: _Loop, segments: list[_Segment]) -> bool:
    """Whether `s` (between the loop and the reductions) is a loop that stores the same
    buffer, past what the reductions' segments read (a scalar tail), and nothing else."""
    other = _store_loop(s)
    if other is None or other.store.buf.root is not loop.store.buf.root:
        return False
    offset = linear(simplify(other.base - loop.base))
    if offset.terms:
        return False
    first = offset.const + other.start * other.lanes
    end = offset.const + other.stop * other.lanes
    return all(end <= g.offset or g.offset + g.lanes * g.count <= first for g in segments)


class _Replace(Mutator):
    """Replaces nodes (those very ones) by others: `new[id(node)]`."""

    def __init__(self, new: dict[int, E.Expr]):
        self.new = new

    def mutate(self, node: Any) -> Any:
        return self.new[id(node)] if id(node) in self.new else super().mutate(node)


class _Emit:
    """The loop's pieces in order, the segments' accumulating in their buffers."""

    def __init__(self, loop: _Loop, name: str):
        self.loop, self.name = loop, name
        self.stmts: list[S.Stmt] = list(loop.lets)
        self.allocs: list[Buf] = []
        self.done = loop.start  # the loop's iterations emitted so far
        self.windows: dict[int, list[tuple[E.Expr, ...]]] = {}

    def buffer(self, segment: _Segment) -> Buf:
        suffix = f"_{len(self.allocs)}" if self.allocs else ""
        buf = Buf.make(f"{self.name}_acc{suffix}", segment.reduce.dtype.scalar, [segment.lanes])
        self.allocs.append(buf)
        return buf

    def slices(self, lanes: int) -> list[tuple[E.Expr, ...]]:
        """The windows of an accumulator of `lanes`, a vector of the loop's each."""
        step = self.loop.lanes
        return [(E.Ramp(E.imm(k * step), E.imm(1), step),) for k in range(lanes // step)]

    def iterations(self, stop: int) -> None:
        """The loop's iterations up to `stop` as they were."""
        if stop > self.done:
            loop = self.loop.loop
            self.stmts.append(S.For(loop.var, E.imm(self.done), E.imm(stop), loop.body))
            self.done = stop

    def start(self, acc: Buf, reduce: E.Reduce) -> list[S.Stmt]:
        """`acc` set to `reduce`'s initial value."""
        init = E.Broadcast(reduce.init.value, self.loop.lanes)  # type: ignore[attr-defined]
        return [S.Store(acc, w, init) for w in self.slices(reduce.dtype.lanes)]

    def vectors(self, first: E.Expr, acc: Buf, segment: _Segment) -> S.Stmt:
        """The loop's iterations `first` on, one per slice of `acc`, added to it."""
        slices = segment.lanes // self.loop.lanes
        return S.Block(tuple(_copy(self.loop, first + k, acc, k, segment.reduce.op)
                             for k in range(slices)))

    def segment(self, g: _Segment) -> Buf:
        """Emit `g`'s iterations accumulating in a new buffer, which it returns."""
        step, op = self.loop.lanes, g.reduce.op
        self.iterations(g.offset // step)
        slices, first = g.lanes // step, g.offset // step
        acc = self.buffer(g)
        self.stmts += self.start(acc, g.reduce)
        r = E.Var(self.loop.loop.var.name)
        if not g.blocks:
            body = self.vectors(r * slices + first, acc, g)
        else:
            inner = g.reduce.body
            assert isinstance(inner, E.Reduce)
            block = self.buffer(g)
            w = E.Var(self.loop.loop.var.name)
            within = S.For(w, E.imm(0), E.imm(g.block),
                           self.vectors((r * g.block + w) * slices + first, block, g))
            total = [S.Store(acc, k, E.combine(op, E.Load(acc, k), E.Load(block, k)))
                     for k in self.slices(g.lanes)]
            body = S.Block((*self.start(block, inner), within, *total))
        self.stmts.append(S.For(r, E.imm(0), E.imm(g.blocks or g.count), body))
        self.done = first + g.count * slices
        return acc


def _fuse(first: S.Stmt, between: list[S.Stmt], second: S.Stmt) -> list[S.Stmt] | None:
    """`first`, a loop of vector stores, and `second`, a store of reductions over them
    (after the loops `between`, which store elsewhere in the same buffer), as one loop that
    also accumulates the reductions; None if they are not such."""
    loop = _store_loop(first)
    if loop is None or loop.lanes == 1 or not isinstance(second, S.Store):
        return None
    if (loop.stop - loop.start) * loop.lanes < MIN_ELEMENTS:
        return None
    if second.buf.root is loop.store.buf.root:
        return None
    parts = _parts(second.value, loop)
    segments = sorted((g for p in parts or () for g in p.segments), key=lambda g: g.offset)
    if not parts or not all(_elsewhere(s, loop, segments) for s in between):
        return None
    if any(len({g.lanes for g in p.segments}) != 1 for p in parts):
        return None
    emit = _Emit(loop, second.buf.name)
    accs = {id(g.reduce): emit.segment(g) for g in segments}
    emit.iterations(loop.stop)
    value = second.value
    for part in parts:
        windows = emit.slices(part.segments[0].lanes)
        slices = [_Replace({id(g.reduce): E.Load(accs[id(g.reduce)], w) for g in part.segments})
                  .mutate(part.lane_reduce.value) for w in windows]
        op = part.lane_reduce.op
        value = replace_node(value, part.lane_reduce, E.LaneReduce(op, _halves(slices, op)))
    return [*(S.Allocate(a) for a in emit.allocs), S.Block(tuple(emit.stmts)), *between,
            S.Store(second.buf, second.indices, value), *(S.Free(a) for a in emit.allocs)]


class _Fuse(Mutator):
    def mutate_Block(self, s: S.Block) -> S.Stmt:
        stmts = [self.mutate(c) for c in s.stmts]
        out: list[S.Stmt] = []
        k = 0
        while k < len(stmts):
            fused, end = None, k + 1
            while fused is None and end < len(stmts) and _store_loop(stmts[k]) is not None:
                fused = _fuse(stmts[k], stmts[k + 1:end], stmts[end])
                if not isinstance(stmts[end], (S.For, S.Block)):
                    break
                end += 1
            if fused is None:
                out.append(stmts[k])
                k += 1
            else:
                out += fused
                k = end + 1
        if len(out) == len(s.stmts) and all(a is b for a, b in zip(out, s.stmts)):
            return s
        return S.Block(tuple(out))


def fuse_stored_reductions(stmt: S.Stmt) -> S.Stmt:
    """Reductions over a loop's stores accumulated in that loop; see the module docstring."""
    return _Fuse().mutate(stmt)
