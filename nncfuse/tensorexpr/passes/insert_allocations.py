"""insert_allocations: reserve memory for temporaries around the statements that use them.

    for i: tmp[i] = exp(b[i]);                 Allocate(tmp, float, {8});
    for i: for j:                        ->    for i: tmp[i] = exp(b[i]);
      out[8 * i + j] = tmp[j] * a[...];        for i: for j: out[8 * i + j] = tmp[j] * a[...];
                                               Free(tmp);
Every buffer that is neither a kernel input nor an output gets an `Allocate`
before the first top-level statement that touches it and a `Free` after the
last one.
"""

from __future__ import annotations

from collections.abc import Iterable

from .. import expr as E
from .. import stmt as S
from ..buffer import Buf
from ..ir_visitor import walk
from ..loopnest import as_block


def _touched(s: S.Stmt) -> dict[Buf, None]:
    """The roots of the buffers `s` stores or loads, in the order a walk meets them (not a
    set's order, which follows object ids: the IR text, the cache key, must not)."""
    return dict.fromkeys(n.buf.root for n in walk(s) if isinstance(n, (S.Store, E.Load)))


def insert_allocations(stmt: S.Stmt, params: Iterable[Buf] = ()) -> S.Stmt:
    """Add Allocate/Free pairs for temporaries; see the module docstring."""
    known = {b.root for b in params}
    stmts = list(as_block(stmt).stmts)
    first: dict[Buf, int] = {}
    last: dict[Buf, int] = {}
    views: dict[Buf, Buf] = {}
    for k, s in enumerate(stmts):
        for buf in _touched(s):
            if buf in known:
                continue
            first.setdefault(buf, k)
            last[buf] = k
    if not first:
        return stmt
    for n in walk(stmt):
        buf = getattr(n, "buf", None)
        if isinstance(buf, Buf) and buf.root in first:
            views.setdefault(buf.root, buf)
    out: list[S.Stmt] = []
    for k, s in enumerate(stmts):
        out += [S.Allocate(views[b]) for b in first if first[b] == k]
        out.append(s)
        out += [S.Free(views[b]) for b in last if last[b] == k]
    return S.Block(tuple(out))
