"""Where nncfuse's training step spends its time: each fused kernel of the forward and backward
graphs against the ATen ops it replaces, the GEMMs and copies left outside kernels, and the
graphs' own overhead.

    python benchmarks/training_kernels.py                     # the MLP and the block, both ways
    python benchmarks/training_kernels.py --workloads block --contenders nncfuse-jit
    python benchmarks/training_kernels.py --gemms --contenders eager,compile,nncfuse-jit
    python benchmarks/training_kernels.py --models bert --contenders nncfuse-backend
    python benchmarks/training_kernels.py --ops --models llama --contenders compile,nncfuse-jit

Per workload and contender (`nncfuse-backend`, `nncfuse-jit`), after a few training steps of
`training.py`'s workload, every optimized graph (forward, backward) is taken apart: each
fusion group runs alone, on random inputs of the types its guard checks, first as the
kernel and then as its fallback graph (the same ATen ops, unfused, in the TorchScript
interpreter); each op left outside the groups is counted by kind. Times are the process's
CPU time per call (best of rounds: one thread, other processes' load does not count), so
they add up to less than a step, which also pays for cold caches, allocation, autograd and
the optimizer. The "ATen ops" are those of the group's own graph, which AOTAutograd has
decomposed (a GELU's backward is a dozen elementwise ops there, one `gelu_backward` kernel in
eager): a kernel faster than them need not be faster than eager's step.

`--gemms` instead splits each contender's step (eager and torch.compile too) into its GEMMs
and the rest: every GEMM one step calls (`mm`, `addmm`, `bmm`, ..., inside nncfuse's kernels
too, as their external calls), each timed alone on random inputs of its layout; the rest is
the step's time less theirs (elementwise work, reductions, allocation, autograd, Python).

`--ops` profiles each contender's step as it runs (torch.profiler; Inductor's kernels
recorded too): the self time per step of each op, fused kernel and wrapper, side by side,
the least of interleaved rounds (the profiler reads a wall clock: on a loaded machine
repeat it; it also adds time to every op it records, ~2 us to an ATen op and ~17 us to a
call of nncfuse's kernel ops, whose implementation is Python: a kind's total is an upper
bound, not a cost), and the same summed by kind (GEMMs, attention, fused kernels, fills, copies,
views and allocations, ...). All contenders are built before any runs: resetting Dynamo
between them would make the earlier ones compile again inside the profile.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings
from collections import Counter
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import training  # noqa: E402 - the workloads and contenders of the training benchmark

import nncfuse  # noqa: E402
from nncfuse.jit.fuser import runtime  # noqa: E402
from nncfuse.jit.specialize import fxgraph  # noqa: E402
from nncfuse.tensorexpr.codegen.entry import ArgSource  # noqa: E402

#: ops that move no data: not worth a line
_VIEWS = {"view", "t", "alias", "transpose", "expand", "_unsafe_view", "permute", "reshape",
          "unsqueeze", "squeeze", "split", "chunk", "select", "slice", "TupleConstruct",
          "TupleUnpack", "ListConstruct", "ListUnpack", "Constant", "TypeCheck", "If"}


def cpu_time(fn: Callable[[], Any], budget_s: float = 0.02, rounds: int = 5) -> float:
    """Seconds of this thread's CPU time per call of `fn`, best of `rounds` batches."""
    fn()
    start = time.thread_time()
    fn()
    once = max(time.thread_time() - start, 1e-7)
    n = max(1, int(budget_s / once))
    best = float("inf")
    for _ in range(rounds):
        start = time.thread_time()
        for _ in range(n):
            fn()
        best = min(best, (time.thread_time() - start) / n)
    return best


def example(value: Any) -> Any:
    """A random value of `value`'s type (a complete tensor type), or None."""
    t = value.type()
    if not isinstance(t, torch._C.TensorType) or t.sizes() is None or t.strides() is None:
        return None
    dtype = t.dtype()
    out = torch.empty_strided(t.sizes(), t.strides(), dtype=dtype)
    if dtype.is_floating_point:
        out.normal_()
    elif dtype == torch.bool:
        out.random_(0, 2)
    else:
        out.random_(0, 8)
    return out


def kernels_of(graph: torch._C.Graph) -> list[tuple[str, Any, list[Any] | None, list[str]]]:
    """(name, kernel, random inputs or None, the ATen ops it replaces) for each fusion group
    of `graph`; inputs are None where a type is not a complete tensor type."""
    rows = []
    for node in nncfuse.fusion_groups(graph):
        kernel = runtime.kernel_of(node)
        inputs = [example(v) for v in node.inputs()]
        ops = [n.kind().split("::")[1] for n in kernel.graph.nodes()
               if n.kind().startswith("aten::")]
        rows.append((node.kind().split("::")[1], kernel,
                     None if any(x is None for x in inputs) else inputs,
                     [o for o in ops if o not in _VIEWS]))
    return rows


def groups_of(graph: torch._C.Graph) -> list[tuple[str, float, float, list[str]]]:
    """(name, kernel seconds, ATen seconds, the ATen ops) for each fusion group of `graph`."""
    rows = []
    for name, kernel, inputs, ops in kernels_of(graph):
        if inputs is None:
            rows.append((name, float("nan"), float("nan"), ops))
            continue
        fused = cpu_time(lambda: kernel.call(inputs))  # noqa: B023 - timed here, not later
        unfused = cpu_time(lambda: kernel.fallback(inputs))  # noqa: B023
        rows.append((name, fused, unfused, ops))
    return rows


def outside(graph: torch._C.Graph) -> Counter[str]:
    """The ops of `graph` that run outside fusion groups (in either branch of no guard), by
    kind, views and control left out."""
    kinds: Counter[str] = Counter()
    for node in graph.nodes():  # top level only: the guards' fallback branches do not run
        kind = node.kind().split("::")[-1]
        if node.kind().startswith("aten::") and kind not in _VIEWS:
            kinds[kind] += 1
    return kinds


def graphs_of(step: training.Step) -> list[tuple[str, torch._C.Graph]]:
    """The optimized graphs a contender's steps ran, with their kinds: those of `nncfuse.jit`'s
    plans under autograd (either mechanism: "forward", "backward"), or the backend's
    (`compiled_graphs`: "forward", "backward", "inference")."""
    policy = getattr(step.fn, "policy", None)
    if policy is None:
        return [(c.kind, g) for c in fxgraph.compiled_graphs() for g in c.graphs()]
    found: list[tuple[str, torch._C.Graph]] = []
    for plan in list(policy.plans.values()):
        if hasattr(plan, "fused_graphs"):
            forward, backward = plan.fused_graphs()
            found += [("forward", g) for g in forward] + [("backward", g) for g in backward]
    return found


def report(name: str, contender: str, workload: tuple[Any, Any]) -> None:
    model, inputs = workload
    training._reset()
    fxgraph.clear_compiled_graphs()
    _, step, _ = training.gradients_after_one_step(contender, model, inputs)
    for _ in range(3):
        step()
    print(f"\n{name}, {contender}: step {cpu_time(step, 0.2, 3) * 1e6:.0f} us")
    print(f"  {'kernel':<40}{'nncfuse':>10}{'ATen ops':>10}{'ratio':>8}  ops it replaces")
    total_k = total_a = 0.0
    for kind, graph in graphs_of(step):
        print(f"  -- {kind} graph; outside kernels: " + ", ".join(
            f"{k} x{n}" if n > 1 else k for k, n in sorted(outside(graph).items())))
        for kernel, fused, unfused, ops in groups_of(graph):
            if fused == fused:  # not NaN
                total_k += fused
                total_a += unfused
            print(f"  {kernel[:40]:<40}{fused * 1e6:10.1f}{unfused * 1e6:10.1f}"
                  f"{unfused / fused:7.2f}x  {' '.join(ops)[:60]}")
    print(f"  {'all kernels':<40}{total_k * 1e6:10.1f}{total_a * 1e6:10.1f}"
          f"{total_a / max(total_k, 1e-12):7.2f}x")


_GEMMS = {"mm", "addmm", "bmm", "baddbmm", "linear", "matmul", "convolution",
          "_convolution", "conv2d", "convolution_backward", "mkldnn_convolution"}


class _GemmCalls(TorchDispatchMode):
    """Records (op, its arguments with tensors as (sizes, strides, dtype)) of every GEMM or
    convolution dispatched, and of those nncfuse's kernels call as external steps."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[Any, list[Any], dict[str, Any]]] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func.namespace == "nncfuse":
            kernel = runtime.kernel_of_kind(f"nncfuse::{func.__name__.split('.')[0]}")
            for step in kernel.interface.externals:
                if all(not isinstance(a, ArgSource) or a.index < len(args) for a in step.args):
                    self.calls.append((step.fn, [_spec(args[a.index]) if isinstance(a, ArgSource)
                                                 else a.value for a in step.args], {}))
        elif func.__name__.split(".")[0] in _GEMMS:
            self.calls.append((func, [_spec(a) for a in args],
                               {k: _spec(v) for k, v in kwargs.items()}))
        return func(*args, **kwargs)


def _spec(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return _Layout(tuple(value.shape), tuple(value.stride()), value.dtype)
    if isinstance(value, (list, tuple)):
        return type(value)(_spec(v) for v in value)
    return value


class _Layout(tuple):
    """A tensor argument's (sizes, strides, dtype), made again as a random tensor."""

    def __new__(cls, *fields: Any) -> _Layout:
        return super().__new__(cls, fields)

    def make(self) -> torch.Tensor:
        sizes, strides, dtype = self
        out = torch.empty_strided(sizes, strides, dtype=dtype)
        return out.normal_() if dtype.is_floating_point else out.zero_()


def _made(value: Any) -> Any:
    if isinstance(value, _Layout):
        return value.make()
    if isinstance(value, (list, tuple)):
        return type(value)(_made(v) for v in value)
    return value


def gemm_report(name: str, contenders: list[str], workload: tuple[Any, Any]) -> None:
    """Each contender's step: its GEMMs, each timed alone, and the rest."""
    print(f"\n{name}: a step's GEMMs (each timed alone) and the rest, CPU time per step")
    print(f"  {'contender':<17}{'step':>10}{'GEMMs':>10}{'calls':>7}{'rest':>10}")
    model, inputs = workload
    for contender in contenders:
        training._reset()
        _, step, _ = training.gradients_after_one_step(contender, model, inputs)
        for _ in range(3):
            step()
        recorder = _GemmCalls()
        with recorder:
            step()
        gemms = 0.0
        for fn, args, kwargs in recorder.calls:
            real, named = _made(args), _made(kwargs)
            with torch.no_grad():
                gemms += cpu_time(lambda: fn(*real, **named))  # noqa: B023 - timed here
        total = cpu_time(step, 0.2, 3)
        print(f"  {contender:<17}{total * 1e6:10.0f}{gemms * 1e6:10.0f}{len(recorder.calls):7d}"
              f"{(total - gemms) * 1e6:10.0f}")


#: --ops: an op's kind, by the first rule whose test its name passes
_KINDS: tuple[tuple[str, Callable[[str], bool]], ...] = (
    ("GEMMs", lambda k: k in {f"aten::{g}" for g in _GEMMS}),
    ("attention", lambda k: k.startswith("aten::_scaled_dot_product")),
    ("fused kernels", lambda k: k.startswith("nncfuse::") or "_cpp_fused_" in k),
    ("fills", lambda k: k in {"aten::fill_", "aten::zero_", "aten::zeros"}),
    ("copies", lambda k: k in {"aten::copy_", "aten::clone"}),
    ("views, allocation", lambda k: k.startswith("aten::") and k[6:] in _VIEWS | {
        "as_strided", "empty", "empty_strided", "empty_like", "detach", "resolve_conj"}),
    ("optimizer", lambda k: k.startswith("Optimizer.") or k == "aten::add_"),
    ("other ATen ops", lambda k: k.startswith("aten::")),
    ("autograd, wrappers", lambda k: True),
)


def step_ops(steps: dict[str, Callable[[], Any]], rounds: int = 3,
             per_round: int = 5) -> dict[str, dict[str, tuple[float, float]]]:
    """Per contender, op name -> (self seconds per step, calls per step): the least over
    `rounds` interleaved profiles of `per_round` steps each."""
    from torch.profiler import ProfilerActivity, profile

    best: dict[str, dict[str, tuple[float, float]]] = {c: {} for c in steps}
    for _ in range(rounds):
        for c, step in steps.items():
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                for _ in range(per_round):
                    step()
            for e in prof.key_averages():
                t = e.self_cpu_time_total * 1e-6 / per_round
                if t < best[c].get(e.key, (float("inf"), 0.0))[0]:
                    best[c][e.key] = (t, e.count / per_round)
    return best


def kind_of(op: str) -> str:
    return next(kind for kind, test in _KINDS if test(op))


def ops_report(name: str, contenders: list[str], workload: tuple[Any, Any],
               rows: int = 40) -> None:
    model, inputs = workload
    training._reset()  # once: see the docstring
    # Read when Inductor generates its code: set after compiling, its kernels go unrecorded.
    torch._inductor.config.cpp.enable_kernel_profile = True
    steps = {}
    for contender in contenders:
        _, steps[contender], _ = training.gradients_after_one_step(contender, model, inputs)
        for _ in range(3):
            steps[contender]()
    best = step_ops(steps)
    print(f"\n{name}: self time per step (us, least of rounds) x calls per step")
    print(f"  {'op':<56}" + "".join(f"{c[:16]:>17}" for c in contenders))
    ops = sorted({op for b in best.values() for op in b},
                 key=lambda op: -max(b.get(op, (0.0, 0.0))[0] for b in best.values()))
    for op in ops[:rows]:
        print(f"  {op[:56]:<56}" + "".join(
            f"{best[c].get(op, (0.0, 0.0))[0] * 1e6:10.0f} x{best[c].get(op, (0, 0))[1]:<5.0f}"
            for c in contenders))
    print(f"  {'-- by kind':<56}")
    for kind in [k for k, _ in _KINDS] + ["all"]:
        sums = [sum(t for op, (t, _) in best[c].items() if kind in ("all", kind_of(op)))
                for c in contenders]
        print(f"  {kind:<56}" + "".join(f"{t * 1e6:10.0f}{'':7}" for t in sums))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workloads", default="mlp,block")
    p.add_argument("--models", default="",
                   help="also these models of models.py (as training.py's --models)")
    p.add_argument("--contenders", default="nncfuse-backend,nncfuse-jit")  # (or nncfuse-jit-aot)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--gemms", action="store_true",
                   help="split each contender's step into its GEMMs and the rest")
    p.add_argument("--ops", action="store_true",
                   help="each contender's step profiled: self time per op, side by side")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    warnings.simplefilter("ignore")
    chosen = {k: v for k, v in training.workloads(False).items()
              if k in args.workloads.split(",")}
    if args.models:
        chosen.update(training.model_workloads(args.models.split(","), False))
    for name, workload in chosen.items():
        if args.ops:
            ops_report(name, args.contenders.split(","), workload)
            continue
        if args.gemms:
            gemm_report(name, args.contenders.split(","), workload)
            continue
        for contender in args.contenders.split(","):
            report(name, contender, workload)


if __name__ == "__main__":
    main()
