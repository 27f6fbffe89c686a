"""saved_writes: does a program write in place a tensor that autograd saved for backward?

Eager autograd saves some operands (or results) of differentiable ops for the
backward, with their version counters; an in-place write to the tensor, or to
a view of it, bumps the counter, and `backward()` raises "one of the variables
needed for gradient computation has been modified by an inplace operation".
nncfuse removes mutation (`_jit_pass_remove_mutation`) before it fuses, and so
loses that check: a program it flags here runs unfused under autograd, where
TorchScript (or eager) raises as eager does.

    %y = aten::mul(%x, %two)          (saves no tensor: %y may be written)
    %y1 = aten::sigmoid_(%y)          (saves its result: %y's version 1)
    %y2 = aten::add_(%y, %one)        ==> "aten::add_ writes a tensor aten::sigmoid_ saved"

The analysis is conservative (flagging costs speed, never correctness): tensors
alias where their schemas say so, and through lists, tuples, attributes and
control flow; an op saves all its tensor operands and results unless the
tables below say it saves fewer; inside a loop, a write meets the savers of
every iteration.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

#: ops that save no tensor for backward (or are not differentiable)
_SAVES_NOTHING = frozenset(f"aten::{k}" for k in (
    "add", "add_", "sub", "sub_", "rsub", "neg", "neg_", "clone", "contiguous", "to", "_to_copy",
    "type_as", "sum", "mean", "zero_", "fill_", "copy_", "cat", "stack", "detach", "dropout",
    "dropout_", "zeros_like", "ones_like", "empty_like", "full_like", "rand_like", "randn_like",
    "eq", "ne", "lt", "le", "gt", "ge", "argmax", "argmin", "sign", "floor_divide", "isnan",
    "logical_not", "logical_and", "logical_or", "bitwise_not", "bitwise_and", "bitwise_or",
    "size", "dim", "numel", "item", "Int", "Float", "Bool", "ScalarImplicit", "IntImplicit",
    "FloatImplicit", "__and__", "__or__", "__not__", "__is__", "__isnot__", "__getitem__",
    "len", "format", "warn", "append",
))
#: ops that save (some of) their tensor operands but not their result
_SAVES_OPERANDS = frozenset(f"aten::{k}" for k in (
    "matmul", "mm", "bmm", "addmm", "linear", "conv1d", "conv2d", "conv3d", "convolution",
    "_convolution", "sin", "cos", "tan", "log", "log1p", "log2", "log10", "abs", "pow", "sinh",
    "cosh", "asin", "acos", "atan", "erf", "gelu", "silu", "softplus", "leaky_relu", "hardtanh",
    "clamp", "clamp_min", "clamp_max", "where", "masked_fill", "index_select", "gather",
    "embedding", "layer_norm", "square", "batch_norm", "native_batch_norm", "group_norm",
    "_batch_norm_impl_index", "instance_norm", "native_layer_norm",
))
#: ops that save their tensor operands only where both are tensors (x * 2 saves nothing)
_SAVES_IF_BOTH_TENSORS = frozenset(f"aten::{k}" for k in ("mul", "mul_", "div", "div_"))


def _schema(node: Any) -> Any:
    text = node.schema()
    return None if text == "(no schema)" else torch._C.parse_schema(text)


def _walk(block: Any, loops: tuple[int, ...]) -> Iterator[tuple[Any, tuple[int, ...]]]:
    """The nodes of `block` in program order, nested blocks included, each with the ids of the
    loops around it."""
    for node in block.nodes():
        yield node, loops
        inner = (*loops, id(node)) if node.kind() == "prim::Loop" else loops
        for sub in node.blocks():
            yield from _walk(sub, inner)


class _Aliases:
    """Union-find over values (by `unique()`) and attributes: which may share memory."""

    def __init__(self) -> None:
        self.parent: dict[Any, Any] = {}

    def find(self, key: Any) -> Any:
        root = key
        while self.parent.get(root, root) != root:
            root = self.parent[root]
        self.parent[key] = root
        return root

    def union(self, a: Any, b: Any) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[ra] = rb


def _is_tensor(value: Any) -> bool:
    return isinstance(value.type(), torch._C.TensorType)


def saved_then_written(graph: torch._C.Graph) -> str | None:
    """Why a run of `graph` (inlined, its in-place ops still there) under autograd may write a
    tensor that an earlier differentiable op saved for backward, or None if it cannot."""
    aliases = _Aliases()
    writes: list[tuple[int, Any, Any, tuple[int, ...]]] = []  # (position, node, value, loops)
    saves: list[tuple[int, Any, Any, tuple[int, ...]]] = []
    for pos, (node, loops) in enumerate(_walk(graph.block(), ())):
        kind = node.kind()
        inputs, outputs = list(node.inputs()), list(node.outputs())
        schema = _schema(node) if kind.startswith("aten::") else None
        if kind == "prim::GetAttr":  # the same attribute read twice is the same tensor
            aliases.union(outputs[0].unique(), ("attr", aliases.find(inputs[0].unique()),
                                                node.s("name")))
            continue
        if schema is None:
            # Lists, tuples, control flow and calls: any result may alias any operand or any
            # value a block returns.
            related = inputs + [v for b in node.blocks() for v in (*b.outputs(), *b.inputs())]
            for out in outputs:
                for v in related:
                    aliases.union(out.unique(), v.unique())
            if kind == "prim::Loop":
                for b in node.blocks():
                    for v in b.inputs():
                        for u in inputs:
                            aliases.union(v.unique(), u.unique())
            continue
        written = []
        for arg, value in zip(schema.arguments, inputs):
            if arg.alias_info is not None:
                if arg.alias_info.is_write:
                    written.append(value)
                for ret, out in zip(schema.returns, outputs):  # a view, or the written self
                    if ret.alias_info is not None and (
                            ret.alias_info.before_set & arg.alias_info.before_set):
                        aliases.union(out.unique(), value.unique())
        for value in written:
            writes.append((pos, node, value, loops))
        if kind in _SAVES_NOTHING:
            continue
        if not written and (not any(_is_tensor(v) for v in outputs) or any(
                r.alias_info is not None for r in schema.returns)):
            continue  # a view, or an op with no tensor result: nothing saved
        operands = [v for v in inputs if not isinstance(v.type(), (
            torch._C.IntType, torch._C.FloatType, torch._C.BoolType, torch._C.NoneType,
            torch._C.StringType, torch._C.DeviceObjType))]
        if kind in _SAVES_IF_BOTH_TENSORS:
            saved = operands if sum(map(_is_tensor, inputs[:2])) == 2 else []
        elif kind in _SAVES_OPERANDS:
            saved = operands
        else:
            saved = operands + outputs
        for value in saved:
            saves.append((pos, node, value, loops))
    for wpos, writer, value, wloops in writes:
        root = aliases.find(value.unique())
        for spos, saver, kept, sloops in saves:
            if aliases.find(kept.unique()) != root:
                continue
            # Before the write, or in a loop around both: an earlier iteration saved it.
            if spos < wpos or (spos > wpos and set(wloops) & set(sloops)):
                return (f"{writer.kind()} writes in place a tensor that {saver.kind()} saved "
                        f"for backward (eager's backward() raises)")
    return None
