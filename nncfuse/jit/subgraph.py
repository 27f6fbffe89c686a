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
group) into a group, `unmerge` puts a group's nodes back in its place. The
fuser forms groups with them and the guard undoes the ones that fail to
compile.
"""

from __future__ import annotations

from typing import Any

import torch

GROUP = "prim::TensorExprGroup"


def is_group(node: Any) -> bool:
    return node.kind() == GROUP


def make_group(graph: Any, node: Any) -> Any:
    """Wrap `node` alone in a new fusion group in its place."""
    group = graph.create(GROUP, 0)
    group.insertBefore(node)
    group.g_("Subgraph", torch._C.Graph())
    _absorb(group, node)
    return group


def merge_into(graph: Any, group: Any, producer: Any) -> None:
    """Move `producer` (a node or a group), which precedes `group`, into it."""
    nodes = unmerge(graph, producer) if is_group(producer) else [producer]
    for node in reversed(nodes):
        if node.kind() != "prim::Constant":
            _absorb(group, node)


def _absorb(group: Any, node: Any) -> None:
    """Clone `node` into the start of `group`'s subgraph and route its values through."""
    subgraph = group.g("Subgraph")
    inner_inputs = list(subgraph.inputs())
    index = {v.unique(): k for k, v in enumerate(group.inputs())}
    first = next(iter(subgraph.nodes()), None)

    def place(clone: Any) -> Any:
        if first is None:
            subgraph.appendNode(clone)
        else:
            clone.insertBefore(first)
        return clone

    def lookup(v: Any) -> Any:
        if v.node().kind() == "prim::Constant":
            return place(subgraph.createClone(v.node(), lambda x: x)).output()
        if v.unique() not in index:
            group.addInput(v)
            inner = subgraph.addInput()
            inner.setType(v.type())
            inner_inputs.append(inner)
            index[v.unique()] = len(inner_inputs) - 1
        return inner_inputs[index[v.unique()]]

    clone = place(subgraph.createClone(node, lookup))
    pairs = list(zip(node.outputs(), clone.outputs()))
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


def unmerge(graph: Any, group: Any) -> list[Any]:
    """Replace `group` by copies of its nodes, in place; return them in order."""
    subgraph = group.g("Subgraph")
    env = {v.unique(): outer for v, outer in zip(subgraph.inputs(), group.inputs())}
    moved: list[Any] = []
    for node in subgraph.nodes():
        clone = graph.createClone(node, lambda v: env[v.unique()])
        clone.insertBefore(group)
        for out, new in zip(node.outputs(), clone.outputs()):
            new.setType(out.type())
            env[out.unique()] = new
        moved.append(clone)
    for inner, outer in zip(subgraph.outputs(), group.outputs()):
        outer.replaceAllUsesWith(env[inner.unique()])
    group.destroy()
    return moved
