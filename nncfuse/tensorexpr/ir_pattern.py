"""Patterns over expressions, so that rewrite rules read one per line, as data.

    x, y = Wild("x"), Wild("y")
    RULES = Rules([
        rule(x * 1, x),                  # exact for every type
        rule(x + 0, x, when=not_float),  # not for floats: -0. + 0. is +0.
        rule(max_(x, x), x),
    ])
    RULES.rewrite(e)  # the first rule's replacement that applies, or None

A pattern is a wildcard (`Wild`: any expression, bound to its name; a name
used twice must match equal expressions), a constant (`Const`: a scalar
immediate, bound to its name), a Python number (an immediate of that value,
or a broadcast one, with the same sign of zero; never a bool), or a node
(`Node(cls, *operands)`, or the sugar `x + y`, `max_(x, y)`, `cast(x)`, ...;
`Node(cls, CONSTS)` matches a node whose operands are all immediates). Only
operands are matched: a node's dtype, lanes or name are for `when`.

A rule's replacement is a bound name (`x`) or a function of the matched node
and the bindings, as is its condition `when`: `when=lambda e, x: ...`. Rules
are tried in order; the rules that may apply to a node class are found once
per class, so a node costs only the rules of its kind.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from . import expr as E
from .ir_visitor import children

Bindings = dict[str, E.Expr]


class Pattern:
    """Base of patterns; the operators build node patterns (`x + 0` is `Node(E.Add, x, 0)`)."""

    root: type | tuple[type, ...] = E.Expr  # the node classes this pattern can match

    def match(self, e: E.Expr, bound: Bindings) -> bool:
        raise NotImplementedError

    def __add__(self, other: Any) -> Node:
        return Node(E.Add, self, other)

    def __radd__(self, other: Any) -> Node:
        return Node(E.Add, other, self)

    def __sub__(self, other: Any) -> Node:
        return Node(E.Sub, self, other)

    def __mul__(self, other: Any) -> Node:
        return Node(E.Mul, self, other)

    def __rmul__(self, other: Any) -> Node:
        return Node(E.Mul, other, self)

    def __truediv__(self, other: Any) -> Node:
        return Node(E.Div, self, other)

    def __or__(self, other: Any) -> Node:
        return Node(E.Or, self, other)

    def __xor__(self, other: Any) -> Node:
        return Node(E.Xor, self, other)


class Wild(Pattern):
    """Any expression, bound to `name`."""

    def __init__(self, name: str):
        self.name = name

    def match(self, e: E.Expr, bound: Bindings) -> bool:
        seen = bound.get(self.name)
        if seen is None:
            bound[self.name] = e
            return True
        return seen == e


class Const(Wild):
    """A scalar immediate, bound to `name`."""

    root = E.Imm

    def match(self, e: E.Expr, bound: Bindings) -> bool:
        return isinstance(e, E.Imm) and super().match(e, bound)


class Number(Pattern):
    """An immediate (or a broadcast one) equal to `value`, zeros of the same sign; not bool."""

    def __init__(self, value: int | float):
        self.value = value
        self.sign = math.copysign(1.0, value)

    def match(self, e: E.Expr, bound: Bindings) -> bool:
        if isinstance(e, E.Broadcast):
            e = e.value
        if not isinstance(e, E.Imm) or isinstance(e.value, bool):
            return False
        return e.value == self.value and math.copysign(1.0, e.value) == self.sign


#: `Node(cls, CONSTS)`: every operand is an immediate.
CONSTS = object()


def _pattern(p: Any) -> Pattern:
    return p if isinstance(p, Pattern) else Number(p)


_OPERANDS: dict[type, Callable[[E.Expr], tuple[E.Expr, ...]]] = {}


def _operands(e: E.Expr) -> tuple[E.Expr, ...]:
    """`children(e)` as a tuple, by a getter made once per class (matching is hot)."""
    get = _OPERANDS.get(type(e))
    if get is None:
        if isinstance(e, (E.BinaryOp, E.Cmp)):
            get = lambda n: (n.a, n.b)
        elif isinstance(e, E.Call):
            get = lambda n: n.args
        else:
            get = lambda n: tuple(children(n))
        _OPERANDS[type(e)] = get
    return get(e)


class Node(Pattern):
    """An instance of `cls` (a class or a tuple of them) whose operands match `operands`."""

    def __init__(self, cls: type | tuple[type, ...], *operands: Any):
        self.root = cls
        self.consts = operands == (CONSTS,)
        self.operands = () if self.consts else tuple(_pattern(p) for p in operands)

    def match(self, e: E.Expr, bound: Bindings) -> bool:
        if not isinstance(e, self.root):
            return False
        parts = _operands(e)
        if self.consts:
            return all(isinstance(p, E.Imm) for p in parts)
        return len(parts) == len(self.operands) and all(
            p.match(c, bound) for p, c in zip(self.operands, parts)
        )


def max_(a: Any, b: Any) -> Node:
    return Node(E.Max, a, b)


def min_(a: Any, b: Any) -> Node:
    return Node(E.Min, a, b)


def cast(value: Any) -> Node:
    return Node(E.Cast, value)


def select(cond: Any, true_value: Any, false_value: Any) -> Node:
    return Node(E.Select, cond, true_value, false_value)


def not_float(e: E.Expr, **bound: E.Expr) -> bool:
    """A rule's condition: the node is not of a float type."""
    return not e.dtype.is_float


Replacement = Wild | Callable[..., E.Expr]


class Rule:
    """`pattern -> replacement` where `when` holds; see the module docstring."""

    def __init__(self, pattern: Pattern, replacement: Replacement,
                 when: Callable[..., bool] | None = None):
        self.pattern, self.replacement, self.when = pattern, replacement, when

    def apply(self, e: E.Expr) -> E.Expr | None:
        bound: Bindings = {}
        if not self.pattern.match(e, bound):
            return None
        if self.when is not None and not self.when(e, **bound):
            return None
        if isinstance(self.replacement, Wild):
            return bound[self.replacement.name]
        return self.replacement(e, **bound)


rule = Rule


class Rules:
    """An ordered list of rules; `rewrite` applies the first that matches."""

    def __init__(self, rules: list[Rule]):
        self.rules = rules
        self.by_class: dict[type, list[Rule]] = {}

    def rewrite(self, e: E.Expr) -> E.Expr | None:
        cls = type(e)
        candidates = self.by_class.get(cls)
        if candidates is None:
            candidates = [r for r in self.rules if issubclass(cls, r.pattern.root)]
            self.by_class[cls] = candidates
        for r in candidates:
            out = r.apply(e)
            if out is not None:
                return out
        return None
