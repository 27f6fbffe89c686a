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
`TILE - 1` rows. Only top-level nests of two loops from 0 (at least two tiles
each, when the extents are constants) are tiled, when some access has a stride
of at least `MIN_STRIDE` elements in the inner loop (or a stride that is a
product of size symbols) and another a stride of 1. Extents need not be
multiples of `TILE`, nor constants (a dynamic kernel's `s0`): the tile loops
run over the whole tiles, `s0 / 32` of them, then the columns past the last
whole tile of each tile row and the rows past the last whole tile row run
untiled:

    for j in [0, s0):                  for jo in [0, s0 / 32):
      for i in [0, 300):         ->      for io in [0, 9): ...tiles as above...
        out[i + 300 * j] = ...           for ji in [0, 32): for it in [288, 300): ...
                                       for j in [32 * (s0 / 32), s0): for i in [0, 300): ...

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
from ..linear_form import linear
from ..loopnest import as_block, buffers_stored
from .parallelize import GRAIN, work
from .simplify import factors, simplify

#: 64: each tile row is 256 bytes, four cache lines of the crossing input, its tile 16 KB
#: (in L1). Side by side at 1 thread (`x.t() + y`, float32, ns per element, 32 -> 64):
#: 1.90 -> 1.30 at 2048^2, 2.02 -> 1.66 at 1000^2, 2.81 -> 2.31 at 3000^2, 1.20 -> 0.91 at
#: 1024^2, even at 256^2 and 512^2 (in L2).
TILE = 64
MIN_STRIDE = 256
#: The most memory the tiles of one crossing load take (one tile per outer tile row);
#: beyond it (a very tall nest) the nest is tiled without copies. A symbolic outer extent is
#: not capped: the tiles then take `TILE` elements per row of the nest, where the crossing
#: input has the inner extent's worth (256 in the example above).
MAX_TILE_BYTES = 1 << 21


def _coefficient(index: E.Expr, var: E.Var, loop_vars: tuple[E.Var, ...]) -> E.Expr | None:
    """The coefficient of `var` in `index`: a constant or a product of size symbols (`16 *
    i * s0`: `16 * s0`); None if `var` also occurs in a non-linear part (a division, a
    clamp, a select, a product with another loop variable)."""
    total: E.Expr = E.imm(0)
    for atom, c in linear(index).terms.items():
        if atom is var:
            total = total + c
        elif any(n is var for n in walk(atom)):
            parts = factors(atom)
            rest = [f for f in parts if f is not var]
            if len(rest) != len(parts) - 1 or any(
                    n in loop_vars for f in rest for n in walk(f)):
                return None
            term: E.Expr = E.imm(c)
            for f in rest:
                term = term * f
            total = total + term
    return simplify(total)




def _large(stride: E.Expr) -> bool:
    """Whether an inner stride is at least `MIN_STRIDE`: a product of size symbols is taken
    to be (a small one only makes the tiles useless, never wrong)."""
    if isinstance(stride, E.Imm):
        return abs(stride.value) >= MIN_STRIDE  # type: ignore[operator]
    return True


def _strides(body: S.Stmt, var: E.Var, loop_vars: tuple[E.Var, ...]) -> list[E.Expr]:
    """The coefficient of `var` in the flat index of each load and store of `body` (that
    has one)."""
    strides = []
    for node in walk(body):
        if isinstance(node, (E.Load, S.Store)) and len(node.indices) == 1:
            c = _coefficient(node.indices[0], var, loop_vars)
            if c is not None:
                strides.append(c)
    return strides


class _ReadTiles(Mutator):
    """Replaces each crossing load of the nest's body (over `outer`, `inner`) by a load of
    its tile buffer at tile element (`ii`, `ji`), and records the copy that fills that
    buffer for tile (`jo`, `io`)."""

    def __init__(self, outer: E.Var, inner: E.Var, tile_vars: tuple[E.Var, ...],
                 written: set[Buf], tiles: E.Expr):
        self.outer, self.inner = outer, inner
        self.jo, self.io, self.ji, self.ii = tile_vars
        self.slot = self.jo * (TILE * TILE)
        self.written, self.tiles = written, tiles
        self.copies: dict[E.Load, tuple[Buf, S.Stmt]] = {}

    def mutate_Load(self, e: E.Load) -> E.Expr:
        if len(e.indices) != 1 or e.buf.root in self.written:
            return e
        loop_vars = (self.outer, self.inner)
        outer = _coefficient(e.indices[0], self.outer, loop_vars)
        inner = _coefficient(e.indices[0], self.inner, loop_vars)
        if outer is None or inner is None or not E.is_const(outer, 1) or not _large(inner):
            return e
        if isinstance(self.tiles, E.Imm) and (
                self.tiles.value * TILE * TILE * e.buf.dtype.itemsize  # type: ignore[operator]
                > MAX_TILE_BYTES):
            return e
        if e not in self.copies:
            size = simplify(self.tiles * (TILE * TILE))
            tile = Buf.make(f"{e.buf.name}_tile", e.buf.dtype, [size])
            r, c = E.Var(f"{self.ii.name}_r"), E.Var(f"{self.ji.name}_c")
            source = substitute(e, {self.inner: self.io * TILE + r,
                                    self.outer: self.jo * TILE + c})
            copy = S.Store(tile, (self.slot + r * TILE + c,), simplify(source))
            loops = S.For(r, E.imm(0), E.imm(TILE), S.For(c, E.imm(0), E.imm(TILE), copy))
            self.copies[e] = (tile, loops)
        tile = self.copies[e][0]
        return E.Load(tile, (self.slot + self.ii * TILE + self.ji,))


def _whole(extent: E.Expr) -> bool:
    """Whether an extent is known to be a multiple of `TILE` (no tail)."""
    return isinstance(extent, E.Imm) and extent.value % TILE == 0  # type: ignore[operator]


def _tile(nest: S.Stmt) -> S.Stmt | None:
    if not isinstance(nest, S.For) or nest.parallel:
        return None
    inner = nest.body
    if isinstance(inner, S.Block) and len(inner.stmts) == 1:
        inner = inner.stmts[0]
    if not isinstance(inner, S.For) or any(isinstance(n, S.For) for n in walk(inner.body)):
        return None
    if not (E.is_const(nest.start, 0) and E.is_const(inner.start, 0)):
        return None
    rows, cols = nest.stop, inner.stop
    if any(isinstance(n, E.Imm) and n.value < 2 * TILE for n in (rows, cols)):  # type: ignore
        return None
    loop_vars = (nest.var, inner.var)
    strides = _strides(inner.body, inner.var, loop_vars)
    if not any(_large(s) for s in strides) or not any(E.is_const(s, 1) for s in strides):
        return None
    tile_vars = tuple(E.Var(v.name + s) for v, s in
                      ((nest.var, "o"), (inner.var, "o"), (nest.var, "i"), (inner.var, "i")))
    jo, io, ji, ii = tile_vars
    tiles, col_tiles = simplify(rows / TILE), simplify(cols / TILE)
    reader = _ReadTiles(nest.var, inner.var, tile_vars, buffers_stored(inner.body), tiles)
    body = reader.mutate(inner.body)
    body = simplify(substitute(body, {nest.var: jo * TILE + ji, inner.var: io * TILE + ii}))
    out: S.Stmt = S.For(ii, E.imm(0), E.imm(TILE), body)
    out = S.For(ji, E.imm(0), E.imm(TILE), out)
    if reader.copies:
        out = S.Block((*(copy for _, copy in reader.copies.values()), out))
    out = S.For(io, E.imm(0), col_tiles, out)
    if not _whole(cols):  # the columns past the last whole tile, in this tile row
        jt, it = E.Var(ji.name), E.Var(inner.var.name + "t")
        tail = substitute(inner.body, {nest.var: jo * TILE + jt, inner.var: it})
        tail = S.For(jt, E.imm(0), E.imm(TILE), S.For(it, col_tiles * TILE, cols, tail))
        out = S.Block((out, tail))
    # parallelize_outer_loops counts one pass through a loop body made of loops: a nest of
    # constant extents whose work asks for threads is marked here (symbolic ones decide
    # at run time there)
    amount = work(nest)
    out = S.For(jo, E.imm(0), tiles, out, parallel=amount is not None and amount >= GRAIN)
    if not _whole(rows):  # the rows past the last whole tile row, untiled
        out = S.Block((out, S.For(nest.var, tiles * TILE, rows, inner)))
    return simplify(out)


def tile_transposes(stmt: S.Stmt) -> S.Stmt:
    """Tile the 2-D nests that read across rows; see the module docstring."""
    nests = list(as_block(stmt).stmts)
    tiled = [_tile(n) for n in nests]
    if all(t is None for t in tiled):
        return stmt
    out: list[S.Stmt] = []
    for t, n in zip(tiled, nests):
        out += [n] if t is None else as_block(t).stmts
    return S.Block(tuple(out))
