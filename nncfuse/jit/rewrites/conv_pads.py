"""conv_pads: a zero pad before convolutions as the convolutions' own padding.

transformers' MobileNetV2 pads every convolution's input as TensorFlow's "same" padding
does (`nn.functional.pad(x, [l, r, t, b])`, zeros) and convolves without padding. In
eager, and outside TorchScript's autodiff graphs (a pad is not differentiable there), each
pad fills a new tensor and copies its input in: 52 pads, 10 ms of MobileNetV2's 43 ms
forward, though 35 of them pad nothing (1x1 convolutions) and most others pad each side
alike (3x3, stride 1). Those pads go: a pad of nothing is its input, and a pad alike on
both sides of each spatial dim, read only by convolutions (not transposed) of constant
padding, adds to their padding (the same sums: the convolution reads zeros past the
edges either way):

    %p = aten::constant_pad_nd(%x, [1, 1, 1, 1], 0)     ==>
    %y = aten::_convolution(%p, %w, %b, %s, [0, 0], ..)       %y = aten::_convolution(%x, %w,
                                                                     %b, %s, [1, 1], ..)

Only where nothing writes the pad's input or result (every reader's schema writes and
aliases nothing): then no reader can tell the input from a copy of it. Pads that differ
by side (stride 2's [0, 1, 0, 1]) or of other values stay. Training's autodiff graphs
(`training/autodiff.py`) and frozen inference (`frontend/freezing.py`) both run it.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ...tensorexpr.meta import UNKNOWN, constant, inputs_of, only_reads

_CONVOLUTIONS = ("aten::_convolution", "aten::conv1d", "aten::conv2d", "aten::conv3d")
_PADDING = 4  # (the position of `padding` in each)


def fold_conv_pads(graph: torch._C.Graph) -> int:
    """Rewrite, in place, each pad of `graph` (top level) that is nothing or its readers'
    padding; the count removed."""
    done = 0
    for kind in ("aten::constant_pad_nd", "aten::pad"):
        for node in graph.findAllNodes(kind, False):
            pads = _zero_pads(node)
            if pads is None or not all(only_reads(u.user, u.offset) for v in (
                    inputs_of(node)[0], node.output()) for u in v.uses()):
                continue
            if any(pads):
                if not _fold_into_readers(graph, node, pads):
                    continue
            node.output().replaceAllUsesWith(inputs_of(node)[0])
            node.destroy()
            done += 1
    return done


def _zero_pads(node: Any) -> list[int] | None:
    """The pad amounts (last dim first, as `pad` takes them) of a constant pad of zeros
    with constant non-negative amounts; else None."""
    values = [constant(v) for v in inputs_of(node)[1:]]
    if any(v is UNKNOWN for v in values):
        return None
    pads, rest = values[0], values[1:]
    if node.kind() == "aten::pad":
        mode, value = rest
        if mode != "constant":
            return None
    else:
        (value,) = rest
    if value is not None and (value != 0 or math.copysign(1.0, value) < 0):
        return None  # (a convolution pads with +0.0)
    if not isinstance(pads, list) or any(p < 0 for p in pads) or len(pads) % 2:
        return None
    return pads


def _fold_into_readers(graph: torch._C.Graph, node: Any, pads: list[int]) -> bool:
    """Whether every reader of `node`'s result is a convolution of it over the dims the pads
    pad, alike on both sides of each: then each reader pads that much more instead (its
    padding a new constant)."""
    dims = len(pads) // 2
    if pads[0::2] != pads[1::2]:
        return False
    extra = pads[0::2][::-1]  # (first spatial dim first, as a convolution takes it)
    uses = node.output().uses()
    current = [_padding(use.user, dims) if use.offset == 0 else None for use in uses]
    if any(c is None for c in current):
        return False
    for use, padding in zip(uses, current):
        with graph.insert_point_guard(use.user):
            new = [a + b for a, b in zip(padding, extra)]  # type: ignore[arg-type]
            use.user.replaceInput(_PADDING, graph.insertConstant(new))
    return True


def _padding(node: Any, dims: int) -> list[int] | None:
    """The constant padding of `node`, a convolution over `dims` dims and not a transposed
    one (whose padding crops its result); else None."""
    if node.kind() not in _CONVOLUTIONS:
        return None
    args = inputs_of(node)
    padding = constant(args[_PADDING])
    if node.kind() == "aten::_convolution" and constant(args[6]) is not False:
        return None
    if not isinstance(padding, list) or len(padding) != dims:
        return None  # (conv2d's padding may also be "same" or "valid")
    return padding
