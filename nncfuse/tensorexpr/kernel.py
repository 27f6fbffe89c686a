"""kernel: a TorchScript graph of fusible ops, lowered, scheduled and compiled.

`TensorExprKernel(graph)` takes a graph whose tensor inputs have complete
types (dtype, sizes, strides, device). Types of the other values come from
the graph when complete, else from running it once on meta tensors. Then:

1. lower (`graph_lowering`): each node becomes a loop nest over its output
   (`lowerings`), one nest per node ("Original Stmt"); outputs are laid out
   with the strides eager PyTorch gives them, and each nest walks its output
   in memory order;
2. schedule: the passes of `schedule`, in order, each logged with its time
   ("unchanged" if it returned the very same Stmt; "Final Stmt" is the
   result). The verifier checks the result; with the `verify` option
   (NNCFUSE_VERIFY=1) also the Original Stmt and each pass's result, and an
   IRError names the pass that broke it;
3. codegen: LLVM (`llvm_codegen`) or, with NNCFUSE_DONT_USE_LLVM=1, the IR
   interpreter.

`run(inputs)` checks the inputs against the graph's types and returns the
output (a tuple if several); `call(args)` skips the checks, for the runtime,
whose guards have already made them. `entry(sources, returns)` generates
other ways to call it (`codegen/entry.py`) from its `KernelInterface`, the
parameters, outputs and checks of `Lowered` by input position. With
`>>kernel` in NNCFUSE_LOG_LEVEL every stage is logged.
"""

from __future__ import annotations

import ctypes
import time
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any

import torch

from .. import log
from ..config import Options
from . import expr as E
from . import stmt as S
from .buffer import Buf
from .codegen.entry import (
    ArgCheck,
    ArgSource,
    BufOutput,
    ConstParam,
    ConstSource,
    ExternalStep,
    KernelInterface,
    NumberParam,
    OutputParam,
    Param,
    ReturnList,
    Returns,
    SizeParam,
    Source,
    TensorParam,
    make_entry,
)
from .codegen.llvm_codegen import compile_stmt, param_ctype
from .codegen.llvm_jit import vector_bits
from .external import site_routine
from .graph_lowering import ComputedOutput, Lowered, lower_graph
from .ir_eval import IREvaluator
from .ir_verifier import IRError, verify
from .ir_visitor import walk
from .passes.collapse_loops import collapse_loops
from .passes.cse import eliminate_common_subexpressions
from .passes.dead_stores import eliminate_dead_stores
from .passes.flatten_indices import flatten_indices
from .passes.fuse_loops import fuse_loops
from .passes.fuse_stored_reductions import fuse_stored_reductions
from .passes.hoist_loads import hoist_loads
from .passes.inline import inline_intermediates
from .passes.insert_allocations import insert_allocations
from .passes.parallelize import GRAIN, parallelize_outer_loops, symbolic_work, work
from .passes.partition_loops import partition_loops
from .passes.reuse_outputs import reuse_outputs
from .passes.simplify import simplify
from .passes.split_loops import split_loops
from .passes.split_reductions import split_reductions
from .passes.tile_transposes import tile_transposes
from .passes.vectorize import vectorize_inner_loops
from .passes.vectorize_reductions import vectorize_reductions
from .size_symbols import row_major

_log = log.get_logger(__file__)

Pass = Callable[[S.Stmt], S.Stmt]


def schedule(lowered: Lowered, vector_width: int) -> list[tuple[str, Pass]]:
    """The ordered, named passes that turn the Original Stmt into the Final Stmt."""
    outputs = list(lowered.output_metas)
    bufs = [p for p in lowered.params if isinstance(p, Buf)]
    # What write-backs store stays a buffer when it would be inlined: inlined, a read of the
    # input at another element than the one stored would see the new value. `fuse_loops`
    # then joins its nest with the write-back's where every such read is of the same element.
    written = [lowered.inputs[k] for k in lowered.written]
    keep = [*outputs, *lowered.write_sources, *written]
    # Outputs the kernel allocates: memory no input shares, that a temporary may hand over.
    fresh = [b for b in outputs if b not in written]
    return [
        ("inline_intermediates", partial(inline_intermediates, outputs=keep)),
        ("simplify", simplify),  # unit loops gone: loads of size-1 dims match their stores
        ("partition_loops", partition_loops),  # cat: one loop per part, no selects
        ("fuse_loops", fuse_loops),
        ("reuse_outputs", partial(reuse_outputs, params=bufs)),
        ("flatten_indices", flatten_indices),
        ("simplify", simplify),
        ("split_loops", split_loops),  # a reshape's merged dims: no gather
        ("collapse_loops", collapse_loops),
        ("tile_transposes", tile_transposes),
        ("eliminate_common_subexpressions", eliminate_common_subexpressions),
        ("eliminate_dead_stores", partial(eliminate_dead_stores, params=bufs, outputs=fresh)),
        ("split_reductions", split_reductions),
        ("vectorize_reductions", partial(vectorize_reductions, vector_bits=vector_width)),
        ("vectorize_inner_loops", partial(vectorize_inner_loops, vector_bits=vector_width)),
        ("simplify", simplify),
        ("parallelize_outer_loops", parallelize_outer_loops),
        ("insert_allocations", partial(insert_allocations, params=bufs)),
        ("hoist_loads", hoist_loads),  # a row's statistics read once per row, not per vector
        ("fuse_stored_reductions", fuse_stored_reductions),  # a softmax's sum in its exp loop
    ]


#: Outputs of at least this many bytes are written with non-temporal stores: measured
#: (one 4-byte multiply per element) 1.3-1.7x faster from 8 MB up, slower below 4 MB.
STREAMING_BYTES = 8 << 20


def _long_running(stmt: S.Stmt) -> bool:
    """Whether calls should release the GIL: the kernel has parallel loops or much work."""
    if any(isinstance(n, S.For) and n.parallel for n in walk(stmt)):
        return True
    return sum(work(s) or 0 for s in stmt.stmts) >= GRAIN if isinstance(stmt, S.Block) else False


def _with_externals(lowered: Lowered, loops: S.Stmt) -> S.Stmt:
    """The loops after the external calls that compute their inputs, as one Stmt to print."""
    if not lowered.externals:
        return loops
    return S.Block((*lowered.externals, *(loops.stmts if isinstance(loops, S.Block) else [loops])))


def _external_steps(lowered: Lowered, position: Mapping[Any, int]) -> tuple[ExternalStep, ...]:
    """Each external call as the entry makes it: kernel input `position[buf]` is the routine's
    result on the positions of its buffer and number operands and on its constants."""
    constants = dict(lowered.constants)
    steps = []
    for call in lowered.externals:
        args = tuple(
            ArgSource(position[a]) if a in position
            else ConstSource(constants[a]) if isinstance(a, Buf)
            else ConstSource(a)
            for a in call.args
        )
        steps.append(ExternalStep(position[call.buf], site_routine(call.fn), args))
    return tuple(steps)


def _quick_call(jit: Any, stmt: S.Stmt, lowered: Lowered) -> tuple[Any, E.Expr] | None:
    """For a dynamic kernel that releases the GIL: the same code through a wrapper that keeps
    it, and when not to use that one (its estimated work at run time reaches GRAIN, where it
    may run parallel loops). None if the work has no estimate."""
    if not isinstance(stmt, S.Block) or not stmt.stmts:
        return None
    parts = [symbolic_work(s) for s in stmt.stmts]
    if None in parts or jit.cfunc._flags_ & ctypes._FUNCFLAG_PYTHONAPI:  # keeps the GIL
        return None
    total = parts[0]
    for p in parts[1:]:
        total = total + p  # type: ignore[operator]
    quick = ctypes.PYFUNCTYPE(None, *[param_ctype(p) for p in lowered.params])(jit.address)
    return quick, E.cmp(">=", simplify(total), GRAIN)  # type: ignore[arg-type]


class TensorExprKernel:
    """A fusion group's graph compiled to one loop nest program; see the module docstring."""

    def __init__(
        self, graph: torch._C.Graph, options: Options | None = None, dynamic: bool = False,
        static_sizes: frozenset[int] = frozenset(),
    ):
        self.graph = graph
        self.options = options or Options.from_env()
        _log.debug("TensorExprKernel graph:\n", graph)
        #: sizes are symbols bound from the inputs on each call (`size_symbols`), except the
        #: `static_sizes`
        self.dynamic = dynamic
        self.lowered = lowered = lower_graph(graph, dynamic, static_sizes)
        _log.debug("Original Stmt:\n", _with_externals(lowered, lowered.stmt))
        if self.options.verify:
            self._verify("lower_graph", lowered.stmt, allocated=False)
        stmt = self._run_schedule(lowered.stmt, schedule(lowered, vector_bits()))
        self._verify("the schedule", stmt, allocated=True)
        #: what runs: the external calls (from the entry), then the loops (compiled)
        self.stmt = _with_externals(lowered, stmt)
        _log.debug("Final Stmt:\n", self.stmt)
        self.jit = None
        self.evaluator = None
        self._quick: tuple[Any, E.Expr] | None = None
        if isinstance(stmt, S.Block) and not stmt.stmts:
            pass  # external calls alone: nothing to compile
        elif self.options.use_llvm:
            streaming = frozenset(
                b for b, meta in lowered.output_metas.items()
                if meta.nbytes >= STREAMING_BYTES and not dynamic
            )
            self.jit = compile_stmt(
                stmt, list(lowered.params), lowered.name, _long_running(stmt), streaming
            )
            self._quick = _quick_call(self.jit, stmt, lowered) if dynamic else None
        else:
            self.evaluator = IREvaluator(stmt, list(lowered.params))
        #: how the compiled code is called, for `entry`
        self.interface = self._interface()
        self._input_types = [  # what `run` checks: None for a number
            None if m is None else (m.dtype, m.sizes, m.strides, m.device)
            for m in lowered.input_metas
        ]
        #: outputs (a list) for inputs that match the graph's types, unchecked: for the runtime
        self.call = self.entry([ArgSource(k) for k in range(len(lowered.inputs))], ReturnList())

    def _run_schedule(self, stmt: S.Stmt, passes: Sequence[tuple[str, Pass]]) -> S.Stmt:
        """`stmt` through `passes` in order, each logged with its time ("unchanged" when it
        returned the very same statement); with the `verify` option, verified after each."""
        allocated = False  # whether temporaries have Allocate and Free statements yet
        for name, run_pass in passes:
            start = time.perf_counter()
            result = run_pass(stmt)
            ms = (time.perf_counter() - start) * 1e3
            allocated |= name == insert_allocations.__name__
            if result is stmt:
                _log.debug(f"After {name} (unchanged, {ms:.2f} ms)")
                continue
            _log.debug(f"After {name} ({ms:.2f} ms):\n", result)
            if self.options.verify:
                self._verify(name, result, allocated)
            stmt = result
        return stmt

    def _verify(self, stage: str, stmt: S.Stmt, allocated: bool) -> None:
        """Raise IRError naming `stage` if `stmt` is malformed (`ir_verifier`)."""
        lowered = self.lowered
        try:
            verify(
                stmt,
                params=[p for p in lowered.params if isinstance(p, E.Var)],
                inputs=[*(b for b in lowered.inputs if isinstance(b, Buf)),
                        *(b for b, _ in lowered.constants),
                        *(c.buf for c in lowered.externals)],
                outputs=[*lowered.output_metas, *(lowered.inputs[k] for k in lowered.written)],
                allocated=allocated,
            )
        except IRError as e:
            raise IRError(f"{lowered.name}: the IR is malformed after {stage}: {e}") from e

    def _interface(self) -> KernelInterface:
        """How the compiled code is called: each parameter and output by input position."""
        lowered = self.lowered
        position = {p: k for k, p in enumerate(lowered.inputs)}
        position |= {c.buf: len(position) + j for j, c in enumerate(lowered.externals)}
        constants = dict(lowered.constants)
        number: dict[Buf | E.Var, int] = {}  # output buffer -> its place among the outputs
        params: list[Param] = []
        symbols = {s.var for s in lowered.symbols}
        for p in lowered.params:
            if p in symbols:
                params.append(SizeParam(p.name))
            elif p in position:
                k = position[p]
                params.append(TensorParam(k) if isinstance(p, Buf) else NumberParam(k))
            elif p in constants:
                params.append(ConstParam(constants[p]))  # type: ignore[index]
            else:
                number[p] = len(number)
                dims = p.dims if self.dynamic else None  # type: ignore[union-attr]
                meta = lowered.output_metas[p]  # type: ignore[index]
                steps = None if not self.dynamic or row_major(meta) else p.strides  # type: ignore
                params.append(OutputParam(meta, dims, steps))  # type: ignore
        outputs = tuple(
            BufOutput(number[o.buf]) if isinstance(o, ComputedOutput) else o
            for o in lowered.outputs
        )
        checks = tuple(ArgCheck(position[c.param], c.holds, c.message) for c in lowered.checks)
        return KernelInterface(
            tuple(params),
            outputs,
            checks,
            externals=_external_steps(lowered, position),
            cfunc=self.jit.cfunc if self.jit is not None else None,
            run=self.evaluator.run if self.evaluator is not None else None,
            written=lowered.written,
            fallback=self._fallback_list if lowered.written or lowered.guards else None,
            symbols=lowered.symbols,
            guards=lowered.guards,
            equal=lowered.equal,
            quick=self._quick,
        )

    def _fallback_list(self, inputs: Sequence[Any]) -> list[Any]:
        """`fallback`'s outputs as a list: what the entry runs when a written input overlaps
        another input (the kernel's loads and stores would not be independent), or when a
        dynamic kernel's guard refuses the inputs."""
        outs = self.fallback(inputs)
        return list(outs) if isinstance(outs, tuple) else [outs]

    @property
    def name(self) -> str:
        return self.lowered.name

    def _check(self, inputs: Sequence[Any]) -> None:
        """Raise ValueError unless `inputs` have the types the kernel was built for
        (requires_grad aside)."""
        types = self._input_types
        if len(inputs) != len(types):
            raise ValueError(f"{self.name} takes {len(types)} inputs, got {len(inputs)}")
        for k, (x, want) in enumerate(zip(inputs, types)):
            if want is None:
                if isinstance(x, torch.Tensor):
                    raise ValueError(f"input {k} must be a number")
            elif not isinstance(x, torch.Tensor) or (
                (x.dtype, x.shape, x.stride(), x.device) != want
                and not (self.dynamic and (x.dtype, x.device) == (want[0], want[3]))
            ):  # a dynamic kernel's entry checks its guard (else it runs the fallback)
                raise ValueError(f"input {k} does not match the type the kernel was built for")

    def run(self, inputs: Sequence[Any]) -> Any:
        """Outputs for `inputs` (checked): a tensor, or a tuple of them."""
        self._check(inputs)
        outs = self.call(inputs)
        return outs[0] if len(outs) == 1 else tuple(outs)

    def entry(
        self, sources: Sequence[Source], returns: Returns, overlap_guarded: bool = False,
        size_guarded: bool = False,
    ) -> Callable[[Sequence[Any]], Any]:
        """A generated function that calls this kernel; see `codegen/entry.py`."""
        return make_entry(self.interface, sources, returns, overlap_guarded, size_guarded)

    def fallback(self, inputs: Sequence[Any]) -> Any:
        """The graph's outputs computed by the TorchScript interpreter, unfused."""
        return torch._C._jit_interpret_graph(self.graph, tuple(inputs))

    def get_code_text(self, attr: str = "") -> str:
        """The generated code: assembly (default) or LLVM IR ("ir"); the Stmt without LLVM."""
        if self.jit is None:
            return str(self.stmt)
        if attr == "ir":
            return self.jit.optimized_ir
        return self.jit.assembly
