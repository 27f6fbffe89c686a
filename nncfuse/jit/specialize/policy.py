"""The specialization policy: which plan runs each input signature of a program.

A `Program` is what gets specialized: a TorchScript graph to fuse and a way
to run it unfused. A `FusedFunction` makes one per scripted variant of its
function; a torch.compile backend would make one from the TorchScript graph
of an FX graph (`program(graph, torch._C._create_function_from_graph(...))`),
with no Python function to script. Either hands calls to one `Policy`.

Calls are keyed by their input signature (`signature`): each tensor's dtype,
sizes, strides, device and requires_grad, the type of every other argument,
and whether grad mode is on. Number values are not part of the key: they are
kernel arguments. For a new signature the policy

1. types the graph: a graph of elementwise ops only, with no control flow,
   called with contiguous tensors, is typed by running it on meta tensors,
   which compute output metadata exactly as the CPU does, so that its first
   call already runs compiled code (once TorchDynamo is loaded: see
   `_meta_is_cheap`); any other graph, with profile nodes, runs
   `profiling_runs` times (each call returns its real result);
2. optimizes the typed graph into the signature's plan (`Policy.optimize`):
   fusion groups are formed, compiled and guarded (`tensorexpr_fuser`), and
   `plans.optimized_plan` picks how to run the result.

Static or dynamic. A static plan's kernels are specialized to exact sizes
and strides. A dynamic plan's kernels take their sizes as run-time arguments
(`tensorexpr/size_symbols.py`); when every computation of the optimized graph
runs in dynamic kernels, the plan serves every signature of its size class
(`size_class`: the signature without its sizes) and is put under each such
key as calls arrive, without compiling again. The `dynamic` option decides:
None (default, as torch.compile's automatic dynamic) optimizes a signature
statically the first time its size class is seen and dynamically the second
time (a dim changed); True dynamically at once; False never; a fusion
strategy (NNC's `[("STATIC", 2), ("DYNAMIC", 10)]`) takes its kinds in turn.
At most `max_specializations` plans are optimized; calls of a further size
class run with the dynamic plan of a class that generalizes theirs (the same
but for dims of equal size, which its kernels' guards admit:
`size_classes.generalizes`), else unfused (a class whose dims of 1, dtypes or
layouts differ fails every dynamic kernel's guard; its kernels would each run
their fallback). A size class that has a dynamic plan keeps running it.
Failures to optimize are logged and also run unfused: a call is never wrong
and never crashes where the unfused program would not.

Threads. `plans` maps each signature to a plan valid for every call with
that signature; only the policy writes it, and callers read it without a
lock (the fast path of `FusedFunction.__call__`: one dict lookup). Everything
else happens under the policy's lock: a thread that meets a signature
without a plan waits while another thread profiles or compiles it, then runs
the plan that thread made, so each signature is optimized exactly once
(PyTorch's graph executor also waits, on its compile mutex). Running a plan
happens outside the lock; a profiling run happens inside it, because the
profiler of a signature and its count of runs are not shared safely. The lock
is re-entrant, for a profiled graph that calls back into the same function.
"""

from __future__ import annotations

import dataclasses
import functools
import sys
import threading
import warnings
from collections.abc import Callable
from typing import Any

import torch

from ... import log
from ...config import Options
from ...tensorexpr import expr as E
from ...tensorexpr.codegen.entry import InputOutput
from ...tensorexpr.lowerings import EXTERNAL_KINDS, lowering_for
from ...tensorexpr.meta import all_nodes, blocks_of, infer_types, inputs_of, outputs_of
from ..fuser import runtime
from ..fuser.guard import STATIC_SIZES, CompileFailure, is_fused_op
from ..fuser.inplace import written_inputs
from ..fuser.tensorexpr_fuser import fuse_tensor_exprs
from ..rewrites.fold_tuples import fold_tuples
from ..rewrites.module_attributes import refine_module_attributes
from ..rewrites.traced_convolutions import untrace_convolutions
from ..rewrites.type_as import type_as_to
from . import collector, hooks, scripting
from .container_writes import caller_container_written
from .plans import OverlapGuardPlan, Plan, UnfusedPlan, optimized_plan, run_as_built
from .profiling import Profiler
from .saved_writes import saved_then_written
from .size_classes import ClassState, Shapes, autocast_state, generalizes, shapes, size_class

_log = log.get_logger(__file__)

Signature = tuple[Any, ...]


#: the type in a signature of a Python int that no int64 holds (TorchScript's `int`): such a
#: call is no program's (`FusedFunction` runs it unfused, as eager or TorchScript would)
BIG_INT = "int beyond int64"
_INT64 = (-(2**63), 2**63 - 1)


def signature(args: tuple[Any, ...]) -> Signature:
    """What a plan is specialized to: tensor metadata, other arguments' types (of the items
    of lists, tuples and dicts too; `BIG_INT` for an int beyond int64), grad mode, the
    autocast state."""
    return (torch.is_grad_enabled(), autocast_state(), *[
        (a.dtype, a.shape, a.stride(), a.device, a.requires_grad)
        if isinstance(a, torch.Tensor)
        else scripting.annotation(a) if type(a) in (list, tuple, dict)
        else BIG_INT if type(a) is int and not _INT64[0] <= a <= _INT64[1] else type(a)
        for a in args
    ])


@dataclasses.dataclass(frozen=True)
class Program:
    """What a policy specializes: a graph to fuse, and how to run its calls unfused."""

    graph: torch._C.Graph  # inlined, in-place ops removed; copied before it is typed
    unfused: Callable[..., Any]  # runs the arguments (not the receiver) without fusion
    receiver: Any = None  # a module's C++ object, the graph's `self` input; or None
    elementwise_only: bool = False  # may be typed on meta tensors (see `_typed_on_meta`)
    #: why its in-place writes must run unfused under autograd (`saved_writes.py`), or None
    saved_write: str | None = None
    #: whether it writes anything in place (an `aten::*_` op, `prim::SetAttr`) or prints or
    #: warns: a call that failed part way may have done so, so it is not run again to raise
    #: eager's exception
    writes: bool = False
    #: why it must run as Python: it changes a list or dict its caller holds, which
    #: TorchScript would copy (`container_writes.py`); or None
    container_write: str | None = None


_ELEMENTWISE_INPUTS = (torch._C.TensorType, torch._C.FloatType, torch._C.IntType,
                       torch._C.BoolType, torch._C.NoneType)


def program(graph: torch._C.Graph, unfused: Callable[..., Any], receiver: Any = None,
            module: torch.nn.Module | None = None) -> Program:
    """A copy of `graph` prepared for fusion: calls inlined, tuples unpacked where packed,
    `type_as` as the `to` it is (`rewrites/type_as.py`), constants folded, in-place ops
    rewritten to out-of-place ones; with `module` (a Python module whose state every call
    checks), its optional tensor attributes and training flags as what it holds
    (`module_attributes`)."""
    graph = graph.copy()
    # Inlining copies each callee's graph as TorchScript preoptimizes it for the ambient
    # autocast: its own casts and op lists (layer norm, gelu in float32) where eager's
    # differ, and the one graph then serves calls outside autocast too. Without: the ops
    # run under the autocast the call has (a signature's `autocast_state`), as eager's do.
    with torch.autocast("cpu", enabled=False):
        torch._C._jit_pass_inline(graph)
    if module is not None:
        refine_module_attributes(graph, module)
    # A traced submodule's tuple of results, unpacked by its caller: between the two, the
    # nodes on either side could not join one group.
    fold_tuples(graph)
    # (Before anything reads the aliases: `type_as` may return its input.)
    type_as_to(graph)
    # Folds lists of constants (expand's sizes) into constants, which fuse.
    torch._C._jit_pass_constant_propagation(graph)
    # Before the writes go (after the branches of constant flags): whether one hits a tensor
    # that autograd saved, which eager's backward checks.
    saved_write = saved_then_written(graph)
    writes = any(_writes(n) for n in all_nodes(graph.block()))
    container_write = caller_container_written(graph)
    torch._C._jit_pass_remove_mutation(graph)
    torch._C._jit_pass_dce(graph)
    elementwise_only = (
        receiver is None
        and all(_elementwise(n) for n in graph.nodes())
        and all(isinstance(v.type(), _ELEMENTWISE_INPUTS) for v in inputs_of(graph))
    )
    # The unfused program runs as eager does: without TorchScript's optimizing passes, whose
    # profiling executor would differentiate it by TorchScript's formulas (the gradient of a
    # max where its operands tie, of clamp's tensor bounds), not eager's.
    return Program(graph, functools.partial(run_as_built, unfused), receiver,
                   elementwise_only, saved_write, writes, container_write)


def _writes(node: Any) -> bool:
    kind = node.kind()
    return kind in ("prim::SetAttr", "prim::Print", "aten::warn") or (
        kind.startswith("aten::") and kind.endswith("_") and not kind.endswith("__"))


def _elementwise(node: Any) -> bool:
    """Whether `node` is a constant, a tuple of results, or an elementwise op with a
    lowering."""
    if node.kind() in ("prim::Constant", "prim::TupleConstruct"):
        return True
    if node.kind() in EXTERNAL_KINDS:  # GEMMs and convolutions: typed by profiling
        return False
    return not blocks_of(node) and lowering_for(node)[0] is not None


@dataclasses.dataclass
class Budget:
    """Plans optimized and plans made by callers, each up to `max_specializations`: shared by
    the policies of one function's module states (`FusedFunction`), so that the bound holds
    for the function."""

    optimized: int = 0
    made: int = 0


class Policy:
    """Signatures to plans for the programs of one function (or one compiled graph).

    Signatures of different argument types may belong to different programs
    (a plain function's scripted variants); the bound counts them together, and with
    those of the policies that share its `budget`.
    """

    def __init__(self, options: Options, budget: Budget | None = None,
                 varying: frozenset[tuple[int, int]] | None = None):
        """`varying`: the (argument, dim) pairs whose sizes may vary between calls, where the
        caller knows them (Dynamo's symbolic dims): with `dynamic=True`, the sizes of the
        other dims stay static in the dynamic kernels (the plan is pinned to them, as under
        automatic dynamic), instead of every size becoming a symbol."""
        self.options = options
        self.budget = budget or Budget()
        self.varying = varying
        #: signature -> plan; read without a lock, written under it, never rebound (callers
        #: such as FusedFunction keep the dict itself for their fast path)
        self.plans: dict[Signature, Plan] = {}
        #: groups that failed to lower or compile (they run unfused), for tools and tests
        self.compile_failures: list[CompileFailure] = []
        self._profiles: dict[Signature, tuple[Profiler, Any]] = {}
        #: (program id, size class) -> its first shapes, varied dims and dynamic plan
        self._classes: dict[tuple[int, Signature | None], ClassState] = {}
        self._shown: dict[int, tuple[Plan, torch._C.Graph | None]] = {}  # see `graph_of`
        self._lock = threading.RLock()
        self._warned = False  # whether `_warn_unfused` has
        #: the ops that the plans' graphs run: they live as long as this policy (and its
        #: plans), and are freed with it unless another policy shares them
        self._ops: list[runtime.FusedOp] = []

    def call(self, prog: Program, key: Signature, args: tuple[Any, ...]) -> Any:
        """Run `args`, of signature `key`, a signature of `prog`: with its plan, or making it."""
        plan = self.plans.get(key)
        if plan is None:
            with self._lock:
                plan = self.plans.get(key)  # made while this thread waited
                if plan is None:
                    with collector.paused():  # profiling, compiling: see collector.py
                        plan, result = self._specialize(prog, key, args)
                    if plan is None:
                        return result  # of a profiling run
        return plan.run(args)

    def call_unfused(self, fn: Callable[..., Any], key: Signature, args: tuple[Any, ...]) -> Any:
        """Run `args` with `fn`, now and for every later call of signature `key` (no program
        takes them: eager Python runs them)."""
        with self._lock:
            plan = self.plans.setdefault(key, UnfusedPlan(fn, None))
        return plan.run(args)

    def call_with(self, key: Signature, make: Callable[[], Plan], args: tuple[Any, ...],
                  unfused: Callable[..., Any]) -> Any:
        """Run `args` with the plan for signature `key`, `make()` (once) if there is none: a plan
        the caller builds (the autograd path, `autograd.py`). At most `max_specializations`
        such plans are made (each traces and compiles anew); later signatures run `unfused`."""
        plan = self.plans.get(key)
        if plan is None:
            with self._lock:
                plan = self.plans.get(key)
                if plan is None:
                    if self.budget.made >= self.options.max_specializations:
                        _log.update("Too many input signatures under autograd; running unfused")
                        plan = UnfusedPlan(unfused, None)
                    else:
                        self.budget.made += 1
                        plan = make()
                    self.plans[key] = plan
        return plan.run(args)

    def serves_every_size(self, plan: Plan) -> bool:
        """Whether `plan` is a size class's dynamic plan: it runs every signature of the class
        with its static sizes, whatever the `varying` dims' sizes."""
        return any(state.plan is plan for state in list(self._classes.values()))

    def graphs(self) -> list[torch._C.Graph]:
        """The optimized graphs of the signatures seen so far (for `nncfuse.fusion_groups`)."""
        return [p.graph for p in list(self.plans.values()) if p.graph is not None]

    def graph_of(self, plan: Plan) -> torch._C.Graph | None:
        """`plan`'s graph as users see it (`symbolic_graph`); kept while the policy lives, as
        the plan's own graph is (the nodes of a graph that is freed become invalid)."""
        with self._lock:
            entry = self._shown.get(id(plan))
            if entry is None:  # (the entry keeps `plan` alive: its id is not reused)
                entry = self._shown[id(plan)] = (plan, symbolic_graph(plan))
            return entry[1]

    def _specialize(
        self, prog: Program, key: Signature, args: tuple[Any, ...]
    ) -> tuple[Plan | None, Any]:
        """The plan for a new signature; or None and the result, when this call was one of
        its profiling runs. Under the lock.

        The size class's dynamic plan if it has one; else a static or dynamic plan as the
        `dynamic` option says (`_kind`); past the bound the unfused program.
        """
        cls = (id(prog), size_class(args))
        now = shapes(args)
        state = self._classes.get(cls)
        seen = state is not None
        if state is None:
            state = self._classes[cls] = ClassState(now, set(self.varying or ()))
        state.note(now)
        plan: Plan | None = state.plan if state.serves(now) else None
        if plan is None and not seen and self.varying is not None:
            # Dynamo's symbolic sizes: a new class (a cache length equal to a model dim) that
            # another's dynamic plan generalizes runs that plan at once, rather than being
            # profiled (over calls that each decode step makes once) and compiled anew.
            plan = self._most_general(prog, cls[1], now)
        kind = "reuse" if plan is not None else self._kind(cls, seen)
        # (A size shared by a fixed dim and a varying one is a symbol: see `static_sizes`.)
        everything = self.options.dynamic is True and self.varying is None
        choice = (kind == "dynamic", frozenset() if everything else state.static_sizes(now), now)
        if plan is not None:
            _log.update("A new signature of a size class with a dynamic plan: reusing it")
            self._profiles.pop(key, None)
        elif kind is None:
            self._profiles.pop(key, None)
            plan = self._most_general(prog, cls[1], now)
            if plan is None:
                _log.update("Too many input signatures; running unfused")
                self._warn_unfused()
                plan = UnfusedPlan(prog.unfused, prog.graph)
            else:
                _log.update("Too many input signatures; running a more general dynamic plan")
        else:
            graph = self._typed_on_meta(prog, key, args)
            if graph is None:
                return None, self._profile(prog, key, args, cls, choice)
            plan = self._optimize_class(graph, prog, cls, choice)
        self.plans[key] = plan
        return plan, None

    def _warn_unfused(self) -> None:
        """Say once per policy that its signatures past the bound run unfused: a program
        that keeps meeting new sizes would otherwise slow down without a word."""
        if not self._warned:
            self._warned = True
            warnings.warn(
                f"nncfuse: more than max_specializations={self.options.max_specializations} "
                "input signatures; new ones run unfused (raise max_specializations, or pass "
                "dynamic=True for kernels that take any size)", stacklevel=4)

    def _most_general(self, prog: Program, cls: Signature | None, now: Shapes) -> Plan | None:
        """A dynamic plan of `prog` whose kernels' guards admit the calls of size class `cls`
        and shapes `now`: that of a class that generalizes `cls` (`generalizes`), with the
        static sizes `now` has. None if there is none (the call then runs unfused)."""
        for (program, general), state in self._classes.items():
            if program == id(prog) and generalizes(general, cls) and state.serves(now):
                return state.plan
        return None

    def _kind(self, cls: tuple[int, Signature | None], seen: bool) -> str | None:
        """"static" or "dynamic": how to optimize the next signature of size class `cls`
        (`seen` before); or None past the bounds."""
        n = self.budget.optimized
        if n >= self.options.max_specializations:
            return None
        choice = self.options.dynamic
        if isinstance(choice, tuple):  # a fusion strategy: its kinds in turn
            for name, count in choice:
                if n < count:
                    kind = name.lower()
                    break
                n -= count
            else:
                return None
        else:
            kind = "dynamic" if choice or (choice is None and seen) else "static"
        return "static" if cls[1] is None else kind

    def _optimize_class(
        self, graph: torch._C.Graph, prog: Program, cls: tuple[int, Signature | None],
        choice: tuple[bool, frozenset[int], Shapes],
    ) -> Plan:
        """`optimize`, dynamically or not and keeping which sizes static (`choice`); the
        plan becomes the class's dynamic plan when only dynamic kernels compute (then it
        holds for every signature of the class with those static sizes)."""
        dynamic, static, now = choice
        token = STATIC_SIZES.set(static)
        try:
            plan = self.optimize(graph, prog, dynamic)
        finally:
            STATIC_SIZES.reset(token)
        if dynamic and _dynamic_only(plan, static):
            self._classes[cls].adopt(plan, now, static)
        return plan

    def _typed_on_meta(
        self, prog: Program, key: Signature, args: tuple[Any, ...]
    ) -> torch._C.Graph | None:
        """`prog`'s graph typed on meta tensors, where that is exact and cheap; else None."""
        if (prog.elementwise_only and self.options.profiling_runs == 1
                and key not in self._profiles and _all_contiguous(args) and _meta_is_cheap()):
            return _infer_types(prog.graph, args)
        return None

    def _profile(
        self, prog: Program, key: Signature, args: tuple[Any, ...],
        cls: tuple[int, Signature | None], choice: tuple[bool, frozenset[int], Shapes],
    ) -> Any:
        """Run `args` through `prog`'s graph with profile nodes; optimize it after the last
        run. Under the lock."""
        entry = self._profiles.get(key)
        if entry is None:
            graph = prog.graph.copy()
            if torch.is_autocast_enabled("cpu"):  # (a trace's convolutions, cast as eager's)
                untrace_convolutions(graph)
            fn = torch._C._create_function_from_graph("nncfuse_profile", graph)
            self._profiles[key] = entry = (Profiler(graph), fn)
        profiler, fn = entry
        full = args if prog.receiver is None else (prog.receiver, *args)
        result = run_as_built(profiler.run, fn, *full)
        # (A re-entrant call of the same signature may have finished this profile already.)
        if profiler.runs >= self.options.profiling_runs and self._profiles.get(key) is entry:
            del self._profiles[key]
            profiler.finish()
            self.plans[key] = self._optimize_class(profiler.graph, prog, cls, choice)
        return result

    def optimize(self, graph: torch._C.Graph, prog: Program, dynamic: bool = False) -> Plan:
        """The plan for one signature from `graph`, `prog`'s graph typed for it (profiled, or
        on meta tensors): fuse, compile and guard its groups (`dynamic`: into dynamic kernels
        where they can be); the unfused program if that fails. Counts toward
        `max_specializations`. Under the lock."""
        self.budget.optimized += 1
        options = dataclasses.replace(self.options, dynamic=dynamic)
        try:
            failures = fuse_tensor_exprs(graph, options, self._ops)
            self.compile_failures += failures
            plan = optimized_plan(graph, prog.receiver)
            written = written_inputs(graph, skip=0 if prog.receiver is None else 1)
            if written:
                plan = OverlapGuardPlan(plan, written, UnfusedPlan(prog.unfused, graph))
            if self.options.strict:  # `nncfuse.explain` registers the check (a layer above)
                for check in hooks.STRICT_CHECKS:
                    plan = check(plan, failures, self.options)
            return plan
        except Exception as e:  # noqa: BLE001
            _log.dump("Optimization failed, running unfused: ", type(e).__name__, ": ", e)
            warnings.warn(f"nncfuse: optimization failed, running unfused: {e}", stacklevel=2)
            return UnfusedPlan(prog.unfused, graph)


def symbolic_graph(plan: Plan) -> torch._C.Graph | None:
    """`plan`'s graph as `graph_for` shows a dynamic plan: a copy in which each tensor that a
    dynamic kernel reads or writes (and its subgraph's inputs and outputs) has `*` for the
    dims its kernel takes as symbols (the type of the signature it was compiled for, but for
    strides, which follow the symbols); the graph itself, for any other plan.

        %x : Float(2, 11, 64, strides=[704, 64, 1])  ->  %x : Float(2, *, 64)
    """
    if plan.graph is None or isinstance(plan, UnfusedPlan) or not any(
            is_fused_op(n) and runtime.kernel_of(n).dynamic for n in plan.graph.nodes()):
        return plan.graph
    shown = plan.graph.copy()
    for node, copy in zip(plan.graph.nodes(), shown.nodes(), strict=True):
        if not is_fused_op(node) or not runtime.kernel_of(node).dynamic:
            continue
        lowered = runtime.kernel_of(node).lowered
        inputs = {g.position: g.sizes for g in lowered.guards}
        outputs = [inputs.get(o.index) if isinstance(o, InputOutput) else o.buf.dims
                   for o in lowered.outputs]
        sub = copy.g("Subgraph").copy()
        symbolic: set[int] = set()  # example values of the symbols: an intermediate's `*`
        for values, sizes in ((inputs_of(sub), inputs.get), (outputs_of(sub), outputs.__getitem__)):
            for k, value in enumerate(values):
                dims = sizes(k)
                if dims is not None and (example := _sizes(value)) is not None:
                    symbolic |= {n for n, d in zip(example, dims) if _int_size(d) is None}
        for value in (v for n in sub.nodes() for v in outputs_of(n)):
            if (example := _sizes(value)) is not None:
                _show(value, [None if n in symbolic else n for n in example])
        for values, sizes in ((inputs_of(copy), inputs.get), (inputs_of(sub), inputs.get),
                              (outputs_of(copy), outputs.__getitem__),
                              (outputs_of(sub), outputs.__getitem__)):
            for k, value in enumerate(values):
                if (dims := sizes(k)) is not None and _sizes(value) is not None:
                    _show(value, [_int_size(d) for d in dims])
        copy.g_("Subgraph", sub)
    return shown


def _sizes(value: Any) -> list[int] | None:
    """The sizes of `value`'s complete tensor type, else None."""
    t = value.type()
    if not isinstance(t, torch._C.TensorType) or t.dtype() is None:
        return None
    sizes = t.sizes()
    return None if sizes is None or None in sizes else list(sizes)


def _show(value: Any, sizes: list[int | None]) -> None:
    """Give `value` a type of its dtype and device with `sizes` (None: `*`), no strides."""
    t = value.type()
    value.setType(torch._C.TensorType.get().with_dtype(t.dtype()).with_sizes(sizes)
                  .with_device(t.device()))


def _int_size(size: Any) -> int | None:
    """A kernel's size: an int, or None (printed `*`) for a symbol or a product of them."""
    if isinstance(size, int):
        return size
    return int(size.value) if isinstance(size, E.Imm) else None


#: Nodes that check the types (sizes) a graph was specialized to
_TYPE_CHECKS = ("prim::TypeCheck", "prim::RequiresGradCheck", "prim::TensorExprDynamicGuard")


#: Views whose constant operands may be sizes of the signature the graph was typed with (the
#: fuser spells a `chunk` as slices of the profiled lengths, an in-place slice assignment is
#: rebuilt from slices): unfused, they are right at other sizes only along a dim that is fixed
_CONSTANT_VIEWS = ("aten::slice", "aten::select", "aten::narrow")


def _dynamic_only(plan: Plan, static: frozenset[int] = frozenset()) -> bool:
    """Whether every kernel of `plan`'s graph is dynamic (checks its inputs itself), nothing
    checks the types it was typed with, and the views that run unfused with constant
    operands are along dims of the same size at every signature the plan serves (`static`:
    the sizes it keeps): then nothing in it depends on the sizes it was typed with (other
    nodes that run unfused, a GEMM between groups, run at any size)."""
    if plan.graph is None or isinstance(plan, UnfusedPlan):
        return False
    nodes = list(all_nodes(plan.graph.block()))
    fused = [n for n in nodes if is_fused_op(n)]
    return bool(fused) and all(runtime.kernel_of(n).dynamic for n in fused) and not any(
        n.kind() in _TYPE_CHECKS or n.kind() in _CONSTANT_VIEWS and not _fixed_view(n, static)
        for n in nodes)


def _fixed_view(node: Any, static: frozenset[int]) -> bool:
    """Whether a slice, select or narrow is along a dim whose size `_fixed` shows, has
    operands computed when it runs, or takes the whole dim."""
    if any(v.node().kind() != "prim::Constant" for v in inputs_of(node)[2:]):
        return True
    if _whole(node):
        return True
    dim, rank = node.inputsAt(1).toIValue(), _rank(node.inputsAt(0))
    return isinstance(dim, int) and rank is not None and -rank <= dim < rank and (
        _fixed(node.inputsAt(0), dim % rank, static))


def _whole(node: Any) -> bool:
    """Whether `node` is a slice of a whole dim (`x[:, None]` through Dynamo: `slice(x, 1, 0,
    2**63 - 1)`), the identity at every size: its constants are no profiled length."""
    if node.kind() != "aten::slice" or node.inputsSize() != 5:
        return False
    start, end, step = (node.inputsAt(k).toIValue() for k in (2, 3, 4))
    return start in (0, None) and step in (1, None) and (
        end is None or isinstance(end, int) and end >= 2**62)


def _dims(value: Any) -> list[int | None] | None:
    """The sizes of `value`'s tensor type of known rank (None for a dim not known), else None."""
    t = value.type()
    return t.sizes() if isinstance(t, torch._C.TensorType) and t.dim() is not None else None


def _constant_shape(node: Any) -> list[int] | None:
    """A view's or reshape's sizes when they are a constant list, else None."""
    if node.kind() not in ("aten::view", "aten::reshape") or node.inputsSize() != 2:
        return None
    shape = node.inputsAt(1).toIValue() if node.inputsAt(1).node().kind() == (
        "prim::Constant") else None
    return list(shape) if isinstance(shape, (list, tuple)) else None


def _rank(value: Any) -> int | None:
    """`value`'s rank: its type's, or (a value outside the groups, untyped in the plan's
    graph) a constant view's or a transpose of one's; else None."""
    sizes, node = _dims(value), value.node()
    if sizes is not None:
        return len(sizes)
    if (shape := _constant_shape(node)) is not None:
        return len(shape)
    return _rank(node.inputsAt(0)) if node.kind() == "aten::transpose" else None


def _fixed(value: Any, dim: int, static: frozenset[int]) -> bool:
    """Whether dim `dim` (in range) of graph value `value` has one size at every signature of
    the plan: a module attribute's; an argument's kept static (the plan serves only that
    size, or 1: part of the class); the last of a `linear` of a fixed weight; a view's
    constant size (not -1: the view fails at any other); a transpose's of a fixed dim
    (rotary embeddings' halves of a head). Else not known: False."""
    node = value.node()
    if (shape := _constant_shape(node)) is not None:
        return len(shape) > dim and shape[dim] != -1
    if node.kind() == "aten::transpose":
        rank, pair = _rank(value), [node.inputsAt(k).toIValue() for k in (1, 2)]
        if rank is None or not all(isinstance(d, int) and -rank <= d < rank for d in pair):
            return False
        a, b = (d % rank for d in pair)
        return _fixed(node.inputsAt(0), {a: b, b: a}.get(dim, dim), static)
    sizes = _dims(value)
    if sizes is None or sizes[dim] is None:
        return False
    if node.kind() == "prim::GetAttr":
        return True
    if node.kind() == "prim::Param":
        return sizes[dim] == 1 or sizes[dim] in static
    return (node.kind() == "aten::linear" and dim == len(sizes) - 1
            and _fixed(node.inputsAt(1), 0, static))


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


def _infer_types(graph: torch._C.Graph, args: tuple[Any, ...]) -> torch._C.Graph | None:
    """A copy of `graph` typed by running it on meta tensors shaped like `args`, if that works.

    Only for graphs of elementwise ops without control flow, whose output
    metadata meta tensors compute exactly as the CPU does: then the first
    call runs compiled code instead of a profiling run at eager speed.
    """
    graph = graph.copy()
    position = {v.unique(): k for k, v in enumerate(inputs_of(graph))}

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


def _values(graph: torch._C.Graph) -> list[Any]:
    return [*inputs_of(graph), *(v for n in graph.nodes() for v in outputs_of(n))]
