"""identities: casts to a value's own type, and slices of all of it, as the value itself.

transformers' Llama casts to float32 and back around each RMSNorm and casts the rotary
cos/sin to the query's dtype (`hidden_states.to(torch.float32)`, `.to(input_dtype)`); on a
float32 model each is its input (ATen's `to` returns `self` when dtype, device and layout
stay and no copy is asked). TorchScript's autodiff cannot differentiate `aten::to`, so each
one split a differentiable graph in two: 25 casts, 26 graphs, each a Python autograd node
and a kernel boundary. Its `repeat_kv` indexes `x[:, :, None, :, :]`: four slices of
everything per key and value, each a view in forward and a `SliceBackward0` in backward that
copies the gradient into zeros. Both go, where the profiled types show them to be identities:

    %a = aten::to(%x, %float, False, False, None)    ==>   (uses of %a, %s use %x)
    %s = aten::slice(%x, %1, %0, %max, %1)              (x: Float(1, 2, 128, 64))

A cast is exact even where its result leaves the graph (eager's is the same tensor). A
slice, a new view in eager, goes only where every reader of it and of its input is an op
that reads or views them without writing them: none can tell the two apart. Types hold for
the whole variant only in a graph without control flow (the caller also checks that no op
makes shapes from values): in a graph with blocks nothing is rewritten.
"""

from __future__ import annotations

from typing import Any

import torch

from ...tensorexpr.meta import blocks_of, constant, inputs_of, only_reads

_PRESERVE_FORMAT = 1  # (torch.preserve_format, as a TorchScript constant)
#: a cast's arguments other than its dtype and device (and non_blocking, which changes
#: nothing here), and the values that keep the tensor
_KEEPS = {"copy": (False,), "memory_format": (None, _PRESERVE_FORMAT), "layout": (None, 0),
          "pin_memory": (None, False)}


def drop_identities(graph: torch._C.Graph) -> int:
    """Replace, in place, each cast and slice of `graph` that is its input by its input; the
    count removed (none in a graph with blocks)."""
    nodes = list(graph.nodes())
    if any(blocks_of(node) for node in nodes):
        return 0
    done = 0
    for node in nodes:
        if node.kind() == "aten::to" and _same_type(node) or (
                node.kind() == "aten::slice" and _whole(node) and _only_read(node)):
            node.output().replaceAllUsesWith(inputs_of(node)[0])
            node.destroy()
            done += 1
    return done


def _types(node: Any) -> tuple[Any, Any] | None:
    """The profiled types of `node`'s first input and its output, if both are tensors."""
    source, result = inputs_of(node)[0].type(), node.output().type()
    if not isinstance(source, torch._C.TensorType) or not isinstance(
            result, torch._C.TensorType):
        return None
    return source, result


def _same_type(node: Any) -> bool:
    """Whether the cast `node` keeps its input's dtype and device (as profiled) and asks for
    no copy and no other layout: then ATen returns the input itself."""
    types = _types(node)
    if types is None or node.outputsSize() != 1:
        return False
    source, result = types
    if None in (source.dtype(), source.device()) or (
            source.dtype(), source.device()) != (result.dtype(), result.device()):
        return False
    schema = torch._C.parse_schema(node.schema())
    return all(constant(value) in _KEEPS[argument.name]
               for argument, value in zip(schema.arguments, inputs_of(node))
               if argument.name in _KEEPS)


def _whole(node: Any) -> bool:
    """Whether the slice `node` starts at 0 with step 1 and keeps its input's sizes (as
    profiled): all of it."""
    types = _types(node)
    if types is None or len(inputs_of(node)) != 5:
        return False
    source, result = types
    start, step = (constant(inputs_of(node)[k]) for k in (2, 4))
    sizes = source.sizes()
    return (start in (None, 0) and step == 1 and sizes is not None and None not in sizes
            and sizes == result.sizes())


def _only_read(node: Any) -> bool:
    """Whether every other reader of the slice `node`'s input, and every reader of its
    result, reads them or views them without writing them (no reader could tell the result
    from its input: only a write may change a tensor's sizes, and a reader that is not an op
    with a schema, a return or a tuple, may show which tensor it is)."""
    uses = [u for v in (inputs_of(node)[0], node.output()) for u in v.uses() if u.user != node]
    return all(only_reads(u.user, u.offset, views=True) for u in uses)
