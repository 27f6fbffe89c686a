"""channels_last: reduced-precision convolutions, and what they feed, in channels-last memory.

oneDNN's bfloat16 convolutions run in channels-last (NHWC); given an NCHW input, ATen's
reorders it, and the output back, on every call: a depthwise 3x3 of 144 channels at 8x8
(1 thread) takes 59 us from NCHW against 36 from NHWC, a 1x1 of 96 -> 192 at 16x16 123 us
against 82 (torch.compile's layout optimization makes the same choice). So the profiled
graph is retyped: a bfloat16 convolution of an NCHW-contiguous input reads it converted once
to channels-last, its output and the values computed from it by ops that keep the layout
(activations, batch norm, elementwise arithmetic, zero padding: `_KEEPS`) are typed
channels-last (the kernels, whose buffers follow the types, compute them so), and any other
reader (a view, a pooling, the graph's return) reads it converted back to the profiled
NCHW-contiguous layout:

    %c : BFloat16(1, 8, 6, 6, strides=[288, 36, 6, 1]) = aten::conv2d(%x, %w, ...)
    %r : BFloat16(1, 8, 6, 6, strides=[288, 36, 6, 1]) = aten::relu(%c)
    return (%r)
                              ->
    %x.1 : BFloat16(1, 4, 6, 6, strides=[144, 1, 24, 4]) = aten::contiguous(%x, 2)
    %c : BFloat16(1, 8, 6, 6, strides=[288, 1, 48, 8]) = aten::conv2d(%x.1, %w, ...)
    %r : BFloat16(1, 8, 6, 6, strides=[288, 1, 48, 8]) = aten::relu(%c)
    %r.1 : BFloat16(1, 8, 6, 6, strides=[288, 36, 6, 1]) = aten::contiguous(%r, 0)
    return (%r.1)

Exact: only where elements are stored changes, and what the graph returns or hands to
another op has eager's layout. (A value computed unfused, by the guard's fallback, has
eager's layout instead: the next kernel's type check fails and its fallback runs, which is
exact too.) Only the top-level block. float32 convolutions too, where their weight is
module state autograd does not track (`cast_cache.STATE_KINDS`: inference), which oneDNN
then takes packed: only in a chain of them (`_chained`: one alone pays both conversions),
and not 1x1s that ATen's own routine computes faster (`native_conv_faster`).
"""

from __future__ import annotations

from collections.abc import Container
from typing import Any

import torch

from ... import log
from ...tensorexpr.external import native_conv_faster
from ...tensorexpr.meta import constant, inputs_of
from . import cast_cache

_log = log.get_logger(__file__)

#: (`convolution`: what AOTAutograd's graphs hold, under the backend)
_CONVOLUTIONS = ("aten::conv2d", "aten::_convolution", "aten::convolution")
#: ops whose result eager lays out as their (channels-last) input, computed by a kernel
#: in whatever layout its type says
_KEEPS = frozenset((
    "aten::relu", "aten::relu6", "aten::hardtanh", "aten::silu", "aten::gelu", "aten::sigmoid",
    "aten::tanh", "aten::hardswish", "aten::hardsigmoid", "aten::add", "aten::sub",
    "aten::mul", "aten::div", "aten::clamp", "aten::batch_norm", "aten::constant_pad_nd",
    "aten::pad",
    "aten::to",
    "aten::max_pool2d",  # (unfused: eager's kernel keeps a channels-last input's layout)
    # (AOTAutograd's max pool: both outputs, the values and their indices, in the input's
    # layout; from NCHW it is 15x slower: 64 channels at 32x32, 3x3 stride 2, 470 us
    # against 32)
    "aten::max_pool2d_with_indices",
))
#: float16's convolutions take no oneDNN kernel on a CPU without AVX512-FP16 (ATen's own
#: then): channels-last measured faster for plain ones (1x1, 96 -> 96 at 16x16: 700 us against
#: 1780, as under ATEN_CPU_CAPABILITY=avx2), slower for depthwise ones (892 against 731)
_REDUCED = (torch.bfloat16, torch.float16)
_CONTIGUOUS, _CHANNELS_LAST = 0, 2  # (memory_format constants, as TorchScript passes them)


def _meta(t: Any) -> torch.Tensor | None:
    """A meta tensor of the complete 4-d tensor type `t`, else None."""
    if not isinstance(t, torch._C.TensorType):
        return None
    sizes, strides, dtype = t.sizes(), t.strides(), t.dtype()
    if sizes is None or strides is None or dtype is None or None in (*sizes, *strides):
        return None
    if len(sizes) != 4:
        return None
    return torch.empty_strided(sizes, strides, dtype=dtype, device="meta")


def _nchw(value: Any) -> bool:
    """Whether `value` is a 4-d NCHW-contiguous tensor that is not channels-last as well."""
    meta = _meta(value.type())
    return meta is not None and meta.is_contiguous() and not meta.is_contiguous(
        memory_format=torch.channels_last)


def _typed(t: Any, memory_format: torch.memory_format) -> Any:
    meta = _meta(t)
    assert meta is not None
    return torch._C.TensorType.create_from_tensor(
        meta.contiguous(memory_format=memory_format)).with_device(t.device())


def _seed(node: Any) -> bool:
    """Whether `node` is a 2-d convolution (not transposed) of reduced precision, or of
    float32 with a weight of module state (`cast_cache.STATE_KINDS`), whose input and output
    are NCHW-contiguous."""
    if node.kind() not in _CONVOLUTIONS or not node.outputsSize() == 1:
        return False
    if node.kind() != "aten::conv2d" and node.inputsAt(6).toIValue() is not False:
        return False
    # float32: only where the weight is state that the next call reads again and autograd
    # does not track; oneDNN then takes it packed from the second call (`external.py`'s
    # `reused_weight`), where a channels-last convolution of an unpacked float32 weight is
    # slow (1 thread, 512 -> 512 channels, 3x3 at 7x7: NCHW 3.1 ms, channels-last 14.6 ms,
    # channels-last with the weight packed 1.8 ms; 64 -> 64 at 56x56: 3.1, 2.1, 2.0 ms;
    # depthwise 96 at 56x56: 206, 102, 91 us; 1x1 32 -> 192 at 28x28: 107, 107, 121 us)
    out, dtype, w = node.output(), node.output().type().dtype(), node.inputsAt(1)
    if w.type().dtype() != dtype or not (dtype in _REDUCED or (
            dtype == torch.float32 and w.type().requires_grad() is False
            and w.node().kind() in cast_cache.STATE_KINDS)):
        return False
    groups = node.inputsAt(6 if node.kind() == "aten::conv2d" else 8)
    if dtype == torch.float16 and not (  # (float16: only where measured faster, not grouped)
            groups.node().kind() == "prim::Constant" and groups.toIValue() == 1):
        return False
    if not (_nchw(out) and _nchw(node.inputsAt(0))):
        return False
    # float32: not where ATen's own routine is the faster (small 1x1s: `native_conv_faster`)
    return dtype != torch.float32 or not _native(node)


def _native(node: Any) -> bool:
    """Whether float32 convolution `node` is faster as ATen's own routine
    (`native_conv_faster`); not where its geometry is not constant."""
    stride, dilation = (constant(node.inputsAt(k)) for k in (3, 5))
    sizes, kernel = _meta(node.inputsAt(0).type()), _meta(node.inputsAt(1).type())
    if not (isinstance(stride, list) and isinstance(dilation, list)) \
            or sizes is None or kernel is None:
        return False
    out = _meta(node.output().type())
    return out is not None and native_conv_faster(
        sizes.shape[0], kernel.shape[2:], stride, dilation, kernel.shape[0] * kernel.shape[1],
        out.numel() // max(out.shape[1], 1))


def _keeps(node: Any, retyped: Container[int]) -> bool:
    """Whether `node` computes its 4-d values from a retyped one in the same layout."""
    if node.kind() not in _KEEPS or not all(_nchw(v) for v in node.outputs()):
        return False
    if node.kind() == "aten::pad" and not (  # (a zero pad: `F.pad(x, p)`, as traced)
            node.inputsAt(2).node().kind() == "prim::Constant"
            and node.inputsAt(2).toIValue() == "constant"):
        return False
    return any(v.unique() in retyped for v in inputs_of(node))


def _convert(graph: Any, value: Any, at: Any, memory_format: int, typ: Any,
             after: bool = False) -> Any:
    """`aten::contiguous(value, memory_format)` of type `typ`, before (or after) node `at`."""
    with graph.insert_point_guard(at):
        fmt = graph.insertConstant(memory_format)
    node = graph.create("aten::contiguous", [value, fmt], 1)
    if after:
        node.insertAfter(at)
    else:
        node.insertBefore(at)
    node.output().setType(typ)
    return node.output()


#: readers of what does not depend on the layout (a batch norm's check of its input's rank),
#: anywhere in the graph: they read a channels-last value as it is
_LAYOUT_FREE = frozenset(("aten::dim", "aten::size", "aten::numel", "aten::len",
                          "prim::dtype", "prim::device"))


def _reads_retyped(use: Any, graph: Any, seeds: set[int], retyped: set[int]) -> bool:
    """Whether the reader of `use` takes a channels-last operand: a convolution's input, an
    op retyped with it (`seeds`, `retyped`: the uniques of their outputs), or one that reads
    no layout (`_LAYOUT_FREE`)."""
    user = use.user
    if user.kind() in _LAYOUT_FREE:
        return True
    if user.owningBlock() != graph.block() or user.outputsSize() == 0:
        return False
    out = user.outputsAt(0).unique()
    return (out in seeds and use.offset == 0) or out in retyped


def _chained(seeds: dict[int, Any], nodes: list[Any]) -> set[int]:
    """The seeds (uniques of convolutions' outputs) worth retyping: reduced-precision ones,
    and float32 ones in a chain, whose input comes channels-last from an earlier seed
    (through ops that keep the layout) or whose result reaches a later one so. A float32
    convolution alone pays both conversions for itself: 96 channels depthwise 3x3 at 56x56,
    batch 8, 1 thread, 8.3 ms so against 2.5 in NCHW."""
    origin: dict[int, int] = {}  # a retyped value's unique -> the seed it comes from
    chained: set[int] = set()
    for node in nodes:
        if node.outputsSize() == 1 and node.output().unique() in seeds:
            source = origin.get(node.inputsAt(0).unique())
            if source is not None:
                chained.update((source, node.output().unique()))
            origin[node.output().unique()] = node.output().unique()
        elif _keeps(node, origin):
            source = next(origin[v.unique()] for v in inputs_of(node) if v.unique() in origin)
            for out in node.outputs():
                origin[out.unique()] = source
    return {u for u, n in seeds.items()
            if u in chained or n.output().type().dtype() != torch.float32}


def convolutions_to_channels_last(graph: torch._C.Graph) -> int:
    """Retype, in place, the reduced-precision convolutions of `graph` and what they feed to
    channels-last, converting at the edges; the count of convolutions."""
    nodes = list(graph.block().nodes())
    seeds = _chained({n.output().unique(): n for n in nodes if _seed(n)}, nodes)
    if not seeds:
        return 0
    retyped: set[int] = set()  # the uniques of values now typed channels-last
    originals: dict[int, tuple[Any, Any]] = {}  # unique -> (the value, its profiled type)
    for node in nodes:  # (in order: a node's inputs are decided before it)
        if node.outputsSize() == 1 and node.output().unique() in seeds:
            x = node.inputsAt(0)
            if x.unique() not in retyped:
                node.replaceInput(0, _convert(graph, x, node, _CHANNELS_LAST,
                                              _typed(x.type(), torch.channels_last)))
            w = node.inputsAt(1)
            if _nchw(w):  # (else ATen converts the weight on every call)
                with graph.insert_point_guard(node):
                    cl = graph.insertNode(graph.create(cast_cache.LAYOUT_KIND, [w], 1))
                cl.output().setType(_typed(w.type(), torch.channels_last))
                node.replaceInput(1, cl.output())
        elif not _keeps(node, retyped):
            continue
        for out in node.outputs():
            originals[out.unique()] = (out, out.type())
            out.setType(_typed(out.type(), torch.channels_last))
            retyped.add(out.unique())
    for value, typ in originals.values():  # readers that do not keep the layout read eager's
        readers = [u for u in value.uses() if not _reads_retyped(u, graph, seeds, retyped)]
        if readers:
            back = _convert(graph, value, value.node(), _CONTIGUOUS, typ, after=True)
            for use in readers:
                use.user.replaceInput(use.offset, back)
    _log.dump(f"After typing {len(seeds)} convolutions channels-last:\n", graph)
    return len(seeds)
