"""Activations: relu, sigmoid, gelu, elu, softplus, hardtanh, threshold, ...

Each formula is the one ATen's CPU kernel evaluates (`cpu/Activation.cpp`,
`cpu/Gelu.h`, `cpu/Elu.h`, `cpu/UnaryOpsKernel.cpp`), operation for
operation, so results round as eager's do. float16/bfloat16 compute in
float32. A parameter (slope, alpha, threshold, ...) is converted the way the
kernel converts it with `Scalar::to<T>()` (`casts.checked`): some kernels
convert to the tensor's type (a float16 `lambd` is rounded to float16),
others to the computation type; the `_param` calls below say which.
"""

from __future__ import annotations

import functools
import math

import torch

from .. import expr as E
from ..dtype import INT64, Dtype
from .casts import checked, fits
from .registry import Ctx, LoweringError, Promotion, ScalarArg, TensorArg, pointwise


def _param(ctx: Ctx, k: int, dtype: Dtype, compute: Dtype) -> E.Expr:
    """Operand `k` as eager's kernel sees it: converted to `dtype`, then held in `compute`.

    The conversion is c10's checked one (`casts.checked`): where eager would
    raise because the value does not fit, the node runs unfused. So a number
    given at run time fuses only where every value of its type fits (e.g. a
    float slope for float64 tensors, an int one for float32 tensors).
    """
    return E.cast(compute, checked(ctx, ctx.arg(k), dtype))


def _in_dtype(ctx: Ctx, k: int, x: E.Expr) -> E.Expr:
    """Operand `k` converted to the tensor's type (`Scalar::to<scalar_t>()`)."""
    return _param(ctx, k, ctx.out_dtype, x.dtype)


def _in_compute(ctx: Ctx, k: int, x: E.Expr) -> E.Expr:
    """Operand `k` converted to the computation type (float for float16/bfloat16)."""
    return _param(ctx, k, x.dtype, x.dtype)


def _require_float(kind: str, x: E.Expr) -> None:
    if not x.dtype.is_float:
        raise LoweringError(f"{kind} of a {x.dtype} tensor")  # eager raises


def _clamp(x: E.Expr, lo: E.Expr, hi: E.Expr) -> E.Expr:
    """`std::min(std::max(x, lo), hi)`: NaN stays NaN; `hi` wins if `lo > hi`."""
    return E.Min(E.Max(x, lo), hi)


# -- activations without parameters --------------------------------------------


def _sigmoid(x: E.Expr) -> E.Expr:
    one = E.as_expr(1.0, x.dtype)
    return one / (one + E.call("exp", -x))


def _relu6_shifted(x: E.Expr) -> E.Expr:
    """clamp(x + 3, 0, 6), shared by hardsigmoid and hardswish."""
    zero, three, six = (E.as_expr(v, x.dtype) for v in (0.0, 3.0, 6.0))
    return _clamp(x + three, zero, six)


#: aten op -> its formula on a float value (float32 for float16/bfloat16).
_FORMULAS = {
    "aten::silu": lambda x: x / (E.as_expr(1.0, x.dtype) + E.call("exp", -x)),
    "aten::mish": lambda x: x * E.call("tanh", E.call("log1p", E.call("exp", x))),
    "aten::hardsigmoid": lambda x: _relu6_shifted(x) / E.as_expr(6.0, x.dtype),
    # (x * clamp(x + 3, 0, 6)) / 6, in the kernel's order.
    "aten::hardswish": lambda x: x * _relu6_shifted(x) / E.as_expr(6.0, x.dtype),
}


def _register_formula(kind: str, formula) -> None:
    @pointwise(kind, operands=(0,), overloads=("",))
    def lower(ctx: Ctx, x: E.Expr) -> E.Expr:
        _require_float(kind, x)
        return formula(x)


for _kind, _formula in _FORMULAS.items():
    _register_formula(_kind, _formula)


@pointwise("aten::sigmoid", Promotion.INT_TO_FLOAT, operands=(0,), overloads=("",))
def sigmoid(ctx: Ctx, x: E.Expr) -> E.Expr:
    return _sigmoid(x)


@pointwise("aten::relu", operands=(0,), overloads=("",))
def relu(ctx: Ctx, x: E.Expr) -> E.Expr:
    """clamp_min(x, 0): -0. and NaN pass through."""
    if x.dtype.is_bool:
        raise LoweringError("relu of a bool tensor")  # eager raises
    return E.Max(x, E.as_expr(0, x.dtype))


# -- clamping ---------------------------------------------------------------------


def _hardtanh_limit(ctx: Ctx, k: int, x: E.Expr) -> E.Expr:
    """A hardtanh limit: integer tensors take it truncated to int64 first (`toLong()`)."""
    arg = ctx.arg(k)
    if x.dtype.is_float or not (isinstance(arg, ScalarArg) and arg.const is not None):
        return _in_dtype(ctx, k, x)  # run-time limits of integer ops: int64 numbers only
    if not fits(arg.const, INT64):
        raise LoweringError(f"{arg.const} does not fit int64: eager raises")
    limit = int(arg.const)
    if not x.dtype.is_signed and limit < 0:
        raise LoweringError("hardtanh on an unsigned type with negative limits")  # as eager
    if not fits(limit, x.dtype):
        raise LoweringError(f"{limit} does not fit {x.dtype}: eager raises")
    return E.as_expr(limit, x.dtype)


def _nan_limit(ctx: Ctx, ks: tuple[int, ...]) -> E.Expr | None:
    """Whether a float limit given at run time is NaN (then clamp fills with NaN)."""
    checks = [
        E.cmp("!=", a.expr, a.expr)
        for a in (ctx.arg(k) for k in ks)
        if isinstance(a, ScalarArg) and a.const is None and a.expr.dtype.is_float
    ]
    if not checks:
        return None
    out = checks[0]
    for c in checks[1:]:
        out = E.Or(out, c)
    return out


def _hardtanh(ctx: Ctx, x: E.Expr, lo_k: int | None, hi_k: int | None) -> E.Expr:
    """clamp(x, min, max) as hardtanh calls it; relu6 is hardtanh(x, 0, 6)."""
    if x.dtype.is_bool:
        raise LoweringError("hardtanh of a bool tensor")  # eager raises
    if lo_k is None:
        return _clamp(x, E.as_expr(0, x.dtype), E.as_expr(6, x.dtype))
    consts = [a.const for a in (ctx.arg(lo_k), ctx.arg(hi_k)) if isinstance(a, ScalarArg)]
    if x.dtype.is_float and any(isinstance(c, float) and math.isnan(c) for c in consts):
        return E.as_expr(math.nan, x.dtype)  # eager fills the output with NaN
    out = _clamp(x, _hardtanh_limit(ctx, lo_k, x), _hardtanh_limit(ctx, hi_k, x))
    nan = _nan_limit(ctx, (lo_k, hi_k)) if x.dtype.is_float else None
    return out if nan is None else E.select(nan, E.as_expr(math.nan, x.dtype), out)


@pointwise("aten::hardtanh", operands=(0,), overloads=("",))
def hardtanh(ctx: Ctx, x: E.Expr) -> E.Expr:
    return _hardtanh(ctx, x, 1, 2)


@pointwise("aten::relu6", operands=(0,), overloads=("",))
def relu6(ctx: Ctx, x: E.Expr) -> E.Expr:
    return _hardtanh(ctx, x, None, None)


@pointwise("aten::threshold", operands=(0,), overloads=("",))
def threshold(ctx: Ctx, x: E.Expr) -> E.Expr:
    """`x <= threshold ? value : x`; float16/bfloat16 compare with a float threshold."""
    if x.dtype.is_bool:
        raise LoweringError("threshold of a bool tensor")  # eager raises
    limit = _in_compute(ctx, 1, x) if ctx.out_dtype.is_reduced_float else _in_dtype(ctx, 1, x)
    return E.select(E.cmp("<=", x, limit), _in_dtype(ctx, 2, x), x)


@pointwise("aten::hardshrink", operands=(0,), overloads=("",))
def hardshrink(ctx: Ctx, x: E.Expr) -> E.Expr:
    """`-lambd <= x <= lambd ? 0 : x`, with lambd in the tensor's type."""
    _require_float("hardshrink", x)
    lambd = _in_dtype(ctx, 1, x)
    inside = E.And(E.cmp(">=", x, -lambd), E.cmp("<=", x, lambd))
    return E.select(inside, E.as_expr(0.0, x.dtype), x)


# -- activations with float parameters ---------------------------------------------


@pointwise("aten::leaky_relu", operands=(0,), overloads=("",))
def leaky_relu(ctx: Ctx, x: E.Expr) -> E.Expr:
    _require_float("leaky_relu", x)
    return E.select(E.cmp(">", x, E.as_expr(0.0, x.dtype)), x, x * _in_compute(ctx, 1, x))


@pointwise("aten::elu", operands=(0,), overloads=("",))
def elu(ctx: Ctx, x: E.Expr) -> E.Expr:
    """`x < 0 ? expm1(x * input_scale) * (alpha * scale) : x * scale`."""
    _require_float("elu", x)
    alpha, scale, input_scale = (_in_compute(ctx, k, x) for k in (1, 2, 3))
    negative = E.call("expm1", x * input_scale) * (alpha * scale)
    return E.select(E.cmp("<", x, E.as_expr(0.0, x.dtype)), negative, x * scale)


@pointwise("aten::softplus", operands=(0,), overloads=("",))
def softplus(ctx: Ctx, x: E.Expr) -> E.Expr:
    """`x * beta > threshold ? x : log1p(exp(x * beta)) / beta`."""
    _require_float("softplus", x)
    beta, limit = _in_compute(ctx, 1, x), _in_compute(ctx, 2, x)
    scaled = x * beta
    smooth = E.call("log1p", E.call("exp", scaled)) / beta
    return E.select(E.cmp(">", scaled, limit), x, smooth)


# gelu's constants, rounded to the computation type as ATen's are.
_SQRT1_2 = math.sqrt(0.5)
_GELU_BETA = math.sqrt(2.0) * (2.0 / math.sqrt(math.pi)) * 0.5  # M_SQRT2 * M_2_SQRTPI * 0.5
_GELU_KAPPA = 0.044715


#: mkldnn_bf16_device_check() / mkldnn_fp16_device_check() (native/mkldnn/Utils.h) as torch
#: exposes them: ideep's has_bf16_type_support() / has_fp16_type_support(), which ask oneDNN's
#: effective ISA (the CPU, capped by ONEDNN_MAX_CPU_ISA; not ATEN_CPU_CAPABILITY).
_ONEDNN_DEVICE_CHECKS = {
    "bfloat16": "_is_mkldnn_bf16_supported",
    "float16": "_is_mkldnn_fp16_supported",
}


def _onednn_device_check(dtype: str) -> bool:
    check = getattr(torch.ops.mkldnn, _ONEDNN_DEVICE_CHECKS[dtype], None)
    return check is not None and bool(check())


def _gelu_uses_onednn(ctx: Ctx) -> bool | E.Expr:
    """Whether eager computes this gelu with oneDNN (`use_mkldnn` in native/Activation.cpp):
    a bool, or in a dynamic kernel whose input's sizes are symbols the condition on them.

    ATen's condition: oneDNN enabled (as it is by default), a contiguous input
    of two or more elements, and float32, or bfloat16 where
    `mkldnn_bf16_device_check()` holds, or float16 where
    `mkldnn_fp16_device_check()` holds (AVX512-FP16 or AVX-NE-CONVERT CPUs).
    The setting is read when the kernel is built (kernels are cached by graph). A dynamic
    kernel keeps its inputs' layout but not their sizes: profiled on an empty tensor, it
    serves inputs of many elements too, so the count is checked where the kernel runs.
    """
    dtype = ctx.out_dtype.name
    if dtype not in ("float32", "bfloat16", "float16") or not torch.backends.mkldnn.is_available():
        return False
    if not torch.backends.mkldnn.enabled:
        return False
    if dtype != "float32" and not _onednn_device_check(dtype):
        return False
    ty = ctx.node.inputsAt(0).type()
    sizes, strides = ty.sizes(), ty.strides()
    if sizes is None or strides is None or None in sizes or None in strides:
        raise LoweringError("gelu of a tensor of unknown layout")
    expected = 1  # (the strides of a contiguous layout: an empty dim counts as 1, as torch's)
    for size, stride in reversed(list(zip(sizes, strides))):
        if size != 1 and stride != expected:
            return False
        expected *= max(size, 1)
    arg = ctx.arg(0)
    numel = math.prod(arg.shape) if isinstance(arg, TensorArg) else math.prod(sizes)
    return numel > 1 if isinstance(numel, int) else E.cmp(">", numel, 1)


@functools.cache
def _onednn_gelu_is_avx512(dtype: str) -> bool:
    """Whether oneDNN's gelu kernel for `dtype` is its AVX-512 one (erf as a polynomial).

    That kernel computes `x * (1 + erf) * 0.5` and makes gelu(+inf) NaN; its
    AVX2 kernel computes `0.5x + 0.5x * erf` from exp and, at the extremes,
    agrees with ATen. Which kernel runs is oneDNN's own choice (the CPU, capped
    by ONEDNN_MAX_CPU_ISA), which torch does not expose: this asks eager once,
    with an input that `use_mkldnn` sends to oneDNN (the caller checked that it
    would send this dtype there).
    """
    x = torch.tensor([math.inf, 0.0], dtype=getattr(torch, dtype))
    return bool(torch.nn.functional.gelu(x)[0].isnan())


@pointwise("aten::gelu", operands=(0,), overloads=("",))
def gelu(ctx: Ctx, x: E.Expr) -> E.Expr:
    """approximate="none": `x * 0.5 * (1 + erf(x * M_SQRT1_2))`;
    "tanh": `0.5 * x * (1 + tanh(beta * (x + kappa * x^3)))`."""
    _require_float("gelu", x)
    approximate = ctx.const(1) if len(ctx.args) > 1 else "none"
    half, one = E.as_expr(0.5, x.dtype), E.as_expr(1.0, x.dtype)
    if approximate == "tanh":
        cube = x * x * x
        inner = E.as_expr(_GELU_BETA, x.dtype) * (x + E.as_expr(_GELU_KAPPA, x.dtype) * cube)
        return half * x * (one + E.call("tanh", inner))
    if approximate != "none":
        raise LoweringError(f"gelu approximate={approximate!r}")
    erf = E.call("erf", x * E.as_expr(_SQRT1_2, x.dtype))
    atens = x * half * (one + erf)  # ATen's, or within rounding oneDNN's AVX2 kernel's
    onednn = _gelu_uses_onednn(ctx)
    if onednn is False or not _onednn_gelu_is_avx512(ctx.out_dtype.name):
        return atens
    # oneDNN's AVX-512 eltwise_gelu_erf: x * (1 + erf) * 0.5, so x > FLT_MAX / 2 overflows;
    # and its erf polynomial, evaluated at |x| = inf, makes gelu(+inf) NaN.
    inf = E.cmp("==", x, E.as_expr(math.inf, x.dtype))
    onednns = E.select(inf, E.as_expr(math.nan, x.dtype), x * (one + erf) * half)
    return onednns if onednn is True else E.select(onednn, onednns, atens)
