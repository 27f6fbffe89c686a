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

Float rules are exact only: `x * 1`, `x / 1`, `x - 0` and `x + -0.` are
`x`; `x + 0.` is not (it turns -0. into +0.). Constants fold with the
interpreter's semantics, so folding never changes a result; intrinsic calls
are not folded.
"""

from __future__ import annotations

from typing import Any

from .. import expr as E
from .. import stmt as S
from ..dtype import INDEX
from ..ir_eval import evaluate
from ..ir_visitor import Mutator, children, substitute

Bounds = tuple[int, int] | None

# Identities: (node type, constant side, constant value, applies to floats) -> keep other side.
_IDENTITIES = [
    (E.Add, "b", 0, False),  # x + 0 -> x (integers; floats would lose -0.)
    (E.Add, "a", 0, False),  # 0 + x -> x
    (E.Add, "b", -0.0, True),  # x + -0. -> x, exact for every float x
    (E.Sub, "b", 0, True),  # x - 0 -> x
    (E.Mul, "b", 1, True),  # x * 1 -> x
    (E.Mul, "a", 1, True),  # 1 * x -> x
    (E.Div, "b", 1, True),  # x / 1 -> x
    (E.Or, "b", 0, False),  # x | 0 -> x
    (E.Xor, "b", 0, False),  # x ^ 0 -> x
]


def _is_neg_zero(v: Any) -> bool:
    return isinstance(v, float) and v == 0.0 and str(v).startswith("-")


def _const_value(e: E.Expr) -> Any:
    if isinstance(e, E.Broadcast):
        e = e.value
    return e.value if isinstance(e, E.Imm) else None


def _identity(e: E.BinaryOp) -> E.Expr | None:
    for node_type, side, value, floats in _IDENTITIES:
        if type(e) is not node_type or (e.dtype.is_float and not floats):
            continue
        const = _const_value(e.b if side == "b" else e.a)
        if const is None or isinstance(const, bool):
            continue
        if _is_neg_zero(value):
            hit = _is_neg_zero(const)
        else:
            hit = const == value and not (e.dtype.is_float and value == 0 and _is_neg_zero(const))
        if hit:
            return e.a if side == "b" else e.b
    return None


def _fold(e: E.Expr) -> E.Imm:
    """Evaluate a scalar expression whose operands are immediates."""
    return E.Imm.make(evaluate(e).item(), e.dtype)


_FOLDABLE = (E.BinaryOp, E.Cmp, E.Select, E.Cast)


def _widening(src: E.Dtype, dst: E.Dtype) -> bool:
    """Whether every value of `src` is exactly representable in `dst`."""
    if src.is_float and dst.is_float:
        order = {"float16": 1, "bfloat16": 1, "float32": 2, "float64": 3}
        return order[dst.name] > order[src.name]
    if src.is_int and dst.is_int:
        return src.is_signed == dst.is_signed and dst.bits >= src.bits
    return False


class _Linear:
    """An int64 expression as `sum(coeff * atom) + const`, atoms in first-seen order."""

    def __init__(self, terms: dict[E.Expr, int] | None = None, const: int = 0):
        self.terms = terms or {}
        self.const = const

    def scaled(self, c: int) -> _Linear:
        return _Linear({k: v * c for k, v in self.terms.items()}, self.const * c)

    def plus(self, other: _Linear, sign: int = 1) -> _Linear:
        terms = dict(self.terms)
        for k, v in other.terms.items():
            terms[k] = terms.get(k, 0) + sign * v
        return _Linear({k: v for k, v in terms.items() if v}, self.const + sign * other.const)


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
    def linear(self, e: E.Expr) -> _Linear:
        if isinstance(e, E.Imm):
            return _Linear(const=e.value)  # type: ignore[arg-type]
        if isinstance(e, (E.Add, E.Sub)):
            return self.linear(e.a).plus(self.linear(e.b), 1 if isinstance(e, E.Add) else -1)
        if isinstance(e, E.Mul):
            la, lb = self.linear(e.a), self.linear(e.b)
            if not lb.terms:
                return la.scaled(lb.const)
            if not la.terms:
                return lb.scaled(la.const)
        return _Linear({e: 1})

    def rebuild(self, lin: _Linear) -> E.Expr:
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

    def recombine(self, lin: _Linear) -> _Linear:
        """`c*d*(x / d) + c*(x % d)` -> `c*x`, for every such pair of atoms."""
        terms = dict(lin.terms)
        for atom in list(terms):
            if not isinstance(atom, E.Mod) or atom not in terms or not E.is_const(atom.b):
                continue
            div = E.Div(atom.a, atom.b)
            c, d = terms[atom], atom.b.value  # type: ignore[union-attr]
            if terms.get(div) == c * d:  # type: ignore[operator]
                del terms[atom], terms[div]
                inner = self.linear(atom.a)
                for k, v in inner.terms.items():
                    terms[k] = terms.get(k, 0) + c * v
                return self.recombine(_Linear(terms, lin.const + c * inner.const))
        return _Linear({k: v for k, v in terms.items() if v}, lin.const)

    def div_mod(self, e: E.Div | E.Mod) -> E.Expr | None:
        """Resolve `x / d` and `x % d` for a constant d > 0 and x known non-negative."""
        d = _const_value(e.b)
        if not isinstance(d, int) or isinstance(d, bool) or d <= 0:
            return None
        whole = self.bounds(e.a)
        if whole is None or whole[0] < 0:
            return None
        lin = self.linear(e.a)
        quotient = _Linear({k: v // d for k, v in lin.terms.items() if v % d == 0}, lin.const // d)
        rest = _Linear({k: v for k, v in lin.terms.items() if v % d}, lin.const % d)
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
        return self.rebuild(quotient.plus(_Linear({E.Div(rest_e, e.b): 1})))

    # -- expressions --------------------------------------------------------
    def mutate(self, node: Any) -> Any:
        new = super().mutate(node)
        if isinstance(new, E.Expr):
            new = self.rewrite(new)
        return new

    def rewrite(self, e: E.Expr) -> E.Expr:
        if isinstance(e, _FOLDABLE) and e.dtype.lanes == 1:
            if all(isinstance(c, E.Imm) for c in children(e)):
                return _fold(e)
        if isinstance(e, E.BinaryOp):
            kept = _identity(e)
            if kept is not None:
                return kept
            if e.dtype == INDEX:
                if isinstance(e, (E.Div, E.Mod)):
                    resolved = self.div_mod(e)
                    if resolved is not None:
                        return resolved
                if isinstance(e, (E.Add, E.Sub, E.Mul)):
                    rebuilt = self.rebuild(self.linear(e))
                    return e if rebuilt == e else rebuilt
            if isinstance(e, (E.Max, E.Min)) and e.a == e.b:
                return e.a
        if isinstance(e, E.Cast):
            inner = e.value
            if isinstance(inner, E.Cast) and inner.value.dtype == e.dtype:
                if _widening(e.dtype, inner.dtype):
                    return inner.value
        if isinstance(e, E.Select) and isinstance(e.cond, E.Imm):
            return e.true_value if e.cond.value else e.false_value
        if isinstance(e, E.Broadcast) and isinstance(e.value, E.Broadcast):
            return e.value
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

    def mutate_Block(self, s: S.Block) -> S.Stmt:
        stmts = [self.mutate(c) for c in s.stmts]
        if all(n is o for n, o in zip(stmts, s.stmts)):
            return s
        return S.Block.make(*(c for c in stmts if not (isinstance(c, S.Block) and not c.stmts)))


def simplify(stmt: Any) -> Any:
    """`stmt` (or an expression) simplified; the same object if nothing applies."""
    return Simplifier().mutate(stmt)
