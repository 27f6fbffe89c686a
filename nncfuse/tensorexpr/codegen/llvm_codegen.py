"""llvm_codegen: a scheduled statement as an LLVM function, compiled to machine code.

The function takes one argument per kernel parameter: a pointer per buffer
(`noalias`: outputs are fresh, and an input the kernel writes into, a write-back,
overlaps no other input: the entry and the plan check that on every call and run the
fallback otherwise; other inputs are only read) and a `double` or `i64`
per scalar (bools as i64). Statements map directly: `For` to a counted loop
with a phi, `Let` to an SSA value, `Allocate`/`Free` to malloc/free (a small
buffer of a loop's body to a stack slot, which LLVM keeps in registers), vector
loads of a unit-stride `Ramp` to one wide load, and loads whose lanes sit at constant
offsets from one scalar index within two vectors' width (`_window`: a repeat `Ramp % 4`,
a spread `Ramp / 4`, a stride of 2, a `cat`'s clamped reads) to one load and a shuffle:

    x[Broadcast(64 * i, 16) + Ramp(0, 1, 16) % Broadcast(4, 16)]
->  shufflevector(load <4 x float> x + 64 * i, [0, 1, 2, 3, 0, 1, 2, 3, ...])

(other vector indices load lane by lane). A scalar `Select` with a reduction in a
branch (`ir_visitor.branches_reduce`) is a branch, so that only the side taken runs its
loops; the independent reductions of adjacent `Let`s over the same ranges run in one loop
(`join_reductions`: a row read once from the cache for both of a variance's sums).
Operators emit what their `ops` row's LLVM column names: an instruction, or one of
`EMITTERS`.
Arithmetic follows the interpreter's semantics (`ir_eval`) exactly: no fast-math, NaN-propagating
max/min, defined float-to-int conversion. bfloat16, which llvmlite cannot
spell, is carried as its 16 bits and converted with round-to-nearest-even.

With `>>llvm_codegen` in NNCFUSE_LOG_LEVEL the IR before and after
optimization and the assembly are logged.
"""

from __future__ import annotations

import contextlib
import ctypes
import re
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import llvmlite.ir as ir

from ... import log
from .. import expr as E
from .. import ops
from .. import stmt as S
from ..buffer import Buf
from ..dtype import FLOAT32, FLOAT64, INT16, INT32, Dtype
from ..ir_eval import evaluate
from ..ir_visitor import Visitor, branches_reduce, children, walk
from ..linear_form import linear
from . import llvm_math, llvm_parallel, llvm_prefetch
from .llvm_jit import JitFunction, compile_ir, vector_bits
from .llvm_types import (
    F32,
    F64,
    I1,
    I8,
    I16,
    I32,
    I64,
    PTR,
    bf16_constant_bits,
    ll_type,
    memory_type,
    type_suffix,
)

_log = log.get_logger(__file__)

#: LLVM instructions that `ops.Emit` names and the IRBuilder methods emitting them.
INSTRUCTIONS = {
    name: name + "_" if name in ("and", "or") else name
    for name in ("fadd", "add", "fsub", "sub", "fmul", "mul", "fdiv", "sdiv", "udiv",
                 "frem", "srem", "urem", "and", "or", "xor", "shl", "ashr", "lshr")
}
#: Comparison predicates `ops.Emit` names: fcmp's for floats, icmp's for the others.
FCMP = {"oeq", "une", "olt", "ole", "ogt", "oge"}
ICMP = {"eq", "ne", "slt", "sle", "sgt", "sge", "ult", "ule", "ugt", "uge"}


def param_ctype(p: Buf | E.Var) -> Any:
    if isinstance(p, Buf):
        return ctypes.c_void_p
    return ctypes.c_double if p.dtype.is_float else ctypes.c_int64


def _param_type(p: Buf | E.Var) -> ir.Type:
    if isinstance(p, Buf):
        return PTR
    return F64 if p.dtype.is_float else I64


#: Buffers allocated inside a loop of at most this many bytes live on the stack.
STACK_BYTES = 1024

#: Whether LLVM may unroll the loops of a `Reduce`: not, since their full unrolling made
#: most of the LLVM time of the transformer block's training kernels.
UNROLL_REDUCTIONS = False


def _eager_reductions(e: E.Expr) -> list[E.Reduce]:
    """The reductions of `e` that run whatever happens, those in another's initial value
    before it: not those in a reduction's body (they run per point), nor those in a branch
    of a select that runs only when taken (`branches_reduce`)."""
    found: list[E.Reduce] = []

    def visit(n: E.Expr) -> None:
        if isinstance(n, E.Reduce):
            visit(n.init)
            found.append(n)
        elif branches_reduce(n):
            visit(n.cond)  # type: ignore[attr-defined]
        else:
            for c in children(n):
                if isinstance(c, E.Expr):
                    visit(c)

    visit(e)
    return found


class LLVMCodeGen(Visitor):
    """Emits LLVM IR for `stmt` as a function `name` over `params`.

    Visiting an expression returns its LLVM value; visiting a statement emits it.
    """

    def __init__(
        self,
        stmt: S.Stmt,
        params: Sequence[Buf | E.Var],
        name: str = "fused",
        streaming: frozenset[Buf] = frozenset(),
    ):
        self.name = name
        self.params = list(params)
        self.streaming = streaming  # outputs too large for the caches: non-temporal stores
        self.fence = False  # whether a non-temporal store needs a fence before returning
        self.module = ir.Module(name=name)
        fnty = ir.FunctionType(ir.VoidType(), [_param_type(p) for p in self.params])
        self.fn = ir.Function(self.module, fnty, name=name)
        self.fn.attributes.add("nounwind")
        self.builder = ir.IRBuilder(self.fn.append_basic_block("entry"))
        self.bufs: dict[Buf, ir.Value] = {}
        self.vars: dict[E.Var, ir.Value] = {}
        #: reductions computed in a shared loop (`join_reductions`), by id: (node, value)
        self.joined: dict[int, tuple[E.Reduce, ir.Value]] = {}
        self.decls: dict[str, ir.Function] = {}
        self.vector_bits = vector_bits()
        #: per statement loop being emitted, innermost last: its variable and the buffers a
        #: reduction in its body already prefetches the next iteration's part of
        #: (`llvm_prefetch`)
        self.loops: list[tuple[E.Var, set[Buf]]] = []
        self.on_stack: set[Buf] = set()  # buffers `visit_Allocate` put on the stack
        for p, arg in zip(self.params, self.fn.args):
            arg.name = p.name
            if isinstance(p, Buf):
                arg.add_attribute("noalias")
                self.bufs[p.root] = arg
            else:
                self.vars[p] = self.convert_param(arg, p.dtype)
        self.stmt(stmt)
        self.ret()

    def ret(self) -> None:
        """Return; after non-temporal stores, fence so that other threads see them."""
        if self.fence:
            self.builder.fence("seq_cst")
        self.builder.ret_void()

    @contextlib.contextmanager
    def inside(self, fn: ir.Function) -> Iterator[None]:
        """Emit into `fn` (a new function) for the duration, then come back."""
        saved = (self.fn, self.builder, dict(self.vars), dict(self.bufs))
        self.fn = fn
        self.builder = ir.IRBuilder(fn.append_basic_block("entry"))
        try:
            yield
        finally:
            self.fn, self.builder, self.vars, self.bufs = saved

    def ir_text(self) -> str:
        # Vectors live across SLEEF calls are spilled: `stackrealign` gives them 64-byte
        # aligned slots (unaligned 512-bit spills straddle cache lines and stall reloads).
        # llvmlite cannot spell the attribute, so it is added to the text.
        return re.sub(r"^(define .*\)) nounwind$", r'\1 nounwind "stackrealign"',
                      str(self.module), flags=re.MULTILINE)

    # -- helpers ------------------------------------------------------------
    def declare(self, name: str, ret: ir.Type, args: Sequence[ir.Type]) -> ir.Function:
        fn = self.decls.get(name)
        if fn is None:
            fn = ir.Function(self.module, ir.FunctionType(ret, list(args)), name=name)
            self.decls[name] = fn
        return fn

    def intrinsic(self, name: str, value_type: ir.Type, args: Sequence[ir.Value]) -> ir.Value:
        suffix = type_suffix(value_type)
        fn = self.declare(f"llvm.{name}.{suffix}", value_type, [a.type for a in args])
        return self.builder.call(fn, list(args))

    def convert_param(self, arg: ir.Value, dtype: Dtype) -> ir.Value:
        b = self.builder
        if dtype.is_float:
            return arg if dtype.name == "float64" else self.cast_value(arg, FLOAT64, dtype)
        if dtype.is_bool:
            return b.icmp_unsigned("!=", arg, ir.Constant(I64, 0))
        return arg if dtype.name == "int64" else b.trunc(arg, ll_type(dtype))

    def splat(self, value: ir.Value, lanes: int) -> ir.Value:
        vt = ir.VectorType(value.type, lanes)
        one = self.builder.insert_element(ir.Constant(vt, ir.Undefined), value, ir.Constant(I32, 0))
        mask = ir.Constant(ir.VectorType(I32, lanes), [0] * lanes)
        return self.builder.shuffle_vector(one, ir.Constant(vt, ir.Undefined), mask)

    def const(self, dtype: Dtype, value: Any) -> ir.Value:
        scalar = dtype.scalar
        if scalar.name == "bfloat16":
            c = ir.Constant(I16, bf16_constant_bits(float(value)))
        elif scalar.is_bool:
            c = ir.Constant(I1, int(bool(value)))
        else:
            c = ir.Constant(ll_type(scalar), value)
        # A splat from the scalar constant: one object for every lane (a list of values made
        # one Constant a lane, most of the objects a kernel's module held; the same text)
        return c if dtype.lanes == 1 else ir.Constant(ll_type(dtype), c)

    # -- bfloat16 -----------------------------------------------------------
    def bf16_to_f32(self, v: ir.Value, lanes: int) -> ir.Value:
        b = self.builder
        i32 = I32 if lanes == 1 else ir.VectorType(I32, lanes)
        f32 = F32 if lanes == 1 else ir.VectorType(F32, lanes)
        return b.bitcast(b.shl(b.zext(v, i32), self.const(INT32.with_lanes(lanes), 16)), f32)

    def f32_to_bf16(self, v: ir.Value, lanes: int) -> ir.Value:
        """Round to nearest even, keeping NaN a (quiet) NaN."""
        b = self.builder
        dt = INT32.with_lanes(lanes)
        i32 = ll_type(dt)
        bits = b.bitcast(v, i32)
        lsb = b.and_(b.lshr(bits, self.const(dt, 16)), self.const(dt, 1))
        rounded = b.add(b.add(bits, self.const(dt, 0x7FFF)), lsb)
        rounded = b.lshr(rounded, self.const(dt, 16))
        quiet_nan = b.or_(b.lshr(bits, self.const(dt, 16)), self.const(dt, 0x40))
        is_nan = b.fcmp_unordered("uno", v, v)
        i16 = ll_type(INT16.with_lanes(lanes))
        return b.trunc(b.select(is_nan, quiet_nan, rounded), i16)

    def to_compute(self, v: ir.Value, dtype: Dtype) -> tuple[ir.Value, Dtype]:
        """bfloat16 values as float32 for arithmetic; others unchanged."""
        if dtype.scalar.name == "bfloat16":
            return self.bf16_to_f32(v, dtype.lanes), FLOAT32.with_lanes(dtype.lanes)
        return v, dtype

    # -- expressions ----------------------------------------------------------
    def expr(self, e: E.Expr) -> ir.Value:
        return self.visit(e)

    def generic_visit(self, node: E.Expr | S.Stmt) -> Any:
        raise NotImplementedError(f"llvm_codegen: {type(node).__name__}")

    def emit(self, row: ops.Op, args: Sequence[Any], dtype: Dtype) -> Any:
        """`row`'s operation on `args` of type `dtype`, as its LLVM column says."""
        name = row.llvm.pick(dtype)
        if name is None:
            raise NotImplementedError(f"llvm_codegen: {row.name} of {dtype}")
        emitter = EMITTERS.get(name)
        if emitter is not None:
            return emitter(self, row, args, dtype)
        return getattr(self.builder, INSTRUCTIONS[name])(*args)

    def visit_Imm(self, e: E.Imm) -> ir.Value:
        return self.const(e.dtype, e.value)

    def visit_Var(self, e: E.Var) -> ir.Value:
        return self.vars[e]

    def visit_Broadcast(self, e: E.Broadcast) -> ir.Value:
        if isinstance(e.value, E.Imm):
            return self.const(e.dtype, e.value.value)
        return self.splat(self.expr(e.value), e.lanes)

    def visit_Ramp(self, e: E.Ramp) -> ir.Value:
        b = self.builder
        base = self.splat(self.expr(e.base), e.lanes)
        steps = ir.Constant(ir.VectorType(I64, e.lanes), list(range(e.lanes)))
        if E.is_const(e.stride, 1):
            return b.add(base, steps)
        return b.add(base, b.mul(steps, self.splat(self.expr(e.stride), e.lanes)))

    def visit_BinaryOp(self, e: E.BinaryOp) -> ir.Value:
        a, dtype = self.to_compute(self.expr(e.a), e.a.dtype)
        bv, _ = self.to_compute(self.expr(e.b), e.b.dtype)
        out = self.emit(e.row, (a, bv), dtype)
        if e.dtype.scalar.name == "bfloat16":
            return self.f32_to_bf16(out, e.dtype.lanes)
        return out

    def combine(self, row: ops.Op, a: ir.Value, b: ir.Value, dtype: Dtype) -> ir.Value:
        """`row` applied to two values of `dtype` (bfloat16 computed in float32, rounded)."""
        a, compute = self.to_compute(a, dtype)
        b, _ = self.to_compute(b, dtype)
        out = self.emit(row, (a, b), compute)
        if dtype.scalar.name == "bfloat16":
            return self.f32_to_bf16(out, dtype.lanes)
        return out

    def visit_Reduce(self, e: E.Reduce) -> ir.Value:
        """Counted loops, one per variable, carrying the accumulator in a phi (unless a
        `Let` before computed it in a shared loop: `join_reductions`)."""
        joined = self.joined.pop(id(e), None)
        if joined is not None:
            return joined[1]
        return self.reduce_axes(e, 0, self.expr(e.init))

    def join_reductions(self, stmts: Sequence[S.Stmt], k: int) -> None:
        """The reductions that the `Let` `stmts[k]` and the `Let`s right after it compute
        whatever happens (`_eager_reductions`), those over the same ranges in one loop
        nest carrying an accumulator each, where two or more are (each reads a row once
        from the cache, not once per reduction: a row's sum of deviations from its mean and
        of their squares, their vector parts and their tails). A later `Let`'s joins when it
        uses no value bound from `stmts[k]` on; the values wait in `joined` for their
        `Let`s. The reductions in a joined one's initial value are joined first."""
        if not any(id(r) not in self.joined for r in _eager_reductions(stmts[k].value)):
            return
        groups: dict[tuple[E.Expr, ...], list[E.Reduce]] = {}
        seen: set[int] = set()
        bound: set[int] = set()
        for s in stmts[k:]:
            if not isinstance(s, S.Let):
                break
            for r in _eager_reductions(s.value):
                if id(r) in self.joined or id(r) in seen or any(
                        isinstance(n, E.Var) and id(n) in bound for n in walk(r)):
                    continue
                seen.add(id(r))
                group = groups.setdefault(r.stops, [])
                if not any(n is m for m in group for n in walk(r.init)) and not any(
                        n is r for m in group for n in walk(m.init)):
                    group.append(r)
            bound.add(id(s.var))
        done: set[tuple[E.Expr, ...]] = set()

        def emit(stops: tuple[E.Expr, ...]) -> None:
            if stops in done:
                return
            done.add(stops)
            group = groups[stops]
            for inner in (n for r in group for n in _eager_reductions(r.init)):
                if inner.stops in groups:
                    emit(inner.stops)
            if len(group) >= 2:
                accs = self.join_axes(group, 0, [self.expr(r.init) for r in group])
                for r, acc in zip(group, accs):
                    self.joined[id(r)] = (r, acc)

        for stops in list(groups):
            emit(stops)

    def join_axes(self, reductions: list[E.Reduce], k: int, accs: list[ir.Value]) -> Any:
        if k == len(reductions[0].vars):
            out = []
            for r, acc in zip(reductions, accs):
                llvm_prefetch.prefetch_next_row(self, r)
                out.append(self.combine(r.row, acc, self.expr(r.body), r.dtype))
            return out
        var = reductions[0].vars[k]

        def body(carried: list[ir.Value]) -> list[ir.Value]:
            for r in reductions[1:]:
                self.vars[r.vars[k]] = self.vars[var]
            return self.join_axes(reductions, k + 1, carried)

        return self.loop(var, ir.Constant(I64, 0), self.expr(reductions[0].stops[k]),
                         body, accs, "r")

    def reduce_axes(self, e: E.Reduce, k: int, acc: ir.Value) -> ir.Value:
        if k == len(e.vars):
            llvm_prefetch.prefetch_next_row(self, e)
            return self.combine(e.row, acc, self.expr(e.body), e.dtype)
        var = e.vars[k]
        return self.loop(var, ir.Constant(I64, 0), self.expr(e.stops[k]),
                         lambda carried: self.reduce_axes(e, k + 1, carried), acc, "r")

    def visit_LaneReduce(self, e: E.LaneReduce) -> ir.Value:
        """Halves combined until one lane is left (the order `ir_eval` follows)."""
        b = self.builder
        v = self.expr(e.value)
        lanes = e.value.dtype.lanes
        undef = ir.Constant(v.type, ir.Undefined)
        while lanes > 2:
            half = lanes // 2
            mask = ir.VectorType(I32, half)
            lo = b.shuffle_vector(v, undef, ir.Constant(mask, list(range(half))))
            hi = b.shuffle_vector(v, undef, ir.Constant(mask, list(range(half, lanes))))
            v = self.combine(e.row, lo, hi, e.value.dtype.with_lanes(half))
            lanes = half
            undef = ir.Constant(v.type, ir.Undefined)
        lo, hi = (b.extract_element(v, ir.Constant(I32, k)) for k in (0, 1))
        return self.combine(e.row, lo, hi, e.dtype)

    def visit_Cmp(self, e: E.Cmp) -> ir.Value:
        a, dtype = self.to_compute(self.expr(e.a), e.a.dtype)
        bv, _ = self.to_compute(self.expr(e.b), e.b.dtype)
        predicate = e.row.llvm.pick(dtype)
        if dtype.is_float:  # llvmlite passes a predicate it does not map through as it is
            return self.builder.fcmp_ordered(predicate, a, bv)
        # llvmlite spells icmp by the C operator; the predicate's first letter is the signedness
        icmp = self.builder.icmp_unsigned if predicate[0] == "u" else self.builder.icmp_signed
        return icmp(e.op, a, bv)

    def visit_Select(self, e: E.Select) -> ir.Value:
        """An LLVM `select`; a scalar one with a reduction in a branch (`branches_reduce`)
        as a branch, so that only the side taken runs its loops."""
        if not branches_reduce(e):
            return self.builder.select(
                self.expr(e.cond), self.expr(e.true_value), self.expr(e.false_value)
            )
        b = self.builder
        blocks = [self.fn.append_basic_block(f"select.{side}") for side in ("true", "false")]
        done = self.fn.append_basic_block("select.done")
        b.cbranch(self.expr(e.cond), *blocks)
        incoming = []
        for block, value in zip(blocks, (e.true_value, e.false_value)):
            b.position_at_end(block)
            incoming.append((self.expr(value), b.block))
            b.branch(done)
        b.position_at_end(done)
        phi = b.phi(incoming[0][0].type)
        for value, block in incoming:
            phi.add_incoming(value, block)
        return phi

    def visit_Cast(self, e: E.Cast) -> ir.Value:
        return self.cast_value(self.expr(e.value), e.value.dtype, e.dtype)

    def visit_Bitcast(self, e: E.Bitcast) -> ir.Value:
        return self.builder.bitcast(self.expr(e.value), ll_type(e.dtype))

    def cast_value(self, v: ir.Value, src: Dtype, dst: Dtype) -> ir.Value:
        return llvm_math.emit_cast(self, v, src, dst)

    def visit_Call(self, e: E.Call) -> ir.Value:
        return llvm_math.emit_call(self, e)

    def address(self, buf: Buf, index: ir.Value) -> ir.Value:
        return self.builder.gep(self.bufs[buf.root], [index], source_etype=memory_type(buf.dtype))

    def lane_addresses(self, buf: Buf, index: E.Expr, lanes: int) -> list[ir.Value]:
        """The address of each lane of a vector `index` that is not a unit-stride Ramp: a
        Ramp of constant stride is one scalar address plus constant offsets (no vector of
        indices to build and take apart)."""
        b = self.builder
        if isinstance(index, E.Ramp) and isinstance(index.stride, E.Imm):
            first = self.address(buf, self.expr(index.base))
            etype = memory_type(buf.dtype)
            return [first] + [b.gep(first, [ir.Constant(I64, k * index.stride.value)],
                                    source_etype=etype) for k in range(1, lanes)]
        indices = self.expr(index)
        return [self.address(buf, b.extract_element(indices, ir.Constant(I32, k)))
                for k in range(lanes)]

    def visit_Load(self, e: E.Load) -> ir.Value:
        (index,) = e.indices
        b = self.builder
        mem = memory_type(e.buf.dtype)
        lanes = e.dtype.lanes
        if lanes == 1:
            v = b.load(self.address(e.buf, self.expr(index)), typ=mem)
        elif isinstance(index, E.Ramp) and E.is_const(index.stride, 1):
            ptr = self.address(e.buf, self.expr(index.base))
            v = b.load(ptr, typ=ir.VectorType(mem, lanes), align=e.buf.dtype.itemsize)
        elif (window := _window(index, lanes)) is not None:
            # lanes at constant offsets from one scalar index, within a vector's width: the
            # window in one load, its lanes picked by a shuffle (no load per lane)
            base, offsets = window
            first = min(offsets)
            ptr = self.address(e.buf, self.expr(base + first) if first else self.expr(base))
            width = max(offsets) - first + 1
            whole = b.load(ptr, typ=ir.VectorType(mem, width), align=e.buf.dtype.itemsize)
            mask = ir.Constant(ir.VectorType(I32, lanes), [k - first for k in offsets])
            v = b.shuffle_vector(whole, ir.Constant(whole.type, ir.Undefined), mask)
        else:
            v = ir.Constant(ir.VectorType(mem, lanes), ir.Undefined)
            for lane, ptr in enumerate(self.lane_addresses(e.buf, index, lanes)):
                v = b.insert_element(v, b.load(ptr, typ=mem), ir.Constant(I32, lane))
        if e.buf.dtype.is_bool:
            zero = ir.Constant(v.type, None)
            return b.icmp_unsigned("!=", v, zero)
        return v

    # -- statements -----------------------------------------------------------
    def stmt(self, s: S.Stmt) -> None:
        self.visit(s)

    def visit_Block(self, s: S.Block) -> None:
        for k, c in enumerate(s.stmts):
            if isinstance(c, S.Let):
                self.join_reductions(s.stmts, k)
            self.stmt(c)

    def visit_Let(self, s: S.Let) -> None:
        self.vars[s.var] = self.expr(s.value)

    def visit_Store(self, s: S.Store) -> None:
        (index,) = s.indices
        b = self.builder
        value = self.expr(s.value)
        lanes = s.value.dtype.lanes
        if s.buf.dtype.is_bool:
            value = b.zext(value, I8 if lanes == 1 else ir.VectorType(I8, lanes))
        if lanes == 1:
            b.store(value, self.address(s.buf, self.expr(index)))
        elif isinstance(index, E.Ramp) and E.is_const(index.stride, 1):
            store = b.store(value, self.address(s.buf, self.expr(index.base)),
                            align=s.buf.dtype.itemsize)
            if s.buf.root in self.streaming and _aligned(index.base, lanes, s.buf.dtype.itemsize):
                # Written once and not read back soon: bypass the caches. movnt needs
                # the vector's own alignment; torch allocates outputs 64-byte aligned.
                store.align = lanes * s.buf.dtype.itemsize
                store.set_metadata("nontemporal", self.module.add_metadata([ir.Constant(I32, 1)]))
                self.fence = True
        else:
            for lane, ptr in enumerate(self.lane_addresses(s.buf, index, lanes)):
                b.store(b.extract_element(value, ir.Constant(I32, lane)), ptr)

    def visit_For(self, s: S.For) -> None:
        if s.parallel and s.parallel_if is not None:  # decided at run time
            with self.builder.if_else(self.expr(s.parallel_if)) as (threads, serial):
                with threads:
                    llvm_parallel.emit_parallel_for(self, s)
                with serial:
                    self.loop(s.var, self.expr(s.start), self.expr(s.stop), s.body)
        elif s.parallel:
            llvm_parallel.emit_parallel_for(self, s)
        else:
            self.loop(s.var, self.expr(s.start), self.expr(s.stop), s.body)

    def loop(
        self,
        var: E.Var,
        start: ir.Value,
        stop: ir.Value,
        body: S.Stmt | Callable[[Any], Any],
        carried: ir.Value | list[ir.Value] | None = None,
        tag: str = "",
    ) -> Any:
        """A counted loop `for (var = start; var < stop; var++) body`. `body` is a statement,
        or, with a `carried` start value (a reduction's accumulator; or a list of them), a
        function from the value carried into an iteration to the one it carries out; then
        the loop's result is the value at its exit."""
        b = self.builder
        pre = b.block
        header = self.fn.append_basic_block(f"{var.name}.{tag}header")
        body_block = self.fn.append_basic_block(f"{var.name}.{tag}body")
        exit_ = self.fn.append_basic_block(f"{var.name}.{tag}exit")
        b.branch(header)
        b.position_at_end(header)
        i = b.phi(I64, name=var.name)
        i.add_incoming(start, pre)
        starts = [] if carried is None else carried if isinstance(carried, list) else [carried]
        phis = []
        for value in starts:
            phis.append(b.phi(value.type, name=f"{var.name}.acc"))
            phis[-1].add_incoming(value, pre)
        b.cbranch(b.icmp_signed("<", i, stop), body_block, exit_)
        b.position_at_end(body_block)
        self.vars[var] = i
        outs = []
        if carried is None:
            self.loops.append((var, set()))
            self.stmt(body)  # type: ignore[arg-type]
            self.loops.pop()
        elif isinstance(carried, list):
            outs = body(phis)  # type: ignore[operator]
        else:
            outs = [body(phis[0])]  # type: ignore[operator]
        i.add_incoming(b.add(i, ir.Constant(I64, 1)), b.block)
        for phi, value in zip(phis, outs):
            phi.add_incoming(value, b.block)
        latch = b.branch(header)
        if tag == "r" and not UNROLL_REDUCTIONS:
            latch.set_metadata("llvm.loop", self.loop_id("llvm.loop.unroll.disable"))
        b.position_at_end(exit_)
        if carried is None:
            return None
        return phis if isinstance(carried, list) else phis[0]

    def loop_id(self, *properties: str) -> ir.MDValue:
        """A new loop's `llvm.loop` metadata: a node that names itself first (distinct from
        every other loop's), then the `properties`."""
        module = self.module
        node = ir.values.MDValue(module, [], name=str(len(module.metadata)))
        node.operands = (node, *(module.add_metadata([ir.MetaDataString(module, p)])
                                 for p in properties))
        return node

    def visit_Allocate(self, s: S.Allocate) -> None:
        extent = s.buf.extent()
        if self.loops and isinstance(extent, E.Imm) and \
                0 < extent.value * s.buf.dtype.itemsize <= STACK_BYTES:  # type: ignore
            # a small buffer of a loop's body (`fuse_stored_reductions`' accumulators):
            # on the stack, where LLVM promotes it to registers; its Free is nothing
            b = self.builder
            here = b.block
            b.position_at_start(self.fn.entry_basic_block)
            slot = b.alloca(ir.ArrayType(memory_type(s.buf.dtype), extent.value),
                            name=s.buf.name)
            slot.align = 64
            slot.type = PTR  # llvmlite types an alloca's pointer; the other buffers' are opaque
            b.position_at_end(here)
            self.bufs[s.buf.root] = slot
            self.on_stack.add(s.buf.root)
            return
        malloc = self.declare("malloc", PTR, [I64])
        size = self.builder.mul(self.expr(s.buf.extent()), ir.Constant(I64, s.buf.dtype.itemsize))
        # malloc(0) may return NULL; ask for at least one byte.
        size = self.builder.select(
            self.builder.icmp_signed("<", size, ir.Constant(I64, 1)), ir.Constant(I64, 1), size
        )
        self.bufs[s.buf.root] = self.builder.call(malloc, [size])

    def visit_Free(self, s: S.Free) -> None:
        if s.buf.root in self.on_stack:
            return
        free = self.declare("free", ir.VoidType(), [PTR])
        self.builder.call(free, [self.bufs[s.buf.root]])


def _lane_offsets(index: E.Expr) -> tuple[E.Expr | None, list[int]] | None:
    """A vector index as a scalar index (None: 0) plus each lane's constant offset, else
    None: `Broadcast(i) + Ramp(0, 1, 4) % 2` is `(i, [0, 1, 0, 1])`."""
    if isinstance(index, E.Broadcast):
        return index.value, [0] * index.dtype.lanes
    if isinstance(index, E.Ramp) and isinstance(index.stride, E.Imm):
        step = index.stride.value
        return index.base, [k * step for k in range(index.dtype.lanes)]  # type: ignore
    if isinstance(index, E.Add):
        a, b = _lane_offsets(index.a), _lane_offsets(index.b)
        if a is None or b is None:
            return None
        bases = [x for x in (a[0], b[0]) if x is not None]
        base = bases[0] + bases[1] if len(bases) == 2 else (bases or [None])[0]
        return base, [x + y for x, y in zip(a[1], b[1])]
    if isinstance(index, E.Mul) and isinstance(index.a, E.Broadcast) and isinstance(
            index.a.value, E.Imm):
        split, c = _lane_offsets(index.b), index.a.value.value
        if split is None:
            return None
        return (None if split[0] is None else split[0] * c), [k * c for k in split[1]]
    if isinstance(index, (E.Div, E.Mod)) and isinstance(index.b, E.Broadcast) and isinstance(
            index.b.value, E.Imm) and index.b.value.value > 0:
        # (b + k) / c = b / c + k / c and (b + k) % c = k % c where c divides b, b >= 0 (a
        # sum of loop variables' multiples) and k >= 0
        c, split = index.b.value.value, _lane_offsets(index.a)
        form = split and split[0] is not None and linear(split[0])
        if split and min(split[1]) >= 0 and (split[0] is None or form and form.const >= 0 and (
                form.const % c == 0 and all(isinstance(v, E.Var) and k > 0 and k % c == 0
                                            for v, k in form.terms.items()))):
            if isinstance(index, E.Mod):
                return None, [k % c for k in split[1]]
            return (None if split[0] is None else split[0] / c), [k // c for k in split[1]]
    if any(isinstance(n, (E.Var, E.Load, E.Reduce)) for n in walk(index)):
        return None
    return None, [int(k) for k in evaluate(index)]


def _window(index: E.Expr, lanes: int) -> tuple[E.Expr, list[int]] | None:
    """`index` as a scalar index and constant lane offsets that span fewer than `2 * lanes`
    elements (two vectors' loads hold them all: a stride of 2, a lane repeated), else None."""
    split = _lane_offsets(index)
    if split is None or max(split[1]) - min(split[1]) >= 2 * lanes:
        return None
    return (split[0] if split[0] is not None else E.imm(0)), split[1]


def _aligned(base: E.Expr, lanes: int, itemsize: int) -> bool:
    """Whether element offset `base` is a multiple of `lanes`, vectors of at most 64 bytes."""
    size = lanes * itemsize
    if size > 64 or size & (size - 1):
        return False
    form = linear(base)
    return all(c % lanes == 0 for c in form.terms.values()) and form.const % lanes == 0


def _float_select(cg: LLVMCodeGen, x: Any, y: Any, lhs: Any, rhs: Any) -> Any:
    """`y if lhs < rhs else x`, and y where y is NaN: NaN in, NaN out (x's NaN fails `<`).

    LLVM merges the two selects into one over `lhs < rhs or y is NaN` (two compares, an
    or of masks, a blend); with AVX-512, float32 vectors take the first select as vmaxps
    or vminps instead (which give the second operand where one is NaN or both are equal,
    as `<` does: of two equal zeros, x, here and in the interpreter; eager's vector loop
    gives its second operand, its scalar tail its first), so that the NaN's is the only
    compare: 3 instructions for 4 (a softmax's row max; 4096 x 1024 at 1 thread 2.03 ->
    1.99 ms, 32768 x 128 1.52 -> 1.49)."""
    out = _ordered_select(cg, x, y, lhs, rhs)
    return cg.builder.select(cg.builder.fcmp_unordered("uno", y, y), y, out)


def _ordered_select(cg: LLVMCodeGen, x: Any, y: Any, lhs: Any, rhs: Any) -> Any:
    """`y if lhs < rhs else x` (a NaN gives x): `MaxOrdered`, and `_float_select`'s first."""
    out = _x86_min_max(cg, x, y, lhs, rhs)
    if out is None:
        out = cg.builder.select(cg.builder.fcmp_ordered("<", lhs, rhs), y, x)
    return out


def _x86_min_max(cg: LLVMCodeGen, x: Any, y: Any, lhs: Any, rhs: Any) -> Any | None:
    """`y if lhs < rhs else x` as vmaxps (y is rhs: max) or vminps (y is lhs: min), 16
    float32 lanes at a time, where the host has AVX-512; else None."""
    kind = x.type
    if not (isinstance(kind, ir.VectorType) and kind.element == ir.FloatType()
            and kind.count % 16 == 0 and cg.vector_bits >= 512):
        return None
    if y is rhs and x is lhs:
        name, first, second = "max", y, x  # (y > x) ? y : x
    elif y is lhs and x is rhs:
        name, first, second = "min", y, x  # (y < x) ? y : x
    else:
        return None
    f16 = ir.VectorType(ir.FloatType(), 16)
    fn = cg.declare(f"llvm.x86.avx512.{name}.ps.512", f16, [f16, f16, I32])
    parts = [cg.builder.call(fn, [llvm_math.slice_lanes(cg, first, k, 16),
                                  llvm_math.slice_lanes(cg, second, k, 16),
                                  ir.Constant(I32, 4)])
             for k in range(0, kind.count, 16)]
    return llvm_math.concat_lanes(cg, parts)


def _int_select(cg: LLVMCodeGen, signed: bool, x: Any, y: Any, lhs: Any, rhs: Any) -> Any:
    b = cg.builder
    less = b.icmp_signed("<", lhs, rhs) if signed else b.icmp_unsigned("<", lhs, rhs)
    return b.select(less, y, x)


#: Emitters for the `ops.Emit` names that are not single instructions, as
#: `(codegen, row, operands, dtype) -> value`; max is `b if a < b else a`, min `b if b < a else a`.
EMITTERS: dict[str, Callable[[LLVMCodeGen, ops.Op, Sequence[Any], Dtype], Any]] = {
    "max_nan": lambda cg, row, args, dt: _float_select(cg, *args, *args),
    "min_nan": lambda cg, row, args, dt: _float_select(cg, *args, *reversed(args)),
    "max_ordered": lambda cg, row, args, dt: _ordered_select(cg, *args, *args),
    "smax": lambda cg, row, args, dt: _int_select(cg, True, *args, *args),
    "smin": lambda cg, row, args, dt: _int_select(cg, True, *args, *reversed(args)),
    "umax": lambda cg, row, args, dt: _int_select(cg, False, *args, *args),
    "umin": lambda cg, row, args, dt: _int_select(cg, False, *args, *reversed(args)),
    **llvm_math.EMITTERS,
}


def _unlink(module: ir.Module) -> None:
    """Take `module` apart once its text is made, so that reference counting frees it: its
    values point up (an instruction to its block, a block or argument to its function, a
    function to the module) and down, cycles that only a garbage collection frees; the
    compile's collection, paused (`jit/specialize/collector.py`), walks them all when it ends
    (MobileNetV2's training step: ~90k llvmlite objects, the most of what it finds)."""
    for value in module.globals.values():
        if isinstance(value, ir.Function):
            for block in value.blocks:
                for instruction in block.instructions:
                    if isinstance(instruction, ir.PhiInstr):  # a loop's variable and its next
                        instruction.incomings = []
                block.instructions, block.terminator = [], None
            value.blocks, value.args, value.return_value = [], (), None
    module.globals.clear()


def compile_stmt(
    stmt: S.Stmt,
    params: Sequence[Buf | E.Var],
    name: str = "fused",
    release_gil: bool = True,
    streaming: frozenset[Buf] = frozenset(),
) -> JitFunction:
    """Generate, optimize and JIT `stmt`; log the stages at `>>llvm_codegen`.

    `release_gil=False` makes calls cheaper (tens of ns) for kernels that finish
    quickly; `streaming` outputs (fresh, 64-byte aligned) get non-temporal stores.
    """
    # An output the kernel reads back (a temporary kept in it, `reuse_outputs`) must stay
    # in the caches: no streaming stores for it; nor for the outputs of kernels with
    # reductions (layer_norm, softmax: rows read from the caches several times, prefetched
    # ahead), which they made slower. 16 MB outputs, 1 thread, with -> without: softmax
    # 1.97-2.00 -> 1.58-1.60 ms (it computed each exp twice to write its output once),
    # log_softmax 2.2-2.5 -> 1.7, 1024 x 4096 softmax 2.2-2.4 -> 2.07, layer_norm (12 MB)
    # 1.18 -> 1.08, rms_norm 1.09 -> 1.05, residual + layer_norm even; elementwise kernels
    # keep them (a multiply 3.4 -> 3.0 with them).
    nodes = list(walk(stmt))
    read = {n.buf.root for n in nodes if isinstance(n, E.Load)}
    reduces = any(isinstance(n, E.Reduce) for n in nodes)
    streaming = frozenset(b for b in streaming if b.root not in read and not reduces)
    cg = LLVMCodeGen(stmt, params, name, streaming)
    text = cg.ir_text()
    _unlink(cg.module)
    _log.debug("LLVM module before optimizations\n", text)
    fn = compile_ir(text, name, None, [param_ctype(p) for p in params], release_gil)
    if _log.enabled(log.DEBUG):
        _log.debug("LLVM module after optimizations\n", fn.optimized_ir)
        _log.debug("LLVM generated assembly code\n", fn.assembly)
    return fn
