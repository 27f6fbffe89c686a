"""Side-by-side timing in one process: interleaved rounds, medians, ratios.

Each round times every contender once (a batch of calls sized to take about
`target_s`), in a rotating order, so slow drifts of a shared machine hit all
of them alike. Report medians over rounds and ratios of medians; min and max
show how noisy the rounds were.
"""

from __future__ import annotations

import gc
import math
import statistics
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Timing:
    """Seconds per call of one contender: one sample per round, each the mean over a batch."""

    samples: tuple[float, ...]
    batch: int  # calls per sample

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    @property
    def min(self) -> float:
        return min(self.samples)

    @property
    def max(self) -> float:
        return max(self.samples)


def _batch_size(fn: Callable[[], Any], target_s: float) -> int:
    """Calls per sample so that one sample takes about `target_s` (timer resolution, noise)."""
    n = 1
    while True:
        start = time.perf_counter()
        for _ in range(n):
            fn()
        elapsed = time.perf_counter() - start
        if elapsed >= target_s / 4 or n >= 1 << 20:
            return max(1, int(n * target_s / max(elapsed, 1e-9)))
        n *= 4


def measure(
    contenders: dict[str, Callable[[], Any]],
    rounds: int = 15,
    target_s: float = 0.02,
    warmup: int = 3,
) -> dict[str, Timing]:
    """Time every contender in `rounds` interleaved rounds, after `warmup` untimed calls each.

    The warm-up calls absorb profiling, compilation and cold caches, so the
    samples are steady-state; time first calls separately with `timed_call`.
    """
    for fn in contenders.values():
        for _ in range(warmup):
            fn()
    sizes = {name: _batch_size(fn, target_s) for name, fn in contenders.items()}
    samples: dict[str, list[float]] = {name: [] for name in contenders}
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
                start = time.perf_counter()
                for _ in range(n):
                    fn()
                samples[name].append((time.perf_counter() - start) / n)
    finally:
        if gc_was_enabled:
            gc.enable()
    return {name: Timing(tuple(s), sizes[name]) for name, s in samples.items()}


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
