"""parallelize_outer_loops: run a loop nest's outermost loop on threads when the work pays.

    for (i = 0; i < 65536; i++)              for (i = 0; i < 65536; i++) /* parallel */
      out[Ramp(16 * i, 1, 16)] = ...;   ->     out[Ramp(16 * i, 1, 16)] = ...;
Each top-level nest (and each loop of a top-level Block, as the vectorizer's
main loop and tail) whose estimated work reaches `grain` gets its outermost
loop marked parallel; codegen splits it into one contiguous chunk per
thread. Work is the number of elements the nest stores times a per-element
cost: 1 per operation, `CALL_COST` per transcendental call, a `Reduce`'s
body once per point it reduces over. Forking threads
costs a few microseconds, so small nests stay serial. Where the bounds are
size symbols (a dynamic kernel) the choice is made at run time:

    for (i = 0; i < s0 / 16; i++)      ->    for (i = 0; i < s0 / 16; i++)
      out[Ramp(16 * i, 1, 16)] = ...;          /* parallel if s0 / 16 * 16 >= 131072 */
"""

from __future__ import annotations

import dataclasses

from .. import expr as E
from .. import stmt as S
from ..ir_visitor import children
from ..loopnest import Nest, as_block
from .simplify import simplify

#: Relative cost of an intrinsic call (a SLEEF routine) against a simple operation.
CALL_COST = 20
#: Work (in simple operations) from which a nest runs in parallel: below it, forking
#: costs more than the second thread saves.
GRAIN = 1 << 17


def work(stmt: S.Stmt) -> int | None:
    """Estimated operations a nest performs, or None if its bounds are not constant."""
    nest = Nest.of(stmt)
    iterations = 1
    for loop in nest.loops:
        if not (isinstance(loop.start, E.Imm) and isinstance(loop.stop, E.Imm)):
            return None
        iterations *= max(0, loop.stop.value - loop.start.value)  # type: ignore[operator]
    per_iteration = _cost(nest.body)
    if per_iteration is None:
        return None
    return iterations * max(per_iteration, 1)


def _cost(node: E.Expr | S.Stmt) -> int | None:
    """Operations in one evaluation of `node`; a `Reduce` counts its body once per point."""
    if isinstance(node, E.Reduce):
        points = 1
        for stop in node.stops:
            if not isinstance(stop, E.Imm):
                return None
            points *= max(0, stop.value)  # type: ignore[operator]
        inner = _cost(node.body)
        return None if inner is None else points * (inner + node.dtype.lanes)
    total = 0
    if isinstance(node, E.Call):
        total += CALL_COST * node.dtype.lanes
    elif isinstance(node, E.Expr) and not isinstance(node, (E.Var, E.Imm)):
        total += node.dtype.lanes
    for child in children(node):
        part = _cost(child)
        if part is None:
            return None
        total += part
    return total


def symbolic_work(stmt: S.Stmt) -> E.Expr | None:
    """Estimated operations of a nest whose bounds are expressions (size symbols): trip
    counts times the cost of the statements inside; None where a cost is not known."""
    if isinstance(stmt, S.For):
        inner = symbolic_work(stmt.body)
        return None if inner is None else (stmt.stop - stmt.start) * inner
    if isinstance(stmt, S.Block):
        parts = [symbolic_work(s) for s in stmt.stmts]
        if None in parts or not parts:
            return None
        total = parts[0]
        for p in parts[1:]:
            total = total + p  # type: ignore[operator]
        return total
    cost = _cost(stmt)
    return None if cost is None else E.imm(max(cost, 1))


def _parallel(stmt: S.Stmt, grain: int) -> S.Stmt:
    if not isinstance(stmt, S.For) or stmt.parallel:
        return stmt
    amount = work(stmt)
    if amount is None:  # symbolic bounds: the choice is made at run time
        estimate = symbolic_work(stmt)
        if estimate is None:
            return stmt
        return dataclasses.replace(
            stmt, parallel=True, parallel_if=E.cmp(">=", simplify(estimate), grain)
        )
    if amount < grain:
        return stmt
    return dataclasses.replace(stmt, parallel=True)


def parallelize_outer_loops(stmt: S.Stmt, grain: int = GRAIN) -> S.Stmt:
    """Mark the outer loops of large top-level nests parallel; see the module docstring."""
    out: list[S.Stmt] = []
    for top in as_block(stmt).stmts:
        if isinstance(top, S.Block):
            top = S.Block(tuple(_parallel(s, grain) for s in top.stmts))
        else:
            top = _parallel(top, grain)
        out.append(top)
    new = S.Block(tuple(out))
    return stmt if new == as_block(stmt) else new
