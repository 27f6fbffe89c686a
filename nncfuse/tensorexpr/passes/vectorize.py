"""vectorize_inner_loops: run innermost loops a vector of lanes at a time, with a scalar tail.

    for (i = 0; i < 100; i++)                  for (i = 0; i < 6; i++)
      out[i] = t0[i] * 2.f;             ->       out[Ramp(16 * i, 1, 16)] =
                                                     t0[Ramp(16 * i, 1, 16)] * Broadcast(2.f, 16);
                                               for (i_1 = 96; i_1 < 100; i_1++)
                                                 out[i_1] = t0[i_1] * 2.f;
The loop variable becomes `Ramp(start + lanes * i, 1, lanes)` and every
expression that depends on it is widened: index arithmetic stays a Ramp where
it is affine, loop-invariant values stay scalar until combined with a vector
(`Broadcast`), `Let`s bind vectors, a `Reduce` accumulates a vector (one
result per lane: a column sum). A body that cannot be widened (nested
loops, a store whose address does not vary with the loop) is left scalar.
The lane count comes from the widest value type in the body: a register's
width (512 bits with AVX-512) divided by that type's bits.
Run on flat indices (after `flatten_indices`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from .. import expr as E
from .. import stmt as S
from ..dtype import INDEX
from ..ir_visitor import Mutator, substitute, walk


class _Unvectorizable(Exception):
    pass


def _lanes_of(e: E.Expr) -> int:
    return e.dtype.lanes


class _Widen:
    """Widens the body of one loop whose variable stands for `ramp`."""

    def __init__(self, var: E.Var, ramp: E.Ramp):
        self.lanes = ramp.lanes
        self.env: dict[E.Var, E.Expr] = {var: ramp}

    def wide(self, e: E.Expr) -> E.Expr:
        return E.broadcast(e, self.lanes)

    def expr(self, e: E.Expr) -> E.Expr:
        if isinstance(e, E.Var):
            return self.env.get(e, e)
        if isinstance(e, E.Imm):
            return e
        if isinstance(e, (E.Ramp, E.Broadcast)):
            raise _Unvectorizable("already vectorized")
        if isinstance(e, E.BinaryOp):
            a, b = self.expr(e.a), self.expr(e.b)
            if _lanes_of(a) == 1 and _lanes_of(b) == 1:
                return e if (a is e.a and b is e.b) else type(e)(a, b)
            affine = self.affine(e, a, b)
            if affine is not None:
                return affine
            return type(e)(self.wide(a), self.wide(b))
        if isinstance(e, E.Load):
            indices = tuple(self.expr(i) for i in e.indices)
            if all(_lanes_of(i) == 1 for i in indices):
                return e if indices == e.indices else E.Load(e.buf, indices)
            return E.Load(e.buf, tuple(self.wide(i) for i in indices))
        if isinstance(e, E.Cmp):
            a, b = self.expr(e.a), self.expr(e.b)
            if _lanes_of(a) == _lanes_of(b) == 1:
                return E.Cmp(e.op, a, b)
            return E.Cmp(e.op, self.wide(a), self.wide(b))
        if isinstance(e, E.Select):
            parts = [self.expr(p) for p in (e.cond, e.true_value, e.false_value)]
            if all(_lanes_of(p) == 1 for p in parts):
                return E.Select(*parts)
            return E.Select(*(self.wide(p) for p in parts))
        if isinstance(e, (E.Cast, E.Bitcast)):
            v = self.expr(e.value)
            return type(e)(e.dtype.with_lanes(_lanes_of(v)), v)
        if isinstance(e, E.Reduce):
            # Each lane reduces on its own (a reduction over an outer dim, vectorized
            # across the kept inner one); its variables stay scalar.
            init, body = self.expr(e.init), self.expr(e.body)
            if _lanes_of(init) == _lanes_of(body) == 1:
                same = init is e.init and body is e.body
                return e if same else replace(e, init=init, body=body)
            return E.Reduce(e.op, self.wide(init), self.wide(body), e.vars, e.stops)
        if isinstance(e, E.Call):
            args = [self.expr(a) for a in e.args]
            if all(_lanes_of(a) == 1 for a in args):
                return E.Call(e.name, tuple(args))
            return E.Call(e.name, tuple(self.wide(a) for a in args))
        raise _Unvectorizable(type(e).__name__)

    def affine(self, e: E.BinaryOp, a: E.Expr, b: E.Expr) -> E.Expr | None:
        """Keep `Ramp + x`, `Ramp - x`, `Ramp * c` as Ramps (index arithmetic)."""
        if e.dtype.scalar != INDEX:
            return None
        ra, rb = isinstance(a, E.Ramp), isinstance(b, E.Ramp)
        if isinstance(e, E.Add) and ra and rb:
            return E.Ramp(a.base + b.base, a.stride + b.stride, self.lanes)  # type: ignore
        if isinstance(e, (E.Add, E.Sub)) and ra and _lanes_of(b) == 1:
            return E.Ramp(type(e)(a.base, b), a.stride, self.lanes)  # type: ignore
        if isinstance(e, E.Add) and rb and _lanes_of(a) == 1:
            return E.Ramp(a + b.base, b.stride, self.lanes)  # type: ignore
        if isinstance(e, E.Mul) and ra and _lanes_of(b) == 1:
            return E.Ramp(a.base * b, a.stride * b, self.lanes)  # type: ignore
        if isinstance(e, E.Mul) and rb and _lanes_of(a) == 1:
            return E.Ramp(a * b.base, a * b.stride, self.lanes)  # type: ignore
        return None

    def stmt(self, s: S.Stmt) -> S.Stmt:
        if isinstance(s, S.Block):
            return S.Block(tuple(self.stmt(c) for c in s.stmts))
        if isinstance(s, S.Let):
            value = self.expr(s.value)
            # A fresh variable even for a scalar: the scalar tail loop binds the original.
            var = E.Var(s.var.name, value.dtype)
            self.env[s.var] = var
            return S.Let(var, value)
        if isinstance(s, S.Store):
            indices = tuple(self.expr(i) for i in s.indices)
            value = self.expr(s.value)
            if all(_lanes_of(i) == 1 for i in indices):
                if _lanes_of(value) == 1:
                    return S.Store(s.buf, indices, value)
                raise _Unvectorizable("store address does not depend on the loop")
            return S.Store(s.buf, tuple(self.wide(i) for i in indices), self.wide(value))
        raise _Unvectorizable(type(s).__name__)


def lanes_for(body: Any, vector_bits: int) -> int:
    """Lanes for a loop body: register width over the widest value type (>= 32 bits)."""
    bits = 32
    for n in walk(body):
        if isinstance(n, (E.Load, S.Store)):
            dtype = n.buf.dtype
        elif isinstance(n, S.Let):
            dtype = n.var.dtype
        else:
            continue
        if dtype.scalar != INDEX:
            bits = max(bits, dtype.scalar.bits)
    return max(1, vector_bits // bits)


class _Vectorize(Mutator):
    def __init__(self, vector_bits: int):
        self.vector_bits = vector_bits

    def mutate_For(self, s: S.For) -> S.Stmt:
        body = self.mutate(s.body)
        if body is not s.body or any(isinstance(n, S.For) for n in walk(body)):
            return s if body is s.body else S.For(s.var, s.start, s.stop, body, s.parallel)
        lanes = lanes_for(body, self.vector_bits)
        static = isinstance(s.start, E.Imm) and isinstance(s.stop, E.Imm)
        if lanes < 2 or static and s.stop.value - s.start.value < lanes:  # type: ignore
            return s
        outer = E.Var(s.var.name)
        ramp = E.Ramp(s.start + outer * lanes, E.imm(1), lanes)
        try:
            wide = _Widen(s.var, ramp).stmt(body)
        except _Unvectorizable:
            return s
        if static:
            count = s.stop.value - s.start.value  # type: ignore[operator]
            vectors, main_end = E.imm(count // lanes), E.imm(s.start.value + count // lanes * lanes)
        else:  # symbolic bounds (a dynamic kernel): the split is computed at run time
            vectors = (s.stop - s.start) / lanes
            main_end = s.start + vectors * lanes
        main = S.For(outer, E.imm(0), vectors, wide, s.parallel)
        if static and main_end.value == s.stop.value:  # type: ignore[attr-defined]
            return main
        tail_var = E.Var(s.var.name)
        tail = S.For(tail_var, main_end, s.stop, substitute(body, {s.var: tail_var}))
        return S.Block((main, tail))


def vectorize_inner_loops(stmt: S.Stmt, vector_bits: int = 512) -> S.Stmt:
    """Vectorize every innermost loop (with a tail computed at run time where its bounds
    are symbolic); see the module docstring."""
    return _Vectorize(vector_bits).mutate(stmt)
