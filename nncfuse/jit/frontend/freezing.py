"""Frozen inference: `nncfuse.jit(module, freeze=True)` for an eval-mode module or
ScriptModule.

Freezing is TorchScript's own: `torch.jit.freeze` inlines the module's
parameters and attributes as constants, folds batch norm into the
convolution before it (and adds and multiplications by constants into
convolutions), and constant-propagates what the convolution's strides and padding
were (GetAttrs and list constructs in a scripted `nn.Conv2d`), so that the
convolution and what follows it fuse into one group with oneDNN's fused
routines (`tensorexpr/lowerings/external.py`). nncfuse then lays the
convolutions out channels-last (`channels_last`), where oneDNN is fastest and
takes the weights packed once, turns a symmetric zero pad before one into its
padding (`rewrites/conv_pads.py`), and adds the guard:

    call ──▶ eval mode, no grad wanted, every parameter and buffer the same object
             │ at the same `_version` as when frozen?
             ├─ yes ──▶ the frozen module's fused plans
             └─ no  ──▶ (training, or grad wanted) the module unfrozen, fused as usual;
                        (a parameter changed) freeze again, then run the new plans

An optimizer step and `load_state_dict` write parameters in place, which
bumps `_version`; assigning a new `nn.Parameter` changes identity. A write
through `param.data` bypasses the version counter (autograd documents it as
untracked): `freeze="checked"` also compares each parameter's values with a
copy taken when freezing, bit for bit, on every call. That sees it, at the
price of reading every parameter per call (ResNet-18's 45 MB: some 15 ms,
more than its convolutions save); `freeze=True` trusts identity and versions.
"""

from __future__ import annotations

import dataclasses
import threading
import warnings
from collections.abc import Callable
from functools import partial
from typing import Any

import torch

from ... import log
from ...config import Options
from ..rewrites.conv_pads import fold_conv_pads
from ..specialize import scripting
from .function import FusedFunction

_log = log.get_logger(__file__)


Getter = Callable[[], Any]


@dataclasses.dataclass(frozen=True)
class _Snapshot:
    """The module's state when frozen: what the guard compares each call with. Each getter
    reads one attribute now: a dict lookup for an nn.Module, a C++ attribute read for a
    ScriptModule (0.2 us; through its Python wrappers 5 us: MobileNetV2 has 312)."""

    slots: tuple[tuple[Getter, torch.Tensor | None, int], ...]  # (getter, tensor, version)
    sizes: tuple[tuple[dict[str, Any], int], ...]  # an nn.Module's dicts: none added, removed
    values: tuple[tuple[torch.Tensor, torch.Tensor], ...]  # (live, copy), with check_values
    requires_grad: bool  # whether any parameter requires grad
    modules: tuple[tuple[Getter, bool], ...]  # training flags that matter, and their values

    @property
    def training(self) -> bool:
        return any(training for _, training in self.modules)

    def fresh(self) -> bool:
        if any(get() != training for get, training in self.modules):
            return False
        for get, t, version in self.slots:
            if get() is not t or (t is not None and t._version != version):
                return False
        if any(len(d) != n for d, n in self.sizes):
            return False
        return all(torch.equal(_bits(live), copy) for live, copy in self.values)


_INT_OF_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _bits(t: torch.Tensor) -> torch.Tensor:
    """`t` as integers of its width: equal bit for bit (NaN equals itself, -0.0 is not 0.0)."""
    if t.is_complex() or t.dtype == torch.bool:
        return t.view(torch.uint8) if t.dtype == torch.bool else t
    return t.view(_INT_OF_SIZE[t.element_size()]) if t.is_floating_point() else t


def _reads_training(m: torch.jit.ScriptModule) -> bool:
    """Whether a ScriptModule's own methods read `self.training` (a traced one's do not:
    tracing recorded one mode's ops)."""
    methods = [m._c._get_method(name) for name in m._c._method_names()]
    return any('prim::GetAttr[name="training"]' in str(f.graph) for f in methods)


def _snapshot(module: torch.nn.Module, check_values: bool) -> _Snapshot:
    slots: list[tuple[Getter, torch.Tensor | None, int]] = []
    sizes: list[tuple[dict[str, Any], int]] = []
    modules: list[tuple[Getter, bool]] = []
    for m in module.modules():
        if isinstance(m, torch.jit.ScriptModule):
            c = m._c
            names = [*m._parameters.keys(), *m._buffers.keys()]
            slots += [(partial(c.getattr, name), c.getattr(name), 0) for name in names]
            if m is module or _reads_training(m):
                modules.append((partial(c.getattr, "training"), m.training))
            continue
        for d in (m._parameters, m._buffers):
            slots += [(partial(d.get, name), t, 0) for name, t in d.items()]
            sizes.append((d, len(d)))
        modules.append((partial(getattr, m, "training"), m.training))
    slots = [(get, t, -1 if t is None else t._version) for get, t, _ in slots]
    seen: set[int] = set()
    values = []
    for _, t, _ in slots:
        if check_values and t is not None and id(t) not in seen:
            seen.add(id(t))
            values.append((t, _bits(t.detach()).clone()))
    requires_grad = any(t is not None and t.requires_grad for _, t, _ in slots)
    return _Snapshot(tuple(slots), tuple(sizes), tuple(values), requires_grad, tuple(modules))


_CHANNELS_LAST = 2  # torch.channels_last, as TorchScript's MemoryFormat constants number it
_CONVOLUTIONS = ("aten::conv2d", "aten::_convolution")


def channels_last(graph: torch._C.Graph) -> int:
    """Run a frozen graph's 2-d convolutions of constant weights channels-last, in place; return
    how many. The input of each is made channels-last, unless computed from another one's
    output (oneDNN writes channels-last, elementwise ops keep it; where a view does not, the
    convolution runs as it is), its weight too, and the graph's tensor outputs computed
    from them are made contiguous again, as eager returns them:

        %y = aten::conv2d(%x, %w, ...)        %xc = aten::contiguous(%x, 2)
        %z = aten::relu(%y)              ->   %y = aten::conv2d(%xc, %w_channels_last, ...)
        return (%z)                           %z = aten::relu(%y)
                                              %zc = aten::contiguous(%z, 0)
                                              return (%zc)
    """
    fold_conv_pads(graph)  # zero pads as the convolutions' own padding: no padded copies
    converted: set[Any] = set()  # values computed from a converted convolution
    count = 0
    for node in list(graph.nodes()):
        if node.kind() in _CONVOLUTIONS and _constant_weight(node, 4) is not None:
            if node.kind() == "aten::_convolution" and node.inputsAt(6).toIValue() is not False:
                continue  # transposed
            _channels_last_input(graph, node, node.inputsAt(0) not in converted)
            count += 1
            converted.add(node.output())
        elif any(v in converted for v in _uses(node)):
            converted.update(node.outputs())
    if count:
        for k, value in enumerate(graph.return_node().inputs()):
            _contiguous_outputs(graph, graph.return_node(), k, value, converted)
    return count


def _constant_weight(node: Any, dim: int) -> torch.Tensor | None:
    w = node.inputsAt(1)
    if w.node().kind() != "prim::Constant" or not isinstance(w.type(), torch._C.TensorType):
        return None
    t = w.toIValue()
    return t if isinstance(t, torch.Tensor) and t.dim() == dim else None


def _uses(node: Any) -> list[Any]:
    """The values `node` reads, those of the nodes in its blocks included."""
    values = list(node.inputs())
    for block in node.blocks():
        for inner in block.nodes():
            values += _uses(inner)
        values += list(block.returnNode().inputs())
    return values


def _channels_last_input(graph: torch._C.Graph, node: Any, convert: bool) -> None:
    with graph.insert_point_guard(node):
        if convert:
            fmt = graph.insertConstant(_CHANNELS_LAST)
            x = graph.create("aten::contiguous", [node.inputsAt(0), fmt]).insertBefore(node)
            x.output().setType(torch._C.TensorType.get())
            node.replaceInput(0, x.output())
        w = _constant_weight(node, 4).contiguous(memory_format=torch.channels_last)
        node.replaceInput(1, graph.insertConstant(w))


def _contiguous_outputs(graph: torch._C.Graph, user: Any, k: int, value: Any,
                        converted: set[Any]) -> None:
    """Make output `value`, input `k` of `user` (the return, or a tuple it returns),
    contiguous if it was computed from a converted convolution."""
    if value not in converted:
        return
    producer = value.node()
    if producer.kind() == "prim::TupleConstruct" and len(value.uses()) == 1:
        for j, item in enumerate(producer.inputs()):
            _contiguous_outputs(graph, producer, j, item, converted)
        return
    if not isinstance(value.type(), torch._C.TensorType):
        return
    with graph.insert_point_guard(user):
        fmt = graph.insertConstant(0)  # torch.contiguous_format
        out = graph.create("aten::contiguous", [value, fmt]).insertBefore(user)
        out.output().setType(value.type())
        user.replaceInput(k, out.output())


@dataclasses.dataclass(frozen=True)
class _Frozen:
    snapshot: _Snapshot
    fn: FusedFunction | None  # of the frozen ScriptModule; None: training, or not freezable


def _frozen_module(module: torch.nn.Module) -> torch.jit.ScriptModule:
    """`module` scripted (unless it is), frozen by TorchScript, its convolutions channels-last."""
    with torch.no_grad(), scripting.compile_lock, warnings.catch_warnings():
        # TorchScript warns that freeze and script are deprecated: they are our substrate.
        warnings.filterwarnings("ignore", category=DeprecationWarning, module="torch.jit")
        script = module
        if not isinstance(script, torch.jit.ScriptModule):
            script = torch.jit.script(script)
        # `freeze` clones the module: the user's is left as it was.
        frozen = torch.jit.freeze(script)
        channels_last(frozen.forward.graph)
    return frozen


class FrozenFunction:
    """An eval-mode `nn.Module` run frozen (see the module docstring); `graph_for`,
    `compile_failures` and `graph` as a `FusedFunction`'s, of the frozen module's plans."""

    def __init__(self, module: torch.nn.Module, options: Options, check_values: bool = False):
        self.target = module
        self.options = dataclasses.replace(options, freeze=False)
        self.check_values = check_values
        self._frozen: _Frozen | None = None
        self._unfrozen: FusedFunction | None = None
        self._lock = threading.Lock()
        #: how many times the module was frozen (a changed parameter freezes it again)
        self.freezes = 0

    def current(self) -> FusedFunction:
        """The function that runs the next call (in this grad mode): the frozen module's, frozen
        again if a parameter changed, or the unfrozen module's (training, or grad wanted)."""
        frozen = self._frozen
        if frozen is None or not frozen.snapshot.fresh():
            with self._lock:
                frozen = self._frozen
                if frozen is None or not frozen.snapshot.fresh():
                    frozen = self._freeze()
        if frozen.fn is None:
            return self._eager_path("a module is in training mode, or freezing failed")
        if frozen.snapshot.requires_grad and torch.is_grad_enabled():
            return self._eager_path("grad mode is on and parameters require grad")
        return frozen.fn

    def _freeze(self) -> _Frozen:
        if self._frozen is not None:
            _log.update("A parameter or buffer changed since freezing; freezing again")
        snapshot = _snapshot(self.target, self.check_values)
        if snapshot.training:  # TorchScript freezes only eval modules
            self._frozen = _Frozen(snapshot, None)
            return self._frozen
        try:
            frozen = _frozen_module(self.target)
        except Exception as e:  # noqa: BLE001 - TorchScript cannot freeze it: run it unfrozen
            warnings.warn(f"nncfuse: cannot freeze {type(self.target).__name__}, running it "
                          f"unfrozen: {e}", stacklevel=4)
            self._frozen = _Frozen(snapshot, None)
            return self._frozen
        self._frozen = _Frozen(snapshot, FusedFunction(frozen, self.options))
        self.freezes += 1
        return self._frozen

    def _eager_path(self, why: str) -> FusedFunction:
        if self._unfrozen is None:
            with self._lock:
                if self._unfrozen is None:
                    _log.update(f"Running unfrozen: {why}")
                    self._unfrozen = FusedFunction(self.target, self.options)
        return self._unfrozen

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.current()(*args, **kwargs)

    def graph_for(self, *args: Any, **kwargs: Any) -> torch._C.Graph | None:
        return self.current().graph_for(*args, **kwargs)

    @property
    def graph(self) -> torch._C.Graph | None:
        return self.current().graph

    @property
    def compile_failures(self) -> list[Any]:
        return self.current().compile_failures
