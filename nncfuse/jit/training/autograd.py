"""autograd: `nncfuse.jit` calls whose inputs or parameters require grad, fused forward and back.

A signature whose tensors (or a module's parameters) require grad, in grad
mode, gets an `AutogradPlan`. Per pattern of non-tensor argument values and
of which tensors require grad, the scripted function is traced by
AOTAutograd into a joint forward-backward graph of ATen ops, split by the
min-cut partitioner (cheap elementwise work is recomputed in the backward,
not saved), and each half runs as a `CompiledGraph` (`fxgraph.py`), the
path of the torch.compile backend: FX -> TorchScript -> the same policy,
fuser and kernels as every other nncfuse call. One `torch.autograd.Function`
ties them together:

    inputs ──_Fused.forward──▶ forward graph (fused) ──▶ outputs, saved tensors
                                                               │ ctx.save_for_backward
    grads of the inputs ◀── backward graph (fused) ◀── grads of the outputs
                    (create_graph=True: the unfused program, recomputed with grad on)

Eager's semantics: `backward()`, `torch.autograd.grad`, `retain_graph`
(saved tensors are freed after a backward without it, and a second one raises
as eager does), in-place changes to saved inputs detected by their version
counters. Higher-order grad runs the unfused program again under grad mode
and differentiates that, so a gradient's own gradient is eager's. Whatever
AOTAutograd cannot trace (data-dependent control flow, an output that aliases
an input, an input that requires grad written in place, an output that does
not require grad) runs the unfused program, with the reason logged under
`autograd`; so does a call in which an input the program writes shares memory
with another input (traced on a copy, the write would not be seen through it).

A module's attributes (parameters, buffers, flags such as `training`) become
inputs of the traced function (`_lifted`), read at every call, so that the
gradients of parameters accumulate in their `.grad` and a changed flag or
attribute gets its own trace.
See docs/autograd.md for why this mechanism rather than TorchScript's autodiff.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import torch

from ... import log
from ...config import Options
from ...tensorexpr.meta import blocks_of
from ..specialize import collector
from ..specialize.fxgraph import CompiledGraph, brief, decompositions
from ..specialize.policy import Program
from .dropouts import plain_dropouts

_log = log.get_logger(__file__)
_MAX_VARIANTS = 8  # patterns of non-tensor values per signature traced; then unfused


def requires_grad(values: tuple[Any, ...], target: Any) -> bool:
    """Whether a call with `values` of `target` (the jit's function or module) needs autograd:
    grad mode is on and a tensor argument or a parameter requires grad."""
    if not torch.is_grad_enabled():
        return False
    if any(isinstance(v, torch.Tensor) and v.requires_grad for v in values):
        return True
    return isinstance(target, torch.nn.Module) and any(
        p.requires_grad for p in target.parameters())


def _frozen(value: Any) -> Any:
    """`value`, a non-tensor argument, as a hashable key; raises TypeError if it cannot be."""
    if isinstance(value, (list, tuple)):
        return (type(value), *map(_frozen, value))
    if isinstance(value, torch.Tensor):
        raise TypeError("a tensor inside a list")
    hash(value)
    return (type(value), value)


class AutogradPlan:
    """The plan of one signature that needs autograd: a traced `_Joint` per pattern of
    non-tensor values and parameters' requires_grad; the unfused program where tracing
    failed or past `_MAX_VARIANTS`."""

    def __init__(self, prog: Program, options: Options):
        self.prog = prog
        self.options = options
        #: the module's attributes the graph reads (parameters, buffers, flags), as
        #: (object, name): read at every call, passed as inputs after the arguments
        self._attributes: list[tuple[Any, str]] = []
        self._fn: Callable[..., Any] | None = prog.unfused  # None: every call runs unfused
        self._variants: dict[Any, _Joint | None] = {}
        self._only: _Joint | None = None  # the one variant of every call, when there is one
        self._lock = threading.Lock()
        if prog.saved_write is not None:
            # Fused, the write would be gone (mutation removed) and backward() would not
            # raise; unfused, TorchScript keeps eager's version counters (the autodiff plan
            # runs this plan's fallback too).
            _log.dump("Running unfused under autograd: ", prog.saved_write)
            self._fn = None
        elif prog.receiver is not None:
            try:
                self._fn, self._attributes = _lifted(prog.graph, prog.receiver)
            except ValueError as e:
                _log.dump("Attributes not lifted to inputs, running unfused: ", e)
                self._fn = None
        else:
            graph = prog.graph.copy()
            changed = plain_dropouts(graph) + _scalar_constants(graph)
            self._attributes = _lift_constants(graph)
            if changed or self._attributes:
                self._fn = torch._C._create_function_from_graph("nncfuse_constants", graph)

    @property
    def graph(self) -> torch._C.Graph | None:
        """The optimized forward graph of the first traced variant (for `graph_for`)."""
        for joint in list(self._variants.values()):
            graphs = joint.forward.graphs() if joint is not None else []
            if graphs:
                return graphs[0]
        return None

    def joints(self) -> list[_Joint]:
        """The traced variants so far, for tests and tools."""
        return [j for j in list(self._variants.values()) if j is not None]

    def fused_graphs(self) -> tuple[list[torch._C.Graph], list[torch._C.Graph]]:
        """The optimized graphs built so far: (the forward's, the backward's)."""
        joints = self.joints()
        return ([g for j in joints for g in j.forward.graphs()],
                [g for j in joints for g in j.backward.graphs()])

    def run(self, args: tuple[Any, ...]) -> Any:
        joint = self._only
        if joint is not None:
            outs = _applied(joint, args)
            if outs is None:
                return self.prog.unfused(*args)
            return outs if joint.returns_tuple else outs[0]
        return self._run(args)

    def _run(self, args: tuple[Any, ...]) -> Any:
        if self._fn is None:
            return self.prog.unfused(*args)
        inputs = (*args, *(obj.getattr(name) for obj, name in self._attributes))
        tensors = [k for k, v in enumerate(inputs) if isinstance(v, torch.Tensor)]
        if not torch.is_grad_enabled() or not any(inputs[k].requires_grad for k in tensors):
            return self.prog.unfused(*args)
        try:
            key = tuple(v.requires_grad if isinstance(v, torch.Tensor) else _frozen(v)
                        for v in inputs)
        except TypeError:
            return self.prog.unfused(*args)
        joint = self._variants.get(key, _MISSING)
        if joint is _MISSING:
            with self._lock:
                joint = self._variants.get(key, _MISSING)
                if joint is _MISSING:
                    joint = self._trace(inputs, tensors)
                    self._variants[key] = joint
                    if joint is not None and len(tensors) == len(inputs) == len(args):
                        # Tensors only, no attributes: the signature fixes the trace.
                        self._only = joint
        if joint is None:
            return self.prog.unfused(*args)
        outs = _applied(joint, tuple(inputs[k] for k in tensors))
        if outs is None:
            return self.prog.unfused(*args)
        return outs if joint.returns_tuple else outs[0]

    def _trace(self, inputs: tuple[Any, ...], tensors: list[int]) -> _Joint | None:
        assert self._fn is not None
        if len(self._variants) >= _MAX_VARIANTS:
            _log.update("Too many patterns of values under autograd; running unfused")
            return None
        try:
            return traced_joint(self._fn, inputs, tensors, self.options)
        except Exception as e:  # noqa: BLE001 - whatever fails, the unfused program runs
            _log.dump("Not traced for autograd, running unfused: ", brief(e)[:500])
            return None


_MISSING: Any = object()


def traced_joint(fn: Callable[..., Any], inputs: tuple[Any, ...], tensors: list[int],
                 options: Options) -> _Joint:
    """`fn` traced at `inputs` (tensors at positions `tensors`) into a `_Joint`. Raises if it
    cannot be traced (outputs that alias an input, an input that requires grad written in
    place, say)."""
    from torch.fx._lazy_graph_module import _use_lazy_graph_module

    # A trace: no collections (see collector.py). Lazy graph modules, as Dynamo makes them
    # (the backend's traces already run under them): AOTAutograd and the partitioner
    # recompile their graphs' Python code a dozen times (BERT: a third of the partition), and
    # nothing reads that code or calls these graphs but the FX fallback, which compiles it on
    # its first call. (The partitioner's backward, reordered into a plain GraphModule, is made
    # lazy in `_Joint`; the conversion generates the code of its own copy of each graph,
    # `fxgraph._scriptable`'s.)
    with collector.paused(), _use_lazy_graph_module(True):
        return _Joint(fn, inputs, tensors, options)


def _unwritten(joint: torch.fx.GraphModule, examples: tuple[torch.Tensor, ...],
               copied: tuple[int, ...], first: int) -> tuple[int, ...]:
    """Of the inputs `copied` (positions among `examples`), traced on copies whose values are
    `joint`'s results from `first` on, those the program writes; the others' copies are
    dropped from `joint` in place (their results, and their reads, which read the input).
    Raises where a write changes an input's shape, strides or dtype (which a copy written
    back cannot do).

        %clone = clone(%x)                          (not written)
        %conv = convolution(%clone, %w, ...)          ==>  %conv = convolution(%x, %w, ...)
        %add_1 = add(%mul_3, %mul_4)                (written: running_mean's new value)
        return (%out, %clone, %add_1, %grad_w, ...)   ==>  return (%out, %add_1, %grad_w, ...)
    """
    placeholders = joint.graph.find_nodes(op="placeholder")
    output = joint.graph.find_nodes(op="output")[0]
    results = list(output.args[0])
    written, dropped = [], set()
    for j, k in enumerate(copied):
        value = results[first + j]
        if (isinstance(value, torch.fx.Node) and value.target == torch.ops.aten.clone.default
                and value.args == (placeholders[k],) and not value.kwargs):
            value.replace_all_uses_with(placeholders[k])  # the same values: none written
            dropped.add(first + j)
            continue
        new = value.meta.get("val") if isinstance(value, torch.fx.Node) else None
        old = examples[k]
        if not isinstance(new, torch.Tensor) or (new.shape, new.stride(), new.dtype) != (
                old.shape, old.stride(), old.dtype):
            raise ValueError("an input written in place changes shape, strides or dtype")
        written.append(k)
    if dropped:
        output.args = (tuple(r for j, r in enumerate(results) if j not in dropped),)
        joint.graph.eliminate_dead_code()
        joint.recompile()
    return tuple(written)


def _lifted(graph: torch._C.Graph, receiver: Any) -> tuple[Callable[..., Any], list[Any]]:
    """A function of `graph`, a module's (its `self` first), that takes the attributes it
    reads as inputs after the other arguments, and those attributes as (object, name).

        graph(%self, %x):                          graph(%x, %weight):
          %lin = prim::GetAttr[name="lin"](%self)    %y = aten::mul(%x, %weight)
          %w = prim::GetAttr[name="weight"](%lin)
          %y = aten::mul(%x, %w)
    """
    graph = graph.copy()
    this = next(graph.inputs())
    objects: dict[int, Any] = {this.unique(): receiver}
    attributes: list[tuple[Any, str]] = []
    getattrs = []

    def visit(block: Any) -> None:
        for node in block.nodes():
            if node.kind() == "prim::SetAttr":
                raise ValueError("the graph sets an attribute")
            if node.kind() == "prim::GetAttr":
                owner = objects.get(node.input().unique())
                if owner is None:
                    raise ValueError("an attribute of a value that is not the module's")
                name = node.s("name")
                getattrs.append(node)
                if isinstance(node.output().type(), torch._C.ClassType):
                    objects[node.output().unique()] = owner.getattr(name)
                    continue
                value = graph.addInput()
                value.setType(node.output().type())
                node.output().replaceAllUsesWith(value)
                attributes.append((owner, name))
            for inner in blocks_of(node):
                visit(inner)

    visit(graph)
    for node in reversed(getattrs):
        node.destroy()
    plain_dropouts(graph)
    _scalar_constants(graph)
    attributes += _lift_constants(graph)
    if list(this.uses()):
        raise ValueError("the module itself is used as a value")
    graph.eraseInput(0)
    return torch._C._create_function_from_graph("nncfuse_lifted", graph), attributes


def _wrapped(value: torch.Tensor) -> bool:
    """Whether `value`, a tensor constant, is a Python number as the tracer records it (a
    0-dim double or long "wrapped number": it does not promote a 0-dim tensor's dtype)."""
    if value.dim() != 0 or value.dtype not in (torch.float64, torch.int64):
        return False
    other = torch.zeros((), dtype=torch.float32 if value.is_floating_point() else torch.int32)
    return (other * value).dtype == other.dtype


def _scalar_constants(graph: torch._C.Graph) -> int:
    """Rewrite, in place, the ops of `graph` that take a traced Python number as a tensor (a
    wrapped-number constant, or `prim::NumToTensor` of a size) to take the number, where the
    op has that overload, and on through ops of numbers only (`pow(size, -0.5)`); the count
    rewritten. Under AOTAutograd the interpreter hands a wrapped number to Python as a
    number, which no Tensor argument takes (`aten::equal() Expected a value of type
    'Tensor'`).

        %c : Double() = prim::Constant[value={0.5}]()      %c : float = prim::Constant[value=0.5]()
        %y = aten::mul(%x, %c)                        ==>   %y = aten::mul(%x, %c)  (mul.Scalar)
    """
    done = 0
    work = [(n.output(), None) for n in graph.findAllNodes("prim::Constant")
            if isinstance(n.output().type(), torch._C.TensorType) and _wrapped(n.t("value"))]
    work += [(n.output(), n.input()) for n in graph.findAllNodes("prim::NumToTensor")]
    while work:
        out, number = work.pop(0)  # the constants first: then a size meets numbers
        source = out.node()
        for use in list(out.uses()):
            user = use.user
            if not user.kind().startswith("aten::") or user.outputsSize() != 1:  # no blocks
                continue
            if number is not None and user.kind() in _TO_NUMBER and (
                    user.kind() == "aten::ScalarImplicit"
                    or _NUMBER_RESULTS.get(number.type().str()) == user.output().type()):
                user.output().replaceAllUsesWith(number)  # Int(NumToTensor(n)) is n
                user.destroy()
                done += 1
                continue
            with graph.insert_point_guard(user):
                scalar = number if number is not None else graph.insertConstant(
                    source.t("value").item())
                inputs = [scalar if k == use.offset else v for k, v in enumerate(user.inputs())]
                if user.kind() in ("aten::add", "aten::sub") and len(inputs) == 3 and all(
                        isinstance(v.type(), torch._C.NumberType | torch._C.IntType
                                   | torch._C.FloatType) for v in inputs[:2]) and \
                        inputs[2].node().kind() == "prim::Constant" and \
                        inputs[2].toIValue() == 1:
                    inputs = inputs[:2]  # add(a, b, alpha=1) of numbers: add.int
                new = graph.create(user.kind(), inputs, 1)
                new.insertBefore(user)
            schema = new.schema()
            returns = schema.rsplit("-> ", 1)[-1].strip()
            result = _NUMBER_RESULTS.get(returns)
            if returns.startswith("Tensor("):  # an in-place op's alias annotation: Tensor(a!)
                returns = "Tensor"
            if schema == "(no schema)" or (returns != "Tensor" and result is None) or (
                    "Scalar" not in schema.split("(", 1)[1].split(",")[use.offset]
                    and result is None):
                new.destroy()
                if number is None and not list(scalar.uses()):
                    scalar.node().destroy()
                continue
            if result is None or not isinstance(user.output().type(), torch._C.TensorType):
                if result is not None and result != user.output().type():
                    new.destroy()
                    continue
                new.output().setType(user.output().type())
                user.output().replaceAllUsesWith(new.output())
            else:  # a number now: its users next, and a tensor of it for the rest
                new.output().setType(result)
                with graph.insert_point_guard(user):
                    tensor = graph.create("prim::NumToTensor", [new.output()], 1)
                    tensor.insertBefore(user)
                tensor.output().setType(user.output().type())
                user.output().replaceAllUsesWith(tensor.output())
                work.append((tensor.output(), new.output()))
            user.destroy()
            done += 1
        if not list(out.uses()):
            source.destroy()
    return done


_TO_NUMBER = ("aten::Int", "aten::Float", "aten::ScalarImplicit")
_NUMBER_RESULTS = {"float": torch._C.FloatType.get(), "int": torch._C.IntType.get(),
                   "bool": torch._C.BoolType.get()}


class _Held:
    """A tensor constant of the graph, lifted to an input: read as an attribute is."""

    def __init__(self, value: torch.Tensor):
        self.value = value

    def getattr(self, _name: str) -> torch.Tensor:
        return self.value


def _lift_constants(graph: torch._C.Graph) -> list[tuple[Any, str]]:
    """Make, in place, each tensor constant of `graph` (`torch.tensor(1.0)` in traced code)
    an input after the others, and return them as attributes: AOTAutograd traces with fake
    tensors, and a real tensor met on the way fails."""
    lifted: list[tuple[Any, str]] = []
    for const in list(graph.findAllNodes("prim::Constant")):
        out = const.output()
        if isinstance(out.type(), torch._C.TensorType) and list(out.uses()):
            value = graph.addInput()
            value.setType(out.type())
            out.replaceAllUsesWith(value)
            lifted.append((_Held(const.t("value")), "constant"))
            const.destroy()
    return lifted


class _Joint:
    """One traced variant: the forward and backward graphs of `fn` at `inputs` (tensors at
    positions `tensors`, the other values compiled in), each a CompiledGraph."""

    def __init__(self, fn: Callable[..., Any], inputs: tuple[Any, ...], tensors: list[int],
                 options: Options):
        from torch._functorch.aot_autograd import aot_export_joint_simple
        from torch._functorch.partitioners import min_cut_rematerialization_partition
        from torch.fx._lazy_graph_module import _LazyGraphModule

        self.fn, self.inputs, self.tensors = fn, inputs, tensors
        self.returns_tuple = True
        examples = tuple(inputs[k] for k in tensors)
        #: the tensors (positions among them) the program writes in place, buffers: traced
        #: on copies, whose final values are outputs after the others, written back. Every
        #: tensor that does not require grad is traced so, and those it does not write are
        #: dropped (`_unwritten`): AOTAutograd refuses inputs written in place, batch norm's
        #: running statistics, but says so only after a full trace (which MobileNetV2's first
        #: steps took twice: 3-4 s of their 18-22 s).
        self.written = tuple(k for k, t in enumerate(examples) if not t.requires_grad)
        joint = aot_export_joint_simple(self.call, examples, trace_joint=True,
                                        decompositions=decompositions())
        outputs = joint.graph.find_nodes(op="output")[0].args[0]
        self.outputs = len(outputs) - len(examples) - len(self.written)  # those that need grad
        self.written = _unwritten(joint, examples, self.written, self.outputs)
        if _shares_written(examples, self.written):
            raise ValueError("an input written in place shares memory with another input")
        #: whether the program draws random numbers (dropout p > 0): its second derivative,
        #: the program run again (`eager_grads`), would draw others (another mask)
        self.random = _random(joint)
        placeholders = joint.graph.find_nodes(op="placeholder")
        if len(placeholders) - len(examples) != self.outputs:
            raise ValueError("an output does not require grad")
        read = _placeholders_read(joint, [placeholders[k] for k in self.written])
        if any(read[:self.outputs]) or any(read[self.outputs + len(self.written):]):
            # A second derivative runs the program again (`eager_grads`), on the values
            # those inputs have then: the ones it wrote.
            raise ValueError("an output or a gradient reads an input the program writes")
        forward, backward = (_LazyGraphModule.from_graphmodule(gm) for gm in
                             min_cut_rematerialization_partition(
                                 joint, examples, num_fwd_outputs=self.outputs + len(self.written)))
        #: per input, the outputs whose gradients its gradient depends on: with none of them
        #: given (outputs the loss does not use), its gradient is None, as in eager
        self.depends = _tangents_read(backward, self.outputs)
        #: per output, the strides its gradient was traced with (the output's: a transposed
        #: output's gradient is transposed too), None where they are not numbers
        self.tangent_strides = _tangent_strides(backward, self.outputs)
        self.forward = CompiledGraph(forward, _examples(forward), "forward", options)
        self.backward = CompiledGraph(backward, _examples(backward), "backward", options)
        if self.forward.program is None or self.backward.program is None:
            raise ValueError(self.forward.reason or self.backward.reason)

    def call(self, *tensors: torch.Tensor) -> tuple[Any, ...]:
        """The unfused program with these tensors, its result as a tuple."""
        full = list(self.inputs)
        copies = [tensors[k].clone() for k in self.written]
        for k, t in zip(self.tensors, tensors):
            full[k] = t
        for k, t in zip(self.written, copies):
            full[self.tensors[k]] = t
        out = self.fn(*full)
        self.returns_tuple = isinstance(out, tuple)
        outs = (*(out if isinstance(out, tuple) else (out,)), *copies)
        # A view of an intermediate (a traced model's last `view`), which AOTAutograd refuses
        # (and says so only after a full trace: GPT-2's first step traced twice), is returned
        # as a copy of its own, which no one can tell apart; views of inputs still fail.
        from torch.multiprocessing.reductions import StorageWeakRef

        storages = {StorageWeakRef(t.untyped_storage()) for t in tensors}
        return tuple(o.clone() if isinstance(o, torch.Tensor) and o._is_view()
                     and StorageWeakRef(o.untyped_storage()) not in storages else o
                     for o in outs)


def _random(gm: torch.fx.GraphModule) -> bool:
    """Whether `gm` draws random numbers (an op tagged `nondeterministic_seeded`: dropout's
    `rand`, `bernoulli`, ...)."""
    return any(n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload)
               and torch.Tag.nondeterministic_seeded in n.target.tags for n in gm.graph.nodes)


def _tangent_strides(backward: torch.fx.GraphModule, outputs: int) -> list[Any]:
    """The strides of the backward's last `outputs` inputs, the tangents, as traced."""
    tangents = [n.meta.get("val") for n in backward.graph.find_nodes(op="placeholder")]
    strides: list[Any] = []
    for t in tangents[len(tangents) - outputs:]:
        stride = tuple(t.stride()) if isinstance(t, torch.Tensor) else None
        strides.append(stride if stride is not None and all(type(d) is int for d in stride)
                       else None)
    return strides


def _as_traced(grad: torch.Tensor | None, shape: Any, dtype: torch.dtype,
               stride: tuple[int, ...] | None) -> torch.Tensor:
    """`grad` (zeros where None) in the layout the backward was traced with (contiguous where
    that is unknown): a view in the backward graph may need it (a transposed output's)."""
    if stride is None or len(stride) != len(shape):
        return grad.contiguous() if grad is not None else torch.zeros(shape, dtype=dtype)
    if grad is not None and all(s == d for s, d, n in zip(grad.stride(), stride, shape) if n > 1):
        return grad  # the strides of dims of size 1 do not matter to a view
    out = torch.empty_strided(shape, stride, dtype=dtype)
    return out.copy_(grad) if grad is not None else out.zero_()


def _tangents_read(backward: torch.fx.GraphModule, outputs: int) -> list[frozenset[int]]:
    """For each result of `backward` (an input's gradient), which of its last `outputs`
    placeholders (the outputs' gradients) it is computed from."""
    placeholders = backward.graph.find_nodes(op="placeholder")
    return _placeholders_read(backward, placeholders[len(placeholders) - outputs:])


def _placeholders_read(gm: torch.fx.GraphModule,
                       chosen: list[torch.fx.Node]) -> list[frozenset[int]]:
    """For each result of `gm`, which of the placeholders `chosen` (positions among them) it
    is computed from."""
    position = {node: k for k, node in enumerate(chosen)}
    reads: dict[torch.fx.Node, frozenset[int]] = {}
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            reads[node] = frozenset([position[node]]) if node in position else frozenset()
        elif node.op != "output":
            reads[node] = frozenset().union(*(reads[n] for n in node.all_input_nodes))
    results = gm.graph.find_nodes(op="output")[0].args[0]
    return [reads[r] if isinstance(r, torch.fx.Node) else frozenset() for r in results]


def _examples(gm: torch.fx.GraphModule) -> list[Any]:
    return [n.meta.get("val") for n in gm.graph.find_nodes(op="placeholder")]


class _Fused(torch.autograd.Function):
    """The fused forward and backward of a `_Joint` as one autograd node."""

    @staticmethod
    def forward(ctx: Any, joint: _Joint, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        results = joint.forward(*tensors)
        ctx.save_for_backward(*results[joint.outputs + len(joint.written):])
        ctx.joint = joint
        ctx.inputs = tensors  # for higher-order grad (inputs only: no reference cycle)
        ctx.versions = versions(tensors)
        ctx.set_materialize_grads(False)  # None: an output the loss does not use
        outs = tuple(results[:joint.outputs])
        ctx.shapes = [(o.shape, o.dtype) for o in outs]
        written = results[joint.outputs:joint.outputs + len(joint.written)]
        ctx.mark_non_differentiable(*written)
        return (*outs, *written)

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor | None) -> tuple[Any, ...]:
        joint: _Joint = ctx.joint
        saved = ctx.saved_tensors  # raises after a backward without retain_graph
        given = frozenset(k for k, g in enumerate(grads) if g is not None)
        grads = grads[:joint.outputs]  # not those of the written buffers' values
        full = [_as_traced(g, shape, dtype, stride)
                for g, (shape, dtype), stride in zip(grads, ctx.shapes, joint.tangent_strides)]
        if torch.is_grad_enabled():
            results = eager_grads(joint.call, ctx.inputs, ctx.versions, tuple(full),
                                  joint.random, joint.written)
        else:
            results = list(joint.backward(*saved, *full))
        return (None, *(r if joint.depends[k] & given else None
                         for k, r in enumerate(results)))


def versions(values: tuple[Any, ...]) -> list[int | None]:
    """The tensors' version counters; None for an inference tensor, which has none (and which
    no one writes outside inference mode), and for a value that is not a tensor."""
    return [t._version if isinstance(t, torch.Tensor) and not t.is_inference() else None
            for t in values]


def _applied(joint: _Joint, tensors: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...] | None:
    """`joint`'s outputs for `tensors`; the buffers it writes get their new values, as the
    program writes them in place. None where one of those shares memory with another input
    (`_shares_written`): the caller runs the program unfused."""
    if _shares_written(tensors, joint.written):
        return None
    outs = _Fused.apply(joint, *tensors)
    if not joint.written:
        return outs
    with torch.no_grad():
        for k, value in zip(joint.written, outs[joint.outputs:]):
            tensors[k].copy_(value)
    return outs[:joint.outputs]


def _shares_written(tensors: tuple[torch.Tensor, ...], written: tuple[int, ...]) -> bool:
    """Whether a tensor the program writes (positions `written`) shares memory with another
    of `tensors` (`f(w, n, n)` writing n): the trace wrote a copy of it, which the other
    does not see, as eager's would."""
    if not written:
        return False
    storages = [t.untyped_storage()._cdata for t in tensors]  # (the StorageImpl's address)
    mine = {storages[k] for k in written}
    return len(mine) < len(written) or any(
        s in mine for k, s in enumerate(storages) if k not in written)


def eager_grads(call: Callable[..., Any], inputs: tuple[Any, ...], seen: list[int | None],
                grads: tuple[Any, ...], random: bool, written: tuple[int, ...] = ()) -> list[Any]:
    """The gradients of `inputs` (None for one that does not require grad) with their own
    graph (create_graph=True): `call(*inputs)`, the unfused program, run again under eager
    autograd and differentiated, given `grads` of its outputs (None: not used). It raises
    where that is not the forward's program: a random one (`random`: dropout's mask drawn
    again), inputs changed since (their `versions` were `seen`) but those `written` by the
    program itself (`_applied`), which nothing reads."""
    if random:
        # As torch.compile's AOTAutograd raises for every double backward: a clear error,
        # not a gradient of another dropout mask; first-order gradients stay fused.
        raise RuntimeError("nncfuse does not support a second derivative (create_graph=True) "
                           "of a program that draws random numbers (dropout with p > 0): run "
                           "it unfused (NNCFUSE_DISABLE=1)")
    if any(now != then for k, (now, then) in enumerate(zip(versions(inputs), seen))
           if k not in written):
        raise RuntimeError("one of the variables needed for gradient computation has been "
                           "modified by an inplace operation")
    wanted = [k for k, t in enumerate(inputs) if isinstance(t, torch.Tensor) and t.requires_grad]
    with torch.enable_grad():
        # Each input through a view of its own: the gradient of one input is then the
        # program's alone, not also through another input computed from it (`f(x, x.sin())`),
        # and it still reaches the input (the next derivative goes on through it).
        own = list(inputs)
        for k in wanted:
            own[k] = inputs[k].view_as(inputs[k])
        outs = call(*own)
        outs = outs if isinstance(outs, tuple) else (outs,)
        pairs = [(o, g) for o, g in zip(outs, grads)
                 if g is not None and isinstance(o, torch.Tensor) and o.requires_grad]
        got = torch.autograd.grad([o for o, _ in pairs], [own[k] for k in wanted],
                                  [g for _, g in pairs], create_graph=True, allow_unused=True)
    result: list[Any] = [None] * len(inputs)
    for k, g in zip(wanted, got):
        result[k] = g
    return result


class FusedGraph:
    """An FX graph of tensors in, tensors out (Dynamo's, for the torch.compile backend), traced
    into a `_Joint` and called through `_Fused`, as `nncfuse.jit` calls its programs: one
    autograd node per call, without AOTAutograd's runtime wrappers. Raises where it cannot
    be traced (the backend then gives the graph to AOTAutograd)."""

    def __init__(self, gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor],
                 options: Options):
        returns_list = []

        def fn(*args: Any) -> tuple[Any, ...]:
            out = gm(*args)
            if not returns_list:  # at the trace (a second derivative calls it again)
                returns_list.append(isinstance(out, list))
            return tuple(out) if isinstance(out, (list, tuple)) else out

        self.gm = gm
        self.joint = traced_joint(fn, tuple(example_inputs), list(range(len(example_inputs))),
                                  options)
        self.returns_list = returns_list[0]

    def __call__(self, *args: torch.Tensor) -> Any:
        outs = _applied(self.joint, args)
        if outs is None:
            return self.gm(*args)  # (under eager autograd)
        return list(outs) if self.returns_list else outs
