"""autodiff: training through TorchScript's autodiff, as NNC ran it (the default).

With `autograd="autodiff"` (the default; NNCFUSE_AUTOGRAD=aot for the other) a signature
that needs autograd gets an `AutodiffPlan` instead of AOTAutograd's `AutogradPlan`
(`autograd.py`):

1. the first call of each pattern of input types profiles the program (its result is
   eager's, recorded by eager autograd), typing every value, requires_grad included; the
   pattern's booleans, integers and None become constants (`_specialize`);
2. the training rewrites (`rewrites.py`, one named list) fold what the signature fixes
   and gather the differentiable nodes into `prim::DifferentiableGraph`s; attention and
   size arithmetic stay outside;
3. each is differentiated (`_jit_differentiate`) into `f` (inputs -> outputs and the
   values the backward captures) and `df` (output gradients and captures -> input
   gradients); `backward_ops.py` decomposes their ops that have no lowering;
4. the node is replaced by a custom op whose Python kernel (above autograd) applies
   `_Differentiable`, an autograd.Function: forward runs `f`, backward runs `df`, each a
   program under its own `Policy` (profiled, fused and guarded as every nncfuse call);
   `df` is specialized per pattern of defined output gradients (`_specialized`) and
   to the values of its captured sizes, and typed by a profiling run before it is
   decomposed; graphs of the same text share their f and df (`_compiled_once`);
5. the rest of the program runs in the interpreter under eager autograd.

    graph(%x, %w):                                 graph(%x, %w):
      %y = prim::DifferentiableGraph_0(%x, %w)  ==>  %y = nncfuse::autodiff_0(%x, %w)
      %s = aten::size(%y, 0)                         %s = aten::size(%y, 0)

Anything this cannot build runs through the AOTAutograd plan. A second derivative
(create_graph=True) runs the differentiable graph again unfused, under eager autograd
(`eager_grads`, as the AOT plan does): `df` runs on detached captures.
"""

from __future__ import annotations

import itertools
import threading
import weakref
from collections.abc import Callable
from typing import Any

import torch

from ... import log
from ...config import Options
from ...tensorexpr.meta import (
    blocks_of,
    graph_text,
    inputs_of,
    is_tensor,
    only_reads,
    outputs_of,
)
from ..specialize import collector
from ..specialize.plans import run_as_built
from ..specialize.policy import Policy, Program, program, signature
from ..specialize.profiling import Profiler
from ..specialize.size_classes import autocast_state
from . import rewrites
from .autodiff_views import DIFFERENTIABLE_GRAPH
from .autograd import AutogradPlan, _frozen, eager_grads, versions
from .backward_ops import decompose
from .dropouts import DROPOUTS
from .selected_gradients import select_masked_gradients

_log = log.get_logger(__file__)
_serial = itertools.count()
_MAX_VARIANTS = 8
#: ops whose result's shape depends on values: no sizes are folded from a profile with them
_VALUE_SHAPES = ("aten::nonzero", "aten::nonzero_numpy", "aten::argwhere", "aten::masked_select",
                 "aten::unique", "aten::_unique2", "aten::unique_consecutive", "aten::unique_dim",
                 "aten::index", "aten::repeat_interleave", "aten::bincount")
#: ops that read a tensor's values as numbers (which may become sizes): nor with these,
#: unless the tensor is made of sizes (`_shapes_fixed`)
_READS_VALUES = ("aten::Int", "aten::item", "aten::tolist", "aten::Float", "aten::Bool",
                 "aten::IntImplicit", "aten::FloatImplicit", "aten::ScalarImplicit")
_SIZES = ("aten::size", "aten::dim", "prim::Constant")


class AutodiffPlan:
    """The plan of one signature that needs autograd, through TorchScript's autodiff: one
    `_Outer` program per pattern of input types (attributes included); AOTAutograd's plan
    where one cannot be built."""

    def __init__(self, prog: Program, options: Options,
                 eager: Callable[..., Any] | None = None):
        """`eager`: what runs a call unfused under autocast (the Python function or module;
        `prog.unfused` without)."""
        self.prog = prog
        self.options = options
        self.eager = eager or prog.unfused
        self.aot = AutogradPlan(prog, options)  # its lifted function, and the fallback
        self._variants: dict[Any, _Outer | None] = {}
        self._lock = threading.Lock()

    @property
    def graph(self) -> torch._C.Graph | None:
        """The first variant's graph as `graph_for` shows it, once each of its differentiable
        graphs has an optimized f: a copy of the outer graph in which each `autodiff_N` node
        holds that f as its Subgraph (`fusion_groups` finds f's groups there); None before
        (or the AOT plan's forward graph, where no variant was built).

            %y = nncfuse::autodiff_0(%x, %w)
              with nncfuse::autodiff_0 = graph(%x, %w):
                %y, %t = nncfuse::fused_mul_sin(%x, %w)
                return (%y, %t)
        """
        outers = self.outers()
        if not outers:
            return self.aot.graph
        first = outers[0]
        shown = first.graph.copy()
        nodes = [n for n in shown.nodes() if n.kind().startswith("nncfuse::autodiff_")]
        for node, entry in zip(nodes, first.entries, strict=True):
            graphs = entry.f.policy.graphs()
            if not graphs:
                return None
            node.g_("Subgraph", graphs[0])
        return shown

    def outers(self) -> list[_Outer]:
        """The variants built so far, for tests and tools."""
        return [v for v in list(self._variants.values()) if v is not None]

    def fused_graphs(self) -> tuple[list[torch._C.Graph], list[torch._C.Graph]]:
        """The optimized graphs built so far: (the f graphs', the df graphs'), and the AOT
        plan's where it ran."""
        entries = [e for outer in self.outers() for e in outer.entries]
        forward, backward = self.aot.fused_graphs()
        return ([*forward, *(g for e in entries for g in e.f.policy.graphs())],
                [*backward, *(g for e in entries for d in list(e._dfs.values())
                              if d is not _FAILED for g in d.policy.graphs())])

    def _fallback(self, args: tuple[Any, ...]) -> Any:
        """AOTAutograd's plan; under autocast, eager's (unfused): its trace of the program
        does not keep eager's dtypes where an op mixes them (a layer norm of a bfloat16
        input with a float32 weight returns float32 there, bfloat16 in eager)."""
        if autocast_state():
            return self.eager(*args)
        return self.aot.run(args)

    def run(self, args: tuple[Any, ...]) -> Any:
        fn = self.aot._fn
        if fn is None:
            return self._fallback(args)
        inputs = (*args, *(obj.getattr(name) for obj, name in self.aot._attributes))
        try:
            key = signature(inputs) + tuple(
                None if isinstance(v, torch.Tensor) else _frozen(v) for v in inputs)
        except TypeError:
            return self._fallback(args)
        outer = self._variants.get(key, _MISSING)
        if outer is _MISSING:
            with self._lock:
                outer = self._variants.get(key, _MISSING)
                if outer is _MISSING:
                    if len(self._variants) >= _MAX_VARIANTS:
                        self._variants[key] = None
                        return self._fallback(args)
                    # A profiling run: eager's result and autograd; then the build.
                    graph = self.prog.graph if fn is self.prog.unfused else fn.graph
                    with collector.paused():
                        result, built = _profiled(graph, inputs, self.options)
                    self._variants[key] = built
                    return result
        if outer is None:
            return self._fallback(args)
        return outer.run(inputs)


_MISSING: Any = object()
_FAILED: Any = object()  # a df that could not be specialized


def _profiled(graph: torch._C.Graph, inputs: tuple[Any, ...],
              options: Options) -> tuple[Any, _Outer | None]:
    """`graph` run on `inputs` with profile nodes, and the `_Outer` program built from the
    types seen (None, logged, where it cannot be built)."""
    graph = graph.copy()
    profiler = Profiler(graph)
    profiled = torch._C._create_function_from_graph("nncfuse_autodiff_profile", graph)
    result = run_as_built(profiler.run, profiled, *inputs)
    profiler.finish()
    try:
        return result, _Outer(graph, options, inputs)
    except Exception as e:  # noqa: BLE001 - whatever fails, AOTAutograd's plan runs
        _log.dump("Not built through autodiff, running the AOTAutograd plan: ", e)
        return result, None


class _Outer:
    """A typed program whose differentiable graphs are `_Entry` ops; the rest runs under
    eager autograd in the interpreter."""

    def __init__(self, graph: torch._C.Graph, options: Options, inputs: tuple[Any, ...]):
        graph = graph.copy()
        _specialize(graph, inputs)
        rewrites.run(graph, _shapes_fixed(graph))  # (into differentiable graphs)
        nodes = graph.findAllNodes(DIFFERENTIABLE_GRAPH)
        if not nodes:
            raise ValueError("no differentiable graph")
        if any(_tensor_list(v) for node in nodes for v in outputs_of(node)):
            # The autograd.Function would return the list, not its tensors: no grad_fn.
            raise ValueError("a differentiable graph returns a list of tensors")
        self.entries = []
        shared: dict[Any, Any] = {}  # (one program per identical f or df: `_compiled_once`)
        for node in nodes:  # (in order: a list's elements may be an earlier one's outputs)
            built = _built_lists(node)
            entry = _Entry(node.g("Subgraph"), options, built, shared)
            self.entries.append(entry)
            inputs = inputs_of(node)
            call = graph.create(entry.kind, [e for k, v in enumerate(inputs)
                                             for e in built.get(k, [v])], len(outputs_of(node)))
            call.insertBefore(node)
            for old, new in zip(node.outputs(), call.outputs()):
                new.setType(old.type())
                old.replaceAllUsesWith(new)
            node.destroy()
            for k in built:
                if not inputs[k].uses():  # (a list that other nodes read stays for them)
                    inputs[k].node().destroy()
        _log.debug("Autodiff outer graph:\n", graph)
        self.graph = graph
        self.fn = torch._C._create_function_from_graph("nncfuse_autodiff", graph)

    def run(self, inputs: tuple[Any, ...]) -> Any:
        return run_as_built(self.fn, *inputs)


class _Entry:
    """One differentiable graph: its `f` and `df` (per pattern of given gradients) as
    programs under policies, and the custom op (`kind`) that runs them."""

    def __init__(self, subgraph: torch._C.Graph, options: Options,
                 lists: dict[int, list[Any]], shared: dict[Any, Any]):
        """`lists`: the subgraph's inputs (by position) that are lists built outside, with
        the values of their elements: the op takes the elements instead (`_spread`);
        `shared`: the programs of the outer graph's entries so far (`_compiled_once`)."""
        self.options = options
        self.shared = shared
        grad = torch._C._jit_differentiate(subgraph.copy())
        f, df = grad.f, grad.df
        self.real = grad.f_real_outputs
        self.vjps = list(grad.df_input_vjps)
        self.captured_inputs = list(grad.df_input_captured_inputs)
        self.captured_outputs = list(grad.df_input_captured_outputs)
        self.output_vjps = list(grad.df_output_vjps)
        unfused = subgraph.copy()
        for k in sorted(lists, reverse=True):  # (later positions first: earlier ones stay)
            self._spread(f, df, k, lists[k])
            _pack(unfused, k, lists[k])
        #: the graph unfused, run again under eager autograd for a second derivative
        self.unfused = torch._C._create_function_from_graph("nncfuse_autodiff_unfused", unfused)
        #: whether f draws random numbers (dropout's mask): then a second derivative raises
        self.random = _random(f)
        self.n_inputs = len(inputs_of(f))
        # Sizes the signature fixes (`_size_if_not_equal` of typed tensors) folded.
        torch._C._jit_pass_peephole(f, False)
        torch._C._jit_pass_constant_propagation(f)
        self.left = decompose(f)  # the kinds left undecomposed, for the log and tools
        self.f = _compiled_once(shared, f, options, "f")
        self.df_graph = df
        self._dfs: dict[tuple[bool, ...], Any] = {}
        self._lock = threading.Lock()
        #: the real outputs whose gradient df takes: the others are not differentiable
        self.differentiable = frozenset(k for k in self.vjps if k < self.real)
        inputs = [e for k, v in enumerate(inputs_of(subgraph)) for e in lists.get(k, [v])]
        #: the inputs (positions) that are channels-last, by their profiled types: their
        #: gradients are given back so, as eager's are (a convolution's backward given a
        #: gradient of another layout than its output's reorders it: ConvNeXt's, 3x slower)
        self.channels_last = frozenset(k for k, v in enumerate(inputs) if _channels_last(v))
        #: the outputs eager gives channels-last (by the profile), which f's kernels write
        #: contiguous: given back so (a convolution that reads one runs in eager's layout)
        self.channels_last_out = frozenset(k for k, v in enumerate(outputs_of(subgraph))
                                           if _channels_last(v))
        self.kind = _register(self, inputs, outputs_of(subgraph))

    def _spread(self, f: torch._C.Graph, df: torch._C.Graph, k: int,
                elements: list[Any]) -> None:
        """f's input `k`, a list of tensors, as inputs for its elements that f packs
        (`_pack`); df's gradient of it (a list: `cat`'s `split_with_sizes`) unpacked into
        theirs; the positions of later inputs shifted. So the autograd.Function takes (and
        gives a gradient to) each tensor. A df that reads the list raises.

            f: graph(%l : Tensor[], %w)           graph(%a, %b, %w)
                 %y = aten::cat(%l, %1)    ==>      %l = prim::ListConstruct(%a, %b)
                                                    %y = aten::cat(%l, %1)
            df: ... return (%gl, %gw)             %ga, %gb = prim::ListUnpack(%gl)
                                                  return (%ga, %gb, %gw)
        """
        n = len(elements)
        shift = [j if j < k else j + n - 1 for j in range(len(inputs_of(f)))]
        if k in self.captured_inputs:
            at = len(self.vjps) + self.captured_inputs.index(k)
            if inputs_of(df)[at].uses():
                raise ValueError("df reads a list of tensors")
            df.eraseInput(at)
            self.captured_inputs.remove(k)
        self.captured_inputs = [shift[j] for j in self.captured_inputs]
        _pack(f, k, elements)
        # df: the list's gradient unpacked where it was returned.
        results = outputs_of(df)
        producer = results[0].node() if len(results) == 1 else None
        if producer is not None and producer.kind() == "prim::TupleConstruct":
            results = inputs_of(producer)
        spread: list[Any] = []
        for value, of in zip(results, self.output_vjps):
            if of != k:
                spread.append(value)
                continue
            unpack = df.create("prim::ListUnpack", [value], n)
            for out, element in zip(unpack.outputs(), elements):
                out.setType(element.type())
            unpack.insertBefore(df.return_node())
            spread += outputs_of(unpack)
        for j in reversed(range(len(outputs_of(df)))):
            df.eraseOutput(j)
        for value in spread:
            df.registerOutput(value)
        self.output_vjps = [e for j in self.output_vjps
                            for e in (range(k, k + n) if j == k else [shift[j]])]

    def df(self, given: tuple[bool, ...], captured: list[Any], vjps: list[Any]) -> Any:
        """The backward for a pattern of given output gradients (one per `vjps`) and of the
        values of the captures that are not tensors (sizes, shapes), which it has as
        constants (up to `_MAX_VARIANTS` patterns, then as inputs)."""
        first = len(self.vjps)
        key, constants = self._key(given, captured)
        fn = self._dfs.get(key)
        if fn is None:
            with self._lock:
                fn = self._dfs.get(key)
                if fn is None:
                    try:
                        graph = _specialized(self.df_graph, given, constants)
                        _typed(graph, [*vjps, *(v for k, v in enumerate(captured)
                                                if first + k not in constants)])
                        select_masked_gradients(graph)
                        self.left += decompose(graph)
                        fn = _compiled_once(self.shared, graph, self.options, "df",
                                            frozenset(constants))
                        fn.constants = frozenset(constants)  # type: ignore[attr-defined]
                    except Exception as e:  # noqa: BLE001 - the caller gives zeros instead
                        _log.dump("df not specialized: ", e)
                        fn = _FAILED
                    self._dfs[key] = fn
        if fn is _FAILED:
            raise ValueError("df not specialized to these gradients")
        return fn

    def _key(self, given: tuple[bool, ...],
             captured: list[Any]) -> tuple[Any, dict[int, Any]]:
        """The key of `df`'s program for these given gradients and captures, and the
        captures (by df input position) it has as constants."""
        first = len(self.vjps)
        constants = {first + k: v for k, v in enumerate(captured)
                     if not isinstance(v, torch.Tensor)}
        try:
            key: Any = (given, _frozen(tuple(constants.values())))
        except TypeError:
            key = None
        if key is None or (key not in self._dfs and len(self._dfs) >= _MAX_VARIANTS):
            key, constants = (given, None), {}
        return key, constants

    def failed(self, given: tuple[bool, ...], captured: list[Any]) -> None:
        """Note that `df`'s program for these given gradients raised where it ran: later
        calls take the caller's fallback (zeros for the gradients not given) at once, not a
        profiling run that raises again at every step (ConvNeXt's: 0.8 ms of each)."""
        key, _ = self._key(given, captured)
        with self._lock:
            self._dfs[key] = _FAILED

    def rerun(self, *inputs: Any) -> Any:
        """The graph unfused (under eager autograd, for a second derivative), on copies of
        the tensors that do not require grad: what it writes (batch norm's running
        statistics, which no op's schema tells) the forward has written already."""
        return run_as_built(self.unfused, *(
            v.clone() if isinstance(v, torch.Tensor) and not v.requires_grad else v
            for v in inputs))

    def __call__(self, *inputs: Any) -> Any:
        outs = _Differentiable.apply(self, *inputs)
        return outs[0] if len(outs) == 1 else outs


def _typed(graph: torch._C.Graph, inputs: list[Any]) -> None:
    """Give `graph`'s values the types of a run on `inputs` (a profiling run, whose result
    is dropped), for `decompose`: the policy profiles the decomposed graph again."""
    profiler = Profiler(graph)
    fn = torch._C._create_function_from_graph("nncfuse_autodiff_types", graph)
    try:
        run_as_built(profiler.run, fn, *inputs)
    except Exception as e:  # noqa: BLE001 - then fewer ops decompose; the policy's run raises
        _log.update("df not typed: ", e)
    profiler.finish()


def _compiled_once(shared: dict[Any, Any], graph: torch._C.Graph, options: Options,
                   what: str, *key: Any) -> Any:
    """`_compiled`, or the program made earlier for a graph of the same text (value names
    aside) and `key`: the layers of a model that are alike (MobileNetV2's 45 differentiable
    graphs have 17 distinct f and 17 distinct df) profile and optimize once, not per layer."""
    text = graph_text(graph)
    made = shared.get((what, text, *key))
    if made is None:
        made = shared.setdefault((what, text, *key), _compiled(graph, options, what))
    return made


def _compiled(graph: torch._C.Graph, options: Options, what: str) -> Any:
    """A callable that runs `graph` under a policy of its own (profiled, fused, guarded);
    several outputs come back as a tuple."""
    results = outputs_of(graph)
    if len(results) != 1:
        pack = graph.create("prim::TupleConstruct", results)
        pack.output().setType(torch._C.TupleType([v.type() for v in results]))
        pack.insertBefore(graph.return_node())
        for k in reversed(range(len(results))):
            graph.eraseOutput(k)
        graph.registerOutput(pack.output())
    fn = torch._C._create_function_from_graph(f"nncfuse_autodiff_{what}", graph)
    prog = program(graph, fn)
    policy = Policy(options)

    def call(*args: Any) -> Any:
        return policy.call(prog, signature(args), args)

    call.policy = policy  # type: ignore[attr-defined]
    return call


def _register(entry: _Entry, inputs: list[Any], outputs: list[Any]) -> str:
    """A custom op that runs `entry`, for a node with these inputs and outputs; its kind. The
    op holds `entry` weakly and is deregistered when `entry` is freed (with its `_Outer`), so
    a dropped function's programs and kernels go with it."""
    name = f"autodiff_{next(_serial)}"
    args = ", ".join(("Tensor" if is_tensor(v) else "Any") + f" i{k}"
                     for k, v in enumerate(inputs))
    rets = ", ".join("Tensor" if is_tensor(v) else "Any" for v in outputs)
    library = torch.library.Library("nncfuse", "FRAGMENT")
    library.define(f"{name}({args}) -> ({rets})")
    ref = weakref.ref(entry)
    if outputs:
        library.impl(name, lambda *inputs: ref()(*inputs), "CompositeImplicitAutograd")
    else:  # (a graph whose results no one reads: rewrites before autodiff dropped them)
        library.impl(name, lambda *inputs: (ref()(*inputs), None)[1],
                     "CompositeImplicitAutograd")
    weakref.finalize(entry, library._destroy).atexit = False  # (exit frees all)
    return f"nncfuse::{name}"


#: the types of the inputs that a variant has as constants: its key holds their values
#: (not floats': 0.0 and -0.0 are one key)
_SPECIALIZED = (bool, int, type(None))


def _specialize(graph: torch._C.Graph, inputs: tuple[Any, ...]) -> None:
    """Uses of `graph`'s inputs that are booleans, integers or None use constants of their
    values in `inputs` (the variant's key fixes them): a module's `training` flag folds,
    and with it batch norm's branches, and the batch norms fuse (`backward_ops.py`). A float
    that is 0 and only a dropout's probability is a constant too: the dropout then goes
    (`dropouts.py`), drawing no numbers, as eager's.

        graph(%x, %training : bool):              graph(%x, %training : bool):
          %y = aten::dropout(%x, %p, %training) ==>  %y = aten::dropout(%x, %p, True)
    """
    first = next(iter(graph.nodes()), graph.return_node())
    for value, v in zip(inputs_of(graph), inputs, strict=True):
        uses = value.uses()
        if not uses:
            continue
        if type(v) is float and v == 0 and all(
                use.user.kind() in DROPOUTS and use.offset == 1 for use in uses):
            v = 0.0  # (a dropout's p: -0.0 is 0 there too, and the key holds the value)
        elif type(v) not in _SPECIALIZED:
            continue
        const = graph.insertConstant(v)
        const.node().moveBefore(first)
        value.replaceAllUsesWith(const)


def _shapes_fixed(graph: torch._C.Graph) -> bool:
    """Whether the variant's key fixes every shape in `graph`: no op makes a shape from
    values, and each op that reads a tensor's values as a number reads one made of sizes
    and constants alone (a trace's `x.shape[-1] // 2`, Llama's rotary halves:
    `aten::Int(aten::floor_divide(prim::NumToTensor(aten::size(%x, -1)), 2))`)."""
    if any(graph.findAllNodes(kind) for kind in _VALUE_SHAPES) or any(
            len(inputs_of(node)) == 1 for node in graph.findAllNodes("aten::where")):
        return False  # (`where(condition)` is `nonzero`'s)
    memo: dict[int, bool] = {}
    return all(_of_sizes(inputs_of(node)[0], memo, 0) for kind in _READS_VALUES
               for node in graph.findAllNodes(kind))


def _of_sizes(value: Any, memo: dict[int, bool], depth: int) -> bool:
    """Whether `value` is computed from sizes and constants alone, within a few ops."""
    made = memo.get(value.unique())
    if made is None:
        node = value.node()
        made = node.kind() in _SIZES or (
            depth < 16 and node.kind() != "prim::Param" and not blocks_of(node)
            and all(_of_sizes(v, memo, depth + 1) for v in inputs_of(node)))
        memo[value.unique()] = made
    return made


def _pack(graph: torch._C.Graph, k: int, elements: list[Any]) -> None:
    """`graph`'s input `k`, a list of tensors, as inputs for its elements (typed as
    `elements`), packed into one list for each reader, so that a cat's fuses with it
    (cat's formula reads the list for its sizes).

        graph(%l : Tensor[], %w):           graph(%a, %b, %w):
          %y = aten::cat(%l, %1)      ==>     %l = prim::ListConstruct(%a, %b)
          %n = aten::len(%l)                  %m = prim::ListConstruct(%a, %b)
                                              %y = aten::cat(%l, %1)
                                              %n = aten::len(%m)
    """
    n, count = len(elements), len(inputs_of(graph))
    news = [graph.addInput() for _ in elements]
    for new, element in zip(news, elements):
        new.setType(element.type())
    graph.permuteInputs([*range(k), *range(count, count + n), *range(k, count)])
    old = inputs_of(graph)[k + n]
    first = next(iter(graph.nodes()), graph.return_node())
    for use in old.uses():
        pack = graph.create("prim::ListConstruct", news)
        pack.output().setType(old.type())
        pack.insertBefore(first)
        use.user.replaceInput(use.offset, pack.output())
    graph.eraseInput(k + n)


def _random(graph: Any) -> bool:
    """Whether `graph` (or a block) draws random numbers: an ATen op tagged
    `nondeterministic_seeded` (dropout's `bernoulli_`, `rand_like`, ...)."""
    for node in graph.nodes():
        namespace, _, name = node.kind().partition("::")
        packet = getattr(torch.ops.aten, name, None) if namespace == "aten" else None
        if packet is not None and any(torch.Tag.nondeterministic_seeded in
                                      getattr(packet, o).tags for o in packet.overloads()):
            return True
        if any(_random(block) for block in blocks_of(node)):
            return True
    return False


def _built_lists(node: Any) -> dict[int, list[Any]]:
    """The inputs of a differentiable graph node (by position) that are lists of tensors
    built by a `prim::ListConstruct` that nothing may change (ViT's cls token `cat`,
    Llama's rotary halves), with their elements; another list of tensors raises (the
    autograd.Function would see the list, not its tensors: no gradient would reach them)."""
    lists = {}
    for k, value in enumerate(inputs_of(node)):
        if not _tensor_list(value):
            continue
        if value.node().kind() != "prim::ListConstruct" or not all(
                _reads(use.user, use.offset) for use in value.uses()):
            raise ValueError("a differentiable graph takes a list of tensors not built "
                             "by a ListConstruct")
        lists[k] = inputs_of(value.node())
    return lists


def _reads(node: Any, k: int) -> bool:
    """Whether `node` only reads its input `k` (a list): no alias, no write."""
    return node.kind() in ("prim::DifferentiableGraph", "prim::ListUnpack") or only_reads(
        node, k)


def _tensor_list(value: Any) -> bool:
    kind = value.type()
    return isinstance(kind, torch._C.ListType) and isinstance(kind.getElementType(),
                                                               torch._C.TensorType)


class _Differentiable(torch.autograd.Function):
    """One differentiable graph as an autograd node: forward `f`, backward `df`."""

    @staticmethod
    def forward(ctx: Any, entry: _Entry, *inputs: Any) -> tuple[Any, ...]:
        plain = tuple(v.detach() if isinstance(v, torch.Tensor) else v for v in inputs)
        outs = entry.f(*plain)
        outs = outs if isinstance(outs, tuple) else (outs,)
        captured = [plain[k] for k in entry.captured_inputs]
        captured += [outs[k] for k in entry.captured_outputs]
        tensors = [k for k, v in enumerate(captured) if isinstance(v, torch.Tensor)]
        ctx.save_for_backward(*(captured[k] for k in tensors))
        ctx.tensors = tensors
        ctx.others = [None if k in tensors else v for k, v in enumerate(captured)]
        ctx.entry = entry
        ctx.inputs = inputs  # for a second derivative (inputs only: no reference cycle)
        ctx.versions = versions(inputs)
        ctx.shapes = [_shapes(outs[k]) for k in entry.vjps]
        ctx.set_materialize_grads(False)
        real = outs[:entry.real]
        if entry.channels_last_out:
            real = tuple(o.contiguous(memory_format=torch.channels_last)
                         if k in entry.channels_last_out else o for k, o in enumerate(real))
        ctx.mark_non_differentiable(*(o for k, o in enumerate(real) if isinstance(
            o, torch.Tensor) and k not in entry.differentiable))
        return real

    @staticmethod
    def backward(ctx: Any, *grads: Any) -> tuple[Any, ...]:
        entry: _Entry = ctx.entry
        saved = ctx.saved_tensors  # raises after a backward without retain_graph
        if torch.is_grad_enabled():  # create_graph=True
            return (None, *eager_grads(entry.rerun, ctx.inputs, ctx.versions, grads,
                                       entry.random))
        vjps = [grads[k] if k < entry.real else None for k in entry.vjps]
        none = (None,) * (1 + entry.n_inputs)
        given = tuple(g is not None for g in vjps)
        if not any(given):
            return none
        captured = list(ctx.others)
        for k, t in zip(ctx.tensors, saved):
            captured[k] = t

        def run(given: tuple[bool, ...], vjps: list[Any]) -> Any:
            df = entry.df(given, captured, [g for g in vjps if g is not None])
            first = len(vjps)
            return df(*(g for g in vjps if g is not None),
                      *(v for k, v in enumerate(captured) if first + k not in df.constants))

        try:
            results = run(given, vjps)
        except (ValueError, RuntimeError) as e:
            if all(given):
                raise
            if isinstance(e, RuntimeError):  # (it ran and raised: not again. A ValueError:
                entry.failed(given, captured)  # none could be made, or one raised before)
            # Zeros for the gradients not given, as autodiff's own executor would give (a
            # df specialized to undefined ones may not build, or may not run: ConvNeXt's).
            vjps = [g if g is not None else _zeros(shapes)
                    for g, shapes in zip(vjps, ctx.shapes)]
            results = run(tuple(True for _ in vjps), vjps)
        results = results if isinstance(results, tuple) else (results,)
        out = list(none)
        for k, g in zip(entry.output_vjps, results):
            if k in entry.channels_last and g is not None:
                g = g.contiguous(memory_format=torch.channels_last)
            out[1 + k] = g
        return tuple(out)


def _channels_last(value: Any) -> bool:
    """Whether `value` is typed as a 4-d tensor in the channels-last layout (not also
    contiguous)."""
    kind = value.type()
    if not isinstance(kind, torch._C.TensorType) or kind.dim() != 4:
        return False
    sizes, strides = kind.sizes(), kind.strides()
    if sizes is None or strides is None or None in sizes or None in strides:
        return False
    meta = torch.empty_strided(sizes, strides, device="meta")
    return meta.is_contiguous(memory_format=torch.channels_last) and not meta.is_contiguous()


def _shapes(value: Any) -> Any:
    """The shape and dtype of a tensor (a list of them for a list: unbind's, captured)."""
    if isinstance(value, torch.Tensor):
        return value.shape, value.dtype
    return [_shapes(v) for v in value]


def _zeros(shapes: Any) -> Any:
    """Zeros (a list of zeros) of `_shapes`'s."""
    if isinstance(shapes, list):
        return [_zeros(s) for s in shapes]
    return torch.zeros(shapes[0], dtype=shapes[1])


_ZERO, _NONZERO, _UNKNOWN = "zero", "nonzero", "unknown"
#: producers of a gradient that may be None (linear's bias gradient when there is no bias),
#: besides an `If` of an optional type and an unwrap of what may be None (`_maybe_none`)
_MAYBE_NONE = ("prim::AutogradAdd",)


def _maybe_none(value: Any) -> bool:
    """Whether a gradient a `GradOf` block returns may be None at run time: an `If` of an
    optional type (but where its condition, `t is not None` of a tensor, picks a branch that
    returns a tensor: linear's bias gradient, which a cast's `GradOf` reads under autocast),
    an unchecked unwrap of one, an `AutogradAdd` (of two that may be). An `If` typed Tensor
    has a tensor on both branches (pow's backward: zeros or the formula)."""
    kind = value.node().kind()
    if kind == "prim::If":
        taken = _taken(value.node())
        if taken is not None:
            k = [v.unique() for v in outputs_of(value.node())].index(value.unique())
            returned = taken.returnNode().inputsAt(k)
            return isinstance(returned.type(), (torch._C.NoneType, torch._C.OptionalType)) or (
                _maybe_none(returned))
        return isinstance(value.type(), torch._C.OptionalType)
    if kind == "prim::unchecked_unwrap_optional":
        inner = value.node().inputsAt(0)
        if inner.node().kind() == "prim::If":
            return _maybe_none(inner)
        return isinstance(inner.type(), torch._C.OptionalType) or _maybe_none(inner)
    return kind in _MAYBE_NONE


def _taken(node: Any) -> Any:
    """The block an `If` takes where its condition is `t is not None` (or `is`) of a value
    typed as a tensor (a bias's gradient in linear's formula), else None."""
    cond = node.inputsAt(0).node()
    if cond.kind() not in ("aten::__isnot__", "aten::__is__"):
        return None
    kinds = {type(v.type()) for v in inputs_of(cond)}
    if kinds != {torch._C.TensorType, torch._C.NoneType}:
        return None
    blocks = list(node.blocks())
    return blocks[0] if cond.kind() == "aten::__isnot__" else blocks[1]


def _specialized(df: torch._C.Graph, given: tuple[bool, ...],
                 constants: dict[int, Any]) -> torch._C.Graph:
    """A copy of `df` for one pattern of defined output gradients (`given`, per leading
    input): undefined ones are `AutogradZero`s, folded away with the `GradOf` blocks they
    alone feed; `GradOf` blocks that run are inlined, `AutogradAdd`s of two defined
    gradients are `add`s (as the profiling executor's `specializeAutogradZero` and
    `LowerGradOf`); inputs with values in `constants` (by position) become constants.

        %a = prim::GradOf[name="aten::mul"](%g)       (%g given, %h not)
          block0(): %m = aten::mul(%g, %x) -> (%m)   ==>   %m = aten::mul(%g, %x)
        %s = prim::AutogradAdd(%h, %a)                     (uses of %s use %m)
    """
    graph = df.copy()
    with torch.autocast("cpu", enabled=False):  # (no casts baked in: `policy.program`)
        torch._C._jit_pass_inline(graph)  # (matmul's backward calls helpers)
    values = inputs_of(graph)
    first = next(iter(graph.nodes()), graph.return_node())
    status: dict[int, str] = {}
    for k, value in enumerate(values):
        if k in constants:
            const = _constant(graph, constants[k], value.type())
            const.node().moveBefore(first)
            value.replaceAllUsesWith(const)
        elif k < len(given) and not given[k]:
            _zero_for(graph, value, first, status)
    for k in reversed(range(len(values))):
        if k in constants or (k < len(given) and not given[k]):
            graph.eraseInput(k)
    _fold_zeros(graph, list(graph.nodes()), status)
    torch._C._jit_pass_dce(graph)
    torch._C._jit_pass_peephole(graph, False)
    torch._C._jit_pass_constant_propagation(graph)
    _none_for_zeros(graph)
    torch._C._jit_pass_dce(graph)
    return graph


def _none_for_zeros(graph: torch._C.Graph) -> None:
    """Return None, in place, for each gradient that is an `AutogradZero` whatever the call
    (of an input that reaches no differentiable output): an undefined tensor, which a
    TorchScript function cannot return to Python. Autograd takes None as no gradient.

        %t = prim::TupleConstruct(%z, %g)                   %t = prim::TupleConstruct(%none, %g)
        return (%t)   with %z = prim::AutogradZero()  ==>   return (%t)
    """
    ret = graph.return_node()
    packs = [v.node() for v in ret.inputs() if v.node().kind() == "prim::TupleConstruct"]
    for node in [ret, *packs]:
        zeros = [k for k, v in enumerate(node.inputs()) if v.node().kind() == "prim::AutogradZero"]
        for k in zeros:
            none = graph.insertConstant(None)
            none.node().moveBefore(node)
            node.replaceInput(k, none)
        if zeros and node is not ret:
            node.output().setType(torch._C.TupleType([v.type() for v in node.inputs()]))


def _constant(graph: torch._C.Graph, value: Any, kind: Any) -> Any:
    """`value` as a constant of `graph` standing for an input of type `kind`; an empty list
    (the size of a 0-dim tensor, `_grad_sum_to_size`'s) as an empty list of its element type,
    which `insertConstant` cannot tell."""
    if isinstance(value, list) and not value:
        if isinstance(kind, torch._C.OptionalType):
            kind = kind.getElementType()
        empty = graph.create("prim::ListConstruct")
        empty.output().setType(kind)
        graph.insertNode(empty)
        return empty.output()
    return graph.insertConstant(value)


def _chunk_zeros(graph: torch._C.Graph, node: Any, states: list[str]) -> None:
    """The undefined gradients of the parts of a `prim::ConstantChunk` (its `GradOf`,
    `node`, cats them) as zeros the shape of a defined one: `autodiff_views.py` moves only
    chunks into equal parts into differentiable graphs.

        %g = prim::GradOf[name="prim::ConstantChunk"](%a, %zero)
          ==>  %z = aten::zeros_like(%a)
               %g = prim::GradOf[name="prim::ConstantChunk"](%a, %z)
    """
    defined = inputs_of(node)[states.index(_NONZERO)]
    block = next(node.blocks())
    for k, state in enumerate(states):
        if state == _ZERO:
            zero = node.inputsAt(k)
            with graph.insert_point_guard(node):
                zeros = graph.insert("aten::zeros_like", [defined])
            zeros.setType(defined.type())
            for use in list(zero.uses()):
                if use.user == node or use.user.owningBlock() == block:
                    use.user.replaceInput(use.offset, zeros)
            states[k] = _NONZERO


def _zero_for(graph: torch._C.Graph, value: Any, before: Any, status: dict[int, str]) -> None:
    """Replace every use of `value` by a new `prim::AutogradZero` placed before `before`,
    known zero in `status`."""
    zero = graph.create("prim::AutogradZero")
    zero.output().setType(value.type())
    zero.insertBefore(before)
    value.replaceAllUsesWith(zero.output())
    status[zero.output().unique()] = _ZERO


def _fold_zeros(graph: torch._C.Graph, nodes: list[Any], status: dict[int, str]) -> None:
    """`_specialized`'s walk over `nodes` in order; `status` of values known zero (others
    defined, or unknown where they come from a block that may return None)."""
    for node in nodes:
        kind = node.kind()
        states = [status.get(v.unique(), _NONZERO) for v in node.inputs()]
        if kind == "prim::AutogradZero":  # (autodiff's own: a part of a chunk not read)
            status[node.output().unique()] = _ZERO
        elif kind == "prim::GradOf":
            if all(s == _ZERO for s in states):
                for out in node.outputs():
                    _zero_for(graph, out, node, status)
                node.destroy()
                continue
            if _NONZERO not in states:
                raise ValueError("a GradOf of gradients not known to be defined")
            if _ZERO in states and node.s("name") == "prim::ConstantChunk":
                _chunk_zeros(graph, node, states)
            block = next(node.blocks())
            moved = list(block.nodes())
            for inner in moved:
                inner.moveBefore(node)
            _fold_zeros(graph, moved, status)
            for out, result in zip(node.outputs(), block.returnNode().inputs()):
                out.replaceAllUsesWith(result)
                if _maybe_none(result):
                    status[result.unique()] = _UNKNOWN
            node.destroy()
        elif kind == "prim::AutogradAdd":
            a, b = node.inputs()
            if states[0] == _ZERO or states[1] == _ZERO:
                keep = b if states[0] == _ZERO else a
                node.output().replaceAllUsesWith(keep)
                node.destroy()
            elif states == [_NONZERO, _NONZERO]:
                one = graph.insertConstant(1)
                one.node().moveBefore(node)
                add = graph.create("aten::add", [a, b, one])
                add.output().setType(node.output().type())
                add.insertBefore(node)
                node.output().replaceAllUsesWith(add.output())
                node.destroy()
            else:
                status[node.output().unique()] = _UNKNOWN
        elif kind == "prim::ListUnpack" and states == [_ZERO]:  # (a spread list's gradient)
            for out in node.outputs():
                _zero_for(graph, out, node, status)
            node.destroy()
        elif _ZERO in states and kind not in ("prim::TupleConstruct", "prim::AutogradZero"):
            raise ValueError(f"an undefined gradient reaches {kind}")
        else:
            for inner in blocks_of(node):
                _fold_zeros(graph, list(inner.nodes()), status)
