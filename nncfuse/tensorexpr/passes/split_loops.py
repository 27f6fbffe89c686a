"""split_loops: split a loop whose variable an index divides by a constant into the two loops
the quotient and the remainder walk, so that neither is computed per element.

    for (k = 0; k < 256; k++)                       for (k_o = 0; k_o < 4; k_o++)
      out[256 * j + k] =                     ->       for (k_i = 0; k_i < 64; k_i++)
        t0[8192 * (k / 64) + 64 * j + k % 64];           out[256 * j + 64 * k_o + k_i] =
                                                           t0[8192 * k_o + 64 * j + k_i];

A reshape that merges dims of a permuted tensor reads it at the merged index's
quotient and remainder (attention's head merge, `x.transpose(1, 2).reshape(b, s, -1)`):
vectorized as it is, every vector of the loop is a gather. The loop of `N`
iterations splits at a divisor `c` of `N` that some index divides its variable
by (`c` at least `MIN_INNER`, so that the inner loop still vectorizes), kept
only if simplification then removes every division and remainder of the two
new variables. The iterations run in the same order. Run on flat indices
(after `flatten_indices`), before `collapse_loops`.
"""

from __future__ import annotations

from dataclasses import replace

from .. import expr as E
from .. import stmt as S
from ..dtype import INDEX
from ..ir_visitor import Mutator, substitute, walk
from .simplify import simplify

#: The shortest inner loop a split makes: a vector of float32 on AVX-512.
MIN_INNER = 16


def _divisors(body: S.Stmt, var: E.Var) -> list[int]:
    """The constants an index in `body` divides (or takes the remainder of) `var` by."""
    found = {
        int(n.b.value)
        for n in walk(body)
        if isinstance(n, (E.Div, E.Mod)) and n.dtype == INDEX and isinstance(n.b, E.Imm)
        and any(m is var for m in walk(n.a))
    }
    return sorted(found, reverse=True)


def _divides(stmt: S.Stmt, variables: tuple[E.Var, ...]) -> bool:
    """Whether an index in `stmt` still divides an expression of one of `variables`."""
    return any(
        isinstance(n, (E.Div, E.Mod)) and n.dtype == INDEX
        and any(m is v for m in walk(n) for v in variables)
        for n in walk(stmt)
    )


def _try_split(loop: S.For) -> S.Stmt | None:
    if loop.parallel or not E.is_const(loop.start, 0) or not isinstance(loop.stop, E.Imm):
        return None
    extent = int(loop.stop.value)
    for c in _divisors(loop.body, loop.var):
        if not (MIN_INNER <= c < extent and extent % c == 0):
            continue
        outer, inner = E.Var(f"{loop.var.name}_o"), E.Var(f"{loop.var.name}_i")
        body = substitute(loop.body, {loop.var: outer * E.imm(c) + inner})
        split = simplify(S.For(outer, E.imm(0), E.imm(extent // c),
                               S.For(inner, E.imm(0), E.imm(c), body)))
        if not _divides(split, (outer, inner)):
            return split
    return None


class _Split(Mutator):
    def mutate_For(self, s: S.For) -> S.Stmt:
        body = self.mutate(s.body)
        node = s if body is s.body else replace(s, body=body)
        split = _try_split(node)
        return node if split is None else split


def split_loops(stmt: S.Stmt) -> S.Stmt:
    """Split loops at the divisors their indices divide them by; see the module docstring."""
    return _Split().mutate(stmt)
