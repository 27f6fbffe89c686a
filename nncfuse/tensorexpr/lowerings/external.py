"""external: GEMMs and convolutions in a group, as `ExternalCall`s with fused epilogues.

A GEMM or convolution node (`ATEN_EXTERNALS`) lowers to no loop nest but to
one `ExternalCall` of a library routine into a buffer the kernel owns; the
group's elementwise nodes after it read that buffer like any other. It reads
only group inputs and constants (the fuser puts it at the start of a group),
so the routine runs before the kernel's loops, from the generated entry.

Where the node's one consumer is an activation oneDNN has as a post-op
(`external.POST_OPS`), or a residual add of a group input (optionally
followed by such an activation), the call is oneDNN's fused routine instead
and those nodes lower to nothing (`Fused`):

    %y = aten::linear(%x, %w, %b)         ExternalCall(aten_linear, "nnc_mkldnn_linear_pointwise",
    %z = aten::gelu(%y, "none")       ->                 {x, w, b}, {'gelu', (), 'none'});

A float32 linear (where torch has MKL) of a weight under a million elements takes
no oneDNN routine: oneDNN reorders an unpacked weight on every call, which costs
more than the epilogue's pass (`ONEDNN_LINEAR_ROWS`). A linear's bias (an addmm's,
with beta and alpha 1) is then added by the loops, which read the GEMM's result
anyway, and a constant weight takes MKL's packed GEMM (`_gemm_plans`):

    %y = aten::linear(%x, %w, %b)         ExternalCall(aten_linear, "nnc_aten_linear",
    %z = aten::silu(%y)               ->                 {x, w}, {None});
                                          for i, j: z[i, j] = silu(aten_linear[i, j] + b[j])

The routine is tried once at lowering on random inputs of the group's types
and compared with the unfused ops; a routine that raises or differs falls
back to the plain ATen op with nncfuse's epilogue (and a call that still
raises fails the group, which runs unfused). The trial also gives the output
strides the buffer is declared with. Its outcome is kept under a key of what it reads
(`trials.py`): a repeated layer's GEMM takes it without running the routines again.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch

from .. import expr as E
from .. import stmt as S
from ..buffer import Buf, span
from ..dtype import from_torch
from ..external import (
    ATEN_EXTERNALS,
    ROUTINES,
    aten_op,
    aten_routine,
    mkl_packed_ok,
    mkl_sgemm_fast,
    native_conv_faster,
    onednn_dtype_ok,
    post_op,
)
from ..meta import TensorMeta
from . import trials
from .registry import ConstArg, LoweringError, ScalarArg, TensorArg, register, schema_overload
from .trials import Outcome

__all__ = ["EXTERNAL_KINDS", "Fused", "lower_external", "external_problem", "onednn_gemm_alone",
           "reusable_gemm", "trial"]

EXTERNAL_KINDS = frozenset(ATEN_EXTERNALS)

#: Fold an inference batch norm (and the activation after it) into a oneDNN convolution.
#: Off: on transformers' ResNet and MobileNetV2 (1 thread, quiet machine) the folded
#: un-prepacked oneDNN call measured slower (0.86x / 1.04x eager) than ATen's convolution
#: followed by nncfuse's loops for batch norm and activation; it wants prepacked weights.
#: Channels-last (8x64x56x56) it was faster (9.6 -> 9.0 ms) but folding reassociates: 1.4e-5
#: off eager near zero, outside `assert_close`'s float32 default. Frozen modules
#: (`nncfuse.jit(m, freeze=True)`, an opt-in) have batch norm folded by TorchScript.
FOLD_BATCH_NORM = False


#: oneDNN's linear with a fused post-op for at least this many rows, else ATen's GEMM and
#: nncfuse's loops after it; for float32 (where torch has MKL) only for a weight of at least
#: ONEDNN_LINEAR_WEIGHT elements. oneDNN reorders an unpacked weight on every call. Float32,
#: 1 thread, 128 rows, its GEMM alone against ATen's `mm`: 1.25x at 256 -> 256, 1.23x at
#: 256 -> 1024, 1.09x at 768 -> 3072 (1.1-6x at 1-4 rows). With the epilogue (gelu, silu)
#: against `mm` and eager's passes: 1.03-1.13x for weights of 256 x 256 to 256 x 1024 (the
#: transformers' shapes; Llama end to end: 316 us per `_linear_pointwise` call against 152 us
#: per `mm`), 0.94-1.04x at 262k-786k elements, 0.90-0.95x from 1M (768 -> 2048 and
#: 768 -> 3072, 1024 -> 3072; 0.82-0.87x at 64 rows of 768 -> 3072).
ONEDNN_LINEAR_ROWS = 32
ONEDNN_LINEAR_WEIGHT = 1 << 20
#: ... and for float32 any weight from this many rows: the post-op runs on the GEMM's tiles
#: while they are in cache, which pays most where the GEMM's reduction is short. Through
#: nncfuse at 1 thread, oneDNN over ATen's GEMM and loops (gelu / residual add): ConvNeXt's
#: 3136 rows of 40 -> 160 0.61x / 0.75x, 784 of 80 -> 320 0.77x / 0.88x, 512 of 256 -> 1024
#: 0.89x / 0.95x; at 128 rows 0.94-1.13x (256 -> 256, 688, 1024; silu 1.13x), 196 of
#: 160 -> 640 0.88x / 1.02x. (ConvNeXt end to end: 1.05x eager with ATen's GEMMs against
#: 1.16x with oneDNN's.)
ONEDNN_LINEAR_MANY_ROWS = 512
#: Where MKL's float32 GEMM is the slower (`mkl_sgemm_fast`: not an Intel CPU), oneDNN's is
#: taken for any GEMM of ONEDNN_LINEAR_ROWS rows, columns and reduction each and at least
#: this many multiply-adds. Zen 5, 1 thread, MKL over oneDNN: 0.14x at 32 x 16 -> 16, 0.60x
#: at 128 x 64 -> 64, 0.91x at 64 x 128 -> 128, 1.28-1.35x at 2M multiply-adds (32 x 256 ->
#: 256, 128 x 128 -> 128, 512 x 64 -> 64), 1.6-2.1x from 8M (BERT's 128 x 256 -> 1024 in
#: each layout of its step, 3136 x 40 -> 160); 0.56x for 2048 x 4096 -> 1 (hence the columns).
ONEDNN_SGEMM_WORK = 1 << 21

#: oneDNN's bfloat16 linear, its weight packed where it is reused (`_reusable`), from this
#: many multiply-adds; below, ATen's GEMM and the loops (a call of oneDNN's costs some 17 us).
#: 1 thread, with gelu, against `linear` and eager's `gelu`: 17 against 12 us at 2 x 64 -> 32
#: (4096), 17 against 29 at 4 x 32 -> 64 (8192), 28 against 51 at 1 x 256 -> 1024.
REUSED_GEMM_WORK = 1 << 13
#: ... and float32's, where MKL's GEMM is the slower (`mkl_sgemm_fast`), from this many. Zen 4,
#: 1 thread, the weight packed against ATen's `addmm`: 0.68x at 4 x 256 -> 256, 0.87x at
#: 128 x 64 -> 256, 0.92x at 32 x 256 -> 256 (2M), 1.01x at 64 x 256 -> 256, 1.08x at
#: 32 x 256 -> 512 (4M), 1.10-1.13x at 32 x 256 -> 688 and back, 1.15x at 32 x 256 -> 1024,
#: 1.61x at 32 x 1024 -> 256, 1.06-1.16x at 128 rows, 1.14x at 1 x 1024 -> 2816 (0.85x at
#: 1 x 256 -> 1024). (oneDNN's unpacked: 0.79-0.99x of ATen's at all of these.)
REUSED_SGEMM_WORK = 1 << 22


def reusable_gemm(dtype: torch.dtype, rows: int, weight: Sequence[int]) -> bool:
    """Whether a linear of `rows` rows of `dtype` by a (N, K) `weight` that is reused from
    call to call runs faster as oneDNN's, its weight packed (`REUSED_GEMM_WORK`,
    `REUSED_SGEMM_WORK`)."""
    if len(weight) != 2 or not onednn_dtype_ok(dtype):
        return False
    work = rows * math.prod(weight)
    if dtype == torch.float32:
        return not mkl_sgemm_fast() and work >= REUSED_SGEMM_WORK
    return dtype == torch.bfloat16 and work >= REUSED_GEMM_WORK

#: MKL's packed GEMM for constant weights of at least this many elements. It takes at least
#: 7.9 MB per weight (MKL's packing pads: 1982689 floats for 64 x 32) and saved 8% at
#: 128 x 256 -> 256 (1 thread: 93 against `mm`'s 101 us), 11-17% from 256 -> 1024 up.
MKL_PACKED_WEIGHT = 1 << 16


@register(tuple(ATEN_EXTERNALS), overloads=("",), constant_operands=True)
def _not_elementwise(ctx: Any) -> E.Expr:
    raise LoweringError(f"{ctx.node.kind()} is an external call, not an elementwise op")


def external_problem(node: Any) -> str | None:
    """Why the external `node` cannot run inside a group, or None."""
    value = node.output()
    meta = TensorMeta.from_type(value.type())
    if meta is not None and not meta.dtype.is_floating_point:
        return f"{node.kind()} runs in a library only for floating dtypes, not {meta.dtype}"
    if node.kind() in ("aten::_convolution", "aten::convolution") and (
            node.inputsAt(6).toIValue() is not False):
        return "a transposed convolution is not supported"
    return None


@dataclass(frozen=True)
class Fused:
    """What lowering an external node produced: the call, its buffer, and the graph values
    (uniques) it computes: the node's output, or that of the last post-op fused into it."""

    call: S.ExternalCall
    value: int
    folded: frozenset[int]  # uniques of the outputs of nodes fused into the call
    bias: Buf | None = None  # added to the call's result by the loops (the value is the sum)


def _operand(arg: Any, sources: frozenset[Buf]) -> Any:
    if isinstance(arg, TensorArg):
        if arg.buf not in sources:
            raise LoweringError("an external call reads only group inputs and constants")
        return arg.buf
    if isinstance(arg, ScalarArg):
        if arg.const is None:
            return arg.expr
        return arg.const
    if isinstance(arg, ConstArg):
        v = arg.value
        return tuple(v) if isinstance(v, list) else v
    raise LoweringError(f"operand {arg} of an external call is not supported")


def _single_user(value: Any, outputs: set[int]) -> Any | None:
    """The one node that uses `value`, if it has one use and is no graph output."""
    uses = list(value.uses())
    if len(uses) != 1 or value.unique() in outputs:
        return None
    return uses[0].user


def _consts(node: Any) -> list[Any] | None:
    """The node's operands after the first, if all are constants."""
    rest = list(node.inputs())[1:]
    if any(v.node().kind() != "prim::Constant" for v in rest):
        return None
    return [v.toIValue() for v in rest]


def _unary(node: Any | None, source: Any) -> tuple[str, tuple[float, ...], str | None] | None:
    if node is None or node.inputsAt(0) != source:
        return None
    consts = _consts(node)
    return None if consts is None else post_op(node.kind(), consts)


def _residual(node: Any | None, value: Any) -> Any | None:
    """The group input `node` adds to `value` (`aten::add(value, other)`, alpha 1), or None."""
    if node is None or node.kind() != "aten::add" or node.inputsSize() != 3:
        return None
    a, b, alpha = node.inputs()
    other = b if a == value else a if b == value else None
    if other is None or other == value or alpha.node().kind() != "prim::Constant":
        return None
    if alpha.toIValue() != 1 or other.node().kind() != "prim::Param":
        return None
    want, got = TensorMeta.from_type(value.type()), TensorMeta.from_type(other.type())
    if want is None or got is None or (got.sizes, got.dtype) != (want.sizes, want.dtype):
        return None
    return other


@dataclass(frozen=True)
class _Plan:
    fn: str
    args: tuple[Any, ...]
    last: Any  # the graph value the call computes
    folded: tuple[Any, ...]  # the nodes after the external one that the call computes
    bias: Buf | None = None  # what the loops add to the routine's result


def _fused_plans(node: Any, operands: list[Any], outputs: set[int],
                 other: Callable[[Any], Any], constant: frozenset[Buf]) -> list[_Plan]:
    """oneDNN routines that compute `node` with its epilogue, best first; `constant`: the
    buffers of the group's constant tensors."""
    kind, value = node.kind(), node.output()
    meta = TensorMeta.from_type(value.type())
    if meta is None or not onednn_dtype_ok(meta.dtype):
        return []
    user = _single_user(value, outputs)
    unary = _unary(user, value)
    residual = _residual(user, value)
    after = _single_user(user.output(), outputs) if residual is not None else None
    then = _unary(after, user.output()) if after is not None else None
    plans: list[_Plan] = []
    reused = "_reused" if _reusable(operands[1], constant, meta) else ""
    packed = operands[1] in constant and _packable(operands[0], operands[1], meta) \
        and not _onednn_sgemm(meta, operands[1], transposed=True) \
        and not reused  # (oneDNN's, packed, where MKL's is the slower)
    if kind == "aten::linear" and len(meta.sizes) >= 2 and not packed and (
            reused or _onednn_linear(meta, operands[1])):
        x, w, b = operands
        if unary is not None:
            plans.append(_Plan(f"nnc_mkldnn_linear_pointwise{reused}", (x, w, b, *unary),
                               user.output(), (user,)))
        if residual is not None:
            plans.append(_Plan(f"nnc_mkldnn_linear_pointwise_binary{reused}",
                               (x, other(residual), w, b, "add"), user.output(), (user,)))
    conv = _conv2d_operands(kind, operands) if len(meta.sizes) == 4 else None
    if conv is not None and meta.dtype == torch.float32 and _native_conv(conv, meta):
        conv = None  # (ATen's own routine and the loops, the faster there)
    if conv is not None:
        x, w, b, stride, padding, dilation, groups = conv
        geometry = (padding, stride, dilation, groups)
        # A constant weight (a frozen module's) is packed once for a channels-last input, a
        # reused one from its second call.
        packed = (("_packed",) if w in constant else (reused,) if reused else ()) \
            if _channels_last(x) else ()
        if unary is not None:
            for suffix in (*packed, ""):
                plans.append(_Plan(f"nnc_mkldnn_convolution_pointwise{suffix}",
                                   (x, w, b, *geometry, *unary), user.output(), (user,)))
        if residual is not None:
            binary = (x, other(residual), w, b, *geometry, "add", None)
            for suffix in (*packed, ""):
                fn = f"nnc_mkldnn_convolution_pointwise_binary{suffix}"
                if then is not None:
                    plans.append(_Plan(fn, (*binary, *then), after.output(), (user, after)))
                plans.append(_Plan(fn, (*binary, None, (), None), user.output(), (user,)))
        bn = _batch_norm(user, value, meta, other) if FOLD_BATCH_NORM else None
        if bn is not None:
            after = _single_user(user.output(), outputs)
            then = _unary(after, user.output())
            fn = "nnc_mkldnn_convolution_bn_pointwise"
            if then is not None:
                plans.append(_Plan(fn, (x, w, b, *bn, *geometry, *then), after.output(),
                                   (user, after)))
            plans.append(_Plan(fn, (x, w, b, *bn, *geometry, "none", (), None),
                               user.output(), (user,)))
        if packed:  # no post-op fuses: still the packed weight
            plans.append(_Plan(f"nnc_mkldnn_convolution_pointwise{packed[0]}",
                               (x, w, b, *geometry, "none", (), None), value, ()))
    elif kind == "aten::linear" and reused and len(meta.sizes) >= 2:  # (no post-op fuses)
        plans.append(_Plan("nnc_mkldnn_linear_pointwise_reused",
                           (*operands, "none", (), None), value, ()))
    return plans


def _native_conv(conv: Sequence[Any], meta: TensorMeta) -> bool:
    """Whether float32 convolution `conv` (its operands: `_conv2d_operands`; its output's
    `meta`) is faster as ATen's own routine (`native_conv_faster`); not where its sizes are
    symbolic."""
    x, w, _, stride, _, dilation, _ = conv
    sizes, kernel = (b.static_dims() if isinstance(b, Buf) else None for b in (x, w))
    if sizes is None or kernel is None:
        return False
    return native_conv_faster(sizes[0], kernel[2:], stride, dilation, kernel[0] * kernel[1],
                              math.prod(meta.sizes) // max(meta.sizes[1], 1))


def _reusable(w: Any, constant: frozenset[Buf], meta: TensorMeta) -> bool:
    """Whether a weight `w` is worth packing where it is the same tensor at a later call
    (`reused_weight`), for oneDNN's routines: a convolution's that is not a constant
    (bfloat16 or float32; packed only for a channels-last input; a constant's is packed
    once, `_packed`), or a linear's (N, K) that `reusable_gemm`, a frozen module's constant
    too (on a CPU where MKL's float32 GEMM is the slower, rather than MKL's packed one)."""
    dims = w.static_dims() if isinstance(w, Buf) else None
    if dims is None or not onednn_dtype_ok(meta.dtype):
        return False
    if len(dims) == 4:  # (a constant convolution weight: `_packed`)
        return w not in constant and meta.dtype in (torch.bfloat16, torch.float32)
    return reusable_gemm(meta.dtype, _rows(meta), dims)  # (a constant: packed at its 2nd call)


def _onednn_linear(meta: TensorMeta, w: Any) -> bool:
    """Whether oneDNN's fused linear may be faster than ATen's (see ONEDNN_LINEAR_ROWS)."""
    if _rows(meta) < ONEDNN_LINEAR_ROWS:
        return False
    if meta.dtype != torch.float32 or not torch._C.has_mkl:
        return True
    if not mkl_sgemm_fast():
        return _onednn_sgemm(meta, w, transposed=True)
    if _rows(meta) >= ONEDNN_LINEAR_MANY_ROWS:
        return True
    dims = w.static_dims() if isinstance(w, Buf) else None
    return dims is not None and math.prod(dims) >= ONEDNN_LINEAR_WEIGHT


def _onednn_sgemm(meta: TensorMeta, w: Any, transposed: bool) -> bool:
    """Whether oneDNN's GEMM is the faster for this float32 one where MKL's is slow
    (`ONEDNN_SGEMM_WORK`); `w` is the 2-d weight (a Buf, or its sizes), `transposed`:
    (columns, reduction), as a linear's."""
    dims = w.static_dims() if isinstance(w, Buf) else w if isinstance(w, tuple) else None
    if meta.dtype != torch.float32 or mkl_sgemm_fast() or dims is None or len(dims) != 2:
        return False
    reduction = dims[1] if transposed else dims[0]
    m, n = _rows(meta), meta.sizes[-1]
    return min(m, n, reduction) >= ONEDNN_LINEAR_ROWS and m * n * reduction >= ONEDNN_SGEMM_WORK


def onednn_gemm_alone(node: Any) -> bool:
    """Whether GEMM `node` is worth a kernel of its own: a float32 mm, or addmm of beta and
    alpha 1, that takes oneDNN's routine (`_onednn_sgemm`: MKL's is the slower here). The
    weight gradients' `mm`s and attention's input projections, which no elementwise op
    follows: BERT's training step has 41 of its 75 GEMMs outside kernels. And a bfloat16
    or float32 linear that `reusable_gemm`: oneDNN's routine takes its weight packed where it
    is reused (`_reusable`; not reused, it is about the routine ATen calls)."""
    kind = node.kind()
    if kind == "aten::linear":
        out, w = (TensorMeta.from_type(v.type()) for v in (node.output(), node.inputsAt(1)))
        return (out is not None and w is not None and out.dtype == w.dtype
                and len(out.sizes) >= 2 and reusable_gemm(out.dtype, _rows(out), w.sizes))
    if kind not in ("aten::mm", "aten::addmm") or not onednn_dtype_ok(torch.float32):
        return False
    metas = [TensorMeta.from_type(v.type()) for v in (node.output(), *node.inputs())]
    if kind == "aten::addmm":
        scalars = [v.toIValue() if v.node().kind() == "prim::Constant" else None
                   for v in list(node.inputs())[3:]]
        bias = metas[1].sizes if metas[1] is not None else None
        if scalars != [1, 1] or bias is None or metas[0] is None or len(bias) > 2 or any(
                b not in (1, o) for b, o in zip(reversed(bias), reversed(metas[0].sizes))):
            return False
        metas = [metas[0], *metas[2:4]]
    out, x, w = metas[:3]
    if out is None or x is None or w is None or len(x.sizes) != 2 or len(w.sizes) != 2:
        return False
    return _onednn_sgemm(out, tuple(w.sizes), transposed=False)


def _gemm_plans(node: Any, operands: list[Any], constant: frozenset[Buf]) -> list[_Plan]:
    """The plain GEMM of a linear, addmm, mm or matmul, best first, with nncfuse's loops after it:
    MKL's packed GEMM where the weight is a constant (a frozen module's: packed once), and a
    bias (linear's; addmm's with beta and alpha 1) added in the loops, which read the result
    anyway, instead of by the routine (ATen's addmm writes it into the output first, then
    accumulates onto it: 128 x 768 -> 3072, 1 thread, 4.37 ms against mm's 3.86 ms)."""
    kind, value = node.kind(), node.output()
    meta = TensorMeta.from_type(value.type())
    if meta is None or kind not in ("aten::linear", "aten::addmm", "aten::mm", "aten::matmul"):
        return []
    if kind == "aten::linear":
        x, w, bias = operands
    elif kind in ("aten::mm", "aten::matmul"):
        (x, w), bias = operands, None
    else:
        bias, x, w, beta, alpha = operands
        if not isinstance(bias, Buf) or any(
                not isinstance(c, (int, float)) or c != 1 for c in (beta, alpha)):
            return []
    if bias is not None and not (isinstance(bias, Buf) and _broadcasts(bias, meta)):
        return []
    if bias is not None and meta.dtype not in (torch.float32, torch.float64):
        return []  # reduced precision: the routine adds the bias before rounding
    linear = kind == "aten::linear"
    plans = []
    # oneDNN's GEMM first where MKL's is slow, packed or not (Zen 5, 128 x 256 -> 1024 and
    # 128 x 768 -> 3072 of a packed weight: MKL 838 and 8851 us, oneDNN 395 and 3871)
    if isinstance(x, Buf) and (x.ndim >= 2 if linear else x.ndim == 2 == len(meta.sizes)) \
            and onednn_dtype_ok(meta.dtype) and _onednn_sgemm(meta, w, transposed=linear):
        fn, args = (("nnc_mkldnn_linear_pointwise", (x, w, None, "none", (), None)) if linear
                    else ("nnc_mkldnn_mm", (x, w)))
        plans.append(_Plan(fn, args, value, (), bias))
    if w in constant and _packable(x, w, meta):
        fn, args = (("nnc_mkl_linear_packed", (x, w, None)) if linear
                    else ("nnc_mkl_mm_packed", (x, w)))
        plans.append(_Plan(fn, args, value, (), bias))
    if bias is not None:
        fn, args = ("nnc_aten_linear", (x, w, None)) if linear else ("nnc_aten_mm", (x, w))
        plans.append(_Plan(fn, args, value, (), bias))
    return plans


def _packable(x: Any, w: Any, meta: TensorMeta) -> bool:
    """Whether MKL's packed GEMM computes `x` times the constant 2-d weight `w` (of at least
    MKL_PACKED_WEIGHT elements) in `meta`'s dtype."""
    dims = w.static_dims() if isinstance(w, Buf) else None
    if not isinstance(x, Buf) or x.ndim < 2 or dims is None or len(dims) != 2:
        return False
    return mkl_packed_ok(meta.dtype) and math.prod(dims) >= MKL_PACKED_WEIGHT


def _broadcasts(bias: Buf, meta: TensorMeta) -> bool:
    """Whether `bias` has static sizes that broadcast to the output's without changing them."""
    sizes = bias.static_dims()
    if sizes is None or len(sizes) > len(meta.sizes):
        return False
    return all(b in (1, o) for b, o in zip(reversed(sizes), reversed(meta.sizes)))


def _channels_last(buf: Any) -> bool:
    """Whether `buf` is a 4-d buffer of static sizes laid out channels-last."""
    sizes = buf.static_dims() if isinstance(buf, Buf) else None
    strides = tuple(getattr(s, "value", None) for s in buf.strides) if sizes else ()
    if sizes is None or len(sizes) != 4 or None in strides:
        return False
    meta = torch.empty_strided(sizes, strides, device="meta")
    return meta.is_contiguous(memory_format=torch.channels_last) and not meta.is_contiguous()


def _rows(meta: TensorMeta) -> int:
    rows = 1
    for d in meta.sizes[:-1]:
        rows *= d
    return rows


def _batch_norm(node: Any | None, value: Any, meta: TensorMeta,
                buf: Callable[[Any], Buf]) -> tuple[Any, ...] | None:
    """(weight, bias, mean, var, eps) of an inference batch norm of `value` whose statistics
    and parameters are group inputs, to fold into the convolution's weights; else None."""
    if node is None or node.kind() != "aten::batch_norm" or node.inputsAt(0) != value:
        return None
    params = list(node.inputs())[1:5]
    flags = list(node.inputs())[5:]
    if any(v.node().kind() != "prim::Constant" for v in flags) or flags[0].toIValue():
        return None
    folded: list[Any] = []
    for k, v in enumerate(params):
        if v.node().kind() == "prim::Constant" and v.toIValue() is None and k < 2:
            folded.append(None)
            continue
        got = TensorMeta.from_type(v.type())
        if v.node().kind() != "prim::Param" or got is None:
            return None
        if got.sizes != (meta.sizes[1],) or got.dtype != meta.dtype:
            return None
        folded.append(buf(v))
    return (*folded, float(flags[2].toIValue()))


def _conv2d_operands(kind: str, operands: list[Any]) -> list[Any] | None:
    """(x, w, b, stride, padding, dilation, groups) of a plain 2-d convolution, else None:
    `conv2d` with explicit padding, or what tracing (`_convolution`) and AOTAutograd
    (`convolution`) record, not transposed."""
    if kind == "aten::conv2d" and isinstance(operands[4], tuple):
        return operands
    if (kind in ("aten::_convolution", "aten::convolution") and operands[6] is False
            and not any(operands[7])):
        return [*operands[:6], operands[8]]
    return None


def _reference(aten: Callable[..., torch.Tensor], value: Any,
               *nodes: Any) -> Callable[..., torch.Tensor]:
    """Eager's result for the ops a plan fuses, the external node's `value` and then `nodes`:
    `run(operands, lookup)` from the node's operand values, `lookup(v)` giving the example or
    constant of any other graph value."""

    def run(operands: Sequence[Any], lookup: Callable[[Any], Any]) -> torch.Tensor:
        y, prev = aten(*operands), value
        for n in nodes:
            args = [y if v == prev else lookup(v) for v in n.inputs()]
            y, prev = aten_op(n.kind(), schema_overload(n) or "default")(*args), n.output()
        return y

    return run


#: A buffer's sizes and strides as ints (a dynamic kernel's at some values of its symbols).
SizesOf = Callable[[Buf], tuple[tuple[int, ...], tuple[int, ...]]]


def _static_sizes(buf: Buf) -> tuple[tuple[int, ...], tuple[int, ...]]:
    sizes = buf.static_dims()
    strides = tuple(getattr(s, "value", None) for s in buf.strides)
    if sizes is None or None in strides:
        raise LoweringError(f"external call operand {buf.name} has symbolic sizes")
    return tuple(sizes), strides  # type: ignore[return-value]


def _example(buf: Buf, constants: dict[Buf, torch.Tensor], gen: torch.Generator,
             sizes_of: SizesOf = _static_sizes) -> torch.Tensor:
    if buf in constants:
        return constants[buf]
    sizes, strides = sizes_of(buf)
    if any(size > 1 and stride == 0 for size, stride in zip(sizes, strides)):
        # An expanded operand (a broadcast input): its elements share memory, which copy_
        # refuses to write; random values over the memory it spans, viewed as the operand.
        spanned = torch.randn(span(sizes, strides), generator=gen).to(buf.dtype.torch)
        return spanned.as_strided(sizes, strides)
    t = torch.empty_strided(sizes, strides, dtype=buf.dtype.torch)
    return t.copy_(torch.randn(sizes, generator=gen).to(buf.dtype.torch))


def _values(args: Sequence[Any], examples: dict[Buf, torch.Tensor]) -> list[Any]:
    return [examples[a] if isinstance(a, Buf) else 1 if isinstance(a, E.Expr) else a
            for a in args]


def lower_external(
    node: Any,
    args: Sequence[Any],
    sources: frozenset[Buf],
    constants: dict[Buf, torch.Tensor],
    outputs: set[int],
    name: str,
    env_buf: Callable[[Any], Buf],
    sizes_of: SizesOf = _static_sizes,
) -> Fused:
    """The `ExternalCall` computing `node` (and the post-ops oneDNN fuses into it); raise
    LoweringError if its routine does not run on the group's types. `env_buf(value)` is the
    buffer of a graph value; `outputs` the uniques of the graph's outputs; `sizes_of` the
    operands' sizes for the trial (a dynamic kernel's: the example's)."""
    kind = node.kind()
    if kind not in EXTERNAL_KINDS:
        raise LoweringError(f"{kind} is not an external call")
    problem = external_problem(node)
    if problem:
        raise LoweringError(problem)
    operands = [_operand(a, sources) for a in args]
    meta = TensorMeta.from_type(node.output().type())
    if meta is None:
        raise LoweringError(f"no type for the output of {kind}")
    constant = frozenset(constants)
    plans = [*_fused_plans(node, operands, outputs, env_buf, constant),
             *_gemm_plans(node, operands, constant)]
    # A model's layers repeat their GEMMs: the outcome of a trial with the same key is kept.
    key = trials.key(node, operands, plans, constants, env_buf, sizes_of)
    outcome = trials.recall(key)
    if outcome is None:
        outcome = _trial(node, operands, plans, sources, constants, env_buf, sizes_of)
        trials.remember(key, outcome)
    if outcome.error is not None:
        raise LoweringError(outcome.error)
    if outcome.plan is None:
        return _fused(aten_routine(kind), tuple(operands), name, outcome, node.output(), ())
    plan = plans[outcome.plan]
    return _fused(plan.fn, plan.args, name, outcome, plan.last, plan.folded, plan.bias)


def _trial(node: Any, operands: Sequence[Any], plans: Sequence[_Plan], sources: frozenset[Buf],
           constants: dict[Buf, torch.Tensor], env_buf: Callable[[Any], Buf],
           sizes_of: SizesOf) -> Outcome:
    """Run each plan on random examples until one matches eager (`_try`); if none does, the
    node's plain ATen routine."""
    gen = torch.Generator().manual_seed(0)
    example = partial(_example, constants=constants, gen=gen, sizes_of=sizes_of)
    # Drawn in operand order (not `sources`' set order, which follows object ids): the
    # examples decide which plan passes, so the plan, and the IR, must not vary by process.
    examples = {b: example(b) for b in dict.fromkeys(_bufs(operands)) if b in sources}
    reference = ROUTINES[aten_routine(node.kind())]
    for k, plan in enumerate(plans):
        for b in _bufs(plan.args):
            examples.setdefault(b, example(b))
        if plan.fn == "nnc_mkldnn_convolution_bn_pointwise" and isinstance(plan.args[6], Buf):
            var = plan.args[6]  # a variance: positive
            examples[var] = examples[var].abs() + 0.5
        run = _reference(reference, node.output(), *plan.folded)
        result = _try(plan, run, operands, examples, partial(_lookup, examples, env_buf))
        if result is not None:
            return Outcome.of(k, result)
    try:
        with torch.no_grad():
            return Outcome.of(None, reference(*_values(operands, examples)))
    except RuntimeError as e:
        return Outcome(None, error=f"{node.kind()} fails on the group's types: {e}")


def trial(call: S.ExternalCall, constants: dict[Buf, torch.Tensor],
          sizes_of: SizesOf) -> torch.Tensor:
    """`call`'s routine on random operands of sizes `sizes_of` (a dynamic kernel checks the
    sizes and strides of its result at other values of its symbols)."""
    gen = torch.Generator().manual_seed(0)
    examples = {b: _example(b, constants, gen, sizes_of) for b in _bufs(call.args)}
    with torch.no_grad():
        return ROUTINES[call.fn](*_values(call.args, examples))


def _lookup(examples: dict[Buf, torch.Tensor], env_buf: Callable[[Any], Buf], value: Any) -> Any:
    if value.node().kind() == "prim::Constant":
        return value.toIValue()
    return examples[env_buf(value)]


def _bufs(args: Sequence[Any]) -> list[Buf]:
    return [a for a in args if isinstance(a, Buf)]


def _try(plan: _Plan, reference: Callable[..., torch.Tensor], operands: Sequence[Any],
         examples: dict[Buf, torch.Tensor], lookup: Callable[[Any], Any]) -> torch.Tensor | None:
    """The fused routine's result on the examples if it runs and matches eager's ops
    (`reference`), else None."""
    try:
        with torch.no_grad():
            got = ROUTINES[plan.fn](*_values(plan.args, examples))
            want = reference(_values(operands, examples), lookup)
    except (RuntimeError, KeyError, TypeError):
        return None
    full = got if plan.bias is None else got + examples[plan.bias]
    if full.shape != want.shape or got.dtype != want.dtype or got.stride() != want.stride():
        return None
    tol = 1e-2 if got.dtype == torch.bfloat16 else 1e-3
    scale = max(1.0, float(want.abs().max())) if want.numel() else 1.0
    return got if torch.allclose(full, want, rtol=tol, atol=tol * scale) else None


def _fused(fn: str, args: tuple[Any, ...], name: str, result: Outcome,
           last: Any, folded: Sequence[Any], bias: Buf | None = None) -> Fused:
    meta = TensorMeta.from_type(last.type())
    if meta is None or (result.sizes, result.dtype) != (meta.sizes, meta.dtype):
        raise LoweringError(f"{fn} gives {result.sizes} {result.dtype}, not the graph's")
    assert result.dtype is not None
    buf = Buf.make(name, from_torch(result.dtype), meta.sizes, result.strides)
    return Fused(S.ExternalCall(buf, fn, args), last.unique(),
                 frozenset(n.output().unique() for n in folded), bias)
