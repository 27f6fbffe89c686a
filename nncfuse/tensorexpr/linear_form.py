"""linear_form: an index (int64) expression as a sum of constant multiples of atoms.

    (j * 4 + 1) * 2 + i      ->   8 * j + 1 * i + 2      (terms {j: 8, i: 1}, const 2)

Sums, differences and products by constants distribute; anything else (a
division, a remainder, a product of two variables) is an atom. The simplifier
(`passes/simplify`) rebuilds expressions from this form; passes and codegen read
it to learn an index's step along a loop variable or its alignment.
"""

from __future__ import annotations

from . import expr as E


class Linear:
    """An int64 expression as `sum(coeff * atom) + const`, atoms in first-seen order."""

    def __init__(self, terms: dict[E.Expr, int] | None = None, const: int = 0):
        self.terms = terms or {}
        self.const = const

    def scaled(self, c: int) -> Linear:
        return Linear({k: v * c for k, v in self.terms.items()}, self.const * c)

    def plus(self, other: Linear, sign: int = 1) -> Linear:
        terms = dict(self.terms)
        for k, v in other.terms.items():
            terms[k] = terms.get(k, 0) + sign * v
        return Linear({k: v for k, v in terms.items() if v}, self.const + sign * other.const)


def linear(e: E.Expr) -> Linear:
    """`e` in linear form: constant multiples of its atoms, plus a constant."""
    if isinstance(e, E.Imm):
        return Linear(const=e.value)  # type: ignore[arg-type]
    if isinstance(e, (E.Add, E.Sub)):
        return linear(e.a).plus(linear(e.b), 1 if isinstance(e, E.Add) else -1)
    if isinstance(e, E.Mul):
        la, lb = linear(e.a), linear(e.b)
        if not lb.terms:
            return la.scaled(lb.const)
        if not la.terms:
            return lb.scaled(la.const)
    return Linear({e: 1})
