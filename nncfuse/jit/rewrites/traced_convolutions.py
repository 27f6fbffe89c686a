"""traced_convolutions: what a trace records for a convolution, as the call it recorded.

`torch.jit.trace` records `F.conv2d` (and `conv1d`, `conv3d`, `conv_transpose*`) as the
`aten::_convolution` it calls, an overload with no AutocastCPU kernel. Under
`torch.autocast("cpu")` eager casts the `conv2d` call to the autocast dtype; the traced node
runs in float32 (TorchScript's own result), and so would every op after it. Under autocast
the trace's convolutions are written back as the calls they record, which autocast casts
as eager's do (`autocast_casts.py` then writes the casts out):

    %y = aten::_convolution(%x, %w, %b, [1, 1], [1, 1], [1, 1], False, [0, 0], 1,
                            False, False, True, True)
        ==>  %y = aten::conv2d(%x, %w, %b, [1, 1], [1, 1], [1, 1], 1)
    (transposed: aten::conv_transpose2d(%x, %w, %b, stride, padding, output_padding,
                                        groups, dilation))

Exact on the CPU: `conv2d` calls `_convolution` with these operands, and the flags it adds
(cuDNN's benchmark, determinism, TF32) mean nothing there. Only nodes whose geometry is
constant (the dims of the call follow from the length of `stride`) and, not transposed,
whose `output_padding` is zero (which `conv2d` passes); others stay.
"""

from __future__ import annotations

from typing import Any

import torch

from ...tensorexpr.meta import blocks_of, inputs_of

_KIND = "aten::_convolution"
#: the overload tracing records (the `.deprecated` one, without `allow_tf32`, is cast)
_ARGS = 13


def untrace_convolutions(graph: torch._C.Graph) -> int:
    """Rewrite, in place, each traced `aten::_convolution` of `graph` on the CPU as the
    `conv*` call it records; the count rewritten."""
    return _block(graph, graph.block())


def _block(graph: torch._C.Graph, block: Any) -> int:
    done = 0
    for node in list(block.nodes()):
        for inner in blocks_of(node):
            done += _block(graph, inner)
        call = _call(node) if node.kind() == _KIND else None
        if call is None:
            continue
        kind, operands = call
        with graph.insert_point_guard(node):
            new = graph.insertNode(graph.create(kind, operands, 1))
        new.copyMetadata(node)
        new.output().setType(node.output().type())
        node.output().replaceAllUsesWith(new.output())
        node.destroy()
        done += 1
    return done


def _call(node: Any) -> tuple[str, list[Any]] | None:
    """(kind, operands) of the `conv*` call `node` records, or None."""
    args = inputs_of(node)
    if len(args) != _ARGS or any(a.node().kind() != "prim::Constant" for a in args[3:9]):
        return None
    x, w, b, stride, padding, dilation, transposed, output_padding, groups = args[:9]
    dims = stride.toIValue()
    if not isinstance(dims, list) or len(dims) not in (1, 2, 3):
        return None
    if not transposed.toIValue():
        if any(output_padding.toIValue()):
            return None
        return f"aten::conv{len(dims)}d", [x, w, b, stride, padding, dilation, groups]
    return (f"aten::conv_transpose{len(dims)}d",
            [x, w, b, stride, padding, output_padding, groups, dilation])
