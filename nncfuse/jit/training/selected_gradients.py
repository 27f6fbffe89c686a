"""selected_gradients: where's gradient selected, as eager's, not multiplied.

TorchScript's formula for `where(cond, a, b)` (`symbolic_script.cpp`) gives `a` the
gradient times the condition as a number, and `b` times its negation. Eager's
(`derivatives.yaml`) selects: `where(cond, grad, 0)`. The two agree but where the gradient
is infinite or NaN at an element the condition drops: the product is NaN there (inf * 0),
eager's 0. (A `sqrt` after the `where`, at an element where both are 0, makes that
gradient: 0 / 0.) In a typed df graph, each product of a gradient by a Bool value the
forward captured (where's condition) becomes the select:

    %m = aten::type_as(%cond, %x)                 (%cond: a df input, Bool; %x, %g and
    %d = aten::mul(%g, %m)            ==>          the product of one floating dtype)
                                                   %d = aten::where(%cond, %g, 0.)
    %n = aten::bitwise_not(%cond)
    %d = aten::mul(%g, type_as(%n, %x))   ==>      %d = aten::where(%cond, 0., %g)

(The selected zero is +0.0, eager's, where the product of a negative gradient is -0.0.)
Not a mask df computes from a value (relu's `result > 0`, clamp's bounds): at a NaN input
eager's formulas differ from op to op (relu's passes the gradient, clamp's gives 0), which
the mask does not tell; those keep TorchScript's product.
"""

from __future__ import annotations

from typing import Any

import torch

from ...tensorexpr.meta import all_nodes, replace_by

__all__ = ["select_masked_gradients"]


def _dtype(value: Any) -> torch.dtype | None:
    typ = value.type()
    return typ.dtype() if isinstance(typ, torch._C.TensorType) else None


def _mask_of(product: Any) -> tuple[Any, Any, bool] | None:
    """(gradient, condition, negated) of `mul(g, m)` or `mul(g, type_as(m, x))`, in either
    order, where `m` is `cond` or its negation and `cond` a Bool input of the graph, and the
    floating operands and result have one dtype; else None."""
    if product.kind() != "aten::mul" or product.inputsSize() != 2:
        return None
    for k in (0, 1):
        g, m = product.inputsAt(k), product.inputsAt(1 - k)
        dtype = _dtype(g)
        if dtype is None or not dtype.is_floating_point or _dtype(product.output()) != dtype:
            continue
        if m.node().kind() == "aten::type_as" and _dtype(m) == dtype:
            m = m.node().inputsAt(0)
        negated = m.node().kind() in _NOTS
        if negated:
            m = m.node().inputsAt(0)
        if _dtype(m) == torch.bool and m.node().kind() == "prim::Param":
            return g, m, negated
    return None


_NOTS = ("aten::bitwise_not", "aten::logical_not")


def select_masked_gradients(graph: torch._C.Graph) -> int:
    """Rewrite, in place, each product of a gradient by a captured Bool condition (or its
    negation) as a select; the count."""
    count = 0
    for node in list(all_nodes(graph)):
        found = _mask_of(node)
        if found is None:
            continue
        g, cond, negated = found
        with graph.insert_point_guard(node):
            zero = graph.insertConstant(0.0)
        replace_by(graph, node, "aten::where", [cond, zero, g] if negated else [cond, g, zero])
        count += 1
    if count:
        torch._C._jit_pass_dce(graph)
    return count
