"""selected_gradients: a gradient TorchScript masks by multiplying is selected, as eager's.

TorchScript's formula for `where(cond, a, b)` (`symbolic_script.cpp`) gives `a` the
gradient times the condition as a number, and `b` times its negation. Eager's
(`derivatives.yaml`) selects: `where(cond, grad, 0)`. The two agree but where the gradient
is infinite or NaN at an element the condition drops: the product is NaN there (inf * 0),
eager's 0. A `sqrt` after the `where`, at an element where both are 0, makes that gradient
(0 / 0) in either backward. In a typed df graph, each such product becomes the select:

    %m = aten::type_as(%cond, %g)                    (%cond: Bool, %g and the product of
    %d = aten::mul(%g, %m)            ==>            one floating dtype)
                                                     %d = aten::where(%cond, %g, 0.)

(The selected zero is +0.0, eager's, where the product of a negative gradient is -0.0.)
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
    """(gradient, Bool condition) of `mul(g, type_as(cond, g))`, in either order, whose
    operands and result have one floating dtype; else None."""
    if product.kind() != "aten::mul" or product.inputsSize() != 2:
        return None
    for k in (0, 1):
        g, m = product.inputsAt(k), product.inputsAt(1 - k)
        cast = m.node()
        if cast.kind() != "aten::type_as" or cast.inputsAt(1) is not g \
                and cast.inputsAt(1).unique() != g.unique():
            continue
        cond = cast.inputsAt(0)
        dtype = _dtype(g)
        if _dtype(cond) == torch.bool and dtype is not None and dtype.is_floating_point \
                and _dtype(product.output()) == dtype:
            return g, cond
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
