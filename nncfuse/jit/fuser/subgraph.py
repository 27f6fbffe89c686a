"""subgraph: group surgery, the one place that makes, grows and takes apart fusion groups.

A group is a `prim::TensorExprGroup` node whose `Subgraph` attribute holds
its nodes; the group's inputs and outputs are the values its nodes take
from, and give to, the rest of the graph:

    %x : Float(128) = aten::mul(%b, %b)           %z : Float(128) = prim::TensorExprGroup_0(%b)
    %z : Float(128) = aten::sin(%x)        ==>    with prim::TensorExprGroup_0 = graph(%0 : ...):
                                                    %x = aten::mul(%0, %0)
                                                    %z = aten::sin(%x)
                                                    -> (%z)

`make_group` wraps one node, `merge_into` pulls a producer (a node or a
group) into a group, `unmerge` puts a group's nodes back in its place,
`move_aliases_out` takes returned views that must share memory out again. The
fuser forms groups with them and the guard undoes the ones that fail to
compile.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ...tensorexpr import shape_checks
from ...tensorexpr.meta import inputs_of, outputs_of
from . import sizes
from .sizes import is_size_node

GROUP = "prim::TensorExprGroup"


def is_group(node: Any) -> bool:
    return node.kind() == GROUP


#: Whether an operand of a node (node, value) is a size expression that the group copies in
#: with the node (`sizes.py`), rather than taking it as an input.
Copies = Callable[[Any, Any], bool]


def _no_copies(node: Any, value: Any) -> bool:
    return False


def make_group(graph: Any, node: Any, copies: Copies = _no_copies) -> Any:
    """Wrap `node` alone in a new fusion group in its place."""
    group = graph.create(GROUP, 0)
    group.insertBefore(node)
    group.g_("Subgraph", torch._C.Graph())
    _absorb(group, node, copies)
    return group


def holds_check(node: Any) -> bool:
    """Whether `node` is a shape check, or a fusion group that holds one."""
    if node.kind() == GROUP:
        return any(map(shape_checks.is_check, node.g("Subgraph").nodes()))
    return shape_checks.is_check(node)


def merge_into(graph: Any, group: Any, producer: Any, copies: Copies = _no_copies) -> None:
    """Move `producer` (a node or a group of `group`'s kind), which precedes `group`, into
    it. A group's size expressions are copied in again with the nodes that read them."""
    nodes = unmerge(graph, producer) if producer.kind() == group.kind() else [producer]
    # (a shape check's sizes are its own, not copied: `shape_checks`; any other size read,
    # a view's, is copied in again, as a group's outputs are tensors)
    copied = [n for n in nodes if is_size_node(n) and not (
        shape_checks.is_check_value(n) and shape_checks.owning_check(n, holds_check))]
    for node in reversed(nodes):
        if node.kind() != "prim::Constant" and node not in copied:
            _absorb(group, node, copies, drop=not copied)
    for node in reversed(copied):  # users first
        if not any(v.uses() for v in outputs_of(node)):
            node.destroy()


def _absorb(group: Any, node: Any, copies: Copies = _no_copies, drop: bool = True) -> None:
    """Clone `node` into the start of `group`'s subgraph and route its values through; its
    operands that `copies` names are built again inside (and with `drop`, removed outside
    when nothing else uses them)."""
    subgraph = group.g("Subgraph")
    inner_inputs = inputs_of(subgraph)
    index = {v.unique(): k for k, v in enumerate(inputs_of(group))}
    first = next(iter(subgraph.nodes()), None)

    def place(clone: Any) -> Any:
        if first is None:
            subgraph.appendNode(clone)
        else:
            clone.insertBefore(first)
        return clone

    copied = []

    def lookup(v: Any) -> Any:
        if v.node().kind() == "prim::Constant":
            return place(subgraph.createClone(v.node(), lambda x: x)).output()
        if copies(node, v):
            copied.append(v)
            return sizes.copy_into(subgraph, v, lookup, place)  # noqa: F821 - `del` below
        if v.unique() not in index:
            group.addInput(v)
            inner = subgraph.addInput()
            inner.setType(v.type())
            inner_inputs.append(inner)
            index[v.unique()] = len(inner_inputs) - 1
        return inner_inputs[index[v.unique()]]

    clone = place(subgraph.createClone(node, lookup))
    # `lookup` calls itself through its closure: a cycle that would keep this frame's values
    # (the fuser makes thousands) for the garbage collector. Deleting it breaks the cycle.
    del lookup
    pairs = list(zip(outputs_of(node), outputs_of(clone)))
    consumed = []
    for out, inner in pairs:
        inner.setType(out.type())
        if out.unique() in index:
            inner_inputs[index[out.unique()]].replaceAllUsesWith(inner)
            consumed.append(index[out.unique()])
    for k in sorted(consumed, reverse=True):
        group.removeInput(k)
        subgraph.eraseInput(k)
    for out, inner in pairs:
        if list(out.uses()):
            subgraph.registerOutput(inner)
            new = group.addOutput()
            new.setType(out.type())
            out.replaceAllUsesWith(new)
    node.destroy()
    for v in copied if drop else ():
        sizes.drop_unused(v)


def unmerge(graph: Any, group: Any) -> list[Any]:
    """Replace `group` by copies of its nodes, in place; return them in order."""
    subgraph = group.g("Subgraph")
    env = {v.unique(): outer for v, outer in zip(inputs_of(subgraph), inputs_of(group))}
    moved: list[Any] = []
    for node in subgraph.nodes():
        clone = graph.createClone(node, lambda v: env[v.unique()])
        clone.insertBefore(group)
        for out, new in zip(outputs_of(node), outputs_of(clone)):
            new.setType(out.type())
            env[out.unique()] = new
        moved.append(clone)
    for inner, outer in zip(outputs_of(subgraph), outputs_of(group)):
        outer.replaceAllUsesWith(env[inner.unique()])
    group.destroy()
    return moved


def move_aliases_out(graph: Any, group: Any, is_alias: Callable[[Any], bool]) -> None:
    """Compute outside `group` each returned alias that eager shares memory with another value.

    An alias node (`is_alias`: a view, or a conversion that returns its input)
    inside a group computes a fresh tensor. As a group output that is only
    right if no other value outside sees the memory eager's view shares:

        %v = aten::t(%x)      (%x an input of the group)      -> %v = aten::t(%x) outside
        %y = aten::add(...);  %v = aten::t(%y);  both returned -> %v = aten::t(%y) outside

    Such an output becomes a copy of its chain of aliases after the group,
    applied to the group's input or output it views (the base becomes an
    output if it was not one); uses inside the group keep the inner copy,
    and what is no longer used inside is removed.
    """
    subgraph = group.g("Subgraph")
    inputs = {v.unique() for v in inputs_of(subgraph)}
    env: dict[int, Any] = {}  # inner value -> its copy outside: chains share their prefixes
    last = [group]  # the node the next copy goes after

    def outer(v: Any) -> Any:
        """`v` outside: an alias or size node built again after the group (and before the
        copies that use it), anything else the group's input or output it is."""
        if v.unique() not in env:
            node = v.node()
            if v.unique() not in inputs and (is_alias(node) or is_size_node(node)):
                clone = graph.createClone(node, outer)
                clone.insertAfter(last[0])
                last[0] = clone
                for out, new in zip(outputs_of(node), outputs_of(clone)):
                    new.setType(out.type())
                    env[out.unique()] = new
            else:
                env[v.unique()] = _outer_value(graph, group, v)
        return env[v.unique()]

    while True:
        found = _shared_alias(subgraph, is_alias)
        if found is None:
            break
        k, _ = found
        new = outer(outputs_of(subgraph)[k])
        group.outputsAt(k).replaceAllUsesWith(new)
        group.eraseOutput(k)
        subgraph.eraseOutput(k)
        torch._C._jit_pass_dce(subgraph)
    for k in reversed(range(len(inputs_of(subgraph)))):
        if not inputs_of(subgraph)[k].uses():
            subgraph.eraseInput(k)
            group.removeInput(k)


def _shared_alias(subgraph: Any, is_alias: Callable[[Any], bool]) -> tuple[int, list[Any]] | None:
    """(output index, alias chain from it to its base) of the first returned alias whose base
    is a subgraph input or is seen through another output too; None if there is none."""
    inputs = {v.unique() for v in inputs_of(subgraph)}
    chains: list[tuple[int, list[Any], Any]] = []
    seen: dict[int, int] = {}
    for k, value in enumerate(outputs_of(subgraph)):
        chain, base = [], value
        while base.unique() not in inputs and is_alias(base.node()):
            chain.append(base.node())
            base = base.node().inputsAt(0)
        chains.append((k, chain, base))
        seen[base.unique()] = seen.get(base.unique(), 0) + 1
    for k, chain, base in chains:
        if chain and (base.unique() in inputs or seen[base.unique()] > 1):
            return k, chain
    return None


def _outer_value(graph: Any, group: Any, inner: Any) -> Any:
    """The value outside `group` that stands for its subgraph's value `inner` (made an output
    of the group if it was not one; constants are copied before the group)."""
    subgraph = group.g("Subgraph")
    for k, v in enumerate(inputs_of(subgraph)):
        if v == inner:
            return group.inputsAt(k)
    for k, v in enumerate(outputs_of(subgraph)):
        if v == inner:
            return group.outputsAt(k)
    if inner.node().kind() == "prim::Constant":
        clone = graph.createClone(inner.node(), lambda x: x)
        clone.insertBefore(group)
        return clone.output()
    subgraph.registerOutput(inner)
    new = group.addOutput()
    new.setType(inner.type())
    return new
