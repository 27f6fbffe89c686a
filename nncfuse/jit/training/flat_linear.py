"""flat_linear: a GEMM written between two views (GPT-2's `Conv1D`) as one `linear`.

transformers' `Conv1D` flattens its input to rows, multiplies with `addmm` and views the
result back: `addmm(b, x.view(-1, k), w).view(*x.shape[:-1], n)`. For TorchScript's
autodiff (`autodiff.py`) views are not differentiable, so such an `addmm` is a
differentiable graph of one node, below the threshold: it runs outside every graph under
eager autograd (ATen's GEMM, forward and backward, and no epilogue). The same product as a
`linear` of the unflattened input (which computes `x @ w + b` too) joins the graphs around
it (GPT-2's GELU after `c_fc`, the residual after `c_proj`), and `backward_ops.py` writes
it and its gradients as 2-d GEMMs that fuse with their neighbours:

    %v = aten::view(%x, [-1, 256])                     %t = aten::t(%w)
    %m = aten::addmm(%b, %v, %w, 1, 1)          ==>    %y = aten::linear(%x, %t, %b)
    %y = aten::view(%m, [1, 128, 768])

Only on complete types (the profiled outer graph's): the views' sizes must be the rows of
`x` and `x`'s leading sizes, the bias one-dimensional, beta and alpha the constant 1, and
neither view's result read elsewhere.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ...tensorexpr.meta import inputs_of

_VIEWS = ("aten::view", "aten::reshape")


def flat_linears(graph: torch._C.Graph) -> int:
    """Rewrite, in place, each `view`-`addmm`-`view` of `graph` (top level) that is a linear
    of the unflattened input; the count rewritten."""
    done = 0
    for node in graph.findAllNodes("aten::addmm", False):
        found = _match(node)
        if found is None:
            continue
        x, w, b, after = found
        t = graph.create("aten::t", [w])
        t.output().setType(_transposed(w.type()))
        t.insertBefore(node)
        linear = graph.create("aten::linear", [x, t.output(), b])
        linear.output().setType(after.output().type())
        linear.insertAfter(t)
        before = inputs_of(node)[1].node()
        after.output().replaceAllUsesWith(linear.output())
        after.destroy()
        node.destroy()
        before.destroy()
        done += 1
    return done


def _match(node: Any) -> tuple[Any, Any, Any, Any] | None:
    """(x, w, b, the view after) where `node`, an addmm, is a flattened linear."""
    b, v, w, beta, alpha = inputs_of(node)
    if not all(c.node().kind() == "prim::Constant" and c.toIValue() == 1 for c in (beta, alpha)):
        return None
    before = v.node()
    uses = node.output().uses()
    if before.kind() not in _VIEWS or len(v.uses()) != 1 or len(uses) != 1:
        return None
    after = uses[0].user
    if after.kind() not in _VIEWS:
        return None
    x = inputs_of(before)[0]
    shape, rows, out, bias = (_sizes(x), _sizes(v), _sizes(after.output()), _sizes(b))
    if None in (shape, rows, out, bias) or len(shape) < 2 or len(bias) != 1:
        return None
    if not isinstance(w.type(), torch._C.TensorType) or not _complete(w.type()):
        return None
    n = bias[0]
    if rows != [math.prod(shape[:-1]), shape[-1]] or out != [*shape[:-1], n]:
        return None
    return x, w, b, after


def _transposed(kind: Any) -> Any:
    """The type of `t()` of a complete 2-d tensor type `kind`: sizes and strides swapped,
    requires_grad kept (autodiff differentiates only what the types say requires grad)."""
    meta = torch.empty_strided(kind.sizes()[::-1], kind.strides()[::-1], dtype=kind.dtype(),
                               device="meta").requires_grad_(kind.requires_grad())
    return torch._C.TensorType.create_from_tensor(meta).with_device(kind.device())


def _complete(kind: Any) -> bool:
    """Whether a tensor type has sizes, strides and requires_grad all known."""
    sizes, strides = kind.sizes(), kind.strides()
    return (sizes is not None and strides is not None and None not in sizes
            and None not in strides and kind.requires_grad() is not None)


def _sizes(value: Any) -> list[int] | None:
    kind = value.type()
    if not isinstance(kind, torch._C.TensorType):
        return None
    sizes = kind.sizes()
    return None if sizes is None or None in sizes else list(sizes)
