"""reuse_outputs: keep a temporary in the memory of the buffer that finally overwrites it.

    for i: {                                         for i: {
      for j: e[i, j] = exp(x[i, j] - m[i]);            for j: out[i, j] = exp(x[i, j] - m[i]);
      s[i] = 1.f / reduce_add(e[i, r] for r);   ->     s[i] = 1.f / reduce_add(out[i, r] for r);
      for j: out[i, j] = e[i, j] * s[i];               for j: out[i, j] = out[i, j] * s[i];
    }                                                }
A temporary `e` of the same type and dims as a buffer `out` whose first store
reads `e` only at the element it writes, and after which nothing reads `e`,
can live in `out`'s memory: each element of `e` is dead once `out`'s store
has read it. Later stores of `out` (softmax's scaling in place) are fine
where they write the row the first one writes in the loops they share: so a
masked softmax's `x + mask` lives in its output too, as the exponentials
do. Softmax then computes each exponential once, as ATen does (exp into the
output, sum, scale in place), and needs no temporary. When
the two stores sit in common loops (a row-fused nest), every access to `e`
must stay in the current iteration's row (the outer loops' variables at the
positions where the store of `e` has them), so no row reads another row's
element after `out` overwrote it; so must every read of `e` in a loop it shares
with `out`'s store (after `fuse_loops`: `out[i] = f(e[i])` next to a read of
`e[16 - i]`). Run before `flatten_indices`.
"""

from __future__ import annotations

from collections.abc import Iterable

from .. import expr as E
from .. import stmt as S
from ..buffer import Buf
from ..ir_visitor import Mutator, walk


class _Leaves:
    """The Stores and Lets of a program in execution order, each with its enclosing loops."""

    def __init__(self, stmt: S.Stmt):
        self.leaves: list[tuple[S.Stmt, tuple[E.Var, ...]]] = []
        self.collect(stmt, ())

    def collect(self, s: S.Stmt, loops: tuple[E.Var, ...]) -> None:
        if isinstance(s, S.Block):
            for c in s.stmts:
                self.collect(c, loops)
        elif isinstance(s, S.For):
            self.collect(s.body, (*loops, s.var))
        else:
            self.leaves.append((s, loops))


def _loads(s: S.Stmt) -> list[E.Load]:
    return [n for n in walk(s) if isinstance(n, E.Load)]


def _common(a: tuple[E.Var, ...], b: tuple[E.Var, ...]) -> tuple[E.Var, ...]:
    out = []
    for x, y in zip(a, b):
        if x is not y:
            break
        out.append(x)
    return tuple(out)


def _candidate(leaves: list, temp: Buf, keep: set[Buf]) -> Buf | None:
    """The buffer `temp` can live in, if any; see the module docstring."""
    stores = [k for k, (s, _) in enumerate(leaves) if isinstance(s, S.Store) and s.buf.root is temp]
    if len(stores) != 1:
        return None
    a = stores[0]
    store_a, loops_a = leaves[a]
    reads = [k for k, (s, _) in enumerate(leaves) for ld in _loads(s) if ld.buf.root is temp]
    if not reads or min(reads) <= a:
        return None
    b = max(reads)
    store_b, loops_b = leaves[b]
    if not isinstance(store_b, S.Store):
        return None
    out = store_b.buf.root
    if out is temp or out.dtype != temp.dtype or out.dims != temp.dims or out.base is not None:
        return None
    if any(ld.indices != store_b.indices for ld in _loads(store_b) if ld.buf.root is temp):
        return None
    out_stores = [k for k, (s, _) in enumerate(leaves) if isinstance(s, S.Store)
                  and s.buf.root is out]
    out_reads = [k for k, (s, _) in enumerate(leaves) for ld in _loads(s) if ld.buf.root is out]
    if out_stores[0] != b or any(k < b for k in out_reads):
        return None
    for k in out_stores[1:]:
        # A later store of `out` (softmax's scaling in place, after its exponentials moved
        # into `out`) in loops it shares with the last read of `e` writes that read's row:
        # another row may be one of `e` that a later iteration still reads.
        shared = _common(leaves[k][1], loops_b)
        now = [(p, i) for p, i in enumerate(store_b.indices) if any(i is v for v in shared)]
        if any(leaves[k][0].indices[p] is not v for p, v in now):
            return None
    outer = _common(loops_a, loops_b)
    rows = [(p, i) for p, i in enumerate(store_a.indices) if any(i is v for v in outer)]
    for k in range(a, b + 1):
        # A read sharing loops with `out`'s store runs after earlier iterations' stores: it
        # must stay in the row that store writes now (argmax over dim 1, erf after it).
        shared = _common(leaves[k][1], loops_b)
        now = [(p, i) for p, i in enumerate(store_b.indices) if any(i is v for v in shared)]
        for ld in _loads(leaves[k][0]):
            if ld.buf.root is temp and any(ld.indices[p] is not v for p, v in rows + now):
                return None
        # A reader in a loop it shares with `out`'s store reads `e` in that store's row:
        # another row (a flip's `16 - i`) may be one that `out` already overwrote.
        shared = _common(leaves[k][1], loops_b)
        cols = [(p, i) for p, i in enumerate(store_b.indices) if any(i is v for v in shared)]
        for ld in _loads(leaves[k][0]):
            if ld.buf.root is temp and any(ld.indices[p] is not v for p, v in cols):
                return None
    return out


class ReadFrom(Mutator):
    """Loads of each buffer in `mapping` read the buffer it maps to instead."""

    def __init__(self, mapping: dict[Buf, Buf]):
        self.mapping = mapping

    def mutate_Load(self, e: E.Load) -> E.Expr:
        e = self.generic_mutate(e)
        new = self.mapping.get(e.buf)
        return e if new is None else E.Load(new, e.indices)


class Rename(ReadFrom):
    """Loads and stores of each buffer in `mapping` access the buffer it maps to instead."""

    def mutate_Store(self, s: S.Store) -> S.Stmt:
        s = self.generic_mutate(s)
        new = self.mapping.get(s.buf)
        return s if new is None else S.Store(new, s.indices, s.value)


def reuse_outputs(stmt: S.Stmt, params: Iterable[Buf] = ()) -> S.Stmt:
    """Let temporaries live in the buffers that overwrite them; see the module docstring."""
    keep = {b.root for b in params}
    changed = True
    while changed:
        changed = False
        leaves = _Leaves(stmt).leaves
        # In program order, not a set's (object ids): which temporary moves first must not
        # change from one process to the next. The last first: softmax's exponentials go
        # into its output (not its scaled input into the exponentials' temporary).
        temps = dict.fromkeys(s.buf for s, _ in leaves if isinstance(s, S.Store)
                              and s.buf.root not in keep and s.buf.base is None)
        for temp in reversed(temps):
            out = _candidate(leaves, temp, keep)
            if out is not None:
                stmt = Rename({temp: out}).mutate(stmt)
                changed = True
                break
    return stmt
