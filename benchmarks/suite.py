"""Eager PyTorch, TorchScript, torch.compile and nncfuse, side by side, on the workloads table.

    python benchmarks/suite.py                      # everything, 1 thread and all threads
    python benchmarks/suite.py --quick              # smoke run: tiny sizes, few rounds
    python benchmarks/suite.py -k seed -k gelu --threads 1 --chart docs/benchmarks.png

For each thread setting and workload, every contender is built fresh, called
once (the first-call time: scripting, profiling, fusion, compilation), warmed
up, checked against eager with `torch.testing.assert_close` (a contender that
fails is reported and never timed), then all are timed together in
interleaved rounds (`harness.measure`). See benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import gc
import os
import shutil
import tempfile
import traceback
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from harness import Timing, copy_time, measure, min_bytes, timed_call
from report import machine_info, print_report, write_chart, write_json
from workloads import Workload, select

import nncfuse

CONTENDERS = ("eager", "script", "compile", "nncfuse")
DEFAULT_JSON = Path(__file__).resolve().parent / "results" / "suite.json"
# The suite's own Inductor cache for warm runs: the default one under /tmp is shared with
# every other torch.compile user of the machine (and we have seen a half-written
# precompiled header there break compiles).
WARM_CACHE = Path(__file__).resolve().parent / "results" / "inductor-cache"
# Calls after the first and before checking and timing: TorchScript's profiling executor
# optimizes only after its profiled runs, and every contender should be in steady state.
WARMUP_CALLS = 3


def _build(contender: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn` as the contender runs it; building is part of the first call's time."""
    if contender == "eager":
        return fn
    if contender == "script":
        return torch.jit.script(fn)
    if contender == "compile":
        return torch.compile(fn)  # default mode; the compilation happens on the first call
    return nncfuse.jit(fn)


@dataclass
class Outcome:
    """One contender on one workload at one thread setting."""

    first_call_s: float | None = None  # build + first call
    second_call_s: float | None = None  # shows compilation deferred past the first call
    timing: Timing | None = None
    error: str | None = None


@dataclass
class Row:
    """One workload at one thread setting: every contender's outcome."""

    workload: str
    threads: int
    shape: tuple[int, ...]
    numel: int
    load_before: float  # 1-minute load average: other processes' share of the CPUs
    outcomes: dict[str, Outcome] = field(default_factory=dict)
    nncfuse_groups: int | None = None  # fusion groups in nncfuse's optimized graph
    copy_s: float | None = None  # a copy of the bytes the workload must move: the roofline


def _fresh(inputs: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    return tuple(t.clone() for t in inputs)


def _first_calls(
    contender: str, w: Workload, inputs: tuple[torch.Tensor, ...], expected: torch.Tensor,
    pristine: tuple[torch.Tensor, ...] | None = None,
) -> tuple[Callable[..., Any] | None, Outcome]:
    """Build and call `contender` until steady, checking its results; None if it fails.
    A workload that writes into its inputs is checked on copies of `pristine`."""
    outcome = Outcome()
    checked = (lambda: _fresh(pristine)) if pristine is not None else (lambda: inputs)
    try:
        fn, build_s = timed_call(_build, contender, w.fn)
        first, call_s = timed_call(fn, *checked())
        outcome.first_call_s = build_s + call_s
        _, outcome.second_call_s = timed_call(fn, *inputs)
        for _ in range(WARMUP_CALLS):
            fn(*inputs)
        # Check the first (profiling) call and a steady-state one: they take different paths.
        torch.testing.assert_close(first, expected)
        torch.testing.assert_close(fn(*checked()), expected)
    except Exception as e:  # noqa: BLE001 - any failure disqualifies, the suite goes on
        outcome.error = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e) else ''}"
        print(f"  !! {contender} on {w.name}: {outcome.error}")
        if os.environ.get("SUITE_TRACEBACK"):
            traceback.print_exc()
        return None, outcome
    return fn, outcome


def _nncfuse_groups(fn: Any, inputs: tuple[torch.Tensor, ...]) -> int | None:
    """How many fusion groups nncfuse formed: 0 means it runs unfused (worth knowing)."""
    try:
        graph = fn.graph_for(*inputs)
    except Exception:  # noqa: BLE001 - diagnostic only
        return None
    return 0 if graph is None else len(nncfuse.fusion_groups(graph))


def run_workload(w: Workload, threads: int, args: argparse.Namespace) -> Row:
    """First calls, checks and interleaved timing of the selected contenders on `w`."""
    torch.manual_seed(0)
    inputs = w.inputs(args.quick)
    pristine = _fresh(inputs) if w.mutates else None
    expected = w.fn(*_fresh(inputs)) if w.mutates else w.fn(*inputs)
    # Dynamo caches compiled code per code object and does not guard on the thread count:
    # without a reset, a second size of the same function would get a dynamic-shape
    # recompile, and a second thread setting would reuse code built for the first.
    torch._dynamo.reset()
    shape = tuple(inputs[0].shape)
    row = Row(w.name, threads, shape, w.numel(args.quick), os.getloadavg()[0])
    ready: dict[str, Callable[[], Any]] = {}
    for contender in args.contenders:
        fn, row.outcomes[contender] = _first_calls(contender, w, inputs, expected, pristine)
        if fn is None:
            continue
        ready[contender] = lambda fn=fn, xs=inputs: fn(*xs)
        if contender == "nncfuse":
            row.nncfuse_groups = _nncfuse_groups(fn, inputs)
    row.copy_s = copy_time(min_bytes(inputs, expected), threads, args.clock)
    del expected
    timings = measure(ready, rounds=args.rounds, target_s=args.target_ms / 1e3, warmup=1,
                      clock=args.clock)
    for contender, timing in timings.items():
        row.outcomes[contender].timing = timing
    del ready, inputs, timings
    torch._dynamo.reset()
    gc.collect()
    return row


def _startup(contenders: list[str]) -> dict[str, float]:
    """Pay each compiler's once-per-process costs (imports, Inductor's C++ headers, LLVM
    initialisation) on a throwaway function, so no workload's first call is charged for them.
    """
    def warm(x):
        return x * 3.0 - 1.0

    x = torch.ones(8)
    costs = {}
    for contender in contenders:
        if contender in ("compile", "nncfuse"):
            fn, build_s = timed_call(_build, contender, warm)
            _, first_s = timed_call(fn, x)
            fn(x)
            costs[contender] = build_s + first_s
    torch._dynamo.reset()
    return costs


def _inductor_vec_isa() -> str:
    """The SIMD instruction set Inductor generates C++ for; INVALID_VEC_ISA means scalar code.

    Inductor decides by building and loading a probe library in a child process;
    when that fails it silently falls back to scalar loops, which would make
    every torch.compile number in the table meaningless.
    """
    from torch._inductor.cpu_vec_isa import pick_vec_isa

    return str(pick_vec_isa())


def _thread_settings(spec: str) -> list[int]:
    available = len(os.sched_getaffinity(0))
    settings: list[int] = []
    for item in spec.split(","):
        n = available if item.strip() == "all" else int(item)
        if n not in settings:
            settings.append(n)
    return settings


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-k", dest="patterns", action="append", metavar="SUBSTRING",
                   help="run workloads whose name contains SUBSTRING (repeatable)")
    p.add_argument("--threads",
                   help="comma-separated thread counts; 'all' = CPUs available "
                        "(default 1,all; quick 1)")
    p.add_argument("--rounds", type=int, help="timed rounds per workload (default 15; quick 3)")
    p.add_argument("--target-ms", type=float,
                   help="length of one timed batch in ms (default 20; quick 2)")
    p.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                   help="what the table reports: wall time (default) or the process's CPU "
                        "time, steadier on a loaded machine at 1 thread (both go to the JSON)")
    p.add_argument("--contenders", default=",".join(CONTENDERS),
                   help="comma-separated subset of " + ",".join(CONTENDERS))
    p.add_argument("--quick", action="store_true",
                   help="smoke run: tiny sizes, few short rounds, warm Inductor cache")
    p.add_argument("--inductor-cache", choices=["cold", "warm"],
                   help="cold: a fresh Inductor cache dir for this run, so torch.compile's "
                        f"first calls are real compiles (default); warm: {WARM_CACHE} (quick)")
    p.add_argument("--json", type=Path, default=DEFAULT_JSON, help=f"default {DEFAULT_JSON}")
    p.add_argument("--chart", type=Path, help="also draw a PNG chart (needs matplotlib)")
    p.add_argument("--list", action="store_true", help="list the selected workloads and exit")
    args = p.parse_args(argv)
    args.rounds = args.rounds or (3 if args.quick else 15)
    args.target_ms = args.target_ms or (2.0 if args.quick else 20.0)
    args.inductor_cache = args.inductor_cache or ("warm" if args.quick else "cold")
    args.threads = args.threads or ("1" if args.quick else "1,all")
    args.contenders = [c.strip() for c in args.contenders.split(",")]
    unknown = set(args.contenders) - set(CONTENDERS)
    if unknown:
        p.error(f"unknown contenders {sorted(unknown)}")
    if "eager" not in args.contenders:
        args.contenders.insert(0, "eager")  # the reference of every ratio
    args.thread_settings = _thread_settings(args.threads)
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    workloads = select(args.patterns)
    if args.list or not workloads:
        for w in workloads:
            print(f"{w.name:24} {w.numel(args.quick):>10} elements")
        return
    # TorchScript is deprecated in this torch; it is a contender all the same.
    warnings.filterwarnings("ignore", category=DeprecationWarning, module="torch.jit")
    cache_dir = None  # a cold cache, removed at the end
    if args.inductor_cache == "cold":
        cache_dir = tempfile.mkdtemp(prefix="suite-inductor-")
    # Inductor reads this variable whenever it needs its cache, so setting it here works.
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache_dir or str(WARM_CACHE)
    initial_threads = torch.get_num_threads()
    rows: list[Row] = []
    try:
        startup = _startup(args.contenders)
        vec_isa = _inductor_vec_isa() if "compile" in args.contenders else None
        for threads in args.thread_settings:
            torch.set_num_threads(threads)
            for w in workloads:
                print(f"[{threads} thread{'s' if threads > 1 else ''}] {w.name}", flush=True)
                rows.append(run_workload(w, threads, args))
    finally:
        torch.set_num_threads(initial_threads)
        if cache_dir is not None:
            shutil.rmtree(cache_dir, ignore_errors=True)
    machine = machine_info(args.thread_settings, vec_isa)
    summary = print_report(rows, args.contenders, machine, startup, args.clock)
    write_json(args.json, machine, vars(args), startup, rows, summary)
    print(f"wrote {args.json}")
    if args.chart is not None:
        write_chart(args.chart, rows, args.contenders, machine, args.clock)


if __name__ == "__main__":
    main()
