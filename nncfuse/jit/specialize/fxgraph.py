"""fxgraph: an FX graph (torch.compile's, AOTAutograd's) as nncfuse runs it.

    FX GraphModule ──copy, strip overloads and devices──▶ torch.jit.script ──▶ TorchScript graph
        │                                                       │ `self` dropped when unused
        │ (fallback: the FX graph itself runs)                  ▼
        └──────────────────────────────────────────── Program ──▶ Policy: profile or type,
                                                                  fuse, guard, compile per
                                                                  input signature (as nncfuse.jit)

This is the conversion PyTorch's own `ts_compile` (torch/_functorch/compilers.py)
does, without freezing: parameters stay inputs. A graph that cannot be converted
(an op TorchScript does not know, symbolic sizes it cannot type) runs as the FX
graph would, and the reason is logged; it never raises where eager would not.
A graph with symbolic sizes (Dynamo's `dynamic=True`, or a dim that changed: SymInt
inputs or sizes) gets dynamic kernels from the first call, one per size class
(`policy.py`); otherwise each signature its own static plan first.
The torch.compile backend (`nncfuse/backend.py`) and `nncfuse.jit` under
autograd (`autograd.py`) both run their forward and backward graphs here; under the
backend's autograd="autodiff" a Dynamo graph's calls that need autograd run the plan
it passes as `trains` (`autodiff.AutodiffPlan`).

Logged under `backend` (the module's name for the user: `NNCFUSE_LOG_LEVEL=backend`);
`compiled_graphs()` lists the graphs compiled lately, for tests and tools.
"""

from __future__ import annotations

import builtins
import collections
import copy
import dataclasses
import itertools
import operator
import re
import threading
import warnings
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import torch

from ... import log
from ...config import Options
from ..fuser.inplace import in_place
from ..fuser.weight_casts import cache_weight_casts
from . import collector, hooks
from .decompose import decompositions
from .policy import Policy, Program, program, signature
from .symbolic_sizes import sizes_from_inputs

__all__ = ["CompiledGraph", "compiled_graphs", "clear_compiled_graphs", "decompositions", "brief"]

_log = log.get_logger("backend.py")
_ids = itertools.count()
_recent: collections.deque[CompiledGraph] = collections.deque(maxlen=64)
_recent_lock = threading.Lock()
aten = torch.ops.aten



class CompiledGraph:
    """One FX graph as nncfuse runs it: its TorchScript program under a policy, or, where it
    could not be converted, the FX graph itself (`reason` says why)."""

    def __init__(self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any], kind: str,
                 options: Options, trains: Callable[[Program, Options], Any] | None = None):
        """`trains`: the plan of a signature that needs autograd (grad mode on, an input that
        requires grad), `trains(program, options)`, such as `autodiff.AutodiffPlan` (the
        backend's autograd="autodiff"); None: such calls run unfused, under eager autograd."""
        self.id = next(_ids)
        self.kind = kind  # "dynamo" (nncfuse_ts), "forward", "backward" or "inference"
        self.gm = gm
        if options.dynamic is None and _symbolic(example_inputs):
            options = dataclasses.replace(options, dynamic=True)  # Dynamo's dynamic sizes
        self.options = options
        self.policy = Policy(options, varying=_symbolic_dims(example_inputs))
        self.trains = trains
        self.reason: str | None = None  # why the FX graph runs instead, if it does
        #: whether running the graph twice is harmless (AOTAutograd's graphs are functional)
        self.functional = kind != "dynamo" or _functional(gm)
        self.program: Program | None = None
        #: the last signature's plan and its check (`_LastPlan`): a repeated call is checked
        #: there, not by `signature` (BERT's backward: 100 tensors, 7 us against 36)
        self._last: _LastPlan | None = None
        try:
            # Dynamo and AOTAutograd compile under a fake-tensor mode; constant propagation
            # must make real tensors.
            from torch.utils._python_dispatch import _disable_current_modes

            with _disable_current_modes(), collector.paused():
                self.program = _convert(gm, example_inputs,
                                        _weights(example_inputs) if kind == "inference" else ())
        except Exception as e:  # noqa: BLE001 - whatever fails, the FX graph runs
            self.reason = f"not converted to TorchScript: {brief(e)}"
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
        return self.policy.graphs()

    def __call__(self, *args: Any) -> Any:
        if self.program is None or self.options.disable:
            return self.gm(*args)
        last = self._last
        if last is not None and last.holds(args):
            try:
                return last.plan.run(args)
            except Exception as e:  # noqa: BLE001 - the FX graph decides whether this is an error
                return self._after_failure(e, args)
        key = signature(args)
        try:
            plan = self.policy.plans.get(key)
            if plan is not None:
                self._last = _last_plan(args, plan, self.policy.varying
                                        if self.policy.serves_every_size(plan) else None)
                return plan.run(args)
            prog, trains = self.program, self.trains
            if trains is not None and _needs_grad(args):
                # (no report of this plan: its f and df graphs are its `fused_graphs()`)
                return self.policy.call_with(key, lambda: trains(prog, self.options), args,
                                             prog.unfused)
            result = self.policy.call(prog, key, args)
        except Exception as e:  # noqa: BLE001 - the FX graph decides whether this is an error
            return self._after_failure(e, args)
        made = self.policy.plans.get(key)
        if made is not None and _log.enabled(log.UPDATE):
            self._log_report(made.graph)
        return result

    def _log_report(self, graph: torch._C.Graph | None) -> None:
        """Log what fused in `graph`, a new signature's optimized graph (nncfuse.explain)."""
        try:
            failures = self.policy.compile_failures
            report_ = "\n".join(  # `nncfuse.explain` registers its report (a layer above)
                str(report(graph, self.options, failures)) for report in hooks.GRAPH_REPORTS)
        except Exception as e:  # noqa: BLE001 - a log line never fails a call
            report_ = f"(no report: {brief(e)})"
        _log.update(f"Graph {self.id} ({self.kind}), a new signature: ", report_)

    def _after_failure(self, error: Exception, args: tuple[Any, ...]) -> Any:
        """The FX graph's result for `args`, whose TorchScript run raised `error`; from now on
        the FX graph runs every call. Where the FX graph raises too, that is the program's
        own error; where it may have written to its inputs, it cannot be run again."""
        if not self.functional:
            raise error
        result = self.gm(*args)  # raises what eager raises
        self.reason = f"the TorchScript program failed: {brief(error)}"
        self.program = None
        _log.dump(f"Graph {self.id} ({self.kind}) runs as the FX graph from now on: ", self.reason)
        # Not the program's error (the FX graph ran): nncfuse's, so say it, as a failed
        # optimization says it (a silent fallback once cost MobileNetV2's training its fusion).
        warnings.warn(f"nncfuse: graph {self.id} ({self.kind}) runs unfused from now on: "
                      f"{self.reason}", stacklevel=2)
        return result


class _LastPlan(NamedTuple):
    """A plan and what a call must be for it to run it without a `signature`: the grad mode,
    the arguments' types, ints within int64 (`signature`'s `BIG_INT`), and Dynamo's C++
    tensor check (dispatch keys, dtype, device, requires_grad, sizes, strides: what
    `signature` compares, and more) of the tensors (`tensors`: their positions, None where
    every argument is one)."""

    grad: bool
    kinds: tuple[type, ...]
    tensors: list[int] | None
    ints: list[int]
    check: Any
    plan: Any

    def holds(self, args: tuple[Any, ...]) -> bool:
        if self.grad is not torch.is_grad_enabled() or tuple(map(type, args)) != self.kinds:
            return False
        if not all(-(2**63) <= args[i] < 2**63 for i in self.ints):
            return False
        try:
            return self.check.check(*(args if self.tensors is None
                                      else [args[i] for i in self.tensors]))
        except TypeError:
            return False


def _last_plan(args: tuple[Any, ...], plan: Any, varying: frozenset[tuple[int, int]] | None
               ) -> _LastPlan | None:
    """`CompiledGraph._last` for a call of `args` (tensors and numbers, else None) that `plan`
    runs: its check takes these exact sizes and strides, but for the `varying` dims and the
    strides of their tensors (a dynamic plan that serves every size of Dynamo's symbolic
    dims: a decode step's cache length, which Dynamo's guards and the kernels' own check)."""
    kinds = tuple(map(type, args))
    if not all(k in (torch.Tensor, torch.nn.Parameter, int, float, bool) for k in kinds):
        return None
    from torch._C._dynamo.guards import TensorGuards

    varying = varying or frozenset()
    tensors = [(i, a) for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
    moving = {i for i, _ in varying}
    check = TensorGuards(
        *(a for _, a in tensors),
        dynamic_dims_sizes=[[None if (i, d) in varying else s for d, s in enumerate(a.shape)]
                            for i, a in tensors],
        dynamic_dims_strides=[[None] * a.dim() if i in moving else list(a.stride())
                              for i, a in tensors])
    positions = None if len(tensors) == len(args) else [i for i, _ in tensors]
    return _LastPlan(torch.is_grad_enabled(), kinds, positions,
                     [i for i, k in enumerate(kinds) if k is int], check, plan)


def _needs_grad(args: tuple[Any, ...]) -> bool:
    """Whether a call of `args` needs autograd: grad mode on, a tensor that requires grad."""
    return torch.is_grad_enabled() and any(
        isinstance(a, torch.Tensor) and a.requires_grad for a in args)


def _symbolic(example_inputs: Sequence[Any]) -> bool:
    """Whether Dynamo made sizes symbolic (`dynamic=True`, or a dim that changed): SymInt
    inputs, or tensors with symbolic sizes. The graph then gets dynamic kernels at once."""
    return any(
        isinstance(x, torch.SymInt)
        or isinstance(x, torch.Tensor) and any(isinstance(s, torch.SymInt) for s in x.shape)
        for x in example_inputs
    )


def _symbolic_dims(example_inputs: Sequence[Any]) -> frozenset[tuple[int, int]] | None:
    """The (input, dim) pairs whose sizes Dynamo made symbolic, or None when none is: the
    other dims' sizes are fixed for this graph (Dynamo guards them), so its dynamic kernels
    keep them static (a decode step's `view(1, 1, 64)` of the new token) instead of refusing
    their constant sizes (and the plan with them)."""
    dims = frozenset(
        (i, d) for i, x in enumerate(example_inputs) if isinstance(x, torch.Tensor)
        for d, s in enumerate(x.shape) if isinstance(s, torch.SymInt))
    return dims or None


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
        if node.op == "call_method" and in_place(target):
            return False
        if node.op == "call_function":
            if isinstance(target, torch._ops.OpOverload) and target._schema.is_mutable:
                return False
            if target in _IN_PLACE_OPERATORS or in_place(getattr(target, "__name__", "")):
                return False
    return True


def brief(e: Exception) -> str:
    """`e` in a line: its type, its message's first line and, if longer, its last."""
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    text = " ... ".join(lines[:1] + lines[-1:]) if len(lines) > 1 else "".join(lines)
    return f"{type(e).__name__}: {text}"


# -- FX -> TorchScript ---------------------------------------------------------------------------
def _weights(example_inputs: Sequence[Any]) -> list[int]:
    """The indices of the float32 inputs that are a module's parameters and buffers (what
    AOTAutograd, compiling the graph, calls its static inputs)."""
    from torch._guards import TracingContext

    context = TracingContext.try_get()
    metadata = context and context.fw_metadata
    static = (metadata and metadata.static_input_indices) or ()
    return [i for i in static if i < len(example_inputs)
            and isinstance(example_inputs[i], torch.Tensor)
            and example_inputs[i].dtype == torch.float32]


def _convert(gm: torch.fx.GraphModule, example_inputs: Sequence[Any],
             weights: Sequence[int] = ()) -> Program:
    """The TorchScript program of `gm`, as `ts_compile` converts it (the casts of `weights`,
    module state among the inputs, through the cast cache); raises if it cannot."""
    for x in example_inputs:
        if isinstance(x, torch.Tensor) and x.device.type != "cpu":
            raise ValueError(f"an input is on {x.device}")
    fx_graph = _scriptable(gm, example_inputs)
    graph = _compiled_function(fx_graph)
    receiver = None
    if graph is None:
        with warnings.catch_warnings():
            # TorchScript's deprecation, and its note on GraphModule's untyped attributes
            warnings.simplefilter("ignore")
            script = torch.jit.script(_module(gm, fx_graph))
        graph = script.graph.copy()
        receiver = script._c
        if not list(next(graph.inputs()).uses()):
            graph.eraseInput(0)  # no attributes read (Dynamo lifts parameters to inputs)
            receiver = None
    if weights:  # (the inputs after the receiver's, where there is one)
        cache_weight_casts(graph, [i + (receiver is not None) for i in weights])
    unfused = script.forward if receiver is not None else torch._C._create_function_from_graph(
        "nncfuse_unfused", graph)
    return program(graph, unfused, receiver)


#: The signature of FX's code, and its statements' tails that free values (`;  a = b = None`)
_SELF = re.compile(r"^def forward\(self(, |\))", re.M)
_FREES = re.compile(r"^( +)(.*);  ((?:\w+ = )+None)$", re.M)


def _compiled_function(fx_graph: torch.fx.Graph) -> torch._C.Graph | None:
    """The TorchScript graph of `fx_graph`'s code compiled as a function without `self`, by
    TorchScript's own parser (`torch.jit.script` of the module parses the code in Python,
    tokenizing it twice, and infers a type for each attribute: 3-4x the time); None where
    the code reads attributes or does not compile that way (the module is scripted then).
    The same statements as a GraphModule's forward (the code it would generate, without
    making the module or compiling that code in Python), names resolved in the code's
    globals."""
    if any(n.op in ("get_attr", "call_module") for n in fx_graph.nodes):
        return None
    code = fx_graph.python_code(root_module="self")
    src, count = _SELF.subn(lambda m: "def forward(" + (")" if m.group(1) == ")" else ""),
                            code.src, count=1)
    if count != 1:
        return None
    src = _FREES.sub(r"\1\2\n\1\3", src)  # the parser takes one statement a line
    names = code.globals

    def resolve(name: str) -> Any:
        return names[name] if name in names else getattr(builtins, name, None)

    unit = torch._C.CompilationUnit()
    try:
        unit.define(src, resolve)
    except RuntimeError as e:
        _log.debug("FX code not compiled as a function, scripting the module: ", brief(e))
        return None
    return unit.find_function("forward").graph.copy()


#: ATen's internal forms that equal a public op in a graph that writes to nothing
_PUBLIC = {
    aten._unsafe_view.default: aten.view.default,  # a view (of a fresh tensor: mm's output)
    aten._softmax.default: aten.softmax.int,  # half_to_float=False
    aten._log_softmax.default: aten.log_softmax.int,
}

_TRANSPOSES = (aten.t.default, aten.transpose.int)


def _same_view(node: torch.fx.Node) -> torch.fx.Node | None:
    """`x` if `node` is a view that is `x` itself (`alias(x)`, `t(t(x))`, or `transpose(
    transpose(x, a, b), a, b)`), else None: a kernel would copy what is already there."""
    if node.op != "call_function" or node.kwargs:
        return None
    if node.target is aten.alias.default and len(node.args) == 1:
        return node.args[0]
    inner = node.args[0] if node.args else None
    if (node.target in _TRANSPOSES and isinstance(inner, torch.fx.Node)
            and inner.target is node.target and not inner.kwargs
            and sorted(node.args[1:]) == sorted(inner.args[1:])
            and all(isinstance(d, int) and d >= 0 for d in node.args[1:])):
        return inner.args[0]
    return None


def _number_minus(node: torch.fx.Node) -> tuple[torch.fx.Node, Any] | None:
    """(y, c) if `node` is ATen's C++ `c - y` of a number `c` (TensorOperators.h writes it
    `empty_like(y).fill_(c).sub_(y)`; a math kernel's, such as `silu_backward`'s `1 - sigmoid`,
    which AOTAutograd's functionalization decomposes before any table) and `rsub(y, c)` is
    the same tensor: `y` floating point, `c` exact in its dtype; else None. The filled tensor
    is no op that fuses: it would end the fusion group of `y`'s producer and cost a fill.

        sub(fill(empty_like(y), c), y)   ==>   rsub(y, c)
    """
    if node.target is not aten.sub.Tensor or node.kwargs or len(node.args) != 2:
        return None
    filled, y = node.args
    if not (isinstance(filled, torch.fx.Node) and filled.target is aten.fill.Scalar
            and len(filled.users) == 1 and not filled.kwargs):
        return None
    empty, c = filled.args
    if not (isinstance(empty, torch.fx.Node) and empty.target is aten.empty_like.default
            and len(empty.users) == 1 and empty.args == (y,)
            and set(empty.kwargs.items()) <= {("memory_format", torch.preserve_format)}):
        return None
    example = y.meta.get("val") if isinstance(y, torch.fx.Node) else None
    if not (isinstance(example, torch.Tensor) and example.is_floating_point()
            and type(c) in (int, float)):
        return None
    exact = torch.tensor(c, dtype=example.dtype).item()
    return (y, c) if exact == c else None  # (a NaN is never exact: it stays)


_NUMBER_TYPES = ((torch.SymBool, bool), (bool, bool), (torch.SymInt, int), (int, int),
                 (torch.SymFloat, float), (float, float))


def _dtype_only(node: torch.fx.Node) -> bool:
    """Whether the `_to_copy` `node` casts the dtype alone: its layout and device, where
    given, are its input's (strided, on its device). AOTAutograd writes `x.to(dtype)`,
    `type_as` and the backward of a traced ReLU's float mask so:

        _to_copy(gt, dtype=torch.float32, layout=torch.strided, device=cpu)
          ==>  to(gt, dtype=torch.float32)                      (a cast that fuses)
    """
    source = node.args[0] if len(node.args) == 1 else None
    example = source.meta.get("val") if isinstance(source, torch.fx.Node) else None
    kwargs = node.kwargs
    if not isinstance(example, torch.Tensor) or "dtype" not in kwargs or not set(
            kwargs) <= {"dtype", "layout", "device"}:
        return False
    device = kwargs.get("device")
    return (kwargs.get("layout") in (None, torch.strided) and example.layout == torch.strided
            and (device is None or torch.device(device) == example.device))


def _scriptable(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> torch.fx.Graph:
    """A copy of `gm`'s graph whose code TorchScript compiles (the original stays as it is,
    for the fallback): inputs annotated by their examples (AOTAutograd's graphs take
    sizes unannotated, which TorchScript would read as tensors), ops by packet rather than
    overload, devices by type name, a `_to_copy` of the dtype alone as `to` (`_dtype_only`),
    `alias(x)` (detach, decomposed) and `t(t(x))` (linear's backward) as `x`, C++'s `c - y`
    as `rsub(y, c)` (`_number_minus`), the private ops of `_PUBLIC` as the public ones they
    equal in a functional graph, computed sizes that follow from their op's input as constants
    (`symbolic_sizes.py`)."""
    graph = copy.deepcopy(gm.graph)
    for node, example in zip(graph.find_nodes(op="placeholder"), example_inputs):
        if node.type is None:
            node.type = next((t for kind, t in _NUMBER_TYPES if isinstance(example, kind)),
                             torch.Tensor if isinstance(example, torch.Tensor) else None)
    _sym_sums_as_adds(graph)
    sizes_from_inputs(graph)
    for node in graph.find_nodes(op="call_function", target=aten._to_copy.default):
        if _dtype_only(node):
            node.target, node.kwargs = aten.to.dtype, {"dtype": node.kwargs["dtype"]}
    for node in graph.find_nodes(op="call_function", target=aten.sub.Tensor):
        found = _number_minus(node)
        if found is not None:
            filled = node.args[0]
            with graph.inserting_before(node):
                rsub = graph.call_function(aten.rsub.Scalar, found)
            rsub.meta = dict(node.meta)
            node.replace_all_uses_with(rsub)
            graph.erase_node(node)
            empty = filled.args[0]
            graph.erase_node(filled)
            graph.erase_node(empty)
    for private, public in _PUBLIC.items():
        for node in graph.find_nodes(op="call_function", target=private):
            if not node.kwargs and node.args[2:] in ((), (False,)):  # not half_to_float
                node.target, node.args = public, node.args[:2]
    returned = set(graph.find_nodes(op="output")[0].all_input_nodes)
    for node in list(graph.nodes):
        source = _same_view(node)
        # (returned: only a value computed here, not returned itself, may stand for it)
        if source is not None and (node not in returned or (
                source.op == "call_function" and source not in returned)):
            inner = node.args[0]
            node.replace_all_uses_with(source)
            graph.erase_node(node)
            if inner is not source and not inner.users:
                graph.erase_node(inner)
    for node in graph.nodes:
        node.kwargs = {k: v.type if isinstance(v, torch.device) else v
                       for k, v in node.kwargs.items()}
        node.args = tuple(a.type if isinstance(a, torch.device) else a for a in node.args)
    for node in graph.nodes:  # (what `strip_overloads` does, before the one recompile)
        if isinstance(node.target, torch._ops.OpOverload):
            node.target = node.target.overloadpacket
    graph.lint()
    return graph


def _sym_sums_as_adds(graph: torch.fx.Graph) -> None:
    """`torch.sym_sum((a, b, c))` as `a + b + c`: TorchScript has no `aten::sym_sum`, and
    Dynamo sums sizes with it once they are symbolic (GPT-2's decode graph, its cache length
    `1 + past`, once automatic dynamic shapes make `past` a size): without this, every decode
    step after the second ran as the FX graph, op by op, slower than eager."""
    for node in list(graph.find_nodes(op="call_function", target=torch.sym_sum)):
        if node.kwargs or len(node.args) != 1 or not isinstance(node.args[0], (list, tuple)):
            continue
        terms = list(node.args[0])
        if not terms:
            continue
        total: Any = terms[0]
        with graph.inserting_before(node):
            for term in terms[1:]:
                # (an FX node that adds two numbers is what FX emits as `a + b`)
                total = graph.call_function(operator.add, (total, term))
                total.meta = dict(node.meta)
        if isinstance(total, torch.fx.Node):  # (a number alone: left as it is, never seen)
            node.replace_all_uses_with(total)
            graph.erase_node(node)


def _module(gm: torch.fx.GraphModule, graph: torch.fx.Graph) -> torch.fx.GraphModule:
    """A plain GraphModule of `graph` (`_scriptable`'s) with `gm`'s attributes, for
    `torch.jit.script` where the code does not compile as a function: never a lazy graph
    module, which scripting does not take."""
    fresh = torch.fx.GraphModule(gm, graph)
    # Scripting infers a type for every attribute; for the FX graph (`_graph`) it tries to
    # compile torch.fx.Graph as a TorchScript class and fails: a third of the scripting.
    # The code reads no such attribute. (Each GraphModule has a class of its own.)
    type(fresh).__jit_ignored_attributes__ = ["_graph"]
    return fresh
