"""Side-by-side timing in one process: interleaved rounds, medians, ratios.

Each round times every contender once (a batch of calls sized to take about
`target_s`), in a rotating order, so slow drifts of a shared machine hit all
of them alike. Report medians over rounds and ratios of medians.
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable


def _batch_size(fn: Callable[[], Any], target_s: float) -> int:
    n = 1
    while True:
        start = time.perf_counter()
        for _ in range(n):
            fn()
        elapsed = time.perf_counter() - start
        if elapsed >= target_s / 4 or n >= 1 << 20:
            return max(1, int(n * target_s / max(elapsed, 1e-9)))
        n *= 4


def compare(
    contenders: dict[str, Callable[[], Any]], rounds: int = 15, target_s: float = 0.02
) -> dict[str, float]:
    """Median seconds per call of each contender, timed in interleaved rounds."""
    for fn in contenders.values():  # warm up: profiling, compilation, caches
        for _ in range(3):
            fn()
    sizes = {name: _batch_size(fn, target_s) for name, fn in contenders.items()}
    samples: dict[str, list[float]] = {name: [] for name in contenders}
    names = list(contenders)
    for r in range(rounds):
        for name in names[r % len(names):] + names[: r % len(names)]:
            fn, n = contenders[name], sizes[name]
            start = time.perf_counter()
            for _ in range(n):
                fn()
            samples[name].append((time.perf_counter() - start) / n)
    return {name: statistics.median(s) for name, s in samples.items()}


def fmt_time(seconds: float) -> str:
    if seconds < 1e-3:
        return f"{seconds * 1e6:8.1f} us"
    return f"{seconds * 1e3:8.2f} ms"
