"""The fuzzer's command line: `python -m nncfuse.fuzz -n N [--seed S] [--backend ...] [-j J]`.

Cases run in worker processes (`--worker`, fed seeds on stdin, answering one
JSON line per seed), so a kernel that kills its process (SIGSEGV, SIGFPE)
or hangs (`--timeout`) costs one counted crash, not the run. Workers are
recycled every `--recycle` cases to bound the memory that compiled kernels
and registered ops accumulate. The summary counts what `oracle.py`
describes; the exit status is 1 on any mismatch or crash.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import selectors
import subprocess
import sys
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from . import oracle
from .minimize import minimize_case, repro_script

_TAG = "@@fuzz "


def _worker(backends: Sequence[str]) -> int:
    """Answer each seed read from stdin with one tagged JSON line on stdout."""
    out = sys.stdout
    sys.stdout = sys.stderr  # stray prints must not corrupt the protocol
    for line in sys.stdin:
        seed = int(line)
        try:
            case, outcome = oracle.check_seed(seed, backends)
        except Exception:  # noqa: BLE001 - the fuzzer's own bug, not nncfuse's
            answer = {"seed": seed, "status": "invalid", "fused": False,
                      "report": f"=== fuzzer error (seed {seed}) ===\n{traceback.format_exc()}"}
            out.write(_TAG + json.dumps(answer) + "\n")
            out.flush()
            continue
        failing = outcome.status in ("mismatch", "crash", "invalid")
        answer = {
            "seed": seed,
            "status": outcome.status,
            "fused": outcome.fused,
            "raises": outcome.raises,
            "noise": [f.kind for f in outcome.noise],
            "kernel_errors": outcome.kernel_errors,
            "fused_kinds": sorted(outcome.fused_kinds),
            "ops": case.program.ops,
            "report": oracle.report(case, outcome) if failing or outcome.noise else "",
        }
        out.write(_TAG + json.dumps(answer) + "\n")
        out.flush()
    return 0


@dataclass
class Tally:
    generated: int = 0
    skipped: int = 0
    fused: int = 0
    raises: int = 0
    seeds: dict[str, list[int]] = field(default_factory=lambda: collections.defaultdict(list))
    kernel_errors: collections.Counter = field(default_factory=collections.Counter)
    fused_kinds: collections.Counter = field(default_factory=collections.Counter)
    ops: collections.Counter = field(default_factory=collections.Counter)

    def add(self, answer: dict[str, Any]) -> None:
        self.generated += 1
        status = answer["status"]
        self.skipped += status == "skipped"
        self.fused += answer["fused"]
        self.raises += answer.get("raises", False)
        if status in ("mismatch", "crash", "invalid"):
            self.seeds[status].append(answer["seed"])
        for kind in set(answer.get("noise", ())):
            self.seeds[kind].append(answer["seed"])
        for error in answer.get("kernel_errors", ()):
            if error not in self.kernel_errors:
                self.seeds["kernel_error"].append(answer["seed"])
            self.kernel_errors[error] += 1
        self.fused_kinds.update(answer.get("fused_kinds", ()))
        self.ops.update(answer.get("ops", ()))

    def crash(self, seed: int, why: str) -> None:
        self.generated += 1
        self.seeds["crash"].append(seed)
        if "timed out" in why:
            self.seeds["timeout"].append(seed)
        print(f"=== nncfuse fuzz: crash (seed {seed}) ===\nworker {why}\n"
              f"replay: python -m nncfuse.fuzz --replay {seed}", flush=True)

    @property
    def failed(self) -> bool:
        return any(self.seeds[k] for k in ("mismatch", "crash", "invalid"))

    def summary(self) -> str:
        compared = self.generated - self.skipped
        rows = [
            f"generated:              {self.generated}",
            f"skipped (eager raised): {self.skipped}",
            f"compared:               {compared}",
            f"ran fused:              {self.fused}",
            f"eager raised on set B:  {self.raises} (nncfuse had to raise too)",
            f"mismatches:             {len(self.seeds['mismatch'])}",
            f"crashes:                {len(self.seeds['crash'])}"
            f" (timeouts among them: {len(self.seeds['timeout'])})",
            f"invalid (fuzzer bugs):  {len(self.seeds['invalid'])}",
            f"unstable (noise, not counted as mismatches): {len(self.seeds['unstable'])}",
            f"torchscript differs from eager (not nncfuse): {len(self.seeds['torchscript'])}",
            f"kernel errors run unfused (distinct): {len(self.kernel_errors)}",
            f"aten kinds seen fused: {len(self.fused_kinds)}",
        ]
        kinds = ("mismatch", "crash", "timeout", "invalid", "unstable", "torchscript",
                 "kernel_error")
        for kind in kinds:
            if self.seeds[kind]:
                rows.append(f"{kind} seeds: {' '.join(map(str, sorted(self.seeds[kind])))}")
        for error, n in self.kernel_errors.most_common(10):
            rows.append(f"  {n} x kernel error: {error}")
        return "\n".join(rows)


class _Worker:
    """One worker process and the seeds it still owes answers for."""

    def __init__(self, seeds: Sequence[int], backends: Sequence[str], recycle: int):
        self.pending = collections.deque(seeds[:recycle])
        self.rest = list(seeds[recycle:])
        cmd = [sys.executable, "-m", "nncfuse.fuzz", "--worker", "--backend", ",".join(backends)]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, bufsize=1)
        assert self.proc.stdin is not None
        self.proc.stdin.write("".join(f"{s}\n" for s in self.pending))
        self.proc.stdin.close()
        self.since = time.monotonic()


def run(seeds: Sequence[int], backends: Sequence[str], jobs: int, timeout: float,
        recycle: int, verbose: bool = True) -> Tally:
    """Check every seed in worker processes; print failure reports as they come."""
    tally = Tally()
    sel = selectors.DefaultSelector()

    def start(todo: Sequence[int]) -> None:
        if todo:
            w = _Worker(todo, backends, recycle)
            sel.register(w.proc.stdout, selectors.EVENT_READ, w)  # type: ignore[arg-type]

    def finish(w: _Worker, why: str | None) -> None:
        sel.unregister(w.proc.stdout)  # type: ignore[arg-type]
        if why is not None:
            w.proc.kill()
        rc = w.proc.wait()
        if w.pending:  # the first one was running when the worker ended
            tally.crash(w.pending.popleft(), why or f"died with exit status {rc}")
        start([*w.pending, *w.rest])

    for j in range(jobs):
        start(list(seeds[j::jobs]))
    last_note = time.monotonic()
    while sel.get_map():
        for key, _ in sel.select(timeout=1.0):
            w = key.data
            line = w.proc.stdout.readline()
            if not line:
                finish(w, None)
            elif line.startswith(_TAG):
                answer = json.loads(line[len(_TAG):])
                assert answer["seed"] == w.pending.popleft()
                w.since = time.monotonic()
                tally.add(answer)
                if answer["report"] and (verbose or answer["status"] != "ok"):
                    print(answer["report"] + "\n", flush=True)
        for key in list(sel.get_map().values()):
            w = key.data
            if time.monotonic() - w.since > timeout:
                finish(w, f"timed out after {timeout:.0f} s")
        if time.monotonic() - last_note > 60:
            last_note = time.monotonic()
            print(f"[fuzz] {tally.generated}/{len(seeds)} done", file=sys.stderr, flush=True)
    return tally


def replay(
    seed: int, backends: Sequence[str] = oracle.BACKENDS, minimize: bool = False
) -> oracle.Outcome:
    """Check the case of `seed` again and print its report (and a minimized repro)."""
    case, outcome = oracle.check_seed(seed, backends)
    print(oracle.report(case, outcome))
    if minimize and outcome.status in ("mismatch", "crash"):
        failure = next(f for f in outcome.failures if f.kind == outcome.status)
        small = minimize_case(case, failure)
        print("\n=== minimized ===\n" + repro_script(small, failure.backend))
    return outcome


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m nncfuse.fuzz", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-n", type=int, default=1000, help="programs to run")
    parser.add_argument("--seed", type=int, default=None, help="first seed (default: random)")
    parser.add_argument("--backend", default="both",
                        help="llvm, interp or both; add sizes, state, autocast or grad for "
                             "those checks")
    parser.add_argument("-j", "--jobs", type=int, default=1, help="worker processes")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds per case")
    parser.add_argument("--recycle", type=int, default=500, help="cases per worker process")
    parser.add_argument("--quiet", action="store_true", help="no reports for noise")
    parser.add_argument("--replay", type=int, default=None, help="check one seed, in process")
    parser.add_argument("--minimize", action="store_true", help="with --replay: minimize")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    backends = oracle.BACKENDS if args.backend == "both" else tuple(args.backend.split(","))
    if args.worker:
        return _worker(backends)
    if args.replay is not None:
        outcome = replay(args.replay, backends, minimize=args.minimize)
        return 1 if outcome.status in ("mismatch", "crash", "invalid") else 0
    first = args.seed if args.seed is not None else int.from_bytes(os.urandom(3), "little")
    print(f"[fuzz] seeds {first}..{first + args.n - 1}, backends {','.join(backends)}",
          file=sys.stderr, flush=True)
    started = time.monotonic()
    tally = run(range(first, first + args.n), backends, args.jobs, args.timeout, args.recycle,
                verbose=not args.quiet)
    print(tally.summary())
    print(f"seeds {first}..{first + args.n - 1}, {time.monotonic() - started:.0f} s")
    return 1 if tally.failed else 0
