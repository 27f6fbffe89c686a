"""sizes: view sizes computed from the sizes of tensors, copied into the groups that use them.

Traced and scripted models size their views from other tensors' sizes, not
constants: GPT-2's Conv1D is `x.view(-1, x.size(-1))`, a GEMM, then
`out.view(size_out)` with `size_out` made of `x.size(0)` and `x.size(1)`;
attention heads split as `view(b, s, h, d)`. In the graph the size operand
is a list built from `aten::size` nodes and constants, and traced size
arithmetic goes through 0-dim tensors (`x.shape[-1] // 2`):

    %n : int = aten::size(%x, %c1)                         (aten::size(%t, d): d a constant)
    %l : int[] = prim::ListConstruct(%n, %c_1, %c64)       (constants and such ints)
    %v = aten::view(%y, %l)

    %t = prim::NumToTensor(aten::size(%x, %c3)); %h = aten::floor_divide(%t, %c2);
    %k : int = aten::Int(%h)                               (traced: ints through 0-dim tensors)

Such an operand is a *size expression* when every leaf is a constant or the
size along a constant dim of a tensor with a complete profiled type, and
every step is integer arithmetic this module knows (`problem` says why not).
A view that reads one joins a group: the expression is copied into the
group's subgraph (`copy_into`), in integer form (`aten::floordiv(int, int)`
for the traced floor_divide), so that each tensor it reads the sizes of
becomes a group input, guarded like any other by the group's TypeCheck; the
kernel lowers `aten::size` of a value of known shape to that size (a static
kernel) and never reads the tensor. The original nodes stay outside for
their other users (`drop_unused` removes them when the group took the last).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ...tensorexpr.meta import TensorMeta, inputs_of, is_tensor

#: Integer arithmetic on sizes, by kind: (its integer op, the number of int operands). The
#: int overloads (scripted code) and the tensor ones on 0-dim tensors (traced code) alike.
_ARITHMETIC = {
    "aten::add": "aten::add", "aten::sub": "aten::sub", "aten::mul": "aten::mul",
    "aten::floordiv": "aten::floordiv", "aten::floor_divide": "aten::floordiv",
    "aten::neg": "aten::neg",
}
#: Nodes that pass an int through a 0-dim tensor and back (traced size arithmetic).
_PASS = ("prim::NumToTensor", "aten::Int")
#: The kinds of a size expression in a group's subgraph (`copy_into`'s integer form).
SIZE_KINDS = frozenset({"aten::size", "prim::ListConstruct", *_ARITHMETIC.values()})

_MAX_DEPTH = 32
#: The kinds that read one size of a tensor (`_size_read`).
_SIZE_READS = ("aten::size", "aten::__getitem__", "prim::ListUnpack")


def is_size_node(node: Any) -> bool:
    """Whether `node` is a step of a size expression in integer form: no tensor in or out."""
    return (node.kind() in SIZE_KINDS and node.outputsSize() == 1
            and _is_int_or_ints(node.output())
            and not (node.kind() == "prim::ListConstruct"
                     and any(is_tensor(v) for v in inputs_of(node))))


def _is_int_or_ints(value: Any) -> bool:
    ty = value.type()
    return isinstance(ty, torch._C.IntType) or (
        isinstance(ty, torch._C.ListType) and isinstance(ty.getElementType(), torch._C.IntType))


def _int_constant(value: Any) -> int | None:
    """The int constant `value` is (typed int: not a tensor constant), else None."""
    if value.node().kind() != "prim::Constant" or not isinstance(value.type(), torch._C.IntType):
        return None
    v = value.toIValue()
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _size_read(value: Any) -> tuple[Any, int] | None:
    """(%t, d) for `aten::size(%t, d)` (or `size(%t)[d]`, or output d of the unpacked
    `size(%t)`: `b, h, s, d = x.shape`), d normalized; None if d is not a constant in range."""
    node = value.node()
    of_sizes = node.inputsSize() >= 1 and node.inputsAt(0).node().kind() == "aten::size" \
        and node.inputsAt(0).node().inputsSize() == 1
    if node.kind() == "aten::size" and node.inputsSize() == 2:
        source, d = node.inputsAt(0), _int_constant(node.inputsAt(1))
    elif node.kind() == "aten::__getitem__" and of_sizes:
        source, d = node.inputsAt(0).node().inputsAt(0), _int_constant(node.inputsAt(1))
    elif node.kind() == "prim::ListUnpack" and of_sizes:
        source = node.inputsAt(0).node().inputsAt(0)
        d = [v.unique() for v in node.outputs()].index(value.unique())
    else:
        return None
    meta = TensorMeta.from_type(source.type()) if is_tensor(source) else None
    if d is None or meta is None or not -len(meta.sizes) <= d < len(meta.sizes):
        return None
    return source, d % len(meta.sizes)


def problem(value: Any) -> tuple[str | None, list[Any]]:
    """(None, the tensors whose sizes it reads) if `value` is a size expression, else (why
    not, [])."""
    sources: list[Any] = []
    why = _walk(value, sources, 0)
    return why, (sources if why is None else [])


def _walk(value: Any, sources: list[Any], depth: int) -> str | None:
    node = value.node()
    node_kind = node.kind()
    if depth > _MAX_DEPTH:
        return "a size expression too deep"
    if node_kind == "prim::Constant":
        known = _int_constant(value) is not None or _tensor_int(value) is not None
        return None if known or _int_list(value) else f"%{value.debugName()} is not an int"
    if node_kind in _SIZE_READS:
        read = _size_read(value)
        if read is None:
            return f"%{value.debugName()} is not a size along a constant dim of a typed tensor"
        sources.append(read[0])
        return None
    if node_kind == "prim::ListConstruct" and _is_int_or_ints(value):
        return _walk_all(inputs_of(node), sources, depth)
    if node_kind in _PASS:
        inner = node.inputsAt(0)
        if node_kind != "prim::NumToTensor" and not _int_tensor(inner):
            return f"%{inner.debugName()} is not a 0-dim integer tensor"
        return _walk(inner, sources, depth + 1)
    if node_kind in _ARITHMETIC and node.outputsSize() == 1:
        return _arithmetic(node, sources, depth)
    return f"%{value.debugName()} is computed by {node_kind}"


def _walk_all(values: list[Any], sources: list[Any], depth: int) -> str | None:
    for v in values:
        why = _walk(v, sources, depth + 1)
        if why is not None:
            return why
    return None


def _tensor_int(value: Any) -> int | None:
    """The value of `value` if it is a 0-dim int64 tensor constant (traced `n + 0`)."""
    if value.node().kind() != "prim::Constant" or not is_tensor(value):
        return None
    t = value.node().t("value")
    return int(t.item()) if t.dim() == 0 and t.dtype == torch.int64 else None


def _int_list(value: Any) -> bool:
    if not _is_int_or_ints(value):
        return False
    v = value.toIValue()
    return isinstance(v, list) and all(isinstance(n, int) and not isinstance(n, bool) for n in v)


def _int_tensor(value: Any) -> bool:
    """Whether `value` is a 0-dim int64 tensor (what `prim::NumToTensor` of an int makes)."""
    meta = TensorMeta.from_type(value.type()) if is_tensor(value) else None
    return meta is not None and meta.dtype == torch.int64 and meta.sizes == ()


def _operands(node: Any) -> list[Any]:
    """The int operands of arithmetic `node` (add and sub: alpha must be the constant 1)."""
    ops = inputs_of(node)
    if node.kind() in ("aten::add", "aten::sub") and len(ops) == 3:
        return ops[:2] if _int_constant(ops[2]) == 1 else []
    return ops


def _arithmetic(node: Any, sources: list[Any], depth: int) -> str | None:
    out = node.output()
    if not (isinstance(out.type(), torch._C.IntType) or _int_tensor(out)):
        return f"{node.kind()} does not compute an int"
    ops = _operands(node)
    arity = 1 if _ARITHMETIC[node.kind()] == "aten::neg" else 2
    if len(ops) != arity:
        return f"{node.kind()} with operands this module does not know"
    for v in ops:
        if not (isinstance(v.type(), torch._C.IntType) or _int_tensor(v)):
            return f"%{v.debugName()} is not an int"
    if _ARITHMETIC[node.kind()] == "aten::floordiv" and not (
            _int_constant(ops[1]) or _tensor_int(ops[1])):
        return "a size divided by something other than a nonzero constant"
    return _walk_all(ops, sources, depth)


def copy_into(graph: Any, value: Any, lookup: Callable[[Any], Any],
              place: Callable[[Any], Any]) -> Any:
    """The size expression `value` built again in `graph` in integer form: constants and the
    nodes of `SIZE_KINDS`, each handed to `place` (which inserts it); tensors read through
    `lookup` (a group's subgraph: its inputs)."""
    node = value.node()
    kind = node.kind()
    if kind == "prim::Constant" and _tensor_int(value) is not None:
        return _int_constant_in(graph, place, _tensor_int(value))
    if kind == "prim::Constant":
        return place(graph.createClone(node, lambda x: x)).output()
    if kind in _SIZE_READS:
        source, d = _size_read(value)  # type: ignore[misc]
        dim = _int_constant_in(graph, place, d)
        return _int_node(graph, place, "aten::size", [lookup(source), dim])
    if kind in _PASS:
        return copy_into(graph, node.inputsAt(0), lookup, place)
    if kind == "prim::ListConstruct":
        items = [copy_into(graph, v, lookup, place) for v in inputs_of(node)]
        made = place(graph.create("prim::ListConstruct", items))
        made.output().setType(torch._C.ListType.ofInts())
        return made.output()
    operands = [copy_into(graph, v, lookup, place) for v in _operands(node)]
    return _int_node(graph, place, _ARITHMETIC[kind], operands)


def _int_constant_in(graph: Any, place: Callable[[Any], Any], n: int) -> Any:
    made = place(graph.create("prim::Constant"))
    made.i_("value", n)
    made.output().setType(torch._C.IntType.get())
    return made.output()


def _int_node(graph: Any, place: Callable[[Any], Any], kind: str, operands: list[Any]) -> Any:
    made = place(graph.create(kind, operands))
    made.output().setType(torch._C.IntType.get())
    return made.output()


def drop_unused(value: Any) -> None:
    """Remove the nodes of size expression `value` (one `problem` took) that nothing uses
    any more; the tensors whose sizes it read stay."""
    node = value.node()
    if node.kind() == "prim::Constant" or list(value.uses()):
        return
    kind = node.kind()
    if kind == "aten::size":
        node.destroy()
    elif kind == "prim::ListUnpack":
        return  # its sibling outputs may be on this walk: the fuser's DCE removes it
    elif kind == "aten::__getitem__":
        inputs = inputs_of(node)
        node.destroy()
        if not list(inputs[0].uses()):
            inputs[0].node().destroy()  # aten::size(%t): the list of %t's sizes
    elif kind in (*_PASS, *_ARITHMETIC, "prim::ListConstruct"):
        inputs = inputs_of(node)
        node.destroy()
        for v in inputs:
            drop_unused(v)
