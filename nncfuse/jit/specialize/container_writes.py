"""container_writes: does a program change a list or dict that its caller holds?

TorchScript converts a Python list or dict argument (or a module's list attribute,
copied when the module is scripted) into a container of its own: what the compiled
program appends or assigns never reaches the caller's object, which eager changes.
A Python function or module flagged here runs as Python, so the caller sees its writes.

    def f(x, seen: List[int]):
        seen.append(x.size(0))                  %seen is the graph's input
        return x.sin()                          aten::append(%seen, %n) writes it
                                            ==> "aten::append writes the list argument seen"

Containers are followed from the graph's inputs and attributes through item reads
(a list's inner list is the same object), so `pairs[0].append(..)` is seen too;
`list(seen)` and literals are new containers and may be written freely.
"""

from __future__ import annotations

from typing import Any

import torch

from ...tensorexpr.meta import all_nodes

_CONTAINERS = (torch._C.ListType, torch._C.DictType)
#: ops whose output is (a part of) their first operand, not a copy
_SAME_OBJECT = frozenset(("aten::__getitem__", "prim::ListUnpack", "prim::TupleUnpack",
                          "prim::TupleIndex"))


def _written_operands(node: Any) -> list[int]:
    """The positions of the operands `node`'s schema says it writes (`(a!)`)."""
    text = node.schema()
    if text == "(no schema)":
        return []
    schema = torch._C.parse_schema(text)
    return [i for i, arg in enumerate(schema.arguments)
            if arg.alias_info is not None and arg.alias_info.is_write]


def caller_container_written(graph: torch._C.Graph) -> str | None:
    """Why `graph` (inlined, before mutation is removed) must run as Python: the first write
    to a list or dict that came from its caller, or None."""
    held: dict[Any, str] = {}  # value -> how the caller holds it
    for v in graph.inputs():
        if isinstance(v.type(), _CONTAINERS + (torch._C.TupleType,)):
            held[v] = f"the argument {v.debugName().split('.')[0]}"
    for node in all_nodes(graph.block()):
        inputs = list(node.inputs())
        if node.kind() == "prim::GetAttr":
            for out in node.outputs():
                if isinstance(out.type(), _CONTAINERS + (torch._C.TupleType,)):
                    held[out] = f"the attribute {node.s('name')}"
            continue
        if node.kind() in _SAME_OBJECT and inputs and inputs[0] in held:
            for out in node.outputs():
                if isinstance(out.type(), _CONTAINERS + (torch._C.TupleType,)):
                    held[out] = held[inputs[0]]
            continue
        for i in _written_operands(node):
            if i < len(inputs) and inputs[i] in held and isinstance(inputs[i].type(),
                                                                   _CONTAINERS):
                kind = "dict" if isinstance(inputs[i].type(), torch._C.DictType) else "list"
                return f"{node.kind()} writes the {kind} {held[inputs[i]].split(' ', 1)[1]}"
    return None
