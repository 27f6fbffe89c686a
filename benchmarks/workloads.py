"""The suite's workloads: plain PyTorch functions that eager, TorchScript, torch.compile and
nncfuse all run unchanged, with their input builders and sizes.

Every function is written out with elementwise ops (no fused library calls such
as `F.gelu`), so that each contender sees the same chain of ops. The
`element_*` families follow NNC's microbenchmarks (pytorch/pytorch
`benchmarks/tensorexpr/elementwise.py`): a binary op (mul, div) between
identity-mapped inputs, or a unary op (exp, sin) summed pairwise; "split"
reads four distinct inputs, "shared" derives all four from one input
(`a + 0.001`, ...), so a fuser reads memory once instead of four times.

The GEMM and convolution workloads (issue 14) call the library ops as models do
(`F.linear`, `F.conv2d`) and their activations as one op each (`F.gelu`,
`F.hardtanh`): what a fuser may hand to oneDNN as a post-op.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

Inputs = tuple[torch.Tensor, ...]


# -- the walkthrough's chain and common activations --------------------------------------------

def seed_chain(x):
    # As in the NNC walkthrough: mul, sin, mul, with the sin's result squared.
    y = torch.mul(x, x)
    z = torch.sin(y)
    return torch.mul(z, z)


def gelu_tanh(x):
    return 0.5 * x * (1 + torch.tanh(0.7978845608 * (x + 0.044715 * x**3)))


def bias_gelu_erf(x, b):
    # A transformer MLP's bias + gelu, the exact (erf) form, as F.gelu computes it.
    y = x + b
    return y * 0.5 * (1 + torch.erf(y * 0.7071067811865476))


def silu(x):
    return x * torch.sigmoid(x)


def swish(x):
    # NNC's swish benchmark, x * (min(relu(x), 6) + 3) / 6; NNC spells the constants as
    # full tensors (torch.min against a tensor of sixes), here they are scalars.
    return x * (torch.clamp(torch.relu(x), max=6.0) + 3.0) / 6.0


def bias_relu_residual(x, b, r):
    return torch.relu(x + b) + r


def bcast_add_mul(x, row, col):
    return (x + row) * col


def bcast_sigmoid(x, row, col):
    return torch.sigmoid(x * row + col)


def tiny_tanh(x):
    return torch.tanh(x * 2.0 + 1.0)


# -- NNC's element_{split,shared}_{mul,div,exp,sin} ---------------------------------------------
# TorchScript cannot take the op as an argument, so each member is written out.

def split_mul(a, b, c, d):
    return a * b + c * d


def shared_mul(a):
    return a * (a + 0.001) + (a + 0.002) * (a + 0.003)


def split_div(a, b, c, d):
    return a / (b + 1e-4) + c / (d + 1e-4)


def shared_div(a):
    return a / (a + 0.001 + 1e-4) + (a + 0.002) / (a + 0.003 + 1e-4)


def split_exp(a, b, c, d):
    return torch.exp(a) + torch.exp(b) + (torch.exp(c) + torch.exp(d))


def shared_exp(a):
    return torch.exp(a) + torch.exp(a + 0.001) + (torch.exp(a + 0.002) + torch.exp(a + 0.003))


def split_sin(a, b, c, d):
    return torch.sin(a) + torch.sin(b) + (torch.sin(c) + torch.sin(d))


def shared_sin(a):
    return torch.sin(a) + torch.sin(a + 0.001) + (torch.sin(a + 0.002) + torch.sin(a + 0.003))


# -- data movement inside a group: index arithmetic --------------------------------------------

def cat_relu(x, y):
    return torch.cat([x + 1, y * 2], 1).relu()


def transpose_add(x, y):
    return (x + 1).transpose(0, 1) + y


# -- reductions (issue #10): written as a model writes them ------------------------------------

def softmax_rows(x):
    return torch.softmax(x, -1)


# The normalized shape is written out: TorchScript folds only constant lists.
def layer_norm_affine(x, w, b):
    return torch.nn.functional.layer_norm(x, (768,), w, b, 1e-5)


def residual_layer_norm(x, r, w, b):
    return torch.nn.functional.layer_norm(x + r, (768,), w, b, 1e-5)


def masked_softmax(x, mask):
    # Attention's scores plus a broadcast mask (padding: batch x 1 x 1 x keys; causal:
    # 1 x 1 x queries x keys), then the softmax over the keys.
    return torch.softmax(x + mask, -1)


def instance_norm(x):
    return torch.nn.functional.instance_norm(x, eps=1e-5)


def heads_merge(x):
    # Attention's output (batch, heads, seq, head_dim) back to (batch, seq, hidden).
    b, h, s, d = x.shape
    return x.transpose(1, 2).reshape(b, s, h * d)


def sum_rows(x):
    return x.sum(-1)


def sum_cols(x):
    return x.sum(0)


def rms_norm(x, w):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w


# -- fusion patterns of issue 11: gates, rotary embeddings, chunks, pads, in-place writes -------

def lstm_cell_elementwise(gx, gh, b, c):
    # An LSTM cell after its two GEMMs (gx = x @ W_ih.t(), gh = h @ W_hh.t()).
    i, f, g, o = (gx + gh + b).chunk(4, 1)
    c2 = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
    return torch.sigmoid(o) * torch.tanh(c2), c2


def rotary_embedding(q, cos, sin):
    # Llama's apply_rotary_pos_emb on a (batch, heads, seq, dim) view of (batch, seq, hidden).
    b, s, _ = q.shape
    q = q.view(b, s, 16, 64).transpose(1, 2)
    rotated = torch.cat((-q[..., 32:], q[..., :32]), dim=-1)
    return q * cos + rotated * sin


def chunk_mul(x):
    a, g = x.chunk(2, -1)  # a gated linear unit's halves
    return a * torch.sigmoid(g)


def pad_activation(x):
    return torch.nn.functional.pad(x, (1, 1, 1, 1)).relu() * 2.0


def inplace_residual_add(x, b, r):
    # r is updated in place, as `r += relu(x + b)` in a block; the scale keeps repeated calls
    # bounded.
    r.mul_(0.5).add_(torch.relu(x + b))
    return r


# -- a GEMM or convolution with its epilogue (issue 14) -----------------------------------------

def linear_gelu(x, w, b):
    return torch.nn.functional.gelu(torch.nn.functional.linear(x, w, b))


def conv_relu(x, w, b):
    return torch.relu(torch.nn.functional.conv2d(x, w, b, 1, 1))


def dwconv_hardtanh(x, w, b):
    # MobileNetV2's depthwise 3x3 (96 channels, a constant group count) and its relu6.
    return torch.nn.functional.hardtanh(torch.nn.functional.conv2d(x, w, b, 1, 1, 1, 96), 0.0, 6.0)


def conv_bn_relu(x, w, b, mean, var, gamma, beta):
    # ResNet's conv, inference batch norm, relu (the parameters are arguments, not frozen).
    y = torch.nn.functional.conv2d(x, w, b, 1, 1)
    return torch.relu(torch.nn.functional.batch_norm(y, mean, var, gamma, beta, False, 0.1, 1e-5))


def dwconv_bn_hardtanh(x, w, b, mean, var, gamma, beta):
    # MobileNetV2's depthwise conv, batch norm and relu6.
    y = torch.nn.functional.conv2d(x, w, b, 1, 1, 1, 96)
    y = torch.nn.functional.batch_norm(y, mean, var, gamma, beta, False, 0.1, 1e-5)
    return torch.nn.functional.hardtanh(y, 0.0, 6.0)


def conv_add_relu(x, w, b, r):
    # ResNet's basic block tail: conv, residual add, relu.
    return torch.relu(torch.nn.functional.conv2d(x, w, b, 1, 1) + r)


# -- input builders: each takes the main tensor's shape --------------------------------------------

def _randn(shape: tuple[int, ...]) -> Inputs:
    return (torch.randn(shape),)


def _rand4(shape: tuple[int, ...]) -> Inputs:
    # NNC's element benchmarks draw uniform [0, 1) inputs (keeps div's denominators >= 1e-4).
    return tuple(torch.rand(shape) for _ in range(4))


def _rand1(shape: tuple[int, ...]) -> Inputs:
    return (torch.rand(shape),)


def _bias(shape: tuple[int, ...]) -> Inputs:
    return torch.randn(shape), torch.randn(shape[-1])


def _bias_residual(shape: tuple[int, ...]) -> Inputs:
    return torch.randn(shape), torch.randn(shape[-1]), torch.randn(shape)


def _affine(shape: tuple[int, ...]) -> Inputs:
    return torch.randn(shape), torch.randn(shape[-1]), torch.randn(shape[-1])


def _residual_affine(shape: tuple[int, ...]) -> Inputs:
    return torch.randn(shape), torch.randn(shape), torch.randn(shape[-1]), torch.randn(shape[-1])


def _padding_mask(shape: tuple[int, ...]) -> Inputs:
    b, _, _, k = shape
    return torch.randn(shape), torch.randn(b, 1, 1, k)


def _causal_mask(shape: tuple[int, ...]) -> Inputs:
    _, _, q, k = shape
    mask = torch.full((q, k), -1e4).triu(1)  # finite, as HF's masks: no all -inf rows
    return torch.randn(shape), mask.reshape(1, 1, q, k)


def _row_col(shape: tuple[int, ...]) -> Inputs:
    m, n = shape
    return torch.randn(shape), torch.randn(n), torch.randn(m, 1)


def _two(shape: tuple[int, ...]) -> Inputs:
    return torch.randn(shape), torch.randn(shape)


def _transposed_pair(shape: tuple[int, ...]) -> Inputs:
    return torch.randn(shape), torch.randn(shape[::-1])


def _gates(shape: tuple[int, ...]) -> Inputs:
    n, h4 = shape
    return torch.randn(shape), torch.randn(shape), torch.randn(h4), torch.randn(n, h4 // 4)


def _rotary(shape: tuple[int, ...]) -> Inputs:
    _, s, _ = shape
    return torch.randn(shape), torch.randn(s, 64), torch.randn(s, 64)


def _linear(shape: tuple[int, ...]) -> Inputs:
    m, k, n = shape  # x (m, k) @ w (n, k)^T + b: the output is (m, n)
    return torch.randn(m, k), torch.randn(n, k) / k**0.5, torch.randn(n)


def _conv(shape: tuple[int, ...]) -> Inputs:
    n, c, h, w = shape  # a 3x3 convolution, c -> c channels, padding 1
    return torch.randn(shape), torch.randn(c, c, 3, 3) / (9 * c) ** 0.5, torch.randn(c)


def _dwconv(shape: tuple[int, ...]) -> Inputs:
    n, c, h, w = shape
    return torch.randn(shape), torch.randn(c, 1, 3, 3) / 3, torch.randn(c)


def _bn(c: int) -> Inputs:
    return torch.randn(c), torch.rand(c) + 0.5, torch.randn(c), torch.randn(c)


def _conv_bn(shape: tuple[int, ...]) -> Inputs:
    return (*_conv(shape), *_bn(shape[1]))


def _conv_bn_channels_last(shape: tuple[int, ...]) -> Inputs:
    x, w, *rest = _conv_bn(shape)
    cl = torch.channels_last
    return (x.contiguous(memory_format=cl), w.contiguous(memory_format=cl), *rest)


def _dwconv_bn(shape: tuple[int, ...]) -> Inputs:
    return (*_dwconv(shape), *_bn(shape[1]))


def _conv_residual(shape: tuple[int, ...]) -> Inputs:
    return (*_conv(shape), torch.randn(shape))


@dataclass(frozen=True)
class Workload:
    """One benchmark: `fn(*build(shape))`; `quick_shape` replaces `shape` in --quick runs."""

    name: str
    fn: Callable[..., torch.Tensor]
    build: Callable[[tuple[int, ...]], Inputs]
    shape: tuple[int, ...]
    quick_shape: tuple[int, ...]
    mutates: bool = False  # writes into its inputs: the suite checks on fresh copies

    def numel(self, quick: bool = False) -> int:
        """Elements of the output (the main input's shape: broadcasts never grow it)."""
        return math.prod(self.quick_shape if quick else self.shape)

    def inputs(self, quick: bool = False) -> Inputs:
        return self.build(self.quick_shape if quick else self.shape)


_N = 1 << 22
_Q1 = (4096,)  # quick-mode shapes: tiny, so a smoke run is about compile and call overhead
_Q2 = (64, 64)


def _element_family() -> list[Workload]:
    family = []
    for op, split, shared in [
        ("mul", split_mul, shared_mul),
        ("div", split_div, shared_div),
        ("exp", split_exp, shared_exp),
        ("sin", split_sin, shared_sin),
    ]:
        family.append(Workload(f"element_split_{op}", split, _rand4, (_N,), _Q1))
        family.append(Workload(f"element_shared_{op}", shared, _rand1, (_N,), _Q1))
    return family


WORKLOADS: list[Workload] = [
    Workload("seed_1x1x128x128", seed_chain, _randn, (1, 1, 128, 128), (1, 1, 16, 16)),
    Workload("seed_1024x1024", seed_chain, _randn, (1024, 1024), _Q2),
    Workload("seed_4096x4096", seed_chain, _randn, (4096, 4096), _Q2),
    Workload("gelu_tanh", gelu_tanh, _randn, (_N,), _Q1),
    Workload("bias_gelu_erf", bias_gelu_erf, _bias, (2048, 2048), _Q2),
    Workload("silu", silu, _randn, (_N,), _Q1),
    Workload("bias_relu_residual", bias_relu_residual, _bias_residual, (2048, 2048), _Q2),
    Workload("swish", swish, _randn, (_N,), _Q1),
    *_element_family(),
    Workload("bcast_add_mul", bcast_add_mul, _row_col, (2048, 2048), _Q2),
    Workload("bcast_sigmoid", bcast_sigmoid, _row_col, (2048, 2048), _Q2),
    Workload("tiny_tanh_16", tiny_tanh, _randn, (16,), (16,)),
    Workload("cat_relu", cat_relu, _two, (1024, 512), _Q2),  # the output has 2x the elements
    Workload("transpose_add", transpose_add, _transposed_pair, (2048, 2048), _Q2),
    Workload("softmax_rows", softmax_rows, _randn, (4096, 1024), _Q2),
    Workload("layer_norm_affine", layer_norm_affine, _affine, (4096, 768), (64, 768)),
    Workload("residual_layer_norm", residual_layer_norm, _residual_affine, (4096, 768),
             (64, 768)),
    Workload("layer_norm_8192", layer_norm_affine, _affine, (8192, 768), (64, 768)),
    Workload("residual_layer_norm_8192", residual_layer_norm, _residual_affine, (8192, 768),
             (64, 768)),
    Workload("masked_softmax_pad", masked_softmax, _padding_mask, (8, 12, 128, 128),
             (2, 2, 16, 16)),
    Workload("masked_softmax_causal", masked_softmax, _causal_mask, (8, 12, 128, 128),
             (2, 2, 16, 16)),
    Workload("instance_norm", instance_norm, _randn, (32, 32, 64, 64), (2, 4, 8, 8)),
    Workload("heads_merge", heads_merge, _randn, (8, 12, 512, 64), (2, 2, 16, 8)),
    Workload("sum_rows", sum_rows, _randn, (4096, 1024), _Q2),
    Workload("sum_cols", sum_cols, _randn, (4096, 1024), _Q2),
    Workload("rms_norm", rms_norm, _bias, (4096, 768), _Q2),
    Workload("lstm_cell_elementwise", lstm_cell_elementwise, _gates, (256, 4096), (8, 256)),
    Workload("rotary_embedding", rotary_embedding, _rotary, (4, 512, 1024), (1, 8, 1024)),
    Workload("chunk_mul", chunk_mul, _randn, (2048, 2048), _Q2),
    Workload("pad_activation", pad_activation, _randn, (2046, 2046), _Q2),
    Workload("inplace_residual_add", inplace_residual_add, _bias_residual, (2048, 2048), _Q2,
             mutates=True),
    Workload("linear_gelu_mlp", linear_gelu, _linear, (128, 768, 3072), (8, 32, 64)),
    Workload("linear_gelu_b1", linear_gelu, _linear, (1, 768, 3072), (1, 32, 64)),
    Workload("conv_relu", conv_relu, _conv, (8, 64, 56, 56), (1, 8, 8, 8)),
    Workload("dwconv_hardtanh", dwconv_hardtanh, _dwconv, (8, 96, 56, 56), (1, 96, 8, 8)),
    Workload("conv_add_relu", conv_add_relu, _conv_residual, (8, 64, 56, 56), (1, 8, 8, 8)),
    Workload("conv_bn_relu", conv_bn_relu, _conv_bn, (8, 64, 56, 56), (1, 8, 8, 8)),
    Workload("conv_bn_relu_cl", conv_bn_relu, _conv_bn_channels_last, (8, 64, 56, 56),
             (1, 8, 8, 8)),
    Workload("dwconv_bn_hardtanh", dwconv_bn_hardtanh, _dwconv_bn, (8, 96, 56, 56),
             (1, 96, 8, 8)),
]


def select(patterns: list[str] | None) -> list[Workload]:
    """Workloads whose name contains any of `patterns` (all of them when None or empty)."""
    if not patterns:
        return list(WORKLOADS)
    return [w for w in WORKLOADS if any(p in w.name for p in patterns)]
