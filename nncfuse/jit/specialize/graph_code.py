"""graph_code: an optimized graph as one generated Python function, not the interpreter.

The TorchScript interpreter runs an optimized graph node by node, and each fused op it
meets goes through the dispatcher into the op's Python implementation (`fuser/runtime.py`)
before the kernel's entry runs. At a decode step of a small language model that is a few
hundred nodes and tens of kernels a call, and the walk costs more than the work. Here the
graph's nodes are spelled out once as straight-line Python, in order: a fused op calls its
kernel's entry directly, a TypeCheck is Dynamo's C++ tensor check (`TensorGuards`) of the
types it names, an If its two blocks, any other op its ATen overload:

    %c : bool = prim::TypeCheck[types=[Float(4)]](%x)       def graph(x, w):
    %y = prim::If(%c)                                          if g0.check(x):
      block0(): nncfuse::fused_mul_sin(%x) -> (...)     ->       v1 = k0((x,))
      block1(): aten::sin(aten::mul(%x, %x)) -> (...)          else:
    %r = aten::mm(%y, %w)                                          v1 = sin(mul(x, x))
                                                               return mm(v1, w)

A graph with a node that is not one of these (a loop, an attribute of a module, an op with
no schema or a generic one, an op or kernel that writes to its arguments) has no code (None):
the interpreter runs it. So the code writes nothing, and where it raises, the interpreter
may run the call again.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ... import log
from ..fuser import runtime

_log = log.get_logger("graph_code.py")

__all__ = ["graph_code"]

#: a schema with a type variable (`t`, `t[]`, `Any`): torch.ops cannot convert Python values
_GENERIC = re.compile(r"[(,\[ ]t[\[\] ?(]|\bAny\b")
#: prim nodes spelled as Python itself
_PACK = {"prim::ListConstruct": "[{}]", "prim::TupleConstruct": "({},)"}
_UNPACK = frozenset({"prim::ListUnpack", "prim::TupleUnpack"})


_VF, _TENSOR = torch._C._VariableFunctions, torch._C.TensorBase
#: (kind, overload) -> torch's Python binding of exactly that overload, for the ops of decode
#: graphs (weights' transposes, views, GEMMs, KV-cache writes): about a microsecond a call
#: under the overload's `_op` (1.6 against 1.0 us for `t`, 2.7 against 1.8 for `view`). Only
#: overloads whose binding cannot resolve to another (no dtype, layout or device taken as an
#: int, as TorchScript passes them).
_BINDINGS: dict[tuple[str, str], Callable[..., Any]] = {
    ("aten::t", ""): _VF.t,
    ("aten::view", ""): _TENSOR.view,
    ("aten::transpose", "int"): _VF.transpose,
    ("aten::unsqueeze", ""): _VF.unsqueeze,
    ("aten::expand", ""): _TENSOR.expand,
    ("aten::permute", ""): _VF.permute,
    ("aten::mm", ""): _VF.mm,
    ("aten::bmm", ""): _VF.bmm,
    ("aten::index_copy", ""): _VF.index_copy,
    ("aten::embedding", ""): _VF.embedding,
}


class NoCode(Exception):
    """A node this module cannot spell: the graph runs in the interpreter."""


class _Writer:
    """Lines of the generated function, and the objects its names refer to."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.env: dict[str, Any] = {}
        self.names: dict[int, str] = {}

    def bind(self, prefix: str, value: Any) -> str:
        name = f"{prefix}{len(self.env)}"
        self.env[name] = value
        return name

    def name(self, value: Any) -> str:
        """The Python name of graph value `value` (a new one the first time)."""
        return self.names.setdefault(value.unique(), f"v{len(self.names)}")

    def use(self, value: Any) -> str:
        name = self.names.get(value.unique())
        if name is None:
            raise NoCode(f"value %{value.debugName()} used before it is defined")
        return name


def graph_code(graph: torch._C.Graph) -> Callable[..., Any] | None:
    """`graph` (an optimized graph, no receiver) as a Python function of its inputs that
    returns what the interpreter returns; None where a node has no spelling here."""
    w = _Writer()
    params = [w.name(v) for v in graph.inputs()]
    try:
        _block(w, graph.nodes(), 1)
        outs = [w.use(v) for v in graph.outputs()]
    except (NoCode, RuntimeError, AttributeError, KeyError) as e:
        _log.update(f"No generated code, the interpreter runs the graph: {e}")
        return None
    result = outs[0] if len(outs) == 1 else "(" + ", ".join(outs) + ",)"
    source = "\n".join([f"def graph({', '.join(params)}):", *w.lines,
                        f"    return {result}"]) + "\n"
    exec(compile(source, "<nncfuse graph>", "exec"), w.env)  # noqa: S102 - generated above
    fn = w.env["graph"]
    fn.source = source
    return fn


def _block(w: _Writer, nodes: Any, depth: int) -> None:
    for node in nodes:
        _node(w, node, depth)


def _node(w: _Writer, node: Any, depth: int) -> None:
    pad = "    " * depth
    kind = node.kind()
    outs = list(node.outputs())
    ins = list(node.inputs())
    if kind == "prim::Constant":
        w.names[outs[0].unique()] = w.bind("c", outs[0].toIValue())
        return
    if kind in _PACK:
        args = ", ".join(w.use(v) for v in ins)
        text = _PACK[kind].format(args) if ins or kind != "prim::TupleConstruct" else "()"
        w.lines.append(f"{pad}{w.name(outs[0])} = {text}")
        return
    if kind in _UNPACK:
        targets = ", ".join(w.name(v) for v in outs)
        w.lines.append(f"{pad}{targets}, = {w.use(ins[0])}")
        return
    if kind == "prim::TypeCheck":
        for v, out in zip(ins, outs):
            w.names[out.unique()] = w.use(v)
        # each value once: Dynamo's check fails a tensor passed twice
        distinct = {w.use(v): out.type() for v, out in zip(ins, outs)}
        guard = w.bind("g", TypeCheck(list(distinct.values())))
        checked = ", ".join(distinct)
        w.lines.append(f"{pad}{w.name(outs[-1])} = {guard}.check({checked})")
        return
    if kind == "prim::If":
        _if(w, node, depth)
        return
    if node.blocks() and list(node.blocks()):
        raise NoCode(f"{kind} has blocks")
    call = _callee(w, node)
    targets = _targets(w, outs)
    w.lines.append(f"{pad}{targets}{call}")


def _targets(w: _Writer, outs: Sequence[Any]) -> str:
    if not outs:
        return ""
    if len(outs) == 1:
        return f"{w.name(outs[0])} = "
    return ", ".join(w.name(v) for v in outs) + " = "


def _if(w: _Writer, node: Any, depth: int) -> None:
    pad = "    " * depth
    outs = list(node.outputs())
    names = [w.name(v) for v in outs]
    w.lines.append(f"{pad}if {w.use(node.inputsAt(0))}:")
    for k, block in enumerate(node.blocks()):
        if k == 1:
            w.lines.append(f"{pad}else:")
        start = len(w.lines)
        _block(w, block.nodes(), depth + 1)
        for name, v in zip(names, block.outputs()):
            w.lines.append(f"{pad}    {name} = {w.use(v)}")
        if len(w.lines) == start:
            w.lines.append(f"{pad}    pass")


def _callee(w: _Writer, node: Any) -> str:
    """The call that computes `node`: a kernel's entry, or its op's overload."""
    kind = node.kind()
    args = [w.use(v) for v in node.inputs()]
    if runtime.is_fused_op_kind(kind):
        op = runtime.op_of_kind(kind)
        if op.entry is None or op.kernel.lowered.written:
            raise NoCode(f"{kind} has no entry, or writes to its inputs")
        entry = op.entry
        return f"{w.bind('k', entry)}(({''.join(a + ', ' for a in args)}))"
    schema = node.schema()
    if schema == "(no schema)":
        raise NoCode(f"{kind} has no schema")
    if _GENERIC.search(schema):
        raise NoCode(f"{kind}: a generic schema, which Python cannot call")
    parsed = torch._C.parse_schema(schema)
    if any(a.alias_info is not None and a.alias_info.is_write for a in parsed.arguments):
        # (no code that may have written when it raises: the interpreter can run the call)
        raise NoCode(f"{kind} writes to an argument")
    namespace, name = kind.split("::")
    if namespace not in ("aten", "quantized", "mkldnn", "mkl"):
        raise NoCode(f"{kind}: an op of namespace {namespace}")
    fast = _BINDINGS.get((kind, parsed.overload_name))
    if fast is not None:
        spelled = [arg for a, arg in zip(parsed.arguments, args) if not a.kwarg_only]
        spelled += [f"{a.name}={arg}" for a, arg in zip(parsed.arguments, args) if a.kwarg_only]
        return f"{w.bind('f', fast)}({', '.join(spelled)})"
    packet = getattr(getattr(torch.ops, namespace), name)
    op = getattr(packet, parsed.overload_name or "default")
    spelled = []
    for a, arg in zip(parsed.arguments, args):
        spelled.append(f"{a.name}={arg}" if a.kwarg_only else arg)
    if len(parsed.returns) != node.outputsSize() and node.outputsSize() > 1:
        raise NoCode(f"{kind}: {node.outputsSize()} outputs, {len(parsed.returns)} returns")
    return f"{w.bind('f', op._op)}({', '.join(spelled)})"


class TypeCheck:
    """`prim::TypeCheck`'s test: whether tensors are of `types` (dtype, device, sizes,
    strides, and requires_grad where grad mode is on, as TorchScript compares them). The
    first tensors that pass make it Dynamo's C++ check of tensors like them (`TensorGuards`:
    also their dispatch keys and requires_grad itself, which views of parameters keep under
    no_grad), a microsecond where this one takes several."""

    def __init__(self, types: Sequence[Any]):
        self.types = []
        for t in types:
            sizes, strides, dtype, device = t.sizes(), t.strides(), t.dtype(), t.device()
            if None in (sizes, strides, dtype, device) or None in sizes or None in strides:
                raise NoCode(f"a TypeCheck of an incomplete type {t}")
            self.types.append((tuple(sizes), tuple(strides), dtype, device,
                               t.requires_grad()))

    def check(self, *tensors: Any) -> bool:
        grad = torch.is_grad_enabled()
        for x, (sizes, strides, dtype, device, requires_grad) in zip(tensors, self.types):
            if not (isinstance(x, torch.Tensor) and x.dtype == dtype and x.device == device
                    and x.shape == sizes and x.stride() == strides
                    and (requires_grad is None or requires_grad == (grad and x.requires_grad))):
                return False
        from torch._C._dynamo.guards import TensorGuards

        self.check = TensorGuards(  # type: ignore[method-assign]
            *tensors, dynamic_dims_sizes=[list(x.shape) for x in tensors],
            dynamic_dims_strides=[list(x.stride()) for x in tensors]).check
        return True
