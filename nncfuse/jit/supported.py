"""supported: which nodes may join a fusion group, and why the others may not.

A node fuses when a lowering exists for its schema (`tensorexpr.lowerings`)
and every value it touches is something a CPU kernel can take: its tensor
inputs and its one output have complete profiled types on the CPU, in a
dtype the loop IR has, not requiring grad (kernels record no autograd);
its other inputs are numbers, or constants the lowering reads. The reasons
are what `>>tensorexpr_fuser` logs for nodes left out.
"""

from __future__ import annotations

from typing import Any

from ..tensorexpr.dtype import from_torch
from ..tensorexpr.lowerings import lowering_for
from ..tensorexpr.meta import TensorMeta, is_tensor

_NUMBER_KINDS = {"FloatType", "IntType", "BoolType"}


def _tensor_problem(value: Any, what: str) -> str | None:
    meta = TensorMeta.from_type(value.type())
    if meta is None:
        return f"{what} %{value.debugName()} has no complete profiled type"
    if meta.device.type != "cpu":
        return f"{what} %{value.debugName()} is on {meta.device}"
    if meta.requires_grad:
        return f"{what} %{value.debugName()} requires grad"
    try:
        from_torch(meta.dtype)
    except ValueError:
        return f"{what} %{value.debugName()} has unsupported dtype {meta.dtype}"
    return None


def why_not_fusible(node: Any) -> str | None:
    """None if `node` can join a fusion group, else the reason it cannot."""
    if node.kind() == "prim::Constant":
        return "constants are copied into groups, not fused"
    lowering, reason = lowering_for(node)
    if lowering is None:
        return reason
    if node.outputsSize() != 1 or not is_tensor(node.output()):
        return "the node does not produce exactly one tensor"
    problem = _tensor_problem(node.output(), "output")
    if problem:
        return problem
    for value in node.inputs():
        if is_tensor(value):
            problem = _tensor_problem(value, "input")
            if problem:
                return problem
        elif value.type().kind() not in _NUMBER_KINDS and value.node().kind() != "prim::Constant":
            return f"input %{value.debugName()} of type {value.type()} is not a constant"
    return None

