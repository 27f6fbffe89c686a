"""hoist_loads: scalar loads that a loop does not change, read once before it.

    for (i = 0; i < 64; i++) {
      mean[i] = ...;
      for (j = 0; j < 48; j++)
        out[Ramp(768 * i + 16 * j, 1, 16)] = x[Ramp(...)] - Broadcast(mean[i], 16);
    }
->  for (i = 0; i < 64; i++) {
      mean[i] = ...;
      {
        float mean_0 = mean[i];
        for (j = 0; j < 48; j++)
          out[Ramp(768 * i + 16 * j, 1, 16)] = x[Ramp(...)] - Broadcast(mean_0, 16);
      }
    }
A row's statistics (the mean and rstd of a layer_norm, the max and the sum of
a softmax) are loaded by every vector of the row's output loop; the loop
stores into the output, which LLVM cannot tell apart from the statistics'
buffer inside an outlined parallel body (its pointers come from a struct,
without `noalias`), so it reloads them per vector. A scalar load whose
indices use no variable the loop binds, of a buffer the loop neither writes
nor allocates, is read once into a `Let` before the loop (buffers of
different roots never overlap: the kernel's parameters are `noalias`). Only
loops of constant, nonempty extent: a load hoisted before a loop that runs
no iteration could read past an empty buffer. Run last: after
`parallelize_outer_loops` (which looks for loops, not blocks) and
`insert_allocations`. layer_norm 4096 x 768: 1.21 -> 1.39x eager at 1 thread.
"""

from __future__ import annotations

from .. import expr as E
from .. import stmt as S
from ..buffer import Buf
from ..ir_visitor import Mutator, walk


class _Replace(Mutator):
    def __init__(self, mapping: dict[E.Load, E.Var]):
        self.mapping = mapping

    def mutate_Load(self, e: E.Load) -> E.Expr:
        var = self.mapping.get(e)
        return var if var is not None else self.generic_mutate(e)


def _bound(s: S.Stmt) -> set[E.Var]:
    """Variables bound inside `s` (loops, lets, reductions)."""
    out: set[E.Var] = set()
    for n in walk(s):
        if isinstance(n, (S.For, S.Let)):
            out.add(n.var)
        elif isinstance(n, E.Reduce):
            out.update(n.vars)
    return out


def _written(s: S.Stmt) -> set[Buf] | None:
    """The roots of the buffers `s` stores into or allocates; None if it calls a library."""
    out: set[Buf] = set()
    for n in walk(s):
        if isinstance(n, S.ExternalCall):
            return None
        if isinstance(n, (S.Store, S.Allocate, S.Free)):
            out.add(n.buf.root)
    return out


def _invariant_loads(loop: S.For) -> list[E.Load]:
    if not (isinstance(loop.start, E.Imm) and isinstance(loop.stop, E.Imm)):
        return []
    if loop.stop.value <= loop.start.value:  # type: ignore[operator]
        return []
    written = _written(loop.body)
    if written is None:
        return []
    bound = _bound(loop.body) | {loop.var}
    found: dict[E.Load, None] = {}
    for n in walk(loop.body):
        if not isinstance(n, E.Load) or n.dtype.lanes != 1 or n.buf.root in written:
            continue
        if any(isinstance(m, E.Var) and m in bound for i in n.indices for m in walk(i)):
            continue
        found[n] = None
    return list(found)


class _Hoist(Mutator):
    def __init__(self) -> None:
        self.count = 0

    def mutate_For(self, s: S.For) -> S.Stmt:
        body = self.mutate(s.body)
        loop = s if body is s.body else S.For(s.var, s.start, s.stop, body, s.parallel,
                                              s.parallel_if)
        loads = _invariant_loads(loop)
        if not loads:
            return loop
        lets: list[S.Stmt] = []
        mapping: dict[E.Load, E.Var] = {}
        for load in loads:
            var = E.Var(f"{load.buf.name}_{self.count}", load.dtype)
            self.count += 1
            mapping[load] = var
            lets.append(S.Let(var, load))
        hoisted = S.For(loop.var, loop.start, loop.stop, _Replace(mapping).mutate(loop.body),
                        loop.parallel, loop.parallel_if)
        return S.Block((*lets, hoisted))


def hoist_loads(stmt: S.Stmt) -> S.Stmt:
    """Hoist loop-invariant scalar loads into lets; see the module docstring."""
    return _Hoist().mutate(stmt)
