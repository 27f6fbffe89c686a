"""int8_weights: a matrix product with a weight cast from int8, as a reduction over the int8 weight.

Weight-only quantization (torchao's `Int8WeightOnlyConfig`, under AOTAutograd) keeps a
linear's weight as int8 rows `w` (N, K) and a scale per row, and its graphs cast the whole
weight to the activations' dtype before a GEMM:

    %wt : Char(1024, 2816, strides=[1, 1024]) = aten::t(%w)
    %wf : Float(1024, 2816, strides=[1, 1024]) = aten::to(%wt, 6, False, False, None)
    %y : Float(1, 2816) = aten::mm(%x, %wf)
    %z : Float(1, 2816) = aten::mul(%y, %scale)

The cast writes a float copy of the weight (four times its bytes) at every call, and the
GEMM reads it back. For few rows of `x` (decoding: one token), a matrix product is a dot
product per output, so it is written as one, with the cast inside:

    %xu : Float(1, 1, 1024) = aten::unsqueeze(%x, 1)
    %w32 : Float(2816, 1024) = aten::to(%w, 6, False, False, None)
    %p : Float(1, 2816, 1024) = aten::mul(%xu, %w32)
    %y : Float(1, 2816) = aten::sum(%p, [-1], False, None)
    %z : Float(1, 2816) = aten::mul(%y, %scale)

The fuser then makes one kernel of it (the cast and the product inlined into the
reduction, vectorized along the weight's contiguous rows, the scale as its epilogue): it
reads each int8 weight once and converts it in registers. Exact up to the order of the
additions (ATen's GEMM sums in blocks too): an int8 weight is exact in every float type,
and reduced-precision operands are computed in float32 and rounded once, as eager's GEMM
accumulates (bfloat16 and half products are exact in float32):

    %y : BFloat16(1, N) = aten::mm(%x, %wf)      (x: BFloat16)
    ->  ... aten::sum(aten::mul(unsqueeze(x.to(float32), 1), w.to(float32)), [-1]).to(bfloat16)

Left alone: a weight whose K axis is not contiguous (the reduction would not vectorize), a
product with more than `MAX_ROWS` rows or rows of unknown count (prefill: there a GEMM
reuses each weight from the caches across rows, the reduction does not), and types the
profile does not state.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from ... import log
from ...tensorexpr.meta import TensorMeta, constant

_log = log.get_logger(__file__)

#: the most rows of `x` written as dot products. Measured on one core (a 2816 x 1024 int8
#: weight, against `torch.mm(x, w.t().float()) * s` in one process): 5x faster than the
#: float copy and the GEMM at 1 row, 2.9x at 4, 1.7x at 8, 1.2x at 16, slower at 32 (the
#: reduction reads the int8 weight once per row). The unfused fallback of the reduction
#: would hold `rows` float copies of the weight.
MAX_ROWS = 8
_WEIGHT_DTYPES = (torch.int8, torch.uint8)
_FLOATS = (torch.float32, torch.bfloat16, torch.float16)
#: ScalarType codes of the float dtypes, as TorchScript graphs spell a `to`'s dtype
_CODES = {torch.float16: 5, torch.float32: 6, torch.bfloat16: 15}


def _meta(value: Any) -> TensorMeta | None:
    return TensorMeta.from_type(value.type())


def _int8_weight(value: Any, dtype: torch.dtype) -> Any | None:
    """The int8 (N, K) weight `w`, rows contiguous, that `value` is `w.t()` cast to `dtype`
    (`to(t(w))` or `t(to(w))`), else None."""
    node = value.node()
    for first, second in (("aten::to", "aten::t"), ("aten::t", "aten::to")):
        inner = node.inputsAt(0).node() if node.kind() == first else None
        if inner is None or inner.kind() != second:
            continue
        cast = node if first == "aten::to" else inner
        if not _plain_cast(cast, dtype):
            return None
        w = inner.inputsAt(0)
        meta = _meta(w)
        if meta and meta.dtype in _WEIGHT_DTYPES and len(meta.sizes) == 2 and (
                meta.strides[1] == 1 or meta.sizes[1] == 1):
            return w
    return None


def _plain_cast(node: Any, dtype: torch.dtype) -> bool:
    """Whether `node` is `aten::to(v, dtype, non_blocking, copy, memory_format)`: a cast to
    `dtype` (a constant, or the dtype of a value the profile types) and nothing else."""
    if node.inputsSize() != 5 or "ScalarType dtype" not in node.schema():
        return False
    code, source = constant(node.inputsAt(1)), node.inputsAt(1).node()
    if source.kind() == "prim::dtype":  # `w.to(x.dtype)`: the profiled dtype of x
        meta = _meta(source.inputsAt(0))
        code = meta and _CODES.get(meta.dtype)
    return code == _CODES[dtype] and constant(node.inputsAt(4)) is None


def _node(graph: Any, before: Any, kind: str, operands: list[Any], example: torch.Tensor) -> Any:
    """A new `kind` node before `before`, its output typed as `example` (a meta tensor) on
    the CPU."""
    node = graph.create(kind, operands, 1)
    node.insertBefore(before)
    node.output().setType(replace(TensorMeta.of(example), device=torch.device("cpu")).to_type())
    return node.output()


def _rewrite(graph: Any, mm: Any) -> bool:
    x, weight = mm.inputsAt(0), mm.inputsAt(1)
    x_meta, out_meta = _meta(x), _meta(mm.output())
    if x_meta is None or out_meta is None or x_meta.dtype not in _FLOATS:
        return False
    if len(x_meta.sizes) != 2 or x_meta.sizes[0] > MAX_ROWS or out_meta.dtype != x_meta.dtype:
        return False
    w = _int8_weight(weight, x_meta.dtype)
    if w is None:
        return False
    with graph.insert_point_guard(mm):
        one, false, last, none = (graph.insertConstant(v) for v in (1, False, [-1], None))
        codes = {d: graph.insertConstant(_CODES[d]) for d in {torch.float32, x_meta.dtype}}
    xe, we = x_meta.empty("meta"), _meta(w).empty("meta")

    def cast(v: Any, example: torch.Tensor, dtype: torch.dtype) -> tuple[Any, torch.Tensor]:
        example = example.to(dtype)
        return _node(graph, mm, "aten::to", [v, codes[dtype], false, false, none],
                     example), example

    if x_meta.dtype != torch.float32:
        x, xe = cast(x, xe, torch.float32)
    xe = xe.unsqueeze(1)
    xu = _node(graph, mm, "aten::unsqueeze", [x, one], xe)
    wf, we = cast(w, we, torch.float32)
    pe = xe * we
    p = _node(graph, mm, "aten::mul", [xu, wf], pe)
    ye = pe.sum(-1)
    y = _node(graph, mm, "aten::sum", [p, last, false, none], ye)
    if x_meta.dtype != torch.float32:
        y, ye = cast(y, ye, x_meta.dtype)
    y.setType(mm.output().type())
    mm.output().replaceAllUsesWith(y)
    mm.destroy()
    return True


def fold_int8_weight_casts(graph: torch._C.Graph) -> int:
    """Write each `mm(x, w.t().to(x.dtype))` of an int8 weight `w` and at most `MAX_ROWS`
    rows of `x` as a reduction that reads `w` (see the module's docstring), in place, in
    the graph's top-level block; the count of products rewritten."""
    count = 0
    for node in list(graph.nodes()):
        if node.kind() == "aten::mm":
            count += _rewrite(graph, node)
    if count:
        torch._C._jit_pass_dce(graph)
        _log.dump(f"{count} matrix products of int8 weights as reductions:\n", graph)
    return count
