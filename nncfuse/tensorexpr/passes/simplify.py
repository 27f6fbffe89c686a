"""simplify: fold constants, apply exact algebraic identities, normalize index arithmetic.

    for (int64_t i = 0; i < 1; i++) {          a[0] = 2.f * b[8 * j + 3];
      a[i] = (1.f + 1.f) * b[(j * 4 + 1) * 2 + 1];
    }
becomes the right-hand side: the unit loop is gone (and loops that run zero
times vanish), `1.f + 1.f` folds, and the index is rewritten as a linear
form. Index (int64) expressions are normalized to `c1 * x1 + ... + c0`, which
lets division and remainder by a constant be resolved from the ranges of the
loop variables, e.g. `(i / 4) * 4 + i % 4` becomes `i` and, for `0 <= i < 4`,
`(j * 4 + i) / 4` becomes `j`.

The local rewrites are `RULES`, one line each (`ir_pattern`). Float rules
are exact only: `x * 1`, `x / 1`, `x - 0` and `x + -0.` are `x`; `x + 0.`
is not (it turns -0. into +0.). Constants fold with the interpreter's
semantics, so folding never changes a result; operators fold where their
`ops` row says so (intrinsic calls do not). The index arithmetic is code,
not rules: linear forms and the ranges of loop variables.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from .. import expr as E
from .. import stmt as S
from ..dtype import INDEX
from ..ir_eval import evaluate
from ..ir_pattern import CONSTS, Const, Node, Rules, Wild, cast, max_, min_, not_float, rule, select
from ..ir_visitor import Mutator, substitute, walk
from ..linear_form import Linear, linear

Bounds = tuple[int, int] | None


def _const_value(e: E.Expr) -> Any:
    if isinstance(e, E.Broadcast):
        e = e.value
    return e.value if isinstance(e, E.Imm) else None


def _fold(e: E.Expr, **bound: E.Expr) -> E.Imm:
    """The value of a scalar node whose operands are immediates, as the interpreter computes it."""
    return E.Imm.make(evaluate(e).item(), e.dtype)


def _widening(src: E.Dtype, dst: E.Dtype) -> bool:
    """Whether every value of `src` is exactly representable in `dst`."""
    if src.is_float and dst.is_float:
        order = {"float16": 1, "bfloat16": 1, "float32": 2, "float64": 3}
        return order[dst.name] > order[src.name]
    if src.is_int and dst.is_int:
        return src.is_signed == dst.is_signed and dst.bits >= src.bits
    return False


def _round_trip(e: E.Expr, x: E.Expr) -> bool:
    """`e` converts `x` to a wider type and back."""
    return x.dtype == e.dtype and _widening(x.dtype, e.value.dtype)  # type: ignore[attr-defined]


x, y = Wild("x"), Wild("y")
c0, c1, c2 = Const("c0"), Const("c1"), Const("c2")

#: The local rewrites, tried in order; the first that applies wins. A number in a pattern
#: is an immediate of the node's type, scalar or broadcast, with that sign of zero.
RULES = Rules([
    # Constant folding with the interpreter's semantics, so folding never changes a result.
    rule(Node((E.BinaryOp, E.Cmp, E.Call), CONSTS), _fold, when=lambda e: e.row.fold),
    rule(select(c0, c1, c2), _fold),
    rule(cast(c0), _fold),
    # Identities: exact for floats too, unless `not_float`.
    rule(x + 0, x, when=not_float),  # floats: -0. + 0. is +0.
    rule(0 + x, x, when=not_float),
    rule(x + -0.0, x),  # exact for every float
    rule(x - 0, x),  # -0. - 0. is -0.
    rule(x * 1, x),
    rule(1 * x, x),
    rule(x / 1, x),
    rule(x | 0, x, when=not_float),
    rule(x ^ 0, x, when=not_float),
    rule(max_(x, x), x),  # NaN too
    rule(min_(x, x), x),
    rule(cast(cast(x)), x, when=_round_trip),  # through a type that holds every value of x's
    rule(select(c0, x, y), lambda e, c0, x, y: x if c0.value else y),
])


def factors(e: E.Expr) -> list[E.Expr]:
    """The factors of a product of int64 expressions (`e` itself if it is no product)."""
    if isinstance(e, E.Mul) and e.dtype == INDEX:
        return [*factors(e.a), *factors(e.b)]
    return [e]


def coefficient(index: E.Expr, var: E.Var) -> int | None:
    """`var`'s coefficient in `index` if `index` is linear in it; None where `var` is also in
    another of `linear`'s atoms (`16 * j + 32 * (j / 2)`: not one vector after the other)."""
    terms = linear(index).terms
    if any(atom is not var and any(n is var for n in walk(atom)) for atom in terms):
        return None
    return terms.get(var, 0)  # type: ignore[return-value]


class Simplifier(Mutator):
    def __init__(self) -> None:
        self.ranges: dict[E.Var, tuple[int, int]] = {}

    # -- bounds -------------------------------------------------------------
    def bounds(self, e: E.Expr) -> Bounds:
        if isinstance(e, E.Imm) and e.dtype == INDEX:
            return (e.value, e.value)  # type: ignore[return-value]
        if isinstance(e, E.Var):
            return self.ranges.get(e)
        if isinstance(e, (E.Add, E.Sub, E.Mul, E.Div, E.Mod)):
            a, b = self.bounds(e.a), self.bounds(e.b)
            if a is None or b is None:
                return None
            if isinstance(e, E.Add):
                return (a[0] + b[0], a[1] + b[1])
            if isinstance(e, E.Sub):
                return (a[0] - b[1], a[1] - b[0])
            if isinstance(e, E.Mul):
                prods = [x * y for x in a for y in b]
                return (min(prods), max(prods))
            if b[0] > 0 and a[0] >= 0:
                if isinstance(e, E.Div):
                    return (a[0] // b[1], a[1] // b[0])
                return (0, min(a[1], b[1] - 1))
        return None

    # -- index arithmetic ---------------------------------------------------
    def rebuild(self, lin: Linear) -> E.Expr:
        lin = self.recombine(lin)
        out: E.Expr | None = None
        for atom, c in lin.terms.items():
            term = atom if abs(c) == 1 else E.Mul(E.imm(abs(c)), atom)
            if out is None:
                out = term if c > 0 else E.Sub(E.imm(0), term)
            else:
                out = E.Add(out, term) if c > 0 else E.Sub(out, term)
        if out is None:
            return E.imm(lin.const)
        if lin.const:
            out = E.Add(out, E.imm(lin.const)) if lin.const > 0 else E.Sub(out, E.imm(-lin.const))
        return out

    def recombine(self, lin: Linear) -> Linear:
        """`c*d*(x / d) + c*(x % d)` -> `c*x`, for every such pair of atoms (d a constant, or
        a product of size symbols: then the atom `d * (x / d)`, its factors in any order)."""
        terms = dict(lin.terms)
        for atom in list(terms):
            if not isinstance(atom, E.Mod) or atom not in terms:
                continue
            div: E.Expr = E.Div(atom.a, atom.b)
            c = terms[atom]
            if E.is_const(atom.b):
                want = c * atom.b.value  # type: ignore[union-attr]
            else:  # symbolic: the product atom whose factors are d's and (x / d)
                want = c
                wanted = Counter([*factors(atom.b), div])
                div = next((t for t in terms if Counter(factors(t)) == wanted), div)
            if div is not atom and terms.get(div) == want:
                del terms[atom], terms[div]
                inner = linear(atom.a)
                for k, v in inner.terms.items():
                    terms[k] = terms.get(k, 0) + c * v
                return self.recombine(Linear(terms, lin.const + c * inner.const))
        return Linear({k: v for k, v in terms.items() if v}, lin.const)

    def div_mod(self, e: E.Div | E.Mod) -> E.Expr | None:
        """Resolve `x / d` and `x % d` for a constant d > 0 and x known non-negative."""
        d = _const_value(e.b)
        if not isinstance(d, int) or isinstance(d, bool) or d <= 0:
            return None
        whole = self.bounds(e.a)
        if whole is None or whole[0] < 0:
            return None
        lin = linear(e.a)
        quotient = Linear({k: v // d for k, v in lin.terms.items() if v % d == 0}, lin.const // d)
        rest = Linear({k: v for k, v in lin.terms.items() if v % d}, lin.const % d)
        rest_e = self.rebuild(rest)
        rb = self.bounds(rest_e)
        if rb is None or rb[0] < 0:
            return None
        if isinstance(e, E.Mod):
            if rb[1] < d:
                return rest_e
            return E.Mod(rest_e, e.b) if quotient.terms or quotient.const else None
        if rb[1] < d:
            return self.rebuild(quotient)
        if not quotient.terms and not quotient.const:
            return None
        return self.rebuild(quotient.plus(Linear({E.Div(rest_e, e.b): 1})))

    # -- expressions --------------------------------------------------------
    def mutate(self, node: Any) -> Any:
        new = super().mutate(node)
        if isinstance(new, E.Expr):
            new = self.rewrite(new)
        return new

    def rewrite(self, e: E.Expr) -> E.Expr:
        new = RULES.rewrite(e)
        if new is not None:
            return new
        if isinstance(e, E.BinaryOp) and e.dtype == INDEX:
            if isinstance(e, (E.Div, E.Mod)):
                resolved = self.div_mod(e)
                if resolved is not None:
                    return resolved
            if isinstance(e, (E.Add, E.Sub, E.Mul)):
                rebuilt = self.rebuild(linear(e))
                return e if rebuilt == e else rebuilt
        return e

    # -- statements ---------------------------------------------------------
    def mutate_For(self, s: S.For) -> S.Stmt:
        start, stop = self.mutate(s.start), self.mutate(s.stop)
        if isinstance(start, E.Imm) and isinstance(stop, E.Imm):
            if stop.value <= start.value:  # type: ignore[operator]
                return S.Block(())
            if stop.value == start.value + 1:  # type: ignore[operator]
                return self.mutate(substitute(s.body, {s.var: start}))
            self.ranges[s.var] = (start.value, stop.value - 1)  # type: ignore[assignment,operator]
        body = self.mutate(s.body)
        self.ranges.pop(s.var, None)
        if isinstance(body, S.Block) and not body.stmts:
            return body
        if start is s.start and stop is s.stop and body is s.body:
            return s
        return S.For(s.var, start, stop, body, s.parallel)

    def mutate_Reduce(self, e: E.Reduce) -> E.Expr:
        """Ranges of its variables known in the body; unit axes substituted; an empty box
        is the init."""
        init = self.mutate(e.init)
        stops = tuple(self.mutate(s) for s in e.stops)
        if any(E.is_const(s) and s.value <= 0 for s in stops):  # type: ignore[attr-defined]
            return init
        unit = {v: E.imm(0) for v, s in zip(e.vars, stops) if E.is_const(s, 1)}
        axes = [(v, s) for v, s in zip(e.vars, stops) if v not in unit]
        for v, s in axes:
            if isinstance(s, E.Imm):
                self.ranges[v] = (0, s.value - 1)  # type: ignore[assignment,operator]
        body = self.mutate(substitute(e.body, unit) if unit else e.body)
        for v, _ in axes:
            self.ranges.pop(v, None)
        if not axes:
            return self.rewrite(E.combine(e.op, init, body))
        if init is e.init and body is e.body and stops == e.stops and not unit:
            return e
        return E.Reduce(e.op, init, body, tuple(v for v, _ in axes), tuple(s for _, s in axes))

    def mutate_Block(self, s: S.Block) -> S.Stmt:
        stmts = [self.mutate(c) for c in s.stmts]
        if all(n is o for n, o in zip(stmts, s.stmts)):
            return s
        return S.Block.make(*(c for c in stmts if not (isinstance(c, S.Block) and not c.stmts)))


def simplify(stmt: Any) -> Any:
    """`stmt` (or an expression) simplified; the same object if nothing applies."""
    return Simplifier().mutate(stmt)
