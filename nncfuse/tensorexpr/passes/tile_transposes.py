"""tile_transposes: walk a 2-D nest in square tiles when one access crosses the other's rows.

    for j in [0, 2048):                          for jo in [0, 64): for io in [0, 64):
      for i in [0, 2048):                  ->      for ji in [0, 32): for ii in [0, 32):
        out[i + 2048 * j] =                          out[32 * io + ii + 2048 * (32 * jo + ji)] =
            x[i + 2048 * j] + y[2048 * i + j];           x[...] + y[2048 * (32 * io + ii) + ...];
A transpose (`x + y.t()`) reads one operand with a large stride in the inner
loop: every element is in another cache line, and a line is used once per
row of the outer loop, long after it was evicted. In tiles of `TILE` x
`TILE`, the `TILE` lines one inner sweep touches are reused by the next
`TILE - 1` rows while still in cache. Only top-level nests of two loops
from 0 whose extents are multiples of `TILE` (at least two tiles each) are
tiled, when some access has a stride of at least `MIN_STRIDE` elements in
the inner loop and another a stride of 1. Run on flat indices (after
`flatten_indices` and `collapse_loops`), before vectorizing.
"""

from __future__ import annotations

from .. import expr as E
from .. import stmt as S
from ..ir_visitor import substitute, walk
from ..loopnest import as_block
from .simplify import Simplifier, simplify

TILE = 32
MIN_STRIDE = 256


def _inner_strides(body: S.Stmt, var: E.Var) -> list[int]:
    """The coefficient of `var` in the flat index of each load and store of `body`."""
    strides = []
    linear = Simplifier().linear
    for node in walk(body):
        if isinstance(node, (E.Load, S.Store)) and len(node.indices) == 1:
            strides.append(abs(linear(node.indices[0]).terms.get(var, 0)))
    return strides


def _tile(nest: S.Stmt) -> S.Stmt | None:
    if not isinstance(nest, S.For) or nest.parallel:
        return None
    inner = nest.body
    if isinstance(inner, S.Block) and len(inner.stmts) == 1:
        inner = inner.stmts[0]
    if not isinstance(inner, S.For) or any(isinstance(n, S.For) for n in walk(inner.body)):
        return None
    extents = []
    for loop in (nest, inner):
        if not (E.is_const(loop.start, 0) and isinstance(loop.stop, E.Imm)):
            return None
        extents.append(loop.stop.value)
    if any(n % TILE or n < 2 * TILE for n in extents):  # type: ignore[operator]
        return None
    strides = _inner_strides(inner.body, inner.var)
    if not strides or max(strides) < MIN_STRIDE or 1 not in strides:
        return None
    jo, io, ji, ii = (E.Var(v.name + s) for v, s in
                      ((nest.var, "o"), (inner.var, "o"), (nest.var, "i"), (inner.var, "i")))
    body = substitute(inner.body, {nest.var: jo * TILE + ji, inner.var: io * TILE + ii})
    out: S.Stmt = S.For(ii, E.imm(0), E.imm(TILE), body)
    out = S.For(ji, E.imm(0), E.imm(TILE), out)
    out = S.For(io, E.imm(0), E.imm(extents[1] // TILE), out)  # type: ignore[operator]
    out = S.For(jo, E.imm(0), E.imm(extents[0] // TILE), out)  # type: ignore[operator]
    return simplify(out)


def tile_transposes(stmt: S.Stmt) -> S.Stmt:
    """Tile the 2-D nests that read across rows; see the module docstring."""
    nests = list(as_block(stmt).stmts)
    tiled = [_tile(n) for n in nests]
    if all(t is None for t in tiled):
        return stmt
    return S.Block(tuple(t if t is not None else n for t, n in zip(tiled, nests)))
