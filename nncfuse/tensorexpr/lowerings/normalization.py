"""Normalizations: layer_norm, rms_norm, group_norm, instance_norm; batch_norm in inference.

Each normalizes over rows (`reductions._Box`): the row statistics are
intermediates over the kept dims (`Ctx.intermediate`), which the output nest
loads, so `fuse_loops` runs a row's statistics and its output in one sweep
while the row is in cache. Numerics follow ATen's CPU kernels
(`layer_norm_kernel.cpp`, `group_norm_kernel.cpp`, `batch_norm_kernel.cpp`):

- float16 and bfloat16 compute in float32 and round once at the end;
- variance is two-pass (the mean, then the mean squared deviation), never
  E[x^2] - E[x]^2; the output is `((x - mean) * rstd) * w + b` with
  `rstd = 1 / sqrt(var + eps)`: ATen's `x * rstd + (-mean * rstd)` rounds
  `x * rstd` (error `u * (|x| + |mean|) * rstd`), this rounds `x - mean`
  (`u * |x - mean| * rstd`), and the output loop is two vector operations,
  the row's mean and rstd broadcast from memory operands;
- inference batch_norm folds its running statistics into a per-channel
  `alpha`, `beta` (`batch_norm_cpu_transform_input`), then is elementwise.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from .. import expr as E
from .reductions import LAYER_NORM_ALONE, Index, _alone_from, _mean_of, _row_box, _tensor, _zero
from .registry import Ctx, LoweringError, TensorArg, compute_type, register

# -- layer_norm ---------------------------------------------------------------------------------


@register("aten::layer_norm", overloads=("",), alone=LAYER_NORM_ALONE)
def layer_norm(ctx: Ctx) -> E.Expr:
    """Mean and 1/sqrt(var + eps) per row (two-pass, in float32 for reduced floats), then
    `((x - mean) * rstd) * weight + bias`."""
    x = _tensor(ctx)
    out = ctx.out_dtype
    if not out.is_float or x.dtype != out:
        raise LoweringError("layer_norm of a non-float tensor")
    shape = ctx.const(1)
    if not isinstance(shape, (list, tuple)) or tuple(shape) != tuple(x.shape[-len(shape):]):
        raise LoweringError("normalized_shape must be a constant matching the input")
    if not shape:
        raise LoweringError("an empty normalized_shape")
    ndim = len(x.shape)
    box = _row_box(ctx, tuple(range(ndim - len(shape), ndim)))
    if box.count == 0:
        raise LoweringError("layer_norm of empty rows")
    compute = compute_type(out)
    eps = ctx.const(4)
    eps = 1e-5 if eps is None else float(eps)
    mean = _mean_of(ctx, box, compute)
    rows = [x.shape[d] for d in box.kept]

    def rstd(*kept: E.Expr) -> E.Expr:
        m = E.Load(mean.buf, kept)

        def deviation(r: Index) -> E.Expr:
            d = box.load(kept, r, compute) - m
            return d * d

        var = box.reduce("Add", kept, deviation, _zero(compute)) / E.imm(float(box.count), compute)
        return E.imm(1.0, compute) / E.call("sqrt", var + E.imm(eps, compute))

    scale = ctx.intermediate("rstd", compute, rows, rstd)
    kept = box.kept_indices(ctx.indices)
    here = tuple(ctx.indices[d] for d in box.dims)
    s, m = E.Load(scale.buf, kept), E.Load(mean.buf, kept)
    y = (box.load(kept, here, compute) - m) * s
    for k, combine in ((2, E.Mul), (3, E.Add)):
        if not ctx.is_none(k):
            arg = ctx.args[k]
            if not isinstance(arg, TensorArg) or tuple(arg.shape) != tuple(shape):
                raise LoweringError("layer_norm weight and bias have the normalized shape")
            y = combine(y, ctx.load(arg, compute))
    return E.cast(out, y)



@register("aten::rms_norm", overloads=("",))
def rms_norm(ctx: Ctx) -> E.Expr:
    """`x * (1 / sqrt(mean(x^2) + eps)) * weight` per row, in float32 for reduced floats
    (`_fused_rms_norm`'s decomposition); eps None: the computation type's machine epsilon."""
    x = _tensor(ctx)
    out = ctx.out_dtype
    shape = ctx.const(1)
    if not out.is_float or x.dtype != out or not isinstance(shape, (list, tuple)) or not shape \
            or tuple(shape) != tuple(x.shape[-len(shape):]):
        raise LoweringError("rms_norm of a non-float tensor, or a normalized_shape unlike it")
    ndim = len(x.shape)
    box = _row_box(ctx, tuple(range(ndim - len(shape), ndim)))
    compute = compute_type(out)
    eps = ctx.const(3)
    eps = float(torch.finfo(compute.torch).eps if eps is None else eps)

    def rstd(*kept: E.Expr) -> E.Expr:
        def square(r: Index) -> E.Expr:
            v = box.load(kept, r, compute)
            return v * v

        total = box.reduce("Add", kept, square, _zero(compute))
        mean = total / E.imm(float(box.count), compute)
        return E.imm(1.0, compute) / E.call("sqrt", mean + E.imm(eps, compute))

    scale = ctx.intermediate("rstd", compute, [x.shape[d] for d in box.kept], rstd)
    kept = box.kept_indices(ctx.indices)
    here = tuple(ctx.indices[d] for d in box.dims)
    y = box.load(kept, here, compute) * E.Load(scale.buf, kept)
    if not ctx.is_none(2):
        w = ctx.args[2]
        if not isinstance(w, TensorArg) or tuple(w.shape) != tuple(shape):
            raise LoweringError("rms_norm weight has the normalized shape")
        y = y * ctx.load(w, compute)
    return E.cast(out, y)


# -- batch_norm (inference), group_norm -------------------------------------------------------


@register("aten::batch_norm", overloads=("",), constant_operands=True)
def batch_norm(ctx: Ctx) -> E.Expr:
    """Inference only (`training` False, running statistics given): per channel (dim 1)
    `alpha = weight / sqrt(var + eps)`, `beta = bias - mean * alpha`, then `x * alpha + beta`,
    ATen's `batch_norm_cpu_transform_input`."""
    x = _tensor(ctx)
    if ctx.const(5) or ctx.is_none(3) or ctx.is_none(4):
        raise LoweringError("batch_norm in training, or without running statistics")
    return _normalize_channels(ctx, x, 1, 2, 3, 4, float(ctx.const(7)))


def _normalize_channels(ctx: Ctx, x: TensorArg, weight_at: int, bias_at: int, mean_at: int,
                        var_at: int, eps: float) -> E.Expr:
    """`x * alpha[c] + beta[c]` from per-channel weight, bias, mean and variance."""
    out = ctx.out_dtype
    if not out.is_float or x.dtype != out or len(x.shape) < 2:
        raise LoweringError("batch_norm of a non-float tensor, or one without channels")
    compute = compute_type(out)
    channels = x.shape[1]
    params = {}
    roles = {"weight": weight_at, "bias": bias_at, "mean": mean_at, "var": var_at}
    for k in roles.values():
        arg = ctx.arg(k)
        if not ctx.is_none(k):
            if not isinstance(arg, TensorArg) or tuple(arg.shape) != (channels,):
                raise LoweringError("batch_norm parameters have one value per channel")
            params[k] = arg

    def param(role: str, c: E.Expr, default: float) -> E.Expr:
        k = roles[role]
        if k not in params:
            return E.imm(default, compute)
        return E.cast(compute, E.Load(params[k].buf, (c,)))

    def alpha_of(c: E.Expr) -> E.Expr:
        var = param("var", c, 1.0)
        invstd = E.imm(1.0, compute) / E.call("sqrt", var + E.imm(eps, compute))
        return param("weight", c, 1.0) * invstd

    alpha = ctx.intermediate("alpha", compute, [channels], alpha_of)
    beta = ctx.intermediate(
        "beta", compute, [channels],
        lambda c: param("bias", c, 0.0) - param("mean", c, 0.0) * E.Load(alpha.buf, (c,)),
    )
    c = ctx.indices[1]
    value = ctx.load(x, compute) * E.Load(alpha.buf, (c,)) + E.Load(beta.buf, (c,))
    return E.cast(out, value)


@register("aten::group_norm", overloads=("",))
def group_norm(ctx: Ctx) -> E.Expr:
    """Mean and 1/sqrt(var + eps) per (sample, group) over the group's channels and all
    spatial dims (two-pass), then `((x - mean) * rstd) * weight[c] + bias[c]`."""
    return _group_norm(ctx, ctx.const(1), 2, 3, float(ctx.const(4)))


# instance_norm alone (eager's runs batch_norm over a 1 x (N*C) view, with its reshapes), at
# 1 thread: 1.0x eager at 2x8x8x8, 2.0-9.4x from 2x64x8x8 to 32x32x64x64; 2 threads 2.5-13x.
# (group_norm is not alone: eager's own kernel is as fast, 0.55-1.3x over the same sizes.)
_INSTANCE_NORM_ALONE = _alone_from(4096)


@register("aten::instance_norm", overloads=("",), alone=_INSTANCE_NORM_ALONE)
def instance_norm(ctx: Ctx) -> E.Expr:
    """With the input's statistics and no running ones to update: group_norm with a group
    per channel; with running statistics only (`use_input_stats` False): batch_norm's."""
    x = _tensor(ctx)
    if not ctx.const(5):
        if ctx.is_none(3) or ctx.is_none(4):
            raise LoweringError("instance_norm without statistics")
        return _normalize_channels(ctx, x, 1, 2, 3, 4, float(ctx.const(7)))
    if not (ctx.is_none(3) and ctx.is_none(4)):
        raise LoweringError("instance_norm updating running statistics (a mutation)")
    if len(x.shape) < 2:
        raise LoweringError("instance_norm without channels")
    return _group_norm(ctx, x.shape[1], 1, 2, float(ctx.const(7)))


def _group_norm(ctx: Ctx, groups: object, weight_at: int, bias_at: int, eps: float) -> E.Expr:
    x = _tensor(ctx)
    out = ctx.out_dtype
    if not out.is_float or x.dtype != out or len(x.shape) < 2 or not isinstance(groups, int):
        raise LoweringError("group_norm of a non-float tensor, or without channels")
    n, channels, *spatial = x.shape
    if groups <= 0 or channels % groups:
        raise LoweringError("channels must divide into the groups")
    per_group = channels // groups
    count = per_group * math.prod(spatial)
    if count == 0:  # (no rows, n == 0, is an empty loop: fine)
        raise LoweringError("group_norm of an empty group")
    compute = compute_type(out)
    sizes = (per_group, *spatial)
    names = "rstuvw"

    def over_group(b: E.Expr, g: E.Expr, body: Callable[[E.Expr], E.Expr]) -> E.Expr:
        rvars = tuple(E.Var(names[k]) for k in range(len(sizes)))
        element = E.Load(x.buf, (b, g * per_group + rvars[0], *rvars[1:]))
        return E.Reduce("Add", _zero(compute), body(E.cast(compute, element)), rvars,
                        tuple(E.imm(s) for s in sizes))

    mean = ctx.intermediate(
        "mean", compute, [n, groups],
        lambda b, g: over_group(b, g, lambda v: v) / E.imm(float(count), compute),
    )

    def rstd(b: E.Expr, g: E.Expr) -> E.Expr:
        m = E.Load(mean.buf, (b, g))
        var = over_group(b, g, lambda v: (v - m) * (v - m)) / E.imm(float(count), compute)
        return E.imm(1.0, compute) / E.call("sqrt", var + E.imm(eps, compute))

    scale = ctx.intermediate("rstd", compute, [n, groups], rstd)
    b, c = ctx.indices[0], ctx.indices[1]
    g = c / E.imm(per_group)
    s, m = E.Load(scale.buf, (b, g)), E.Load(mean.buf, (b, g))
    y = (ctx.load(x, compute) - m) * s
    for k, combine in ((weight_at, E.Mul), (bias_at, E.Add)):
        if not ctx.is_none(k):
            arg = ctx.args[k]
            if not isinstance(arg, TensorArg) or tuple(arg.shape) != (channels,):
                raise LoweringError("group_norm weight and bias have one value per channel")
            y = combine(y, E.cast(compute, E.Load(arg.buf, (c,))))
    return E.cast(out, y)
