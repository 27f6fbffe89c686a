"""Profiling inside the TorchScript interpreter: what every tensor value looks like at run time.

`Profiler(graph)` inserts after each tensor-valued definition (graph and block
inputs, node outputs) a node `nncfuse::profile(%value, id)` whose Python
kernel records the tensor's dtype, sizes, strides, device and requires_grad.
Runs of the graph merge their observations per value: agreement keeps the
metadata, disagreement forgets it (the value's type stays incomplete and it
will not be fused). `finish()` removes the profile nodes and writes the
complete types into the graph, as PyTorch's profiling executor does.

requires_grad is recorded as eager autograd would see it: false under
`torch.no_grad()`.

The profiler a profile node reports to is the running thread's (`_active` is
thread-local), so other threads' graphs do not record into it; one profiler
is run by one thread at a time (the policy's lock), since merging and counting
runs are not atomic.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import torch

from ...tensorexpr.meta import TensorMeta, blocks_of, inputs_of, is_tensor, outputs_of

_PROFILE_OP = "nncfuse::profile"

_lib = torch.library.Library("nncfuse", "FRAGMENT")
_lib.define("profile(Tensor x, int id) -> ()", alias_analysis="CONSERVATIVE")
_active = threading.local()


def _profile_kernel(x: torch.Tensor | float | int | bool | None, id: int) -> None:
    profiler = getattr(_active, "profiler", None)
    if profiler is not None:
        if x is not None and not isinstance(x, torch.Tensor):
            # A wrapped number (a traced Python number) reaches Python as the number.
            x = torch.tensor(x, dtype=_WRAPPED_DTYPES[type(x)])
        profiler.record(id, x)


_WRAPPED_DTYPES = {bool: torch.bool, int: torch.int64, float: torch.float64}


_lib.impl("profile", _profile_kernel, "CompositeExplicitAutograd")


class Profiler:
    """Profile nodes in a graph, and what they observed."""

    def __init__(self, graph: torch._C.Graph):
        self.graph = graph
        self.values: list[Any] = []
        self.seen: dict[int, TensorMeta | None] = {}
        self.nodes: list[Any] = []
        self.runs = 0
        self._instrument(graph.block() if hasattr(graph, "block") else graph)

    def _instrument(self, block: Any) -> None:
        first = next(iter(block.nodes()), None)
        anchor = first if first is not None else block.returnNode()
        for value in inputs_of(block):
            self._add(value, before=anchor)
        for node in list(block.nodes()):
            if node.kind() == _PROFILE_OP:
                continue
            for sub in blocks_of(node):
                self._instrument(sub)
            after = node
            for value in outputs_of(node):
                after = self._add(value, after=after) or after

    def _add(self, value: Any, before: Any = None, after: Any = None) -> Any:
        if not is_tensor(value) or _maybe_uninitialized(value, {}):
            return None
        vid = len(self.values)
        self.values.append(value)
        const = self.graph.create("prim::Constant")
        const.i_("value", vid)
        const.output().setType(torch._C.IntType.get())
        node = self.graph.create(_PROFILE_OP, [value, const.output()], 0)
        if before is not None:
            const.insertBefore(before)
            node.insertBefore(before)
        else:
            const.insertAfter(after)
            node.insertAfter(const)
        self.nodes += [node, const]
        return node

    def record(self, vid: int, t: torch.Tensor | None) -> None:
        """Merge an observation; None (an undefined tensor) leaves the value untyped."""
        meta = None if t is None else TensorMeta.of(t)
        if vid not in self.seen:
            self.seen[vid] = meta
        elif self.seen[vid] != meta:
            self.seen[vid] = None

    def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Call `fn(*args)` (which runs the instrumented graph) with this profiler active."""
        previous = getattr(_active, "profiler", None)
        _active.profiler = self
        try:
            return fn(*args)
        finally:
            _active.profiler = previous
            self.runs += 1

    def observed(self) -> dict[int, TensorMeta]:
        """Value `unique()` -> consistent metadata, for every value seen."""
        return {
            self.values[vid].unique(): meta for vid, meta in self.seen.items() if meta is not None
        }

    def finish(self) -> dict[int, TensorMeta]:
        """Remove the profile nodes, type every consistently seen value; return the metadata."""
        metas = self.observed()
        for node in self.nodes:
            node.destroy()
        self.nodes = []
        for value in self.values:
            meta = metas.get(value.unique())
            if meta is not None:
                value.setType(meta.to_type())
        return metas


def _maybe_uninitialized(value: Any, memo: dict[int, bool]) -> bool:
    """Whether `value` may hold TorchScript's `Uninitialized` when it runs: a placeholder
    that an early `return`, `break` or `raise` leaves in the paths that skip it, carried
    through `prim::If` and `prim::Loop` (a profile node could not pass it to Python). Such
    values stay unprofiled, so untyped: they do not fuse.

        %r = prim::If(%returned)              (%r: the function's result where an early
          block0(): -> (%y)                    return ran, Uninitialized where not; the
          block1(): %u = prim::Uninitialized() later code takes it only where it ran)
                    -> (%u)
    """
    key = value.unique()
    if key in memo:
        return memo[key]
    memo[key] = False  # (a loop's carried value reaches itself: assume not, until shown)
    node = value.node()
    kind = node.kind()
    if kind == "prim::Uninitialized":
        found = True
    elif kind == "prim::Param" and node.owningBlock().owningNode() is not None:
        owner = node.owningBlock().owningNode()  # a loop body's carried value (after `i`)
        k = list(node.outputs()).index(value) - 1
        found = owner.kind() == "prim::Loop" and k >= 0 and _carried(owner, k, memo)
    elif kind == "prim::If":
        k = list(node.outputs()).index(value)
        found = any(_maybe_uninitialized(list(b.outputs())[k], memo) for b in node.blocks())
    elif kind == "prim::Loop":
        found = _carried(node, list(node.outputs()).index(value), memo)
    else:
        found = False
    memo[key] = found
    return found


def _carried(loop: Any, k: int, memo: dict[int, bool]) -> bool:
    """Whether the `k`th value `loop` carries may be Uninitialized: its initial value (after
    the trip count and condition) or what the body passes on (after the condition)."""
    body = next(iter(loop.blocks()))
    return (_maybe_uninitialized(list(loop.inputs())[k + 2], memo)
            or _maybe_uninitialized(list(body.outputs())[k + 1], memo))
