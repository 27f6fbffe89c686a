"""Plans: what runs the calls of one input signature, once the policy has decided.

A plan is an object with `run(args)` (all arguments by position) and `graph`
(what `graph_for` shows). There are three:

    GraphPlan     the optimized graph, in the TorchScript interpreter
    KernelPlan    one kernel called directly, when the optimized graph is a single
                  guarded fusion group over the function's inputs
    UnfusedPlan   the unfused function (past the policy's bounds, failures, no script)

`optimized_plan` picks between the first two for an optimized graph. Plans
hold no mutable state: any number of threads may run one at the same time.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import torch

from ...tensorexpr.codegen.entry import (
    ArgSource,
    ConstSource,
    ReturnOne,
    Returns,
    ReturnTuple,
    Source,
    overlaps,
)
from ...tensorexpr.kernel import TensorExprKernel
from ...tensorexpr.meta import inputs_of, outputs_of
from ..fuser import runtime


class Plan(Protocol):
    graph: torch._C.Graph | None

    def run(self, args: tuple[Any, ...]) -> Any: ...


def run_as_built(fn: Callable[..., Any], *args: Any) -> Any:
    """Call `fn`, a graph function, with TorchScript's own optimizing passes off.

    The switch is thread-local (tests/jit/frontend/test_threads.py checks it): this
    thread's save and restore cannot race with another's. It is restored after
    the call.
    """
    previous = torch._C._get_graph_executor_optimize()
    torch._C._set_graph_executor_optimize(False)
    try:
        return fn(*args)
    finally:
        torch._C._set_graph_executor_optimize(previous)


class GraphPlan:
    """Runs an optimized graph in the TorchScript interpreter (its repeated views folded
    first: `fold_same_views`)."""

    def __init__(self, graph: torch._C.Graph, receiver: Any):
        fold_same_views(graph)
        self.graph = graph
        self.receiver = receiver
        self.fn = torch._C._create_function_from_graph("nncfuse_fused", graph)

    def run(self, args: tuple[Any, ...]) -> Any:
        full = args if self.receiver is None else (self.receiver, *args)
        return run_as_built(self.fn, *full)


#: views whose result is their input's storage at its offset, fixed by their arguments alone
_SAME_VIEWS = frozenset({"aten::view", "aten::t", "aten::transpose", "aten::alias",
                         "aten::permute", "aten::unsqueeze", "aten::expand"})
#: uses through which a value leaves the graph (or a block): its identity is seen outside
_ESCAPES = frozenset({"prim::Return", "prim::TupleConstruct", "prim::ListConstruct"})


def fold_same_views(graph: torch._C.Graph) -> int:
    """Replace each view in `graph`'s top block that repeats an earlier one (the same op of
    the same value with the same arguments) by that one; return how many were folded.

    AOTAutograd's graphs take a view per use (BERT's backward views each gradient as
    `[128, 256]` and `[-1, 256]`, one for each of two GEMMs: 24 of 110 views, 41 of 135 in
    its forward), each a node of the interpreter and a tensor:

        %a = aten::view(%g, [128, 256])         %a = aten::view(%g, [128, 256])
        %b = aten::view(%g, [-1, 256])     ->   %m = aten::mm(%a, %w)
        %m = aten::mm(%a, %w)                   %t = aten::t(%a)
        %t = aten::t(%b)

    Both are the same memory seen the same way, so a reader cannot tell them apart; not
    where either may be written to (an in-place op, a kernel storing into its input: the
    metadata of a view may change) or where both leave the graph (two outputs that are one
    tensor: a gradient accumulated into one would change the other); where one does (a
    saved tensor of the forward), that one is both. A size of -1
    matches the earlier view's size there (the same element count: whenever one view is
    valid the other is the same view).
    """
    aliases = None
    seen: dict[tuple[Any, ...], list[tuple[Any, tuple[Any, ...] | None]]] = {}
    folded = 0
    for node in list(graph.nodes()):
        if node.kind() not in _SAME_VIEWS or node.outputsSize() != 1:
            continue
        key, sizes = _view_key(node)
        if key is None:
            continue
        earlier = seen.setdefault(key, [])
        same = next((n for n, s in earlier if s == sizes or _sizes_match(s, sizes)), None)
        if same is None:
            earlier.append((node, sizes))
            continue
        if aliases is None:
            aliases = graph.alias_db()
        values = (node.output(), same.output(), node.inputsAt(0))
        if _escapes(node.output()) and _escapes(same.output()) or any(
                aliases.has_writers(v) for v in values):
            continue
        node.output().replaceAllUsesWith(same.output())
        node.destroy()
        folded += 1
    return folded


def _view_key(node: Any) -> tuple[tuple[Any, ...] | None, tuple[Any, ...] | None]:
    """The view `node` as (op, its input, its arguments but a constant size list), and that
    size list (None if there is none); (None, None) where an argument is not a constant or a
    dim is negative (its meaning depends on the rank)."""
    inputs = inputs_of(node)
    args: list[Any] = []
    sizes = None
    for k, v in enumerate(inputs[1:], 1):
        if v.node().kind() != "prim::Constant":
            args.append(("value", v.unique()))
            continue
        value = v.toIValue()
        if node.kind() == "aten::view" and k == 1 and isinstance(value, list):
            sizes = tuple(value)
            continue
        if isinstance(value, list):
            value = tuple(value)
        if node.kind() in ("aten::transpose", "aten::unsqueeze", "aten::permute") and any(
                d < 0 for d in (value if isinstance(value, tuple) else (value,))):
            return None, None
        args.append(value)
    if node.kind() == "aten::transpose":
        args.sort()
    return (node.kind(), inputs[0].unique(), *args), sizes


def _sizes_match(first: tuple[Any, ...] | None, then: tuple[Any, ...] | None) -> bool:
    """Whether a view to `then` equals an earlier one to `first` (no -1 in it): the same
    sizes but at most one -1 in `then`."""
    if first is None or then is None or len(first) != len(then) or -1 in first:
        return False
    holes = [k for k, s in enumerate(then) if s == -1]
    return len(holes) <= 1 and all(s == t for s, t in zip(first, then) if t != -1)


def _escapes(value: Any) -> bool:
    """Whether `value` may leave the graph, or a block, as itself."""
    return any(use.user.kind() in _ESCAPES for use in value.uses())


class KernelPlan:
    """Calls one kernel directly: the optimized graph is a single guarded fusion group.

    `run` is generated code (`codegen/entry.py`) that takes the function's
    arguments, allocates the outputs, calls the machine code and returns what
    the function returns. Written inputs that overlap another argument are the
    policy's `OverlapGuardPlan`'s to catch (it runs the unfused program), so the
    entry does not check them a second time.
    """

    def __init__(
        self,
        graph: torch._C.Graph,
        kernel: TensorExprKernel,
        sources: list[Source],
        returns: Returns,
    ):
        self.graph = graph
        # A dynamic kernel's guard too: the policy puts a dynamic plan only under signatures
        # of its size class (`size_classes`), which is what the guard checks.
        self.run = kernel.entry(sources, returns, overlap_guarded=True, size_guarded=True)


class UnfusedPlan:
    """The scripted function itself (or the Python function, where there is no script)."""

    def __init__(self, script: Callable[..., Any], graph: torch._C.Graph | None):
        self.graph = graph
        self.script = script

    def run(self, args: tuple[Any, ...]) -> Any:
        return self.script(*args)


class OverlapGuardPlan:
    """Runs `plan` unless an argument the optimized graph writes into (`written`, by
    position) overlaps another tensor argument in memory; then `unfused` runs the call.

    The fuser rewrites writes to inputs as functional ops and write-backs (`inplace.py`),
    which is exact only when the written input shares no memory with another: where eager
    would see the write through the other argument, the functional graph would not.
    """

    def __init__(self, plan: Plan, written: tuple[int, ...], unfused: Plan):
        self.plan, self.written, self.unfused = plan, written, unfused
        self.graph = plan.graph

    def run(self, args: tuple[Any, ...]) -> Any:
        for k in self.written:
            if overlaps(args[k], args[:k] + args[k + 1 :]):
                return self.unfused.run(args)
        return self.plan.run(args)


def optimized_plan(graph: torch._C.Graph, receiver: Any) -> KernelPlan | GraphPlan:
    """The plan for an optimized graph: its kernel called directly where it can be (the
    signature already implies the TypeCheck), else the interpreter."""
    plan = _kernel_plan(graph) if receiver is None else None
    return plan or GraphPlan(graph, receiver)


def _kernel_plan(graph: torch._C.Graph) -> KernelPlan | None:
    """A KernelPlan if `graph` is TypeCheck + If(kernel) over its inputs, or a dynamic
    kernel's node alone (it guards itself), else None."""
    nodes = [n for n in graph.nodes() if n.kind() != "prim::Constant"]
    tuple_out = None
    if nodes and nodes[-1].kind() == "prim::TupleConstruct":
        tuple_out = nodes.pop()
    checked: dict[int, Any] = {}
    if len(nodes) == 1 and runtime.is_fused_op(nodes[0]) and runtime.kernel_of(nodes[0]).dynamic:
        fused = branch = nodes[0]
    elif [n.kind() for n in nodes] == ["prim::TypeCheck", "prim::If"]:
        check, branch = nodes
        fused_nodes = list(next(iter(branch.blocks())).nodes())
        if len(fused_nodes) != 1 or not runtime.is_fused_op(fused_nodes[0]):
            return None
        fused = fused_nodes[0]
        checked = {out.unique(): inp for inp, out in zip(inputs_of(check), outputs_of(check))}
    else:
        return None
    position = {v.unique(): k for k, v in enumerate(inputs_of(graph))}
    sources: list[Source] = []
    for v in inputs_of(fused):
        v = checked.get(v.unique(), v)
        if v.unique() in position:
            sources.append(ArgSource(position[v.unique()]))
        elif v.node().kind() == "prim::Constant":
            sources.append(ConstSource(v.toIValue()))
        else:
            return None
    results = {v.unique(): k for k, v in enumerate(outputs_of(branch))}
    returned = inputs_of(tuple_out) if tuple_out is not None else outputs_of(graph)
    if tuple_out is not None and outputs_of(graph) != [tuple_out.output()]:
        return None
    if any(v.unique() not in results for v in returned):
        return None
    indices = tuple(results[v.unique()] for v in returned)
    one = tuple_out is None and len(indices) == 1
    returns = ReturnOne(indices[0]) if one else ReturnTuple(indices)
    return KernelPlan(graph, runtime.kernel_of(fused), sources, returns)
