"""type_as: `aten::type_as(x, y)` as `aten::to(x, y, False, False, None)`, the same call.

ATen's `type_as` is `x.to(y.options())`: `x` itself when `y` has its type. Its schema says
otherwise (`type_as(Tensor self, Tensor other) -> Tensor`, a new tensor), so TorchScript's
alias analysis let a write to `x` move across a read of the result: in the fuzzer's seed
9594, `x.type_as(x).triu(1)` and then `x[..., 2:5].relu_()` fused with the triangle read after
the write. `to.other` is the same call, its result annotated as `x`'s alias:

    %v = aten::type_as(%x, %y)        ==>   %v = aten::to(%x, %y, False, False, None)
"""

from __future__ import annotations

import torch

from ...tensorexpr.meta import all_nodes, inputs_of


def type_as_to(graph: torch._C.Graph) -> int:
    """Replace, in place, each `aten::type_as` of `graph` (its blocks too) by `aten::to`;
    the count replaced."""
    done = 0
    for node in list(all_nodes(graph.block())):
        if node.kind() != "aten::type_as":
            continue
        with graph.insert_point_guard(node):
            flags = [graph.insertConstant(v) for v in (False, False, None)]
            to = graph.insertNode(graph.create("aten::to", [*inputs_of(node), *flags], 1))
        to.output().setType(node.output().type())
        to.copyMetadata(node)
        node.output().replaceAllUsesWith(to.output())
        node.destroy()
        done += 1
    return done
