"""fold_tuples: a tuple unpacked right where it is packed, as the values packed.

A traced submodule that returns a tuple leaves a `prim::TupleConstruct` in its caller's
inlined graph and a `prim::TupleUnpack` of it where the caller takes the tuple apart. No
differentiable graph holds either, so the nodes on either side of the pair cannot join one
graph: they run apart, under eager autograd between them.

    %t = prim::TupleConstruct(%a, %b)       ==>   (uses of %x use %a, of %y use %b)
    %x, %y = prim::TupleUnpack(%t)
"""

from __future__ import annotations

import torch

from ...tensorexpr.meta import inputs_of


def fold_tuples(graph: torch._C.Graph) -> None:
    """Replace, in place, each `prim::TupleUnpack` (top level) of a `prim::TupleConstruct`
    by the values packed; drop the construct where nothing else reads it."""
    for node in graph.findAllNodes("prim::TupleUnpack", False):
        packed = inputs_of(node)[0].node()
        if packed.kind() != "prim::TupleConstruct":
            continue
        for out, value in zip(node.outputs(), packed.inputs()):
            out.replaceAllUsesWith(value)
        node.destroy()
        if not packed.output().uses():
            packed.destroy()
