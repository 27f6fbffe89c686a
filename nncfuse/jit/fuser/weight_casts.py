"""weight_casts: the casts of weights to reduced precision, made once per weight version, in
one call.

`batch_weight_casts`: where a graph casts several weights of module state through
`cast_cache.py`'s op (`autocast_casts.py` puts it where autocast casts a parameter), that it
does not write and sets no attribute, the weights are read first (the `prim::GetAttr`s moved
to the start, in their order) and cast in one call: one call of a Python op (about 8 us),
not one per weight.
(Not a graph input that is not module state: an activation, cast anew at every call, would
make the batch's copies be looked up one by one.)

    %w.1 : BFloat16(8, 3) = nncfuse::autocast_weight(%w, 15, True)
    %v.1 : BFloat16(8, 8) = nncfuse::autocast_weight(%v, 15, True)
                              ->
    %l : Tensor[] = prim::ListConstruct(%w, %v)
    %c : Tensor[] = nncfuse::autocast_weights(%l, 15, [True, True])
    %w.1 : BFloat16(8, 3), %v.1 : BFloat16(8, 8) = prim::ListUnpack(%c)

`cache_weight_casts`: the backend's graphs take a module's parameters and buffers as
inputs, and AOTAutograd has written autocast's casts of them out as `aten::to`, made anew
on every call as eager's autocast makes them anew in every region. Given which inputs are
float32 module state (AOTAutograd's static inputs), a cast of one to bfloat16 or float16
whose copy is only read (nothing writes it; the graph does not return it or a view of it)
comes from the cache instead:

    %w.1 : Tensor = aten::to(%arg0_1, 15, False, False, None)
                              ->
    %w.1 : Tensor = nncfuse::autocast_weight(%arg0_1, 15, True)

(The cache itself decides at run time what it may keep; anything else is cast anew.)
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from ... import log
from ...tensorexpr.meta import all_nodes
from . import cast_cache

_log = log.get_logger(__file__)

#: ScalarType codes of the reduced float dtypes, as TorchScript graphs spell a `to`'s dtype
_REDUCED_CODES = (5, 15)


def _escapes(value: Any, aliases: Any) -> bool:
    """Whether `value`, or a value that may alias it (a view of it, a container holding
    it), is written or returned."""
    seen, todo = {value.unique()}, [value]
    while todo:
        v = todo.pop()
        if aliases.has_writers(v):
            return True
        for use in v.uses():
            if use.user.kind() == "prim::Return":
                return True
            for out in use.user.outputs():
                if out.unique() not in seen and aliases.may_contain_alias(out, v):
                    seen.add(out.unique())
                    todo.append(out)
    return False


def _cacheable_cast(node: Any, weights: set[int], aliases: Any) -> bool:
    """Whether `node` is `aten::to(w, dtype, False, False, None)` of one of `weights` (the
    uniques of values) to a reduced dtype, whose copy no one writes or receives."""
    if node.kind() != "aten::to" or node.inputsSize() != 5 or node.outputsSize() != 1 \
            or node.inputsAt(0).unique() not in weights:
        return False
    flags = [node.inputsAt(i) for i in range(1, 5)]
    if any(f.node().kind() != "prim::Constant" for f in flags):
        return False
    dtype, non_blocking, copy, memory_format = (f.toIValue() for f in flags)
    if dtype not in _REDUCED_CODES or non_blocking or copy or memory_format is not None:
        return False
    return not _escapes(node.output(), aliases)


def batch_weight_casts(graph: torch._C.Graph) -> None:
    """The top-level block's cached casts of weights (in place) as one `autocast_weights` call
    per dtype, after the block's `prim::GetAttr`s, moved to its start (where nothing sets an
    attribute)."""
    block = graph.block()
    aliases = graph.alias_db()  # (a weight the graph writes is cast where it was)
    casts = [n for n in block.nodes() if n.kind() == cast_cache.KIND  # (of module state:
             and n.inputsAt(2).toIValue()  # a `prim::GetAttr`, or a static input)
             and not aliases.has_writers(n.inputsAt(0))]
    if len(casts) < 2 or any(n.kind() == "prim::SetAttr" for n in all_nodes(block)):
        return
    reads = [n for n in block.nodes() if n.kind() == "prim::GetAttr"]
    previous = None
    for node in reads:  # (in their order: each reads %self or one before it)
        if previous is None:
            start = next(iter(block.nodes()))
            if node != start:
                node.moveBefore(start)
        else:
            node.moveAfter(previous)
        previous = node
    nodes = list(block.nodes())  # (the block's return node ends it: there is a next one)
    after = nodes[nodes.index(previous) + 1] if previous is not None else nodes[0]
    by_dtype: dict[Any, list[Any]] = {}
    for node in casts:
        by_dtype.setdefault(node.inputsAt(1).toIValue(), []).append(node)
    for dtype, group in by_dtype.items():
        if len(group) < 2:
            continue
        with graph.insert_point_guard(after):
            weights = graph.insertNode(graph.create(
                "prim::ListConstruct", [n.inputsAt(0) for n in group], 1)).output()
            weights.setType(torch._C.ListType.ofTensors())
            states = graph.insertConstant([bool(n.inputsAt(2).toIValue()) for n in group])
            call = graph.insertNode(graph.create(
                cast_cache.BATCH_KIND, [weights, graph.insertConstant(dtype), states], 1))
            call.output().setType(weights.type())
            unpack = graph.insertNode(
                graph.create("prim::ListUnpack", [call.output()], len(group)))
        for node, value in zip(group, unpack.outputs()):
            value.setType(node.output().type())
            node.output().replaceAllUsesWith(value)
            node.destroy()


def cache_weight_casts(graph: torch._C.Graph, weights: Iterable[int]) -> int:
    """Cast the float32 module state among the inputs of `graph` (their indices: `weights`)
    through the cast cache, in place, where that is exact; the count of casts."""
    inputs = list(graph.inputs())
    uniques = {inputs[i].unique() for i in weights}
    aliases = graph.alias_db()
    count = 0
    for node in list(graph.block().nodes()):
        if not _cacheable_cast(node, uniques, aliases):
            continue
        with graph.insert_point_guard(node):
            args = [node.inputsAt(0), node.inputsAt(1), graph.insertConstant(True)]
            cached = graph.insertNode(graph.create(cast_cache.KIND, args, 1))
        cached.output().setType(node.output().type())
        node.output().replaceAllUsesWith(cached.output())
        node.destroy()
        count += 1
    if count:
        _log.dump(f"After casting {count} weights through the cast cache:\n", graph)
    return count
