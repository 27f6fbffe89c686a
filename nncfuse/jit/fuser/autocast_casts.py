"""autocast_casts: the casts eager's CPU autocast makes, as explicit nodes of the graph.

Under `torch.autocast("cpu")` an op with an AutocastCPU kernel casts its operands before it
runs (ATen's `autocast_mode.cpp`, `cached_cast`): the GEMMs and convolutions of the
"lower_precision_fp" list cast each floating operand but float64 to the autocast dtype, the
"fp32" list (losses, `prod`, ...) casts them to float32, and the "promote" list (cat, stack,
index_copy) to the widest of their dtypes and the autocast dtype. Written out, the op reads
operands autocast leaves alone, so it means the same under autocast and outside, and fuses
(`supported.py` lets an AutocastCPU op into a group only where `casts_nothing`): a bfloat16
GEMM with its epilogue in one kernel. Under bfloat16 autocast:

    %y : BFloat16(4, 32) = aten::linear(%x, %w, %b)           (x, w, b: Float)
                              ->
    %x.1 : BFloat16(4, 16) = aten::to(%x, 15, False, False, None)
    %w.1 : BFloat16(32, 16) = nncfuse::autocast_weight(%w, 15, True)
    %b.1 : BFloat16(32) = nncfuse::autocast_weight(%b, 15, True)
    %y : BFloat16(4, 32) = aten::linear(%x.1, %w.1, %b.1)

Ops that cast the same value to the same dtype, with nothing written between them, read
one cast (eager makes one per op), which then fuses with the value's producer: the
activation feeding the query, key and value projections is rounded once, in the kernel
that computes it.

Each cast is typed from the profile: the operand's profiled type with the dtype cast to (its
strides as `to` gives them). A parameter or buffer (read by `prim::GetAttr`) or a graph input
that is cast to the autocast dtype is cast by `cast_cache.py`'s op, which makes the copy once
per version of the tensor (`weight_casts.py` then casts them in one call). A node whose
operands' types the profile does not know is left as it is (it stays outside groups, under
eager's autocast).
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from ... import log
from ...tensorexpr.meta import all_nodes, blocks_of, inputs_of
from . import cast_cache

_log = log.get_logger(__file__)

LOWER, FP32, PROMOTE = "lower_precision_fp", "fp32", "promote"
_REDUCED = (torch.bfloat16, torch.float16)

#: ATen's CPU autocast policy by op name (`autocast_mode.cpp`, `TORCH_LIBRARY_IMPL(aten,
#: AutocastCPU, m)`); an overload is cast only if it has an AutocastCPU kernel
_POLICY: dict[str, str] = {
    **dict.fromkeys((
        "conv1d", "conv2d", "conv3d", "bmm", "mm", "linalg_vecdot", "baddbmm", "addmm",
        "_addmm_activation", "addbmm", "linear", "_convolution", "matmul", "conv_tbc",
        "conv_transpose1d", "conv_transpose2d", "conv_transpose3d", "prelu",
        "scaled_dot_product_attention"), LOWER),
    **dict.fromkeys((
        "prod", "mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss", "soft_margin_loss",
        "binary_cross_entropy", "binary_cross_entropy_with_logits", "kl_div", "trace",
        "cdist", "margin_ranking_loss", "hinge_embedding_loss", "cosine_embedding_loss",
        "poisson_nll_loss"), FP32),
    **dict.fromkeys(("cat", "stack", "index_copy"), PROMOTE),
}


@functools.cache
def has_autocast_kernel(schema: str) -> bool:
    """Whether eager autocast casts the operands of the op of `schema` (it has a kernel for
    the AutocastCPU dispatch key)."""
    parsed = torch._C.parse_schema(schema)
    name = parsed.name + (f".{parsed.overload_name}" if parsed.overload_name else "")
    return torch._C._dispatch_has_kernel_for_dispatch_key(name, "AutocastCPU")


def _policy(node: Any) -> str | None:
    kind = node.kind()
    policy = _POLICY.get(kind[len("aten::"):]) if kind.startswith("aten::") else None
    schema = node.schema() if policy else "(no schema)"
    return policy if schema != "(no schema)" and has_autocast_kernel(schema) else None


def _operands(node: Any) -> list[tuple[Any, int, int | None]] | None:
    """The tensor operands of `node`: (value, input index, index in its list or None); None
    where one is a tensor list that is not built by a `prim::ListConstruct`."""
    out: list[tuple[Any, int, int | None]] = []
    for i, value in enumerate(inputs_of(node)):
        kind = value.type().kind()
        if kind == "TensorType":
            out.append((value, i, None))
        elif kind == "ListType" and value.type().getElementType().kind() == "TensorType":
            if value.node().kind() != "prim::ListConstruct":
                return None
            out.extend((item, i, k) for k, item in enumerate(inputs_of(value.node())))
        elif kind == "OptionalType" and value.type().getElementType().kind() == "TensorType":
            if value.node().kind() != "prim::Constant":
                return None  # (a tensor or None only at run time)
    return out


def _eligible(dtype: torch.dtype) -> bool:
    """Whether autocast casts a CPU tensor of `dtype` (`is_eligible`: floating, not double)."""
    return dtype.is_floating_point and dtype != torch.float64


def _targets(node: Any, dtype: torch.dtype) -> list[torch.dtype | None] | None:
    """The dtype each operand of `node` is cast to under autocast to `dtype` (None: left as
    it is), or None if the node is not one autocast casts or a dtype is not profiled."""
    policy = _policy(node)
    operands = _operands(node) if policy else None
    if operands is None:
        return None
    dtypes = [value.type().dtype() for value, _, _ in operands]
    if None in dtypes:
        return None
    if policy == LOWER:
        target = dtype
    elif policy == FP32:
        target = torch.float32
    else:
        target = dtype
        for d in dtypes:
            if _eligible(d):
                target = torch.promote_types(target, d)
    return [target if _eligible(d) and d != target else None for d in dtypes]


def casts_nothing(node: Any) -> bool:
    """Whether, under the live autocast, eager's autocast leaves the operands of `node` as
    they are (their profiled dtypes): the op then means the same under autocast and outside.
    False for an op autocast casts by a policy not known here."""
    targets = _targets(node, torch.get_autocast_dtype("cpu"))
    return targets is not None and not any(targets)


def _cast_type(value: Any, dtype: torch.dtype) -> Any:
    """The profiled type of `value.to(dtype)`, or None if `value`'s is not complete. It
    requires grad where `value` does and grad mode is on (autodiff reads it)."""
    t = value.type()
    sizes, strides = t.sizes(), t.strides()
    if sizes is None or strides is None or None in sizes or None in strides:
        return None
    grad = bool(t.requires_grad()) and torch.is_grad_enabled()
    meta = torch.empty_strided(sizes, strides, dtype=t.dtype(), device="meta",
                               requires_grad=grad).to(dtype)
    return torch._C.TensorType.create_from_tensor(meta).with_device(t.device())


def _is_weight(value: Any) -> bool:
    """Whether `value` is module state (read by `prim::GetAttr`) or an input of the graph
    (a weight passed as an argument: `cast_cache` caches only leaves that require grad)."""
    return value.node().kind() in ("prim::GetAttr", "prim::Param")


def _to(graph: Any, value: Any, dtype: torch.dtype) -> Any:
    """A node (not inserted) `aten::to(value, dtype)`."""
    args = [value, graph.insertConstant(dtype), *map(graph.insertConstant, (False, False)),
            graph.insertConstant(None)]
    return graph.create("aten::to", args, 1)


def _differentiable_cast(graph: Any, value: Any, dtype: torch.dtype) -> Any:
    """A node (not inserted) casting `value` to `dtype`: from float32 to a reduced dtype or
    back with autocast's own cast ops, which TorchScript's autodiff differentiates (`aten::to`
    it does not), else `aten::to` (also for a value that does not require grad: a GradOf
    of its cast would have a gradient that may be undefined)."""
    source = value.type().dtype()
    if value.type().requires_grad() is False:
        return _to(graph, value, dtype)
    if source == torch.float32 and dtype in _REDUCED:
        args = [value, *map(graph.insertConstant, (False, True, torch.float16, dtype))]
        return graph.create("aten::_autocast_to_reduced_precision", args, 1)
    if source in _REDUCED and dtype == torch.float32:
        args = [value, *map(graph.insertConstant, (False, True))]
        return graph.create("aten::_autocast_to_full_precision", args, 1)
    return _to(graph, value, dtype)


def differentiable_cast(graph: torch._C.Graph, value: Any, dtype: torch.dtype) -> Any:
    """`value` cast to `dtype` by a node inserted at the insert point, typed as `value`
    with `dtype`: autocast's own cast op where one casts so (TorchScript's autodiff
    differentiates it), else `aten::to`.

        %h.1 : Float(...) = aten::_autocast_to_full_precision(%h, False, True)
    """
    node = graph.insertNode(_differentiable_cast(graph, value, dtype))
    node.output().setType(value.type().with_dtype(dtype))
    return node.output()


def _cast(graph: Any, value: Any, dtype: torch.dtype, autocast_dtype: torch.dtype,
          training: bool) -> Any:
    """A node casting `value` to `dtype`, inserted at the insert point; None if untyped.
    Training: one autodiff differentiates; else a weight's to the autocast dtype cached."""
    typ = _cast_type(value, dtype)
    if typ is None:
        return None
    if training:
        node = _differentiable_cast(graph, value, dtype)
    elif dtype == autocast_dtype and value.type().dtype() == torch.float32 and _is_weight(value):
        module_state = value.node().kind() == "prim::GetAttr"
        args = [value, graph.insertConstant(dtype), graph.insertConstant(module_state)]
        node = graph.create(cast_cache.KIND, args, 1)
    else:
        node = _to(graph, value, dtype)
    graph.insertNode(node)
    node.output().setType(typ)
    return node.output()


def _rewrite(graph: Any, node: Any, targets: list[torch.dtype | None], dtype: torch.dtype,
             training: bool, made: dict[tuple[int, torch.dtype], Any]) -> bool:
    operands = _operands(node)
    assert operands is not None
    casts: list[Any] = []
    with graph.insert_point_guard(node):
        for (value, _, _), target in zip(operands, targets):
            cast = None
            if target is not None:
                key = (value.unique(), target)
                cast = made.get(key) or _cast(graph, value, target, dtype, training)
                if cast is None:
                    return False  # (the casts made so far are dead: DCE removes them)
                made[key] = cast
            casts.append(cast)
        lists: dict[int, list[Any]] = {}
        for (value, i, k), cast in zip(operands, casts):
            if k is None:
                if cast is not None:
                    node.replaceInput(i, cast)
            else:
                lists.setdefault(i, list(inputs_of(node.inputsAt(i).node())))[k] = (
                    cast if cast is not None else value)
        for i, items in lists.items():
            old = node.inputsAt(i)
            if items == inputs_of(old.node()):
                continue
            built = graph.insertNode(graph.create("prim::ListConstruct", items, 1))
            built.output().setType(old.type())
            node.replaceInput(i, built.output())
    return True


def _writes(node: Any) -> bool:
    """Whether `node` (or a node of its blocks) writes one of its inputs (its schema says so;
    a node without one: no)."""
    for n in [node, *(inner for block in blocks_of(node) for inner in all_nodes(block))]:
        try:
            schema = torch._C.parse_schema(n.schema())
        except RuntimeError:  # "(no schema)"
            continue
        if any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments):
            return True
    return False


def _rewrite_block(graph: Any, block: Any, dtype: torch.dtype, training: bool,
                   made: dict[tuple[int, torch.dtype], Any]) -> int:
    """The casts of `block`'s nodes written out; `made`: the casts made before the block
    that dominate it, by (value, dtype), which a later op casting the same value reads too
    until a node writes (eager casts at each op; none can differ where nothing writes)."""
    count = 0
    for node in list(block.nodes()):
        for sub in blocks_of(node):
            count += _rewrite_block(graph, sub, dtype, training, dict(made))
        if _writes(node):
            made.clear()
        targets = _targets(node, dtype)
        if targets and any(targets) and _rewrite(graph, node, targets, dtype, training, made):
            count += 1
    return count


def make_autocast_casts_explicit(graph: torch._C.Graph, training: bool = False) -> None:
    """Under the live CPU autocast, write the casts eager's autocast makes as nodes of
    `graph` (in place), before the ops that autocast casts; outside autocast, nothing.
    `training` (TorchScript's autodiff then differentiates the graph): float32 to the
    autocast dtype and back as `aten::_autocast_to_reduced_precision` and
    `_autocast_to_full_precision` (autodiff's formulas cast the gradient back), weights'
    too, not through `cast_cache` (whose op has no derivative)."""
    if not torch.is_autocast_enabled("cpu"):
        return
    count = _rewrite_block(graph, graph.block(), torch.get_autocast_dtype("cpu"), training,
                           {})
    if count:
        torch._C._jit_pass_dce(graph)
        _log.dump(f"After making {count} ops' autocast casts explicit:\n", graph)
