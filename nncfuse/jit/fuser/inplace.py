"""inplace: in-place writes to graph inputs as functional ops and one explicit write-back.

TorchScript's `_jit_pass_remove_mutation` removes the mutation of values the
graph creates; writes to its inputs remain, and the AliasDb keeps every later
reader of such an input out of groups. This pass, on the profiled graph,
rewrites the writes to an input `x` that it can prove exact:

    %r = aten::add_(%x, %y, %1)               %v = aten::add(%x, %y, %1)
    %z = aten::mul(%x, %2)           ==>      %z = aten::mul(%v, %2)
    return (%x)                               %w = aten::copy_(%x, %v, %false)   # write-back
                                              return (%x)

Every in-place op on `x` becomes its functional op (when eager's functional
result has `x`'s dtype and sizes, as the in-place one must), later readers
read the new value, and one `aten::copy_` just before the return writes the
last value into `x`'s storage. A slice assignment (`x[:, :n] = e`: a chain of
views of `x` and a `copy_` into it) is a write-back of its own, kept where it
is, when nothing reads `x` after it. An in-place op on a chain of views of `x`
(`x.t().add_(y)`, `x[0].relu_()`) is spelled as one (`_view_ops_as_copies`);
reads of `x` through other views count as reads when they come before every
write, and the fuser moves no such read past a write-back (`_crosses_write_back`
follows view chains). The fuser fuses write-backs (`is
write_back`), the kernel stores them into the input's buffer after every
other loop nest (so every read of the old values comes first), and the guard
checks at run time that the written input overlaps no other input.

What is left alone (and stays unfused, as before): inputs used inside `if` or
loop bodies, inputs read through views after a write, inputs read at all after a view
write other than a slice assignment, more than one in-place op on one view, inputs some
other op writes (or that escape into a list), in-place ops whose result would
change dtype or shape (eager raises or casts), writes mixed with a view write.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from ... import log
from ...tensorexpr.lowerings import aliases, lowering_for
from ...tensorexpr.meta import TensorMeta, blocks_of, inputs_of, is_tensor, outputs_of

_log = log.get_logger(__file__)

#: Kinds whose node marks the write-back of a functionalized input.
WRITE_BACK = "aten::copy_"


def _schema(node: Any) -> Any | None:
    try:
        return torch._C.parse_schema(node.schema())
    except (RuntimeError, ValueError):
        return None


def _writes(node: Any, offset: int) -> bool:
    """Whether `node` may write its input `offset` (unknown schemas: yes)."""
    schema = _schema(node)
    if schema is None:
        return node.kind() not in ("prim::TupleConstruct", "prim::ListConstruct", "prim::Return")
    if offset >= len(schema.arguments):
        return True
    info = schema.arguments[offset].alias_info
    return info is not None and info.is_write


def _returns_alias(node: Any) -> bool:
    schema = _schema(node)
    if schema is None:
        return node.kind() not in ("prim::TupleConstruct", "prim::Return", "prim::ListConstruct")
    return aliases(node) or any(r.alias_info is not None for r in schema.returns)


def _example(value: Any) -> Any:
    meta = TensorMeta.from_type(value.type()) if is_tensor(value) else None
    if meta is not None:
        return meta.empty("meta")
    if value.node().kind() == "prim::Constant":
        return value.toIValue()
    return {"FloatType": 1.0, "IntType": 1, "BoolType": True}.get(value.type().kind(), _NO)


_NO = object()


def in_place(kind: str) -> bool:
    """Whether an op of `kind` (or an FX method or function name) writes its first input
    (`aten::add_`, `aten::copy_`): the only writes `_plan` rewrites."""
    return kind.endswith("_") and not kind.endswith("__")


def _functional(node: Any) -> Any | None:
    """The functional kind of in-place `node` if it has a lowering and eager's functional
    result has the dtype and sizes of the written input; else None."""
    kind = node.kind()
    if kind == WRITE_BACK or not in_place(kind):
        return None
    functional = kind[:-1]
    schema = _schema(node)
    target = TensorMeta.from_type(node.inputsAt(0).type())
    if schema is None or target is None:
        return None
    args, kwargs = [], {}
    for arg, value in zip(schema.arguments, inputs_of(node)):
        example = _example(value)
        if example is _NO:
            return None
        if arg.kwarg_only:
            kwargs[arg.name] = example
        else:
            args.append(example)
    try:
        result = getattr(torch.ops.aten, functional.split("::")[1])(*args, **kwargs)
    except Exception:  # noqa: BLE001 - no such op, or eager rejects these operands
        return None
    if not isinstance(result, torch.Tensor) or result.dtype != target.dtype:
        return None
    if tuple(result.shape) != tuple(target.sizes):
        return None
    return functional


def _chain_root(value: Any) -> tuple[Any, list[Any]]:
    """The value at the root of `value`'s chain of view nodes, and the chain's nodes."""
    chain = []
    while value.node().kind() != "prim::Param" and aliases(value.node()):
        chain.append(value.node())
        value = value.node().inputsAt(0)
    return value, chain


def chain_root(value: Any) -> Any:
    """The value `value` is a view of, through any number of view nodes (or itself)."""
    return _chain_root(value)[0]


def _escapes_to_return(node: Any) -> bool:
    return node.kind() == "prim::Return" or (
        node.kind() == "prim::TupleConstruct"
        and all(u.user.kind() == "prim::Return" for u in node.output().uses())
    )


class _Plan:
    """What to do with one input: functionalize `ops`, or keep one view write `view_write`."""

    def __init__(self) -> None:
        self.ops: list[tuple[Any, str]] = []  # in-place nodes and their functional kinds
        self.view_write: Any | None = None
        self.readers_after: list[Any] = []  # nodes reading x after the view write
        self.view_reads: list[Any] = []  # nodes reading x through views, before any write


def _plan(graph: torch._C.Graph, x: Any) -> _Plan | None:
    """How to rewrite the writes to input `x`, or None to leave them (and `x`) alone."""
    top = graph.block()
    versions = {x.unique()}  # x and the results of in-place ops on it
    plan = _Plan()
    ty = TensorMeta.from_type(x.type())
    if ty is None or ty.requires_grad or not _distinct_elements(ty):
        return None  # (eager refuses to write into a tensor whose elements share memory)
    for node in graph.nodes():
        used = [k for k, v in enumerate(inputs_of(node)) if v.unique() in versions]
        if not used:
            continue
        if node.owningBlock() != top or blocks_of(node):
            return None
        if plan.view_write is not None and _escapes_to_return(node):
            continue
        if plan.view_write is not None:  # a read of the new value: of its rebuilt value
            if any(_writes(node, k) for k in used) or _returns_alias(node):
                return None
            if node.kind() == "prim::ListConstruct" and not _into_cat(node):
                return None
            plan.readers_after.append(node)
            continue
        if node.kind() == WRITE_BACK and used == [1]:
            continue  # a copy of x into something else: a read
        if _writes(node, 0) and used == [0] and node.kind() == WRITE_BACK:
            plan.ops.append((node, "copy"))
            versions.add(node.output().unique())
            continue
        if _writes(node, 0) and used == [0]:
            functional = _functional(node)
            if functional is None:
                return None
            plan.ops.append((node, functional))
            versions.add(node.output().unique())
            continue
        if any(_writes(node, k) for k in used):
            return None
        if _returns_alias(node):
            write = None if plan.ops else _view_write(node, versions)
            if write is not None:
                plan.view_write = write
                continue
            readers = _view_readers(node)
            if readers is None:
                return None
            plan.view_reads += readers
            continue
        if node.kind() == "prim::ListConstruct" and not _into_cat(node):
            return None
    for node in list(graph.nodes()) + [graph.return_node()]:
        for v in outputs_of(node) if node.kind() != "prim::Return" else ():
            if v.unique() in versions and any(u.user.owningBlock() != top for u in v.uses()):
                return None
    if any(u.user.owningBlock() != top for u in x.uses()):
        return None
    for node, functional in plan.ops:
        if functional == "copy" and not _copy_is_exact(node):
            return None
    if not plan.ops and plan.view_write is None:
        return None
    first_write = plan.view_write if plan.view_write is not None else plan.ops[0][0]
    if any(not r.isBefore(first_write) for r in plan.view_reads):
        return None  # a view read after the write sees the new values
    if plan.readers_after and _slices(plan.view_write) is None:
        return None
    return plan


def _distinct_elements(meta: TensorMeta) -> bool:
    """Whether no two elements of a tensor laid out as `meta` share memory."""
    reach = 0  # the largest offset the dimensions so far reach
    for size, stride in sorted(((n, abs(st)) for n, st in zip(meta.sizes, meta.strides)
                                if n > 1), key=lambda d: d[1]):
        if stride <= reach:
            return False
        reach += (size - 1) * stride
    return True


def _into_cat(node: Any) -> bool:
    readers = [u.user.kind() for u in node.output().uses()]
    return readers in (["aten::cat"], ["aten::stack"])


def _slices(copy: Any) -> list[tuple[Any, int, int, int]] | None:
    """The view chain of slice assignment `copy` as (base, dim, start, end), from the one
    nearest the written value out, when every view is a constant slice with step 1 and the
    assigned value has the view's dtype and sizes; else None."""
    dst, src = copy.inputsAt(0), copy.inputsAt(1)
    view, value = TensorMeta.from_type(dst.type()), TensorMeta.from_type(src.type())
    if view is None or value is None or (view.dtype, view.sizes) != (value.dtype, value.sizes):
        return None
    found = []
    for node in _chain_root(dst)[1]:
        base = TensorMeta.from_type(node.inputsAt(0).type())
        if node.kind() != "aten::slice" or base is None or base.sizes == ():
            return None
        operands = [v.toIValue() if v.node().kind() == "prim::Constant" else "?"
                    for v in inputs_of(node)[1:]]
        if "?" in operands or operands[3] != 1:
            return None
        dim = operands[0] % len(base.sizes)
        start, end, _ = slice(operands[1], operands[2]).indices(base.sizes[dim])
        found.append((node.inputsAt(0), dim, start, max(start, end)))
    return found


def _typed(node: Any, example: torch.Tensor) -> Any:
    node.output().setType(replace(TensorMeta.of(example), device=torch.device("cpu")).to_type())
    return node.output()


def _rebuild(graph: torch._C.Graph, copy: Any) -> Any:
    """The new value of the input a slice assignment `copy` writes: the assigned value between
    the input's slices before and after it, dimension by dimension (`cat`):

        x[:, 2:5] = e   ->   cat([x[:, 0:2], e, x[:, 5:]], 1)

    The slices' bounds are the profiled sizes of `x`, a graph input (never a module
    attribute: only inputs are functionalized), whose sizes the plan's signature fixes;
    dynamic plans serve other sizes only where their kernels check them or
    `policy._dynamic_only` finds the unfused constant views along dims of one size
    (tests/jit/fuser/test_split_sizes.py).
    """
    top = next(iter(graph.nodes()))
    prev, new = copy, copy.inputsAt(1)
    example = TensorMeta.from_type(new.type()).empty("meta")

    def const(value: Any) -> Any:
        with graph.insert_point_guard(top):
            return graph.insertConstant(value)

    def add(node: Any) -> Any:
        nonlocal prev
        node.insertAfter(prev)
        prev = node
        return node

    for base, dim, start, end in _slices(copy) or ():
        whole = TensorMeta.from_type(base.type()).empty("meta")
        parts, examples = [], []
        for lo, hi, inner in ((0, start, None), (start, end, new), (end, whole.shape[dim], None)):
            if inner is not None:
                parts.append(inner)
                examples.append(example)
            elif hi > lo:
                part = add(graph.create("aten::slice", [base, const(dim), const(lo), const(hi),
                                                         const(1)], 1))
                examples.append(whole.narrow(dim, lo, hi - lo))
                parts.append(_typed(part, examples[-1]))
        if len(parts) > 1:
            items = add(graph.create("prim::ListConstruct", parts, 1))
            items.output().setType(torch._C.ListType.ofTensors())
            example = torch.cat(examples, dim)
            new = _typed(add(graph.create("aten::cat", [items.output(), const(dim)], 1)), example)
        else:
            example = example.expand(whole.shape) if example.shape != whole.shape else example
    return new


def _copy_is_exact(node: Any) -> bool:
    """A whole `x.copy_(y)`: exact when `y` has `x`'s dtype and sizes (later readers of `x`
    read `y`)."""
    dst = TensorMeta.from_type(node.inputsAt(0).type())
    src = TensorMeta.from_type(node.inputsAt(1).type()) if is_tensor(node.inputsAt(1)) else None
    if dst is None or src is None:
        return False
    return src.dtype == dst.dtype and src.sizes == dst.sizes


def _view_write(view: Any, versions: set[int]) -> Any | None:
    """The `copy_` of a slice assignment that the view node `view` starts, if its chain of
    views is used by nothing else and `x` is not read after it; else None."""
    if lowering_for(view)[0] is None:
        return None
    value = view.output()
    while True:
        uses = list(value.uses())
        if len(uses) != 1:
            return None
        user, offset = uses[0].user, uses[0].offset
        if user.kind() == WRITE_BACK and offset == 0:
            if any(u.user.kind() != "prim::Return" for u in user.output().uses()):
                return None
            dst = TensorMeta.from_type(value.type())
            if dst is None or not _distinct_elements(dst):
                return None  # a broadcast view: eager refuses the write
            return user if is_tensor(user.inputsAt(1)) else None
        if offset != 0 or not aliases(user) or lowering_for(user)[0] is None:
            return None
        value = user.output()


def _view_readers(view: Any) -> list[Any] | None:
    """The nodes that read through the chain of views `view` starts (views with lowerings,
    read by nodes that neither write nor alias what they read), or None if some use of the
    chain is anything else (a write, a return, a list, a view without a lowering)."""
    if lowering_for(view)[0] is None:
        return None
    readers = []
    for use in view.output().uses():
        user = use.user
        if user.owningBlock() != view.owningBlock() or blocks_of(user):
            return None
        if _writes(user, use.offset) or _escapes_to_return(user):
            return None
        if user.kind() == "prim::ListConstruct":
            if not _into_cat(user):
                return None
            readers.append(user)
        elif _returns_alias(user):
            if use.offset != 0 or not aliases(user):
                return None
            inner = _view_readers(user)
            if inner is None:
                return None
            readers += inner
        else:
            readers.append(user)
    return readers


def _view_ops_as_copies(graph: torch._C.Graph) -> None:
    """Spell an in-place op on a view of a graph input as its functional op and a `copy_`
    into the same view, rebuilt: a view write, which `_plan` takes.

        %v = aten::t(%x)                          %v = aten::t(%x)
        %r = aten::add_(%v, %y, %1)       ==>     %a = aten::add(%v, %y, %1)
                                                  %v2 = aten::t(%x)
                                                  %r2 = aten::copy_(%v2, %a, %false)

    Only where the view chain is used by the op alone, its elements do not share memory
    (eager refuses such writes), the functional result has the view's dtype and sizes, and
    no other operand is computed from the same input (eager's rules for overlapping
    operands would apply)."""
    for node in list(graph.nodes()):
        view = node.inputsAt(0) if node.inputsSize() else None
        if view is None or node.kind() == WRITE_BACK or not is_tensor(view):
            continue
        root, chain = _chain_root(view)
        if not chain or root.node().kind() != "prim::Param" or not _writes(node, 0):
            continue
        if any(len(n.output().uses()) != 1 or lowering_for(n)[0] is None for n in chain):
            continue
        meta = TensorMeta.from_type(view.type())
        if meta is None or not _distinct_elements(meta) or any(
            v.unique() == root.unique() or chain_root(v).unique() == root.unique()
            for v in inputs_of(node)[1:]
        ):
            continue
        functional = _functional(node)
        if functional is None or node.outputsSize() != 1:
            continue
        with graph.insert_point_guard(node):
            new = graph.insertNode(graph.create(functional, inputs_of(node), 1))
            new.output().setType(node.output().type())
            new.copyMetadata(node)
            if lowering_for(new)[0] is None:  # only ops that fuse (not `detach_`, say)
                new.destroy()
                continue
            mapping = {root.unique(): root}
            dst = root
            for link in reversed(chain):
                clone = graph.insertNode(graph.createClone(link, lambda v: mapping.get(
                    v.unique(), v)))
                clone.output().setType(link.output().type())
                mapping[link.output().unique()] = dst = clone.output()
            flag = graph.insertConstant(False)
            copy = graph.insertNode(graph.create(WRITE_BACK, [dst, new.output(), flag], 1))
            copy.output().setType(view.type())
        node.output().replaceAllUsesWith(copy.output())
        node.destroy()
        flag.node().moveBefore(next(iter(graph.nodes())))
        _log.update("In-place ", functional, " on a view of input %", root.debugName(),
                    " is a view write")


def functionalize_input_writes(graph: torch._C.Graph) -> set[Any]:
    """Rewrite the writes to graph inputs that are exact to rewrite (module docstring), in
    place; return the write-back nodes and the values only they write (for the fuser)."""
    exempt: set[Any] = set()
    _view_ops_as_copies(graph)
    if not any(in_place(node.kind()) for node in graph.nodes()):
        return exempt  # nothing to plan (AOTAutograd's graphs): skip a pass per input
    for x in inputs_of(graph):
        if not is_tensor(x):
            continue
        plan = _plan(graph, x)
        if plan is None:
            continue
        if plan.view_write is not None:
            copy = plan.view_write
            root, chain = _chain_root(copy.inputsAt(0))
            exempt.update({copy, x, copy.output(), *(n.output() for n in chain)})
            if plan.readers_after:
                new = _rebuild(graph, copy)
                for node in plan.readers_after:
                    for k, v in enumerate(inputs_of(node)):
                        if v == x:
                            node.replaceInput(k, new)
            _log.update("Slice assignment into input %", x.debugName(), " is a write-back")
            continue
        _functionalize(graph, x, plan, exempt)
    return exempt


def _functionalize(graph: torch._C.Graph, x: Any, plan: _Plan, exempt: set[Any]) -> None:
    cur = x
    rewritten = {n for n, _ in plan.ops}
    versions = {x.unique()}
    for node in list(graph.nodes()):
        if node in rewritten:
            functional = dict((n, f) for n, f in plan.ops)[node]
            versions.add(node.output().unique())
            if functional == "copy":
                cur = node.inputsAt(1)
            else:
                with graph.insert_point_guard(node):
                    inputs = [cur, *inputs_of(node)[1:]]
                    new = graph.insertNode(graph.create(functional, inputs, 1))
                    new.output().setType(node.output().type())
                    new.copyMetadata(node)
                cur = new.output()
            node.output().replaceAllUsesWith(x)
            node.destroy()
            continue
        if cur is x:
            continue
        for k, v in enumerate(inputs_of(node)):
            if v.unique() in versions and v is not cur and not _escapes_to_return(node):
                node.replaceInput(k, cur)
    for k, v in enumerate(inputs_of(graph.return_node())):
        if v.unique() in versions:
            graph.return_node().replaceInput(k, x)
    if cur is x:
        return
    with graph.insert_point_guard(graph.return_node()):
        flag = graph.insertConstant(False)
        copy = graph.insertNode(graph.create(WRITE_BACK, [x, cur, flag], 1))
    # The constant first: between `cur` and the write-back it would keep them apart (the
    # fuser moves nodes only past values their consumer does not take).
    copy.output().setType(x.type())
    flag.node().moveBefore(next(iter(graph.nodes())))
    _log.update("Writes to input %", x.debugName(), " are functional, with one write-back")
    exempt.update({copy, x, copy.output()})


def is_write_back(node: Any, exempt: frozenset[Any]) -> bool:
    return node.kind() == WRITE_BACK and node in exempt


def only_write_backs(block: Any, exempt: frozenset[Any]) -> bool:
    """Whether the write-backs in `exempt` are the only nodes of `block` (and its nested
    blocks) that write to a tensor."""
    for node in block.nodes():
        if any(not only_write_backs(b, exempt) for b in blocks_of(node)):
            return False
        if node in exempt:
            continue
        schema = _schema(node)
        if schema is not None and any(
            a.alias_info is not None and a.alias_info.is_write for a in schema.arguments
        ):
            return False
    return True


def written_inputs(graph: torch._C.Graph, skip: int = 0) -> tuple[int, ...]:
    """Positions (less `skip`, for a module's `self`) of the graph inputs that a `copy_` in
    `graph` (nested blocks included: guards' fallbacks) writes, directly or through views.
    The fused ops' write-backs write the same inputs as their fallbacks."""
    position = {v.unique(): k for k, v in enumerate(inputs_of(graph))}
    found: set[int] = set()

    def visit(block: Any) -> None:
        for node in block.nodes():
            for sub in blocks_of(node):
                visit(sub)
            if node.kind() == WRITE_BACK:
                root, _ = _chain_root(node.inputsAt(0))
                if root.unique() in position and position[root.unique()] >= skip:
                    found.add(position[root.unique()] - skip)

    visit(graph.block())
    return tuple(sorted(found))
