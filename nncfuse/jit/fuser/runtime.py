"""runtime: each compiled fusion group as a custom op the TorchScript interpreter can run.

For a kernel named `fused_mul_sin_mul` this registers, through
`torch.library`, an op `nncfuse::fused_mul_sin_mul(Tensor i0, ...) -> Tensor`
whose Python implementation allocates the outputs (with the strides eager
PyTorch would give them) and calls the kernel's machine code. A graph node of
that kind runs the kernel; it keeps the group's graph as its `Subgraph`
attribute, so the graph prints `with nncfuse::fused_mul_sin_mul_0 = graph(...)`.
Op names are unique in the process: a second kernel with the same name gets
a `_k<n>` suffix.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Sequence
from typing import Any

import torch

from ...tensorexpr.codegen.entry import ArgSource, ReturnOne, ReturnTuple
from ...tensorexpr.kernel import TensorExprKernel

_lib = torch.library.Library("nncfuse", "FRAGMENT")
_kernels: dict[str, TensorExprKernel] = {}  # op kind -> the kernel it runs
_serial = itertools.count(1)
_lock = threading.Lock()  # finding a free op name and taking it are one step, whatever the threads
_SCHEMA_TYPES = {"TensorType": "Tensor", "FloatType": "float", "IntType": "int", "BoolType": "bool"}


def is_fused_op(node: Any) -> bool:
    return node.kind() in _kernels


def kernel_of(node: Any) -> TensorExprKernel:
    """The kernel a fused-op node runs."""
    return _kernels[node.kind()]


def kernel_of_kind(kind: str) -> TensorExprKernel:
    """The kernel that fused-op nodes of `kind` run."""
    return _kernels[kind]


def register_kernel(kernel: TensorExprKernel, inputs: Sequence[Any], n_outputs: int) -> str:
    """Register an op running `kernel` on values typed like `inputs`; return its node kind."""
    with _lock:
        return _register(kernel, inputs, n_outputs)


def _register(kernel: TensorExprKernel, inputs: Sequence[Any], n_outputs: int) -> str:
    name = kernel.name
    while f"nncfuse::{name}" in _kernels:
        name = f"{kernel.name}_k{next(_serial)}"
    written = kernel.lowered.written  # inputs it stores into: mutable in the schema
    args = ", ".join(
        _SCHEMA_TYPES[v.type().kind()] + (f"(w{k}!)" if k in written else "") + f" i{k}"
        for k, v in enumerate(inputs)
    )
    rets = "Tensor" if n_outputs == 1 else "(" + ", ".join(["Tensor"] * n_outputs) + ")"
    _lib.define(f"{name}({args}) -> {rets}")
    entry = kernel.entry(
        [ArgSource(k) for k in range(len(inputs))],
        ReturnOne(0) if n_outputs == 1 else ReturnTuple(tuple(range(n_outputs))),
    )
    if n_outputs:
        _lib.impl(name, lambda *args: entry(args), "CompositeExplicitAutograd")
    else:  # a group that only writes into its inputs
        _lib.impl(name, lambda *args: (entry(args), None)[1], "CompositeExplicitAutograd")
    kind = f"nncfuse::{name}"
    _kernels[kind] = kernel
    return kind
