"""transposed_gemms: a reduced-precision GEMM of a transposed weight, as the linear it was.

AOTAutograd decomposes `F.linear(x, w, b)` into a transpose and a GEMM; the transpose is a
new view at every call, so the GEMM's weight operand is never the same tensor twice, and
oneDNN cannot take it packed once (`external.reused_weight`). A bfloat16 `addmm` (beta
and alpha 1, a bias of one row) or `mm` of a 2-d weight's transpose is written back as the
linear, which reads the weight itself:

    %t : BFloat16(256, 1024, strides=[1, 256]) = aten::t(%w)
    %y : BFloat16(32, 1024) = aten::addmm(%b, %x, %t, 1, 1)
                              ->
    %y : BFloat16(32, 1024) = aten::linear(%x, %w, %b)

Exact: `linear` computes `x @ w.t() + b` with the same routine eager's `F.linear` calls, the
call the user's model made before the decomposition. float32 GEMMs are left as they are
(their routines are chosen by the GEMM they are).
"""

from __future__ import annotations

from typing import Any

import torch

from ... import log
from ...tensorexpr.meta import TensorMeta, constant

_log = log.get_logger(__file__)

_DTYPES = (torch.bfloat16,)


def _meta(value: Any) -> TensorMeta | None:
    return TensorMeta.from_type(value.type())


def _weight(value: Any) -> Any | None:
    """The 2-d tensor `w` whose transpose `value` is (`aten::t(w)` or a `permute(w, [1, 0])`),
    else None."""
    node = value.node()
    if node.kind() == "aten::t" or (node.kind() == "aten::permute"
                                    and constant(node.inputsAt(1)) == [1, 0]):
        w = node.inputsAt(0)
        meta = _meta(w)
        return w if meta is not None and len(meta.sizes) == 2 else None
    return None


def _operands(node: Any) -> tuple[Any, Any, Any] | None:
    """(x, w, bias or None) of a GEMM `node` that is `linear(x, w, bias)`, else None."""
    if node.kind() not in ("aten::mm", "aten::addmm") or node.outputsSize() != 1:
        return None
    out = _meta(node.output())
    if out is None or out.dtype not in _DTYPES or len(out.sizes) != 2:
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
    w, xm = _weight(wt), _meta(x)
    if w is None or xm is None or len(xm.sizes) != 2 or xm.dtype != out.dtype \
            or _meta(w).dtype != out.dtype:
        return None
    return x, w, bias


def gemms_as_linears(graph: torch._C.Graph) -> int:
    """Rewrite, in place, the top-level block's reduced-precision GEMMs of a transposed
    weight as linears; the count rewritten."""
    count = 0
    for node in list(graph.block().nodes()):
        operands = _operands(node)
        if operands is None:
            continue
        x, w, bias = operands
        with graph.insert_point_guard(node):
            if bias is None:
                bias = graph.insertConstant(None)
            linear = graph.insertNode(graph.create("aten::linear", [x, w, bias], 1))
        linear.output().setType(node.output().type())
        node.output().replaceAllUsesWith(linear.output())
        node.destroy()
        count += 1
    if count:
        torch._C._jit_pass_dce(graph)
        _log.dump(f"After writing {count} GEMMs as linears:\n", graph)
    return count
