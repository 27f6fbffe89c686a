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
A nest moves down past nests that do not read what it writes, to reach a
nest it fuses with. The loads of `y` after the store are then removed by
`eliminate_common_subexpressions`.
"""

from __future__ import annotations

from .. import stmt as S
from ..ir_visitor import substitute
from ..loopnest import Nest, as_block, loads, stores


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
    if not na.loops or not _same_space(na, nb):
        return None
    body_b = substitute(nb.body, dict(zip(nb.vars, na.vars)))
    if not _independent(na, body_b):
        return None
    return na.build(S.Block.make(*as_block(na.body).stmts, *as_block(body_b).stmts))


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
