"""oracle: one fuzz case, a random elementwise TorchScript program, nncfuse against eager.

    python -m nncfuse.fuzz -n 10000 [--seed S] [--backend llvm|interp|both] [-j JOBS]
    python -m nncfuse.fuzz --replay SEED [--minimize]

`program.generate(seed)` makes a case: a program of 1-12 elementwise
ops (`op_specs`) over random dtypes, shapes, broadcasts, layouts and numbers
(`inputs`), and two input sets of the same types. `check_case` runs the
program as plain Python (eager PyTorch, the reference) and through
`nncfuse.jit` with each backend, calling it on set A (profiling), set A
again (the optimized graph) and set B (the optimized graph, other values),
and checks each call: outputs as `torch.testing.assert_close(...,
equal_nan=True)` with its default tolerances; each input's whole storage as
eager leaves it (programs write into inputs and slices of them: every call
gets fresh copies; what the program does not write must not change); where
eager raises, nncfuse raises too.

What counts:

- skipped: eager raises on set A. The program is dropped without running
  nncfuse: there is nothing to compare but two error messages, and the
  generator redraws most such programs anyway. Where eager raises only on
  set B (an integer division by zero, say), nncfuse must raise too, on the
  optimized path: that is compared.
- mismatch: an output differs, an input was modified, or nncfuse returned
  where eager raised. Two kinds of difference are not nncfuse's and are
  counted apart: `unstable`, where eager itself, its approximate ops
  (`OpSpec.approx`) perturbed by a couple of ulps and the zeros of its
  min/max-like ops (`OpSpec.zero_sign`) of either sign, reaches nncfuse's value
  at every differing element (the program amplifies last-bit noise there);
  and `torchscript`, where the unfused ScriptFunction already differs from
  eager.
- crash: nncfuse raised where eager did not (or the worker died or hung).
- kernel error: a fusion group failed to compile for a reason other than a
  `LoweringError` and ran unfused (correct, but a bug); reported, not fatal.

The command line runs cases in worker processes, so a kernel that crashes
the process (SIGSEGV, SIGFPE) is a counted crash and the run goes on.
"""

from __future__ import annotations

import random
import traceback
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch

import nncfuse
from nncfuse.tensorexpr.lowerings import LoweringError

from . import gradients, resize, state
from .inputs import clone_input, describe, storage_of
from .program import Case, generate

BACKENDS = ("llvm", "interp")
CALLS = (0, 0, 1)  # input set per call: profile on A, run A optimized, then B
CALL_NAMES = ("A (profiling)", "A (optimized)", "B (optimized)")
#: assert_close's default (rtol, atol) per float dtype, as documented.
TOLERANCES = {
    torch.float16: (1e-3, 1e-5),
    torch.bfloat16: (1.6e-2, 1e-5),
    torch.float32: (1.3e-6, 1e-5),
    torch.float64: (1e-7, 1e-7),
}
#: (rtol, atol) against eager autocast: a bf16 ulp is 2^-8, and a GEMM's result that is
#: rounded before its epilogue in one and after it in the other differs by one
AUTOCAST_TOLERANCE = (3e-2, 3e-2)
NUDGE_TRIALS = 16  # nudged eager runs per round, and rounds at most (see `_is_noise`)
NUDGE_ROUNDS = 6


@dataclass
class Failure:
    backend: str
    kind: str  # mismatch, crash, unstable, torchscript
    call: int
    message: str


@dataclass
class Outcome:
    """What checking one case found."""

    status: str = "ok"  # ok, skipped, mismatch, crash, invalid
    fused: bool = False
    raises: bool = False  # eager raised on set B, so nncfuse had to
    failures: list[Failure] = field(default_factory=list)
    kernel_errors: list[str] = field(default_factory=list)
    fused_kinds: set[str] = field(default_factory=set)

    @property
    def noise(self) -> list[Failure]:
        return [f for f in self.failures if f.kind in ("unstable", "torchscript")]


class _Raised:
    """Eager's answer when it raised."""

    def __init__(self, error: BaseException):
        self.error = error

    def __repr__(self) -> str:
        return f"raised {type(self.error).__name__}: {self.error}"


def _as_tuple(out: Any) -> tuple[Any, ...]:
    return out if isinstance(out, tuple) else (out,)


def _fresh(args: Sequence[Any]) -> list[Any]:
    """Copies of the tensor inputs, storage and layout included: programs write into them."""
    return [clone_input(a) if isinstance(a, torch.Tensor) else a for a in args]


def _quiet_call(fn: Any, args: Sequence[Any], written: list[Any] | None = None) -> Any:
    """`fn` on copies of `args` (its outputs, or _Raised); the copies, as the call left
    them, are appended to `written`."""
    args = _fresh(args)
    if written is not None:
        written += args
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return _as_tuple(fn(*args))
        except Exception as e:  # noqa: BLE001 - an answer like any other
            return _Raised(e)


def compare(got: Any, want: Any) -> str:
    """'' if `got` matches eager's `want` (tuples of outputs), else what differs."""
    if isinstance(want, _Raised):
        return "" if isinstance(got, _Raised) else f"eager {want}, nncfuse returned"
    if isinstance(got, _Raised):
        return f"nncfuse {got}"
    if len(got) != len(want):
        return f"{len(got)} outputs, eager has {len(want)}"
    for k, (g, w) in enumerate(zip(got, want)):
        try:
            torch.testing.assert_close(g, w, equal_nan=True)
        except AssertionError as e:
            return f"output {k}: " + " ".join(str(e).split())
    return ""


def _close(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Elementwise: whether `a` and `b` agree as assert_close would judge each element."""
    if b.dtype in TOLERANCES:
        rtol, atol = TOLERANCES[b.dtype]
        return torch.isclose(a.double(), b.double(), rtol=rtol, atol=atol, equal_nan=True)
    return a == b


class Nudger:
    """Perturbs float tensors as much as two implementations of an approximate op may differ.

    The error model: a couple of ulps of the computation type (float32 for
    float16/bfloat16) relative to the value; in half the calls never less
    than ulps of 1.0, since functions computed by formula lose accuracy
    where terms cancel (gelu's `1 + erf(x)` for negative x, lgamma near its
    zeros). Reduced-precision results may also round to the neighbouring
    value. Non-finite values stay. A sum's noise scales with `terms`, the sum
    of its terms' magnitudes (`OpSpec.magnitude`), where that is larger.
    """

    def __init__(self, seed: int = 0):
        self.gen = torch.Generator().manual_seed(seed)

    def __call__(self, t: Any, terms: Any = None) -> Any:
        if not isinstance(t, torch.Tensor) or not t.is_floating_point() or t.numel() == 0:
            return t
        wide = t.double()
        compute = torch.float64 if t.dtype == torch.float64 else torch.float32
        magnitude = wide.abs() if terms is None else torch.fmax(wide.abs(), terms.double())
        if torch.rand((), generator=self.gen) < 0.5:  # half the calls: the absolute floor too
            magnitude = magnitude.clamp(min=1.0)
        scale = torch.finfo(compute).eps * magnitude
        noise = (torch.rand(t.shape, generator=self.gen, dtype=torch.float64) * 4 - 2) * scale
        out = (wide + noise).to(t.dtype)
        if t.dtype in (torch.float16, torch.bfloat16):
            step = torch.randint(-1, 2, t.shape, generator=self.gen)
            up = torch.full_like(t, float("inf"))
            out = torch.where(step > 0, torch.nextafter(out, up), out)
            out = torch.where(step < 0, torch.nextafter(out, -up), out)
        return torch.where(torch.isfinite(t), out, t)

    def zeros(self, t: Any) -> Any:
        """`t` with the sign of each zero flipped at random."""
        if not isinstance(t, torch.Tensor) or not t.is_floating_point() or t.numel() == 0:
            return t
        flip = (t == 0) & (torch.rand(t.shape, generator=self.gen) < 0.5)
        return torch.where(flip, -t, t)


class _Spread:
    """Per element of one output: the range of values eager takes under noise, and NaNs."""

    def __init__(self, want: torch.Tensor):
        self.lo = self.hi = want.double()
        self.nan = want.isnan() if want.is_floating_point() else torch.zeros_like(want, dtype=bool)

    def add(self, value: torch.Tensor) -> None:
        value = value.double()
        self.lo, self.hi = torch.fmin(self.lo, value), torch.fmax(self.hi, value)
        self.nan = self.nan | value.isnan()

    def covers(self, got: torch.Tensor, want: torch.Tensor) -> torch.Tensor:
        """Where `got` lies within the spread (widened by the comparison's tolerance)."""
        rtol, atol = TOLERANCES.get(want.dtype, (0.0, 0.0))
        got = got.double()
        slack = torch.where(got.isfinite(), atol + rtol * got.abs(), 0.0)
        inside = (got >= self.lo - slack) & (got <= self.hi + slack)  # inf - 0 is inf
        return inside | (got.isnan() & self.nan)


def _storages(args: Sequence[Any]) -> tuple[torch.Tensor, ...]:
    return tuple(storage_of(a) for a in args if isinstance(a, torch.Tensor))


def _is_noise(case: Case, k: int, got: Any, want: Any, with_inputs: bool = False) -> bool:
    """Whether eager, its approximate ops nudged (`Nudger`), reaches each value nncfuse gave.

    Nudged runs come in rounds, until nncfuse's values are all reached or
    `NUDGE_ROUNDS` rounds are over: chaotic programs (tan of huge values,
    remainders by tiny divisors) need many samples to reach a given value.
    Only mismatches pay for this.
    """
    if isinstance(got, _Raised) or isinstance(want, _Raised) or len(got) != len(want):
        return False
    if any(not isinstance(g, torch.Tensor) or (g.dtype, g.shape) != (w.dtype, w.shape)
           for g, w in zip(got, want)):
        return False
    wrong = [~_close(g, w) for g, w in zip(got, want)]
    spreads = [_Spread(w) for w in want]
    nudged = case.program.eager(Nudger(k))
    for _ in range(NUDGE_ROUNDS):
        for _ in range(NUDGE_TRIALS):
            written: list[Any] = []
            out = _quiet_call(nudged, case.inputs[k], written)
            if with_inputs and not isinstance(out, _Raised):  # and the inputs' storage
                out = (*out, *_storages(written))
            if not isinstance(out, _Raised):
                for spread, o in zip(spreads, out):
                    spread.add(o)
        if all(bool((x & ~spread.covers(g, w)).sum() == 0)
               for spread, g, w, x in zip(spreads, got, want, wrong)):
            return True
    return False


def _kernel_errors(fused: Any) -> list[str]:
    """Groups that failed to compile for a reason other than a LoweringError (the guard runs
    them unfused by design, so only its record shows them)."""
    errors = []
    for failure in fused.compile_failures:
        if isinstance(failure.error, LoweringError):
            continue
        where = traceback.extract_tb(failure.error.__traceback__)[-1]
        at = f"{where.filename.rsplit('/', 1)[-1]}:{where.lineno}"
        errors.append(f"{type(failure.error).__name__} at {at}: "
                      + str(failure.error).split("\n")[0][:200])
    return errors


def _same_storage(now: Any, want: Any) -> bool:
    """Whether an input's whole storage (elements its layout skips included) is as eager left
    it: the same where the program writes nothing, close (NaNs equal) where it writes."""
    if not isinstance(now, torch.Tensor):
        return True
    try:
        torch.testing.assert_close(storage_of(now), storage_of(want), equal_nan=True)
    except AssertionError:
        return False
    return True


def _classify(case: Case, k: int, script: Any, got: Any, want: Any) -> str:
    """mismatch, or: torchscript (nncfuse agrees with the unfused script, which differs from
    eager), or unstable (eager's own last-ulp noise explains the difference)."""
    scripted = _quiet_call(script, case.inputs[k])
    if compare(scripted, want) and not compare(got, scripted):
        return "torchscript"
    if _is_noise(case, k, got, want):
        return "unstable"
    return "mismatch"


def _fused_kinds(graph: Any) -> set[str]:
    groups = nncfuse.fusion_groups(graph) if graph is not None else []
    return {n.kind() for g in groups for n in g.g("Subgraph").nodes()
            if n.kind() != "prim::Constant"}


def _run_backend(case: Case, backend: str, script: Any, wants: list[Any], out: Outcome,
                 after: list[list[Any]]) -> None:
    fused = nncfuse.jit(script, use_llvm=backend == "llvm", min_group_size=case.min_group_size)
    for call, k in enumerate(CALLS):
        args = _fresh(case.inputs[k])
        pointers = [a.data_ptr() if isinstance(a, torch.Tensor) else None for a in args]
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                got = _as_tuple(fused(*args))
            out.kernel_errors += [str(w.message)[:300] for w in caught
                                  if "nncfuse" in str(w.message)]
        except Exception as e:  # noqa: BLE001
            got = _Raised(e)
            if not isinstance(wants[k], _Raised):
                tb = traceback.format_exception(e)
                out.failures.append(Failure(backend, "crash", call, "".join(tb[-3:]).strip()))
                return
        message = compare(got, wants[k])
        kind = _classify(case, k, script, got, wants[k]) if message else ""
        modified = [p.name for p, now, want in zip(case.program.params, args, after[k])
                    if not _same_storage(now, want)]
        moved = [p.name for p, a, ptr in zip(case.program.params, args, pointers)
                 if isinstance(a, torch.Tensor) and a.data_ptr() != ptr]
        if (modified or moved) and not isinstance(wants[k], _Raised):
            message = f"inputs differ from eager's after the call: {modified + moved}; {message}"
            noise = not moved and not isinstance(got, _Raised) and _is_noise(
                case, k, (*got, *_storages(args)), (*wants[k], *_storages(after[k])), True)
            kind = "unstable" if noise else "mismatch"
        if message:
            out.failures.append(Failure(backend, kind, call, message))
            return
    out.kernel_errors += _kernel_errors(fused)
    try:
        out.fused_kinds |= _fused_kinds(fused.graph_for(*case.inputs[0]))
    except Exception as e:  # noqa: BLE001
        out.failures.append(Failure(backend, "crash", 0, f"graph_for raised {e!r}"))


def check_sizes(case: Case, script: Any, out: Outcome) -> None:
    """Call one dynamic `nncfuse.jit` of `script` on set A and on `resized` sets; record
    failures in `out` (backend "sizes")."""
    rng = random.Random(case.seed)
    gen = torch.Generator().manual_seed(case.seed or 0)
    try:
        sets = [case.inputs[0], *resize.resized(case, rng, gen)]
    except Exception:  # noqa: BLE001 - a layout that does not fit the new sizes: skip
        return
    eager = case.program.eager()
    fused = nncfuse.jit(script, min_group_size=case.min_group_size, dynamic=True)
    for inputs in sets:
        after: list[Any] = []
        want = _quiet_call(eager, inputs, after)
        args = _fresh(inputs)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                got = _as_tuple(fused(*args))
        except Exception as e:  # noqa: BLE001
            got = _Raised(e)
            if not isinstance(want, _Raised):
                where = resize.describe_sizes(inputs)
                out.failures.append(Failure("sizes", "crash", 2,
                                            f"{where}: {type(e).__name__}: {e}"))
                return
        message = compare(got, want)
        if message:
            sized = replace(case, inputs=(case.inputs[0], inputs))
            kind = _classify(sized, 1, script, got, want)
            where = resize.describe_sizes(inputs)
            out.failures.append(Failure("sizes", kind, 2, f"{where}: {message}"))
            return


def check_gradients(case: Case, script: Any, out: Outcome) -> None:
    """The case's input gradients through `nncfuse.jit` against eager autograd's
    (`gradients`); a failure in `out` (backend "grad") where a call's differ or raise."""
    fused = nncfuse.jit(script, min_group_size=case.min_group_size)
    try:
        kind, call, message = gradients.check(case.program.eager(), script, case.inputs,
                                              case.seed or 0, fused)
    except gradients.Skip:
        return
    if kind:
        out.failures.append(Failure("grad", kind, call, message))


def check_state(case: Case, out: Outcome, backend: str = "state") -> None:
    """The case's seed as a module whose state changes between calls (`state`), with calls
    under autocast for backend "autocast"; a failure in `out` where a call differs from
    eager's or raises."""
    amp = compare_autocast if backend == "autocast" else None
    try:
        message = state.check(case.seed or 0, nncfuse.jit, compare, autocast=amp)
    except Exception as e:  # noqa: BLE001 - nncfuse raised (eager does not here)
        out.failures.append(Failure(backend, "crash", 2, f"{type(e).__name__}: {e}"))
        return
    if message:
        out.failures.append(Failure(backend, "mismatch", 2, message))


def compare_autocast(got: Any, want: Any) -> str:
    """'' if `got` matches eager autocast's `want` (dtypes equal, values within
    `AUTOCAST_TOLERANCE`), else what differs."""
    if len(got) != len(want):
        return f"{len(got)} outputs, eager has {len(want)}"
    rtol, atol = AUTOCAST_TOLERANCE
    for k, (g, w) in enumerate(zip(got, want)):
        try:
            torch.testing.assert_close(g, w, rtol=rtol, atol=atol, equal_nan=True)
        except AssertionError as e:
            return f"output {k}: " + " ".join(str(e).split())
    return ""


def check_case(case: Case, backends: Sequence[str] = BACKENDS) -> Outcome:
    """Run `case` eagerly and through nncfuse with each backend; see the module docstring."""
    out = Outcome()
    eager = case.program.eager()
    after: list[list[Any]] = [[], []]  # the inputs as eager left them, per input set
    wants = [_quiet_call(eager, inputs, after[k]) for k, inputs in enumerate(case.inputs)]
    if isinstance(wants[0], _Raised):
        out.status = "skipped"
        return out
    out.raises = isinstance(wants[-1], _Raised)
    try:
        script = case.program.script()
    except Exception as e:  # noqa: BLE001 - the generator wrote a program TorchScript rejects
        out.status = "invalid"
        out.failures.append(Failure("torchscript", "invalid", 0, f"{type(e).__name__}: {e}"))
        return out
    for backend in backends:
        if backend == "sizes":  # the same dynamic kernels at other sizes (`resize`)
            check_sizes(case, script, out)
        elif backend in ("state", "autocast"):  # a module changed between calls (`state`)
            check_state(case, out, backend)
        elif backend == "grad":  # input gradients against eager autograd's (`gradients`)
            check_gradients(case, script, out)
        else:
            _run_backend(case, backend, script, wants, out, after)
    out.fused = bool(out.fused_kinds)
    kinds = {f.kind for f in out.failures}
    out.status = "crash" if "crash" in kinds else "mismatch" if "mismatch" in kinds else "ok"
    return out


def report(case: Case, outcome: Outcome) -> str:
    """A failure report: seed, source, inputs, and what differed on which backend."""
    rows = [f"=== nncfuse fuzz: {outcome.status} (seed {case.seed}) ==="]
    if case.seed is not None:
        rows.append(f"replay: python -m nncfuse.fuzz --replay {case.seed} [--minimize]")
    rows += [case.program.source().rstrip(), f"min_group_size={case.min_group_size}", "inputs:"]
    for k, name in enumerate("AB"):
        for param, value in zip(case.program.params, case.inputs[k]):
            rows.append(f"  [{name}] {describe(param.name, value, param.spec)}")
    for f in outcome.failures:
        rows.append(f"{f.backend}: {f.kind} at call {CALL_NAMES[f.call]}: {f.message}")
    rows += [f"kernel error: {e}" for e in outcome.kernel_errors]
    return "\n".join(rows)


def check_seed(seed: int, backends: Sequence[str] = BACKENDS) -> tuple[Case, Outcome]:
    case = generate(seed)
    return case, check_case(case, backends)
