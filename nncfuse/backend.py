"""backend: `torch.compile(model, backend="nncfuse")`, FX graphs through nncfuse's pipeline.

    torch.compile(fn, backend="nncfuse")      # AOTAutograd: inference and training
    torch.compile(fn, backend="nncfuse_ts")   # Dynamo's graphs as they are (no autograd split)

No import is needed: pyproject.toml declares both names in the
`torch_dynamo_backends` entry-point group, and Dynamo imports this module
when a name is first looked up. Importing it also registers them (for a
source checkout that is not installed). `import nncfuse` never imports this
module: it imports `torch._dynamo`, 1.3 s.

Each FX graph Dynamo hands over (a graph break gives several) becomes a
`CompiledGraph` (`jit/specialize/fxgraph.py`, shared with `nncfuse.jit` under autograd):
converted to TorchScript as PyTorch's own `ts_compile` does, without freezing
(parameters stay inputs), then profiled or typed, fused, guarded and compiled
per input signature as `nncfuse.jit` does. Dynamo's guards decide recompiles;
within one graph, nncfuse's TypeCheck guards still protect every kernel, and a
new input signature (Dynamo's `dynamic=True` passes varying sizes to one graph)
is a size class of the policy, with dynamic kernels (see `jit/specialize/fxgraph.py`). A
graph that cannot be converted runs as the FX graph would, and the reason is
logged; it never raises where eager would not.

Training goes through AOTAutograd by default, as Inductor's does (below). With
`make_backend(autograd="autodiff")` (or NNCFUSE_AUTOGRAD=autodiff), a training graph
is not traced by AOTAutograd: it converts as "nncfuse_ts"'s do, and its calls that need
autograd run as `nncfuse.jit(fn, autograd="autodiff")`'s (`jit/training/autodiff.py`): profiled,
then TorchScript's autodiff splits each differentiable graph into an `f` and a `df`, each
fused. Its first steps are shorter (no trace, no partition); a graph that cannot be
converted goes through AOTAutograd as below, the reason logged.

"nncfuse" goes through AOTAutograd, as Inductor does: nncfuse's kernels record
no autograd, so training is fused when the graph is split into a forward and a
backward of plain ATen ops, each run with grad off. The forward, backward and
inference graphs each go through the path above. The partitioner is
`min_cut_rematerialization_partition`: cheap elementwise work is recomputed in
the backward, inside its fusion groups, instead of saved. A training graph of
plain tensors is traced and split so (`aot_export_joint_simple`) and runs as
`nncfuse.jit`'s programs under autograd do, as one `torch.autograd.Function`
(`autograd.FusedGraph`): AOTAutograd's runtime wrappers around each call (its
argument and output bookkeeping, the autograd function's prologue and epilogue:
~60 us of a 2.4 ms MLP step, ~0.3 ms of a BERT step) are not run. What that
cannot trace (an output that does not require grad or aliases an input, an input
that requires grad written in place, sizes as inputs, tensor subclasses)
goes to AOTAutograd's own runtime, as do inference graphs. The `*_backward`
ops, layer and batch norm, softmax's backward and dropout decompose into
elementwise ops and reductions (`DECOMPOSITIONS`, `jit/specialize/decompose.py`) so that
they fuse; ops with no lowering yet (embedding_dense_backward, convolution_backward,
...) run unfused in ATen.

`NNCFUSE_LOG_LEVEL=backend` logs each graph's conversion and fallbacks;
`>backend` adds, per optimized signature, what fused (nncfuse.explain's
report); `>>backend` the TorchScript graphs. `compiled_graphs()` lists the
graphs compiled lately, for tests and tools.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from importlib.metadata import EntryPoint
from typing import Any

import torch
import torch._dynamo
from torch._dynamo.backends import registry
from torch._dynamo.backends.common import aot_autograd
from torch._functorch.aot_autograd import make_boxed_func
from torch._functorch.partitioners import min_cut_rematerialization_partition

from . import log
from .config import Options
from .jit.specialize import collector, fxgraph
from .jit.specialize.fxgraph import CompiledGraph, brief, clear_compiled_graphs, compiled_graphs
from .jit.training.autodiff import AutodiffPlan
from .jit.training.autograd import FusedGraph

__all__ = ["nncfuse", "nncfuse_ts", "make_backend", "CompiledGraph", "compiled_graphs",
           "clear_compiled_graphs", "DECOMPOSITIONS"]

#: Decomposed before partitioning (`fxgraph.decompositions`)
DECOMPOSITIONS = fxgraph.decompositions()
_log = log.get_logger("backend.py")


# -- the backends --------------------------------------------------------------------------------
def _inner(kind: str, options: Options) -> Callable[..., Any]:
    """An AOTAutograd compiler for `kind` graphs, with the boxed calling convention."""

    def compile_graph(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Any:
        return make_boxed_func(CompiledGraph(gm, example_inputs, kind, options))

    return compile_graph


def make_backend(aot: bool = True, autograd_node: bool = True,
                 **options: Any) -> Callable[..., Any]:
    """A torch.compile backend with these nncfuse options (see `Options`): through
    AOTAutograd (`aot=True`, what "nncfuse" is) or Dynamo's graphs as they are ("nncfuse_ts").
    `autograd_node`: training graphs of plain tensors run as one nncfuse autograd node
    (`FusedGraph`) where they can, not under AOTAutograd's runtime wrappers.
    `autograd="autodiff"`: training graphs run as Dynamo hands them over, TorchScript's
    autodiff differentiating them (`AutodiffPlan`, as `nncfuse.jit` does), no AOTAutograd
    trace; a graph that cannot be converted goes through AOTAutograd (the reason logged)."""
    if "autograd" not in options and not os.environ.get("NNCFUSE_AUTOGRAD", "").strip():
        options["autograd"] = "aot"  # (nncfuse.jit's default is autodiff: see the docstring)
    opts = Options.from_env(**options)
    if not aot:
        return lambda gm, example_inputs: CompiledGraph(gm, example_inputs, "dynamo", opts)
    through_aot = aot_autograd(
        fw_compiler=_inner("forward", opts),
        bw_compiler=_inner("backward", opts),
        inference_compiler=_inner("inference", opts),
        partition_fn=min_cut_rematerialization_partition,
        decompositions=DECOMPOSITIONS,
    )

    def backend(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Any:
        if opts.autograd == "autodiff" and _trains(example_inputs):
            compiled = CompiledGraph(gm, example_inputs, "dynamo", opts, trains=AutodiffPlan)
            if compiled.program is not None:
                return compiled
            _log.dump("Training graph through AOTAutograd, not autodiff: ", compiled.reason)
        if autograd_node and _trains(example_inputs):
            try:
                return FusedGraph(gm, list(example_inputs), opts)
            except Exception as e:  # noqa: BLE001 - AOTAutograd's own runtime then
                _log.dump("Training graph through AOTAutograd's runtime: ", brief(e)[:300])
        # AOTAutograd's trace: no collections (see jit/specialize/collector.py)
        with collector.paused():
            try:
                return through_aot(gm, example_inputs)
            except RuntimeError as e:
                if "modified by an inplace operation" not in str(e):
                    raise
                # The trace runs the backward, and a write to a tensor that autograd saved
                # fails it (Inductor raises here, at the first call). Eager raises at
                # backward(): the graph runs as Dynamo handed it over, where it does.
                _log.dump("Training graph run unfused: ", brief(e)[:300])
                return gm

    return backend


def _trains(example_inputs: Sequence[Any]) -> bool:
    """Whether a graph of these inputs is a training graph that nncfuse's own autograd node can
    run (`FusedGraph`): grad mode, plain tensors only (no sizes, no tensor subclasses), one
    that requires grad. Under autocast too: the trace records eager's casts, and Dynamo
    guards on the autocast state."""
    from torch._subclasses.fake_tensor import FakeTensor

    plain = (torch.Tensor, torch.nn.Parameter, FakeTensor)
    return (torch.is_grad_enabled()
            and all(type(x) in plain for x in example_inputs)
            and any(x.requires_grad for x in example_inputs))


def nncfuse(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Any:
    """The "nncfuse" backend: AOTAutograd, forward and backward (or inference) through nncfuse."""
    return make_backend(aot=True)(gm, example_inputs)


def nncfuse_ts(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Any:
    """The "nncfuse_ts" backend: Dynamo's FX graph to TorchScript to nncfuse, no AOTAutograd
    (inputs that require grad run unfused)."""
    return CompiledGraph(gm, example_inputs, "dynamo", Options.from_env())


def _register() -> None:
    """Register the backends by name, unless Dynamo is loading them from the entry point
    (it registers what the entry point names itself, and refuses a name twice)."""
    for name, fn in (("nncfuse", nncfuse), ("nncfuse_ts", nncfuse_ts)):
        if name not in registry._COMPILER_FNS and not isinstance(
                registry._BACKENDS.get(name), EntryPoint):
            registry.register_backend(fn, name=name)


_register()
