"""torch.compile backends on a small MLP with GELU: first-step time and per-call time of
`backend="nncfuse"` against Inductor (torch.compile's default) and eager, side by side.

    python benchmarks/compile_mlp.py                 # 1 thread, batch 64, 256 -> 1024 -> 256
    python benchmarks/compile_mlp.py --batch 8 --threads 2

Two workloads: inference (`torch.no_grad()`, AOTAutograd's inference graph) and a
training step (forward, loss, backward: AOTAutograd's forward and backward graphs).
"First step" is the wall time of the first call after `torch.compile`: Dynamo's
tracing, AOTAutograd, the backend's compile, and (for nncfuse) the profiling run and
kernel compiles of the first signature, which nncfuse does lazily on the first call; for a
training step, until the backward has run. Before it, each backend compiles an unrelated
tiny function once (imports, LLVM's or the C++ compiler's set-up), and Inductor's cache
directory is a fresh, empty one (`--inductor-cache warm` keeps the environment's), so the
numbers are a cold compile of this model in a warm process. nncfuse's in-process kernel
cache is cleared before each measurement. Per call: medians of interleaved rounds
(`harness.measure`), after warm-up calls.
"""

from __future__ import annotations

import argparse
import copy
import os
import tempfile
import time
from collections.abc import Callable
from typing import Any

import torch
from harness import fmt_time, measure

BACKENDS = ("eager", "inductor", "nncfuse")


class MLP(torch.nn.Module):
    def __init__(self, width: int, hidden: int):
        super().__init__()
        self.fc1 = torch.nn.Linear(width, hidden)
        self.fc2 = torch.nn.Linear(hidden, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(x)) * 0.5)


def _compiled(backend: str, model: torch.nn.Module) -> Callable[..., Any]:
    if backend == "eager":
        return model
    if backend == "inductor":
        return torch.compile(model)
    return torch.compile(model, backend="nncfuse")


def _reset() -> None:
    from nncfuse.jit.fuser.guard import clear_kernel_cache

    torch._dynamo.reset()
    clear_kernel_cache()


def _warm_up_backends() -> None:
    """Each backend's one-time set-up, on a function unlike the model."""
    for backend in ("inductor", "nncfuse"):
        fn = torch.compile(lambda a: torch.cos(a) - 3.0 * a, backend=backend)
        a = torch.randn(3, requires_grad=True)
        fn(a).sum().backward()
        with torch.no_grad():
            fn(torch.randn(5))
    _reset()


def _step(model: torch.nn.Module, fn: Callable[..., Any], x: torch.Tensor) -> Callable[[], Any]:
    def step() -> None:
        model.zero_grad(set_to_none=True)
        fn(x).square().mean().backward()

    return step


def _inference(fn: Callable[..., Any], x: torch.Tensor) -> Callable[[], Any]:
    def call() -> Any:
        with torch.no_grad():
            return fn(x)

    return call


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                   help="per-call time: wall (default) or the process's CPU time, steadier on a "
                        "loaded machine at 1 thread")
    p.add_argument("--inductor-cache", choices=["cold", "warm"], default="cold")
    args = p.parse_args(argv)
    if args.inductor_cache == "cold":
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="inductor-cold-")
    torch.set_num_threads(args.threads)
    import nncfuse.backend  # noqa: F401 - registers "nncfuse" (as the entry point does)

    _warm_up_backends()
    torch.manual_seed(0)
    base = MLP(args.width, args.hidden)
    x = torch.randn(args.batch, args.width)
    with torch.no_grad():
        expected = base(x)

    first: dict[tuple[str, str], float] = {}
    calls: dict[str, dict[str, Callable[[], Any]]] = {"inference": {}, "training step": {}}
    for backend in BACKENDS:
        for workload in calls:
            _reset()
            model = copy.deepcopy(base)
            fn = _compiled(backend, model)
            call = _inference(fn, x) if workload == "inference" else _step(model, fn, x)
            start = time.perf_counter()
            call()
            first[(backend, workload)] = time.perf_counter() - start
            if workload == "inference":
                torch.testing.assert_close(call(), expected, rtol=1e-4, atol=1e-5)
            calls[workload][backend] = call
    # `torch._dynamo.reset()` dropped the earlier ones' compiled code: compile all again for
    # the timed rounds (their warm-up calls), in one Dynamo cache.
    _reset()
    for workload in calls:
        for backend in BACKENDS:
            model = copy.deepcopy(base)
            fn = _compiled(backend, model)
            calls[workload][backend] = (_inference(fn, x) if workload == "inference"
                                        else _step(model, fn, x))
    print(f"MLP {args.width} -> {args.hidden} (GELU) -> {args.width}, batch {args.batch}, "
          f"{args.threads} thread(s), torch {torch.__version__}, Inductor cache "
          f"{args.inductor_cache}, per call: median {args.clock} time; 1-minute load average "
          f"{os.getloadavg()[0]:.2f}\n")
    print(f"{'workload':<15}{'backend':<10}{'first step':>12}{'per call':>12}{'vs eager':>10}")
    for workload, contenders in calls.items():
        timings = measure(contenders, rounds=args.rounds, target_s=0.05, warmup=3,
                          clock=args.clock)
        eager = timings["eager"].median
        for backend in BACKENDS:
            t = timings[backend].median
            print(f"{workload:<15}{backend:<10}{fmt_time(first[(backend, workload)]):>12}"
                  f"{fmt_time(t):>12}{eager / t:>9.2f}x")


if __name__ == "__main__":
    main()
