"""transposed_gemms: a GEMM of a weight, as the linear it is, where oneDNN packs the weight.

AOTAutograd decomposes `F.linear(x, w, b)` into a transpose and a GEMM; the transpose is a
new view at every call, and a GEMM reads its operand as it is, so oneDNN cannot take the
weight packed once it is reused (`external.reused_weight`). An `addmm` (beta and alpha 1,
a bias of one row) or `mm` of a 2-d weight's transpose, of a dtype and size where the
packed weight pays (`reusable_gemm`: bfloat16 from 8k multiply-adds, float32 from 8M where
MKL's GEMM is the slower), is written back as the linear, which reads the weight itself:

    %t : BFloat16(256, 1024, strides=[1, 256]) = aten::t(%w)
    %y : BFloat16(32, 1024) = aten::addmm(%b, %x, %t, 1, 1)
                              ->
    %y : BFloat16(32, 1024) = aten::linear(%x, %w, %b)

and a bfloat16 one of a (K, N) weight itself (GPT-2's `Conv1D`: `addmm(b, x, w)`), where
the weight is a graph input, a module's attribute or a cached cast of one, as the linear of
its transpose (a view of the same weight: `reused_weight` packs it once too; not float32's,
whose backward graphs' `mm`s read saved activations so; nor where `x` is not row-major, as
a backward graph's weight gradient `mm(t(dy), x)` of a saved activation, where oneDNN's
linear of two transposed operands is 8-10% slower than `mm`: 256 x 8 by 8 x 1024, 46 us
against 41):

    %y : BFloat16(32, 768) = aten::addmm(%b, %x, %w, 1, 1)
                              ->
    %t : BFloat16(768, 256, strides=[1, 768]) = aten::t(%w)
    %y : BFloat16(32, 768) = aten::linear(%x, %t, %b)

Exact: `linear` computes `x @ w.t() + b` with the routine eager's `F.linear` calls (the
call the user's model made before the decomposition).
"""

from __future__ import annotations

from typing import Any

import torch

from ... import log
from ...tensorexpr.lowerings import reusable_gemm
from ...tensorexpr.meta import TensorMeta, constant, replace_by
from . import cast_cache

_log = log.get_logger(__file__)

def _meta(value: Any) -> TensorMeta | None:
    return TensorMeta.from_type(value.type())


#: what makes a weight: a graph input, a module's attribute, a cached cast (`nncfuse::`) or
#: a batch of them unpacked
_WEIGHTS = (*cast_cache.STATE_KINDS, "prim::ListUnpack")


def _weight(value: Any) -> tuple[Any, bool] | None:
    """(w, transposed): the 2-d weight `w` whose transpose `value` is (`aten::t(w)` or a
    `permute(w, [1, 0])`), or `value` itself, a weight that the GEMM reads as (K, N); None
    for any other operand."""
    node = value.node()
    if node.kind() == "aten::t" or (node.kind() == "aten::permute"
                                    and constant(node.inputsAt(1)) == [1, 0]):
        value, transposed = node.inputsAt(0), True
    elif node.kind() in _WEIGHTS or node.kind().startswith("nncfuse::"):
        transposed = False
    else:
        return None
    meta = _meta(value)
    return (value, transposed) if meta is not None and len(meta.sizes) == 2 else None


def _operands(node: Any) -> tuple[Any, tuple[Any, bool], Any] | None:
    """(x, (w, transposed), bias or None) of a GEMM `node` that is `linear(x, w, bias)`
    (`transposed`) or `linear(x, w.t(), bias)`, else None."""
    if node.kind() not in ("aten::mm", "aten::addmm") or node.outputsSize() != 1:
        return None
    out = _meta(node.output())
    if out is None or len(out.sizes) != 2:
        return None
    if node.kind() == "aten::mm" and node.inputsSize() == 2:
        x, wt, bias = node.inputsAt(0), node.inputsAt(1), None
    elif node.kind() == "aten::addmm" and node.inputsSize() == 5:
        bias, x, wt = node.inputsAt(0), node.inputsAt(1), node.inputsAt(2)
        if constant(node.inputsAt(3)) != 1 or constant(node.inputsAt(4)) != 1:
            return None
        b = _meta(bias)
        if b is None or list(b.sizes) != [out.sizes[1]] or b.dtype != out.dtype:
            return None
    else:
        return None
    weight, xm = _weight(wt), _meta(x)
    if weight is None or xm is None or len(xm.sizes) != 2 or xm.dtype != out.dtype:
        return None
    wm = _meta(weight[0])
    dims = wm.sizes if weight[1] else wm.sizes[::-1]  # (N, K)
    if wm.dtype != out.dtype or not reusable_gemm(out.dtype, out.sizes[0], dims) or (
            not weight[1] and (out.dtype == torch.float32 or xm.strides[1] != 1)):
        return None
    return x, weight, bias


def _transpose_type(w: Any) -> Any:
    meta = _meta(w)
    return torch._C.TensorType.create_from_tensor(
        meta.empty("meta").t()).with_device(meta.device)


def gemms_as_linears(graph: torch._C.Graph) -> int:
    """Rewrite, in place, the top-level block's reduced-precision GEMMs of a weight as
    linears; the count rewritten."""
    count = 0
    for node in list(graph.block().nodes()):
        operands = _operands(node)
        if operands is None:
            continue
        x, (w, transposed), bias = operands
        with graph.insert_point_guard(node):
            if bias is None:
                bias = graph.insertConstant(None)
            if not transposed:
                t = graph.insertNode(graph.create("aten::t", [w], 1))
                t.output().setType(_transpose_type(w))
                w = t.output()
        replace_by(graph, node, "aten::linear", [x, w, bias])
        count += 1
    if count:
        torch._C._jit_pass_dce(graph)
        _log.dump(f"After writing {count} GEMMs as linears:\n", graph)
    return count
