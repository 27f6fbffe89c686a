"""decompose: what AOTAutograd decomposes, while tracing, before the graphs are partitioned.

The torch.compile backend and `nncfuse.jit` under autograd (`autograd.py`) trace with
this table. It turns ops nncfuse has no lowering for, mostly the `*_backward` ops and
the multi-output normalizations of training graphs, into ops that fuse:

    native_layer_norm(x, [n], w, b, eps)          var, mean = var_mean(x, [-1], keepdim)
        -> out, mean, rstd                  ==>   rstd = rsqrt(var + eps)
                                                  out = (x - mean) * rstd * w + b
    var_mean(x, dims, keepdim)              ==>   var(x, dims, keepdim), mean(x, dims, keepdim)
    slice_backward(g, sizes, d, a, b, 1)    ==>   constant_pad_nd(g, [0, 0, ..., a, size - b])
    select_backward(g, sizes, d, i)         ==>   constant_pad_nd(g.unsqueeze(d), [.., i, size-i-1])

ATen's own rules (`torch._decomp`) for the backward ops of activations, softmax,
layer and batch norm, dropout, and the normalizations themselves give elementwise
ops and reductions; nncfuse's rule for `var_mean` (two outputs: no kernel) makes
those single-output reductions, as the lowerings take them. The backward of a slice or a
select is the gradient put into zeros (ATen: `zeros` then a strided `copy_`, two ops and a
fill outside the groups, 16 per Llama step from rotary's halves); as a constant pad it is
index arithmetic, which fuses with the gradient's producer and consumers.
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


def _slice_range(size: int, start: int, end: int) -> tuple[int, int]:
    """A slice's start and end as ATen normalizes them (TensorShape.cpp `slice`)."""
    start, end = start + size if start < 0 else start, end + size if end < 0 else end
    start = min(max(start, 0), size)
    return start, min(max(end, start), size)


def _pads(sizes: list[int], dim: int, before: int, after: int) -> list[int]:
    """constant_pad_nd's pads (last dim first) for `before` and `after` along `dim`."""
    return [0, 0] * (len(sizes) - 1 - dim) + [before, after]


def _plain(*values: Any) -> bool:
    return all(type(v) is int for v in values)  # noqa: E721 - no SymInt (dynamic sizes)


def _slice_backward(grad: torch.Tensor, input_sizes: Any, dim: int, start: int, end: int,
                    step: int) -> Any:
    """slice_backward of step 1 as a constant pad; anything else (a step, symbolic sizes, a
    gradient that copy_ would broadcast) stays the ATen op (NotImplemented)."""
    sizes = list(input_sizes)
    if step != 1 or not sizes or not _plain(*sizes, dim, start, end):
        return NotImplemented
    dim = dim % len(sizes)
    start, end = _slice_range(sizes[dim], start, end)
    if list(grad.shape) != sizes[:dim] + [end - start] + sizes[dim + 1:]:
        return NotImplemented
    return aten.constant_pad_nd(grad, _pads(sizes, dim, start, sizes[dim] - end), 0)


def _select_backward(grad: torch.Tensor, input_sizes: Any, dim: int, index: int) -> Any:
    """select_backward as the gradient unsqueezed and padded (see `_slice_backward`)."""
    sizes = list(input_sizes)
    if not sizes or not _plain(*sizes, dim, index):
        return NotImplemented
    dim = dim % len(sizes)
    index = index + sizes[dim] if index < 0 else index
    if not 0 <= index < sizes[dim] or list(grad.shape) != sizes[:dim] + sizes[dim + 1:]:
        return NotImplemented
    pads = _pads(sizes, dim, index, sizes[dim] - index - 1)
    return aten.constant_pad_nd(aten.unsqueeze(grad, dim), pads, 0)


@functools.cache
def decompositions() -> dict[Any, Callable[..., Any]]:
    """The decomposition table (ops to functions of ATen ops) AOTAutograd traces with."""
    table = dict(torch._decomp.get_decompositions(list(_ATEN_RULES)))
    table[aten.var_mean.correction] = _var_mean
    table[aten.slice_backward.default] = _slice_backward
    table[aten.select_backward.default] = _select_backward
    return table
