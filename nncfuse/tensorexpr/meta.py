"""meta: what a tensor value of a TorchScript graph looks like, from its type or a meta run.

`TensorMeta` is the run-time metadata a kernel is specialized to (dtype,
sizes, strides, device, requires_grad). It comes from a complete
`TensorType`, from a tensor, or, for a graph whose types are incomplete,
from running the graph once on meta tensors (`infer_types`). Both the
TorchScript side (`jit/`) and the kernel use it, so it sits below both.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch


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
    """Whether a graph value is a tensor."""
    return isinstance(value.type(), torch._C.TensorType)


def inputs_of(owner: Any) -> list[Any]:
    """The inputs of a graph's node, of a graph or of a block, in order, as a list.
    `node.inputs()` and the like hand out pybind iterators, and the end of one is a C++
    exception: ~15 us a loop, whatever its length, where this takes ~1 us for a node's few
    values (the fuser's walks, BERT's training graphs: a third of their time)."""
    if isinstance(owner, torch._C.Node):
        return [owner.inputsAt(k) for k in range(owner.inputsSize())]
    param = owner.param_node() if isinstance(owner, torch._C.Graph) else owner.paramNode()
    return [param.outputsAt(k) for k in range(param.outputsSize())]


#: kinds of node whose meaning runs no block (ATen's ops, `nncfuse::` kernels, these): their
#: nodes own none (TorchScript makes none; a block there would never run)
_BLOCKLESS = frozenset({"prim::Constant", "prim::ListConstruct", "prim::ListUnpack",
                        "prim::TupleConstruct", "prim::TupleUnpack", "prim::NumToTensor",
                        "prim::GetAttr", "prim::TypeCheck", "prim::TensorExprGroup"})


def blocks_of(node: Any) -> list[Any]:
    """The blocks of a graph's node (a prim::If's two, a prim::Loop's body), as a list; for
    the kinds that run none, none, without asking: walking an empty `node.blocks()` costs
    its C++ exception too (see `inputs_of`), and the walks over every node of a graph ask
    each (BERT's training step: 10,000 times)."""
    kind = node.kind()
    if kind in _BLOCKLESS or kind.startswith(("aten::", "nncfuse::")):
        return []
    return list(node.blocks())


def all_nodes(block: Any) -> Any:
    """The nodes of `block` and of the blocks inside it, depth first, in program order (each
    block's list taken before its nodes are yielded: a caller may insert nodes)."""
    for node in list(block.nodes()):
        yield node
        for inner in blocks_of(node):
            yield from all_nodes(inner)


def replace_by(graph: torch._C.Graph, node: Any, kind: str, operands: list[Any]) -> Any:
    """Put a `kind` node of `operands` in place of the one-output `node` (before it, typed as
    its output, read by its readers), remove `node`, and return the new node.

        %y = aten::mul(%g, %m)   ->   %y.1 = aten::where(%c, %g, %zero)
    """
    with graph.insert_point_guard(node):
        new = graph.insertNode(graph.create(kind, operands, 1))
    new.output().setType(node.output().type())
    node.output().replaceAllUsesWith(new.output())
    node.destroy()
    return new


def outputs_of(owner: Any) -> list[Any]:
    """The outputs of a graph's node, of a graph or of a block, in order (see `inputs_of`)."""
    if isinstance(owner, torch._C.Node):
        return [owner.outputsAt(k) for k in range(owner.outputsSize())]
    ret = owner.return_node() if isinstance(owner, torch._C.Graph) else owner.returnNode()
    return [ret.inputsAt(k) for k in range(ret.inputsSize())]


def graph_text(graph: torch._C.Graph) -> str:
    """`graph`'s text with its values renamed in order of appearance (`%0`, `%1`, ...) and
    without a trace's module scopes: the same for graphs that differ only in those (a
    traced model's layers alike)."""
    names: dict[str, str] = {}
    text = re.sub(r", scope: [^\n]*", "", graph.str(False))
    return re.sub(r"%[\w.]+", lambda m: names.setdefault(m.group(0), f"%{len(names)}"), text)


#: `constant`'s answer for a value that no `prim::Constant` makes
UNKNOWN: Any = object()


def constant(value: Any) -> Any:
    """The Python value of a graph value that a `prim::Constant` makes, else `UNKNOWN`
    (None is a constant's value too)."""
    return value.toIValue() if value.node().kind() == "prim::Constant" else UNKNOWN


def only_reads(node: Any, k: int, views: bool = False) -> bool:
    """Whether `node` only reads its input `k`: its schema neither writes nor aliases it
    (no schema, as `prim::If`'s: no); with `views`, it may alias it without writing it (a
    view of it)."""
    try:
        schema = torch._C.parse_schema(node.schema())
    except RuntimeError:  # "(no schema)"
        return False
    arguments = schema.arguments
    if k >= len(arguments):
        return False
    alias = arguments[k].alias_info
    return alias is None or views and not alias.is_write


def infer_types(graph: torch._C.Graph, example: Callable[[Any], Any]) -> dict[int, TensorMeta]:
    """Metadata of every tensor value of `graph`'s top-level block, found by running a copy
    on meta tensors.

    `example(value)` gives the meta tensor or number to feed each graph input.
    The copy returns every tensor it computes, so one interpreter run sees them
    all; returned keys are `unique()`s of `graph`'s values. Values inside
    nested blocks are not typed (the graphs typed this way have none).
    """
    copy = graph.copy()
    originals = [v for v in _values(graph) if is_tensor(v)]
    for value in [v for v in _values(copy) if is_tensor(v)]:
        copy.registerOutput(value)
    n_own = len(list(graph.outputs()))
    inputs = tuple(example(v) for v in graph.inputs())
    results = torch._C._jit_interpret_graph(copy, inputs)
    results = results if isinstance(results, tuple) else (results,)
    metas: dict[int, TensorMeta] = {}
    for orig, t in zip(originals, results[n_own:]):
        if isinstance(t, torch.Tensor):
            metas[orig.unique()] = TensorMeta.of(t)
    return metas


def _values(graph: torch._C.Graph) -> list[Any]:
    return [*graph.inputs(), *(v for n in graph.nodes() for v in n.outputs())]
