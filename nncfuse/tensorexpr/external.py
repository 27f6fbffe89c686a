"""external: the library routines an `ExternalCall` may name, and when oneDNN fuses post-ops.

nncfuse writes no GEMM or convolution: an `ExternalCall(buf, fn, args)` runs
`ROUTINES[fn](*args)`, a routine torch exports, and the kernel's loops read
its result. Two families:

- `nnc_aten_<op>`: the ATen op itself (`torch.ops.aten.<op>.default`), called
  with the node's operands in schema order; the group's elementwise epilogue
  then runs over the whole output in nncfuse's loops;
- `nnc_mkldnn_*_pointwise`: oneDNN's fused kernels (what torch.compile's CPU
  backend calls): `_linear_pointwise(x, w, b, attr, scalars, algorithm)` and
  `_convolution_pointwise(x, w, b, padding, stride, dilation, groups, attr,
  scalars, algorithm)` apply a unary post-op (`POST_OPS`) inside the routine,
  each output block while it is in cache; the `.binary` overloads add a
  residual (`add`) and then, optionally, a unary post-op;
- `nnc_mkldnn_convolution_bn_pointwise`: an inference batch norm folded into
  the convolution's weights and bias (on every call: they may change), then
  `_convolution_pointwise`;
- `..._packed`: the convolution routines with the weight in oneDNN's blocked
  layout (`mkldnn._reorder_convolution_weight`, what torch.compile's freezing
  does), packed on the first call and kept while the weight is the same
  tensor at the same `_version` (`packed_weight`); for a channels-last
  input, whose output oneDNN writes channels-last;
- `..._reused`: a bfloat16 weight that is not a constant but the same tensor at the same
  `_version` as at an earlier call (a parameter, or the cast cache's copy of one) packed
  the same way from its second call (`reused_weight`), a weight that is new at every
  call never; oneDNN reorders an unpacked weight inside every call (bfloat16, 1 thread:
  a 1x1 convolution of 160 -> 1280 channels at 2x2 178 us against 54 packed, a linear
  of one row 1024 -> 2816 228 us against 99, of 32 rows 256 -> 1024 106 against 94);
- `nnc_mkl_linear_packed`, `nnc_mkl_mm_packed`: MKL's GEMM on a weight packed
  the same way (`mkl._mkl_reorder_linear_weight`, what torch.compile's freezing
  does for float32), for a constant weight (a frozen module's);
- `nnc_mkldnn_mm`: `x @ w` as oneDNN's linear of `w.t()`, no bias, no post-op: the
  float32 GEMM where MKL's is the slower one (`mkl_sgemm_fast`).

oneDNN takes float32 and bfloat16 (this torch: not float64; bfloat16 only where
`torch.ops.mkldnn._is_mkldnn_bf16_supported()`); `onednn_dtype_ok` says so.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache, partial
from typing import Any

import torch

from ..config import cpu_info

#: aten kinds that run as an external call inside a group, and how many leading tensor
#: operands each takes (the rest are constants or numbers)
ATEN_EXTERNALS: dict[str, int] = {
    "aten::linear": 3,
    "aten::matmul": 2,
    "aten::mm": 2,
    "aten::bmm": 2,
    "aten::addmm": 3,
    "aten::conv1d": 3,
    "aten::conv2d": 3,
    "aten::_convolution": 3,
    "aten::convolution": 3,  # (what AOTAutograd's graphs hold)
}


#: The ATen externals whose `torch` function is exactly `aten::<op>.default` for the operands
#: a node passes (one overload, the schema's argument names): routine `nnc_aten_<op>` calls
#: it, the unboxed binding eager's `torch.mm` is, rather than the `OpOverload` (its Python
#: `__call__`, then a boxed call). The same kernel, bit for bit, for less code per call,
#: which counts in a training step, where each call finds the caches emptied by the GEMM
#: before it: a 4x4 mm after a cache flush 38 us against 47 (warm 3.4 against 4.5). As eager's
#: calls do (the interpreter's do not), they see a `__torch_function__` mode in effect.
BINDINGS: dict[str, Callable[..., torch.Tensor]] = {
    "aten::mm": torch.mm,
    "aten::bmm": torch.bmm,
    "aten::addmm": torch.addmm,
    "aten::matmul": torch.matmul,
    "aten::linear": torch._C._nn.linear,
}


def aten_op(kind: str, overload: str = "default",
            via: Callable[..., torch.Tensor] | None = None) -> Callable[..., torch.Tensor]:
    """`torch.ops.aten.<kind>.<overload>` (or `via`, a binding of that very overload), called
    with the node's operands in schema order (keyword-only ones passed by name, as
    TorchScript lists them all positionally)."""
    op = getattr(getattr(torch.ops.aten, kind.split("::")[1]), overload)
    fn = op if via is None else via
    names = [a.name for a in op._schema.arguments]
    first = next((k for k, a in enumerate(op._schema.arguments) if a.kwarg_only), len(names))
    if first == len(names):
        return fn

    def call(*args: Any) -> torch.Tensor:
        return fn(*args[:first], **dict(zip(names[first:], args[first:])))

    return call


#: oneDNN's fused routines, called with the node's operands (sequences of ints and scalars
#: as tuples): the overloads themselves, no Python between
_linear_pointwise = torch.ops.mkldnn._linear_pointwise.default
_linear_binary = torch.ops.mkldnn._linear_pointwise.binary
_conv_pointwise = torch.ops.mkldnn._convolution_pointwise.default
_conv_binary = torch.ops.mkldnn._convolution_pointwise.binary


#: id(weight) -> (a weak reference to it, {key: its packed form}); one form per weight
_packed: dict[int, tuple[weakref.ref, dict[tuple[Any, ...], torch.Tensor]]] = {}
#: re-entrant: a weak reference's callback (`_forget`) may run inside a locked region
_packed_lock = threading.RLock()


def packed_weight(w: torch.Tensor, key: tuple[Any, ...],
                  pack: Callable[[torch.Tensor], torch.Tensor],
                  owner: torch.Tensor | None = None) -> torch.Tensor:
    """`pack(w)`, computed once per weight tensor (or `owner`, the tensor `w` is a view of),
    `_version` (an in-place write is seen) and `key` (the call's geometry), and forgotten
    with the tensor."""
    owner = w if owner is None else owner
    if w.is_inference():  # (it tracks no version: an in-place write would not be seen)
        return pack(w)
    key = _form_key(w, key)
    entry = _packed.get(id(owner))
    if entry is not None and entry[0]() is owner and key in entry[1]:
        return entry[1][key]
    packed = pack(w.detach())
    with _packed_lock:
        entry = _packed.get(id(owner))
        if entry is None or entry[0]() is not owner:
            entry = (weakref.ref(owner, partial(_forget, id(owner))), {})
            _packed[id(owner)] = entry
        entry[1].clear()  # an older version, or another geometry: keep one packed form
        entry[1][key] = packed
    return packed


def _form_key(w: torch.Tensor, key: tuple[Any, ...]) -> tuple[Any, ...]:
    """What a packed form of `w` for `key` depends on: its version, sizes, strides, dtype."""
    return (w._version, tuple(w.shape), w.stride(), w.dtype, *key)


def _conv_geometry(x: torch.Tensor, padding: Any, stride: Any, dilation: Any,
                   groups: int) -> tuple[Any, ...]:
    """The key of a convolution's packed weight (`_pack_conv`'s operands after the weight)."""
    return (tuple(padding), tuple(stride), tuple(dilation), groups, tuple(x.shape))


def _pack_conv(geometry: tuple[Any, ...], w: torch.Tensor) -> torch.Tensor:
    """`w` in oneDNN's blocked layout for a convolution of this geometry."""
    padding, stride, dilation, groups, input_size = geometry
    return torch.ops.mkldnn._reorder_convolution_weight(
        w, list(padding), list(stride), list(dilation), groups, list(input_size))


def _forget(key: int, ref: weakref.ref) -> None:
    with _packed_lock:
        if key in _packed and _packed[key][0] is ref:
            del _packed[key]
        if key in _sightings and _sightings[key][0] is ref:
            del _sightings[key]


#: id(weight) -> (a weak reference to it, the key of the call that saw it last)
_sightings: dict[int, tuple[weakref.ref, tuple[Any, ...]]] = {}


def reused_weight(w: torch.Tensor, key: tuple[Any, ...],
                  pack: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor | None:
    """`packed_weight(w, key, pack)` where a call before this one saw the same tensor `w` (or
    a view of the same tensor, alike), at the same `_version` and storage, with the same
    `key`; else None, and this call is seen. A weight that is a new tensor at every call (a
    cast that autograd records), or an inference tensor (it has no version), is never
    packed; one that is the same (a parameter, the cast cache's copy, their transposes) is
    from its second call on, and again from the second call after it changes."""
    if w.is_inference():  # (it tracks no version: an in-place write would not be seen)
        return None
    owner = w if w._base is None else w._base
    key = (w.data_ptr(), *key)
    form = _form_key(w, key)
    entry = _packed.get(id(owner))
    if entry is not None and entry[0]() is owner and form in entry[1]:
        return entry[1][form]
    seen = _sightings.get(id(owner))
    if seen is not None and seen[0]() is owner and seen[1] == form:
        return packed_weight(w, key, pack, owner)
    with _packed_lock:
        _sightings[id(owner)] = (weakref.ref(owner, partial(_forget, id(owner))), form)
    return None


def _conv_pointwise_packed(x, w, b, padding, stride, dilation, groups, attr, scalars,  # noqa: ANN001, ANN202, E501
                           algorithm):
    geometry = _conv_geometry(x, padding, stride, dilation, groups)
    packed = packed_weight(w, geometry, partial(_pack_conv, geometry))
    return _conv_pointwise(x, packed, b, padding, stride, dilation, groups, attr, scalars,
                           algorithm)


def _conv_binary_packed(x, other, w, b, padding, stride, dilation, groups, *post):  # noqa: ANN001, ANN002, ANN202, E501
    geometry = _conv_geometry(x, padding, stride, dilation, groups)
    packed = packed_weight(w, geometry, partial(_pack_conv, geometry))
    return _conv_binary(x, other, packed, b, padding, stride, dilation, groups, *post)


# oneDNN's float32 channels-last convolution of an unpacked weight reorders it slowly (1
# thread, 512 -> 512 channels, 3x3 at 7x7: 14.6 ms, of which reordering 9.8, against 3.1 ms
# for the NCHW convolution and 1.8 packed): until the weight is packed, a float32 one runs in
# NCHW, its input and result converted (a weight that is new at every call always does).
def _conv_unpacked(conv: Callable[..., torch.Tensor], x: torch.Tensor, others: tuple[Any, ...],
                   w: torch.Tensor, *rest: Any) -> torch.Tensor:
    """`conv(x, *others, w, *rest)` of a weight not packed: a float32 one in NCHW, `x` and
    `others` converted."""
    if x.dtype != torch.float32:
        return conv(x, *others, w, *rest)
    nchw = conv(x.contiguous(), *(t.contiguous() for t in others), w.contiguous(), *rest)
    return nchw.contiguous(memory_format=torch.channels_last)


def _conv_pointwise_call(packed, x, w, *rest):  # noqa: ANN001, ANN002, ANN202
    if packed is None:
        return _conv_unpacked(_conv_pointwise, x, (), w, *rest)
    return _conv_pointwise(x, packed, *rest)


def _conv_binary_call(packed, x, other, w, *rest):  # noqa: ANN001, ANN002, ANN202
    if packed is None:
        return _conv_unpacked(_conv_binary, x, (other,), w, *rest)
    return _conv_binary(x, other, packed, *rest)


def _linear_pointwise_call(packed, x, w, *rest):  # noqa: ANN001, ANN002, ANN202
    return _linear_pointwise(x, w if packed is None else packed, *rest)


def _linear_binary_call(packed, x, other, w, *rest):  # noqa: ANN001, ANN002, ANN202
    return _linear_binary(x, other, w if packed is None else packed, *rest)


def _conv_packing(x: torch.Tensor, w: torch.Tensor, padding: Any, stride: Any, dilation: Any,
                  groups: int, *post: Any) -> torch.Tensor | None:
    """`reused_weight` of a convolution's weight, for this geometry (`post`: the post-ops'
    operands, which the packed form does not depend on)."""
    geometry = _conv_geometry(x, padding, stride, dilation, groups)
    return reused_weight(w, geometry, partial(_pack_conv, geometry))


# A linear's weight is packed for the row count of the call that packs it, and serves any:
# bfloat16, 1 thread, 1024 -> 2816, packed for 1, 32 or 128 rows, each ran 1, 32 and 128 rows
# at the same speed (99-106, 839-846, 3585-3741 us), so a decode's and a prefill's calls
# share one form (the row count in the key made them repack each other in turn).
def _linear_packing(x: torch.Tensor, w: torch.Tensor, *post: Any) -> torch.Tensor | None:
    """`reused_weight` of a linear's weight (`x` gives the row count to pack for; the packed
    form does not depend on `post`, the post-ops' operands)."""
    return reused_weight(w, ("onednn",), partial(_pack_linear, _rows(x)))


@dataclass(frozen=True)
class _Reusing:
    """A `_reused` routine: its operands' weight is at `weight`, the bias after it;
    `packing(x, w, *rest)` (`rest`: the operands after the bias) gives the weight's packed
    form or None; `call(packed, *operands)` computes. `by_size`: the packed form depends on
    the first operand's sizes too."""

    weight: int
    packing: Callable[..., torch.Tensor | None]
    call: Callable[..., torch.Tensor]
    by_size: bool

    def packed(self, args: tuple[Any, ...]) -> torch.Tensor | None:
        return self.packing(args[0], args[self.weight], *args[self.weight + 2:])

    def __call__(self, *args: Any) -> torch.Tensor:
        return self.call(self.packed(args), *args)


_REUSING = {
    "nnc_mkldnn_convolution_pointwise_reused": _Reusing(1, _conv_packing, _conv_pointwise_call,
                                                        by_size=True),
    "nnc_mkldnn_convolution_pointwise_binary_reused": _Reusing(2, _conv_packing,
                                                               _conv_binary_call, by_size=True),
    "nnc_mkldnn_linear_pointwise_reused": _Reusing(1, _linear_packing, _linear_pointwise_call,
                                                   by_size=False),
    "nnc_mkldnn_linear_pointwise_binary_reused": _Reusing(2, _linear_packing,
                                                          _linear_binary_call, by_size=False),
}


class ReusedSite:
    """One call site of a `_reused` routine (one `ExternalCall` of one kernel): the packed
    form the call before found, kept (weakly: it goes with its weight, as `_packed` has it)
    with the weight tensor it is for (weakly), its version, storage, sizes and strides, and
    the input's sizes where they are part of the form. A call of that very weight, unchanged,
    takes it at once; any other goes through `reused_weight`:

        site(x, w, b, ...)  ->  conv(x, packed, b, ...)   # the same w, at the same version

    The lookup it saves: about 3 us of a 35 us depthwise convolution (bfloat16, 96 channels
    at 8x8), a call, 52 calls a MobileNetV2 forward. (Its state is one tuple, replaced whole:
    threads that share a site see one call's or another's.)"""

    __slots__ = ("_routine", "_last")

    def __init__(self, routine: _Reusing):
        self._routine = routine
        self._last: tuple[Any, ...] | None = None

    def __call__(self, *args: Any) -> torch.Tensor:
        routine = self._routine
        w = args[routine.weight]
        size = args[0].shape if routine.by_size else None
        seen = (w._version, w.data_ptr(), w.shape, w.stride(), size)
        last = self._last
        if last is not None and last[0]() is w and last[1] == seen:
            packed = last[2]()
            if packed is not None:
                return routine.call(packed, *args)
        packed = routine.packed(args)
        if packed is not None:
            self._last = (weakref.ref(w), seen, weakref.ref(packed))
        return routine.call(packed, *args)


def site_routine(fn: str) -> Callable[..., torch.Tensor]:
    """The callable one `ExternalCall` of `fn` runs: `ROUTINES[fn]`, or a `ReusedSite` of
    its own for a `_reused` routine."""
    routine = _REUSING.get(fn)
    return ROUTINES[fn] if routine is None else ReusedSite(routine)


def _pack_linear(rows: int, w: torch.Tensor) -> torch.Tensor:
    return torch.ops.mkldnn._reorder_linear_weight(w, rows)


def _conv_bn_pointwise(x, w, b, gamma, beta, mean, var, eps, padding, stride, dilation,  # noqa: ANN001, ANN202, E501
                       groups, attr, scalars, algorithm):
    # An inference batch norm after the convolution, folded into its weights and bias on
    # every call (parameters and statistics may change between calls), as eager computes it:
    # alpha = gamma / sqrt(var + eps), beta' = beta - mean * alpha.
    alpha = torch.rsqrt(var + eps)
    if gamma is not None:
        alpha = alpha * gamma
    shift = -mean * alpha if b is None else (b - mean) * alpha
    if beta is not None:
        shift = shift + beta
    folded = w * alpha.reshape(-1, *([1] * (w.dim() - 1)))
    return _conv_pointwise(x, folded, shift, padding, stride, dilation, groups, attr, scalars,
                           algorithm)


def _rows(x: torch.Tensor) -> int:
    return x.numel() // x.shape[-1] if x.shape[-1] else 0


def _mkl_linear_packed(x, w, b, transposed=False):  # noqa: ANN001, ANN202
    # MKL's packed GEMM (`cblas_sgemm_compute`), the weight packed once for x's row count
    # (`_mkl_linear` computes any other count unpacked). `transposed`: w is (k, n), x @ w.
    rows = _rows(x)

    def pack(t: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkl._mkl_reorder_linear_weight(t.t() if transposed else t, rows)

    packed = packed_weight(w, ("mkl", transposed, rows), pack)
    return torch.ops.mkl._mkl_linear(x, packed, w.t() if transposed else w, b, rows)


def _mkl_mm_packed(x, w):  # noqa: ANN001, ANN202
    return _mkl_linear_packed(x, w, None, transposed=True)


def _mkldnn_mm(x, w):  # noqa: ANN001, ANN202
    return torch.ops.mkldnn._linear_pointwise(x, w.t(), None, "none", [], "")


@cache
def mkl_sgemm_fast() -> bool:
    """Whether MKL's float32 GEMM is the one to call here rather than oneDNN's: torch has
    MKL, and the CPU is Intel's or of an unknown vendor. MKL picks its kernels by vendor;
    on AMD's Zen 5 (AVX-512) its sgemm ran at 83-90 GFLOPS on one thread, oneDNN's at
    130-180 (BERT's GEMMs, 128 rows, every layout of its training step: 1.6-2.1x; 128 x
    768 -> 3072 2.0x), but for small ones (oneDNN's ~14 us a call: `ONEDNN_SGEMM_WORK`)."""
    return torch._C.has_mkl and cpu_info("vendor_id") in ("GenuineIntel", None)


def mkl_packed_ok(dtype: torch.dtype) -> bool:
    """Whether MKL's packed GEMM (`nnc_mkl_*_packed`) takes `dtype` on this machine."""
    return dtype == torch.float32 and torch._C.has_mkl and hasattr(torch.ops.mkl,
                                                                    "_mkl_linear")


#: routine name -> the callable; `ExternalCall.fn` names one of these
ROUTINES: dict[str, Callable[..., torch.Tensor]] = {
    **{f"nnc_aten_{k.split('::')[1]}": aten_op(k, via=BINDINGS.get(k)) for k in ATEN_EXTERNALS},
    "nnc_mkldnn_linear_pointwise": _linear_pointwise,
    "nnc_mkldnn_linear_pointwise_binary": _linear_binary,
    "nnc_mkldnn_convolution_pointwise": _conv_pointwise,
    "nnc_mkldnn_convolution_pointwise_binary": _conv_binary,
    "nnc_mkldnn_convolution_bn_pointwise": _conv_bn_pointwise,
    "nnc_mkldnn_convolution_pointwise_packed": _conv_pointwise_packed,
    "nnc_mkldnn_convolution_pointwise_binary_packed": _conv_binary_packed,
    **_REUSING,
    "nnc_mkl_linear_packed": _mkl_linear_packed,
    "nnc_mkl_mm_packed": _mkl_mm_packed,
    "nnc_mkldnn_mm": _mkldnn_mm,
}


def aten_routine(kind: str) -> str:
    """The routine name of an aten external kind: `nnc_aten_linear` for `aten::linear`."""
    return f"nnc_aten_{kind.split('::')[1]}"


#: aten activation kind -> oneDNN post-op name; scalars and algorithm come from `post_op`.
#: Not relu, relu6 or hardtanh: oneDNN's relu and clip give 0 for NaN (`max`/`min`), where
#: eager's propagate it (`relu(conv(x))` of a NaN pixel: NaN), so the loops compute them.
POST_OPS: dict[str, str] = {
    "aten::gelu": "gelu",
    "aten::silu": "swish",
    "aten::hardswish": "hardswish",
    "aten::sigmoid": "sigmoid",
    "aten::tanh": "tanh",
}


def post_op(kind: str, consts: list[Any]) -> tuple[str, tuple[float, ...], str | None] | None:
    """(attr, scalars, algorithm) of the oneDNN post-op that computes activation `kind` with
    constant operands `consts` (after the tensor), or None if oneDNN has none for it."""
    attr = POST_OPS.get(kind)
    if attr is None:
        return None
    if kind == "aten::gelu":
        approximate = consts[0] if consts else "none"
        return (attr, (), approximate) if approximate in ("none", "tanh") else None
    return (attr, (), None) if not consts else None


def onednn_dtype_ok(dtype: torch.dtype) -> bool:
    """Whether oneDNN's fused routines take `dtype` on this machine."""
    if not torch.backends.mkldnn.is_available():
        return False
    if dtype == torch.float32:
        return True
    return dtype == torch.bfloat16 and torch.ops.mkldnn._is_mkldnn_bf16_supported()


#: below this many weight elements (a 1x1 convolution's in x out channels), and below
#: this many multiply-adds
NATIVE_1X1_WEIGHT = 1 << 16
NATIVE_1X1_WORK = 1 << 22


def native_conv_faster(batch: int, kernel: Sequence[int], stride: Sequence[int],
                       dilation: Sequence[int], weight: int, positions: int) -> bool:
    """Whether a float32 2-d convolution is faster as ATen's own routine (a GEMM) than as
    oneDNN's: a 1x1 kernel, not strided nor dilated, of fewer than 16 rows on one thread,
    where eager takes ATen's too (its `use_mkldnn` condition), of a weight of fewer than
    `NATIVE_1X1_WEIGHT` elements and fewer than `NATIVE_1X1_WORK` multiply-adds (`weight`
    times the output `positions`). Zen 4, 1 thread, with a ReLU, ATen's against oneDNN's
    fused routine with its weight packed (channels-last): 32 -> 64 at 16x16 20 against 44 us,
    96 -> 24 at 8x8 14 against 61, 64 -> 384 at 14x14 124 against 149 (4.8M), 32 -> 192 at
    28x28 129 against 133 (4.8M); oneDNN's from more work, 24 -> 144 at 56x56 323 against
    255, 16 -> 96 at 112x112 931 against 507, or larger weights, 160 -> 960 at 2x2 199
    against 45, 320 -> 1280 at 2x2 517 against 81. (Eager's condition takes ATen's for 3x3s
    of few elements too, where oneDNN's packed is 1.4-11x faster: 512 -> 512 at 2x2 3.1 ms
    against 0.27.)"""
    if not (torch.backends.mkldnn.is_available() and torch.backends.mkldnn.enabled):
        return True
    return (all(k == 1 for k in kernel) and all(v == 1 for v in (*stride, *dilation))
            and batch < 16 and torch.get_num_threads() == 1 and weight < NATIVE_1X1_WEIGHT
            and weight * positions < NATIVE_1X1_WORK)
