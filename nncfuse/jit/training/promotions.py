"""promotions: an op's type promotion of floating operands written out as casts, for autodiff.

Eager autograd gives each input the gradient in its own dtype: where `add` promotes a
bfloat16 operand to float32, the engine casts the float32 gradient back to bfloat16 before
the op that made the operand (a bfloat16 GEMM under autocast) sees it. TorchScript's autodiff
formulas do not: `add`'s gives the float32 gradient, and the GEMM's backward then multiplies
float32 by bfloat16 (eager raises; under autocast its cast hides it). Written out, the cast is
differentiated as a cast (the gradient cast back, as eager's engine does: autocast's own cast
ops, which autodiff differentiates, where they cast so), and the op reads operands of one
dtype. The rule, for any op: a floating operand of another dtype than the
op's floating result, where the result's dtype is the promotion of the operands', is cast to
it first (exact: the op computed in that dtype anyway). Under bfloat16 autocast:

    %y : Float = aten::add(%x : Float, %h : BFloat16, 1)
                          ->
    %h.1 : Float = aten::_autocast_to_full_precision(%h, False, True)
    %y : Float = aten::add(%x, %h.1, 1)

An op of one reduced-precision result that reads it and float32 operands (a layer or batch
norm of a bfloat16 input with float32 weights: eager's kernel computes in float32 and rounds
once) computes in float32, its reduced operands cast up and its result cast down:

    %y : BFloat16 = aten::layer_norm(%h : BFloat16, %s, %w : Float, %b : Float, ...)
                          ->
    %h.1 : Float = aten::_autocast_to_full_precision(%h, False, True)
    %y.1 : Float = aten::layer_norm(%h.1, %s, %w, %b, ...)
    %y : BFloat16 = aten::_autocast_to_reduced_precision(%y.1, False, True, 5, 15)

An op that mixes floating dtypes otherwise and reads a value that requires grad (a sum with
`dtype=`) raises `ValueError`: autodiff's formulas would give gradients of the wrong dtype,
and the program runs as eager instead.
"""

from __future__ import annotations

from typing import Any

import torch

from ...tensorexpr.meta import blocks_of, inputs_of, outputs_of
from ..fuser.autocast_casts import differentiable_cast
from ..fuser.inplace import in_place

_REDUCED = (torch.bfloat16, torch.float16)
#: ops whose job is to change the dtype: their formulas cast the gradient back
_CASTS = ("aten::to", "aten::type_as", "aten::_autocast_to_reduced_precision",
          "aten::_autocast_to_full_precision")


def _floating(value: Any) -> torch.dtype | None:
    """The dtype of a value typed as a floating tensor, else None."""
    t = value.type()
    if not isinstance(t, torch._C.TensorType):
        return None
    dtype = t.dtype()
    return dtype if dtype is not None and dtype.is_floating_point else None


def _requires_grad(value: Any) -> bool:
    return value.type().requires_grad() is not False  # (unknown: it may)


def _promote(graph: Any, node: Any) -> None:
    """Cast `node`'s promoted floating operands to its result dtype; raise where it mixes
    floating dtypes in another way and one of them requires grad. (Not an in-place op: it
    would write the cast's copy, not its input; autodiff leaves it to eager autograd.)"""
    if not node.kind().startswith("aten::") or node.kind() in _CASTS or in_place(node.kind()):
        return
    operands = [(k, v, _floating(v)) for k, v in enumerate(inputs_of(node))]
    operands = [(k, v, d) for k, v, d in operands if d is not None]
    results = {d for v in outputs_of(node) if (d := _floating(v)) is not None}
    dtypes = {d for _, _, d in operands} | results
    if len(dtypes) < 2:
        return
    promoted = None
    for _, _, d in operands:
        promoted = d if promoted is None else torch.promote_types(promoted, d)
    if results == {promoted}:
        with graph.insert_point_guard(node):
            for k, value, d in operands:
                if d != promoted:
                    node.replaceInput(k, differentiable_cast(graph, value, promoted))
        return
    outs = outputs_of(node)
    (reduced,) = results if len(results) == 1 else (None,)
    if (reduced in _REDUCED and len(outs) == 1 and _floating(outs[0]) == reduced
            and {d for _, _, d in operands} == {reduced, torch.float32}):
        _in_float32(graph, node, operands, reduced)
        return
    if any(_requires_grad(v) for _, v, _ in operands):
        raise ValueError(f"{node.kind()} mixes floating dtypes {sorted(map(str, dtypes))}: "
                         "autodiff's formulas would give gradients of other dtypes")


def _in_float32(graph: Any, node: Any, operands: list[Any], reduced: torch.dtype) -> None:
    """`node`, which reads float32 and `reduced` operands and returns `reduced` (a layer norm
    of a bfloat16 input with float32 weights), computed in float32 from its operands cast up
    (exact), its result cast down once: as eager's mixed kernels compute it."""
    with graph.insert_point_guard(node):
        for k, value, d in operands:
            if d == reduced:
                node.replaceInput(k, differentiable_cast(graph, value, torch.float32))
    out = node.output()
    out.setType(out.type().with_dtype(torch.float32))
    with graph.insert_point_guard(node):
        rounded = differentiable_cast(graph, out, reduced)
    rounded.node().moveAfter(node)
    out.replaceAllUsesWith(rounded)
    rounded.node().replaceInput(0, out)


def _block(graph: Any, block: Any) -> None:
    for node in list(block.nodes()):
        for sub in blocks_of(node):
            _block(graph, sub)
        _promote(graph, node)


def explicit_promotions(graph: torch._C.Graph) -> None:
    """Write out, in place, the promotions of floating operands of a typed graph (above)."""
    _block(graph, graph.block())
