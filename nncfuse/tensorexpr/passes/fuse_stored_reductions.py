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
          float<16> v = exp(x[Ramp(1024 * i + 16 * (4 * j), 1, 16)] - m);
          out[Ramp(1024 * i + 16 * (4 * j), 1, 16)] = v;
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
wait for the first. Here each part of such a reduction (a vector `Reduce` whose
body is a unit-stride load of the buffer that the statement before it stores,
a loop of unit-stride vector stores, over a range that loop covers) becomes an
accumulator buffer (`W` lanes, as `lanes` slices of the store loop's vectors)
that the loop adds each stored vector to, and the part's `lanes_add` the same
pairwise halving of its slices: the same additions in the same order, so the
same results. Parts it cannot take (a scalar tail, a blocked long sum) are left
as they are: they read back the stored values. Run last (after `hoist_loads` and
`insert_allocations`: the accumulator is allocated in the loop body, where
llvm_codegen keeps a small constant buffer in registers). Softmax 4096 x 1024,
1 thread: 1.48 -> 1.28 ms (kernel alone; plain copy 1.18); 1024 x 4096 1.75 -> 1.28.
"""

from __future__ import annotations

from dataclasses import dataclass

from .. import expr as E
from .. import stmt as S
from ..buffer import Buf
from ..ir_visitor import Mutator, replace_node, substitute, walk
from .simplify import Simplifier, simplify

#: Rows shorter than this many elements stay as they are: measured no faster
#: (softmax 32768 x 128, 1 thread: 1.35 -> 1.38 ms).
MIN_ELEMENTS = 256


@dataclass(frozen=True)
class _Loop:
    """A loop `for (var = start; var < stop; var++)` whose body, `lets` then `store`,
    stores one `lanes`-wide vector of `buf` at `base + lanes * var`."""

    lets: tuple[S.Let, ...]  # the loop's enclosing Block's bindings, before it
    loop: S.For
    body: tuple[S.Stmt, ...]  # the Lets of the body, then the store
    store: S.Store
    base: E.Expr  # the store's index at var = 0
    lanes: int
    start: int
    stop: int


@dataclass(frozen=True)
class _Part:
    """A vector `Reduce` over `count` vectors of `lanes` at element `offset` from the
    loop's base, and the `LaneReduce` over it (None if `lanes` is the loop's)."""

    reduce: E.Reduce
    parent: E.LaneReduce | None
    offset: int
    lanes: int
    count: int


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
    if Simplifier().linear(first).terms.get(s.var) != lanes:
        return None
    base = simplify(substitute(first, {s.var: E.imm(0)}))
    return _Loop(lets, s, body, store, base, lanes, s.start.value, s.stop.value)  # type: ignore


def _parts(value: E.Expr, loop: _Loop) -> list[_Part] | None:
    """The reductions in `value` over what `loop` stores, each within its range; None if
    one of them cannot accumulate in the loop."""
    linear = Simplifier().linear
    parents = {id(n.value): n for n in walk(value) if isinstance(n, E.LaneReduce)}
    parts = []
    buf = loop.store.buf.root
    for n in walk(value):
        if not (isinstance(n, E.Reduce) and isinstance(n.body, E.Load)
                and n.body.buf.root is buf):
            continue
        (index,) = n.body.indices
        lanes, (var,), (count,) = n.dtype.lanes, n.vars, n.stops
        if not (isinstance(index, E.Ramp) and E.is_const(index.stride, 1)
                and isinstance(count, E.Imm) and lanes % loop.lanes == 0):
            continue  # a scalar tail: it reads back the stored values
        slices = lanes // loop.lanes
        if slices & (slices - 1) or not (isinstance(n.init, E.Broadcast)
                                         and isinstance(n.init.value, E.Imm)):
            return None
        if linear(index.base).terms.get(var) != lanes:
            return None
        at_zero = simplify(substitute(index.base, {var: E.imm(0)}))
        offset = linear(simplify(at_zero - loop.base))
        parent = parents.get(id(n))
        if offset.terms or offset.const % loop.lanes or (slices > 1 and parent is None):
            return None
        first, end = loop.start * loop.lanes, loop.stop * loop.lanes
        if not first <= offset.const <= offset.const + lanes * count.value <= end:  # type: ignore
            return None
        parts.append(_Part(n, parent if slices > 1 else None, offset.const, lanes,
                           count.value))  # type: ignore[arg-type]
    parts.sort(key=lambda p: p.offset)
    if any(a.offset + a.lanes * a.count > b.offset for a, b in zip(parts, parts[1:])):
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


def _elsewhere(s: S.Stmt, loop: _Loop, parts: list[_Part]) -> bool:
    """Whether `s` (between the loop and the reductions) is a loop that stores the same
    buffer, past what the reductions' parts read (a scalar tail), and nothing else."""
    other = _store_loop(s)
    if other is None or other.store.buf.root is not loop.store.buf.root:
        return False
    offset = Simplifier().linear(simplify(other.base - loop.base))
    if offset.terms:
        return False
    first = offset.const + other.start * other.lanes
    end = offset.const + other.stop * other.lanes
    return all(end <= p.offset or p.offset + p.lanes * p.count <= first for p in parts)


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
    if not parts or not all(_elsewhere(s, loop, parts) for s in between):
        return None
    var, step = loop.loop.var, loop.lanes
    stmts: list[S.Stmt] = list(loop.lets)
    allocs, value, done = [], second.value, loop.start
    for part in parts:
        slices = part.lanes // step
        name = f"{second.buf.name}_acc" + (f"_{len(allocs)}" if allocs else "")
        acc = Buf.make(name, part.reduce.dtype.scalar, [part.lanes])
        allocs.append(acc)
        first_vector = part.offset // step
        if first_vector > done:
            stmts.append(S.For(var, E.imm(done), E.imm(first_vector), loop.loop.body))
        init = E.Broadcast(part.reduce.init.value, step)  # type: ignore[attr-defined]
        windows = [(E.Ramp(E.imm(k * step), E.imm(1), step),) for k in range(slices)]
        stmts += [S.Store(acc, w, init) for w in windows]
        r = E.Var(var.name)
        stmts.append(S.For(r, E.imm(0), E.imm(part.count), S.Block(tuple(
            _copy(loop, r * slices + (first_vector + k), acc, k, part.reduce.op)
            for k in range(slices)))))
        done = first_vector + part.count * slices
        loads: list[E.Expr] = [E.Load(acc, w) for w in windows]
        if part.parent is None:
            value = replace_node(value, part.reduce, loads[0])
        else:
            value = replace_node(value, part.parent,
                                 E.LaneReduce(part.parent.op, _halves(loads, part.reduce.op)))
    if done < loop.stop:
        stmts.append(S.For(var, E.imm(done), E.imm(loop.stop), loop.loop.body))
    return [*(S.Allocate(a) for a in allocs), S.Block(tuple(stmts)), *between,
            S.Store(second.buf, second.indices, value), *(S.Free(a) for a in allocs)]


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
