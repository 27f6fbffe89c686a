"""tensorexpr_fuser: gather fusible nodes of a profiled graph into guarded fusion groups.

NNC's algorithm. Each block (and, recursively, each `prim::If`/`prim::Loop`
body) is walked from its end to its start; a fusible node, or a group, pulls
in the fusible nodes that produce its inputs, when the producer can be moved
next to its consumer without changing what any other node sees. The walk
repeats until nothing changes. Then (with `min_group_size=1`, or for nodes
worth a kernel alone: `supported.fuses_alone`) lone fusible nodes become
groups of their own, adjacent groups merge, and groups with fewer than
`min_group_size` nodes (but for those lone ones) are taken apart again. A group is a
`prim::TensorExprGroup` node holding its nodes in a `Subgraph` attribute:

    %z : Float(128) = prim::TensorExprGroup_0(%b)
    with prim::TensorExprGroup_0 = graph(%0 : Float(128)):
      %x : Float(128) = aten::mul(%0, %0)
      ...

GEMMs and convolutions (`supported.is_external`) join a group as external calls
that the kernel runs before its loops: they read only group inputs, so one
neither pulls in its producers nor is merged after a node it reads. Alone, with views
of its result at most, a GEMM is no group (nothing to fuse, and eager hands out views of
what the library returns) but where oneDNN's routine beats ATen's (`onednn_gemm_alone`).

Scripted code's shape checks (an `if` that only raises, on the rank or sizes of tensors:
`tensorexpr/shape_checks.py`) join the group of what they read, with the values of their
condition; the kernel lowers them to nothing. So that a bad input meets eager's error, a
check moves only across nodes that cannot raise (`_INERT`), and nothing moves across one.

Alias safety: only nodes whose inputs nothing writes to (per the graph's
AliasDb, taken before fusion) are fused, so moving them never reorders a
read across a write. `guard.py` then compiles each group and guards it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from ... import log
from ...config import Options
from ...tensorexpr import shape_checks
from ...tensorexpr.lowerings import EXTERNAL_KINDS, VIEWS, aliases, lowering_for
from ...tensorexpr.meta import blocks_of, inputs_of, is_tensor, outputs_of
from . import guard, runtime
from .autocast_casts import make_autocast_casts_explicit
from .channels_last import convolutions_to_channels_last
from .flattened_linears import unflatten_linears
from .inplace import (
    chain_root,
    functionalize_input_writes,
    in_place,
    is_write_back,
    only_write_backs,
)
from .quantized_weights import fold_quantized_weights
from .sizes import is_size_node
from .subgraph import holds_check, is_group, make_group, merge_into, move_aliases_out, unmerge
from .supported import (
    copied_operand,
    feeds_external,
    fuses_alone,
    is_external,
    size_sources,
    why_not_fusible,
    why_not_write_back,
)
from .transposed_gemms import gemms_as_linears
from .weight_casts import batch_weight_casts

_log = log.get_logger(__file__)
def _body(group: Any) -> list[Any]:
    """The nodes of `group` that compute: not constants, not copied size expressions, not
    shape checks."""
    return [n for n in group.g("Subgraph").nodes()
            if n.kind() != "prim::Constant" and not is_size_node(n)
            and not shape_checks.is_check_node(n)]


def _body_size(group: Any) -> int:
    return len(_body(group))


def _fuses_alone(group: Any) -> bool:
    """Whether `group` is one node that is worth a kernel on its own (`fuses_alone`)."""
    nodes = _body(group)
    return len(nodes) == 1 and fuses_alone(nodes[0])


#: views that never copy (reshape and contiguous may)
_FREE_VIEWS = VIEWS - {"aten::contiguous", "aten::reshape", "aten::reshape_as", "aten::flatten"}


def _external_and_views(group: Any) -> bool:
    """Whether `group` computes nothing but external calls and views of their results."""
    kinds = [n.kind() for n in _body(group)]
    return any(is_external(n) for n in group.g("Subgraph").nodes()) and all(
        k in _FREE_VIEWS or k in EXTERNAL_KINDS for k in kinds)


class _Fuser:
    def __init__(
        self, graph: torch._C.Graph, options: Options, write_backs: frozenset[Any] = frozenset()
    ):
        self.graph = graph
        self.options = options
        aliases = graph.alias_db()
        # Values some node writes to (or that alias such): their readers are never moved.
        self.written: set[int] = set()
        self._find_written(graph.block(), aliases)
        self._find_written_lists(graph.block())
        # ... but for inputs only write-backs write (`inplace.py`): those fuse, and no
        # reader of the input moves across its write-back (`_crosses_write_back`).
        self.write_backs = write_backs
        if write_backs and only_write_backs(graph.block(), write_backs):
            # The AliasDb has every input that may alias a written one written too; the
            # guard checks at run time that no input overlaps a written one.
            self.written = set()
        self.reasons: dict[int, str | None] = {}
        # Whether any node writes (`_written_inputs`); merging moves nodes into groups and
        # makes no new writes, so without one no merge crosses a write-back (AOTAutograd's
        # graphs: `_crosses_write_back` walked the nodes between each pair for nothing).
        self.writes = _writes(graph.block())
        # Whether a shape check may join a group: else no move needs `_keeps_check_order`
        # (a trace has none).
        self.checks = _has_checks(graph.block())

    def _find_written(self, block: Any, aliases: Any) -> None:
        values = inputs_of(block)
        for node in block.nodes():
            values += outputs_of(node)
            for sub in blocks_of(node):
                self._find_written(sub, aliases)
        self.written.update(v.unique() for v in values if aliases.has_writers(v))

    def _find_written_lists(self, block: Any) -> None:
        """A list of written tensors (a cat's, a stack's) is written too: its reader reads
        them."""
        for node in block.nodes():
            for sub in blocks_of(node):
                self._find_written_lists(sub)
            if node.kind() == "prim::ListConstruct" and any(
                v.unique() in self.written for v in inputs_of(node)
            ):
                self.written.add(node.output().unique())

    # -- what may fuse ----------------------------------------------------------
    def why_not(self, node: Any) -> str | None:
        if is_group(node):
            return None
        key = node.output().unique() if node.outputsSize() == 1 else None
        if key is not None and key in self.reasons:
            return self.reasons[key]
        if is_write_back(node, self.write_backs):
            reason = why_not_write_back(node)
        else:
            reason = why_not_fusible(node)
        if reason is None and any(v.unique() in self.written for v in inputs_of(node)):
            reason = "an input is written to by another node"
        if reason is None and any(v.unique() in self.written for v in size_sources(node)):
            reason = "a tensor it reads the sizes of is written to by another node"
        if reason is None and any(v.unique() in self.written for v in outputs_of(node)):
            reason = "its output is written to by another node"
        if key is not None:
            self.reasons[key] = reason
            if reason is not None and node.kind() != "prim::Constant":
                _log.debug("Considering node: ", node, "Not fused: ", reason)
        return reason

    # -- the walk ---------------------------------------------------------------
    def run(self, block: Any) -> None:
        for node in list(block.nodes()):
            for sub in blocks_of(node):
                self.run(sub)
        changed = True
        while changed:
            changed = False
            node = block.returnNode().prev()
            while node.kind() != "prim::Param":
                merged = self.scan(node)
                if merged is not None:
                    changed = True
                    node = merged
                else:
                    node = node.prev()
        for node in list(block.nodes()):
            lone = not is_group(node) and node.kind() != "prim::Constant"
            lone = lone and node.outputsSize() >= 1 and all(map(is_tensor, outputs_of(node)))
            # a library call alone: nothing to fuse, but where oneDNN's GEMM beats ATen's
            lone = lone and (not is_external(node) or fuses_alone(node))
            lone = lone and (self.options.min_group_size <= 1 or fuses_alone(node))
            if lone and self.why_not(node) is None:
                make_group(self.graph, node, copied_operand)
        self.merge_adjacent(block)
        for node in list(block.nodes()):
            if is_group(node):
                move_aliases_out(self.graph, node, aliases)  # eager's views stay views
        for node in list(block.nodes()):
            if is_group(node) and _body_size(node) < self.options.min_group_size \
                    and not _fuses_alone(node):
                _log.update("Undoing a group of ", _body_size(node), " node(s)")
                unmerge(self.graph, node)
            elif is_group(node) and _external_and_views(node) and not _fuses_alone(node):
                # A copy of what a library call returns, where eager hands out its views;
                # a GEMM worth a kernel alone keeps one, the views read its result.
                _log.update("Undoing a group of external calls and views only")
                for moved in unmerge(self.graph, node):
                    if is_external(moved) and fuses_alone(moved):
                        make_group(self.graph, moved, copied_operand)

    def scan(self, node: Any) -> Any | None:
        """Pull one producer into `node`; the group if that happened, else None."""
        if not is_group(node) and (shape_checks.is_check_value(node) or is_external(node)
                                   or self.why_not(node) is not None):
            return None  # (a check value joins the group of its check, as its producer)
        block = node.owningBlock()
        producers = [
            v.node()
            for v in inputs_of(node)
            if v.node().owningBlock() == block
            and v.node().kind() not in ("prim::Param", "prim::Constant")
        ]
        for producer in sorted(set(producers), key=functools.cmp_to_key(_order), reverse=True):
            if (self.why_not(producer) is not None
                    or self.writes and _crosses_write_back(producer, node)
                    or _feeds_external(node, producer)):
                continue
            if not _move_together(producer, node, self.checks):
                continue
            group = node if is_group(node) else make_group(self.graph, node, copied_operand)
            _log.update("Merging ", producer.kind(), " into ", group.kind())
            merge_into(self.graph, group, producer, copied_operand)
            return group
        return None

    def merge_adjacent(self, block: Any) -> None:
        nodes = [n for n in block.nodes() if n.kind() != "prim::Constant"]
        for first, second in zip(nodes, nodes[1:]):
            if is_group(first) and is_group(second) and not _feeds_external(second, first):
                merge_into(self.graph, second, first, copied_operand)


def _written_inputs(node: Any) -> set[int]:
    """The values that write-backs in `node` (a write-back, or a group) store into, or that
    an in-place op left outside groups writes (its `self`), each traced through views to
    its root. Views here include ops TorchScript's alias analysis takes for fresh values but
    eager returns as their input (eval dropout), so the roots catch what alias analysis
    misses."""
    if not is_group(node):
        writes = node.kind().startswith("aten::") and in_place(node.kind()) and node.inputsSize()
        return {_root(node.inputsAt(0)).unique()} if writes else set()
    subgraph = node.g("Subgraph")
    outer = {v.unique(): o for v, o in zip(inputs_of(subgraph), inputs_of(node))}
    found = set()
    for inner in subgraph.nodes():
        if inner.kind() == "aten::copy_":
            root = inner.inputsAt(0)
            while root.unique() not in outer:
                root = root.node().inputsAt(0)
            found.add(outer[root.unique()].unique())
    return found


def _has_checks(block: Any) -> bool:
    """Whether `block` (or a block nested in it) holds a shape check (`shape_checks`)."""
    return any(shape_checks.is_check(n) or any(map(_has_checks, blocks_of(n)))
               for n in block.nodes())


def _writes(block: Any) -> bool:
    """Whether a node in `block` (or its nested blocks) writes (`_written_inputs`)."""
    return any(_written_inputs(n) or any(_writes(b) for b in blocks_of(n)) for n in block.nodes())


def _crosses_write_back(producer: Any, consumer: Any) -> bool:
    """Whether joining `producer` and `consumer` could move a node that reads an input across
    a write-back that stores into it: a write-back in either and a reader between them, or
    a write-back between them and a reader among the two (which one moves past the nodes
    between is `_move_together`'s choice). A read through a view of the input, or of a list
    that holds it (cat, stack), counts."""
    written = _written_inputs(producer) | _written_inputs(consumer)
    read = None  # (the two's read roots: only where a node between writes)
    node = consumer.prev()
    while node != producer and node.kind() != "prim::Param":
        if written and _read_roots(node) & written:  # (AOTAutograd's graphs write nothing)
            return True
        between = _written_inputs(node)
        if between:
            read = _read_roots(producer) | _read_roots(consumer) if read is None else read
            if between & read:
                return True
        node = node.prev()
    return False


def _read_roots(node: Any) -> set[int]:
    """The values `node` reads, each traced through views and tensor lists to its root."""
    values = inputs_of(node)
    for v in list(values):
        if v.node().kind() == "prim::ListConstruct":
            values += inputs_of(v.node())
    return {_root(v).unique() for v in values}


def _root(value: Any) -> Any:
    """`chain_root` through groups too: a group's output that is a view of one of its inputs
    inside (a reshape the group took in, which `move_aliases_out` puts back outside it) is
    traced on from that input.

        %v = prim::TensorExprGroup(%x)  with  %v' = aten::reshape(%x', ...) returned
        _root(%v) = _root(%x)
    """
    while True:
        value = chain_root(value)
        group = value.node()
        if not is_group(group):
            return value
        sub = group.g("Subgraph")
        k = next(i for i, o in enumerate(group.outputs()) if o.unique() == value.unique())
        inner = chain_root(outputs_of(sub)[k])
        params = [v.unique() for v in inputs_of(sub)]
        if inner.unique() not in params:
            return value
        value = group.inputsAt(params.index(inner.unique()))


def _feeds_external(consumer: Any, producer: Any) -> bool:
    """Whether merging `producer` into the group `consumer` would put a node computed in the
    group before an external call that reads it."""
    if not is_group(consumer):
        return False
    return any(feeds_external(consumer, v) for v in outputs_of(producer))


def _order(a: Any, b: Any) -> int:
    return 0 if a == b else (-1 if a.isBefore(b) else 1)


#: Nodes that neither raise nor have effects: a shape check may move across them.
_INERT = frozenset({"prim::Constant", "prim::GetAttr", "prim::ListConstruct",
                    "prim::TupleConstruct", "prim::unchecked_cast", "aten::dim",
                    "nncfuse::channels_last_weight", "nncfuse::autocast_weight"})


def _keeps_check_order(producer: Any, consumer: Any) -> bool:
    """Whether moving `producer` and `consumer` together keeps the order of every shape
    check and the nodes that could raise (or have effects) between them: eager's error for a
    bad input is the first check's, or the first failing op's. A check crosses inert nodes
    only, and nothing crosses a check."""
    between = []
    node = consumer.prev()
    while node != producer:
        between.append(node)
        node = node.prev()
    if any(map(holds_check, between)):
        return False
    moved = holds_check(producer) or holds_check(consumer)
    return not moved or all(n.kind() in _INERT for n in between)


def _move_together(producer: Any, consumer: Any, checks: bool = True) -> bool:
    """Make `producer` immediately precede `consumer` if data dependences allow, and the
    order of shape checks (`_keeps_check_order`; with `checks`: the graph may hold some)."""
    if not producer.isBefore(consumer):
        return False
    if consumer.prev() == producer:
        return True
    if checks and not _keeps_check_order(producer, consumer):
        return False
    users_between = any(use.user.isBefore(consumer)
                        for v in outputs_of(producer) for use in v.uses())
    if not users_between:
        producer.moveBefore(consumer)
        return True
    defined_between = any(
        v.node().isAfter(producer)
        for v in inputs_of(consumer)
        if v.node().owningBlock() == consumer.owningBlock()
    )
    if not defined_between:
        consumer.moveAfter(producer)
        return True
    return False


def fusion_groups(graph: Any) -> list[Any]:
    """Every fusion-group node of `graph`, nested blocks and other nodes' subgraphs (the
    autodiff path's f, `AutodiffPlan.graph`) included, in order. `graph` may be None, what
    `graph_for` returns for a call that runs unfused without a graph: it has none."""
    found: list[Any] = []
    if graph is None:
        return found

    def visit(block: Any) -> None:
        for node in block.nodes():
            if is_group(node) or guard.is_fused_op(node):
                found.append(node)
            elif node.hasAttribute("Subgraph"):  # an autodiff node as `graph_for` shows it
                visit(node.g("Subgraph").block())
            for sub in blocks_of(node):
                visit(sub)

    visit(graph.block())
    return found


def why_not_fused(graph: torch._C.Graph, options: Options) -> Callable[[Any], str | None]:
    """The fuser's verdict on the nodes of `graph`, for tools (`nncfuse.explain`): a function
    from a node to the reason it may not join a group (what `>>tensorexpr_fuser` logs), or
    None if it may. Alias safety is judged on `graph` as it is (an optimized graph keeps the
    writes of the one the fuser saw)."""
    return _Fuser(graph, options).why_not


_SPLITS = {"aten::chunk", "aten::split", "aten::split_with_sizes", "aten::unsafe_chunk",
           "aten::unsafe_split", "aten::unbind"}


#: Non-tensor operands that never size a lowered op's result when not constants.
_SIZELESS = (torch._C.FloatType, torch._C.BoolType, torch._C.NoneType)


def _size_fixed(value: Any, seen: dict[int, bool]) -> bool:
    """Whether the sizes of tensor `value` follow from the plan's signature: an argument of
    the graph, or the result of ops nncfuse lowers (whose sizes follow from their operands')
    on such tensors, constants and floats or bools (ints may be sizes: `arange(n)`,
    `view(x, [n])`). Not a module attribute (`prim::GetAttr`: it may be replaced by one of
    another shape), nor anything else."""
    key = value.unique()
    if key not in seen:
        seen[key] = False  # (no cycles in a block; this only bounds the walk)
        seen[key] = _made_from_fixed(value, seen)
    return seen[key]


def _made_from_fixed(value: Any, seen: dict[int, bool]) -> bool:
    node = value.node()
    if node.kind() == "prim::Param":
        return node.owningBlock().owningNode() is None and is_tensor(value)
    if node.kind() == "prim::Constant":
        return True
    if node.kind() == "prim::ListConstruct":
        return all(is_tensor(v) and _size_fixed(v, seen) for v in inputs_of(node))
    if blocks_of(node) or lowering_for(node)[0] is None or not is_tensor(value):
        return False
    return all(
        v.node().kind() == "prim::Constant" or isinstance(v.type(), _SIZELESS)
        or (is_tensor(v) or v.node().kind() == "prim::ListConstruct") and _size_fixed(v, seen)
        for v in inputs_of(node))


def _chunks_to_slices(graph: Any, block: Any) -> None:
    """Spell `chunk`, `split` and `unbind` unpacked into their parts as one `slice` (`select`
    for unbind) per part, which fuse: the same views of the same input.

        %l : Tensor[] = aten::chunk(%x, 2, 1)           %a = aten::slice(%x, 1, 0, 3, 1)
        %a : Tensor, %b : Tensor = prim::ListUnpack(%l) -> %b = aten::slice(%x, 1, 3, 6, 1)

    Each part's extent along the dim comes from its profiled type, so the slices are right
    only at the profiled size of the input: a split whose list is used otherwise, whose
    operands are not constants, or whose input's size the plan does not fix (`_size_fixed`)
    stays as it is. Where the slices join a group, its TypeCheck guards that size; but they
    also run unguarded, outside groups and in the guard's fallback (run when the TypeCheck
    fails), so the input's size must not change while the plan's signature stays: a module
    attribute replaced by one of another shape, `torch.arange(n)` with `n` an int argument
    (a value, not part of the signature) would be sliced at the old size. Not done where
    dynamic kernels are made (they slice along a dim of symbolic size by constant bounds, as
    `x[:, -1:]` does at every size), and dynamic plans serve other sizes of an argument only
    where `policy._dynamic_only` finds every constant view along a dim of fixed size.
    """
    for node in list(block.nodes()):
        for sub in blocks_of(node):
            _chunks_to_slices(graph, sub)
        if node.kind() != "prim::ListUnpack" or node.input().node().kind() not in _SPLITS:
            continue
        split = node.input().node()
        if len(node.input().uses()) != 1:
            continue
        source = split.inputsAt(0)
        operands = [v.toIValue() for v in inputs_of(split)[1:]
                    if v.node().kind() == "prim::Constant"]
        if len(operands) != split.inputsSize() - 1 or not is_tensor(source):
            continue
        if not _size_fixed(source, {}):
            _log.update("Not slicing ", split.kind(), ": its input's size is not fixed by "
                        "the signature")
            continue
        ndim = source.type().dim()
        sizes = [v.type().sizes() if is_tensor(v) else None for v in outputs_of(node)]
        if ndim is None or None in sizes or any(s is None or None in s for s in sizes):
            continue
        dim = (operands[0] if split.kind() == "aten::unbind" else operands[-1]) % max(ndim, 1)
        with graph.insert_point_guard(node):
            start = 0
            for out, size in zip(outputs_of(node), sizes):
                if split.kind() == "aten::unbind":
                    args = [source, graph.insertConstant(dim), graph.insertConstant(start)]
                    part = graph.create("aten::select", args, 1)
                    start += 1
                else:
                    end = start + size[dim]
                    args = [source, *(graph.insertConstant(c) for c in (dim, start, end, 1))]
                    part = graph.create("aten::slice", args, 1)
                    start = end
                graph.insertNode(part)
                part.output().setType(out.type())
                out.replaceAllUsesWith(part.output())
        node.destroy()
        split.destroy()


def fuse_tensor_exprs(
    graph: torch._C.Graph, options: Options, keep: list[runtime.FusedOp] | None = None
) -> list[guard.CompileFailure]:
    """Form, compile and guard fusion groups in `graph`, in place; return the groups that
    failed to compile (they run unfused). The ops the graph runs go to `keep`, which must
    live as long as the graph (`guard_fusion_groups`)."""
    _log.dump("Before TExprFuser:\n", graph)
    make_autocast_casts_explicit(graph)
    batch_weight_casts(graph)
    gemms_as_linears(graph)
    unflatten_linears(graph)
    fold_quantized_weights(graph)
    convolutions_to_channels_last(graph)
    if options.dynamic is not True:
        # (Not for dynamic kernels: a part's bounds are its profiled size's, and a dynamic
        # kernel slices along a dim of symbolic size by constant bounds: `x[:, -1:]`.)
        _chunks_to_slices(graph, graph.block())
    write_backs = frozenset(functionalize_input_writes(graph))
    _Fuser(graph, options, write_backs).run(graph.block())
    _log.dump("After creating fusion groups:\n", graph)
    groups = [n for n in fusion_groups(graph) if is_group(n)]
    failures = guard.guard_fusion_groups(graph, groups, options, keep)
    _log.dump("After guarding fusion groups:\n", graph)
    torch._C._jit_pass_dce(graph)
    _log.dump("After TExprFuser:\n", graph)
    return failures
