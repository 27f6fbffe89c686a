"""collapse_loops: turn a nest over a dense iteration space into fewer, longer loops.

    for (i = 0; i < 128; i++)                     for (i = 0; i < 16384; i++)
      for (j = 0; j < 128; j++)              ->       out[i] = t0[i] * 2.f;
        out[128 * i + j] = t0[128 * i + j] * 2.f;
Two directly nested loops (outer over `A`, inner over `B`) become one loop
over `A * B` with `i = v / B`, `j = v % B`, kept only if simplification
then removes every division and remainder (all accesses are dense across the
two loops). A long inner loop vectorizes without a tail per row. Run on flat
indices (after `flatten_indices`).
"""

from __future__ import annotations

from .. import expr as E
from .. import stmt as S
from ..dtype import INDEX
from ..ir_visitor import Mutator, substitute, walk
from .simplify import simplify


def _try_collapse(outer: S.For, inner: S.For) -> S.Stmt | None:
    if not all(E.is_const(b, 0) for b in (outer.start, inner.start)):
        return None
    if outer.parallel or inner.parallel:
        return None
    fused = E.Var(outer.var.name)
    body = substitute(inner.body, {outer.var: fused / inner.stop, inner.var: fused % inner.stop})
    body = simplify(S.For(fused, E.imm(0), outer.stop * inner.stop, body))
    if not isinstance(body, S.For):
        return body
    if any(
        isinstance(n, (E.Div, E.Mod)) and n.dtype == INDEX and any(m is fused for m in walk(n))
        for n in walk(body)
    ):
        return None  # an index still divides the fused variable: the loops are not dense
    return body


class _Collapse(Mutator):
    def mutate_For(self, s: S.For) -> S.Stmt:
        body = self.mutate(s.body)
        node = s if body is s.body else S.For(s.var, s.start, s.stop, body, s.parallel)
        inner = body.stmts[0] if isinstance(body, S.Block) and len(body.stmts) == 1 else body
        if isinstance(inner, S.For):
            collapsed = _try_collapse(node, inner)
            if collapsed is not None:
                return collapsed
        return node


def collapse_loops(stmt: S.Stmt) -> S.Stmt:
    """Collapse dense nested loops, innermost pairs first; see the module docstring."""
    return _Collapse().mutate(stmt)
