"""FusedFunction: what `nncfuse.jit` returns. It binds a call's arguments and runs its plan.

The wrapper's part is Python's: bind positional and keyword arguments and
defaults (`_bind`), and pick the scripted form of the function that takes
them (a ScriptFunction or module has one; a plain Python function gets one
per pattern of argument types, `scripting.py`). Which plan runs a call's
signature, and when signatures are profiled, optimized or left unfused, is
the policy's part (`policy.py`); this class hands it each call it has no
plan for.

The common call, all arguments by position with a plan for their
signature, is one dict lookup and the plan's `run`: nothing else on the way
to the kernel. Calls from many threads are safe: that lookup takes no lock,
and the policy and the scripting of variants lock what they change.

A Python `nn.Module` is scripted per state (`module_state.py`): its plans are
specialized on the training flags, parameters, buffers, submodules and
attributes its scripted code read, and each call checks first that they hold
(identities, 25-60 ns each):

    call ──▶ the module holds what its scripted copy read?
             ├─ yes ──▶ that state's plans (the fast path)
             └─ no  ──▶ a kept state it is in again (train/eval flipped back), else script
                        it anew: new plans, within the function's `max_specializations`;
                        past them, the module runs eagerly

A ScriptModule needs none of this: its code reads its attributes when it runs
(`sm.eval()` is seen), and its constants cannot change. A traced module
recorded the ops of one mode: `eval()` after tracing does not change them, as
in TorchScript.
"""

from __future__ import annotations

import dataclasses
import functools
import warnings
from typing import Any

import torch

from ... import log
from ...config import Options
from ..fuser.guard import CompileFailure
from ..specialize import scripting
from ..specialize.module_state import Kept, ModuleState, module_state
from ..specialize.policy import BIG_INT, Budget, Policy, Program, program, signature
from ..training import autodiff, autograd

_log = log.get_logger(__file__)
_MISSING = object()  # a parameter without a default; a variant not scripted yet
_KEPT_STATES = 4  # a module's states whose plans are kept (train and eval, grad or not)
#: how TorchScript's interpreter wraps an exception of the ops it runs (its type lost)
_INTERPRETER = "The following operation failed in the TorchScript interpreter"
_SCRIPTED = (torch.jit.ScriptFunction, torch.jit.ScriptModule)  # TorchScript's errors are theirs


@dataclasses.dataclass(frozen=True)
class _Variant:
    """One scripted form of the function: the program the policy specializes, and the
    parameters that arguments bind to."""

    program: Program  # the ScriptFunction (or module's forward) and its prepared graph
    parameters: list[Any]  # the schema's arguments after `self`
    defaults: list[tuple[str, Any]]  # (name, default or _MISSING) of each, for `_bind`


def _variant(script: Any, receiver: Any, module: torch.nn.Module | None = None) -> _Variant:
    """`script`'s scripted form; `module`: the Python module whose state each call checks."""
    parameters = script.schema.arguments[1 if receiver is not None else 0 :]
    defaults = [(a.name, a.default_value if a.has_default_value() else _MISSING)
                for a in parameters]
    return _Variant(program(script.graph, script, receiver, module), parameters, defaults)


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


def _name(fn: Any) -> str:
    """`fn` in a word for a message: a module's class, a function's qualified name (a module's
    repr would be all its layers)."""
    if isinstance(fn, torch.nn.Module):
        return getattr(fn, "original_name", None) or type(fn).__qualname__  # (a script's)
    return getattr(fn, "__qualname__", None) or getattr(fn, "qualified_name", None) or type(
        fn).__qualname__


def _first_line(error: Exception, limit: int = 160) -> str:
    """The first line of `error`'s message, trimmed: TorchScript's reason, without the
    source excerpt that follows it."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    line = (lines[0] if lines else type(error).__name__).rstrip(":")
    return line if len(line) <= limit else line[: limit - 3] + "..."


@dataclasses.dataclass
class _State:
    """The plans of one state of a module (of a function: its only one): its scripted variants
    and the policy that specializes them. `module` is None where nothing is guarded."""

    module: ModuleState | None
    policy: Policy
    variants: dict[scripting.Pattern, _Variant | None]


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
        self._budget = Budget()  # shared by the policies of a module's states
        #: a Python module's state is guarded (`_check`); a ScriptModule reads its own
        self._stateful = isinstance(fn, torch.nn.Module) and not isinstance(
            fn, torch.jit.ScriptModule)
        self._states: Kept[_State] = Kept(_KEPT_STATES, lambda s: s.module,
                                          lambda s, m: dataclasses.replace(s, module=m))
        self._failures: list[CompileFailure] = []  # of the states no longer kept
        self._eager = False  # past the bound of module states: run the module itself
        self._made_states = 0
        self._use(_State(None, Policy(options, self._budget), {}))
        self._last: _Variant | None = None
        self._params: list[tuple[str, Any]] | None = None  # a plain function's, with variants
        self._arity = -1  # number of arguments once known: enables the fast path
        if not isinstance(fn, (torch.nn.Module, torch.jit.ScriptFunction)):
            params = scripting.parameters(fn)
            if params is not None:
                self._params = [(p.name, _MISSING if p.default is p.empty else p.default)
                                for p in params]
                self._arity = len(params)
        if callable(fn) and not isinstance(fn, torch.nn.Module):
            functools.update_wrapper(self, fn, updated=())

    @property
    def compile_failures(self) -> list[CompileFailure]:
        """Groups that failed to lower or compile (they run unfused), for tools and tests."""
        kept = [f for s in self._states.items if s is not self._state
                for f in s.policy.compile_failures]
        return [*self._failures, *kept, *self.policy.compile_failures]

    @property
    def states(self) -> int:
        """The module states specialized so far (1 for a function), for tools and tests."""
        return max(1, self._made_states)

    # -- module state ------------------------------------------------------------------
    def _use(self, state: _State) -> None:
        """Make `state` the current one: its plans and its check for the fast path."""
        self._state = state
        #: which plan runs each signature; shared by all the scripted variants
        self.policy = state.policy
        self._variants = state.variants
        self._last = next((v for v in state.variants.values() if v is not None), None)
        self._check = None if state.module is None else state.module.fresh
        self._plans = self.policy.plans  # the same dict, one attribute away for the fast path

    def _sync(self) -> None:
        """If the module left the state its plans were made for: a kept state it is in, or a
        new one (scripted by `_script`), or past the bound, none (eager)."""
        state = self._state.module
        if state is None or state.fresh():
            return
        with scripting.compile_lock:
            if self._state.module is None or self._state.module.fresh():
                return  # another thread switched already
            kept = self._states.find()
            if kept is not None:
                _log.update("The module is in a state seen before: its plans")
                self._use(kept)
                return
            _log.update("The module's state changed (a training flag, a parameter, a "
                        "submodule or an attribute its code reads): scripting it anew")
            self._use(_State(None, Policy(self.options, self._budget), {}))

    # -- set-up -------------------------------------------------------------------
    def _prepare(self, types: scripting.Pattern = ()) -> _Variant | None:
        """The scripted form for argument types `types` (plain functions), or None if none."""
        if self._stateful:
            self._sync()
        variant = self._variants.get(types, _MISSING)
        if variant is _MISSING:
            # Under TorchScript's compiler lock: it scripts each pattern once, whatever
            # the threads, and `catch_warnings` changes process-wide state.
            with scripting.compile_lock, warnings.catch_warnings():
                # torch.jit.script/trace warn that TorchScript is deprecated; that is our substrate.
                warnings.filterwarnings("ignore", category=DeprecationWarning, module="torch.jit")
                if types not in self._variants:
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
            if self._stateful:
                return self._script_state()
            if isinstance(fn, torch.jit.ScriptModule):
                return _variant(fn.forward, fn._c)
            if isinstance(fn, torch.jit.ScriptFunction):
                return _variant(fn, None)
            if self._params is None:
                return _variant(torch.jit.script(fn), None)
            return _variant(scripting.script(fn, types), None)
        except Exception as e:  # noqa: BLE001
            warnings.warn(f"nncfuse: cannot script {_name(self.target)} (TorchScript: "
                          f"{_first_line(e)}), running it unfused", stacklevel=4)
            return None

    def _script_state(self) -> _Variant | None:
        """The module scripted in its current state, which becomes the current state's, and is
        kept; None (eager calls from then on) past the bound of states."""
        if self._made_states >= max(self.options.max_specializations, 1):
            _log.update("Too many module states; running the module eagerly")
            self._eager = True
            return None
        script = torch.jit.script(self.target)
        self._state.module = module_state(self.target, script)
        self._check = self._state.module.fresh
        self._made_states += 1
        for dropped in self._states.add(self._state):
            self._failures += dropped.policy.compile_failures
        return _variant(script.forward, script._c, self.target)

    @property
    def graph(self) -> torch._C.Graph | None:
        """The graph nncfuse starts from (inlined, in-place ops removed), of the last call's
        argument types; before any call, of the declared ones."""
        variant = self._last or self._prepare()
        return None if variant is None else variant.program.graph

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
        try:
            # The common case first and in few steps: all arguments given, the module (if
            # one) in the state its plans were made for, a plan exists.
            if not kwargs and len(args) == self._arity:
                check = self._check
                if check is None or check():
                    plan = self._plans.get(signature(args))
                    if plan is not None:
                        return plan.run(args)
            return self._call(args, kwargs)
        except (RuntimeError, torch.jit.Error) as e:
            if _INTERPRETER not in str(e) or isinstance(self.target, _SCRIPTED) or any(
                    v is not None and v.program.writes for v in self._variants.values()):
                raise
            # TorchScript's interpreter raises what eager raised as a RuntimeError (an
            # IndexError), and what scripted code raises (a module's shape check's
            # ValueError) as a `torch.jit.Error`: eager's own exception, of eager's type,
            # from eager.
            # (Not for a program that writes in place: the failed call may have written.)
            return self.target(*args, **kwargs)

    def _call(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if self.options.disable or self._eager:
            return self.target(*args, **kwargs)
        values = self._bind_args(args, kwargs)
        if values is None:
            return self.target(*args, **kwargs)  # Python or TorchScript reports the error
        key = signature(values)
        plan = self._plans.get(key)
        if plan is not None:
            return plan.run(values)
        # (an int no int64 holds: TorchScript's `int` cannot take it, eager may)
        variant = None if BIG_INT in key else self._variant_for(values)
        if variant is None or (variant.program.container_write is not None
                               and not isinstance(self.target, _SCRIPTED)):
            # Eager Python (or TorchScript, for a script) runs these arguments.
            return self.policy.call_unfused(self.target, key, values)
        if autograd.requires_grad(values, self.target):
            if key[1] and self.options.autograd == "aot":  # (`autocast_state`) AOTAutograd's
                # trace of the program does not keep eager autocast's dtypes where an op
                # mixes them (`AutodiffPlan._fallback`): unfused, as eager.
                return self.policy.call_unfused(self.target, key, values)
            # Fused forward and backward: TorchScript's autodiff graphs (autodiff.py), or
            # AOTAutograd's joint graph (autograd.py). Under autocast, autodiff's graphs with
            # its casts written out (the rewrite `autocast_casts`).
            prog = variant.program
            make = ((lambda: autodiff.AutodiffPlan(prog, self.options, self.target))
                    if self.options.autograd == "autodiff"
                    else (lambda: autograd.AutogradPlan(prog, self.options)))
            return self.policy.call_with(key, make, values, prog.unfused)
        return self.policy.call(variant.program, key, values)

    def graph_for(self, *args: Any, **kwargs: Any) -> torch._C.Graph | None:
        """The optimized graph that runs for these inputs (profiling and compiling if needed).

        None when they run unfused without a graph: nncfuse disabled, arguments that do not
        bind, or a function TorchScript cannot compile (its first call warned why). None is
        what a graph without fusion groups would say too: `nncfuse.fusion_groups(None)` is
        `[]`, so `fusion_groups(f.graph_for(x))` works for every function, and
        `nncfuse.explain` tells the cases apart."""
        if self.options.disable:
            return None
        values = self._bind_args(args, kwargs)
        if values is None:
            return None
        key = signature(values)
        # (an autograd plan shows its forward graph, optimized after its own profiling runs)
        for _ in range(2 * self.options.profiling_runs + 1):
            plan = self._plans.get(key)
            if plan is not None and (plan.graph is not None or not isinstance(
                    plan, (autograd.AutogradPlan, autodiff.AutodiffPlan))):
                break
            self(*args, **kwargs)
        return self.policy.graph_of(self._plans[key])  # a dynamic plan's symbols as `*`
