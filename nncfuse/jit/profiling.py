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
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

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


@dataclass(frozen=True)
class TensorMeta:
    """The run-time metadata of a tensor that a fused kernel is specialized to."""

    dtype: torch.dtype
    sizes: tuple[int, ...]
    strides: tuple[int, ...]
    device: torch.device
    requires_grad: bool

    @staticmethod
    def of(t: torch.Tensor) -> TensorMeta:
        return TensorMeta(
            t.dtype,
            tuple(t.shape),
            tuple(t.stride()),
            t.device,
            bool(t.requires_grad and torch.is_grad_enabled()),
        )

    @staticmethod
    def from_type(ty: Any) -> TensorMeta | None:
        """The metadata a complete TensorType states, or None if it leaves any open."""
        if not isinstance(ty, torch._C.TensorType):
            return None
        sizes, strides = ty.sizes(), ty.strides()
        dtype, device, rg = ty.dtype(), ty.device(), ty.requires_grad()
        if None in (sizes, strides, dtype, device, rg) or None in sizes or None in strides:
            return None
        return TensorMeta(dtype, tuple(sizes), tuple(strides), device, bool(rg))

    @property
    def nbytes(self) -> int:
        """Bytes of the elements (as if dense: what a fresh output of these sizes holds)."""
        return self.dtype.itemsize * math.prod(self.sizes)

    def empty(self, device: str | torch.device | None = None) -> torch.Tensor:
        """An uninitialized tensor with this metadata (requires_grad aside)."""
        return torch.empty_strided(
            self.sizes, self.strides, dtype=self.dtype, device=device or self.device
        )

    def to_type(self) -> torch._C.TensorType:
        example = self.empty("meta")
        if self.requires_grad and (self.dtype.is_floating_point or self.dtype.is_complex):
            example.requires_grad_(True)
        return torch._C.TensorType.create_from_tensor(example).with_device(self.device)


def is_tensor(value: Any) -> bool:
    return isinstance(value.type(), torch._C.TensorType)


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
        for value in block.inputs():
            self._add(value, before=anchor)
        for node in list(block.nodes()):
            if node.kind() == _PROFILE_OP:
                continue
            for sub in node.blocks():
                self._instrument(sub)
            after = node
            for value in node.outputs():
                after = self._add(value, after=after) or after

    def _add(self, value: Any, before: Any = None, after: Any = None) -> Any:
        if not is_tensor(value):
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

    def finish(self, device: torch.device | None = None) -> dict[int, TensorMeta]:
        """Remove the profile nodes, type every consistently seen value; return the metadata."""
        metas = self.observed()
        if device is not None:
            metas = {k: _on(m, device) for k, m in metas.items()}
        for node in self.nodes:
            node.destroy()
        self.nodes = []
        for value in self.values:
            meta = metas.get(value.unique())
            if meta is not None:
                value.setType(meta.to_type())
        return metas


def _on(meta: TensorMeta, device: torch.device) -> TensorMeta:
    return TensorMeta(meta.dtype, meta.sizes, meta.strides, device, meta.requires_grad)


def run_graph(graph: torch._C.Graph, inputs: tuple[Any, ...]) -> Any:
    """Run `graph` once in the TorchScript interpreter, exactly as it is."""
    return torch._C._jit_interpret_graph(graph, inputs)


def infer_types(graph: torch._C.Graph, example: Callable[[Any], Any]) -> dict[int, TensorMeta]:
    """Metadata of every tensor value of `graph`, found by running a copy on meta tensors.

    `example(value)` gives the meta tensor or number to feed each graph input.
    Returned keys are `unique()`s of `graph`'s values (matched by position).
    """
    copy = graph.copy()
    profiler = Profiler(copy)
    inputs = tuple(example(v) for v in graph.inputs())
    profiler.run(run_graph, copy, inputs)
    seen = profiler.observed()
    metas: dict[int, TensorMeta] = {}
    for orig, dup in zip(_all_values(graph), _all_values(copy, skip_profile=True)):
        meta = seen.get(dup.unique())
        if meta is not None:
            metas[orig.unique()] = meta
    return metas


def _all_values(graph: Any, skip_profile: bool = False) -> list[Any]:
    out: list[Any] = []

    def visit(block: Any) -> None:
        out.extend(block.inputs())
        for node in block.nodes():
            if skip_profile and node.kind() == _PROFILE_OP:
                continue
            if skip_profile and node.kind() == "prim::Constant" and _feeds_profile(node):
                continue
            for sub in node.blocks():
                visit(sub)
            out.extend(node.outputs())

    visit(graph.block() if hasattr(graph, "block") else graph)
    return out


def _feeds_profile(node: Any) -> bool:
    uses = node.output().uses()
    return bool(uses) and all(u.user.kind() == _PROFILE_OP for u in uses)
