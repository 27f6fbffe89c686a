"""shape_checks: the rank and size checks of scripted code, which a fusion group may hold.

Scripted modules check their inputs' shapes before computing, and raise when a check fails
(`BatchNorm2d._check_input_dim`):

    %d : int = aten::dim(%x)
    %c : bool = aten::ne(%d, %four)
     = prim::If(%c)
      block0():
        %d2 : int = aten::dim(%x)
        %m : str = aten::format(%msg, %d2)
         = prim::RaiseException(%m, %cls)
        -> ()
      block1():
        -> ()

A *check* is such a `prim::If`: no outputs, one block that only raises (its nodes build the
message: `RAISE_KINDS`), the other empty. Its *condition* is built by *check values*: reads
of a tensor's rank or sizes (`READS`) and int or bool operations (`OPS`) on them and on
constants. Where the tensors' types are known, as in a fusion group's graph guarded by its
TypeCheck, a check is a constant: `evaluate` computes a check value from its operands, and
`graph_lowering` lowers a check that passes to nothing and refuses one that raises (the
group then runs its nodes, which raise as eager does). `owning_check` says which one check a
check value serves, so that a group takes it with that check and with nothing else.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import torch

from .meta import blocks_of, inputs_of, is_tensor, outputs_of

#: Integer arithmetic on sizes, in TorchScript's int overloads (`floordiv` rounds down).
INT_OPS: dict[str, Callable[..., int]] = {
    "aten::add": operator.add, "aten::sub": operator.sub, "aten::mul": operator.mul,
    "aten::floordiv": operator.floordiv, "aten::neg": operator.neg,
}
#: Comparisons and logic on ints and bools.
PREDICATES: dict[str, Callable[..., bool]] = {
    "aten::eq": operator.eq, "aten::ne": operator.ne, "aten::lt": operator.lt,
    "aten::le": operator.le, "aten::gt": operator.gt, "aten::ge": operator.ge,
    "aten::__not__": operator.not_, "aten::__and__": operator.and_,
    "aten::__or__": operator.or_,
}
OPS = {**INT_OPS, **PREDICATES}
#: Reads of a tensor's shape: rank, sizes (all, or along a dim), and `len` (dim 0's size).
READS = frozenset({"aten::dim", "aten::size", "aten::len"})
#: What a raising block may hold: the message's making (it runs only when the check fails).
RAISE_KINDS = frozenset({"prim::RaiseException", "prim::Constant", "aten::format", "aten::str",
                         "prim::ListConstruct", "prim::TupleConstruct", "aten::__getitem__",
                         *READS, *OPS})


def _number(value: Any) -> bool:
    return isinstance(value.type(), (torch._C.IntType, torch._C.BoolType))


def _ints(value: Any) -> bool:
    ty = value.type()
    return isinstance(ty, torch._C.ListType) and isinstance(ty.getElementType(), torch._C.IntType)


def is_check_value(node: Any) -> bool:
    """Whether `node` computes a value of a check's condition: a read of a tensor's shape
    (`READS`: its rank, its sizes, one size, `len`), an item or the length of such a list of
    sizes, an op of `OPS` on ints and bools, or a `prim::If` choosing between such values
    (`and`, `or`: the second operand is computed only where the first does not decide)."""
    if node.outputsSize() != 1:
        return False
    operands = inputs_of(node)
    if node.kind() == "aten::size" and len(operands) == 1:  # `x.shape`
        return is_tensor(operands[0]) and _ints(node.output())
    if not _number(node.output()):
        return False
    if node.kind() == "prim::If":
        return all(len(outputs_of(b)) == 1 and all(
            n.kind() == "prim::Constant" or is_check_value(n) for n in b.nodes())
            for b in blocks_of(node))
    if node.kind() == "aten::__getitem__":  # `x.shape[1]`
        return len(operands) == 2 and _ints(operands[0]) and _number(operands[1])
    if node.kind() in READS:
        first = operands[0] if operands else None
        return first is not None and (is_tensor(first) or node.kind() == "aten::len" and _ints(
            first)) and all(map(_number, operands[1:]))
    return node.kind() in OPS and bool(operands) and all(map(_number, operands))


class Shape(tuple):
    """The sizes of a tensor a check reads, as `evaluate` takes them (not a list of ints)."""


def raising_block(node: Any) -> int | None:
    """The index of the block of check `node` that raises, or None if `node` is no check: a
    `prim::If` without outputs, one block of which ends raising and holds only `RAISE_KINDS`,
    the other empty."""
    if node.kind() != "prim::If" or node.outputsSize() != 0:
        return None
    blocks = blocks_of(node)
    for k, block in enumerate(blocks):
        other = blocks[1 - k]
        nodes = list(block.nodes())
        if (nodes and nodes[-1].kind() == "prim::RaiseException"
                and all(n.kind() in RAISE_KINDS and not blocks_of(n) for n in nodes)
                and not list(other.nodes()) and not outputs_of(other)):
            return k
    return None


def is_check(node: Any) -> bool:
    return raising_block(node) is not None


def is_check_node(node: Any) -> bool:
    """A check or a check value."""
    return is_check(node) or is_check_value(node)


def owning_check(node: Any, holds_check: Callable[[Any], bool] = is_check) -> Any | None:
    """The one check that every use of check value `node` leads to (through other check
    values, or inside the check's raising block), or None if there is not one such. With
    `holds_check`, the node that holds the check (a fusion group) serves as the check."""
    owners = set()
    for use in node.output().uses():
        user = use.user
        while user.owningBlock() != node.owningBlock() and (
                user.owningBlock().owningNode() is not None):
            user = user.owningBlock().owningNode()  # a use in a raising block: its check
        if user.owningBlock() != node.owningBlock():
            return None
        if holds_check(user):
            owners.add(user)
        elif is_check_value(user):
            owners.add(owning_check(user, holds_check))
        else:
            return None
        if len(owners) > 1:
            return None
    return next(iter(owners), None)


def operands(node: Any) -> list[Any]:
    """The values `node` reads: its inputs, and those its blocks read from outside them."""
    inside = {v.unique() for b in blocks_of(node) for n in b.nodes() for v in outputs_of(n)}
    inner = [v for b in blocks_of(node) for n in b.nodes() for v in operands(n)]
    inner += [v for b in blocks_of(node) for v in outputs_of(b)]
    found = inputs_of(node) + [v for v in inner if v.unique() not in inside]
    return list({v.unique(): v for v in found}.values())


def condition(check: Any) -> list[Any]:
    """The check values in `check`'s block that its condition is computed from, in order."""
    found: dict[Any, None] = {}

    def visit(value: Any) -> None:
        node = value.node()
        if node.owningBlock() == check.owningBlock() and is_check_value(node) and (
                node not in found):
            for operand in operands(node):
                visit(operand)
            found[node] = None

    visit(check.inputsAt(0))
    return list(found)


def leaves(check: Any) -> list[Any]:
    """The values `check`'s condition is computed from that are no check values: tensors
    whose shape it reads, constants, and anything else (which makes it no constant)."""
    nodes = condition(check)
    inner = {n.output().unique() for n in nodes}
    read = [v for n in nodes for v in operands(n)] or [check.inputsAt(0)]
    return list({v.unique(): v for v in read if v.unique() not in inner}.values())


def evaluate(kind: str, operands: list[Any]) -> Any:
    """The value of a check value of `kind` on `operands`: ints, bools, lists of ints, and a
    tensor's `Shape`; ValueError where eager would raise."""
    first = operands[0]
    if kind == "aten::dim":
        return len(first)
    if kind == "aten::len":
        return len(first) if not isinstance(first, Shape) else evaluate("aten::size", [first, 0])
    if kind == "aten::size" and len(operands) == 1:
        return list(first)
    if kind in ("aten::size", "aten::__getitem__"):
        k = operands[1]
        if not -len(first) <= k < len(first):
            raise ValueError(f"{kind} at {k} of {len(first)} sizes")
        return first[k]
    if kind == "aten::floordiv" and operands[1] == 0:
        raise ValueError("integer division by zero")
    return OPS[kind](*operands)


def message_operands(check: Any) -> list[Any]:
    """The values defined outside check `check` that its raising block reads."""
    return operands(check)[1:]
