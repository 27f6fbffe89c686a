"""backward_ops: TorchScript decompositions of the ops autodiff's f and df graphs hold.

TorchScript's autodiff (`autodiff.py`) writes gradients with ATen's `*_backward` ops
and layer norm as `native_layer_norm` (three outputs), which nncfuse has no lowering for;
AOTAutograd's path decomposes them while tracing (`decompose.py`). Here each becomes the
graph of a scripted function, inserted in its place (`decompose`), with ATen's formulas
(`torch._decomp`), so that it fuses with its neighbours:

    %d = aten::gelu_backward(%g, %x, "none")      %c = aten::erf(aten::mul(%x, 0.7071..))
                                             ==>  ...
                                                  %d = aten::mul(%g, aten::add(%cdf, ...))

f's batch norm (`_batch_norm_impl_index`, in training or evaluation, of a contiguous
float tensor) becomes its statistics, the normalization and the writes of the running
statistics (`copy_` into them, which the fuser keeps in the kernel); df's
(`_batch_norm_impl_index_backward`) its two sums per channel and the input's gradient, so
that they fuse with the activation's backward that makes their `grad`:

    %m = fused_ge_le_mul_mul(%g, %y)                %m = fused...(%g, %y)   (ReLU6's mask)
    %dx, %dw, %db = aten::_batch_norm_     ==>      %sg = sum(%m, [0, 2, 3])
        impl_index_backward(0, %x, %m, ...)          %sgx = sum(%m * (%x - %mean) * %invstd)
                                                    %dx = %invstd * %w * (%m - %sg / n - ...)

(MobileNetV2's training step, `benchmarks/training.py --models mobilenet,resnet`: 0.91x to
0.94x Inductor's; ResNet-50's 1.15x to 1.19x; each first step 1.3x longer: more kernels.)

Only where the decomposition's constants are known in the graph (the dims of a layer
norm: the rank of its typed input and a constant normalized shape; a `_grad_sum_to_size`
of a tensor of known rank to a constant size; a batch norm's sizes and `training`, which
the variant's key fixes: `autodiff._specialize`); elsewhere the op stays, unfused.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from ...tensorexpr.meta import UNKNOWN, TensorMeta, constant, inputs_of, is_tensor, outputs_of
from ...tensorexpr.size_symbols import row_major


def gelu_backward(grad: Tensor, x: Tensor) -> Tensor:
    cdf = 0.5 * (1.0 + torch.erf(x * 0.7071067811865476))
    pdf = 0.3989422804014327 * torch.exp(x * x * -0.5)
    return grad * (cdf + x * pdf)


def gelu_tanh_backward(grad: Tensor, x: Tensor) -> Tensor:
    inner = 0.7978845608028654 * (x + 0.044715 * x * x * x)
    t = torch.tanh(inner)
    right = x * 0.5 * (1.0 - t * t) * 0.7978845608028654 * (1.0 + 3.0 * 0.044715 * x * x)
    return grad * (0.5 * (1.0 + t) + right)


def tanh_backward(grad: Tensor, y: Tensor) -> Tensor:
    return grad * (1.0 - y * y)


def sigmoid_backward(grad: Tensor, y: Tensor) -> Tensor:
    return grad * (y * (1.0 - y))


def threshold_backward(grad: Tensor, x: Tensor, threshold: float) -> Tensor:
    return torch.where(x <= threshold, 0.0, grad)


def softmax_backward(grad: Tensor, y: Tensor, dim: int) -> Tensor:
    return y * (grad - (grad * y).sum(dim, keepdim=True))


def layer_norm(x: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float,
               inner: list[int]) -> tuple[Tensor, Tensor, Tensor]:
    mean = x.mean(inner, keepdim=True)
    rstd = torch.rsqrt(torch.var(x, inner, unbiased=False, keepdim=True) + eps)
    out = (x - mean) * rstd
    if weight is not None:
        out = out * weight
    if bias is not None:
        out = out + bias
    return out, mean, rstd


def layer_norm_backward(grad: Tensor, x: Tensor, mean: Tensor, rstd: Tensor,
                        weight: Tensor | None, inner: list[int], outer: list[int],
                        n: float, mask: list[bool]
                        ) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
    x_hat = (x - mean) * rstd
    gw = grad
    if weight is not None:
        gw = grad * weight
    d_input: Tensor | None = None
    if mask[0]:
        d_input = (rstd / n) * (gw * n - gw.sum(inner, keepdim=True)
                                - x_hat * (gw * x_hat).sum(inner, keepdim=True))
    d_weight: Tensor | None = None
    if mask[1]:
        d_weight = (grad * x_hat).sum(outer)
    d_bias: Tensor | None = None
    if mask[2]:
        d_bias = grad.sum(outer)
    return d_input, d_weight, d_bias


def batch_norm(x: Tensor, weight: Tensor | None, bias: Tensor | None,
               running_mean: Tensor | None, running_var: Tensor | None, momentum: float,
               eps: float, dims: list[int], shape: list[int], channels: list[int], n: float
               ) -> tuple[Tensor, Tensor, Tensor, Tensor, int]:
    mean = x.mean(dims, keepdim=True)
    var = torch.var(x, dims, unbiased=False, keepdim=True)
    invstd = torch.rsqrt(var + eps)
    out = (x - mean) * invstd
    if weight is not None:
        out = out * weight.view(shape)
    if bias is not None:
        out = out + bias.view(shape)
    if running_mean is not None:
        running_mean.copy_(momentum * mean.view(channels) + (1.0 - momentum) * running_mean)
    if running_var is not None:
        running_var.copy_(momentum * (n / (n - 1.0)) * var.view(channels)
                          + (1.0 - momentum) * running_var)
    reserve = torch.empty([0], dtype=torch.uint8)
    return out, mean.view(channels), invstd.view(channels), reserve, 0


def batch_norm_eval(x: Tensor, weight: Tensor | None, bias: Tensor | None,
                    running_mean: Tensor, running_var: Tensor, eps: float, shape: list[int]
                    ) -> tuple[Tensor, Tensor, Tensor, Tensor, int]:
    out = (x - running_mean.view(shape)) * torch.rsqrt(running_var + eps).view(shape)
    if weight is not None:
        out = out * weight.view(shape)
    if bias is not None:
        out = out + bias.view(shape)
    reserve = torch.empty([0], dtype=torch.uint8)  # (eager saves no statistics)
    return out, torch.empty([0], dtype=x.dtype), torch.empty([0], dtype=x.dtype), reserve, 0


def batch_norm_backward(grad: Tensor, x: Tensor, weight: Tensor | None, mean: Tensor,
                        invstd: Tensor, training: bool, eps: float, dims: list[int],
                        shape: list[int], channels: list[int], n: float, mask: list[bool]
                        ) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
    if not training:  # (`invstd`: the running variance)
        invstd = torch.rsqrt(invstd + eps)
    x_hat = (x - mean.view(shape)) * invstd.view(shape)
    sum_g = grad.sum(dims, keepdim=True)
    sum_gx = (grad * x_hat).sum(dims, keepdim=True)
    d_input: Tensor | None = None
    if mask[0]:
        scale = invstd.view(shape)
        if weight is not None:
            scale = scale * weight.view(shape)
        if training:
            d_input = scale * (grad - sum_g / n - x_hat * (sum_gx / n))
        else:  # (the running statistics: constants of the input)
            d_input = scale * grad
    d_weight: Tensor | None = None
    if mask[1]:
        d_weight = sum_gx.view(channels)
    d_bias: Tensor | None = None
    if mask[2]:
        d_bias = sum_g.view(channels)
    return d_input, d_weight, d_bias


def mm(a: Tensor, b: Tensor) -> Tensor:
    return torch.mm(a, b)


def flat_mm(a: Tensor, b: Tensor, rows: list[int], out: list[int]) -> Tensor:
    return torch.mm(a.reshape(rows), b).reshape(out)


def linear(x: Tensor, w: Tensor, b: Tensor | None, rows: list[int], out: list[int]) -> Tensor:
    flat = x.reshape(rows)
    if b is None:
        return torch.mm(flat, w.t()).reshape(out)
    return (torch.mm(flat, w.t()) + b).reshape(out)  # (one kernel: an addmm stays ATen's)


def t_mm(a: Tensor, b: Tensor) -> Tensor:
    return torch.mm(b.t(), a.t())


def sum_to(x: Tensor, dims: list[int], size: list[int]) -> Tensor:
    return x.sum(dims, keepdim=True).view(size)


def sum_leading(x: Tensor, dims: list[int]) -> Tensor:
    return x.sum(dims)


def cast(x: Tensor, dtype: int) -> Tensor:
    return x.to(dtype)


def _autocast_to_reduced(node: Any) -> tuple[Any, list[Any]]:
    """Autocast's cast (`autocast_casts.differentiable_cast`) as the `to` it is on a typed
    CPU tensor: to the CPU dtype if float32 and enabled on the CPU, else the tensor."""
    x, _cuda, cpu, _cuda_dtype, dtype = node.inputs()
    if x.type().scalarType() is None or x.type().device() != torch.device("cpu"):
        raise KeyError(node)
    if x.type().dtype() != torch.float32 or not _constant(cpu):
        return None, [x]
    return cast, [x, _constant(dtype)]


def _autocast_to_full(node: Any) -> tuple[Any, list[Any]]:
    """Autocast's cast back: to float32 if float16 or bfloat16 and enabled on the CPU."""
    x, _cuda, cpu = node.inputs()
    if x.type().scalarType() is None or x.type().device() != torch.device("cpu"):
        raise KeyError(node)
    if x.type().dtype() not in (torch.float16, torch.bfloat16) or not _constant(cpu):
        return None, [x]
    return cast, [x, torch.float32]


@functools.cache
def _scripted(fn: Callable[..., Any]) -> torch._C.Graph:
    return torch.jit.script(fn).graph


def _constant(value: Any) -> Any:
    """The Python value of `value` if a constant makes it, else raises KeyError."""
    made = constant(value)
    if made is UNKNOWN:
        raise KeyError(value)
    return made


def _inserted(graph: torch._C.Graph, node: Any, value: Any) -> Any:
    with graph.insert_point_guard(node):
        return graph.insertConstant(value)


def _rank(value: Any) -> int:
    t = value.type()
    if not isinstance(t, torch._C.TensorType) or t.dim() is None:
        raise KeyError(value)
    return t.dim()


def _none(value: Any) -> bool:
    return isinstance(value.type(), torch._C.NoneType)


def _gelu_backward(node: Any) -> tuple[Any, list[Any]]:
    grad, x, approximate = node.inputs()
    kind = _constant(approximate)
    return gelu_backward if kind == "none" else gelu_tanh_backward, [grad, x]


def _threshold_backward(node: Any) -> tuple[Any, list[Any]]:
    grad, x, threshold = node.inputs()
    return threshold_backward, [grad, x, threshold]


def _softmax_backward(node: Any) -> tuple[Any, list[Any]]:
    grad, y, dim, _dtype = node.inputs()
    if grad.type().scalarType() != y.type().scalarType() or grad.type().scalarType() is None:
        raise KeyError(node)  # a softmax with a cast
    return softmax_backward, [grad, y, dim]


def _layer_norm(node: Any) -> tuple[Any, list[Any]]:
    x, shape, weight, bias, eps = node.inputs()
    rank, shape = _rank(x), _constant(shape)
    return layer_norm, [x, weight, bias, eps, list(range(rank - len(shape), rank))]


def _layer_norm_backward(node: Any) -> tuple[Any, list[Any]]:
    grad, x, shape, mean, rstd, weight, _bias, mask = node.inputs()
    rank, shape, mask = _rank(x), _constant(shape), _constant(mask)
    n = 1
    for d in shape:
        n *= d
    axis = rank - len(shape)
    if mask[1] and _none(weight) or mask[2] and _none(_bias):
        raise KeyError(node)
    return layer_norm_backward, [grad, x, mean, rstd, weight, list(range(axis, rank)),
                                 list(range(axis)), float(n), mask]


def _batch_norm_sizes(x: Any, *others: Any) -> tuple[list[int], list[int], list[int], float]:
    """A batch norm's reduced dims, broadcast shape, channels and count per channel, where
    `x` (and each of `others` that is a tensor) is float or double, of one dtype, and `x` is
    contiguous: then ATen's statistics are of that dtype too (half's are float), and the
    kernel is faster than ATen's (channels-last: slower)."""
    meta = TensorMeta.from_type(x.type())
    dtypes = {v.type().scalarType() for v in (x, *others) if not _none(v)}
    if meta is None or len(meta.sizes) < 2 or not row_major(meta) or len(dtypes) != 1 or (
            dtypes - {"Float", "Double"}):
        raise KeyError(x)
    sizes = meta.sizes
    n = 1
    for k, s in enumerate(sizes):
        n *= 1 if k == 1 else s
    shape = [1] * len(sizes)
    shape[1] = sizes[1]
    return [0, *range(2, len(sizes))], shape, [sizes[1]], float(n)


def _batch_norm(node: Any) -> tuple[Any, list[Any]]:
    x, weight, bias, running_mean, running_var, training, momentum, eps, _ = node.inputs()
    dims, shape, channels, n = _batch_norm_sizes(x, weight, bias, running_mean, running_var)
    if _constant(training) is not True:
        if _none(running_mean) or _none(running_var):
            raise KeyError(node)  # (eager raises)
        return batch_norm_eval, [x, weight, bias, running_mean, running_var, eps, shape]
    if n <= 1:
        raise KeyError(node)  # (eager raises: one value per channel)
    return batch_norm, [x, weight, bias, running_mean, running_var, momentum, eps, dims,
                        shape, channels, n]


def _batch_norm_backward(node: Any) -> tuple[Any, list[Any]]:
    (index, x, grad, weight, running_mean, running_var, save_mean, save_invstd, train,
     eps, mask, _reserve) = node.inputs()
    training, mask = _constant(train), _constant(mask)
    if _constant(index) != 0 or mask[1] and _none(weight):
        raise KeyError(node)  # (another backend's; eager raises)
    if training:
        mean, invstd = save_mean, save_invstd
    else:  # (evaluation's: of the running statistics)
        mean, invstd = running_mean, running_var
    if _none(mean) or _none(invstd):
        raise KeyError(node)
    dims, shape, channels, n = _batch_norm_sizes(x, grad, weight, mean, invstd)
    return batch_norm_backward, [grad, x, weight, mean, invstd, training, eps, dims, shape,
                                 channels, n, mask]


def _matmul(node: Any) -> tuple[Any, list[Any]]:
    a, b = node.inputs()
    if _rank(a) < 2 or _rank(b) != 2:
        raise KeyError(node)  # (a batched one: kept)
    if _rank(a) == 2:
        return mm, [a, b]
    # (a stack of rows times a matrix, as linear's input gradient: one 2-d GEMM, which
    # oneDNN's routine takes where a 3-d matmul stays ATen's)
    out, sizes = node.output().type().sizes(), b.type().sizes()
    if out is None or sizes is None:
        raise KeyError(node)
    return flat_mm, [a, b, [-1, sizes[0]], out]


def _linear(node: Any) -> tuple[Any, list[Any]]:
    x, w, b = node.inputs()
    if any(u.user.kind() != "prim::Return" for u in node.output().uses()):
        raise KeyError(node)  # (read in the graph: it may fuse with what reads it)
    if _rank(w) != 2 or not _none(b) and _rank(b) != 1:
        raise KeyError(node)
    out, sizes = node.output().type().sizes(), w.type().sizes()
    if out is None or sizes is None:
        raise KeyError(node)
    return linear, [x, w, b, [-1, sizes[1]], out]


def _t(node: Any) -> tuple[Any, list[Any]]:
    """The transpose of an `mm` read by nothing else as the `mm` of the transposed operands:
    the gradient of a weight used transposed (GPT-2's `Conv1D` as `linear(x, w.t(), b)`,
    `flat_linear.py`) comes out contiguous, as eager's, not as a transposed view that the
    kernel writes strided and AccumulateGrad copies."""
    (x,) = node.inputs()
    if x.node().kind() != "aten::mm" or len(x.uses()) != 1:
        raise KeyError(node)
    return t_mm, list(x.node().inputs())


def _grad_sum_to_size(node: Any) -> tuple[Any, list[Any]]:
    x, size = node.inputs()
    if _none(size):
        raise KeyError(node)  # peephole drops it
    rank, size = _rank(x), _constant(size)
    lead = rank - len(size)
    if lead < 0:
        raise KeyError(node)
    # (a dim of size 1 summed with keepdim is itself, whatever x's size there)
    ones = [lead + k for k, s in enumerate(size) if s == 1]
    if not ones:
        # (no dims: x itself; `sum(x, [])` would sum every dim)
        return (sum_leading, [x, list(range(lead))]) if lead else (None, [x])
    return sum_to, [x, list(range(lead)) + ones, size]


_RULES: dict[str, Callable[[Any], tuple[Any, list[Any]]]] = {
    "aten::gelu_backward": _gelu_backward,
    "aten::tanh_backward": lambda n: (tanh_backward, list(n.inputs())),
    "aten::sigmoid_backward": lambda n: (sigmoid_backward, list(n.inputs())),
    "aten::threshold_backward": _threshold_backward,
    "aten::_softmax_backward_data": _softmax_backward,
    "aten::native_layer_norm": _layer_norm,
    "aten::native_layer_norm_backward": _layer_norm_backward,
    "aten::_batch_norm_impl_index": _batch_norm,
    "aten::_batch_norm_impl_index_backward": _batch_norm_backward,
    "aten::_grad_sum_to_size": _grad_sum_to_size,
    "aten::matmul": _matmul,
    "aten::linear": _linear,
    "aten::t": _t,
    "aten::_autocast_to_reduced_precision": _autocast_to_reduced,
    "aten::_autocast_to_full_precision": _autocast_to_full,
}


def decompose(graph: torch._C.Graph) -> list[str]:
    """Replace, in place, the nodes of `graph` (top level) that `_RULES` decompose by the
    graphs of their scripted functions; the kinds left as they were. Sizes and ranks of
    typed values are folded first (a `dim()` test of matmul's backward, its permutations)."""
    _folded(graph)
    left = []
    for node in list(graph.nodes()):
        rule = _RULES.get(node.kind())
        if rule is None:
            continue
        try:
            fn, args = rule(node)
        except Exception:  # noqa: BLE001 - a constant not known (KeyError), or else: kept
            left.append(node.kind())
            continue
        if fn is None:  # the op is its input
            node.output().replaceAllUsesWith(args[0])
            node.destroy()
            continue
        values = [a if isinstance(a, torch._C.Value) else _inserted(graph, node, a)
                  for a in args]
        with graph.insert_point_guard(node):
            results = graph.insertGraph(_scripted(fn), values)
        outs = outputs_of(node)
        if len(outs) > 1 and results[0].node().kind() == "prim::TupleConstruct":
            results = inputs_of(results[0].node())  # (the construct: dead code)
        elif len(outs) > 1:  # the function returns a tuple: unpacked
            with graph.insert_point_guard(node):
                unpack = graph.create("prim::TupleUnpack", results, len(outs))
                graph.insertNode(unpack)
            results = list(unpack.outputs())
        for old, new in zip(outs, results):
            if is_tensor(old):  # (as profiled: a later rule reads its rank)
                new.setType(old.type().contiguous() if fn is t_mm else old.type())
            old.replaceAllUsesWith(new)
        node.destroy()
    _folded(graph)
    return left


def _folded(graph: torch._C.Graph) -> None:
    torch._C._jit_pass_peephole(graph, False)
    torch._C._jit_pass_remove_mutation(graph)
    torch._C._jit_pass_constant_propagation(graph)
    torch._C._jit_pass_dce(graph)
