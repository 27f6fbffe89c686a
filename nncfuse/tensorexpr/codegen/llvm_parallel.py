"""Parallel loops for llvm_codegen: a `For` marked parallel runs on OpenMP's threads.

The loop body is outlined into a function `<kernel>.par<n>(ptr data)` (n counts
the kernel's own parallel loops, so the IR text, which keys the object-code
cache, depends on the kernel alone, not on what the process compiled before) that
reads what the body uses (buffer pointers, scalars, the bounds) from a struct
the caller fills, takes the `omp_get_thread_num()`-th of
`omp_get_num_threads()` contiguous chunks of the iteration range, and runs
them as a serial loop. The caller hands it to `GOMP_parallel` of the libgomp
that torch itself uses (torch/lib/libgomp.so.1), with the default thread
count, so `torch.set_num_threads` governs fused kernels too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import llvmlite.ir as ir

from .. import expr as E
from .. import stmt as S
from ..buffer import Buf
from ..ir_visitor import walk
from .llvm_types import I32, I64, PTR

if TYPE_CHECKING:
    from .llvm_codegen import LLVMCodeGen


def _captured(s: S.For) -> tuple[list[E.Var], list[Buf]]:
    """Variables the loop uses but does not bind, and the buffers it touches but does not
    allocate."""
    bound: set[E.Var] = set()
    used: dict[E.Var, None] = {}
    bufs: dict[Buf, None] = {}
    inner: set[Buf] = set()
    for node in walk(s):
        if isinstance(node, S.Allocate):
            inner.add(node.buf.root)
        if isinstance(node, (S.For, S.Let)):
            bound.add(node.var)
        elif isinstance(node, E.Reduce):
            bound.update(node.vars)
        elif isinstance(node, E.Var):
            used[node] = None
        buf = getattr(node, "buf", None)
        if isinstance(buf, Buf):
            bufs[buf.root] = None
    return [v for v in used if v not in bound], [b for b in bufs if b not in inner]


def _outlined_name(cg: LLVMCodeGen) -> str:
    """`<kernel>.par<n>`, n the number of loops the kernel outlined before this one."""
    prefix = f"{cg.name}.par"
    return f"{prefix}{sum(1 for f in cg.module.functions if f.name.startswith(prefix))}"


def emit_parallel_for(cg: LLVMCodeGen, s: S.For) -> None:
    """Emit `s` as a GOMP_parallel call of an outlined, chunked copy of its loop."""
    variables, buffers = _captured(s)
    values = [cg.bufs[b] for b in buffers] + [cg.vars[v] for v in variables]
    values += [cg.expr(s.start), cg.expr(s.stop)]
    struct = ir.LiteralStructType([v.type for v in values])

    b = cg.builder
    here = b.block
    b.position_at_start(cg.fn.entry_basic_block)
    data = b.alloca(struct, name="par.data")
    b.position_at_end(here)
    for k, value in enumerate(values):
        # `data` is a typed pointer to the struct: gep finds the field's type itself.
        b.store(value, b.gep(data, [ir.Constant(I32, 0), ir.Constant(I32, k)]))

    outlined = ir.Function(cg.module, ir.FunctionType(ir.VoidType(), [PTR]),
                           name=_outlined_name(cg))
    outlined.attributes.add("nounwind")
    gomp = cg.declare("GOMP_parallel", ir.VoidType(), [PTR, PTR, I32, I32])
    b.call(gomp, [outlined, data, ir.Constant(I32, 0), ir.Constant(I32, 0)])

    with cg.inside(outlined):
        ob = cg.builder
        arg = outlined.args[0]
        fields = [
            ob.load(ob.gep(arg, [ir.Constant(I32, 0), ir.Constant(I32, k)], source_etype=struct),
                    typ=value.type)
            for k, value in enumerate(values)
        ]
        for buf, ptr in zip(buffers, fields):
            cg.bufs[buf] = ptr
        for var, value in zip(variables, fields[len(buffers):]):
            cg.vars[var] = value
        start, stop = fields[-2:]
        tid = ob.sext(ob.call(cg.declare("omp_get_thread_num", I32, []), []), I64)
        nth = ob.sext(ob.call(cg.declare("omp_get_num_threads", I32, []), []), I64)
        count = ob.sub(stop, start)
        chunk = ob.sdiv(ob.add(count, ob.sub(nth, ir.Constant(I64, 1))), nth)
        lo = ob.add(start, ob.mul(tid, chunk))
        hi = ob.add(lo, chunk)
        hi = ob.select(ob.icmp_signed("<", hi, stop), hi, stop)
        cg.loop(s.var, lo, hi, s.body)
        cg.ret()
