"""Checks that a statement is well formed beyond what node constructors check.

- every variable is bound before use: by an enclosing `For`, an earlier
  `Let` in an enclosing Block, an enclosing `Reduce` (in its body), or as a
  kernel parameter;
- no variable is bound twice (a `Reduce`'s variables may be shared by copies
  of that Reduce, which bind them only inside their bodies);
- temporaries are allocated before use and freed exactly once, after use;
- only temporaries and outputs are stored to (an `ExternalCall` stores its buffer).

Before the schedule allocates temporaries (`insert_allocations`), pass
`allocated=False`: then a buffer that is neither an input nor an output is a
temporary, live everywhere.
"""

from __future__ import annotations

from collections.abc import Iterable

from . import expr as E
from . import stmt as S
from .buffer import Buf
from .ir_visitor import Visitor


class IRError(Exception):
    """A malformed IR tree."""


def verify(
    stmt: S.Stmt,
    params: Iterable[E.Var] = (),
    inputs: Iterable[Buf] = (),
    outputs: Iterable[Buf] = (),
    allocated: bool = True,
) -> None:
    """Raise IRError if `stmt` breaks a rule of the module docstring."""
    roots = {b.root for b in inputs}, {b.root for b in outputs}
    _Checker(set(params), *roots, allocated).run(stmt)


class _Checker(Visitor):
    def __init__(
        self, params: set[E.Var], inputs: set[Buf], outputs: set[Buf], allocated: bool
    ):
        self.allocated = allocated
        self.scope: set[E.Var] = set(params)
        self.bound: set[E.Var] = set(params)
        self.inputs, self.outputs = inputs, outputs
        self.live: set[Buf] = set()
        self.freed: set[Buf] = set()

    def run(self, stmt: S.Stmt) -> None:
        self.visit(stmt)
        if self.live:
            raise IRError(f"never freed: {sorted(b.name for b in self.live)}")

    def bind(self, var: E.Var) -> None:
        if var in self.bound:
            raise IRError(f"variable {var.name} is bound twice")
        self.bound.add(var)
        self.scope.add(var)

    def buffer(self, buf: Buf, store: bool) -> None:
        root = buf.root
        known = root in self.inputs or root in self.outputs
        if not known and root not in self.live and self.allocated:
            raise IRError(f"buffer {buf.name} used while not allocated")
        if store and root in self.inputs and root not in self.outputs:
            raise IRError(f"store into input buffer {buf.name}")

    def generic_visit(self, node: E.Expr | S.Stmt) -> None:
        if isinstance(node, S.Stmt):
            raise IRError(f"unknown statement {type(node).__name__}")
        super().generic_visit(node)  # expressions: check the operands

    # -- expressions --------------------------------------------------------
    def visit_Var(self, e: E.Var) -> None:
        if e not in self.scope:
            raise IRError(f"variable {e.name} used out of scope")

    def visit_Reduce(self, e: E.Reduce) -> None:
        self.visit(e.init)
        for stop in e.stops:
            self.visit(stop)
        outer = set(self.scope)
        for v in e.vars:
            # Lexical: copies of one Reduce (a vectorized loop and its tail) share its
            # variables, which is sound; shadowing a variable in scope is not.
            if v in self.scope or v in self.bound:
                raise IRError(f"Reduce variable {v.name} is already bound")
            self.scope.add(v)
        self.visit(e.body)
        self.scope = outer

    def visit_Load(self, e: E.Load) -> None:
        self.buffer(e.buf, store=False)
        super().generic_visit(e)

    # -- statements ---------------------------------------------------------
    def visit_Block(self, s: S.Block) -> None:
        outer = set(self.scope)
        for child in s.stmts:
            self.visit(child)
        self.scope = outer

    def visit_For(self, s: S.For) -> None:
        self.visit(s.start)
        self.visit(s.stop)
        outer = set(self.scope)
        self.bind(s.var)
        self.visit(s.body)
        self.scope = outer

    def visit_Let(self, s: S.Let) -> None:
        self.visit(s.value)
        self.bind(s.var)

    def visit_Store(self, s: S.Store) -> None:
        for i in s.indices:
            self.visit(i)
        self.visit(s.value)
        self.buffer(s.buf, store=True)

    def visit_Allocate(self, s: S.Allocate) -> None:
        root = s.buf.root
        if root in self.live or root in self.freed:
            raise IRError(f"buffer {s.buf.name} allocated twice")
        self.live.add(root)

    def visit_ExternalCall(self, s: S.ExternalCall) -> None:
        for b in s.bufs:
            self.buffer(b, store=False)
        self.buffer(s.buf, store=True)

    def visit_Free(self, s: S.Free) -> None:
        root = s.buf.root
        if root not in self.live:
            raise IRError(f"buffer {s.buf.name} freed while not allocated")
        self.live.remove(root)
        self.freed.add(root)
