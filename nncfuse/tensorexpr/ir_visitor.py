"""Generic traversal of IR trees.

`Visitor.visit(node)` calls `visit_<ClassName>` and returns its result; where
the visitor defines no method for the node's class, the method of its nearest
base class that has one (`visit_BinaryOp` serves `Add`, `Mul`, ...), else
`generic_visit`, which visits the children. `Mutator.mutate(node)` likewise
calls `mutate_<ClassName>` or rebuilds the node from mutated children,
returning the very same object when no child changed, so unchanged subtrees
are shared and `new is old` tells a pass it did nothing. Every consumer that
walks the IR (interpreter, printer, verifier, LLVM codegen, passes)
dispatches this one way; the method for a (visitor class, node class) pair is
looked up once and cached, which is as fast as the `isinstance` ladders it
replaces.

Children are the dataclass fields that hold expressions or statements
(directly or in tuples). Buffers are leaves.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

from .expr import Expr, Reduce, Select, Var
from .stmt import Stmt

Node = Expr | Stmt

_CHILD_FIELDS: dict[type, tuple[str, ...]] = {}
_METHODS: dict[tuple[type, str, type], Callable[..., Any] | None] = {}


def method_for(owner: type, prefix: str, node_type: type) -> Callable[..., Any] | None:
    """`owner`'s function `prefix + name` for the nearest class in `node_type`'s MRO, or None."""
    key = (owner, prefix, node_type)
    try:
        return _METHODS[key]
    except KeyError:
        pass
    found = None
    for cls in node_type.__mro__:
        found = getattr(owner, prefix + cls.__name__, None)
        if found is not None:
            break
    _METHODS[key] = found
    return found


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
    return iter(_children(node))


_NODES = (Expr, Stmt)


def _children(node: Node) -> list[Node]:
    """`children(node)` as a list: what the walks use (a generator per node costs more)."""
    try:
        names = _CHILD_FIELDS[type(node)]
    except KeyError:
        names = _child_fields(type(node))
    if not names:
        return []  # a leaf
    kids: list[Node] = []
    for name in names:
        value = getattr(node, name)
        if isinstance(value, tuple):
            kids += [v for v in value if isinstance(v, _NODES)]
        elif isinstance(value, _NODES):
            kids.append(value)
    return kids


class Visitor:
    """Read-only walk; override `visit_<ClassName>` and call `generic_visit` to recurse."""

    #: `visit_` methods by node class (`method_for`), one table per subclass
    _visits: dict[type, Callable[..., Any] | None] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls._visits = {}

    def visit(self, node: Node) -> Any:
        try:
            method = self._visits[type(node)]
        except KeyError:
            method = self._visits[type(node)] = method_for(type(self), "visit_", type(node))
        if method is None:
            return self.generic_visit(node)
        return method(self, node)

    def generic_visit(self, node: Node) -> Any:
        for child in _children(node):
            self.visit(child)


class Mutator:
    """Identity-preserving rewrite; override `mutate_<ClassName>`, recurse with `generic_mutate`."""

    #: `mutate_` methods by node class (`method_for`), one table per subclass
    _mutates: dict[type, Callable[..., Any] | None] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls._mutates = {}

    def mutate(self, node: Any) -> Any:
        try:
            method = self._mutates[type(node)]
        except KeyError:
            method = self._mutates[type(node)] = method_for(type(self), "mutate_", type(node))
        if method is None:
            return self.generic_mutate(node)
        return method(self, node)

    def generic_mutate(self, node: Any) -> Any:
        try:
            names = _CHILD_FIELDS[type(node)]
        except KeyError:
            names = _child_fields(type(node))
        if not names:
            return node  # a leaf
        changes: dict[str, Any] = {}
        mutate = self.mutate
        for name in names:
            value = getattr(node, name)
            if isinstance(value, tuple):
                new = [mutate(v) if isinstance(v, _NODES) else v for v in value]
                for n, o in zip(new, value):
                    if n is not o:
                        changes[name] = tuple(new)
                        break
            elif isinstance(value, _NODES):
                new_value = mutate(value)
                if new_value is not value:
                    changes[name] = new_value
        return dataclasses.replace(node, **changes) if changes else node


def walk(node: Node) -> Iterator[Node]:
    """Every node of the tree, parents before children."""
    stack = [node]
    while stack:
        n = stack.pop()
        yield n
        kids = _children(n)
        if kids:
            kids.reverse()
            stack += kids


def branches_reduce(e: Expr) -> bool:
    """Whether `e` is a scalar `Select` with a `Reduce` in a branch: codegen then runs only
    the branch taken (a rare row's slow path costs nothing on the others), so passes leave
    the branches' values in them rather than compute them before it.

        var[i] = ok[i] ? fast[i] : reduce_add(0., double(x[i, r]) ... for r < 1024);
    """
    return isinstance(e, Select) and e.dtype.lanes == 1 and any(
        isinstance(n, Reduce) for branch in (e.true_value, e.false_value) for n in walk(branch))


class Substitute(Mutator):
    """Replaces variables by the expressions a mapping gives."""

    def __init__(self, mapping: dict[Var, Expr]):
        self.mapping = mapping

    def mutate_Var(self, node: Var) -> Expr:
        return self.mapping.get(node, node)


def substitute(node: Any, mapping: dict[Var, Expr]) -> Any:
    """`node` with every variable in `mapping` replaced by its value."""
    return Substitute(mapping).mutate(node) if mapping else node


class _ReplaceNode(Mutator):
    def __init__(self, old: Any, new: Any):
        self.old, self.new = old, new

    def mutate(self, node: Any) -> Any:
        return self.new if node is self.old else super().mutate(node)


def replace_node(tree: Any, old: Any, new: Any) -> Any:
    """`tree` with `old` (that very node, not an equal one) replaced by `new`."""
    return _ReplaceNode(old, new).mutate(tree)
