"""tile_transposes: walk a 2-D nest in square tiles when one access crosses the other's rows.

    for j in [0, 2048):                      for jo in [0, 64): for io in [0, 64):
      for i in [0, 2048):              ->      for r in [0, 32): for c in [0, 32):
        out[i + 2048 * j] =                      y_tile[1024 * jo + 32 * r + c] =
            x[i + 2048 * j] + y[2048 * i + j];       y[65536 * io + 32 * jo + 2048 * r + c];
                                               for ji in [0, 32): for ii in [0, 32):
                                                 out[32 * io + ii + 2048 * (32 * jo + ji)] =
                                                     x[...] + y_tile[1024 * jo + 32 * ii + ji];
A transpose (`x + y.t()`) reads one operand with a large stride in the inner
loop: every element is in another cache line, and a line is used once per
row of the outer loop, long after it was evicted. In tiles of `TILE` x
`TILE`, the `TILE` lines one inner sweep touches are reused by the next
`TILE - 1` rows. Only top-level nests of two loops from 0 whose extents are
multiples of `TILE` (at least two tiles each) are tiled, when some access has
a stride of at least `MIN_STRIDE` elements in the inner loop and another a
stride of 1.

Tiling alone is not enough when the stride is a power of two (a 2048-wide
matrix): the `TILE` rows of one sweep all fall in the same set of the L1
cache, which holds fewer lines than that, so they evict each other. So a
crossing load whose index moves by 1 along the outer loop is first copied,
tile by tile, into a small buffer (`<buf>_tile`), row by row with unit
strides on both sides (each cache line read whole, once); the computation
then reads the tile from L1 at a short stride. Each iteration of the
outermost loop has its own slice of the buffer, so that loop can still run
in parallel (up to `MAX_TILE_BYTES` in all). Run on flat indices (after `flatten_indices` and
`collapse_loops`), before vectorizing.
"""

from __future__ import annotations

from .. import expr as E
from .. import stmt as S
from ..buffer import Buf
from ..ir_visitor import Mutator, substitute, walk
from ..loopnest import as_block, buffers_stored
from .simplify import Simplifier, simplify

TILE = 32
MIN_STRIDE = 256
#: The most memory the tiles of one crossing load take (one tile per outer tile row);
#: beyond it (a very tall nest) the nest is tiled without copies.
MAX_TILE_BYTES = 1 << 21


def _coefficients(index: E.Expr, vars_: tuple[E.Var, ...]) -> tuple[int, ...] | None:
    """The coefficient of each of `vars_` in `index`, or None if one also occurs in a
    non-linear part (under a division, a clamp, a select)."""
    lin = Simplifier().linear(index)
    for atom in lin.terms:
        if atom not in vars_ and any(n in vars_ for n in walk(atom)):
            return None
    return tuple(lin.terms.get(v, 0) for v in vars_)


def _inner_strides(body: S.Stmt, var: E.Var) -> list[int]:
    """The coefficient of `var` in the flat index of each load and store of `body`."""
    strides = []
    linear = Simplifier().linear
    for node in walk(body):
        if isinstance(node, (E.Load, S.Store)) and len(node.indices) == 1:
            strides.append(abs(linear(node.indices[0]).terms.get(var, 0)))
    return strides


class _ReadTiles(Mutator):
    """Replaces each crossing load of the tile body by a load of its tile buffer, and
    records the copy that fills that buffer."""

    def __init__(self, outer: E.Var, inner: E.Var, slot: E.Expr, written: set[Buf],
                 tiles: int):
        self.outer, self.inner, self.slot = outer, inner, slot
        self.written, self.tiles = written, tiles
        self.copies: dict[E.Load, tuple[Buf, S.Stmt]] = {}

    def mutate_Load(self, e: E.Load) -> E.Expr:
        if len(e.indices) != 1 or e.buf.root in self.written:
            return e
        coefficients = _coefficients(e.indices[0], (self.outer, self.inner))
        if coefficients is None or coefficients[0] != 1 or abs(coefficients[1]) < MIN_STRIDE:
            return e
        if self.tiles * TILE * TILE * e.buf.dtype.itemsize > MAX_TILE_BYTES:
            return e
        if e not in self.copies:
            tile = Buf.make(f"{e.buf.name}_tile", e.buf.dtype, [self.tiles * TILE * TILE])
            r, c = E.Var(f"{self.inner.name}_r"), E.Var(f"{self.outer.name}_c")
            source = substitute(e, {self.inner: r, self.outer: c})
            copy = S.Store(tile, (self.slot + r * TILE + c,), source)
            loops = S.For(r, E.imm(0), E.imm(TILE), S.For(c, E.imm(0), E.imm(TILE), copy))
            self.copies[e] = (tile, loops)
        tile = self.copies[e][0]
        return E.Load(tile, (self.slot + self.inner * TILE + self.outer,))


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
    body = simplify(body)
    tiles = extents[0] // TILE  # type: ignore[operator]
    reader = _ReadTiles(ji, ii, jo * (TILE * TILE), buffers_stored(body), tiles)
    body = reader.mutate(body)
    out: S.Stmt = S.For(ii, E.imm(0), E.imm(TILE), body)
    out = S.For(ji, E.imm(0), E.imm(TILE), out)
    if reader.copies:
        out = S.Block((*(copy for _, copy in reader.copies.values()), out))
    out = S.For(io, E.imm(0), E.imm(extents[1] // TILE), out)  # type: ignore[operator]
    out = S.For(jo, E.imm(0), E.imm(tiles), out)
    return simplify(out)


def tile_transposes(stmt: S.Stmt) -> S.Stmt:
    """Tile the 2-D nests that read across rows; see the module docstring."""
    nests = list(as_block(stmt).stmts)
    tiled = [_tile(n) for n in nests]
    if all(t is None for t in tiled):
        return stmt
    return S.Block(tuple(t if t is not None else n for t, n in zip(tiled, nests)))
