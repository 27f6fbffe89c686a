"""Where compile time goes: one first training step, or the first three inference calls of a
model, split by pipeline stage (process CPU time, each stage's own, nested stages apart).

    python benchmarks/compile_time.py block nncfuse-jit --steps 3   # training.py's workloads
    python benchmarks/compile_time.py mlp nncfuse-backend
    python benchmarks/compile_time.py mobilenet nncfuse-backend --quick    # models.py's
    python benchmarks/compile_time.py bert inference             # nncfuse.jit(traced), no grad
    python benchmarks/compile_time.py bert nncfuse-jit-aot       # the jit through AOTAutograd

Stages (wrapped functions): AOTAutograd's joint trace (`nncfuse-jit-aot`, the backend) and
the partitioner; the FX -> TorchScript conversion; profiling runs (their instrumented graph
run included); the fuser and guards; lowering; the schedule's passes; the LLVM IR built in
Python; LLVM's parse and verify, optimization pipeline and machine code; the MCJIT engine;
the generated entry; for `nncfuse-jit` (jit/training/autodiff.py, whose first step profiles and
whose second compiles: `--steps 3`) also the differentiable subgraphs, autodiff itself,
the decompositions and the rest of building its program. "rest" is everything else: for
the backend Dynamo and AOTAutograd's trace, for every contender the unfused ops a
profiling run executes outside nncfuse's code.
Kernels are built by one thread (`guard.COMPILE_THREADS = 1`) so that CPU time divides by
stage. Python's garbage collections count in the stage they interrupt; a last line says how
long they took (a full one, over every object of the process, takes ~150 ms here: the objects
a stage keeps alive decide whether one runs). Nothing is compared here: for before/after, run
it on both trees.
"""

from __future__ import annotations

import argparse
import collections
import copy
import gc
import importlib
import os
import sys
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch

import nncfuse

Totals = collections.Counter[str]


def _wrap(owner: Any, name: str, label: str, totals: Totals, stack: list[float]) -> None:
    """Replace `owner.name` by a function that adds its own CPU time to `totals[label]`."""
    fn = getattr(owner, name)

    def timed(*args: Any, **kwargs: Any) -> Any:
        start = time.process_time()
        stack.append(0.0)
        try:
            return fn(*args, **kwargs)
        finally:
            inner = stack.pop()
            spent = time.process_time() - start
            totals[label] += spent - inner
            if stack:
                stack[-1] += spent

    setattr(owner, name, timed)


def instrument(totals: Totals) -> None:
    """Time the stages (see the module docstring) into `totals`."""
    import torch._functorch.aot_autograd as aot
    import torch._functorch.partitioners as partitioners

    import nncfuse.backend as backend
    from nncfuse.jit.fuser import guard
    from nncfuse.jit.specialize import fxgraph, policy
    from nncfuse.jit.training import autodiff
    from nncfuse.tensorexpr import kernel
    from nncfuse.tensorexpr.codegen import llvm_codegen, llvm_jit

    guard.COMPILE_THREADS = 1
    stack: list[float] = []
    for owner, name, label in [
        (aot, "aot_export_joint_simple", "AOTAutograd trace (jit)"),
        (partitioners, "min_cut_rematerialization_partition", "partition"),
        (backend, "min_cut_rematerialization_partition", "partition"),
        (fxgraph, "_convert", "FX -> TorchScript"),
        (policy.Policy, "_profile", "profiling runs"),
        (policy, "fuse_tensor_exprs", "fuser and guards"),
        (kernel, "lower_graph", "lowering"),
        (kernel.TensorExprKernel, "_run_schedule", "passes"),
        (kernel, "compile_stmt", "LLVM IR (Python)"),
        (llvm_jit, "_optimized", "LLVM parse, verify"),
        (llvm_jit, "optimize", "LLVM optimization"),
        (llvm_jit, "_object_code", "LLVM machine code"),
        (llvm_codegen, "compile_ir", "MCJIT engine"),
        (kernel, "make_entry", "entry"),
        (autodiff, "_profiled", "autodiff: profile and build"),
        (torch._C, "_jit_pass_create_autodiff_subgraphs", "autodiff: subgraphs"),
        (torch._C, "_jit_differentiate", "autodiff: differentiate"),
        (autodiff, "decompose", "autodiff: decompositions"),
    ]:
        _wrap(owner, name, label, totals, stack)


def collections_timed(totals: Totals) -> None:
    """Add the CPU time of Python's garbage collections to `totals` (by generation)."""
    started: list[float] = []

    def callback(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started[:] = [time.process_time()]
        elif started:
            totals[f"generation {info['generation']}"] += time.process_time() - started[0]
            totals[f"generation {info['generation']} runs"] += 1

    gc.callbacks.append(callback)


def training_step(name: str, contender: str, quick: bool, steps: int = 1) -> Callable[[], None]:
    """The first `steps` steps of training.py's `contender` on workload `name`, to be timed."""
    import training

    training._warm_up()
    chosen = (training.workloads(quick) if name in ("mlp", "block")
              else training.model_workloads([name], quick))
    model, inputs = chosen[name]
    model = copy.deepcopy(model)

    def step() -> None:
        fn = training.build(contender, model, inputs)
        for _ in range(steps):
            training.loss(fn(*inputs)).backward()

    return step


def inference_calls(name: str, quick: bool) -> Callable[[], None]:
    """The first three calls of `nncfuse.jit(traced)` on models.py's model `name`, no grad."""
    models = importlib.import_module("models")
    (spec,) = [s for s in models.MODELS if s.name == name]
    torch.manual_seed(0)
    model, inputs = spec.build(quick)
    model.eval()
    with torch.no_grad():
        traced = torch.jit.trace(model, inputs, strict=False)
        traced(*inputs)

    def calls() -> None:
        fn = nncfuse.jit(traced)
        with torch.no_grad():
            for _ in range(3):
                fn(*inputs)

    return calls


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("workload", help="mlp, block, or a models.py model (bert, mobilenet, ...)")
    p.add_argument("contender", help="nncfuse-jit, nncfuse-jit-aot, nncfuse-backend, or "
                                     "inference")
    p.add_argument("--quick", action="store_true", help="the small shapes")
    p.add_argument("--steps", type=int, default=1, help="training steps timed (from the first)")
    args = p.parse_args(argv)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    totals: Totals = collections.Counter()
    instrument(totals)
    run = (inference_calls(args.workload, args.quick) if args.contender == "inference"
           else training_step(args.workload, args.contender, args.quick, args.steps))
    collected: Totals = collections.Counter()
    collections_timed(collected)
    totals.clear()
    collected.clear()
    start = time.process_time()
    run()
    total = time.process_time() - start
    print(f"{args.workload}, {args.contender}: {total * 1e3:.0f} ms CPU")
    for label, spent in totals.most_common():
        print(f"  {label:<26}{spent * 1e3:8.0f} ms")
    print(f"  {'rest':<26}{(total - sum(totals.values())) * 1e3:8.0f} ms")
    spent = sum(v for k, v in collected.items() if not k.endswith("runs"))
    runs = ", ".join(f"{int(collected[f'generation {g} runs'])} of generation {g}"
                     for g in range(3) if collected[f"generation {g} runs"])
    print(f"  (of these, garbage collections {spent * 1e3:.0f} ms: {runs or 'none'})")


if __name__ == "__main__":
    main()
