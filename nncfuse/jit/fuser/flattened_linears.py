"""flattened_linears: a linear of a flattened input, unflattened after, as the linear of the
input itself.

AOTAutograd writes `F.linear` of an input with more than two dims out as a GEMM between two
views: the leading dims flattened into rows, and the result's rows viewed back. The second
view stands between the GEMM and what follows it (a GELU, a residual add), so oneDNN's fused
routine cannot take those as its epilogue: BERT's feed-forward GELU ran as a loop of its own
(213 us a call at 128 x 1024 in bfloat16) where the linear's post-op computes it for free.
Once `transposed_gemms` has made the GEMM a linear again, the views are dropped:

    %x2 : BFloat16(128, 256) = aten::view(%x, [128, 256])         (x: BFloat16(1, 128, 256))
    %y2 : BFloat16(128, 1024) = aten::linear(%x2, %w, %b)
    %y : BFloat16(1, 128, 1024) = aten::view(%y2, [1, 128, 1024])
                              ->
    %y : BFloat16(1, 128, 1024) = aten::linear(%x, %w, %b)

Exact: ATen's linear of an input of more than two dims computes the GEMM of its rows
flattened and views the result back (the graph's own decomposition). Only where the GEMM's
result has no other reader than the view after it, and the input's leading dims are the
result's; the flattened input stays where something else reads it.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ... import log
from ...tensorexpr.meta import TensorMeta

_log = log.get_logger(__file__)

_VIEWS = ("aten::view", "aten::reshape", "aten::_unsafe_view")


def _sizes(value: Any) -> list[int] | None:
    meta = TensorMeta.from_type(value.type())
    if meta is None or any(not isinstance(s, int) for s in meta.sizes):
        return None
    return list(meta.sizes)


def _unflattened(node: Any) -> tuple[Any, Any] | None:
    """(x, the view after `node`) where `node` is `linear(view(x), w, b)` whose result only
    that view reads, `x` of sizes [*lead, K], the view's of [*lead, N]."""
    if node.kind() != "aten::linear" or node.outputsSize() != 1:
        return None
    flat, uses = node.inputsAt(0), node.output().uses()
    if flat.node().kind() not in _VIEWS or len(uses) != 1 or uses[0].user.kind() not in _VIEWS \
            or uses[0].offset != 0:
        return None
    x, after = flat.node().inputsAt(0), uses[0].user
    xs, flats, ys, outs = (_sizes(v) for v in (x, flat, node.output(), after.output()))
    if None in (xs, flats, ys, outs) or len(xs) <= 2 or len(flats) != 2 or len(ys) != 2:
        return None
    if xs[:-1] != outs[:-1] or xs[-1] != flats[1] or math.prod(xs[:-1]) != flats[0] \
            or len(outs) != len(xs) or outs[-1] != ys[1]:
        return None
    return x, after


def unflatten_linears(graph: torch._C.Graph) -> int:
    """Rewrite, in place, the top-level block's linears of flattened inputs viewed back as
    linears of the inputs themselves; the count rewritten."""
    count = 0
    for node in list(graph.block().nodes()):
        found = _unflattened(node)
        if found is None:
            continue
        x, after = found
        node.replaceInput(0, x)
        node.output().setType(after.output().type())
        after.output().replaceAllUsesWith(node.output())  # (dead now: DCE removes it)
        count += 1
    if count:
        torch._C._jit_pass_dce(graph)
        _log.dump(f"After unflattening {count} linears:\n", graph)
    return count
