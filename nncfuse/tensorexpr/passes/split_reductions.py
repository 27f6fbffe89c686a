"""split_reductions: a long full reduction as partial results over chunks, then their total.

    out[0] = reduce_add(0.f, x[r] for r < 1048576);
->  for (k = 0; k < 64; k++)
      out_part[k] = reduce_add(-0.f, x[16384 * k + r] for r < 16384);
    out[0] = reduce_add(0.f, out_part[k_1] for k_1 < 64);
A statement outside any loop (a reduction to one value) that reduces over
at least `2 * CHUNK` points gets a loop over chunks, which
`parallelize_outer_loops` can run on threads (a full reduction otherwise
runs on one), and whose partial results are a level of cascade for sums.
Points past the last whole chunk are reduced from the chunks' total. Axes
over dense memory are merged first (`vectorize_reductions.merge_axes`).
"""

from __future__ import annotations

from .. import expr as E
from .. import stmt as S
from ..buffer import Buf
from ..ir_visitor import replace_node, substitute, walk
from ..loopnest import as_block
from .vectorize_reductions import merge_axes

#: Points per chunk, and the most chunks.
CHUNK = 1 << 14
CHUNKS = 64


def _split(s: S.Store, serial: int) -> list[S.Stmt] | None:
    reduces = [n for n in walk(s.value) if isinstance(n, E.Reduce)]
    if len(reduces) != 1 or reduces[0].dtype.lanes != 1:
        return None
    e = merge_axes(reduces[0])
    if len(e.vars) != 1 or not isinstance(e.stops[0], E.Imm):
        return None
    count = e.stops[0].value
    chunks = min(CHUNKS, count // CHUNK)  # type: ignore[operator]
    if chunks < 2:
        return None
    size = count // chunks  # type: ignore[operator]
    (var,) = e.vars
    part = Buf.make(f"{s.buf.name}_part{serial or ''}", e.dtype, [chunks])
    k, r = E.Var("k"), E.Var(var.name)
    body = substitute(e.body, {var: k * size + r})
    partial = E.Reduce(e.op, E.identity(e.op, e.dtype), body, (r,), (E.imm(size),))
    loop = S.For(k, E.imm(0), E.imm(chunks), S.Store(part, (k,), partial))
    k_total = E.Var("k")
    total: E.Expr = E.Reduce(e.op, e.init, E.Load(part, (k_total,)), (k_total,),
                             (E.imm(chunks),))
    done = chunks * size
    if done < count:  # type: ignore[operator]
        tail = E.Var(var.name)
        total = E.Reduce(e.op, total, substitute(e.body, {var: tail + E.imm(done)}), (tail,),
                         (E.imm(count - done),))  # type: ignore[operator]
    value = replace_node(s.value, reduces[0], total)
    return [loop, S.Store(s.buf, s.indices, value)]


def split_reductions(stmt: S.Stmt) -> S.Stmt:
    """Split long reductions to one value into chunks; see the module docstring."""
    out: list[S.Stmt] = []
    changed = False
    for top in as_block(stmt).stmts:
        parts = _split(top, len(out)) if isinstance(top, S.Store) else None
        if parts is None:
            out.append(top)
        else:
            out.extend(parts)
            changed = True
    return S.Block(tuple(out)) if changed else stmt
