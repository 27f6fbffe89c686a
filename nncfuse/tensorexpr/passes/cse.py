"""eliminate_common_subexpressions: compute each repeated value once per iteration.

    for i: {                                     for i: {
      y[i] = sin(t0[i] * t0[i]);                   float v = t0[i];
      z[i] = y[i] * y[i];                  ->      float v_1 = sin(v * v);
    }                                              y[i] = v_1;
                                                   z[i] = v_1 * v_1;
                                                 }
In every straight-line loop body (Lets and Stores only), a load of an element
stored earlier in the same body becomes the stored value, and then, largest
first, every subexpression that occurs twice or more is bound by a `Let`
before its first use. Index arithmetic is left alone: the vectorizer must
see it, and LLVM shares it anyway. The body of a `Reduce` is not searched
(its values depend on the reduction's variables; LLVM shares those), nor are the
branches of a scalar select with a `Reduce` in one, which only the branch taken runs.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from .. import expr as E
from .. import stmt as S
from ..dtype import INDEX
from ..ir_visitor import Mutator, branches_reduce, children, walk


def _candidate(e: E.Expr) -> bool:
    if isinstance(e, (E.Var, E.Imm, E.Ramp)) or e.dtype.scalar == INDEX:
        return False
    return not (isinstance(e, E.Broadcast) and isinstance(e.value, (E.Var, E.Imm)))


def _outside_reductions(e: E.Expr) -> Any:
    """The nodes of `e`, parents first, but not those inside a `Reduce`'s body (they may
    use its variables, which a `Let` before the statement cannot see), nor in the branches
    of a select that reduces in one (`branches_reduce`: bound before it, they would be
    computed whichever branch is taken)."""
    stack = [e]
    while stack:
        n = stack.pop()
        yield n
        if isinstance(n, E.Reduce):
            stack.extend(reversed((n.init, *n.stops)))
        elif branches_reduce(n):
            stack.append(n.cond)
        else:
            stack.extend(reversed(list(children(n))))


def _size(e: E.Expr) -> int:
    return sum(1 for _ in walk(e))


class _Replace(Mutator):
    def __init__(self, mapping: dict[Any, E.Expr]):
        self.mapping = mapping

    def mutate(self, node: Any) -> Any:
        if isinstance(node, E.Expr):
            hit = self.mapping.get(node)
            if hit is not None:
                return hit
        return super().mutate(node)


def _exprs(stmt: S.Stmt) -> list[E.Expr]:
    return [c for c in children(stmt) if isinstance(c, E.Expr)]


def _forward_stores(stmts: list[S.Stmt], names: _Namer) -> list[S.Stmt]:
    reloaded = {
        (n.buf.root, n.indices)
        for s in stmts
        for e in _exprs(s)
        for n in walk(e)
        if isinstance(n, E.Load)
    }
    known: dict[Any, E.Expr] = {}
    out: list[S.Stmt] = []
    for s in stmts:
        if known:
            s = _Replace(known).mutate(s)
        if isinstance(s, S.Store):
            for key in [k for k in known if k.buf.root is s.buf.root]:
                del known[key]  # another store to this buffer may alias
            if (s.buf.root, s.indices) in reloaded and not isinstance(s.value, (E.Var, E.Imm)):
                var = names.new(s.value.dtype)
                out.append(S.Let(var, s.value))
                s = S.Store(s.buf, s.indices, var)
            known[E.Load(s.buf, s.indices)] = s.value
        out.append(s)
    return out


class _Namer:
    def new(self, dtype: Any) -> E.Var:
        return E.Var("v", dtype)


def _bind_repeated(stmts: list[S.Stmt], names: _Namer) -> list[S.Stmt]:
    while True:
        counts: Counter = Counter()
        first: dict[E.Expr, int] = {}
        for k, s in enumerate(stmts):
            for root in _exprs(s):
                for n in _outside_reductions(root):
                    if isinstance(n, E.Expr) and _candidate(n):
                        counts[n] += 1
                        first.setdefault(n, k)
        repeated = [e for e, c in counts.items() if c > 1]
        if not repeated:
            return stmts
        target = max(repeated, key=lambda e: (_size(e), -first[e]))
        var = names.new(target.dtype)
        k = first[target]
        replace = _Replace({target: var})
        stmts = stmts[:k] + [S.Let(var, target)] + [replace.mutate(s) for s in stmts[k:]]


class _CSE(Mutator):
    def __init__(self) -> None:
        self.names = _Namer()

    def mutate_Block(self, s: S.Block) -> S.Stmt:
        new = self.generic_mutate(s)
        if all(isinstance(c, (S.Let, S.Store)) for c in new.stmts):
            stmts = _bind_repeated(_forward_stores(list(new.stmts), self.names), self.names)
            if stmts != list(new.stmts):
                return S.Block(tuple(stmts))
        return new

    def mutate_For(self, s: S.For) -> S.Stmt:
        body = self.mutate(s.body)
        if isinstance(body, (S.Store, S.Let)):
            block = S.Block((body,))
            shared = self.mutate_Block(block)
            body = body if shared is block else shared  # a body of one, unless it changed
        return s if body is s.body else S.For(s.var, s.start, s.stop, body, s.parallel)


def eliminate_common_subexpressions(stmt: S.Stmt) -> S.Stmt:
    """Forward stores to loads and bind repeated values; see the module docstring."""
    return _CSE().mutate(stmt)
