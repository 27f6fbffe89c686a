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
"""

from __future__ import annotations

from collections.abc import Iterable

from .. import expr as E
from .. import stmt as S
from ..buffer import Buf
from ..ir_visitor import Mutator, walk


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


def eliminate_dead_stores(stmt: S.Stmt, params: Iterable[Buf] = ()) -> S.Stmt:
    """Drop stores to temporaries that are never loaded; see the module docstring."""
    keep = {b.root for b in params}
    loaded = {n.buf.root for n in walk(stmt) if isinstance(n, E.Load)}
    stored = {n.buf.root for n in walk(stmt) if isinstance(n, S.Store)}
    dead = stored - loaded - keep
    return _Drop(dead).mutate(stmt) if dead else stmt
