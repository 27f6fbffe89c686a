"""guard: compile each fusion group and run it only on the inputs it was compiled for.

    %25 : Float(1, 1, 128, 128), %26 : bool = prim::TypeCheck[types=[...]](%b.1)
    %27 : Tensor = prim::If(%26)
      block0():
        %z.3 : Float(1, 1, 128, 128) = nncfuse::fused_mul_sin_mul_0(%25)
        -> (%z.3)
      block1():
        %x.2 : Tensor = aten::mul(%b.1, %b.1)
        ...
        -> (%z.2)

`prim::TypeCheck` compares the group's tensor inputs with the profiled types
(dtype, sizes, strides, device, requires_grad); when they match, the
compiled kernel runs; otherwise the group's original nodes (the fallback)
do. Numbers are kernel arguments and need no guard. A group whose kernel
fails to lower or compile is logged and replaced by its nodes, unguarded.

With the `dynamic` option True, a group gets a dynamic kernel where it can
(sizes bound at run time: `tensorexpr/size_symbols.py`), else a static one.
A dynamic kernel's node stands alone, without TypeCheck and If: its entry
checks its own guard (dtype, rank, dims of 1, equal sizes, layout class) on
every call and runs the group's nodes when it fails. Dynamic kernels are
cached by that guard class and the graph's text without its sizes, so one
kernel serves every size of the class.

    %z.3 : Float(8, 1000) = nncfuse::fused_mul_sin_mul_0(%b.1)
"""

from __future__ import annotations

import contextvars
import os
import re
import threading
import weakref
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch

from ... import log
from ...config import Options
from ...tensorexpr.codegen import llvm_jit
from ...tensorexpr.kernel import TensorExprKernel
from ...tensorexpr.lowerings import LoweringError, trials
from ...tensorexpr.meta import TensorMeta, graph_text, inputs_of, is_tensor, outputs_of
from ...tensorexpr.size_symbols import SizeSymbols
from . import runtime
from .subgraph import unmerge

_log = log.get_logger(__file__)
is_fused_op = runtime.is_fused_op


#: Sizes that dynamic kernels keep static (the dims that did not change), set by the policy
#: while it optimizes a signature.
STATIC_SIZES: contextvars.ContextVar[frozenset[int]] = contextvars.ContextVar(
    "STATIC_SIZES", default=frozenset())

#: Threads that build the kernels of one graph's groups, each group a task. Lowering and the
#: passes hold the GIL; LLVM's optimization and machine code (llvmlite) release it and take
#: llvmlite's one lock, so two threads overlap one group's Python with another's LLVM (in the
#: transformer block's training step LLVM is ~60% of building its 14 kernels). 1: one after
#: the other.
COMPILE_THREADS = min(2, os.cpu_count() or 1)

_Key = tuple[str, bool, bool, str]
_Built = runtime.FusedOp | Exception  # a group's kernel, or what building it raised

# Kernels by the text of their graph, names aside: identical groups share one kernel and its
# op, also when two threads (two functions, or two signatures of one) meet them at the same
# time: one compiles while the other waits on the key's lock. Different keys compile in
# parallel. The table holds them weakly: a kernel lives as long as a graph that runs it (its
# owner keeps the `FusedOp`: `guard_fusion_groups`'s `keep`), and a group met after its last
# user is gone compiles again (its object code may still be in `llvm_jit`'s cache).
_compiled: weakref.WeakValueDictionary[_Key, runtime.FusedOp] = weakref.WeakValueDictionary()
#: what building the groups that failed raised, the latest `FAILURES_KEPT`
_failed: OrderedDict[_Key, Exception] = OrderedDict()
FAILURES_KEPT = 256
_compiling: dict[_Key, threading.Lock] = {}  # keys being built, while they are
_table_lock = threading.Lock()  # guards the tables and the registration order of kernels
_pool: list[ThreadPoolExecutor] = []  # made on first use
# A forked child has none of the parent's threads: its pool would take tasks and never run them.
os.register_at_fork(after_in_child=_pool.clear)


def clear_kernel_cache() -> None:
    """Forget compiled kernels (functions already optimized keep theirs), their object code
    (`llvm_jit`) and the outcomes of GEMM trials (`lowerings/trials.py`)."""
    with _table_lock:
        _compiled.clear()
        _failed.clear()
        _compiling.clear()
    trials.clear()
    llvm_jit.clear_compiled()


#: The sizes and strides in a printed tensor type: `Float(8, 1000, strides=[1000, 1], ...`.
_SIZES = re.compile(r"\(([-\d, ]*)strides=\[[-\d, ]*\], ")


def _cache_key(subgraph: torch._C.Graph, options: Options, dynamic: bool) -> _Key:
    """The graph's text with its own value names; for a dynamic kernel without sizes and
    with the guard class of its inputs (`SizeSymbols`) instead. LoweringError when a dynamic
    kernel cannot guard its inputs' layout."""
    text = graph_text(subgraph)
    guards = ""
    if dynamic:
        text = _SIZES.sub("(", text)
        inputs = inputs_of(subgraph)
        metas = [(k, TensorMeta.from_type(v.type())) for k, v in enumerate(inputs)]
        if any(m is None for k, m in metas if is_tensor(inputs[k])):
            raise LoweringError("incomplete input types")
        symbols = SizeSymbols([(k, m) for k, m in metas if m is not None], STATIC_SIZES.get())
        guards = repr([(g.position, [str(s) for s in g.sizes], [str(s) for s in g.strides])
                       for g in symbols.guards])
    return text, options.use_llvm, options.verify, guards


def _compile_all(groups: list[Any], options: Options) -> list[_Built]:
    """For each group, the registered op running its kernel or the exception that building
    it raised (`_build`): the kernels built by `COMPILE_THREADS` threads, registered in the
    groups' order (so that op names do not depend on which thread finished first).

    A task per distinct graph (`_distinct`), the largest first: a thread handed a group
    identical to one another thread builds would wait on its key's lock, idle (BERT's
    training step: 41 groups, 13 kernels), and the largest last would run alone at the end.
    The repeats reuse their first's kernel, here, once it is built."""
    if COMPILE_THREADS < 2 or len(groups) < 2:
        return [_kind(group, _build(group, options)) for group in groups]
    with _table_lock:
        if not _pool:
            _pool.append(ThreadPoolExecutor(COMPILE_THREADS, thread_name_prefix="nncfuse-compile"))
    firsts = sorted(_distinct(groups, options), key=lambda k: -_size(groups[k]))
    # Each task in a copy of this thread's context: STATIC_SIZES is the caller's.
    futures = {k: _pool[0].submit(contextvars.copy_context().run, _build, groups[k], options)
               for k in firsts}
    return [_kind(group, futures[k].result() if k in futures else _build(group, options))
            for k, group in enumerate(groups)]


def _distinct(groups: list[Any], options: Options) -> list[int]:
    """The positions of the groups whose graph no earlier group has (by `_cache_key`'s text:
    identical groups build one kernel); a group with tensor constants is its own."""
    seen: set[_Key] = set()
    firsts = []
    for k, group in enumerate(groups):
        subgraph = group.g("Subgraph")
        if not _has_tensor_constants(subgraph):
            key = _cache_key(subgraph, options, dynamic=False)
            if key in seen:
                continue
            seen.add(key)
        firsts.append(k)
    return firsts


def _size(group: Any) -> int:
    """The number of nodes of `group`'s graph: what building its kernel takes, roughly."""
    return sum(1 for _ in group.g("Subgraph").nodes())


def _build(group: Any, options: Options) -> _Built:
    """`group`'s kernel: with the `dynamic` option, a dynamic kernel where the group can have
    one, else a static one."""
    if options.dynamic is True:
        built = _build_as(group, options, dynamic=True)
        if not isinstance(built, Exception):
            return built
        _log.update("No dynamic kernel, compiling a static one: ", type(built).__name__, ": ",
                    built)
    return _build_as(group, options, dynamic=False)


def _build_as(group: Any, options: Options, dynamic: bool) -> _Built:
    subgraph = group.g("Subgraph")
    if _has_tensor_constants(subgraph):
        # The text does not show a tensor constant's values (a frozen module's weights):
        # such a kernel is its own.
        return _kernel(subgraph, options, dynamic)
    try:
        key = _cache_key(subgraph, options, dynamic)
    except LoweringError as e:
        return e
    with _table_lock:
        lock = _compiling.setdefault(key, threading.Lock())
    try:
        with lock:
            built: _Built | None = _compiled.get(key) or _failed.get(key)
            if built is not None:
                _log.update("Reusing the kernel of an identical group: ",
                            getattr(built, "kind", None) or key[0])
                return built
            built = _kernel(subgraph, options, dynamic)
            with _table_lock:
                if isinstance(built, Exception):
                    _failed[key] = built
                    while len(_failed) > FAILURES_KEPT:
                        _failed.popitem(last=False)
                else:
                    _compiled[key] = built
            return built
    finally:
        with _table_lock:  # (a thread waiting on the lock still has it)
            if _compiling.get(key) is lock:
                del _compiling[key]


def _kernel(subgraph: torch._C.Graph, options: Options, dynamic: bool) -> _Built:
    try:
        static = STATIC_SIZES.get() if dynamic else frozenset()
        return runtime.FusedOp(TensorExprKernel(subgraph.copy(), options, dynamic, static))
    except Exception as e:  # noqa: BLE001 - any failure means: run it unfused
        return e


def _kind(group: Any, built: _Built) -> _Built:
    """`built`'s op, registered for `group`'s inputs on first use; or the exception that
    building or registering it raised."""
    if isinstance(built, Exception):
        return built
    with _table_lock:
        try:
            built.register(inputs_of(group), group.outputsSize())
        except Exception as e:  # noqa: BLE001 - any failure means: run it unfused
            return e
        return built


def _has_tensor_constants(subgraph: torch._C.Graph) -> bool:
    return any(n.kind() == "prim::Constant" and isinstance(n.output().type(), torch._C.TensorType)
               for n in subgraph.nodes())


@dataclass(frozen=True)
class CompileFailure:
    """A fusion group that failed to lower or compile, and now runs unfused."""

    subgraph: torch._C.Graph
    error: Exception

    @property
    def ops(self) -> list[str]:
        return [n.kind() for n in self.subgraph.nodes() if n.kind() != "prim::Constant"]

    def __str__(self) -> str:
        return f"{type(self.error).__name__}: {self.error}"


def guard_fusion_groups(
    graph: torch._C.Graph, groups: list[Any], options: Options,
    keep: list[runtime.FusedOp] | None = None,
) -> list[CompileFailure]:
    """Replace each `prim::TensorExprGroup` in `groups` by a guarded kernel (or its nodes);
    return the groups that failed to compile.

    The ops that `graph` now runs are appended to `keep`, which must live as long as the
    graph (a freed op is deregistered); without it they are never freed."""
    failures = []
    ops = []
    for group, built in zip(groups, _compile_all(groups, options), strict=True):
        if isinstance(built, Exception):
            kind = built
            _log.dump(
                "Fusion group not compiled, running it unfused: ",
                type(kind).__name__, ": ", kind, "\n", group.g("Subgraph"),
            )
            failures.append(CompileFailure(group.g("Subgraph").copy(), kind))
            unmerge(graph, group)
            continue
        ops.append(built)
        kind = built.kind
        if built.kernel.dynamic:
            _unguarded(graph, group, kind)
        else:
            _guard(graph, group, kind)
    if keep is None:
        runtime.pin(ops)
    else:
        keep.extend(ops)
    return failures


def _unguarded(graph: torch._C.Graph, group: Any, kind: str) -> None:
    """The group's node becomes a dynamic kernel's, which guards itself (its entry)."""
    fused = _kernel_node(graph, group, kind, inputs_of(group))
    fused.insertBefore(group)
    for new, old in zip(outputs_of(fused), outputs_of(group)):
        old.replaceAllUsesWith(new)
    group.destroy()


def _kernel_node(graph: torch._C.Graph, group: Any, kind: str, inputs: list[Any]) -> Any:
    """A node of `kind` running `group`'s subgraph on `inputs`, its outputs typed as the
    group's (not inserted)."""
    fused = graph.create(kind, inputs, group.outputsSize())
    fused.g_("Subgraph", group.g("Subgraph"))
    for new, old in zip(outputs_of(fused), outputs_of(group)):
        new.setType(old.type())
    return fused


def _guard(graph: torch._C.Graph, group: Any, kind: str) -> None:
    subgraph = group.g("Subgraph")
    outer = inputs_of(group)
    checked = [v for v in outer if is_tensor(v)]
    types = [inner.type() for inner, v in zip(inputs_of(subgraph), outer) if is_tensor(v)]
    check = graph.create("prim::TypeCheck", checked, len(checked) + 1)
    check.tys_("types", types)
    check_outs = outputs_of(check)
    for value, ty in zip(check_outs, types):
        value.setType(ty)
    check_outs[-1].setType(torch._C.BoolType.get())
    check.insertBefore(group)

    branch = graph.create("prim::If", [check_outs[-1]], group.outputsSize())
    branch.insertBefore(group)
    fused_block, fallback_block = branch.addBlock(), branch.addBlock()

    typed = dict(zip((v.unique() for v in checked), check_outs[:-1]))
    fused = _kernel_node(graph, group, kind, [typed.get(v.unique(), v) for v in outer])
    fused.insertBefore(fused_block.returnNode())
    for new in outputs_of(fused):
        fused_block.registerOutput(new)

    env = {inner.unique(): v for inner, v in zip(inputs_of(subgraph), outer)}
    for node in subgraph.nodes():
        clone = graph.createClone(node, lambda v: env[v.unique()])
        clone.insertBefore(fallback_block.returnNode())
        for out, new in zip(outputs_of(node), outputs_of(clone)):
            if is_tensor(out):
                new.setType(torch._C.TensorType.get())
            env[out.unique()] = new
    for inner in outputs_of(subgraph):
        fallback_block.registerOutput(env[inner.unique()])

    for new, old in zip(outputs_of(branch), outputs_of(group)):
        new.setType(old.type())
        old.replaceAllUsesWith(new)
    group.destroy()
