"""supported: which nodes may join a fusion group, and why the others may not.

A node fuses when a lowering exists for its schema (`tensorexpr.lowerings`)
and every value it touches is something a CPU kernel can take: its tensor
inputs and its outputs (one, or as many as the lowering's `outputs`: max.dim's
values and indices) have complete profiled types on the CPU, in a dtype the
loop IR has, not requiring grad (kernels record no autograd);
its other inputs are numbers, or constants the lowering reads (for
lowerings that compile them in: view sizes, dims, slice bounds, only
constants, or sizes of tensors a kernel can take: `sizes.py`, which the
group copies in with the node, `copied_operand`). A `prim::ListConstruct`
of tensors fuses with the one cat or stack that reads it, and only with it:
the list is no value a kernel returns. A shape check of scripted code (`shape_checks`)
fuses when its condition is computed from the shapes of tensors a kernel can take and from
constants, by values that serve it alone. The reasons are what
`>>tensorexpr_fuser` logs for nodes left out.
"""

from __future__ import annotations

from typing import Any

import torch

from ...tensorexpr import shape_checks
from ...tensorexpr.dtype import from_torch
from ...tensorexpr.lowerings import (
    EXTERNAL_KINDS,
    external_problem,
    lowering_for,
    onednn_gemm_alone,
)
from ...tensorexpr.meta import TensorMeta, inputs_of, is_tensor, outputs_of
from . import sizes
from .autocast_casts import casts_nothing, has_autocast_kernel
from .subgraph import GROUP as _GROUP
from .subgraph import holds_check

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


_LIST_READERS = {"aten::cat", "aten::concat", "aten::concatenate", "aten::stack"}


def _list_problem(node: Any) -> str | None:
    """Why the `prim::ListConstruct` `node` cannot fuse with the node that reads it."""
    uses = list(node.output().uses())
    if len(uses) == 1 and uses[0].user.kind() == _GROUP:  # the reader is in a group already
        inner = inputs_of(uses[0].user.g("Subgraph"))[uses[0].offset]
        uses = list(inner.uses())
        reader_problem = None
    else:
        reader_problem = _node_problem(uses[0].user) if uses else None
    if len(uses) != 1 or uses[0].user.kind() not in _LIST_READERS or uses[0].offset != 0:
        return "a list fuses only into the one cat or stack that reads it"
    for value in inputs_of(node):
        if not is_tensor(value):
            return f"list item %{value.debugName()} is not a tensor"
        problem = _tensor_problem(value, "list item")
        if problem:
            return problem
    return reader_problem


def why_not_fusible(node: Any) -> str | None:
    """None if `node` can join a fusion group, else the reason it cannot."""
    if node.kind() == "prim::Constant":
        return "constants are copied into groups, not fused"
    if node.kind() == "prim::ListConstruct":
        return _list_problem(node)
    if shape_checks.is_check_value(node):
        owner = shape_checks.owning_check(node, holds_check)
        if owner is None:
            return "a shape check's value used outside the one check"
        return None if owner.kind() == _GROUP else _check_problem(owner)
    if shape_checks.is_check(node):
        return _check_problem(node)
    return _node_problem(node)


def _check_problem(check: Any) -> str | None:
    """Why the shape check `check` (`shape_checks`) cannot join a group: it must be a
    constant where the group's TypeCheck passes, computed from the shapes of tensors a kernel
    takes and from constants, by values that serve this check only."""
    if any(shape_checks.owning_check(n) != check for n in shape_checks.condition(check)):
        return "a value of the shape check's condition is used outside it"
    for value in shape_checks.leaves(check):
        if is_tensor(value):
            problem = _tensor_problem(value, "checked tensor")
            if problem:
                return problem
        elif value.node().kind() != "prim::Constant":
            return (f"the shape check's condition reads %{value.debugName()}, neither a "
                    "constant nor a tensor's shape")
    for value in shape_checks.message_operands(check):
        if is_tensor(value):
            problem = _tensor_problem(value, "tensor in the check's message")
            if problem:
                return problem
    return None


def _node_problem(node: Any) -> str | None:
    lowering, reason = lowering_for(node)
    if lowering is None:
        return reason
    # Fused, an op would compute in its profiled inputs' dtypes, not in the ones autocast
    # casts them to: outside groups, eager's autocast casts them as it does without nncfuse,
    # unless they are those dtypes already (`autocast_casts.py` wrote the casts out).
    # (A plan's signature holds the autocast state: this one is made under the call's.)
    if torch._C._is_any_autocast_enabled() and node.kind() != "prim::ListConstruct" and (
            has_autocast_kernel(node.schema())) and not (
                torch.is_autocast_enabled("cpu") and casts_nothing(node)):
        return f"{node.kind()} runs under autocast's casts (eager's)"
    if lowering.problem is not None and (problem := lowering.problem(node)):
        return problem
    outputs = outputs_of(node)
    if len(outputs) != lowering.outputs or not all(is_tensor(v) for v in outputs):
        return f"the node does not produce exactly {lowering.outputs} tensor(s)"
    for value in outputs:
        problem = _tensor_problem(value, "output")
        if problem:
            return problem
    if node.kind() in EXTERNAL_KINDS:
        problem = external_problem(node)
        if problem:
            return problem
    for value in inputs_of(node):
        if is_tensor(value):
            problem = _tensor_problem(value, "input")
            if problem:
                return problem
        elif value.node().kind() == "prim::Constant" or _fused_list(node, value):
            continue
        elif lowering.constant_operands:
            problem = _sizes_problem(value)
            if problem:
                return (f"{node.kind()} compiles in %{value.debugName()}, which is not a "
                        f"constant ({problem})")
        elif value.type().kind() not in _NUMBER_KINDS:
            return f"input %{value.debugName()} of type {value.type()} is not a constant"
    return None


def _sizes_problem(value: Any) -> str | None:
    """Why `value` is not a size expression (`sizes.py`) of tensors a kernel may take."""
    problem, sources = sizes.problem(value)
    if problem is None:
        for source in sources:
            problem = _tensor_problem(source, "size source")
            if problem:
                break
    return problem


def copied_operand(node: Any, value: Any) -> bool:
    """Whether `value`, an operand of `node`, is a size expression that a group copies in
    with `node` (`subgraph.make_group`): `node` compiles it in and it is no constant."""
    if is_tensor(value) or value.node().kind() == "prim::Constant" or _fused_list(node, value):
        return False
    if shape_checks.is_check_node(node):
        return False
    lowering, _ = lowering_for(node)
    return bool(lowering is not None and lowering.constant_operands
                and _sizes_problem(value) is None)


def size_sources(node: Any) -> list[Any]:
    """The tensors whose sizes the copied operands of `node` read (`copied_operand`)."""
    return [t for v in inputs_of(node) if copied_operand(node, v) for t in sizes.problem(v)[1]]


def fuses_alone(node: Any) -> bool:
    """Whether `node` makes a group of its own even below `min_group_size` (`Lowering.alone`:
    a reduction whose one kernel beats eager's one op at this size; a GEMM that takes
    oneDNN's routine where ATen's, MKL's, is the slower: `onednn_gemm_alone`)."""
    if is_external(node):
        return onednn_gemm_alone(node)
    lowering, _ = lowering_for(node)
    return bool(lowering is not None and lowering.alone is not None and lowering.alone(node))


def is_external(node: Any) -> bool:
    """Whether `node` runs as an external call (GEMM, convolution) inside a group: it must
    read only group inputs, so it starts its group (`reads_external`)."""
    return node.kind() in EXTERNAL_KINDS


def feeds_external(group: Any, value: Any) -> bool:
    """Whether `value`, an input of `group`, is read by an external call inside it."""
    sub = inputs_of(group.g("Subgraph"))
    return any(
        is_external(u.user)
        for use in value.uses() if use.user == group
        for u in sub[use.offset].uses()
    )


def _fused_list(node: Any, value: Any) -> bool:
    """Whether `value` is the tensor list a cat or stack `node` reads, built to fuse with it."""
    return (
        node.kind() in _LIST_READERS
        and value.node().kind() == "prim::ListConstruct"
        and node.inputsAt(0) == value
    )



def why_not_write_back(node: Any) -> str | None:
    """None if the write-back `node` (`copy_(dst, src)`, dst an input or a view chain of one,
    see `inplace.py`) can join a group: its tensors are ones a kernel takes."""
    for value, what in ((node.inputsAt(0), "destination"), (node.inputsAt(1), "source")):
        if not is_tensor(value):
            return f"write-back {what} %{value.debugName()} is not a tensor"
        problem = _tensor_problem(value, f"write-back {what}")
        if problem:
            return problem
    if node.inputsAt(2).node().kind() != "prim::Constant":
        return "copy_'s non_blocking is not a constant"
    return None
