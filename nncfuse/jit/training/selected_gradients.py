"""selected_gradients: a gradient TorchScript masks by multiplying is selected, as eager's.

TorchScript's formulas (`symbolic_script.cpp`) mask a gradient by multiplying it by a
condition: `where(cond, a, b)` gives `a` the gradient times the condition as a number;
relu's, relu6's and hardshrink's multiply by their masks (`result > 0`, ...). Eager's
(`derivatives.yaml`) select: `where(cond, grad, 0)`, `threshold_backward`. The two agree
but where the gradient is infinite or NaN at an element the mask drops: the product is NaN
there (inf * 0), eager's 0. (A `sqrt` after the op, at an element where both are 0, makes
that gradient: 0 / 0.) In a typed df graph, each such product becomes the select:

    %m = aten::type_as(%cond, %x)                 (%cond: Bool; %x, %g and the product of
    %d = aten::mul(%g, %m)            ==>          one floating dtype)
                                                   %d = aten::where(%cond, %g, 0.)
    %d = aten::mul(%g, %cond)         ==>          %d = aten::where(%cond, %g, 0.)

(The selected zero is +0.0, eager's, where the product of a negative gradient is -0.0.
Where the mask itself differs from eager's, it still does: relu's `result > 0` is false at
a NaN input, whose gradient eager's `threshold_backward` passes on.)
"""

from __future__ import annotations

from typing import Any

import torch

from ...tensorexpr.meta import all_nodes

__all__ = ["select_masked_gradients"]


def _dtype(value: Any) -> torch.dtype | None:
    typ = value.type()
    return typ.dtype() if isinstance(typ, torch._C.TensorType) else None


def _mask_of(product: Any) -> tuple[Any, Any] | None:
    """(gradient, Bool condition) of `mul(g, cond)` or `mul(g, type_as(cond, x))`, in either
    order, whose floating operands and result have one dtype; else None."""
    if product.kind() != "aten::mul" or product.inputsSize() != 2:
        return None
    for k in (0, 1):
        g, m = product.inputsAt(k), product.inputsAt(1 - k)
        dtype = _dtype(g)
        if dtype is None or not dtype.is_floating_point or _dtype(product.output()) != dtype:
            continue
        if m.node().kind() == "aten::type_as" and _dtype(m) == dtype:
            m = m.node().inputsAt(0)
        if _dtype(m) == torch.bool:
            return g, m
    return None


def select_masked_gradients(graph: torch._C.Graph) -> int:
    """Rewrite, in place, each product of a gradient by a Bool condition cast to it as a
    select; the count."""
    count = 0
    for node in list(all_nodes(graph)):
        found = _mask_of(node)
        if found is None:
            continue
        g, cond = found
        with graph.insert_point_guard(node):
            zero = graph.insertConstant(0.0)
            select = graph.insertNode(graph.create("aten::where", [cond, g, zero], 1))
        select.output().setType(node.output().type())
        node.output().replaceAllUsesWith(select.output())
        node.destroy()
        count += 1
    if count:
        torch._C._jit_pass_dce(graph)
    return count
