"""FusedFunction: what `nncfuse.jit` returns. Profile, then optimize, then run.

Calls are keyed by their input signature: each tensor's dtype, sizes,
strides, device and requires_grad, the type of every other argument, and
whether grad mode is on. Number values are not part of the key: they are
kernel arguments. For a new signature:

1. the function's graph, with profile nodes, runs `profiling_runs` times
   (each call returns its real result); a graph of elementwise ops only, with
   no control flow, called with contiguous tensors, is instead typed by
   running it on meta tensors, which then compute output metadata exactly as
   the CPU does, so that its first call already runs compiled code (once
   TorchDynamo is loaded: see `_meta_is_cheap`);
2. the profiled graph is fused (`tensorexpr_fuser`): groups are formed,
   compiled and guarded;
3. the optimized graph becomes this signature's plan. When the whole graph
   is one guarded kernel over the function's inputs, the plan calls the
   kernel directly, skipping the interpreter (the key already implies the
   TypeCheck); otherwise the TorchScript interpreter runs the graph.

At most `max_specializations` signatures are optimized; calls with further
signatures run the unfused scripted function. Failures to optimize are
logged and also fall back to it: a call is never wrong and never crashes
where the unfused function would not.
"""

from __future__ import annotations

import dataclasses
import functools
import sys
import warnings
from collections.abc import Callable
from typing import Any

import torch

from .. import log
from ..config import Options
from ..tensorexpr.lowerings import lowering_for
from ..tensorexpr.meta import infer_types
from . import runtime, scripting
from .guard import CompileFailure
from .profiling import Profiler
from .tensorexpr_fuser import fuse_tensor_exprs

_log = log.get_logger(__file__)
#: Strict fusion, installed by `nncfuse.explain` (a layer above): `strict_check(plan,
#: failures, options)` returns the plan, or one that raises StrictFusionError.
strict_check: Callable[..., Any] | None = None


def _signature(args: tuple[Any, ...]) -> tuple[Any, ...]:
    """What a plan is specialized to: tensor metadata, other arguments' types (of the items
    of lists, tuples and dicts too), grad mode."""
    return (torch.is_grad_enabled(), *[
        (a.dtype, a.shape, a.stride(), a.device, a.requires_grad)
        if isinstance(a, torch.Tensor)
        else scripting.annotation(a) if type(a) in (list, tuple, dict) else type(a)
        for a in args
    ])


def _run_as_built(fn: Callable[..., Any], *args: Any) -> Any:
    """Call `fn`, a graph function, with TorchScript's own optimizing passes off.

    The switch is thread-local; it is restored after the call.
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
        return _run_as_built(self.fn, *full)


class KernelPlan:
    """Calls one kernel directly: the optimized graph is a single guarded fusion group.

    `run` is generated code (`codegen/entry.py`) that takes the function's
    arguments, allocates the outputs, calls the machine code and returns what
    the function returns.
    """

    def __init__(self, graph: torch._C.Graph, kernel: Any, sources: list, returns: Any):
        self.graph = graph
        self.run = kernel.entry(sources, returns)


class UnfusedPlan:
    """The scripted function itself."""

    def __init__(self, script: Callable[..., Any], graph: torch._C.Graph | None):
        self.graph = graph
        self.script = script

    def run(self, args: tuple[Any, ...]) -> Any:
        return self.script(*args)


def _all_contiguous(args: tuple[Any, ...]) -> bool:
    """Whether every tensor argument has exactly row-major strides: then meta tensors get
    eager's output strides.

    Some meta kernels (decompositions) lay out outputs of strided or broadcast
    (stride 0) inputs differently than the CPU kernels; for row-major inputs
    both give row-major outputs. (`is_contiguous` is too lenient: it accepts
    any strides on size-1 and empty dimensions.)
    """
    for a in args:
        if isinstance(a, torch.Tensor):
            expect = 1
            for size, stride in zip(reversed(a.shape), reversed(a.stride())):
                if stride != expect:
                    return False
                expect *= size
    return True


def _meta_is_cheap() -> bool:
    """Whether typing on meta tensors costs less than a profiling run.

    Many meta kernels are Python decompositions wrapped to disable TorchDynamo,
    and the first call of one imports `torch._dynamo`: 1.3 s, once per process.
    Until something else (torch.compile) has imported it, a profiling run at
    eager speed is far cheaper.
    """
    return "torch._dynamo" in sys.modules


def _elementwise(node: Any) -> bool:
    """Whether `node` is a constant, a tuple of results, or an op with a lowering."""
    if node.kind() in ("prim::Constant", "prim::TupleConstruct"):
        return True
    return not list(node.blocks()) and lowering_for(node)[0] is not None


def _values(graph: torch._C.Graph) -> list[Any]:
    return [*graph.inputs(), *(v for n in graph.nodes() for v in n.outputs())]


def _kernel_plan(graph: torch._C.Graph) -> KernelPlan | None:
    """A KernelPlan if `graph` is TypeCheck + If(kernel) over its inputs, else None."""
    nodes = [n for n in graph.nodes() if n.kind() != "prim::Constant"]
    tuple_out = None
    if nodes and nodes[-1].kind() == "prim::TupleConstruct":
        tuple_out = nodes.pop()
    if [n.kind() for n in nodes] != ["prim::TypeCheck", "prim::If"]:
        return None
    check, branch = nodes
    fused_nodes = list(next(iter(branch.blocks())).nodes())
    if len(fused_nodes) != 1 or not runtime.is_fused_op(fused_nodes[0]):
        return None
    fused = fused_nodes[0]
    position = {v.unique(): k for k, v in enumerate(graph.inputs())}
    checked = {out.unique(): inp for inp, out in zip(check.inputs(), check.outputs())}
    sources: list[tuple[str, Any]] = []
    for v in fused.inputs():
        v = checked.get(v.unique(), v)
        if v.unique() in position:
            sources.append(("arg", position[v.unique()]))
        elif v.node().kind() == "prim::Constant":
            sources.append(("const", v.toIValue()))
        else:
            return None
    results = {v.unique(): k for k, v in enumerate(branch.outputs())}
    returned = list(tuple_out.inputs()) if tuple_out is not None else list(graph.outputs())
    if tuple_out is not None and list(graph.outputs()) != [tuple_out.output()]:
        return None
    if any(v.unique() not in results for v in returned):
        return None
    indices = tuple(results[v.unique()] for v in returned)
    returns: Any = indices if tuple_out is not None or len(indices) != 1 else indices[0]
    return KernelPlan(graph, runtime.kernel_of(fused), sources, returns)


_ELEMENTWISE_INPUTS = (torch._C.TensorType, torch._C.FloatType, torch._C.IntType,
                       torch._C.BoolType, torch._C.NoneType)
_MISSING = object()  # a parameter without a default


@dataclasses.dataclass(frozen=True)
class _Variant:
    """One scripted form of the function: what it runs unfused and the graph it fuses from."""

    script: Any  # a ScriptFunction, or a ScriptModule's forward method
    receiver: Any  # the module's C++ object (the graph's `self`), or None
    graph: torch._C.Graph  # inlined, in-place ops removed
    elementwise_only: bool  # see FusedFunction._infer_types
    parameters: list[Any]  # the schema's arguments after `self`
    defaults: list[tuple[str, Any]]  # (name, default or _MISSING) of each, for `_bind`

    def run(self, args: tuple[Any, ...]) -> Any:
        return self.script(*args)


def _variant(script: Any, receiver: Any) -> _Variant:
    parameters = script.schema.arguments[1 if receiver is not None else 0 :]
    defaults = [(a.name, a.default_value if a.has_default_value() else _MISSING)
                for a in parameters]
    graph = script.graph.copy()
    torch._C._jit_pass_inline(graph)
    # Folds lists of constants (expand's sizes) into constants, which fuse.
    torch._C._jit_pass_constant_propagation(graph)
    torch._C._jit_pass_remove_mutation(graph)
    torch._C._jit_pass_dce(graph)
    elementwise_only = (
        receiver is None
        and all(_elementwise(n) for n in graph.nodes())
        and all(isinstance(v.type(), _ELEMENTWISE_INPUTS) for v in graph.inputs())
    )
    return _Variant(script, receiver, graph, elementwise_only, parameters, defaults)


def _bind(parameters: list[tuple[str, Any]], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """`args` and `kwargs` as one tuple of `parameters`, (name, default or _MISSING) pairs;
    None if they do not bind."""
    if len(args) > len(parameters):
        return None
    bound = list(args)
    for name, default in parameters[len(args) :]:
        if name in kwargs:
            bound.append(kwargs.pop(name))
        elif default is not _MISSING:
            bound.append(default)
        else:
            return None
    return None if kwargs else tuple(bound)


class FusedFunction:
    """A function, ScriptFunction or ScriptModule that runs with fused kernels.

    A ScriptFunction or module has one scripted form. A plain Python function
    is scripted once per pattern of argument types (`scripting.py`), with each
    parameter typed by its value as eager Python would treat it; a function
    TorchScript cannot compile runs eagerly, with a warning.
    """

    def __init__(self, fn: Any, options: Options):
        self.options = options
        self.target = fn
        self._variants: dict[scripting.Pattern, _Variant | None] = {}
        self._last: _Variant | None = None
        self._plans: dict[tuple[Any, ...], Any] = {}
        self._profiles: dict[tuple[Any, ...], tuple[Profiler, Any]] = {}
        self._params: list[tuple[str, Any]] | None = None  # a plain function's, with variants
        self._arity = -1  # number of arguments once known: enables the fast path
        self._optimized = 0  # signatures optimized, up to options.max_specializations
        #: groups that failed to lower or compile (they run unfused), for tools and tests
        self.compile_failures: list[CompileFailure] = []
        if not isinstance(fn, (torch.nn.Module, torch.jit.ScriptFunction)):
            params = scripting.parameters(fn)
            if params is not None:
                self._params = [(p.name, _MISSING if p.default is p.empty else p.default)
                                for p in params]
                self._arity = len(params)
        if callable(fn) and not isinstance(fn, torch.nn.Module):
            functools.update_wrapper(self, fn, updated=())

    # -- set-up -------------------------------------------------------------------
    def _prepare(self, types: scripting.Pattern = ()) -> _Variant | None:
        """The scripted form for argument types `types` (plain functions), or None if none."""
        if types not in self._variants:
            with warnings.catch_warnings():
                # torch.jit.script/trace warn that TorchScript is deprecated; that is our substrate.
                warnings.filterwarnings("ignore", category=DeprecationWarning, module="torch.jit")
                self._variants[types] = self._script(types)
        variant = self._variants[types]
        if variant is not None:
            self._last = variant
            if self._arity < 0:
                self._arity = len(variant.parameters)
        return variant

    def _script(self, types: scripting.Pattern) -> _Variant | None:
        fn = self.target
        try:
            if isinstance(fn, torch.nn.Module) and not isinstance(fn, torch.jit.ScriptModule):
                fn = torch.jit.script(fn)
            if isinstance(fn, torch.jit.ScriptModule):
                return _variant(fn.forward, fn._c)
            if isinstance(fn, torch.jit.ScriptFunction):
                return _variant(fn, None)
            if self._params is None:
                return _variant(torch.jit.script(fn), None)
            return _variant(scripting.script(fn, types), None)
        except Exception as e:  # noqa: BLE001
            warnings.warn(f"nncfuse: cannot script {fn!r}, running it unfused: {e}", stacklevel=4)
            return None

    @property
    def graph(self) -> torch._C.Graph | None:
        """The graph nncfuse starts from (inlined, in-place ops removed), of the last call's
        argument types; before any call, of the declared ones."""
        variant = self._last or self._prepare()
        return None if variant is None else variant.graph

    def _bind_args(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """All arguments by position (defaults filled in), or None if they do not bind."""
        if self._params is not None:
            return _bind(self._params, args, dict(kwargs))
        variant = self._prepare()
        return None if variant is None else _bind(variant.defaults, args, dict(kwargs))

    def _variant_for(self, values: tuple[Any, ...]) -> _Variant | None:
        """The scripted form that takes `values`, or None if there is none."""
        if self._params is not None:
            variant = self._prepare(scripting.pattern(values))
        else:
            variant = self._prepare()
        if variant is None or not scripting.accepts(variant.parameters, values):
            return None
        return variant

    # -- calls ----------------------------------------------------------------------
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        # The common case first and in few steps: all arguments given, a plan exists.
        if not kwargs and len(args) == self._arity:
            plan = self._plans.get(_signature(args))
            if plan is not None:
                return plan.run(args)
        return self._call(args, kwargs)

    def _call(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if self.options.disable:
            return self.target(*args, **kwargs)
        values = self._bind_args(args, kwargs)
        if values is None:
            return self.target(*args, **kwargs)  # Python or TorchScript reports the error
        key = _signature(values)
        plan = self._plans.get(key)
        if plan is None:
            variant = self._variant_for(values)
            if variant is None:
                # Eager Python (or TorchScript, for a script) runs these arguments.
                self._plans[key] = plan = UnfusedPlan(self.target, None)
            else:
                return self._profile(key, values, variant)
        return plan.run(values)

    def _profile(self, key: tuple[Any, ...], args: tuple[Any, ...], variant: _Variant) -> Any:
        if self._optimized >= self.options.max_specializations:
            _log.update("Too many input signatures; running unfused")
            self._plans[key] = UnfusedPlan(variant.script, variant.graph)
            return variant.run(args)
        if (variant.elementwise_only and self.options.profiling_runs == 1
                and key not in self._profiles and _all_contiguous(args) and _meta_is_cheap()):
            graph = self._infer_types(variant.graph, args)
            if graph is not None:
                self._plans[key] = plan = self._optimize(graph, variant)
                return plan.run(args)
        if key not in self._profiles:
            graph = variant.graph.copy()
            profiler = Profiler(graph)
            fn = torch._C._create_function_from_graph("nncfuse_profile", graph)
            self._profiles[key] = (profiler, fn)
        profiler, fn = self._profiles[key]
        full = args if variant.receiver is None else (variant.receiver, *args)
        result = _run_as_built(profiler.run, fn, *full)
        if profiler.runs >= self.options.profiling_runs:
            del self._profiles[key]
            profiler.finish()
            self._plans[key] = self._optimize(profiler.graph, variant)
        return result

    @staticmethod
    def _infer_types(graph: torch._C.Graph, args: tuple[Any, ...]) -> torch._C.Graph | None:
        """A copy of `graph` typed by running it on meta tensors shaped like `args`, if that
        works.

        Only for graphs of elementwise ops without control flow, whose output
        metadata meta tensors compute exactly as the CPU does: then the first
        call runs compiled code instead of a profiling run at eager speed.
        """
        graph = graph.copy()
        position = {v.unique(): k for k, v in enumerate(graph.inputs())}

        def example(value: Any) -> Any:
            a = args[position[value.unique()]]
            if not isinstance(a, torch.Tensor):
                return a
            m = torch.empty_strided(a.shape, a.stride(), dtype=a.dtype, device="meta")
            return m.requires_grad_(a.requires_grad) if a.is_floating_point() else m

        try:
            metas = infer_types(graph, example)
        except Exception as e:  # noqa: BLE001 - profile by running instead
            _log.update("Types not inferred on meta tensors: ", e)
            return None
        for value in _values(graph):
            meta = metas.get(value.unique())
            if meta is not None:
                value.setType(dataclasses.replace(meta, device=torch.device("cpu")).to_type())
        return graph

    def _optimize(self, graph: torch._C.Graph, variant: _Variant) -> Any:
        self._optimized += 1
        try:
            failures = fuse_tensor_exprs(graph, self.options)
            self.compile_failures += failures
            plan = _kernel_plan(graph) if variant.receiver is None else None
            plan = plan or GraphPlan(graph, variant.receiver)
            if self.options.strict and strict_check is not None:
                plan = strict_check(plan, failures, self.options)
            return plan
        except Exception as e:  # noqa: BLE001
            _log.dump("Optimization failed, running unfused: ", type(e).__name__, ": ", e)
            warnings.warn(f"nncfuse: optimization failed, running unfused: {e}", stacklevel=4)
            return UnfusedPlan(variant.script, graph)

    def graph_for(self, *args: Any, **kwargs: Any) -> torch._C.Graph | None:
        """The optimized graph that runs for these inputs (profiling and compiling if needed);
        None when they run unfused without one (nncfuse disabled, the function not scripted)."""
        if self.options.disable:
            return None
        values = self._bind_args(args, kwargs)
        if values is None:
            return None
        key = _signature(values)
        for _ in range(self.options.profiling_runs + 1):
            if key in self._plans:
                break
            self(*args, **kwargs)
        return self._plans[key].graph
