"""eager_gradients: ops whose TorchScript gradient is not eager's stay out of autodiff's graphs.

TorchScript's autodiff differentiates an op by its formula in `symbolic_script.cpp`; a few
of those are not eager's (`derivatives.yaml`) beyond rounding:

    max/min/maximum/minimum(a, b)   where a == b each gets 0 (`a > b` and `b > a`); eager
                                    gives each half the gradient
    clamp(x, min, max) of tensors   no gradient for `min` and `max`; eager gives each the
                                    gradient where it is the result
    hardtanh(x, lo, hi)             the gradient passes at x == lo or hi; eager's stops
    threshold(x, t, v)              the gradient passes at x == t; eager's stops
    softplus(x, beta, t)            at beta * x == t the gradient passes unchanged; eager
                                    takes the sigmoid
    pow(x, y) of tensors            for y at x == 0: inf or NaN where eager's is 0

A differentiable graph that holds one computes such a gradient; left out, the op runs under
eager's autograd, with eager's. Before `differentiable_graphs` each such node is hidden as an
op autodiff does not know (`hide`), and after it the node is itself again (`restore`):

    %y = aten::clamp(%x, %lo, %hi)
                 (hide)
    %y = nncfuse::eager_gradient_3(%x, %lo, %hi, "aten::clamp")
                 (differentiable_graphs: not in one; restore)
    %y = aten::clamp(%x, %lo, %hi)

Only where the difference can arise: clamp's and pow's when a tensor operand that the
formula drops requires grad. (relu's, relu6's, hardswish's, hardshrink's and softshrink's
formulas multiply by their mask where eager selects: at a NaN input the gradient is 0 where
eager passes it on, and an infinite gradient at a masked element NaN where eager's is 0.
Those ops stay in the graphs, where their kernels fuse, for differences that need NaN or
infinite values; where's product, by a condition the forward captured, is a select:
`selected_gradients.py`.) The unfused program runs without TorchScript's optimizing passes
(`policy.program`), so its gradients are eager's.
"""

from __future__ import annotations

from typing import Any

import torch

from ...tensorexpr.meta import all_nodes, replace_by

__all__ = ["hide", "restore"]

#: the most operands of a hidden op (a hiding op per count, registered below)
MOST_OPERANDS = 8

#: kinds whose formula differs from eager's for any operands (and the binary max and min)
_ALWAYS = frozenset({"aten::maximum", "aten::minimum", "aten::hardtanh", "aten::threshold",
                     "aten::softplus"})
#: kinds whose formula drops the gradient of these tensor operands (by position)
_DROPPED = {"aten::clamp": (1, 2), "aten::clamp_min": (1,), "aten::clamp_max": (1,),
            "aten::pow": (1,)}


def _call_hidden(*args: Any) -> torch.Tensor:
    """What a hiding op computes (it does not run: `restore` comes first): the op it hides."""
    *operands, kind = args
    return getattr(torch.ops.aten, kind.split("::")[1])(*operands)


def _hiding_op(n: int) -> str:
    return f"eager_gradient_{n}"


_library = torch.library.Library("nncfuse", "FRAGMENT")
for _n in range(1, MOST_OPERANDS + 1):
    _operands = ", ".join(f"Any a{k}" for k in range(_n))
    _library.define(f"{_hiding_op(_n)}({_operands}, str kind) -> Tensor")
    _library.impl(_hiding_op(_n), _call_hidden, "CompositeExplicitAutograd")
_HIDDEN = frozenset(f"nncfuse::{_hiding_op(n)}" for n in range(1, MOST_OPERANDS + 1))


def _requires_grad(value: Any) -> bool:
    ty = value.type()
    return isinstance(ty, torch._C.TensorType) and bool(ty.requires_grad())


def _differs(node: Any) -> bool:
    kind = node.kind()
    if node.outputsSize() != 1 or not 1 <= node.inputsSize() <= MOST_OPERANDS:
        return False
    if kind in ("aten::max", "aten::min"):  # only the binary form (not the reductions)
        return node.inputsSize() == 2 and all(
            isinstance(v.type(), torch._C.TensorType) for v in node.inputs())
    if kind in _ALWAYS:
        return True
    return any(k < node.inputsSize() and _requires_grad(node.inputsAt(k))
               for k in _DROPPED.get(kind, ()))


def hide(graph: torch._C.Graph) -> int:
    """Replace, in place, each node of `graph` whose TorchScript gradient differs from eager's
    (`_differs`) by a hiding op that `restore` turns back; the count."""
    done = 0
    for node in [n for n in all_nodes(graph.block()) if _differs(n)]:
        with graph.insert_point_guard(node):
            kind = graph.insertConstant(node.kind())
        replace_by(graph, node, f"nncfuse::{_hiding_op(node.inputsSize())}",
                   [*node.inputs(), kind])
        done += 1
    return done


def restore(graph: torch._C.Graph) -> int:
    """Turn each hiding op of `graph` back into the op it hides, in place; the count."""
    done = 0
    for node in [n for n in all_nodes(graph.block()) if n.kind() in _HIDDEN]:
        *operands, kind = node.inputs()
        replace_by(graph, node, kind.toIValue(), operands)
        if not kind.uses():
            kind.node().destroy()
        done += 1
    return done
