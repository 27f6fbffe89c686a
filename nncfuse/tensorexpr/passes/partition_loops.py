"""partition_loops: split a loop where a comparison of its variable with a constant flips.

    for i: for j in [0, 8):                        for i: {
      out[i, j] = relu(j < 3                         for j in [0, 3):
          ? a[i, min(j, 2)] + 1.f           ->         out[i, j] = relu(a[i, j] + 1.f);
          : b[i, max(j - 3, 0)] * 2.f);              for j in [0, 5):
                                                       out[i, j + 3] = relu(b[i, j] * 2.f);
                                                   }
A loop whose body compares its variable with constants inside its range
(`j < 3`: what cat, stack and the like lower to) becomes one loop per
interval between those constants, each over a fresh variable from 0, with
the loop variable replaced by it plus the interval's start. In each piece
the comparisons are known, so the selects fall away, and so do `min` and
`max` that the ranges of the loop variables decide (the clamps that keep
the unselected branch in bounds): each part of a cat is read by its own
dense loop, which vectorizes and collapses like any other. Loops with more
than `MAX_PIECES` pieces are left alone (their selects stay exact).
Run before `flatten_indices` (the comparisons are on the loop variables).
"""

from __future__ import annotations

from typing import Any

from .. import expr as E
from .. import stmt as S
from ..dtype import INDEX
from ..ir_visitor import Mutator, substitute, walk
from .simplify import Simplifier

MAX_PIECES = 16


def _cuts(body: S.Stmt, var: E.Var, start: int, stop: int) -> list[int]:
    """Where comparisons of `var` with constants change value, inside (start, stop)."""
    cuts: set[int] = set()
    for node in walk(body):
        if not isinstance(node, E.Cmp):
            continue
        if node.a is var and isinstance(node.b, E.Imm):
            op, c = node.op, node.b.value
        elif node.b is var and isinstance(node.a, E.Imm):
            op = {"<": ">", "<=": ">=", ">": "<", ">=": "<="}.get(node.op, node.op)
            c = node.a.value
        else:
            continue
        if op in ("<", ">="):
            cuts.add(c)  # type: ignore[arg-type]
        elif op in ("<=", ">"):
            cuts.add(c + 1)  # type: ignore[operator]
        else:
            cuts.update((c, c + 1))  # type: ignore[operator]
    return sorted(c for c in cuts if start < c < stop)


class _Decide(Simplifier):
    """`simplify`, plus: comparisons, `min` and `max` of index values decided by the ranges."""

    def rewrite(self, e: E.Expr) -> E.Expr:
        e = super().rewrite(e)
        if isinstance(e, (E.Min, E.Max, E.Cmp)) and e.a.dtype == INDEX:
            a, b = self.bounds(e.a), self.bounds(e.b)
            if a is None or b is None:
                return e
            if isinstance(e, E.Min):
                return e.a if a[1] <= b[0] else e.b if b[1] <= a[0] else e
            if isinstance(e, E.Max):
                return e.a if a[0] >= b[1] else e.b if b[0] >= a[1] else e
            decided = _decide(e.op, a, b)
            if decided is not None:
                return E.imm(decided, e.dtype)
        return e


def _decide(op: str, a: tuple[int, int], b: tuple[int, int]) -> bool | None:
    if op == "<":
        return True if a[1] < b[0] else False if a[0] >= b[1] else None
    if op == "<=":
        return True if a[1] <= b[0] else False if a[0] > b[1] else None
    if op == ">":
        return _decide("<", b, a)
    if op == ">=":
        return _decide("<=", b, a)
    if a[0] == a[1] == b[0] == b[1]:
        return op == "=="
    if a[1] < b[0] or b[1] < a[0]:
        return op == "!="
    return None


class _Partition(Mutator):
    def __init__(self) -> None:
        self.changed = False

    def mutate_For(self, s: S.For) -> S.Stmt:
        if isinstance(s.start, E.Imm) and isinstance(s.stop, E.Imm) and not s.parallel:
            start, stop = s.start.value, s.stop.value
            cuts = _cuts(s.body, s.var, start, stop)  # type: ignore[arg-type]
            if cuts and len(cuts) < MAX_PIECES:
                self.changed = True
                bounds = [start, *cuts, stop]
                pieces = []
                for lo, hi in zip(bounds, bounds[1:]):
                    var = E.Var(s.var.name, s.var.dtype)
                    fresh: dict[E.Var, E.Expr] = {
                        n.var: E.Var(n.var.name, n.var.dtype)
                        for n in walk(s.body) if isinstance(n, S.For)
                    }  # each piece binds its own inner loop variables
                    fresh[s.var] = var + lo if lo else var
                    body = substitute(s.body, fresh)
                    pieces.append(S.For(var, E.imm(0), E.imm(hi - lo), self.mutate(body)))
                return S.Block(tuple(pieces))
        return self.generic_mutate(s)

    def mutate_Block(self, s: S.Block) -> S.Stmt:
        stmts = [self.mutate(c) for c in s.stmts]
        if all(n is o for n, o in zip(stmts, s.stmts)):
            return s
        return S.Block.make(*stmts)


def partition_loops(stmt: Any) -> Any:
    """Split loops at the constants their variable is compared with; see the module docstring."""
    split = _Partition()
    out = split.mutate(stmt)
    if not split.changed:
        return stmt
    return _Decide().mutate(out)
