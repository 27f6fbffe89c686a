"""Frozen inference: `nncfuse.jit(module, freeze=True)` for an eval-mode module or
ScriptModule.

Freezing is TorchScript's own: `torch.jit.freeze` inlines the module's
parameters and attributes as constants, folds batch norm into the
convolution before it (and `add`/`mul` by constants into convolutions and
linears), and constant-propagates what the convolution's strides and padding
were (GetAttrs and list constructs in a scripted `nn.Conv2d`), so that the
convolution and what follows it fuse into one group with oneDNN's fused
routines (`tensorexpr/lowerings/external.py`). nncfuse adds the guard:

    call ──▶ eval mode, no grad wanted, every parameter and buffer the same object
             │ at the same `_version` as when frozen?
             ├─ yes ──▶ the frozen module's fused plans
             └─ no  ──▶ (training, or grad wanted) the module unfrozen, fused as usual;
                        (a parameter changed) freeze again, then run the new plans

An optimizer step and `load_state_dict` write parameters in place, which
bumps `_version`; assigning a new `nn.Parameter` changes identity. A write
through `param.data` bypasses the version counter (autograd documents it as
untracked), so the guard also compares each parameter's values with the
frozen copy's, bit for bit (the default, `freeze=True`): memory-bound
comparisons per call, cheap next to the convolutions; `freeze="versions"`
trusts identity and versions alone (and keeps no copy).
"""

from __future__ import annotations

import dataclasses
import threading
import warnings
from typing import Any

import torch

from .. import log
from ..config import Options
from . import scripting
from .function import FusedFunction

_log = log.get_logger(__file__)


@dataclasses.dataclass(frozen=True)
class _Snapshot:
    """The module's state when frozen: what the guard compares each call with."""

    slots: tuple[tuple[Any, str, torch.Tensor | None, int], ...]
    sizes: tuple[tuple[Any, int], ...]  # each dict's size: none added or removed
    values: tuple[tuple[torch.Tensor, torch.Tensor], ...]  # (live, copy), with check_values
    requires_grad: bool  # whether any parameter requires grad
    modules: tuple[tuple[torch.nn.Module, bool], ...]  # each (sub)module, its training flag

    @property
    def training(self) -> bool:
        return any(training for _, training in self.modules)

    def fresh(self) -> bool:
        if any(m.training != training for m, training in self.modules):
            return False
        for d, name, t, version in self.slots:
            got = d[name] if name in d else None
            if got is not t or (t is not None and t._version != version):
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


def _tensor_dicts(module: torch.nn.Module) -> list[Any]:
    """The `_parameters` and `_buffers` dicts of `module` and its submodules."""
    dicts: list[Any] = []  # dicts, or a ScriptModule's wrappers of its C++ attributes
    for m in module.modules():
        dicts.append(m._parameters)
        dicts.append(m._buffers)
    return dicts


def _snapshot(module: torch.nn.Module, check_values: bool) -> _Snapshot:
    modules = tuple((m, m.training) for m in module.modules())
    dicts = _tensor_dicts(module)
    slots = tuple((d, name, t, -1 if t is None else t._version)
                  for d in dicts for name, t in d.items())
    seen: set[int] = set()
    values = []
    for _, _, t, _ in slots:
        if check_values and t is not None and id(t) not in seen:
            seen.add(id(t))
            values.append((t, _bits(t.detach()).clone()))
    requires_grad = any(t is not None and t.requires_grad for _, _, t, _ in slots)
    sizes = tuple((d, len(d)) for d in dicts)
    return _Snapshot(slots, sizes, tuple(values), requires_grad, modules)


@dataclasses.dataclass(frozen=True)
class _Frozen:
    snapshot: _Snapshot
    fn: FusedFunction | None  # of the frozen ScriptModule; None if a module is training


class FrozenFunction:
    """An eval-mode `nn.Module` run frozen (see the module docstring); `graph_for`,
    `compile_failures` and `graph` as a `FusedFunction`'s, of the frozen module's plans."""

    def __init__(self, module: torch.nn.Module, options: Options, check_values: bool = True):
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
            return self._eager_path("a module is in training mode")
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
        with torch.no_grad(), scripting.compile_lock, warnings.catch_warnings():
            # TorchScript warns that freeze and script are deprecated: they are our substrate.
            warnings.filterwarnings("ignore", category=DeprecationWarning, module="torch.jit")
            script = self.target
            if not isinstance(script, torch.jit.ScriptModule):
                script = torch.jit.script(script)
            # `freeze` clones the module: the user's is left as it was.
            frozen = torch.jit.freeze(script)
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
