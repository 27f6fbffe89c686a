"""trials: the outcomes of `external`'s GEMM and convolution trials, kept by what decides them.

Lowering an external node runs its candidate routines (plans) on random examples and keeps
the first that matches eager (`external._trial`): a few GEMMs per node, ~40% of lowering.
A model's layers repeat the same GEMMs (the same plans on operands of the same dtypes,
sizes and strides), so the outcome (which plan, its result's sizes, strides and dtype) is
kept process-wide under a key that holds everything the trial reads:

    aten::linear(x: Float(128, 256), w: Float(1024, 256), b: Float(1024)) -> gelu
    key: (node kind, overload, operands: buffers by first appearance, dtype, sizes, strides;
          constants by type and repr; each plan's routine, operands, bias and fused ops;
          threads, default dtype, autocast, oneDNN, float32 matmul precision)

The examples are drawn from a generator seeded the same way in the key's buffer order, so
equal keys run the same trial. Where the outcome may depend on something the key cannot
hold (a constant tensor's values, an operand without a hashable description, a dispatch
mode that may change what ops do), there is no key and the trial runs.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode

from .. import expr as E
from ..buffer import Buf
from .registry import schema_overload

__all__ = ["Outcome", "clear", "key", "recall", "remember", "KEPT"]

#: At most this many outcomes are kept (then all are forgotten at once).
KEPT = 4096

Key = tuple[Any, ...]


@dataclass(frozen=True)
class Outcome:
    """What a trial gave: the index of the first plan that passed (None: the node's plain
    ATen routine), and the sizes, strides and dtype of its result; or the ATen routine's
    error."""

    plan: int | None
    sizes: tuple[int, ...] = ()
    strides: tuple[int, ...] = ()
    dtype: torch.dtype | None = None
    error: str | None = None

    @staticmethod
    def of(plan: int | None, result: torch.Tensor) -> Outcome:
        return Outcome(plan, tuple(result.shape), tuple(result.stride()), result.dtype)


_kept: dict[Key, Outcome] = {}
_lock = threading.Lock()


def clear() -> None:
    """Forget every outcome."""
    with _lock:
        _kept.clear()


def recall(k: Key | None) -> Outcome | None:
    """The outcome kept under `k`, if any."""
    if k is None:
        return None
    with _lock:
        return _kept.get(k)


def remember(k: Key | None, outcome: Outcome) -> None:
    if k is None:
        return
    with _lock:
        if len(_kept) >= KEPT:
            _kept.clear()
        _kept[k] = outcome


#: Dispatch modes that run each op as it is (they check it): AOTAutograd runs a compiled
#: graph's first call in `_AnalyzeCustomOpInputOutputMode`, and the backward compiles there.
_PASSING_MODES = frozenset({"_AnalyzeCustomOpInputOutputMode"})


class _NoKey(Exception):
    """The outcome may depend on something a key cannot hold."""


def key(node: Any, operands: Sequence[Any], plans: Sequence[Any],
        constants: dict[Buf, torch.Tensor], env_buf: Callable[[Any], Buf],
        sizes_of: Callable[[Buf], tuple[tuple[int, ...], tuple[int, ...]]]) -> Key | None:
    """Everything the trial of `plans` for `node` reads (see the module docstring), or None.
    Buffers are numbered by first appearance in the order the trial meets them (operands,
    then each plan's operands and the inputs of the ops it fuses)."""
    mode = _get_current_dispatch_mode()
    if mode is not None and type(mode).__name__ not in _PASSING_MODES:
        return None
    ids: dict[Buf, int] = {}

    def operand(a: Any) -> Any:
        if isinstance(a, Buf):
            if a in constants:
                raise _NoKey  # its values decide
            sizes, strides = sizes_of(a)
            return ("buf", ids.setdefault(a, len(ids)), a.dtype, tuple(sizes), tuple(strides))
        if isinstance(a, E.Expr):
            return ("expr",)  # the trial passes 1
        return _constant(a)

    def fused_ops(nodes: Sequence[Any]) -> tuple[Any, ...]:
        prev, described = node.output(), []
        for n in nodes:
            inputs = tuple(("prev",) if v == prev
                           else ("const", _constant(v.toIValue()))
                           if v.node().kind() == "prim::Constant"
                           else ("value", operand(env_buf(v))) for v in n.inputs())
            described.append((n.kind(), schema_overload(n), inputs))
            prev = n.output()
        return tuple(described)

    try:
        described = (
            node.kind(), schema_overload(node), tuple(operand(a) for a in operands),
            tuple((p.fn, tuple(operand(a) for a in p.args),
                   None if p.bias is None else operand(p.bias), fused_ops(p.folded))
                  for p in plans),
        )
    except Exception:  # noqa: BLE001 - whatever the trial would meet there, it meets itself
        return None
    return (*described, type(mode).__name__, torch.get_num_threads(), torch.get_default_dtype(),
            torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu"),
            torch._C._get_mkldnn_enabled(), torch.get_float32_matmul_precision())


def _constant(value: Any) -> Any:
    """A hashable description of a constant operand that tells apart what compares equal
    (1, 1.0 and True; 0.0 and -0.0)."""
    if isinstance(value, (tuple, list)):
        return (type(value).__name__, tuple(_constant(v) for v in value))
    if value is None or isinstance(value, (bool, int, float, str, torch.dtype, torch.device)):
        return (type(value).__name__, repr(value))
    raise _NoKey
