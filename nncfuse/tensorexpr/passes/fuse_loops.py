"""fuse_loops: merge adjacent loop nests over the same iteration space into one sweep.

    for i: for j: y[i, j] = sin(x[i, j]);          for i: for j: {
    for i: for j: z[i, j] = y[i, j] * 2.f;    ->     y[i, j] = sin(x[i, j]);
                                                     z[i, j] = y[i, j] * 2.f;
                                                   }
Two top-level nests fuse when their loops have the same bounds and every
element the second reads from a buffer the first writes is the element the
first wrote in the same iteration (so no iteration reads ahead of a write),
and every element the first reads from a buffer the second writes (an input
a write-back stores into) is the one the second writes in that iteration.
Where a nest reduces (a row statistic, or what it reads or feeds), nests
also fuse over their common outer loops when each outer iteration (a row)
reads only what the other wrote in that row: a softmax's max, sum and
output then run row by row while the row is in cache:

    for i: m[i] = reduce_max(x[i, r] for r);       for i: {
    for i: for j: y[i, j] = exp(x[i, j] - m[i]);  ->   m[i] = reduce_max(x[i, r] for r);
                                                       for j: y[i, j] = exp(x[i, j] - m[i]);
                                                     }
Where the second's loop is `m` times as long as the first's and reads the
first's rows at `c / m` (a group norm: statistics per group of `m` channels),
that loop is split in two, `c_o` and `c_i`, in the same order, to match:

    for b: for g < 32: m[b, g] = reduce_add(x[b, 2 * g + r, s] for r, s);
    for b: for c < 64: for s: y[b, c, s] = x[b, c, s] - m[b, c / 2];
->  for b: for g < 32: {
      m[b, g] = reduce_add(x[b, 2 * g + r, s] for r, s);
      for c_i < 2: for s: y[b, 2 * g + c_i, s] = x[b, 2 * g + c_i, s] - m[b, g];
    }
A nest moves down past nests that do not read what it writes, to reach a
nest it fuses with. The loads of `y` after the store are then removed by
`eliminate_common_subexpressions`.
"""

from __future__ import annotations

from .. import expr as E
from .. import stmt as S
from ..ir_visitor import substitute, walk
from ..loopnest import Nest, as_block, loads, stores
from .simplify import simplify


def _same_space(a: Nest, b: Nest) -> bool:
    return len(a.loops) == len(b.loops) and all(
        x.start == y.start and x.stop == y.stop and x.parallel == y.parallel
        for x, y in zip(a.loops, b.loops)
    )


def _independent(first: Nest, second: S.Stmt) -> bool:
    """Whether each read in `second` of what `first` writes is of the same iteration's element."""
    written: dict = {}
    for st in stores(first.body):
        written.setdefault(st.buf.root, set()).add(st.indices)
    for ld in loads(second):
        if ld.buf.root in written and ld.indices not in written[ld.buf.root]:
            return False
    read: dict = {}
    for ld in loads(first.body):
        read.setdefault(ld.buf.root, set()).add(ld.indices)
    for st in stores(second):  # a write-back into an input `first` reads: of the same element
        if st.buf.root in read and read[st.buf.root] != {st.indices}:
            return False
    return True


def _fuse(a: S.Stmt, b: S.Stmt) -> S.Stmt | None:
    na, nb = Nest.of(a), Nest.of(b)
    if not na.loops:
        return None
    if _same_space(na, nb):
        body_b = substitute(nb.body, dict(zip(nb.vars, na.vars)))
        if _independent(na, body_b):
            return na.build(S.Block.make(*as_block(na.body).stmts, *as_block(body_b).stmts))
    if _reduces(a) or _reduces(b):
        fused = _fuse_rows(na, nb)
        if fused is None and (split := _split_to_rows(na, nb)) is not None:
            fused = _fuse_rows(na, split)
        return fused
    return None


def _split_to_rows(na: Nest, nb: Nest) -> Nest | None:
    """`nb` with the first of its outer loops that is `m` times as long as `na`'s loop there
    split in two (`c` -> `m * c_o + c_i`, the same order), so that `na`'s rows match where
    `nb` reads them at `c / m` (a group norm's channels, `c / 2`, over its groups' statistics);
    None where no loop is such a multiple, or `nb` reads nothing `na` writes."""
    written = {st.buf.root for st in stores(na.body)}
    if not any(ld.buf.root in written for ld in loads(nb.body)):
        return None
    for p in range(min(len(na.loops), len(nb.loops))):
        la, lb = na.loops[p], nb.loops[p]
        if la.stop == lb.stop:
            continue
        if not (E.is_const(la.start, 0) and E.is_const(lb.start, 0)
                and isinstance(la.stop, E.Imm) and isinstance(lb.stop, E.Imm)):
            return None
        a, b = int(la.stop.value), int(lb.stop.value)
        if a <= 0 or b <= a or b % a:
            return None
        m = E.imm(b // a)
        outer, inner = E.Var(f"{lb.var.name}_o"), E.Var(f"{lb.var.name}_i")
        loops = (*nb.loops[:p], S.For(outer, E.imm(0), la.stop, S.Block(()), lb.parallel),
                 S.For(inner, E.imm(0), m, S.Block(())), *nb.loops[p + 1:])
        body = substitute(Nest(nb.loops[p + 1:], nb.body).build(), {lb.var: outer * m + inner})
        return Nest.of(simplify(Nest(loops[:p + 2], body).build()))
    return None


def _reduces(stmt: S.Stmt) -> bool:
    return any(isinstance(n, E.Reduce) for n in walk(stmt))


def _fuse_rows(na: Nest, nb: Nest) -> S.Stmt | None:
    """Both nests in one sweep of their common outer loops, each doing a whole row in turn.

    Sound when, in every row, the second reads of the first's buffers only elements
    the first wrote in that row: at each index where the first stores an outer loop's
    variable, the second loads the same variable.
    """
    k = min(len(na.loops), len(nb.loops))
    if k == 0 or not _same_space(Nest(na.loops[:k], na.body), Nest(nb.loops[:k], nb.body)):
        return None
    outer = na.vars[:k]
    inner_a = Nest(na.loops[k:], na.body).build()
    inner_b = substitute(Nest(nb.loops[k:], nb.body).build(), dict(zip(nb.vars[:k], outer)))
    rows: dict = {}
    for st in stores(inner_a):
        at = tuple((p, i) for p, i in enumerate(st.indices) if any(i is v for v in outer))
        rows.setdefault(st.buf.root, set()).add(at)
    for ld in loads(inner_b):
        for at in rows.get(ld.buf.root, ()):
            if any(ld.indices[p] is not v for p, v in at):
                return None
    read_by_a = {ld.buf.root for ld in loads(inner_a)}
    if any(st.buf.root in read_by_a for st in stores(inner_b)):
        return None
    body = S.Block.make(*as_block(inner_a).stmts, *as_block(inner_b).stmts)
    return Nest(na.loops[:k], body).build()


def _fuse_one(nests: list[S.Stmt]) -> bool:
    """Fuse some nest into a later one it can reach; whether that happened."""
    for i, first in enumerate(nests):
        written = {st.buf.root for st in stores(first)}
        for j in range(i + 1, len(nests)):
            fused = _fuse(first, nests[j])
            if fused is not None:
                nests[j] = fused
                del nests[i]
                return True
            if any(ld.buf.root in written for ld in loads(nests[j])):
                break  # nests[j] reads what `first` writes: `first` cannot move past it
    return False


def fuse_loops(stmt: S.Stmt) -> S.Stmt:
    """Fuse compatible top-level nests; see the module docstring."""
    nests = list(as_block(stmt).stmts)
    changed = False
    while _fuse_one(nests):
        changed = True
    return S.Block(tuple(nests)) if changed else stmt
