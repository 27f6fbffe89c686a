"""Training steps, side by side: eager, torch.compile (Inductor), the nncfuse backend and
`nncfuse.jit`. A step is forward, loss, backward and an SGD step.

    python benchmarks/training.py --clock cpu              # the MLP and the transformer block
    python benchmarks/training.py --models bert,gpt2       # also models.py's (transformers)
    python benchmarks/training.py --quick                  # smoke run: small shapes, few rounds

Workloads: an MLP with GELU (`MLP`), a pre-norm transformer block (`Block`: layer norm,
attention with softmax, GELU MLP, residuals), and with `--models` the models of
`benchmarks/models.py` in training mode with every dropout probability 0 (so that results
compare). Contenders, each on its own copy of the same initial weights:

- eager:           the module itself;
- compile:         `torch.compile(module)` (Inductor, default mode);
- nncfuse-backend: `torch.compile(module, backend="nncfuse")` (AOTAutograd's forward and
                   backward graphs through nncfuse);
- nncfuse-jit:     `nncfuse.jit(module)` (scripted; models.py's models traced), whose
                   parameters require grad: jit/autograd.py's fused forward and backward.

Before timing, each contender's first step is timed alone (wall clock: Dynamo, AOTAutograd,
the compilers, profiling runs; Inductor's cache is a fresh directory unless
`--inductor-cache warm`), and its parameters' gradients after that step are compared with
eager's (rtol 1e-3, atol 1e-4 times the largest gradient, or, where float32 itself is
that far off, as close to float64's as `compare_gradients` says): an nncfuse contender
that differs is reported and not timed; torch.compile, the baseline, is timed and its
difference shown (Inductor's ResNet-18 gradients are 0.6% of the largest from eager's and
float64's, which agree to 1e-5). Then steps are timed in interleaved rounds (`harness.measure`),
medians. The summary gives, per contender, the geometric mean over workloads of its step
time over torch.compile's, and of its first-step time over torch.compile's.
"""

from __future__ import annotations

import argparse
import copy
import importlib
import os
import sys
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable
from typing import Any

import torch
from harness import fmt_time, geomean, measure

import nncfuse

CONTENDERS = ("eager", "compile", "nncfuse-backend", "nncfuse-jit")
RTOL, ATOL = 1e-3, 1e-4
ILL_CONDITIONED = 8  # see compare_gradients


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
    if contender == "nncfuse-backend":
        importlib.import_module("nncfuse.backend")  # registers "nncfuse" (as the entry point)
        return torch.compile(model, backend="nncfuse")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return nncfuse.jit(torch.jit.script(model))
        except Exception:  # noqa: BLE001 - transformers' models: traced, as models.py does
            return nncfuse.jit(torch.jit.trace(model, inputs, strict=False, check_trace=False))


def _first(out: Any) -> torch.Tensor:
    while isinstance(out, (tuple, list)):
        out = out[0]
    return out


def loss(out: Any) -> torch.Tensor:
    """The output against fixed random weights (not its mean square: after a final layer
    norm that is nearly constant, and its gradients rounding noise)."""
    out = _first(out)
    out = out if out.dtype == torch.float64 else out.float()
    weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(0)).to(out.dtype)
    return (out * weights).mean()


def make_step(model: torch.nn.Module, fn: Callable[..., Any],
              inputs: tuple[Any, ...]) -> Callable[[], None]:
    """One training step of `fn` (running `model`): forward, loss, backward, SGD."""
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        loss(fn(*inputs)).backward()
        optimizer.step()

    return step


def gradients_after_one_step(contender: str, base: torch.nn.Module,
                             inputs: tuple[Any, ...]) -> tuple[list[Any], Callable[[], None],
                                                               float]:
    """A fresh copy of `base` for `contender`: its gradients after one step (taken before the
    optimizer moved the weights), the step function, and the first step's wall time."""
    model = copy.deepcopy(base)
    fn = build(contender, model, inputs)
    grads: list[Any] = []
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
    start = time.perf_counter()
    optimizer.zero_grad(set_to_none=True)
    loss(fn(*inputs)).backward()
    first = time.perf_counter() - start
    grads = [None if p.grad is None else p.grad.clone() for p in model.parameters()]
    optimizer.step()
    return grads, make_step(model, fn, inputs), first


def exact_gradients(base: torch.nn.Module, inputs: tuple[Any, ...]) -> list[Any]:
    """Eager's gradients after one step in float64 (`base` and its float inputs widened)."""
    model = copy.deepcopy(base).double()
    wide = tuple(x.double() if isinstance(x, torch.Tensor) and x.is_floating_point() else x
                 for x in inputs)
    loss(model(*wide)).backward()
    return [None if p.grad is None else p.grad for p in model.parameters()]


def compare_gradients(got: list[Any], want: list[Any],
                      exact: Callable[[], list[Any]] | None = None) -> str | None:
    """None if the gradients match eager's, else what differs. The absolute tolerance is
    relative to the largest gradient of all: some are zero but for rounding (a key's bias
    before softmax), and rounding differs between any two ways of computing them. Where
    float32 itself is that far off (MobileNetV2's convolutions under training-mode batch
    norms of few elements: eager's weight gradients are 1% of their largest from float64's,
    Inductor's and nncfuse's up to 7%), a gradient also matches if it is at most
    `ILL_CONDITIONED` times as far from the float64 gradients (`exact`, computed on demand)
    as eager's; a wrong term is off by the gradient's own size."""
    scale = max((float(w.abs().max()) for w in want if w is not None and w.numel()),
                default=1.0) or 1.0
    for k, (g, w) in enumerate(zip(got, want)):
        if w is None and g is not None and not g.any():
            continue  # zeros where eager has none: torch.compile's way (AOTAutograd's)
        if (g is None) != (w is None):
            return f"parameter {k}: gradient {'missing' if g is None else 'unexpected'}"
        if g is None:
            continue
        try:
            torch.testing.assert_close(g, w, rtol=RTOL, atol=ATOL * scale)
        except AssertionError as e:
            x = exact()[k] if exact is not None else None
            far = (g.double() - x).abs().max() if x is not None else None
            if far is None or far > ILL_CONDITIONED * (w.double() - x).abs().max():
                return f"parameter {k} {tuple(w.shape)}: {str(e).splitlines()[1:3]}"
    return None


def _reset() -> None:
    from nncfuse.jit.guard import clear_kernel_cache

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
    steps: dict[str, Callable[[], None]] = {}
    reference = None
    wide: list[Any] = []

    def exact() -> list[Any]:
        if not wide:
            wide.extend(exact_gradients(base, inputs))
        return wide

    for contender in contenders:
        _reset()
        try:
            grads, step, first = gradients_after_one_step(contender, base, inputs)
        except Exception as e:  # noqa: BLE001 - reported, not timed
            result["errors"][contender] = f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"
            if args.verbose:
                traceback.print_exc()
            continue
        if contender == "eager":
            reference = grads
        elif reference is not None:
            problem = compare_gradients(grads, reference, exact)
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
                print(f"{'':<10}{'':<17}  ({r['notes'][c]})")
    print("\ngeomean over workloads, against torch.compile (Inductor):")
    for c in contenders:
        if c == "compile":
            continue
        both = [r for r in results.values() if c in r["step"] and "compile" in r["step"]]
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
    p.add_argument("--contenders", default=",".join(CONTENDERS))
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rounds", type=int, help="timed rounds (default 10; quick 3)")
    p.add_argument("--target-ms", type=float, default=50.0, help="time per sample")
    p.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                   help="step time: wall, or the process's CPU time (steadier when loaded)")
    p.add_argument("--inductor-cache", choices=["cold", "warm"], default="cold")
    p.add_argument("--malloc-keep", type=int, default=0, metavar="MB",
                   help="glibc's heap keeps blocks up to MB and a free top up to MB, for every "
                        "contender (0: glibc's defaults); see docs/autograd.md")
    p.add_argument("--quick", action="store_true", help="smoke run: small shapes, few rounds")
    p.add_argument("--verbose", action="store_true", help="tracebacks of failures")
    args = p.parse_args(argv)
    if args.rounds is None:
        args.rounds = 3 if args.quick else 10
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
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
          f"{args.inductor_cache}, step: median {args.clock} time; 1-minute load average "
          f"{os.getloadavg()[0]:.2f}\n")
    results = {name: run(name, model, inputs, args, contenders)
               for name, (model, inputs) in chosen.items()}
    report(results, contenders)


if __name__ == "__main__":
    main()
