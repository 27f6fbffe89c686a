"""Module state: what a module's scripted code reads of its Python module, and a check cheap
enough for every call that it still holds.

`torch.jit.script(module)` copies what it sees: each submodule's `training` flag and plain
attributes, the constants it bakes into the code (Dropout's `p`, GELU's `approximate`,
LayerNorm's `eps`), and the parameter, buffer and submodule objects it holds. Plans made from
it are right for that state only. `module_state` lists, from the scripted forward's inlined
graph, each attribute the code reads (a `prim::GetAttr`) and each constant of the modules it
reaches that its compiled methods name, as (the Python dict that holds it, its name, the
object it held):

    graph(%self, %x):                                    (root._modules, "1", dropout)
      %d = prim::GetAttr[name="1"](%self)         ->     (dropout.__dict__, "training", True)
      %t = prim::GetAttr[name="training"](%d)            (dropout.__dict__, "p", 0.5)
      %y = aten::dropout(%x, 0.5, %t)                    (dropout.__dict__, "inplace", False)

`ModuleState.fresh` compares every entry by identity, in C loops over flat tuples (`map`,
`operator.is_`): 25-60 ns an entry, 1.4 us for a ten-module transformer block's 34. A
flag flipped by `train()`/`eval()`, a reassigned parameter, a replaced submodule or a changed
attribute each put another object there. In-place writes (an optimizer step,
`load_state_dict`, `.double()`) keep the objects: the code reads them at run time, and the
plans' type checks guard what they were specialized to. The submodules of a Sequential,
ModuleList or ModuleDict are counted too (its forward iterates them). `rebound` tells an
equal state in new objects (a flag set to the same value again, an equal float) from a
changed one.

`Kept` keeps a few specializations by state (most recent first), so that flipping a model
between training and eval finds the earlier plans again instead of compiling anew.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import operator
import re
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

import torch

_PLAIN = (type(None), bool, int, float, str, torch.dtype, torch.device)
_MISSING = object()
_CONTAINERS = (torch.nn.Sequential, torch.nn.ModuleList, torch.nn.ModuleDict)


def _plain(value: Any) -> bool:
    """Whether `value` is compared by value (a number, string, ... or a tuple or list of them)."""
    if isinstance(value, (tuple, list)):
        return all(map(_plain, value))
    return isinstance(value, _PLAIN)


def _same(now: Any, then: Any) -> bool:
    """Whether `now` may stand for `then`: the same object, or an equal plain value of the
    same type (True is not 1; 0.0 is -0.0, which no attribute here tells apart)."""
    if now is then:
        return True
    if type(now) is not type(then) or not _plain(then):
        return False
    if isinstance(then, (tuple, list)):
        return len(now) == len(then) and all(map(_same, now, then))
    return bool(now == then)


@dataclasses.dataclass(frozen=True, eq=False, repr=False)
class ModuleState:
    """What a module's scripted code read: `objects[k]` was `dicts[k][keys[k]]` (a Python
    module's `__dict__`, `_parameters`, `_buffers` or `_modules`); `getters[k](names[k])`
    read a ScriptModule's attribute (`_c.getattr`: a C++ read, 0.2 us); `sized[k]` had
    `sizes[k]` entries."""

    dicts: tuple[dict[str, Any], ...]
    keys: tuple[str, ...]
    objects: tuple[Any, ...]
    getters: tuple[Callable[[str], Any], ...] = ()
    names: tuple[str, ...] = ()
    values: tuple[Any, ...] = ()
    sized: tuple[dict[str, Any], ...] = ()
    sizes: tuple[int, ...] = ()
    training: bool = False  # whether a flag the code reads is True (TorchScript freezes none)

    def fresh(self) -> bool:
        """Whether the module holds every object it held (per call: keep it tight)."""
        return (all(map(operator.is_, map(dict.get, self.dicts, self.keys), self.objects))
                and (not self.sized or tuple(map(len, self.sized)) == self.sizes)
                and (not self.getters or all(map(operator.is_, map(
                    operator.call, self.getters, self.names), self.values))))

    def rebound(self) -> ModuleState | None:
        """This state with the objects the module holds now, if each stands for its own (the
        same tensor or module, an equal plain value); else None: the state changed."""
        if tuple(map(len, self.sized)) != self.sizes:
            return None
        objects = tuple(map(dict.get, self.dicts, self.keys, [_MISSING] * len(self.keys)))
        values = tuple(map(operator.call, self.getters, self.names))
        if not (all(map(_same, objects, self.objects)) and all(map(_same, values, self.values))):
            return None
        return dataclasses.replace(self, objects=objects, values=values)

    def tensors(self) -> Iterator[torch.Tensor]:
        """The parameters and buffers read (each once)."""
        seen: set[int] = set()
        for t in (*self.objects, *self.values):
            if isinstance(t, torch.Tensor) and id(t) not in seen:
                seen.add(id(t))
                yield t


def module_state(module: torch.nn.Module, script: torch.jit.ScriptModule) -> ModuleState:
    """The state of `module` that `script` (scripted from it, or `module` itself) reads in
    its forward: see the module docstring. Raises ValueError where the code reads an object
    that is not a module's attribute (then nothing can guard it)."""
    graph = script.forward.graph.copy()
    torch._C._jit_pass_inline(graph)
    owners: dict[Any, tuple[Any, Any]] = {next(graph.inputs()): (module, script)}
    entries: dict[tuple[int, str], tuple[Any, str, Any]] = {}
    getters: dict[tuple[int, str], tuple[Any, str, Any]] = {}
    sized: dict[int, dict[str, Any]] = {}
    training = [False]

    def reached(py: Any, sm: Any) -> None:
        if isinstance(py, torch.jit.ScriptModule):
            return  # its constants are its own: nothing in Python can change them
        if isinstance(py, _CONTAINERS):  # (what TorchScript iterates, and takes `len` of)
            sized[id(py._modules)] = py._modules
        words = _words_of_compiled_methods(type(py), tuple(sm._c._method_names()))
        for name in sm._concrete_type.get_constants():
            if name in py.__dict__ and (words is None or name in words):
                entries[id(py.__dict__), name] = (py.__dict__, name, py.__dict__[name])

    def read(py: Any, name: str) -> Any:
        """Record that the code reads `name` of Python module `py`; its value."""
        if isinstance(py, torch.jit.ScriptModule):
            value = py._c.getattr(name)
            if not isinstance(value, torch._C.ScriptObject):  # (a submodule: a new wrapper)
                getters[id(py), name] = (py._c.getattr, name, value)
            return value
        for d in (py._parameters, py._buffers, py._modules, py.__dict__):
            if name in d:
                entries[id(d), name] = (d, name, d[name])
                return d[name]
        raise ValueError(f"{type(py).__name__}.{name} is not in the module's dicts")

    def visit(block: Any) -> None:
        for node in block.nodes():
            if node.kind() == "prim::GetAttr":
                owner = owners.get(node.input())
                if owner is None:
                    raise ValueError("the code reads an attribute of a value not a module's")
                py, sm = owner
                name = node.s("name")
                value = read(py, name)
                if name == "training" and value is True:
                    training[0] = True
                if isinstance(node.output().type(), torch._C.ClassType):
                    child = getattr(sm, name)
                    if isinstance(py, torch.jit.ScriptModule):
                        value = child
                    if not isinstance(value, torch.nn.Module):
                        raise ValueError(f"{name} is not a module")
                    owners[node.output()] = (value, child)
                    reached(value, child)
            for inner in node.blocks():
                visit(inner)

    reached(module, script)
    visit(graph)
    flat = list(entries.values())
    via = list(getters.values())
    return ModuleState(
        dicts=tuple(d for d, _, _ in flat), keys=tuple(k for _, k, _ in flat),
        objects=tuple(o for _, _, o in flat),
        getters=tuple(g for g, _, _ in via), names=tuple(k for _, k, _ in via),
        values=tuple(v for _, _, v in via),
        sized=tuple(sized.values()), sizes=tuple(len(d) for d in sized.values()),
        training=training[0])


@functools.cache
def _words_of_compiled_methods(cls: type, methods: tuple[str, ...]) -> frozenset[str] | None:
    """The identifiers in the source of `cls`'s methods that TorchScript compiled, or None
    if one's source cannot be read: a constant none of them names (Linear's `in_features`)
    is baked into no code, so no check per call need read it."""
    words: set[str] = set()
    for name in methods:
        fn = getattr(cls, name, None)
        try:
            words.update(re.findall(r"\w+", inspect.getsource(fn)))
        except (OSError, TypeError):
            return None
    return frozenset(words)


T = TypeVar("T")


class Kept(Generic[T]):
    """Specializations by module state, most recent first, at most `limit`: `find` gives the
    one whose state the module is in now. `state(item)` is an item's state check: its
    `fresh()`, and `rebound()` to take an equal state's new objects."""

    def __init__(self, limit: int, state: Callable[[T], Any],
                 rebind: Callable[[T, Any], T]):
        self.limit = limit
        self._state = state
        self._rebind = rebind
        self.items: list[T] = []

    def find(self) -> T | None:
        for k, item in enumerate(self.items):
            state = self._state(item)
            if not state.fresh():
                state = state.rebound()
                if state is None:
                    continue
                item = self._rebind(item, state)
            del self.items[k]
            self.items.insert(0, item)
            return item
        return None

    def add(self, item: T) -> list[T]:
        """Keep `item` first; the items no longer kept."""
        self.items.insert(0, item)
        dropped = self.items[self.limit:]
        del self.items[self.limit:]
        return dropped
