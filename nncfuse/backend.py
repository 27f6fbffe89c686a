"""backend: `torch.compile(model, backend="nncfuse")`, FX graphs through nncfuse's pipeline.

    torch.compile(fn, backend="nncfuse")      # AOTAutograd: inference and training
    torch.compile(fn, backend="nncfuse_ts")   # Dynamo's graphs as they are (no autograd split)

No import is needed: pyproject.toml declares both names in the
`torch_dynamo_backends` entry-point group, and Dynamo imports this module
when a name is first looked up. Importing it also registers them (for a
source checkout that is not installed). `import nncfuse` never imports this
module: it imports `torch._dynamo`, 1.3 s.

Each FX graph Dynamo hands over (a graph break gives several) becomes a
`CompiledGraph`:

    FX GraphModule ──copy, strip overloads and devices──▶ torch.jit.script ──▶ TorchScript graph
        │                                                       │ `self` dropped when unused
        │ (fallback: the FX graph itself runs)                  ▼
        └──────────────────────────────────────────── Program ──▶ Policy: profile or type,
                                                                  fuse, guard, compile per
                                                                  input signature (as nncfuse.jit)

This is the conversion PyTorch's own `ts_compile` (torch/_functorch/compilers.py)
does, without freezing: parameters stay inputs. Dynamo's guards decide
recompiles; within one graph, nncfuse's TypeCheck guards still protect every
kernel, and a new input signature (Dynamo's `dynamic=True` passes varying
sizes to one graph) is a size class of the policy: a graph with symbolic sizes (SymInt
inputs or sizes) gets dynamic kernels from the first call, one per size class (see
`jit/policy.py`); otherwise each signature its own static plan, up to `max_specializations`,
then runs unfused. A graph that cannot be converted (an op TorchScript does
not know, symbolic sizes it cannot type) runs as the FX graph would, and the
reason is logged; it never raises where eager would not.

"nncfuse" always goes through AOTAutograd, as Inductor does: nncfuse's kernels
record no autograd (inputs that require grad stay unfused), so training is
only fused when the graph is split into a forward and a backward of plain
ATen ops, each run with grad off. The forward, backward and inference graphs
each go through the path above. The partitioner is
`min_cut_rematerialization_partition`: cheap elementwise work is recomputed in
the backward, inside its fusion groups, instead of saved. The `*_backward` ops
of activations decompose into elementwise ops (`DECOMPOSITIONS`) so that they
fuse; ops with no lowering yet (native_layer_norm, ...) run unfused in ATen.

`NNCFUSE_LOG_LEVEL=backend` logs each graph's conversion and fallbacks;
`>backend` adds, per optimized signature, what fused (nncfuse.explain's
report); `>>backend` the TorchScript graphs. `compiled_graphs()` lists the
graphs compiled lately, for tests and tools.
"""

from __future__ import annotations

import collections
import copy
import dataclasses
import itertools
import operator
import threading
import warnings
from collections.abc import Callable, Sequence
from importlib.metadata import EntryPoint
from typing import Any

import torch
import torch._dynamo
from torch._dynamo.backends import registry
from torch._dynamo.backends.common import aot_autograd
from torch._functorch.aot_autograd import make_boxed_func
from torch._functorch.compile_utils import strip_overloads
from torch._functorch.partitioners import min_cut_rematerialization_partition
from torch.utils._python_dispatch import _disable_current_modes

from . import log
from .config import Options
from .explain import report_for
from .jit.policy import Policy, Program, program, signature

__all__ = ["nncfuse", "nncfuse_ts", "make_backend", "CompiledGraph", "compiled_graphs",
           "DECOMPOSITIONS"]

_log = log.get_logger(__file__)
_ids = itertools.count()
_recent: collections.deque[CompiledGraph] = collections.deque(maxlen=64)
_recent_lock = threading.Lock()

aten = torch.ops.aten
#: Decomposed before partitioning, into elementwise ops that fuse: the backward ops of
#: activations (functorch's `default_decompositions` for ts_compile, less the forward
#: activations and masked_fill, which nncfuse lowers as they are).
DECOMPOSITIONS = torch._decomp.get_decompositions([
    aten.detach, aten.gelu_backward, aten.leaky_relu_backward, aten.sigmoid_backward,
    aten.threshold_backward, aten.hardtanh_backward, aten.hardsigmoid_backward,
    aten.hardswish_backward, aten.tanh_backward, aten.silu_backward, aten.elu_backward,
    aten.is_same_size,
])


class CompiledGraph:
    """One FX graph as nncfuse runs it: its TorchScript program under a policy, or, where it
    could not be converted, the FX graph itself (`reason` says why)."""

    def __init__(self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any], kind: str,
                 options: Options):
        self.id = next(_ids)
        self.kind = kind  # "dynamo" (nncfuse_ts), "forward", "backward" or "inference"
        self.gm = gm
        if options.dynamic is None and _symbolic(example_inputs):
            options = dataclasses.replace(options, dynamic=True)  # Dynamo's dynamic sizes
        self.options = options
        self.policy = Policy(options)
        self.reason: str | None = None  # why the FX graph runs instead, if it does
        #: whether running the graph twice is harmless (AOTAutograd's graphs are functional)
        self.functional = kind != "dynamo" or _functional(gm)
        self.program: Program | None = None
        try:
            # Dynamo and AOTAutograd compile under a fake-tensor mode; constant propagation
            # must make real tensors.
            with _disable_current_modes():
                self.program = _convert(gm, example_inputs)
        except Exception as e:  # noqa: BLE001 - whatever fails, the FX graph runs
            self.reason = f"not converted to TorchScript: {_brief(e)}"
        if self.program is None:
            _log.dump(f"Graph {self.id} ({kind}) runs as the FX graph: ", self.reason)
        else:
            _log.dump(f"Graph {self.id} ({kind}) converted to TorchScript")
            _log.debug(f"Graph {self.id} ({kind}):\n", self.program.graph)
        with _recent_lock:
            _recent.append(self)

    @property
    def graph(self) -> torch._C.Graph | None:
        """The TorchScript graph nncfuse starts from, or None (the FX graph runs)."""
        return None if self.program is None else self.program.graph

    def graphs(self) -> list[torch._C.Graph]:
        """The optimized graphs of the signatures seen so far (for `nncfuse.fusion_groups`)."""
        return [p.graph for p in list(self.policy.plans.values()) if p.graph is not None]

    def __call__(self, *args: Any) -> Any:
        if self.program is None or self.options.disable:
            return self.gm(*args)
        key = signature(args)
        try:
            plan = self.policy.plans.get(key)
            if plan is not None:
                return plan.run(args)
            result = self.policy.call(self.program, key, args)
        except Exception as e:  # noqa: BLE001 - the FX graph decides whether this is an error
            return self._after_failure(e, args)
        made = self.policy.plans.get(key)
        if made is not None and _log.enabled(log.UPDATE):
            self._log_report(made.graph)
        return result

    def _log_report(self, graph: torch._C.Graph | None) -> None:
        """Log what fused in `graph`, a new signature's optimized graph (nncfuse.explain)."""
        try:
            report: Any = report_for(graph, self.options, self.policy.compile_failures)
        except Exception as e:  # noqa: BLE001 - a log line never fails a call
            report = f"(no report: {_brief(e)})"
        _log.update(f"Graph {self.id} ({self.kind}), a new signature: ", report)

    def _after_failure(self, error: Exception, args: tuple[Any, ...]) -> Any:
        """The FX graph's result for `args`, whose TorchScript run raised `error`; from now on
        the FX graph runs every call. Where the FX graph raises too, that is the program's
        own error; where it may have written to its inputs, it cannot be run again."""
        if not self.functional:
            raise error
        result = self.gm(*args)  # raises what eager raises
        self.reason = f"the TorchScript program failed: {_brief(error)}"
        self.program = None
        _log.dump(f"Graph {self.id} ({self.kind}) runs as the FX graph from now on: ", self.reason)
        return result


def _symbolic(example_inputs: Sequence[Any]) -> bool:
    """Whether Dynamo made sizes symbolic (`dynamic=True`, or a dim that changed): SymInt
    inputs, or tensors with symbolic sizes. The graph then gets dynamic kernels at once."""
    return any(
        isinstance(x, torch.SymInt)
        or isinstance(x, torch.Tensor) and any(isinstance(s, torch.SymInt) for s in x.shape)
        for x in example_inputs
    )


def compiled_graphs() -> list[CompiledGraph]:
    """The graphs compiled lately (the last 64), oldest first."""
    with _recent_lock:
        return list(_recent)


def clear_compiled_graphs() -> None:
    with _recent_lock:
        _recent.clear()


_IN_PLACE_OPERATORS = {operator.setitem, operator.delitem, *(
    getattr(operator, name) for name in dir(operator) if name.startswith("__i") and name.endswith(
        "__") and name not in ("__index__", "__inv__", "__invert__", "__is__", "__is_not__"))}


def _functional(gm: torch.fx.GraphModule) -> bool:
    """Whether `gm` visibly writes to nothing (no in-place op, method or operator)."""
    for node in gm.graph.nodes:
        target = node.target
        if node.op == "call_module":
            return False
        if node.op == "call_method" and _in_place_name(target):
            return False
        if node.op == "call_function":
            if isinstance(target, torch._ops.OpOverload) and target._schema.is_mutable:
                return False
            if target in _IN_PLACE_OPERATORS or _in_place_name(getattr(target, "__name__", "")):
                return False
    return True


def _in_place_name(name: str) -> bool:
    return name.endswith("_") and not name.endswith("__")


def _brief(e: Exception) -> str:
    """`e` in a line: its type, its message's first line and, if longer, its last."""
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    text = " ... ".join(lines[:1] + lines[-1:]) if len(lines) > 1 else "".join(lines)
    return f"{type(e).__name__}: {text}"


# -- FX -> TorchScript ---------------------------------------------------------------------------
def _convert(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Program:
    """The TorchScript program of `gm`, as `ts_compile` converts it; raises if it cannot."""
    for x in example_inputs:
        if isinstance(x, torch.Tensor) and x.device.type != "cpu":
            raise ValueError(f"an input is on {x.device}")
    with warnings.catch_warnings():
        # TorchScript's deprecation, and its note on GraphModule's untyped attributes
        warnings.simplefilter("ignore")
        script = torch.jit.script(_scriptable(gm, example_inputs))
    graph = script.graph.copy()
    receiver = script._c
    if not list(next(graph.inputs()).uses()):
        graph.eraseInput(0)  # no attributes read (Dynamo lifts parameters to inputs)
        receiver = None
    unfused = script.forward if receiver is not None else torch._C._create_function_from_graph(
        "nncfuse_unfused", graph)
    return program(graph, unfused, receiver)


_NUMBER_TYPES = ((torch.SymBool, bool), (bool, bool), (torch.SymInt, int), (int, int),
                 (torch.SymFloat, float), (float, float))


def _scriptable(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> torch.fx.GraphModule:
    """A plain GraphModule copy of `gm` that `torch.jit.script` takes (the original stays as
    it is, for the fallback): inputs annotated by their examples (AOTAutograd's graphs take
    sizes unannotated, which TorchScript would read as tensors), ops by packet rather than
    overload, devices by type name, `_to_copy(x, dtype=...)` as `to`. A copy is never a lazy
    graph module."""
    graph = copy.deepcopy(gm.graph)
    for node, example in zip(graph.find_nodes(op="placeholder"), example_inputs):
        if node.type is None:
            node.type = next((t for kind, t in _NUMBER_TYPES if isinstance(example, kind)),
                             torch.Tensor if isinstance(example, torch.Tensor) else None)
    for node in graph.find_nodes(op="call_function", target=aten._to_copy.default):
        if len(node.args) == 1 and list(node.kwargs) == ["dtype"]:
            node.target = aten.to.dtype
    for node in graph.nodes:
        node.kwargs = {k: v.type if isinstance(v, torch.device) else v
                       for k, v in node.kwargs.items()}
        node.args = tuple(a.type if isinstance(a, torch.device) else a for a in node.args)
    fresh = torch.fx.GraphModule(gm, graph)
    strip_overloads(fresh)
    fresh.graph.lint()
    fresh.recompile()
    return fresh


# -- the backends --------------------------------------------------------------------------------
def _inner(kind: str, options: Options) -> Callable[..., Any]:
    """An AOTAutograd compiler for `kind` graphs, with the boxed calling convention."""

    def compile_graph(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Any:
        return make_boxed_func(CompiledGraph(gm, example_inputs, kind, options))

    return compile_graph


def make_backend(aot: bool = True, **options: Any) -> Callable[..., Any]:
    """A torch.compile backend with these nncfuse options (see `Options`): through
    AOTAutograd (`aot=True`, what "nncfuse" is) or Dynamo's graphs as they are ("nncfuse_ts")."""
    opts = Options.from_env(**options)
    if not aot:
        return lambda gm, example_inputs: CompiledGraph(gm, example_inputs, "dynamo", opts)
    return aot_autograd(
        fw_compiler=_inner("forward", opts),
        bw_compiler=_inner("backward", opts),
        inference_compiler=_inner("inference", opts),
        partition_fn=min_cut_rematerialization_partition,
        decompositions=DECOMPOSITIONS,
    )


def nncfuse(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Any:
    """The "nncfuse" backend: AOTAutograd, forward and backward (or inference) through nncfuse."""
    return make_backend(aot=True)(gm, example_inputs)


def nncfuse_ts(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Any:
    """The "nncfuse_ts" backend: Dynamo's FX graph to TorchScript to nncfuse, no AOTAutograd
    (inputs that require grad run unfused)."""
    return CompiledGraph(gm, example_inputs, "dynamo", Options.from_env())


def _register() -> None:
    """Register the backends by name, unless Dynamo is loading them from the entry point
    (it registers what the entry point names itself, and refuses a name twice)."""
    for name, fn in (("nncfuse", nncfuse), ("nncfuse_ts", nncfuse_ts)):
        if name not in registry._COMPILER_FNS and not isinstance(
                registry._BACKENDS.get(name), EntryPoint):
            registry.register_backend(fn, name=name)


_register()
