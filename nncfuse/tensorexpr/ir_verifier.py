"""Checks that a statement is well formed beyond what node constructors check.

- every variable is bound before use: by an enclosing `For`, an earlier
  `Let` in an enclosing Block, or as a kernel parameter;
- no variable is bound twice;
- temporaries are allocated before use and freed exactly once, after use;
- only temporaries and outputs are stored to.

Before the schedule allocates temporaries (`insert_allocations`), pass
`allocated=False`: then a buffer that is neither an input nor an output is a
temporary, live everywhere.
"""

from __future__ import annotations

from collections.abc import Iterable

from . import expr as E
from . import stmt as S
from .buffer import Buf
from .ir_visitor import walk


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


class _Checker:
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
        self.stmt(stmt)
        if self.live:
            raise IRError(f"never freed: {sorted(b.name for b in self.live)}")

    def bind(self, var: E.Var) -> None:
        if var in self.bound:
            raise IRError(f"variable {var.name} is bound twice")
        self.bound.add(var)
        self.scope.add(var)

    def expr(self, e: E.Expr) -> None:
        for node in walk(e):
            if isinstance(node, E.Var) and node not in self.scope:
                raise IRError(f"variable {node.name} used out of scope")
            if isinstance(node, E.Load):
                self.buffer(node.buf, store=False)

    def buffer(self, buf: Buf, store: bool) -> None:
        root = buf.root
        known = root in self.inputs or root in self.outputs
        if not known and root not in self.live and self.allocated:
            raise IRError(f"buffer {buf.name} used while not allocated")
        if store and root in self.inputs and root not in self.outputs:
            raise IRError(f"store into input buffer {buf.name}")

    def stmt(self, s: S.Stmt) -> None:
        if isinstance(s, S.Block):
            outer = set(self.scope)
            for child in s.stmts:
                self.stmt(child)
            self.scope = outer
        elif isinstance(s, S.For):
            self.expr(s.start)
            self.expr(s.stop)
            outer = set(self.scope)
            self.bind(s.var)
            self.stmt(s.body)
            self.scope = outer
        elif isinstance(s, S.Let):
            self.expr(s.value)
            self.bind(s.var)
        elif isinstance(s, S.Store):
            for i in s.indices:
                self.expr(i)
            self.expr(s.value)
            self.buffer(s.buf, store=True)
        elif isinstance(s, S.Allocate):
            root = s.buf.root
            if root in self.live or root in self.freed:
                raise IRError(f"buffer {s.buf.name} allocated twice")
            self.live.add(root)
        elif isinstance(s, S.Free):
            root = s.buf.root
            if root not in self.live:
                raise IRError(f"buffer {s.buf.name} freed while not allocated")
            self.live.remove(root)
            self.freed.add(root)
        else:
            raise IRError(f"unknown statement {type(s).__name__}")
