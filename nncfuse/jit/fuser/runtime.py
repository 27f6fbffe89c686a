"""runtime: each compiled fusion group as a custom op the TorchScript interpreter can run.

For a kernel named `fused_mul_sin_mul` this registers, through
`torch.library`, an op `nncfuse::fused_mul_sin_mul(Tensor i0, ...) -> Tensor`
whose Python implementation allocates the outputs (with the strides eager
PyTorch would give them) and calls the kernel's machine code. A graph node of
that kind runs the kernel; it keeps the group's graph as its `Subgraph`
attribute, so the graph prints `with nncfuse::fused_mul_sin_mul_0 = graph(...)`.

Lifetime. A `FusedOp` is a kernel and its op: the op is defined by a
`torch.library.Library` of its own, which deregisters it when it is freed, so
an op lives exactly as long as its `FusedOp`. A graph cannot hold Python
objects, so whoever keeps a graph with fused nodes keeps their `FusedOp`s (a
policy keeps those of its plans: `fuser.tensorexpr_fuser.fuse_tensor_exprs`'s
`keep`); the table of kinds here holds them weakly. Op names are unique among
the live ops: a second kernel with the same name gets the lowest free `_k<n>`
suffix, and a freed op's name is taken again (TorchScript interns every node
kind it meets, forever: reusing names bounds that table).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Sequence
from typing import Any

import torch

from ...tensorexpr.codegen.entry import ArgSource, ReturnOne, ReturnTuple
from ...tensorexpr.kernel import TensorExprKernel

#: op kind -> the live FusedOp that runs it
_kernels: weakref.WeakValueDictionary[str, FusedOp] = weakref.WeakValueDictionary()
#: names of the registered ops: a name is free again once its op is deregistered
_taken: set[str] = set()
#: finding a free op name and taking it are one step, whatever the threads; re-entrant, as a
#: freed op's finalizer (`_release`) may run in a thread that holds it (a collection)
_lock = threading.RLock()
_SCHEMA_TYPES = {"TensorType": "Tensor", "FloatType": "float", "IntType": "int", "BoolType": "bool"}


class FusedOp:
    """A kernel, and once `register`ed the custom op (node kind `kind`) that runs it; the op
    is deregistered when this object is freed."""

    def __init__(self, kernel: TensorExprKernel):
        self.kernel = kernel
        self.kind: str | None = None

    def register(self, inputs: Sequence[Any], n_outputs: int) -> str:
        """Register the op for values typed like `inputs` (once); return its node kind."""
        with _lock:
            if self.kind is None:
                self._register(inputs, n_outputs)
            return self.kind  # type: ignore[return-value]

    def _register(self, inputs: Sequence[Any], n_outputs: int) -> None:
        kernel = self.kernel
        name, suffix = kernel.name, 0
        while name in _taken:
            suffix += 1
            name = f"{kernel.name}_k{suffix}"
        written = kernel.lowered.written  # inputs it stores into: mutable in the schema
        args = ", ".join(
            _SCHEMA_TYPES[v.type().kind()] + (f"(w{k}!)" if k in written else "") + f" i{k}"
            for k, v in enumerate(inputs)
        )
        rets = "Tensor" if n_outputs == 1 else "(" + ", ".join(["Tensor"] * n_outputs) + ")"
        library = torch.library.Library("nncfuse", "FRAGMENT")
        library.define(f"{name}({args}) -> {rets}")
        entry = kernel.entry(
            [ArgSource(k) for k in range(len(inputs))],
            ReturnOne(0) if n_outputs == 1 else ReturnTuple(tuple(range(n_outputs))),
        )
        if n_outputs:
            library.impl(name, lambda *args: entry(args), "CompositeExplicitAutograd")
        else:  # a group that only writes into its inputs
            library.impl(name, lambda *args: (entry(args), None)[1], "CompositeExplicitAutograd")
        _taken.add(name)
        # The op goes with this object, and its name is free again only once it is gone.
        weakref.finalize(self, _release, library, name).atexit = False  # exit frees all
        self.kind = f"nncfuse::{name}"
        _kernels[self.kind] = self


def _release(library: torch.library.Library, name: str) -> None:
    """Deregister a freed FusedOp's op, then free its name."""
    library._destroy()
    with _lock:
        _taken.discard(name)


def is_fused_op(node: Any) -> bool:
    """Whether `node` runs a kernel: also in a graph kept after the function that made it
    (`graph_for`'s), whose kernels may be gone (`kernel_of` needs them)."""
    return node.kind().startswith("nncfuse::fused")  # every kernel's name: `graph_lowering`


def is_fused_op_kind(kind: str) -> bool:
    """Whether `kind` is the kind of a live fused op."""
    return kind in _kernels


def kernel_of(node: Any) -> TensorExprKernel:
    """The kernel a fused-op node runs, while the function or policy that made it lives."""
    return kernel_of_kind(node.kind())


def kernel_of_kind(kind: str) -> TensorExprKernel:
    """The kernel that fused-op nodes of `kind` run."""
    op = _kernels.get(kind)
    if op is None:
        raise KeyError(f"{kind}: no such kernel; it is freed with the last function (or "
                       "policy) whose plans run it")
    return op.kernel


def op_of_kind(kind: str) -> FusedOp:
    """The live FusedOp that fused-op nodes of `kind` run: what keeps it registered."""
    return _kernels[kind]


def register_kernel(kernel: TensorExprKernel, inputs: Sequence[Any], n_outputs: int) -> str:
    """Register an op running `kernel` on values typed like `inputs`; return its node kind.
    The op stays for the life of the process (`FusedOp` for one that is freed)."""
    op = FusedOp(kernel)
    _pinned.append(op)
    return op.register(inputs, n_outputs)


#: ops registered through `register_kernel`, or fused without a `keep`: never freed
_pinned: list[FusedOp] = []


def pin(ops: Sequence[FusedOp]) -> None:
    """Keep `ops` for the life of the process (their graphs' owner is not known)."""
    with _lock:
        _pinned.extend(ops)
