"""decompose: what AOTAutograd decomposes, while tracing, before the graphs are partitioned.

The torch.compile backend and `nncfuse.jit` under autograd (`autograd.py`) trace with
this table. It turns ops nncfuse has no lowering for, mostly the `*_backward` ops and
the multi-output normalizations of training graphs, into ops that fuse:

    native_layer_norm(x, [n], w, b, eps)          var, mean = var_mean(x, [-1], keepdim)
        -> out, mean, rstd                  ==>   rstd = rsqrt(var + eps)
                                                  out = (x - mean) * rstd * w + b
    var_mean(x, dims, keepdim)              ==>   var(x, dims, keepdim), mean(x, dims, keepdim)

ATen's own rules (`torch._decomp`) for the backward ops of activations, softmax,
layer and batch norm, dropout, and the normalizations themselves give elementwise
ops and reductions; nncfuse's rule for `var_mean` (two outputs: no kernel) makes
those single-output reductions, as the lowerings take them.
Forward activations and masked_fill are not decomposed: nncfuse lowers them as they are.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

aten = torch.ops.aten

#: decomposed with torch._decomp's rules (functorch's `default_decompositions` for
#: ts_compile, less forward activations, plus the normalizations' and softmax's backward)
_ATEN_RULES = (
    aten.detach, aten.gelu_backward, aten.leaky_relu_backward, aten.sigmoid_backward,
    aten.threshold_backward, aten.hardtanh_backward, aten.hardsigmoid_backward,
    aten.hardswish_backward, aten.tanh_backward, aten.silu_backward, aten.elu_backward,
    aten.is_same_size, aten.native_layer_norm_backward, aten._softmax_backward_data,
    aten._log_softmax_backward_data, aten.native_dropout, aten.native_dropout_backward,
    aten._safe_softmax, aten.native_layer_norm, aten._native_batch_norm_legit_functional,
    aten._native_batch_norm_legit, aten._native_batch_norm_legit_no_training,
    aten.native_batch_norm_backward,
)


def _var_mean(x: torch.Tensor, dim: Any = None, *, correction: Any = None,
              keepdim: bool = False) -> Any:
    """var_mean as two single-output reductions, each of which fuses."""
    return (aten.var.correction(x, dim, correction=correction, keepdim=keepdim),
            aten.mean.dim(x, dim, keepdim))


@functools.cache
def decompositions() -> dict[Any, Callable[..., Any]]:
    """The decomposition table (ops to functions of ATen ops) AOTAutograd traces with."""
    table = dict(torch._decomp.get_decompositions(list(_ATEN_RULES)))
    table[aten.var_mean.correction] = _var_mean
    return table
