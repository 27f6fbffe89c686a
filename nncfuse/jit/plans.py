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

from ..tensorexpr.codegen.entry import (
    ArgSource,
    ConstSource,
    ReturnOne,
    Returns,
    ReturnTuple,
    Source,
    overlaps,
)
from ..tensorexpr.kernel import TensorExprKernel
from . import runtime


class Plan(Protocol):
    graph: torch._C.Graph | None

    def run(self, args: tuple[Any, ...]) -> Any: ...


def run_as_built(fn: Callable[..., Any], *args: Any) -> Any:
    """Call `fn`, a graph function, with TorchScript's own optimizing passes off.

    The switch is thread-local (tests/jit/test_threads.py checks it): this
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
    """Runs an optimized graph in the TorchScript interpreter."""

    def __init__(self, graph: torch._C.Graph, receiver: Any):
        self.graph = graph
        self.receiver = receiver
        self.fn = torch._C._create_function_from_graph("nncfuse_fused", graph)

    def run(self, args: tuple[Any, ...]) -> Any:
        full = args if self.receiver is None else (self.receiver, *args)
        return run_as_built(self.fn, *full)


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
        checked = {out.unique(): inp for inp, out in zip(check.inputs(), check.outputs())}
    else:
        return None
    position = {v.unique(): k for k, v in enumerate(graph.inputs())}
    sources: list[Source] = []
    for v in fused.inputs():
        v = checked.get(v.unique(), v)
        if v.unique() in position:
            sources.append(ArgSource(position[v.unique()]))
        elif v.node().kind() == "prim::Constant":
            sources.append(ConstSource(v.toIValue()))
        else:
            return None
    results = {v.unique(): k for k, v in enumerate(branch.outputs())}
    returned = list(tuple_out.inputs()) if tuple_out is not None else list(graph.outputs())
    if tuple_out is not None and list(graph.outputs()) != [tuple_out.output()]:
        return None
    if any(v.unique() not in results for v in returned):
        return None
    indices = tuple(results[v.unique()] for v in returned)
    one = tuple_out is None and len(indices) == 1
    returns = ReturnOne(indices[0]) if one else ReturnTuple(indices)
    return KernelPlan(graph, runtime.kernel_of(fused), sources, returns)
