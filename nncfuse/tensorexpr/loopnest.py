"""Building and taking apart loop nests: the vocabulary the schedule passes share.

`compute` makes the loop nest that defines a tensor element by element:

    compute("aten_mul", [4, 8], lambda i, j: a[i, j] * b[j])
    ->  for (int64_t i = 0; i < 4; i++) {
          for (int64_t j = 0; j < 8; j++) {
            aten_mul[i, j] = a[i, j] * b[j];
          }
        }

`Nest` views a perfect nest (loops directly inside loops, down to a body)
as its loops and its body; `Nest.build` puts one back together.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from . import expr as E
from . import stmt as S
from .buffer import Buf
from .dtype import Dtype
from .ir_visitor import walk


def compute(
    name: str,
    dtype: Dtype,
    dims: Sequence[int | E.Expr],
    body: Callable[..., E.Expr],
    strides: Sequence[int | E.Expr] | None = None,
    order: Sequence[int] | None = None,
    out: Buf | None = None,
) -> tuple[Buf, S.Stmt]:
    """A buffer and the nest that stores `body(*indices)` into each of its elements.

    `order` lists the dimensions from the outermost loop inwards (default: in
    order); `out` is an existing buffer to store into instead of a new one.
    """
    buf = out if out is not None else Buf.make(name, dtype, dims, strides)
    names = "ijklmnopqrstuvwxyz"
    indices = [E.Var(names[k] if k < len(names) else f"i{k}") for k in range(buf.ndim)]
    value = body(*indices)
    if value.dtype != buf.dtype:
        raise TypeError(f"{name}: body gives {value.dtype}, buffer holds {buf.dtype}")
    nest: S.Stmt = S.Store(buf, tuple(indices), value)
    for k in reversed(list(order if order is not None else range(buf.ndim))):
        nest = S.For(indices[k], E.imm(0), buf.dims[k], nest)
    return buf, nest


@dataclass(frozen=True)
class Nest:
    """A perfect loop nest: `loops` from the outermost in, then `body`."""

    loops: tuple[S.For, ...]
    body: S.Stmt

    @staticmethod
    def of(stmt: S.Stmt) -> Nest:
        loops: list[S.For] = []
        while isinstance(stmt, S.For):
            loops.append(stmt)
            stmt = stmt.body
            if (
                isinstance(stmt, S.Block)
                and len(stmt.stmts) == 1
                and isinstance(stmt.stmts[0], S.For)
            ):
                stmt = stmt.stmts[0]
        return Nest(tuple(loops), stmt)

    @property
    def vars(self) -> tuple[E.Var, ...]:
        return tuple(loop.var for loop in self.loops)

    def build(self, body: S.Stmt | None = None) -> S.Stmt:
        out = self.body if body is None else body
        for loop in reversed(self.loops):
            out = S.For(loop.var, loop.start, loop.stop, out, loop.parallel)
        return out


def definition(stmt: S.Stmt) -> tuple[Buf, tuple[E.Var, ...], E.Expr] | None:
    """`(buf, indices, value)` if `stmt` is a nest made by `compute`, else None."""
    nest = Nest.of(stmt)
    body = nest.body
    if not isinstance(body, S.Store) or len(nest.loops) != body.buf.ndim:
        return None
    if {id(i) for i in body.indices} != {id(v) for v in nest.vars}:
        return None
    for loop in nest.loops:
        k = next(k for k, i in enumerate(body.indices) if i is loop.var)
        if not (E.is_const(loop.start, 0) and loop.stop == body.buf.dims[k]):
            return None
    return body.buf, body.indices, body.value  # type: ignore[return-value]


def extent(stmt: S.Stmt) -> int | None:
    """The number of iterations of a perfect nest with constant bounds."""
    total = 1
    for loop in Nest.of(stmt).loops:
        if not (isinstance(loop.start, E.Imm) and isinstance(loop.stop, E.Imm)):
            return None
        total *= max(0, loop.stop.value - loop.start.value)  # type: ignore[operator]
    return total


def stores(stmt: S.Stmt) -> list[S.Store]:
    return [n for n in walk(stmt) if isinstance(n, S.Store)]


def loads(node: E.Expr | S.Stmt) -> list[E.Load]:
    return [n for n in walk(node) if isinstance(n, E.Load)]


def buffers_stored(stmt: S.Stmt) -> set[Buf]:
    return {s.buf.root for s in stores(stmt)}


def as_block(stmt: S.Stmt) -> S.Block:
    return stmt if isinstance(stmt, S.Block) else S.Block((stmt,))
