"""Generic traversal of IR trees.

`Visitor.visit(node)` calls `visit_<ClassName>` when a subclass defines it and
otherwise visits the node's children. `Mutator.mutate(node)` likewise calls
`mutate_<ClassName>` or rebuilds the node from mutated children, returning
the very same object when no child changed, so unchanged subtrees are shared
and `new is old` tells a pass it did nothing.

Children are the dataclass fields that hold expressions or statements
(directly or in tuples). Buffers are leaves.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

from .expr import Expr, Var
from .stmt import Stmt

Node = Expr | Stmt

_CHILD_FIELDS: dict[type, tuple[str, ...]] = {}


def _child_fields(cls: type) -> tuple[str, ...]:
    names = _CHILD_FIELDS.get(cls)
    if names is None:
        names = tuple(
            f.name
            for f in dataclasses.fields(cls)
            if f.name not in ("dtype", "name", "op", "lanes", "buf", "parallel")
        )
        _CHILD_FIELDS[cls] = names
    return names


def children(node: Node) -> Iterator[Node]:
    """The expression and statement children of `node`, in field order."""
    for name in _child_fields(type(node)):
        value = getattr(node, name)
        if isinstance(value, tuple):
            yield from (v for v in value if isinstance(v, (Expr, Stmt)))
        elif isinstance(value, (Expr, Stmt)):
            yield value


class Visitor:
    """Read-only walk; override `visit_<ClassName>` and call `generic_visit` to recurse."""

    def visit(self, node: Node) -> None:
        method = getattr(self, "visit_" + type(node).__name__, None)
        if method is None:
            self.generic_visit(node)
        else:
            method(node)

    def generic_visit(self, node: Node) -> None:
        for child in children(node):
            self.visit(child)


class Mutator:
    """Identity-preserving rewrite; override `mutate_<ClassName>`, recurse with `generic_mutate`."""

    def mutate(self, node: Any) -> Any:
        method = getattr(self, "mutate_" + type(node).__name__, None)
        if method is None:
            return self.generic_mutate(node)
        return method(node)

    def generic_mutate(self, node: Any) -> Any:
        changes: dict[str, Any] = {}
        for name in _child_fields(type(node)):
            value = getattr(node, name)
            if isinstance(value, tuple):
                new = tuple(self.mutate(v) if isinstance(v, (Expr, Stmt)) else v for v in value)
                if any(n is not o for n, o in zip(new, value)):
                    changes[name] = new
            elif isinstance(value, (Expr, Stmt)):
                new_value = self.mutate(value)
                if new_value is not value:
                    changes[name] = new_value
        return dataclasses.replace(node, **changes) if changes else node


def walk(node: Node) -> Iterator[Node]:
    """Every node of the tree, parents before children."""
    stack = [node]
    while stack:
        n = stack.pop()
        yield n
        stack.extend(reversed(list(children(n))))


def find(node: Node, predicate: Callable[[Node], bool]) -> list[Node]:
    """The nodes of the tree that satisfy `predicate`, in walk order."""
    return [n for n in walk(node) if predicate(n)]


class Substitute(Mutator):
    """Replaces variables by the expressions a mapping gives."""

    def __init__(self, mapping: dict[Var, Expr]):
        self.mapping = mapping

    def mutate_Var(self, node: Var) -> Expr:
        return self.mapping.get(node, node)


def substitute(node: Any, mapping: dict[Var, Expr]) -> Any:
    """`node` with every variable in `mapping` replaced by its value."""
    return Substitute(mapping).mutate(node) if mapping else node
