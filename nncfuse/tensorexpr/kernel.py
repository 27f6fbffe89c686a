"""kernel: a TorchScript graph of fusible ops, lowered, scheduled and compiled.

`TensorExprKernel(graph)` takes a graph whose tensor inputs have complete
types (dtype, sizes, strides, device). Types of the other values come from
the graph when complete, else from running it once on meta tensors. Then:

1. lower: each node becomes a loop nest over its output (`lowerings`), one
   nest per node ("Original Stmt"); outputs are laid out with the strides
   eager PyTorch gives them, and each nest walks its output in memory order;
2. schedule: the passes of `SCHEDULE`, in order, each logged ("Final Stmt"
   is the result);
3. codegen: LLVM (`llvm_codegen`) or, with NNCFUSE_DONT_USE_LLVM=1, the IR
   interpreter.

`run(inputs)` checks the inputs against the graph's types and returns the
output (a tuple if several); `call(args)` skips the checks, for the runtime,
whose guards have already made them. With `>>kernel` in NNCFUSE_LOG_LEVEL
every stage is logged.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

import torch

from .. import log
from ..config import Options
from . import expr as E
from . import stmt as S
from .buffer import Buf
from .codegen.entry import Source, make_entry
from .codegen.llvm_codegen import compile_stmt
from .codegen.llvm_jit import vector_bits
from .dtype import BOOL, FLOAT64, INT64, from_torch
from .ir_eval import IREvaluator
from .ir_verifier import verify
from .ir_visitor import walk
from .loopnest import compute
from .lowerings import (
    Arg,
    ConstArg,
    Ctx,
    LoweringError,
    ScalarArg,
    TensorArg,
    lowering_for,
    scalar_dtype,
)
from .meta import TensorMeta, infer_types, is_tensor
from .passes.collapse_loops import collapse_loops
from .passes.cse import eliminate_common_subexpressions
from .passes.dead_stores import eliminate_dead_stores
from .passes.flatten_indices import flatten_indices
from .passes.fuse_loops import fuse_loops
from .passes.inline import inline_intermediates
from .passes.insert_allocations import insert_allocations
from .passes.parallelize import GRAIN, parallelize_outer_loops, work
from .passes.reuse_outputs import reuse_outputs
from .passes.simplify import simplify
from .passes.split_reductions import split_reductions
from .passes.vectorize import vectorize_inner_loops
from .passes.vectorize_reductions import vectorize_reductions

_log = log.get_logger(__file__)


@dataclass
class Lowered:
    """A graph lowered to one statement, and how its parameters bind to the graph."""

    stmt: S.Stmt
    params: list[Buf | E.Var]
    inputs: list[Buf | E.Var | None]  # per graph input: its parameter (None if unused)
    constants: list[tuple[Buf, torch.Tensor]]  # tensor constants, bound at call time
    outputs: list[tuple[str, Any]]  # per graph output: ("buf", Buf) or ("input", index)
    output_metas: dict[Buf, TensorMeta]
    input_metas: list[TensorMeta | None]
    name: str
    checks: list  # RuntimeCheck: run before the kernel


def _sanitize(name: str) -> str:
    return re.sub(r"\W", "_", name) or "t"


def _scalar_var(value: Any, name: str) -> E.Var:
    kind = value.type().kind()
    dtype = {"FloatType": FLOAT64, "IntType": INT64, "BoolType": BOOL}.get(kind)
    if dtype is None:
        raise LoweringError(f"graph input {name} of type {value.type()} is not supported")
    return E.Var(name, dtype)


def _layout_order(meta: TensorMeta) -> list[int]:
    """Dimensions from the largest stride to the smallest: the order that walks memory."""
    return sorted(range(len(meta.sizes)), key=lambda d: -meta.strides[d])


def _example(value: Any) -> Any:
    meta = TensorMeta.from_type(value.type())
    if meta is not None:
        return meta.empty("meta")
    kind = value.type().kind()
    if kind == "TensorType":
        raise LoweringError(f"graph input %{value.debugName()} has an incomplete tensor type")
    return {"FloatType": 1.0, "IntType": 1, "BoolType": True}.get(kind)


def graph_metas(graph: torch._C.Graph) -> dict[int, TensorMeta]:
    """Metadata of the graph's tensor values: from their types, else from a meta-tensor run."""
    metas: dict[int, TensorMeta] = {}
    complete = True
    for node in graph.nodes():
        for v in node.outputs():
            if is_tensor(v):
                meta = TensorMeta.from_type(v.type())
                complete &= meta is not None
    for v in graph.inputs():
        meta = TensorMeta.from_type(v.type())
        if is_tensor(v) and meta is None:
            raise LoweringError(f"graph input %{v.debugName()} has an incomplete tensor type")
    if not complete:
        device = next(
            (m.device for v in graph.inputs() if (m := TensorMeta.from_type(v.type()))),
            torch.device("cpu"),
        )
        metas = {k: replace(m, device=device) for k, m in infer_types(graph, _example).items()}
    for node in [*graph.nodes()]:
        for v in node.outputs():
            meta = TensorMeta.from_type(v.type())
            if meta is not None:
                metas[v.unique()] = meta
    for v in graph.inputs():
        meta = TensorMeta.from_type(v.type())
        if meta is not None:
            metas[v.unique()] = meta
    return metas


def lower_graph(graph: torch._C.Graph) -> Lowered:
    """One loop nest per node of `graph`; see the module docstring."""
    metas = graph_metas(graph)
    env: dict[int, Arg] = {}
    params: list[Buf | E.Var] = []
    inputs: list[Buf | E.Var | None] = []
    input_metas: list[TensorMeta | None] = []
    names: set[str] = set()

    def unique(base: str) -> str:
        name, n = base, 0
        while name in names:
            n += 1
            name = f"{base}_{n}"
        names.add(name)
        return name

    for k, value in enumerate(graph.inputs()):
        debug = value.debugName()
        name = unique(f"t{k}" if debug.isdigit() else _sanitize(debug))
        if is_tensor(value):
            meta = metas[value.unique()]
            if meta.device.type != "cpu":
                raise LoweringError(f"input {name} is on {meta.device}, not the CPU")
            buf = Buf.make(name, from_torch(meta.dtype), meta.sizes, meta.strides)
            env[value.unique()] = TensorArg(buf, meta.sizes)
            params.append(buf)
            inputs.append(buf)
            input_metas.append(meta)
        else:
            var = _scalar_var(value, name)
            env[value.unique()] = ScalarArg(var)
            params.append(var)
            inputs.append(var)
            input_metas.append(None)

    graph_outputs = {v.unique() for v in graph.outputs()}
    kernel_inputs = frozenset(p for p in params if p is not None)
    checks: list = []
    constants: list[tuple[Buf, torch.Tensor]] = []
    nests: list[S.Stmt] = []
    output_metas: dict[Buf, TensorMeta] = {}
    ops: list[str] = []
    for node in graph.nodes():
        if node.kind() == "prim::Constant":
            value = node.output()
            ivalue = value.toIValue()
            if isinstance(ivalue, torch.Tensor):
                meta = TensorMeta.of(ivalue)
                buf = Buf.make(unique("const"), from_torch(meta.dtype), meta.sizes, meta.strides)
                constants.append((buf, ivalue))
                env[value.unique()] = TensorArg(buf, meta.sizes)
            elif isinstance(ivalue, (bool, int, float)):
                env[value.unique()] = ScalarArg(E.imm(ivalue, scalar_dtype(ivalue)), ivalue)
            else:
                env[value.unique()] = ConstArg(ivalue)
            continue
        lowering, reason = lowering_for(node)
        if lowering is None:
            raise LoweringError(reason)
        if node.outputsSize() != 1 or not is_tensor(node.output()):
            raise LoweringError(f"{node.kind()} must have one tensor output")
        out = node.output()
        meta = metas.get(out.unique())
        if meta is None:
            raise LoweringError(f"no type for the output of {node.kind()}")
        args = [env[v.unique()] for v in node.inputs()]
        ctx = Ctx(node, args, from_torch(meta.dtype), meta.sizes, (), kernel_inputs, checks)
        op = node.kind().split("::")[-1]
        ops.append(op)
        is_output = out.unique() in graph_outputs
        buf, nest = compute(
            unique(f"aten_{op}"),
            ctx.out_dtype,
            meta.sizes,
            lambda *idx, ctx=ctx: lowering.fn(replace(ctx, indices=idx)),  # type: ignore
            strides=meta.strides if is_output else None,
            order=_layout_order(meta) if is_output else None,
        )
        if is_output:
            output_metas[buf] = meta
        env[out.unique()] = TensorArg(buf, meta.sizes)
        nests.extend(ctx.nests)  # the node's intermediates (a reduction's row statistics)
        nests.append(nest)

    input_index = {v.unique(): k for k, v in enumerate(graph.inputs())}
    outputs: list[tuple[str, Any]] = []
    for value in graph.outputs():
        if value.unique() in input_index:
            outputs.append(("input", input_index[value.unique()]))
            continue
        arg = env.get(value.unique())
        if not isinstance(arg, TensorArg) or arg.buf not in output_metas:
            raise LoweringError("graph outputs must be tensors computed by the graph")
        outputs.append(("buf", arg.buf))
    out_bufs = list(dict.fromkeys(b for kind, b in outputs if kind == "buf"))
    params = params + [b for b, _ in constants] + out_bufs
    name = "fused_" + "_".join(ops[:4]) if ops else "fused"
    return Lowered(
        S.Block(tuple(nests)),
        params,
        inputs,
        constants,
        outputs,
        output_metas,
        input_metas,
        _sanitize(name[:60]),
        checks,
    )


def schedule(lowered: Lowered, vector_width: int) -> list[tuple[str, Callable[[S.Stmt], S.Stmt]]]:
    """The ordered, named passes that turn the Original Stmt into the Final Stmt."""
    outputs = list(lowered.output_metas)
    bufs = [p for p in lowered.params if isinstance(p, Buf)]
    return [
        ("inline_intermediates", partial(inline_intermediates, outputs=outputs)),
        ("simplify", simplify),  # unit loops gone: loads of size-1 dims match their stores
        ("fuse_loops", fuse_loops),
        ("reuse_outputs", partial(reuse_outputs, params=bufs)),
        ("flatten_indices", flatten_indices),
        ("simplify", simplify),
        ("collapse_loops", collapse_loops),
        ("eliminate_common_subexpressions", eliminate_common_subexpressions),
        ("eliminate_dead_stores", partial(eliminate_dead_stores, params=bufs)),
        ("split_reductions", split_reductions),
        ("vectorize_reductions", partial(vectorize_reductions, vector_bits=vector_width)),
        ("vectorize_inner_loops", partial(vectorize_inner_loops, vector_bits=vector_width)),
        ("simplify", simplify),
        ("parallelize_outer_loops", parallelize_outer_loops),
        ("insert_allocations", partial(insert_allocations, params=bufs)),
    ]


#: Outputs of at least this many bytes are written with non-temporal stores: measured
#: (one 4-byte multiply per element) 1.3-1.7x faster from 8 MB up, slower below 4 MB.
STREAMING_BYTES = 8 << 20


def _long_running(stmt: S.Stmt) -> bool:
    """Whether calls should release the GIL: the kernel has parallel loops or much work."""
    if any(isinstance(n, S.For) and n.parallel for n in walk(stmt)):
        return True
    return sum(work(s) or 0 for s in stmt.stmts) >= GRAIN if isinstance(stmt, S.Block) else False


class TensorExprKernel:
    """A fusion group's graph compiled to one loop nest program; see the module docstring."""

    def __init__(self, graph: torch._C.Graph, options: Options | None = None):
        self.graph = graph
        self.options = options or Options.from_env()
        _log.debug("TensorExprKernel graph:\n", graph)
        self.lowered = lowered = lower_graph(graph)
        stmt = lowered.stmt
        _log.debug("Original Stmt:\n", stmt)
        for name, run_pass in schedule(lowered, vector_bits()):
            stmt = run_pass(stmt)
            _log.debug(f"After {name}:\n", stmt)
        inputs = [b for b in lowered.inputs if isinstance(b, Buf)]
        inputs += [b for b, _ in lowered.constants]
        verify(
            stmt,
            params=[p for p in lowered.params if isinstance(p, E.Var)],
            inputs=inputs,
            outputs=list(lowered.output_metas),
        )
        _log.debug("Final Stmt:\n", stmt)
        self.stmt = stmt
        self.jit = None
        self.evaluator = None
        if self.options.use_llvm:
            streaming = frozenset(
                b for b, meta in lowered.output_metas.items()
                if meta.nbytes >= STREAMING_BYTES
            )
            self.jit = compile_stmt(
                stmt, lowered.params, lowered.name, _long_running(stmt), streaming
            )
        else:
            self.evaluator = IREvaluator(stmt, lowered.params)
        #: outputs (a list) for inputs that match the graph's types, unchecked: for the runtime
        self.call = self.entry([("arg", k) for k in range(len(lowered.inputs))], "list")

    @property
    def name(self) -> str:
        return self.lowered.name

    def _check(self, inputs: Sequence[Any]) -> None:
        metas = self.lowered.input_metas
        if len(inputs) != len(metas):
            raise ValueError(f"{self.name} takes {len(metas)} inputs, got {len(inputs)}")
        for k, (x, meta) in enumerate(zip(inputs, metas)):
            if meta is None:
                if isinstance(x, torch.Tensor):
                    raise ValueError(f"input {k} must be a number")
                continue
            if not isinstance(x, torch.Tensor) or TensorMeta.of(x) != replace(
                meta, requires_grad=TensorMeta.of(x).requires_grad
            ):
                raise ValueError(f"input {k} does not match the type the kernel was built for")

    def run(self, inputs: Sequence[Any]) -> Any:
        """Outputs for `inputs` (checked): a tensor, or a tuple of them."""
        self._check(inputs)
        outs = self.call(inputs)
        return outs[0] if len(outs) == 1 else tuple(outs)

    def entry(self, sources: Sequence[Source], returns: Any) -> Callable[[Sequence[Any]], Any]:
        """A generated function that calls this kernel; see `codegen/entry.py`."""
        lowered = self.lowered
        position = {p: k for k, p in enumerate(lowered.inputs)}
        constants = dict(lowered.constants)
        params: list[tuple[str, Any]] = []
        out_number: dict[Buf, int] = {}
        for p in lowered.params:
            if p in position:
                params.append(("tensor" if isinstance(p, Buf) else "number", position[p]))
            elif p in constants:
                params.append(("const", constants[p]))
            else:
                out_number[p] = len(out_number)  # type: ignore[index]
                params.append(("output", lowered.output_metas[p]))  # type: ignore[index]
        outputs = [
            ("buf", out_number[ref]) if kind == "buf" else ("input", ref)
            for kind, ref in lowered.outputs
        ]
        checks = [(position[c.param], c.holds, c.message) for c in lowered.checks]
        cfunc = self.jit.cfunc if self.jit is not None else None
        run = self.evaluator.run if self.evaluator is not None else None
        return make_entry(params, outputs, checks, sources, returns, cfunc, run)

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
