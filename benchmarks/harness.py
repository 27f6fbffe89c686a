"""Side-by-side timing in one process: interleaved rounds, medians, ratios.

Each round times every contender once (a batch of calls sized to take about
`target_s`), in a rotating order, so slow drifts of a shared machine hit all
of them alike. Report medians over rounds and ratios of medians; min and max
show how noisy the rounds were.
"""

from __future__ import annotations

import gc
import math
import os
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Timing:
    """Seconds per call of one contender: one sample per round, each the mean over a batch.

    Every sample is taken on two clocks. Wall time is what a caller waits. The
    process's CPU time does not grow while other processes hold the CPU, so on a
    loaded machine it is the steadier measure of single-threaded code (with
    several threads it sums their work, which is not what a caller waits).
    `clock` picks the one that median, min and max report.
    """

    wall: tuple[float, ...]
    cpu: tuple[float, ...]
    batch: int  # calls per sample
    clock: str = "wall"

    @property
    def samples(self) -> tuple[float, ...]:
        return self.cpu if self.clock == "cpu" else self.wall

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    @property
    def min(self) -> float:
        return min(self.samples)

    @property
    def max(self) -> float:
        return max(self.samples)

    @property
    def cpu_per_wall(self) -> float:
        """CPU seconds per wall second: below 1 on one thread, other processes took the CPU."""
        return statistics.median(self.cpu) / statistics.median(self.wall)


def _run(fn: Callable[[], Any], n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        fn()
    return time.perf_counter() - start


def _batch_size(fn: Callable[[], Any], target_s: float) -> int:
    """Calls per sample so that one sample takes about `target_s` (timer resolution, noise).

    Each trial size is timed three times and the fastest counts: one trial that
    another process interrupted would otherwise shrink the batch to a single call.
    """
    n = 1
    while True:
        elapsed = min(_run(fn, n) for _ in range(3))
        if elapsed >= target_s / 4 or n >= 1 << 20:
            return max(1, int(n * target_s / max(elapsed, 1e-9)))
        n *= 4


def measure(
    contenders: dict[str, Callable[[], Any]],
    rounds: int = 15,
    target_s: float = 0.02,
    warmup: int = 3,
    clock: str = "wall",
) -> dict[str, Timing]:
    """Time every contender in `rounds` interleaved rounds, after `warmup` untimed calls each.

    The warm-up calls absorb profiling, compilation and cold caches, so the
    samples are steady-state; time first calls separately with `timed_call`.
    `clock` ("wall" or "cpu") is the one the returned Timings report.
    """
    for fn in contenders.values():
        for _ in range(warmup):
            fn()
    sizes = {name: _batch_size(fn, target_s) for name, fn in contenders.items()}
    wall: dict[str, list[float]] = {name: [] for name in contenders}
    cpu: dict[str, list[float]] = {name: [] for name in contenders}
    names = list(contenders)
    # As timeit does: a garbage collection landing in one sample would be charged to
    # whichever contender happened to allocate last.
    gc.collect()
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        for r in range(rounds):
            # Rotate who goes first: a contender that always ran right after another one
            # would always inherit that one's cache and frequency state.
            for name in names[r % len(names):] + names[: r % len(names)]:
                fn, n = contenders[name], sizes[name]
                start, start_cpu = time.perf_counter(), time.process_time()
                for _ in range(n):
                    fn()
                cpu[name].append((time.process_time() - start_cpu) / n)
                wall[name].append((time.perf_counter() - start) / n)
    finally:
        if gc_was_enabled:
            gc.enable()
    return {name: Timing(tuple(wall[name]), tuple(cpu[name]), sizes[name], clock)
            for name in contenders}


def compare(
    contenders: dict[str, Callable[[], Any]], rounds: int = 15, target_s: float = 0.02
) -> dict[str, float]:
    """Median seconds per call of each contender, timed in interleaved rounds."""
    return {name: t.median for name, t in measure(contenders, rounds, target_s).items()}


def timed_call(fn: Callable[..., Any], *args: Any) -> tuple[Any, float]:
    """The result of one call `fn(*args)` and its wall time in seconds (for first calls)."""
    start = time.perf_counter()
    result = fn(*args)
    return result, time.perf_counter() - start


def copy_time(nbytes: int, threads: int, clock: str = "wall", rounds: int = 5) -> float:
    """Seconds a tensor copy that moves `nbytes` (half read, half written) takes at `threads`
    threads, the fastest of `rounds`: the memory roofline of a call that moves as much (the
    same size, so the same caches hold it), on `clock` ("wall" or "cpu", as `measure`). A
    call's time over it is how far it is from the limit."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        src = torch.ones(max(1, nbytes // 8))
        dst = torch.empty_like(src)
        dst.copy_(src)  # first touch: pages mapped outside the timing
        t = measure({"copy": lambda: dst.copy_(src)}, rounds, 0.005, 1, clock)["copy"]
    finally:
        torch.set_num_threads(before)
    return t.min


def min_bytes(*values: Any) -> int:
    """The fewest bytes a call can move: every tensor among `values` (its inputs and its
    outputs; tuples and lists looked into) read or written once: its elements, or its
    storage where that is smaller (a broadcast); tensors sharing a storage count once."""
    import torch

    sizes: dict[int, int] = {}

    def add(v: Any) -> None:
        if isinstance(v, torch.Tensor):
            storage = v.untyped_storage()
            size = min(storage.nbytes(), v.numel() * v.element_size())
            sizes[storage.data_ptr()] = max(size, sizes.get(storage.data_ptr(), 0))
        elif isinstance(v, (tuple, list)):
            for item in v:
                add(item)

    add(values)
    return sum(sizes.values())


def geomean(values: Iterable[float]) -> float:
    """Geometric mean, the right average for ratios (NaN if there are none)."""
    logs = [math.log(v) for v in values]
    return math.exp(sum(logs) / len(logs)) if logs else math.nan


def fmt_time(seconds: float) -> str:
    if seconds < 1e-3:
        return f"{seconds * 1e6:8.1f} us"
    if seconds < 1.0:
        return f"{seconds * 1e3:8.2f} ms"
    return f"{seconds:8.2f} s "


def select(parser: Any, args: Any, contenders: Iterable[str], models: Iterable[Any]) -> None:
    """Resolve a models-style command line in place: `args.contenders` (eager first, always:
    the reference), `args.specs` (the named `models`, each with a `.name`; all by default)
    and `args.thread_settings` (`all` = the CPUs this process may use); unknown names are
    the parser's error."""
    args.contenders = [c.strip() for c in args.contenders.split(",")]
    unknown = set(args.contenders) - set(contenders)
    if unknown:
        parser.error(f"unknown contenders {sorted(unknown)}")
    if "eager" not in args.contenders:
        args.contenders.insert(0, "eager")
    models = list(models)
    names = [m.strip() for m in args.models.split(",")] if args.models else None
    if names and set(names) - {s.name for s in models}:
        parser.error(f"unknown models {sorted(set(names) - {s.name for s in models})}")
    args.specs = [s for s in models if names is None or s.name in names]
    available = len(os.sched_getaffinity(0))
    args.thread_settings = list(dict.fromkeys(
        available if t.strip() == "all" else int(t) for t in args.threads.split(",")))


def quiet_transformers(script: str) -> Any:
    """transformers, imported (or exit saying how to install it) and silence its logging and
    the warnings (TorchScript's deprecation, tracer warnings) that would bury the tables."""
    try:
        import transformers
    except ImportError:
        sys.exit(f'benchmarks/{script} needs transformers: pip install -e ".[models]"')
    warnings.filterwarnings("ignore")
    transformers.logging.set_verbosity_error()
    return transformers
