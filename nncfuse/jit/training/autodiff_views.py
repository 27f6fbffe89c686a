"""autodiff_views: the views between differentiable graphs moved into them, and the graphs
they separated joined.

`_jit_pass_create_autodiff_subgraphs` merges no view op (a view returned by a
differentiable graph would be differentiated as a copy), so a transformer's
attention (`chunk`, `reshape`, `transpose` between the QKV projection, the
attention and the output projection) leaves three graphs: three autograd nodes
whose backwards run one after another in Python, with each view's backward (a
`cat` for the chunk, copies for the reshapes of transposed gradients) between
them under eager autograd. A view whose every use is one differentiable graph
is no output of it, so this pass moves it in (`chunk` unpacked as
`prim::ConstantChunk`, whose gradient TorchScript's autodiff knows: a `cat`),
and then joins each graph that fed such a view with the graph that took it, as
one, where alias analysis lets the first move down to the second:

    %a = prim::DifferentiableGraph_0(%x, %w)         %b = prim::DifferentiableGraph_0(%x, %w, %u)
    %t = aten::transpose(%a, 1, 2)            ==>      with graph(%x, %w, %u):
    %b = prim::DifferentiableGraph_1(%t, %u)             %a = aten::linear(%x, %w)
                                                         %t = aten::transpose(%a, 1, 2)
                                                         %b = aten::matmul(%t, %u)

Only the views TorchScript's autodiff differentiates move (not `slice`, `select`,
`expand`: their gradients have no formula there), and only where their operands
other than the tensor are constants.
"""

from __future__ import annotations

from typing import Any

from ...tensorexpr.meta import inputs_of, is_tensor, outputs_of
from ..fuser.subgraph import merge_into, unmerge

DIFFERENTIABLE_GRAPH = "prim::DifferentiableGraph"
#: views whose gradient TorchScript's autodiff has a formula for
_VIEWS = frozenset(("aten::reshape", "aten::view", "aten::transpose", "aten::permute",
                    "aten::t", "aten::squeeze", "aten::unsqueeze", "aten::contiguous"))


def absorb_views(graph: Any, threshold: int) -> None:
    """Move the views that feed only one differentiable graph into it, then join the
    differentiable graphs such views connected (see the module's docstring); the graphs of
    fewer than `threshold` nodes then are taken apart (their nodes run under eager
    autograd), as `_jit_pass_create_autodiff_subgraphs` takes apart its small ones."""
    joins: list[tuple[Any, Any]] = []  # (producer graph, consumer graph) through a view
    for node in _graphs(graph):
        while _absorb_one(graph, node, joins):
            pass
    merged: list[tuple[Any, Any]] = []  # (graph merged, the graph it went into)
    for producer, consumer in joins:
        producer, consumer = _alive(producer, merged), _alive(consumer, merged)
        if producer == consumer or producer.owningBlock() != consumer.owningBlock():
            continue
        if not graph.alias_db().move_before_topologically_valid(producer, consumer):
            continue
        merge_into(graph, consumer, producer)
        merged.append((producer, consumer))
    for node in _graphs(graph):
        body = [n for n in node.g("Subgraph").nodes() if n.kind() != "prim::Constant"]
        if len(body) < threshold:
            unmerge(graph, node)


def _alive(node: Any, merged: list[tuple[Any, Any]]) -> Any:
    """`node`, or the graph it was merged into (following `merged`)."""
    for gone, into in merged:
        if gone == node:
            return _alive(into, merged)
    return node


def _graphs(graph: Any) -> list[Any]:
    """The differentiable graphs in `graph`, nested blocks' too (an `If`'s branches)."""
    return graph.findAllNodes(DIFFERENTIABLE_GRAPH)


def _absorb_one(graph: Any, node: Any, joins: list[tuple[Any, Any]]) -> bool:
    """Move one view that feeds only `node` into it; whether one moved. A view of another
    differentiable graph's output notes the pair in `joins`."""
    for value in inputs_of(node):
        view = _only_for(value, node)
        if view is None:
            continue
        if view.kind() == "prim::ListUnpack":
            view = _constant_chunk(graph, view)
        source = view.inputsAt(0).node()
        if source.kind() == DIFFERENTIABLE_GRAPH:
            joins.append((source, node))
        merge_into(graph, node, view)
        return True
    return False


def _only_for(value: Any, node: Any) -> Any:
    """The view that makes `value` if it moves into `node`: every use of its results is
    `node`'s, its other operands are constants; else None."""
    producer = value.node()
    kind = producer.kind()
    if kind == "prim::ListUnpack":
        chunk = producer.input().node()
        if (chunk.kind() != "aten::chunk" or len(producer.input().uses()) != 1
                or not _constant_operands(chunk) or not _equal_parts(producer)):
            return None
    elif kind not in _VIEWS or not _constant_operands(producer):
        return None
    if not all(is_tensor(v) and all(u.user == node for u in v.uses())
               for v in outputs_of(producer)):
        return None
    return producer


def _constant_operands(node: Any) -> bool:
    """Whether `node`'s operands after its first (the tensor) are all constants."""
    return all(v.node().kind() == "prim::Constant" for v in inputs_of(node)[1:])


def _equal_parts(unpack: Any) -> bool:
    """Whether the parts a chunk's `ListUnpack` gives are typed all of one shape (df gives
    a part without a gradient zeros like another's: `autodiff._chunk_zeros`)."""
    shapes = [v.type().sizes() if is_tensor(v) else None for v in outputs_of(unpack)]
    return None not in shapes and all(s == shapes[0] and None not in s for s in shapes)


def _constant_chunk(graph: Any, unpack: Any) -> Any:
    """`chunk` and the `ListUnpack` of its parts as one `prim::ConstantChunk` (which
    TorchScript's autodiff differentiates), in the unpack's place."""
    chunk = unpack.input().node()
    chunks, dim = (v.toIValue() for v in inputs_of(chunk)[1:])
    node = graph.create("prim::ConstantChunk", [chunk.inputsAt(0)], unpack.outputsSize())
    node.i_("chunks", chunks)
    node.i_("dim", dim)
    node.insertBefore(unpack)
    for old, new in zip(outputs_of(unpack), outputs_of(node)):
        new.setType(old.type())
        old.replaceAllUsesWith(new)
    unpack.destroy()
    chunk.destroy()
    return node
