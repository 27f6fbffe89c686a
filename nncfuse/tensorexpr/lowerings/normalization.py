"""normalization: batch norm in inference, an elementwise op per channel.

`aten::batch_norm(x, weight, bias, running_mean, running_var, training=False,
momentum, eps, cudnn_enabled)` with running statistics is, per element of
channel `c` (dim 1), what ATen's CPU kernel computes
(`batch_norm_cpu_collect_linear_and_constant_terms`):

    alpha = weight[c] / sqrt(running_var[c] + eps)     (1 / sqrt(...) without weight)
    beta  = bias[c] - running_mean[c] * alpha           (- running_mean[c] * alpha)
    out   = x * alpha + beta

so after a convolution (an external call) the group runs it with the
activation that follows in one pass over the convolution's output. Training
mode (batch statistics, running-stat updates) does not fuse.
"""

from __future__ import annotations

from .. import expr as E
from ..dtype import FLOAT32, FLOAT64
from .registry import Ctx, LoweringError, TensorArg, register


@register("aten::batch_norm", overloads=("",), constant_operands=True)
def batch_norm(ctx: Ctx) -> E.Expr:
    x = ctx.args[0]
    if not isinstance(x, TensorArg) or len(x.shape) < 2:
        raise LoweringError("batch_norm of a tensor with fewer than 2 dims")
    if ctx.const(5) is not False:
        raise LoweringError("batch_norm in training mode (batch statistics) does not fuse")
    dtype = ctx.out_dtype
    if dtype not in (FLOAT32, FLOAT64) or x.dtype != dtype:
        raise LoweringError(f"batch_norm fuses for float32 and float64, not {x.dtype}")
    eps = E.as_expr(float(ctx.const(7)), dtype)
    channel = ctx.indices[1]

    def per_channel(k: int) -> E.Expr | None:
        if ctx.is_none(k):
            return None
        arg = ctx.args[k]
        if not isinstance(arg, TensorArg) or arg.shape != (x.shape[1],) or arg.dtype != dtype:
            raise LoweringError("batch_norm parameters must be per-channel tensors of x's dtype")
        return ctx.load_at(arg, (channel,))

    weight, bias, mean, var = (per_channel(k) for k in (1, 2, 3, 4))
    if mean is None or var is None:
        raise LoweringError("batch_norm without running statistics does not fuse")
    one = E.as_expr(1.0, dtype)
    invstd = one / E.call("sqrt", var + eps)
    alpha = invstd if weight is None else invstd * weight
    beta = E.as_expr(0.0, dtype) - mean * alpha if bias is None else bias - mean * alpha
    return ctx.load(x) * alpha + beta
