"""The suite's outputs: the printed tables, the JSON record and the PNG chart.

Ratios are of medians, and always read "how many times faster nncfuse is":
`vs eager` = eager / nncfuse, `vs compile` = torch.compile / nncfuse. Averages
of ratios are geometric means.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import platform
import statistics
import subprocess
from pathlib import Path
from typing import Any

import llvmlite
import llvmlite.binding as llvm
import torch
from harness import fmt_time, geomean

from nncfuse.config import cpu_info

LARGE = 1 << 20  # workloads at least this big enter the "speedup over eager" average
LABELS = {"eager": "eager", "script": "TorchScript", "compile": "torch.compile",
          "compile-frozen": "torch.compile frozen",
          "nncfuse": "nncfuse", "nncfuse-frozen": "nncfuse frozen",
          "nncfuse-backend": "nncfuse backend"}


def _cpu_model() -> str:
    return cpu_info("model name") or platform.processor() or "unknown"


def _git_revision() -> str:
    """HEAD, marked dirty when nncfuse/ has uncommitted changes (its speed is what moves)."""
    here = Path(__file__).resolve().parent

    def git(*cmd: str) -> str:
        return subprocess.run(["git", *cmd], cwd=here, capture_output=True, text=True,
                              check=True).stdout.strip()

    try:
        head = git("rev-parse", "--short", "HEAD")
        dirty = git("status", "--porcelain", "--", str(here.parent / "nncfuse"))
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")


def machine_info(thread_settings: list[int], inductor_vec_isa: str | None) -> dict[str, Any]:
    return {
        "cpu_model": _cpu_model(),
        "llvm_host_cpu": llvm.get_host_cpu_name(),
        "cpus_available": len(os.sched_getaffinity(0)),
        "torch_default_threads": torch.get_num_threads(),
        "thread_settings": thread_settings,
        "torch": torch.__version__,
        "llvmlite": llvmlite.__version__,
        "python": platform.python_version(),
        "nncfuse_revision": _git_revision(),
        "inductor_vec_isa": inductor_vec_isa,
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
    }


def _median(row: Any, contender: str) -> float | None:
    outcome = row.outcomes.get(contender)
    return outcome.timing.median if outcome and outcome.timing else None


def _ratio(row: Any, numerator: str) -> float | None:
    """`numerator`'s median over nncfuse's: above 1, nncfuse is faster."""
    a, b = _median(row, numerator), _median(row, "nncfuse")
    return a / b if a and b else None


def _roofline(row: Any) -> float | None:
    """A copy of the bytes the workload must move over nncfuse's time, in percent."""
    t, copy = _median(row, "nncfuse"), getattr(row, "copy_s", None)
    return 100 * copy / t if t and copy else None


def _spread(row: Any) -> float | None:
    """How far the rounds disagree: the worst max/min over the row's timed contenders."""
    spreads = [o.timing.max / o.timing.min for o in row.outcomes.values() if o.timing]
    return max(spreads) if spreads else None


def _cpu_share(row: Any) -> float | None:
    """The lowest CPU/wall ratio, in percent, of the row's timed contenders."""
    shares = [100 * o.timing.cpu_per_wall for o in row.outcomes.values() if o.timing]
    return min(shares) if shares else None


def _cell(value: float | None, fmt: str, width: int, missing: str = "-") -> str:
    return f"{missing:>{width}}" if value is None else format(value, fmt).rjust(width)


def _times(ratio: float | None) -> str:
    return "n/a" if ratio is None else f"{ratio:.2f}x"


def _elements(n: int) -> str:
    for unit, scale in (("M", 1 << 20), ("K", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.4g}{unit}"
    return str(n)


def _time_cell(row: Any, contender: str) -> str:
    outcome = row.outcomes.get(contender)
    if outcome is None:
        return f"{'-':>11}"
    if outcome.error is not None:
        return f"{'FAILED':>11}"
    return fmt_time(outcome.timing.median)


def summarize(rows: list[Any]) -> dict[str, dict[str, float | None]]:
    """Per thread setting: geomean speedup over eager (large workloads) and vs compile (all)."""
    summary = {}
    for threads in dict.fromkeys(r.threads for r in rows):
        mine = [r for r in rows if r.threads == threads]
        vs_eager = [_ratio(r, "eager") for r in mine if r.numel >= LARGE]
        vs_compile = [_ratio(r, "compile") for r in mine]
        summary[str(threads)] = {
            "nncfuse_vs_eager_geomean_large": _finite(geomean(v for v in vs_eager if v)),
            "nncfuse_vs_compile_geomean_all": _finite(geomean(v for v in vs_compile if v)),
        }
    return summary


def _finite(x: float) -> float | None:
    """None for NaN (an average over nothing): JSON has no NaN."""
    return None if math.isnan(x) else x


def print_report(
    rows: list[Any], contenders: list[str], machine: dict[str, Any], startup: dict[str, float],
    clock: str,
) -> dict[str, dict[str, float | None]]:
    """Print the steady-state table, first calls and the averages; return the averages."""
    print(f"\n{machine['cpu_model']} (LLVM: {machine['llvm_host_cpu']}), "
          f"torch {machine['torch']}, nncfuse {machine['nncfuse_revision']}")
    isa = machine["inductor_vec_isa"]
    if isa is not None:
        print(f"torch.compile's vector ISA: {isa}")
        if "INVALID" in isa:
            print("!! torch.compile generated scalar C++: Inductor's vector-ISA probe failed "
                  "(e.g. a file such as nt.py on sys.path crashes the probe's child process)")
    print(f"median {clock} time per call; vs eager = eager/nncfuse, "
          "vs compile = torch.compile/nncfuse (>1: nncfuse faster);")
    print("groups = nncfuse fusion groups; spread = the largest slowest/fastest round of any "
          "contender (1.0: steady; >2: a noisy row);")
    print("cpu% = the lowest CPU/wall time of any contender (at 1 thread, below ~90: other "
          "processes took the CPU);")
    print("roof% = a copy of the bytes the workload reads and writes at least (inputs, outputs "
          "once) over nncfuse's time (100: as fast as memcpy)\n")
    head = f"{'workload':<22}{'thr':>4}{'elems':>8}" + "".join(
        f"{LABELS[c]:>14}" for c in contenders)
    print(head + f"{'vs eager':>10}{'vs compile':>11}{'groups':>7}{'spread':>7}{'cpu%':>6}"
          f"{'roof%':>6}")
    for r in rows:
        times = "".join(f"{_time_cell(r, c):>14}" for c in contenders)
        print(f"{r.workload:<22}{r.threads:>4}{_elements(r.numel):>8}{times}"
              f"{_cell(_ratio(r, 'eager'), '.2f', 9)}x"
              f"{_cell(_ratio(r, 'compile'), '.2f', 10)}x"
              f"{_cell(r.nncfuse_groups, 'd', 7)}{_cell(_spread(r), '.1f', 7)}"
              f"{_cell(_cpu_share(r), '.0f', 6)}{_cell(_roofline(r), '.0f', 6)}")

    compilers = [c for c in ("compile", "nncfuse") if c in contenders]
    if compilers:
        print("\nfirst call (build + profile + compile + run), process start-up excluded:")
        print(f"{'workload':<22}{'thr':>4}" + "".join(f"{LABELS[c]:>14}" for c in compilers))
        for r in rows:
            cells = "".join(
                f"{fmt_time(r.outcomes[c].first_call_s):>14}"
                if r.outcomes[c].first_call_s is not None else f"{'FAILED':>14}"
                for c in compilers)
            print(f"{r.workload:<22}{r.threads:>4}{cells}")
        print("process start-up (paid once, on a throwaway function): " + ", ".join(
            f"{LABELS[c]} {fmt_time(s).strip()}" for c, s in startup.items()))

    tiny = [r for r in rows if r.numel <= 64]
    for r in tiny:
        print(f"per-call overhead ({r.workload}, {r.threads} thr): " + ", ".join(
            f"{LABELS[c]} {fmt_time(_median(r, c)).strip()}"
            for c in contenders if _median(r, c) is not None))

    summary = summarize(rows)
    print()
    for threads, s in summary.items():
        large, all_ = s["nncfuse_vs_eager_geomean_large"], s["nncfuse_vs_compile_geomean_all"]
        print(f"{threads} thread(s): nncfuse speedup over eager, geomean over workloads "
              f">= {LARGE >> 20}M elements: {_times(large)}; "
              f"nncfuse vs torch.compile, geomean over all: {_times(all_)}")
        loads = [r.load_before for r in rows if str(r.threads) == threads]
        print(f"  1-minute load average before each workload: {min(loads):.2f} to "
              f"{max(loads):.2f} on {machine['cpus_available']} CPUs (other processes' "
              f"share: compare with the thread count)")
    return summary


def _row_json(r: Any) -> dict[str, Any]:
    contenders = {}
    for name, o in r.outcomes.items():
        t = o.timing
        contenders[name] = {
            "median_s": t.median if t else None,
            "min_s": t.min if t else None,
            "max_s": t.max if t else None,
            "wall_median_s": statistics.median(t.wall) if t else None,
            "cpu_median_s": statistics.median(t.cpu) if t else None,
            "cpu_per_wall": t.cpu_per_wall if t else None,
            "rounds": len(t.samples) if t else 0,
            "calls_per_round": t.batch if t else 0,
            "wall_samples_s": list(t.wall) if t else [],
            "cpu_samples_s": list(t.cpu) if t else [],
            "first_call_s": o.first_call_s,
            "second_call_s": o.second_call_s,
            "error": o.error,
        }
    return {"workload": r.workload, "threads": r.threads, "shape": list(r.shape),
            "numel": r.numel, "load_avg_1min": r.load_before, "nncfuse_groups": r.nncfuse_groups,
            "roofline_pct": _roofline(r),
            "nncfuse_vs_eager": _ratio(r, "eager"), "nncfuse_vs_compile": _ratio(r, "compile"),
            "contenders": contenders}


def write_json(
    path: Path, machine: dict[str, Any], options: dict[str, Any], startup: dict[str, float],
    rows: list[Any], summary: dict[str, dict[str, float | None]],
) -> None:
    """The whole run as JSON: enough to redraw the table or compare two runs later."""
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {"machine": machine, "options": options, "startup_s": startup,
              "summary": summary, "results": [_row_json(r) for r in rows]}
    path.write_text(json.dumps(record, indent=1, default=str, allow_nan=False) + "\n")


def write_chart(
    path: Path, rows: list[Any], contenders: list[str], machine: dict[str, Any], clock: str
) -> None:
    """Speedup over eager per workload, one panel per thread setting (log scale)."""
    names = list(dict.fromkeys(r.workload for r in rows))
    panels: dict[int, dict[tuple[str, str], float]] = {}
    for r in rows:
        e = _median(r, "eager")
        for c in contenders:
            t = _median(r, c)
            panels.setdefault(r.threads, {})[r.workload, c] = e / t if e and t else math.nan
    title = (f"{machine['cpu_model']} ({machine['llvm_host_cpu']}), torch {machine['torch']}"
             f", nncfuse {machine['nncfuse_revision']}, {machine['date'][:10]}")
    draw_speedups(path, panels, names, names, contenders, clock, title)


def draw_speedups(
    path: Path,
    panels: dict[int, dict[tuple[str, str], float]],
    names: list[str],
    labels: list[str],
    contenders: list[str],
    clock: str,
    title: str,
    fontsize: float | None = None,
) -> None:
    """Horizontal bars of speedup over eager, one panel per thread setting (log scale):
    `panels[threads][name, contender]`, NaN where missing; `labels` name the rows."""
    try:
        import matplotlib
    except ImportError:
        print('matplotlib is not installed (pip install -e ".[plot]"): no chart drawn')
        return
    matplotlib.use("Agg")  # no display needed
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    others = [c for c in contenders if c != "eager"]
    settings = sorted(panels)
    fig, axes = plt.subplots(1, len(settings), figsize=(6.5 * len(settings), 1.5 + 0.45 * len(
        names)), sharey=True, squeeze=False)
    height = 0.8 / max(1, len(others))
    for ax, threads in zip(axes[0], settings):
        for k, c in enumerate(others):
            speedups = [panels[threads].get((n, c), math.nan) for n in names]
            ax.barh([i + (k - (len(others) - 1) / 2) * height for i in range(len(names))],
                    speedups, height=height, label=LABELS[c])
        ax.axvline(1.0, color="black", linewidth=0.8)
        ax.set_xscale("log")
        ax.set_title(f"{threads} thread{'s' if threads > 1 else ''}")
        ax.set_xlabel(f"speedup over eager (median {clock} time; log scale, >1 is faster)")
        ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}x"))
        ax.xaxis.set_minor_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
        ax.grid(axis="x", which="both", alpha=0.3)
    axes[0][0].set_yticks(range(len(names)), labels)
    axes[0][0].invert_yaxis()
    axes[0][-1].legend(loc="lower right")
    fig.suptitle(title, fontsize=fontsize)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"wrote {path}")
