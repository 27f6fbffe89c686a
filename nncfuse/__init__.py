"""nncfuse: a JIT tensor-expression fuser for PyTorch on the CPU.

    import nncfuse

    @nncfuse.jit
    def f(a, b):
        return torch.sin(a * b) * b

    f(x, y)                     # profiles, then fuses and compiles with LLVM
    f.graph_for(x, y)           # the optimized TorchScript graph
    nncfuse.fusion_groups(g)    # the fusion-group nodes of a graph
    print(nncfuse.explain(f, x, y))  # what fused, what stayed outside and why

    torch.compile(model, backend="nncfuse")  # an entry point registers it (nncfuse/backend.py)

Set NNCFUSE_LOG_LEVEL (e.g. "tensorexpr_fuser:>>kernel:>>llvm_codegen") to
watch every stage, NNCFUSE_DONT_USE_LLVM=1 to run kernels in the IR
interpreter, NNCFUSE_DISABLE=1 to run everything unfused, NNCFUSE_VERIFY=1
to verify the IR after every schedule pass, NNCFUSE_STRICT=1 to raise
StrictFusionError where a compute node stays unfused.
"""

from __future__ import annotations

from typing import Any

import torch

from .config import VERSION, Options
from .explain import Report, StrictFusionError, explain
from .jit.frontend.freezing import FrozenFunction
from .jit.frontend.function import FusedFunction
from .jit.fuser.tensorexpr_fuser import fusion_groups
from .tensorexpr.kernel import TensorExprKernel

__all__ = ["jit", "explain", "fusion_groups", "FusedFunction", "FrozenFunction",
           "TensorExprKernel", "Options", "Report", "StrictFusionError"]
__version__ = VERSION


def jit(fn: Any = None, **options: Any) -> Any:
    """Fuse `fn`: a Python function, a ScriptFunction (scripted or traced) or a module.

    Options (see `Options`): min_group_size (2), profiling_runs (1),
    max_specializations (12), verify (False), strict (False: see `nncfuse.explain`),
    freeze (False: for an eval-mode nn.Module, True runs it frozen: `jit/frontend/freezing.py`).
    Usable as `@nncfuse.jit` or `@nncfuse.jit(...)`.
    """
    if fn is None:
        return lambda f: jit(f, **options)
    opts = Options.from_env(**options)
    if opts.freeze and isinstance(fn, torch.nn.Module):
        return FrozenFunction(fn, opts, check_values=opts.freeze == "checked")
    return FusedFunction(fn, opts)
