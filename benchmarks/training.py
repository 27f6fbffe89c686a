"""Training steps, side by side: eager, torch.compile (Inductor), the nncfuse backend and
`nncfuse.jit`. A step is forward, loss, backward and an SGD step.

    python benchmarks/training.py --clock cpu              # the MLP and the transformer block
    python benchmarks/training.py --models bert,gpt2       # also models.py's (transformers)
    python benchmarks/training.py --quick                  # smoke run: small shapes, few rounds
    python benchmarks/training.py --phases                 # also where each step's time goes
    python benchmarks/training.py --dtype bfloat16 --models bert,resnet   # under autocast

Workloads: an MLP with GELU (`MLP`), a pre-norm transformer block (`Block`: layer norm,
attention with softmax, GELU MLP, residuals), and with `--models` the models of
`benchmarks/models.py` in training mode with every dropout probability 0 (so that results
compare). Contenders, each on its own copy of the same initial weights:

- eager:           the module itself;
- compile:         `torch.compile(module)` (Inductor, default mode);
- nncfuse-backend: `torch.compile(module, backend="nncfuse")` (AOTAutograd's forward and
                   backward graphs through nncfuse);
- nncfuse-jit:     `nncfuse.jit(module)` (scripted; models.py's models traced), whose
                   parameters require grad: TorchScript's autodiff graphs with fused
                   forwards and backwards (jit/training/autodiff.py); its first call profiles
                   and its graphs' first calls profile again: compare with `--first-steps 3`, the
                   time to its steady state;
- aot-eager:       (only when named in `--contenders`) `torch.compile(module,
                   backend="aot_eager")`: Dynamo's and AOTAutograd's traces and partition and
                   no compiler, so its first step is the floor under the first step of any
                   compiler behind AOTAutograd (Inductor's, the nncfuse backend's);
- nncfuse-jit-aot: (only when named) `nncfuse.jit(module, autograd="aot")`: AOTAutograd's
                   joint graph on the scripted program, partitioned (jit/training/autograd.py);
- nncfuse-jit-autodiff: (only when named) `nncfuse.jit(module, autograd="autodiff")`, the
                   default spelled out (for runs under NNCFUSE_AUTOGRAD=aot).
- nncfuse-backend-autodiff: (only when named) `torch.compile(module,
                   backend=nncfuse.backend.make_backend(autograd="autodiff"))`: Dynamo's
                   graphs through TorchScript's autodiff as nncfuse-jit's, no AOTAutograd
                   trace.

Before timing, each contender's first step is timed alone (wall clock, from the build: Dynamo,
AOTAutograd, TorchScript's script or trace, the compilers, profiling runs; Inductor's cache is
a fresh directory unless `--inductor-cache warm`), and its parameters' gradients after that
step are compared with eager's (rtol 1e-3, atol 1e-4 times the largest gradient); where they
differ by more, with float64 eager's (`exact_gradients`): each parameter's gradient may be at
most `MULTIPLIER` times as far from it (root mean square) as float32 eager's own is, the rule
of `torch._dynamo.utils.same(fp64_ref=...)`, what PyTorch's benchmarks check compilers by (a
deep CNN's batch norms in training mode amplify rounding: MobileNetV2's first layers' gradients
from eager, Inductor and nncfuse differ by up to 1% of the largest gradient, and float32
eager's are about as far from float64 eager's as nncfuse's). An nncfuse contender that differs
is reported and not timed; torch.compile, the baseline, is timed and its difference shown
(Inductor's ResNet-18 gradients: rms error 1.45e-4 against float64 eager's, float32 eager's
7.15e-8). Then steps are timed in interleaved rounds (`harness.measure`), medians. The summary
gives, per contender, the geometric mean over workloads of its step time over torch.compile's,
and of its first-step time over torch.compile's.

`--dtype bfloat16|float16`: every contender's whole step but the optimizer (forward, loss,
`loss.backward()`) runs under `torch.autocast("cpu", dtype=...)`, as users write it. Gradients
then differ from eager autocast's by its rounding (a bfloat16 ulp is 0.4%): where they differ
by more than the tolerances above, they are compared with float64 eager's, each parameter's at
most `MULTIPLIER` times as far (root mean square) as eager autocast's own, the rule above;
Inductor's distance is shown for scale.

`--overhead` then times each contender's step again with the bodies of its compiled graphs
replayed (`replayed_graphs`: nncfuse's and Inductor's graphs return their last results instead
of running): what is left is what runs around the kernels: Dynamo, AOTAutograd's or nncfuse's
autograd node, the loss, the optimizer (the same for all), and the step's time minus it is the
graphs' own (their kernels and the Python that calls them).

`--phases` then splits each contender's step into its parts (`phases`): zero_grad and the
forward, the loss, the backward, the optimizer step: CPU time of each (user and system, the
kernel's share being page faults and giving memory back), and the minor page faults per step
(glibc gives a free top of its heap back to the system; a step that then allocates again
faults those pages in anew). Medians over rounds of steps.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import gc
import importlib
import os
import resource
import statistics
import sys
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch
from harness import fmt_time, geomean, measure

import nncfuse
from nncfuse.testing import MULTIPLIER, rms

CONTENDERS = ("eager", "compile", "nncfuse-backend", "nncfuse-jit")
#: Also accepted by --contenders: Dynamo and AOTAutograd's trace and partition with no
#: compiler behind them, the first-step floor of every compiler under AOTAutograd.
REFERENCES = ("aot-eager", "nncfuse-jit-aot", "nncfuse-jit-autodiff",
              "nncfuse-backend-autodiff")
#: `nncfuse.jit`'s options per contender (nncfuse-jit: the default, autodiff)
JIT_OPTIONS = {"nncfuse-jit": {}, "nncfuse-jit-aot": {"autograd": "aot"},
               "nncfuse-jit-autodiff": {"autograd": "autodiff"}}
RTOL, ATOL = 1e-3, 1e-4
#: the dtype of `--dtype`'s autocast (None: float32, no autocast); set by `main`
AUTOCAST: torch.dtype | None = None


def autocast() -> Any:
    """The step's autocast region (`--dtype`), or none."""
    if AUTOCAST is None:
        return contextlib.nullcontext()
    return torch.autocast("cpu", dtype=AUTOCAST)


class MLP(torch.nn.Module):
    def __init__(self, width: int = 256, hidden: int = 1024):
        super().__init__()
        self.fc1 = torch.nn.Linear(width, hidden)
        self.fc2 = torch.nn.Linear(hidden, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(x)))


class Block(torch.nn.Module):
    """A pre-norm transformer block, written so that TorchScript takes it."""

    def __init__(self, width: int = 256, heads: int = 4):
        super().__init__()
        self.heads = heads
        self.norm1 = torch.nn.LayerNorm(width)
        self.qkv = torch.nn.Linear(width, 3 * width)
        self.proj = torch.nn.Linear(width, width)
        self.norm2 = torch.nn.LayerNorm(width)
        self.mlp = MLP(width, 4 * width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).chunk(3, dim=-1)
        q = q.reshape(b, s, self.heads, d // self.heads).transpose(1, 2)
        k = k.reshape(b, s, self.heads, d // self.heads).transpose(1, 2)
        v = v.reshape(b, s, self.heads, d // self.heads).transpose(1, 2)
        scores = torch.matmul(q, k.transpose(-1, -2)) * (float(d // self.heads) ** -0.5)
        attention = torch.matmul(torch.softmax(scores, dim=-1), v)
        x = x + self.proj(attention.transpose(1, 2).reshape(b, s, d))
        return self.mlp(self.norm2(x))


def workloads(quick: bool) -> dict[str, tuple[torch.nn.Module, tuple[torch.Tensor, ...]]]:
    """The built-in workloads: name -> (module, inputs)."""
    torch.manual_seed(0)
    batch, seq = (8, 16) if quick else (64, 64)
    return {
        "mlp": (MLP(), (torch.randn(batch, 256),)),
        "block": (Block(), (torch.randn(4 if not quick else 2, seq, 256),)),
    }


def model_workloads(names: list[str], quick: bool) -> dict[str, Any]:
    """models.py's models (transformers), training mode, dropout 0."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    models = importlib.import_module("models")
    out: dict[str, Any] = {}
    for spec in models.MODELS:
        if spec.name in names:
            torch.manual_seed(0)
            model, inputs = spec.build(quick)
            out[spec.name] = (without_dropout(model), inputs)
    return out


def without_dropout(model: torch.nn.Module) -> torch.nn.Module:
    """`model` in training mode with every dropout probability 0."""
    model.train()
    for m in model.modules():
        if isinstance(m, torch.nn.modules.dropout._DropoutNd):
            m.p = 0.0
        for name, value in list(vars(m).items()):
            if "dropout" in name and isinstance(value, float):
                setattr(m, name, 0.0)
        config = getattr(m, "config", None)
        for name in dir(config) if config is not None else ():
            if "dropout" in name and isinstance(getattr(config, name, None), float):
                setattr(config, name, 0.0)
    return model


def build(contender: str, model: torch.nn.Module, inputs: tuple[Any, ...]) -> Callable[..., Any]:
    if contender == "eager":
        return model
    if contender == "compile":
        return torch.compile(model)
    if contender == "aot-eager":
        return torch.compile(model, backend="aot_eager")
    if contender == "nncfuse-backend":
        importlib.import_module("nncfuse.backend")  # registers "nncfuse" (as the entry point)
        return torch.compile(model, backend="nncfuse")
    if contender == "nncfuse-backend-autodiff":
        backend = importlib.import_module("nncfuse.backend")
        return torch.compile(model, backend=backend.make_backend(autograd="autodiff"))
    options = JIT_OPTIONS[contender]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return nncfuse.jit(torch.jit.script(model), **options)
        except Exception:  # noqa: BLE001 - transformers' models: traced, as models.py does
            traced = torch.jit.trace(model, inputs, strict=False, check_trace=False)
            return nncfuse.jit(traced, **options)


def _first(out: Any) -> torch.Tensor:
    while isinstance(out, (tuple, list)):
        out = out[0]
    return out


def loss(out: Any) -> torch.Tensor:
    """The output against fixed random weights (not its mean square: after a final layer
    norm that is nearly constant, and its gradients rounding noise)."""
    out = _first(out)
    out = out if out.dtype == torch.float64 else out.float()  # float64: `exact_gradients`
    weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(0))
    return (out * weights.to(out.dtype)).mean()


PHASES = ("forward", "loss", "backward", "optimizer")


class Step:
    """One training step of `fn` (running `model`): forward, loss, backward, SGD. Calling it
    runs a step; `phased()` runs one and returns, per phase, its (user, system) CPU
    seconds and minor page faults."""

    def __init__(self, model: torch.nn.Module, fn: Callable[..., Any], inputs: tuple[Any, ...]):
        self.fn, self.inputs = fn, inputs
        self.optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)

    def __call__(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        with autocast():
            loss(self.fn(*self.inputs)).backward()
        self.optimizer.step()

    def phased(self) -> list[tuple[float, float, int]]:
        marks = [resource.getrusage(resource.RUSAGE_SELF)]
        self.optimizer.zero_grad(set_to_none=True)
        with autocast():
            out = self.fn(*self.inputs)
            marks.append(resource.getrusage(resource.RUSAGE_SELF))
            value = loss(out)
            marks.append(resource.getrusage(resource.RUSAGE_SELF))
            value.backward()
        marks.append(resource.getrusage(resource.RUSAGE_SELF))
        self.optimizer.step()
        marks.append(resource.getrusage(resource.RUSAGE_SELF))
        return [(b.ru_utime - a.ru_utime, b.ru_stime - a.ru_stime, b.ru_minflt - a.ru_minflt)
                for a, b in zip(marks, marks[1:])]


def phases(steps: dict[str, Step], rounds: int, per_round: int) -> dict[str, list[Any]]:
    """Per contender and phase (`PHASES`): the medians over `rounds` interleaved rounds of
    `per_round` steps each of the mean user and system CPU seconds and page faults per step.
    getrusage counts in ticks of the kernel's clock, hence the rounds of many steps."""
    samples: dict[str, list[list[list[float]]]] = {c: [] for c in steps}
    names = list(steps)
    gc.collect()
    enabled = gc.isenabled()
    gc.disable()  # as harness.measure: a collection is no phase's
    try:
        for r in range(rounds):
            for c in names[r % len(names):] + names[:r % len(names)]:
                total = [[0.0, 0.0, 0.0] for _ in PHASES]
                for _ in range(per_round):
                    for acc, part in zip(total, steps[c].phased()):
                        for k in range(3):
                            acc[k] += part[k] / per_round
                samples[c].append(total)
    finally:
        if enabled:
            gc.enable()
    return {c: [[statistics.median(s[p][k] for s in runs) for k in range(3)]
                for p in range(len(PHASES))] for c, runs in samples.items()}


def report_phases(name: str, result: dict[str, list[Any]]) -> None:
    print(f"\n{name}: a step's phases, per step (median of rounds; CPU user + system, faults)")
    print(f"  {'contender':<17}" + "".join(f"{p:>24}" for p in PHASES) + f"{'total':>12}")
    for c, parts in result.items():
        cells = "".join(f"{fmt_time(u):>10} +{fmt_time(s):>9} {f:>4.0f}f" for u, s, f in parts)
        total = sum(u + s for u, s, _ in parts)
        print(f"  {c:<17}{cells}{fmt_time(total):>12}")


@contextlib.contextmanager
def replayed_graphs() -> Iterator[None]:
    """Within: each compiled graph of nncfuse (`CompiledGraph`) and Inductor (`CompiledFxGraph`)
    returns its results of the first call made within (detached) instead of running again."""
    from torch._inductor.output_code import CompiledFxGraph

    from nncfuse.jit.specialize.fxgraph import CompiledGraph

    saved = {cls: cls.__call__ for cls in (CompiledGraph, CompiledFxGraph)}
    results: dict[int, Any] = {}

    def replay(call: Callable[..., Any]) -> Callable[..., Any]:
        def replayed(self: Any, *args: Any) -> Any:
            if id(self) not in results:
                results[id(self)] = (self, call(self, *args))  # (self: its id stays its own)
            out = results[id(self)][1]
            if isinstance(out, torch.Tensor):
                return out.detach()
            return type(out)(o.detach() if isinstance(o, torch.Tensor) else o for o in out)
        return replayed

    for cls, call in saved.items():
        cls.__call__ = replay(call)  # type: ignore[method-assign]
    try:
        yield
    finally:
        for cls, call in saved.items():
            cls.__call__ = call  # type: ignore[method-assign]


def gradients_after_one_step(contender: str, base: torch.nn.Module,
                             inputs: tuple[Any, ...], first_steps: int = 1,
                             ) -> tuple[list[Any], Step, float]:
    """A fresh copy of `base` for `contender`: its gradients after one step (taken before the
    optimizer moved the weights), the step function, and the first step's wall time (from
    the contender's build: `torch.jit.script` or `trace` for nncfuse.jit, where
    torch.compile's Dynamo trace is in its first step); with
    `first_steps` n > 1, the wall time of the first n steps (the optimizer moves the weights
    after the last one only) and the gradients of the last."""
    model = copy.deepcopy(base)
    start = time.perf_counter()  # (`build` included: nncfuse.jit's script or trace)
    fn = build(contender, model, inputs)
    grads: list[Any] = []
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
    for _ in range(first_steps):
        optimizer.zero_grad(set_to_none=True)
        with autocast():
            loss(fn(*inputs)).backward()
    first = time.perf_counter() - start
    grads = [None if p.grad is None else p.grad.clone() for p in model.parameters()]
    optimizer.step()
    return grads, Step(model, fn, inputs), first


def exact_gradients(base: torch.nn.Module, inputs: tuple[Any, ...]) -> list[Any]:
    """Eager's gradients after one step of a float64 copy of `base` on float64 `inputs`."""
    model = copy.deepcopy(base).double()
    wide = tuple(x.double() if isinstance(x, torch.Tensor) and x.is_floating_point() else x
                 for x in inputs)
    return gradients_after_one_step("eager", model, wide)[0]


def compare_gradients(got: list[Any], want: list[Any],
                      exact: Callable[[], list[Any]] | None = None) -> str | None:
    """None if the gradients match eager's (`want`), else what differs. The absolute
    tolerance is relative to the largest gradient of all: some are zero but for rounding (a
    key's bias before softmax), and rounding differs between any two ways of computing them.
    Where one differs and `exact()` gives float64 eager's gradients, it still matches if it
    is at most `MULTIPLIER` times as far from that as `want`'s is (root mean square)."""
    scale = max((float(w.abs().max()) for w in want if w is not None and w.numel()),
                default=1.0) or 1.0
    numeric = []
    for k, (g, w) in enumerate(zip(got, want)):
        if w is None and g is not None and not g.any():
            continue  # zeros where eager has none: torch.compile's way (AOTAutograd's)
        if (g is None) != (w is None):
            return f"parameter {k}: gradient {'missing' if g is None else 'unexpected'}"
        if g is not None:
            numeric.append(k)
    for k in numeric:
        g, w = got[k], want[k]
        try:
            torch.testing.assert_close(g, w, rtol=RTOL, atol=ATOL * scale)
            continue
        except AssertionError as e:
            problem = f"parameter {k} {tuple(w.shape)}: {str(e).splitlines()[1:3]}"
        if exact is None:
            return problem
        ours, theirs = rms(g, exact()[k]), rms(w, exact()[k])
        if ours > MULTIPLIER * theirs + ATOL * scale / 10:
            return (f"{problem}; against float64 eager: rms error {ours:.2e}, float32 "
                    f"eager's {theirs:.2e}")
    return None


def _reset() -> None:
    from nncfuse.jit.fuser.guard import clear_kernel_cache

    torch._dynamo.reset()
    clear_kernel_cache()


def _warm_up() -> None:
    """Each compiler's one-time set-up (imports, the C++ and LLVM set-up), on a function
    unlike the workloads."""
    a = torch.randn(3, requires_grad=True)
    for backend in ("inductor", "nncfuse"):
        torch.compile(lambda t: torch.cos(t) - 3.0 * t, backend=backend)(a).sum().backward()
    nncfuse.jit(torch.jit.script(torch.nn.Tanh()))(a).sum().backward()
    _reset()


def run(name: str, base: torch.nn.Module, inputs: tuple[Any, ...], args: argparse.Namespace,
        contenders: list[str]) -> dict[str, Any]:
    result: dict[str, Any] = {"first": {}, "step": {}, "errors": {}, "notes": {}}
    steps: dict[str, Step] = {}
    reference = None
    exact: list[Any] = []  # float64 eager's gradients, made when first wanted

    def exact_once() -> list[Any]:
        if not exact:
            exact.append(exact_gradients(base, inputs))
        return exact[0]

    for contender in contenders:
        _reset()
        try:
            grads, step, first = gradients_after_one_step(contender, base, inputs,
                                                          args.first_steps)
        except Exception as e:  # noqa: BLE001 - reported, not timed
            result["errors"][contender] = f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"
            if args.verbose:
                traceback.print_exc()
            continue
        if contender == "eager":
            reference = grads
        elif reference is not None:
            problem = compare_gradients(grads, reference, exact_once)
            if problem and contender == "compile":  # the baseline: timed, its problem shown
                result["notes"][contender] = "gradients differ from eager's: " + problem
            elif problem:
                result["errors"][contender] = "gradients differ: " + problem
                continue
        result["first"][contender] = first
        steps[contender] = step
    timings = measure(steps, rounds=args.rounds, target_s=args.target_ms / 1e3, warmup=3,
                      clock=args.clock)
    result["step"] = {c: t.median for c, t in timings.items()}
    if args.overhead:
        with replayed_graphs():
            for step in steps.values():
                step()
            replayed = measure(steps, rounds=args.rounds, target_s=args.target_ms / 1e3,
                               warmup=3, clock=args.clock)
        result["replayed"] = {c: t.median for c, t in replayed.items()}
    if args.phases:
        result["phases"] = phases(steps, rounds=args.rounds,  # type: ignore[arg-type]
                                  per_round=max(1, round(args.target_ms / 1e3 / min(
                                      result["step"].values(), default=1.0))))
    return result


def report(results: dict[str, dict[str, Any]], contenders: list[str]) -> None:
    print(f"{'workload':<10}{'contender':<17}{'first step':>12}{'step':>12}"
          f"{'vs eager':>10}{'vs compile':>12}")
    for name, r in results.items():
        eager, compiled = r["step"].get("eager"), r["step"].get("compile")
        for c in contenders:
            if c in r["errors"]:
                print(f"{name:<10}{c:<17}  {r['errors'][c]}")
                continue
            t = r["step"][c]
            vs_eager = f"{eager / t:9.2f}x" if eager else ""
            vs_compile = f"{compiled / t:11.2f}x" if compiled else ""
            print(f"{name:<10}{c:<17}{fmt_time(r['first'][c]):>12}{fmt_time(t):>12}"
                  f"{vs_eager:>10}{vs_compile:>12}")
            if c in r["notes"]:
                print(f"{'':<27}({r['notes'][c][:150]})")
    print("\ngeomean over workloads, against torch.compile (Inductor):")
    for c in contenders:
        if c == "compile":
            continue
        both = [r for r in results.values() if c in r["step"] and "compile" in r["step"]]
        if not both:
            continue
        speed = geomean(r["step"]["compile"] / r["step"][c] for r in both)
        compile_time = geomean(r["first"][c] / r["first"]["compile"] for r in both)
        print(f"  {c:<17} step speed {speed:5.2f}x   first-step time {compile_time:6.3f}x"
              f"   ({len(both)} workloads)")


def malloc_keep(nbytes: int) -> None:
    """Make glibc serve blocks up to `nbytes` from its heap (M_MMAP_THRESHOLD) and keep a free
    top of the heap up to `nbytes` (M_TRIM_THRESHOLD). By default it sets both thresholds
    from the blocks freed so far, gives back a free top of the heap above the second, and a
    step that then allocates again faults its pages in anew: tens of faults per step of the
    MLP with nncfuse's graphs (their order of allocations), about none with eager's."""
    import ctypes

    libc = ctypes.CDLL("libc.so.6")
    m_trim_threshold, m_mmap_threshold = -1, -3  # malloc.h
    if not (libc.mallopt(m_mmap_threshold, nbytes) and libc.mallopt(m_trim_threshold, nbytes)):
        raise OSError("mallopt failed")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workloads", default="mlp,block", help="built-in workloads: mlp,block")
    p.add_argument("--models", default="", help="also these models of models.py, e.g. bert,gpt2")
    p.add_argument("--contenders", default=",".join(CONTENDERS),
                   help=f"comma-separated, of {', '.join(CONTENDERS + REFERENCES)}")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rounds", type=int, help="timed rounds (default 10; quick 3)")
    p.add_argument("--target-ms", type=float, default=50.0, help="time per sample")
    p.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                   help="step time: wall, or the process's CPU time (steadier when loaded)")
    p.add_argument("--inductor-cache", choices=["cold", "warm"], default="cold")
    p.add_argument("--malloc-keep", type=int, default=0, metavar="MB",
                   help="glibc's heap keeps blocks up to MB and a free top up to MB, for every "
                        "contender (0: glibc's defaults); see docs/autograd.md")
    p.add_argument("--overhead", action="store_true",
                   help="also each step with the compiled graphs' bodies replayed (what runs "
                        "around the kernels)")
    p.add_argument("--phases", action="store_true",
                   help="also each step's phases: forward, loss, backward, optimizer (CPU time, "
                        "page faults)")
    p.add_argument("--first-steps", type=int, default=3, metavar="N",
                   help="'first step': the time of the first N steps (default 3: to the "
                        "steady state of nncfuse-jit, whose first step profiles)")
    p.add_argument("--quick", action="store_true", help="smoke run: small shapes, few rounds")
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="float32",
                   help="bfloat16|float16: forward, loss and backward under torch.autocast")
    p.add_argument("--verbose", action="store_true", help="tracebacks of failures")
    args = p.parse_args(argv)
    if args.rounds is None:
        args.rounds = 3 if args.quick else 10
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    global AUTOCAST
    AUTOCAST = None if args.dtype == "float32" else getattr(torch, args.dtype)
    if args.inductor_cache == "cold":
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="inductor-cold-")
    torch.set_num_threads(args.threads)
    if args.malloc_keep:
        malloc_keep(args.malloc_keep << 20)
    warnings.simplefilter("ignore")
    contenders = [c for c in args.contenders.split(",") if c]
    chosen = {k: v for k, v in workloads(args.quick).items() if k in args.workloads.split(",")}
    if args.models:
        chosen.update(model_workloads(args.models.split(","), args.quick))
    _warm_up()
    print(f"training steps, {args.threads} thread(s), torch {torch.__version__}, Inductor cache "
          f"{args.inductor_cache}, step: median {args.clock} time, {args.dtype}; 1-minute load "
          f"average {os.getloadavg()[0]:.2f}\n")
    results = {name: run(name, model, inputs, args, contenders)
               for name, (model, inputs) in chosen.items()}
    report(results, contenders)
    for name, r in results.items():
        if "replayed" in r:
            print(f"\n{name}: step with the compiled graphs replayed (around them) + the graphs")
            for c, t in r["replayed"].items():
                print(f"  {c:<17}{fmt_time(t):>12} + {fmt_time(r['step'][c] - t):>10}")
    for name, r in results.items():
        if "phases" in r:
            report_phases(name, r["phases"])


if __name__ == "__main__":
    main()
