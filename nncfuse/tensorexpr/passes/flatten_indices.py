"""flatten_indices: address every buffer with one element offset computed from its strides.

    for i: for j:                           for i: for j:
      out[i, j] = a[i, j] + b[j];    ->       out[4 * i + j] = a[i + 8 * j] + b[j];
where `out` is 8x4, `a` a transposed 8x4 input (strides 1, 8) and `b`
broadcasts along `i` (after `simplify` drops the zero terms). After this pass every access
is to a one-dimensional, unit-stride view (`Buf.flat`) of the same memory,
which is what codegen expects.
"""

from __future__ import annotations

from .. import expr as E
from .. import stmt as S
from ..buffer import Buf
from ..ir_visitor import Mutator


def _offset(buf: Buf, indices: tuple[E.Expr, ...]) -> tuple[E.Expr, ...]:
    total: E.Expr = E.imm(0)
    for index, stride in zip(indices, buf.strides):
        total = total + index * stride
    return (total,)


class _Flatten(Mutator):
    def __init__(self) -> None:
        self.flat: dict[Buf, Buf] = {}

    def view(self, buf: Buf) -> Buf:
        if buf.base is not None and buf.ndim == 1:
            return buf
        if buf not in self.flat:
            self.flat[buf] = buf.flat()
        return self.flat[buf]

    def mutate_Load(self, e: E.Load) -> E.Expr:
        indices = tuple(self.mutate(i) for i in e.indices)
        return E.Load(self.view(e.buf), _offset(e.buf, indices))

    def mutate_Store(self, s: S.Store) -> S.Stmt:
        indices = tuple(self.mutate(i) for i in s.indices)
        return S.Store(self.view(s.buf), _offset(s.buf, indices), self.mutate(s.value))

    def mutate_Allocate(self, s: S.Allocate) -> S.Stmt:
        return S.Allocate(self.view(s.buf))

    def mutate_Free(self, s: S.Free) -> S.Stmt:
        return S.Free(self.view(s.buf))


def flatten_indices(stmt: S.Stmt) -> S.Stmt:
    """Rewrite multi-dimensional accesses as flat offsets; run `simplify` after it."""
    return _Flatten().mutate(stmt)
