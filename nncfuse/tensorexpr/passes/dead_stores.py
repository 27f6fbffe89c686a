"""eliminate_dead_stores: drop stores to temporaries nothing reads, and unused Lets.

    for i: {                                for i: {
      float v = sin(t0[i]);                   float v = sin(t0[i]);
      aten_sin[i] = v;              ->        out[i] = v * v;
      out[i] = v * v;                       }
    }
After `eliminate_common_subexpressions` has replaced the loads of a
temporary by the value stored (`aten_sin` here), its stores are dead: no
memory is allocated for it and no time spent writing it. Kernel parameters
(inputs and outputs) are always kept. A `Let` whose variable is no longer
used goes too, and loops left empty vanish in `simplify`.

A temporary whose one store an output's one store repeats, next to it in the
same block (the same value at the same element offset: run after
`flatten_indices`), holds what that output holds from then on; its readers
read the output instead, and its stores are dead. GELU's backward, both
returned transposed and summed over its rows, is then stored once:

    for i: {                                for i: {
      float v = t0[i] * t1[i];                float v = t0[i] * t1[i];
      tmp[i] = v;                   ->        out_t[i] = v;
      out_t[i] = v;                         }
    }                                       for j: sum[j] = reduce_add(out_t[64 * r + j] for r);
    for j: sum[j] = reduce_add(tmp[64 * r + j] for r);
Likewise where the output's one store copies the temporary at the same
element offset in a later nest (a copy `fuse_loops` could not join with the
temporary's nest, past a reduction that reads it): the temporary is stored in
the output, and the copy, now of each element onto itself, goes:

    for i: tmp[i] = f(t0[i]);                for i: out_t[i] = f(t0[i]);
    for j: sum[j] = reduce_add(tmp[...]);  ->  for j: sum[j] = reduce_add(out_t[...]);
    for i: out_t[i] = tmp[i];                for i: {}
Only an output the kernel allocates (not a write-back into an input, whose
memory the caller sees and other buffers may share) and stores nowhere else,
of the temporary's dtype, sizes and strides (a copy of part of a temporary, a
`chunk`'s first piece, stays a copy); neither may be an external call's
argument or result.

A store that a later store of the same block overwrites (the same buffer and
element), with no load of that buffer between them, is dead too: a temporary
that `reuse_outputs` put in its reader's output, whose loads
`eliminate_common_subexpressions` then replaced, left one (the suite's seed
chain, GELU, Llama's SiLU backward; LLVM cannot drop it where a load of another
buffer, which might alias, comes between):

    for i: {                                for i: {
      float v = sin(t0[i]);                   float v = sin(t0[i]);
      out[i] = v;                   ->        out[i] = v * v;
      out[i] = v * v;                       }
    }
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from .. import expr as E
from .. import stmt as S
from ..buffer import Buf
from ..ir_visitor import Mutator, walk
from .reuse_outputs import ReadFrom, Rename
from .simplify import simplify


class _Drop(Mutator):
    def __init__(self, dead: set[Buf]):
        self.dead = dead

    def mutate_Block(self, s: S.Block) -> S.Stmt:
        kept: list[S.Stmt] = []
        for child in reversed(s.stmts):  # backwards: a Let is dead if nothing after uses it
            child = self.mutate(child)
            if isinstance(child, S.Store) and child.buf.root in self.dead:
                continue
            if isinstance(child, S.Let) and not any(
                n is child.var for k in kept for n in walk(k)
            ):
                continue
            kept.append(child)
        kept.reverse()
        if len(kept) == len(s.stmts) and all(a is b for a, b in zip(kept, s.stmts)):
            return s
        return S.Block(tuple(kept))


def _same_offsets(a: tuple[E.Expr, ...], b: tuple[E.Expr, ...]) -> bool:
    """Whether two stores' indices are the same elements (`32 * i + j` and `j + 32 * i`)."""
    return len(a) == len(b) and all(
        x == y or E.is_const(simplify(x - y), 0) for x, y in zip(a, b))


def _alike(t: Buf, o: Buf) -> bool:
    """Whether two accessed buffers (`flatten_indices`' flat views) are of one dtype, extent
    and stride: storing one's elements into the other stays in bounds (a copy of the first
    chunk of a temporary would not)."""
    return t.dtype == o.dtype and t.dims == o.dims and t.strides == o.strides


def _accesses(stmt: S.Stmt) -> tuple[list, Counter, dict[Buf, set[Buf]], set[Buf]]:
    """The nodes of `stmt` in program order, how often each buffer is stored, the buffers
    (views) each is accessed through, and those an external call reads or writes."""
    nodes = list(walk(stmt))
    count = Counter(n.buf.root for n in nodes if isinstance(n, S.Store))
    access: dict[Buf, set[Buf]] = {}
    for n in nodes:
        if isinstance(n, (S.Store, E.Load)):
            access.setdefault(n.buf.root, set()).add(n.buf)
    external = {a.root for n in nodes if isinstance(n, S.ExternalCall)
                for a in (n.buf, *n.args) if isinstance(a, Buf)}
    return nodes, count, access, external


def _repeated(stmt: S.Stmt, outputs: set[Buf], keep: set[Buf]) -> dict[Buf, Buf]:
    """Each temporary whose one store an output's one store repeats, with that output (the
    buffers these stores access: `flatten_indices`'s views of both)."""
    nodes, count, access, external = _accesses(stmt)
    found: dict[Buf, Buf] = {}
    for block in nodes:
        if not isinstance(block, S.Block):
            continue
        for a, b in zip(block.stmts, block.stmts[1:]):
            if not (isinstance(a, S.Store) and isinstance(b, S.Store)):
                continue
            for tmp, out in ((a, b), (b, a)):
                t, o = tmp.buf.root, out.buf.root
                if (t in keep or o not in outputs or not _alike(tmp.buf, out.buf)
                        or {t, o} & external or count[t] != 1 or count[o] != 1
                        or access[t] != {tmp.buf} or access[o] != {out.buf}
                        or not _same_offsets(tmp.indices, out.indices) or tmp.value != out.value
                        or any(ld.buf.root in (t, o) for ld in walk(tmp.value)
                               if isinstance(ld, E.Load))):
                    continue
                found.setdefault(tmp.buf, out.buf)
    return found


def _copied(stmt: S.Stmt, outputs: set[Buf], keep: set[Buf]) -> dict[Buf, Buf]:
    """Each temporary that an output's one store copies after the temporary's one store,
    at the same element offsets, with that output."""
    nodes, count, access, external = _accesses(stmt)
    order = {id(n): k for k, n in enumerate(nodes)}
    stored = [n for n in nodes if isinstance(n, S.Store)]
    first: dict[Buf, S.Store] = {}
    for n in stored:
        first.setdefault(n.buf.root, n)
    found: dict[Buf, Buf] = {}
    for out in stored:
        o, ld = out.buf.root, out.value
        if not isinstance(ld, E.Load) or o not in outputs:
            continue
        t = ld.buf.root
        if (t in keep or t is o or not _alike(ld.buf, out.buf) or {t, o} & external
                or count[t] != 1 or count[o] != 1 or access[t] != {ld.buf} or access[o] != {out.buf}
                or order[id(first[t])] > order[id(out)]
                or not _same_offsets(ld.indices, out.indices)):
            continue
        found.setdefault(ld.buf, out.buf)
    return found


class _DropSelfCopies(Mutator):
    """Drops the stores to `bufs` of each element onto itself (an empty block remains)."""

    def __init__(self, bufs: set[Buf]):
        self.bufs = bufs

    def mutate_Store(self, s: S.Store) -> S.Stmt:
        if (s.buf in self.bufs and isinstance(s.value, E.Load) and s.value.buf == s.buf
                and _same_offsets(s.value.indices, s.indices)):
            return S.Block(())
        return s


class _DropOverwritten(Mutator):
    """Drops each store of a block that a later store of that block overwrites, with no load
    of its buffer (any view of it) between them."""

    def mutate_Block(self, s: S.Block) -> S.Stmt:
        s = self.generic_mutate(s)
        kept: list[S.Stmt] = []
        later: list[S.Store] = []  # the stores after `child` in this block, none read since
        for child in reversed(s.stmts):
            if isinstance(child, S.Store) and any(
                    w.buf == child.buf and _same_offsets(w.indices, child.indices)
                    for w in later):
                continue
            read = {n.buf.root for n in walk(child) if isinstance(n, E.Load)} | {
                a.root for n in walk(child) if isinstance(n, S.ExternalCall)
                for a in (n.buf, *n.args) if isinstance(a, Buf)}
            later = [w for w in later if w.buf.root not in read]
            if isinstance(child, S.Store) and child.buf.root not in read:
                later.append(child)  # overwrites, unless it reads what it overwrites first
            kept.append(child)
        if len(kept) == len(s.stmts):
            return s
        kept.reverse()
        return S.Block(tuple(kept))


def eliminate_dead_stores(stmt: S.Stmt, params: Iterable[Buf] = (),
                          outputs: Iterable[Buf] = ()) -> S.Stmt:
    """Drop stores to temporaries that are never loaded, or whose values an output of
    `outputs` (a subset of `params`) repeats or copies; see the module docstring."""
    keep = {b.root for b in params}
    fresh = {b for b in outputs if b.base is None}
    repeated = _repeated(stmt, fresh, keep)
    if repeated:
        stmt = ReadFrom(repeated).mutate(stmt)
    copied = _copied(stmt, fresh, keep)
    if copied:
        stmt = _DropSelfCopies(set(copied.values())).mutate(Rename(copied).mutate(stmt))
    loaded = {n.buf.root for n in walk(stmt) if isinstance(n, E.Load)}
    stored = {n.buf.root for n in walk(stmt) if isinstance(n, S.Store)}
    dead = stored - loaded - keep
    stmt = _Drop(dead).mutate(stmt) if dead else stmt
    return _DropOverwritten().mutate(stmt)
