"""cast_cache: a weight's reduced-precision copy, made once per version of the weight.

Under autocast, eager casts a float32 parameter to the autocast dtype for every GEMM that
reads it, and keeps the copy only until the autocast region ends. The graph op
`nncfuse::autocast_weight(w, dtype, module_state)` (`autocast_casts.py` puts it where a
parameter or buffer is cast) returns `w.to(dtype)` from a cache kept across calls:

    %wb = aten::to(%w, 15, False, False, None)    ->    %wb = nncfuse::autocast_weight(%w, 15, True)

An entry is keyed by the tensor's identity (a weak key: it goes with the tensor) and
remembers the tensor's `_version` and data pointer, so an in-place update (an optimizer's
step, `load_state_dict`'s `copy_`) or new storage (`p.data = t`) makes a new copy. (An
update through `.data`'s alias bumps no version: eager's own cache has the same blind spot
only within one region, this one across calls; `.data` writes are outside the contract.)
What may be cached is what eager caches (a float32 leaf that requires grad, not a view) and
a module's own state (`module_state`: read by `prim::GetAttr`); anything else is cast anew.
A copy is made without autograd; a tensor that needs autograd here is cast anew.
"""

from __future__ import annotations

import threading
import weakref
from functools import partial
from typing import Any

import torch
from torch.utils.weak import WeakIdKeyDictionary

KIND = "nncfuse::autocast_weight"
#: the casts of many weights in one call (a call of a Python op costs about 8 us)
BATCH_KIND = "nncfuse::autocast_weights"
#: a 4-d weight in channels-last memory, once per version
LAYOUT_KIND = "nncfuse::channels_last_weight"
#: the nodes that give a graph state the next call reads again: a module's attribute, a graph
#: input (the backend's graphs take the parameters as inputs)
STATE_KINDS = ("prim::GetAttr", "prim::Param")

#: tensor -> {dtype: (version, data pointer, copy)}
_copies: WeakIdKeyDictionary = WeakIdKeyDictionary()
#: re-entrant: a weak reference's callback (`_forget_batch`) may run inside a locked region, when
#: what the region drops was the last reference to a tensor
_lock = threading.RLock()


def cached_cast(tensor: torch.Tensor, dtype: torch.dtype, module_state: bool) -> torch.Tensor:
    """`tensor.to(dtype)`, from the cache where `tensor` is a weight that has not changed."""
    if tensor.dtype == dtype:
        return tensor  # (as `to`: the tensor itself)
    if (torch.is_grad_enabled() and tensor.requires_grad) or tensor.is_inference() or not (
            module_state or (tensor.is_leaf and tensor.requires_grad)) or tensor._is_view():
        return tensor.to(dtype)
    key = (tensor._version, tensor.data_ptr())
    with _lock:
        entry = _copies.get(tensor)
        hit = entry is not None and entry.get(dtype)
    if hit and hit[:2] == key:
        return hit[2]
    with torch.inference_mode(False), torch.no_grad():  # (a copy that tracks its version)
        copy = tensor.to(dtype)
    with _lock:
        _copies.setdefault(tensor, {})[dtype] = (*key, copy)
    return copy


#: tensor -> (version, data pointer, its channels-last copy)
_layouts: WeakIdKeyDictionary = WeakIdKeyDictionary()


def cached_channels_last(tensor: torch.Tensor) -> torch.Tensor:
    """`tensor.contiguous(memory_format=torch.channels_last)`, made once per version of a
    4-d weight (a parameter, a buffer, or a copy this cache made) that autograd does not
    track here (`channels_last.py` puts it before a channels-last convolution's weight: ATen
    would convert the weight on every call)."""
    if (torch.is_grad_enabled() and tensor.requires_grad) or tensor.is_inference() \
            or tensor._is_view() or tensor.dim() != 4:
        return tensor.contiguous(memory_format=torch.channels_last)
    key = (tensor._version, tensor.data_ptr())
    with _lock:
        hit = _layouts.get(tensor)
    if hit is not None and hit[:2] == key:
        return hit[2]
    with torch.inference_mode(False), torch.no_grad():
        copy = tensor.contiguous(memory_format=torch.channels_last)
    with _lock:
        _layouts[tensor] = (*key, copy)
    return copy


def _cacheable(tensor: torch.Tensor, dtype: torch.dtype, module_state: bool) -> bool:
    """Whether `cached_cast` keeps `tensor`'s copy (outside autograd)."""
    return tensor.dtype != dtype and not tensor.is_inference() and not tensor._is_view() and (
        module_state or (tensor.is_leaf and tensor.requires_grad))


#: (dtype, ids of the tensors) -> (weak references to them, their keys, their copies): the
#: last result of `cached_casts` for those tensors, forgotten when one of them goes
_batches: dict[tuple[Any, ...], tuple[list[weakref.ref], list[tuple[int, int, bool]],
                                      list[torch.Tensor]]] = {}


def _keys(tensors: list[torch.Tensor]) -> list[tuple[int, int, bool]]:
    return [(t._version, t.data_ptr(), t.requires_grad) for t in tensors]


def cached_casts(tensors: list[torch.Tensor], dtype: torch.dtype,
                 module_state: list[bool]) -> list[torch.Tensor]:
    """`cached_cast` of each of `tensors`. Outside autograd, a call with the very tensors of
    the last one, unchanged, takes its copies at once: 52 weights (MobileNetV2's), 33 us a
    call of the op against 137 for a lookup of each."""
    if torch.is_grad_enabled():
        return [cached_cast(t, dtype, m) for t, m in zip(tensors, module_state)]
    ids = (dtype, *map(id, tensors))
    hit = _batches.get(ids)
    if hit is not None and all(r() is t for r, t in zip(hit[0], tensors)) \
            and hit[1] == _keys(tensors):
        return list(hit[2])
    copies = [cached_cast(t, dtype, m) for t, m in zip(tensors, module_state)]
    if all(_cacheable(t, dtype, m) for t, m in zip(tensors, module_state)):
        forget = partial(_forget_batch, ids)
        with _lock:
            _batches[ids] = ([weakref.ref(t, forget) for t in tensors], _keys(tensors), copies)
    return copies


def _forget_batch(ids: tuple[Any, ...], ref: weakref.ref) -> None:
    with _lock:
        entry = _batches.get(ids)
        if entry is not None and any(r is ref for r in entry[0]):
            del _batches[ids]


def clear() -> None:
    """Forget every copy (tests)."""
    with _lock:
        _copies.clear()
        _layouts.clear()
        _batches.clear()


_library = torch.library.Library("nncfuse", "FRAGMENT")
_library.define("autocast_weight(Tensor weight, ScalarType dtype, bool module_state) -> Tensor")
_library.impl("autocast_weight", cached_cast, "CompositeExplicitAutograd")
_library.define("autocast_weights(Tensor[] weights, ScalarType dtype, bool[] module_state) "
                "-> Tensor[]")
_library.impl("autocast_weights", cached_casts, "CompositeExplicitAutograd")
_library.define("channels_last_weight(Tensor weight) -> Tensor")
_library.impl("channels_last_weight", cached_channels_last, "CompositeExplicitAutograd")
