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

    call ──▶ eval mode, no grad wanted, every flag, parameter, buffer, submodule and
             │ attribute the code reads the same object (`module_state.py`), each tensor
             │ at the same `_version` as when frozen?
             ├─ yes ──▶ the frozen module's fused plans
             └─ no  ──▶ (training, or grad wanted) the module unfrozen, fused as usual;
                        (back in a kept state: eval after train) its frozen plans;
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
from typing import Any

import torch

from ... import log
from ...config import Options
from ..rewrites.conv_pads import fold_conv_pads
from ..specialize import scripting
from ..specialize.module_state import Kept, ModuleState, module_state
from .function import FusedFunction

_log = log.get_logger(__file__)
_KEPT_STATES = 4  # frozen states kept: eval after train finds its frozen module again


@dataclasses.dataclass(frozen=True)
class _Snapshot:
    """The module's state when frozen: what the guard compares each call with. The flags,
    objects and attributes the code reads (`module_state.py`, as the unfrozen path's guard),
    and as freezing made constants of the tensors' values, their versions too."""

    state: ModuleState
    versions: tuple[tuple[torch.Tensor, int], ...]  # (tensor, its _version when frozen)
    values: tuple[tuple[torch.Tensor, torch.Tensor], ...]  # (live, copy), with check_values
    requires_grad: bool  # whether any parameter requires grad

    @property
    def training(self) -> bool:
        return self.state.training

    def fresh(self) -> bool:
        return self.state.fresh() and self._unchanged()

    def _unchanged(self) -> bool:
        if any(t._version != version for t, version in self.versions):
            return False
        return all(torch.equal(_bits(live), copy) for live, copy in self.values)

    def rebound(self) -> _Snapshot | None:
        """This snapshot with the module's equal new plain values (see `ModuleState`)."""
        state = self.state.rebound()
        if state is None or not self._unchanged():
            return None
        return dataclasses.replace(self, state=state)


_INT_OF_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _bits(t: torch.Tensor) -> torch.Tensor:
    """`t` as integers of its width: equal bit for bit (NaN equals itself, -0.0 is not 0.0)."""
    if t.is_complex() or t.dtype == torch.bool:
        return t.view(torch.uint8) if t.dtype == torch.bool else t
    return t.view(_INT_OF_SIZE[t.element_size()]) if t.is_floating_point() else t


def _snapshot(module: torch.nn.Module, script: torch.jit.ScriptModule,
              check_values: bool) -> _Snapshot:
    state = module_state(module, script)
    tensors = list(state.tensors())
    values = tuple((t, _bits(t.detach()).clone()) for t in tensors) if check_values else ()
    return _Snapshot(state, tuple((t, t._version) for t in tensors), values,
                     any(t.requires_grad for t in tensors))


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


def _scripted(module: torch.nn.Module) -> torch.jit.ScriptModule:
    """`module` scripted, unless it is a ScriptModule."""
    if isinstance(module, torch.jit.ScriptModule):
        return module
    with scripting.compile_lock, warnings.catch_warnings():
        # TorchScript warns that script is deprecated: it is our substrate.
        warnings.filterwarnings("ignore", category=DeprecationWarning, module="torch.jit")
        return torch.jit.script(module)


def _frozen_module(script: torch.jit.ScriptModule) -> torch.jit.ScriptModule:
    """`script` frozen by TorchScript, its convolutions channels-last."""
    with torch.no_grad(), scripting.compile_lock, warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=DeprecationWarning, module="torch.jit")
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
        #: earlier states, found again when the module is back in one (eval after train)
        self._kept: Kept[_Frozen] = Kept(_KEPT_STATES, lambda f: f.snapshot,
                                         lambda f, s: dataclasses.replace(f, snapshot=s))
        self._unfrozen: FusedFunction | None = None
        self._unfreezable = False  # TorchScript cannot script it: always unfrozen
        self._lock = threading.Lock()
        #: how many times the module was frozen (a changed parameter freezes it again)
        self.freezes = 0

    def current(self) -> FusedFunction:
        """The function that runs the next call (in this grad mode): the frozen module's, frozen
        again if a parameter changed, or the unfrozen module's (training, or grad wanted)."""
        frozen = self._frozen
        if self._unfreezable:
            return self._eager_path("TorchScript cannot script the module")
        if frozen is None or not frozen.snapshot.fresh():
            with self._lock:
                frozen = self._frozen
                if frozen is None or not frozen.snapshot.fresh():
                    frozen = self._kept.find() or self._freeze()
                    self._frozen = frozen
        if self._unfreezable or frozen.fn is None:
            return self._eager_path("a module is in training mode, or freezing failed")
        if frozen.snapshot.requires_grad and torch.is_grad_enabled():
            return self._eager_path("grad mode is on and parameters require grad")
        return frozen.fn

    def _freeze(self) -> _Frozen:
        """A new `_Frozen` for the module's state now, kept. Past `max_specializations`
        freezes, the state runs unfrozen (each freeze compiles anew)."""
        if self._frozen is not None:
            _log.update("The module's state changed since freezing; freezing again")
        try:
            script = _scripted(self.target)
            snapshot = _snapshot(self.target, script, self.check_values)
        except Exception as e:  # noqa: BLE001 - no script, or nothing to guard: unfrozen
            warnings.warn(f"nncfuse: cannot freeze {type(self.target).__name__}, running it "
                          f"unfrozen: {e}", stacklevel=5)
            self._unfreezable = True
            return _Frozen(None, None)  # type: ignore[arg-type] - never kept nor checked
        frozen = _Frozen(snapshot, None)
        if snapshot.training:  # TorchScript freezes only eval modules
            pass
        elif self.freezes >= max(self.options.max_specializations, 1):
            _log.update("Frozen too many times; running unfrozen")
        else:
            try:
                frozen = _Frozen(snapshot, FusedFunction(_frozen_module(script), self.options))
                self.freezes += 1
            except Exception as e:  # noqa: BLE001 - TorchScript cannot freeze it: unfrozen
                warnings.warn(f"nncfuse: cannot freeze {type(self.target).__name__}, running "
                              f"it unfrozen: {e}", stacklevel=5)
        self._kept.add(frozen)
        return frozen

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
