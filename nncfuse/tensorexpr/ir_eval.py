"""An interpreter for the loop IR: the reference semantics every backend is tested against.

The statement is translated once into nested Python closures (one per node)
over numpy scalars and arrays; running it calls the closures. Vectors are
numpy arrays, scalars numpy scalars of the node's dtype, so integer
arithmetic wraps and float32 math rounds as compiled code does. bfloat16,
which numpy lacks, is held in float32 values rounded to bfloat16 after every
operation and stored as its 16 bits. What each operator computes is its
row's numpy function (`ops`); this module applies them, node by node.

Semantics that C leaves open are pinned down here and matched by LLVM codegen:
float-to-integer conversion goes through int32 (int64 for 64-bit targets),
yielding that type's minimum when out of range or NaN, then wraps.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import numpy as np
import torch

from . import expr as E
from . import stmt as S
from .buffer import Buf
from .dtype import Dtype
from .external import ROUTINES
from .ir_visitor import Visitor

Env = dict[int, Any]
Fn = Callable[[Env], Any]


def _np_dtype(dtype: Dtype) -> np.dtype:
    if dtype.name == "bfloat16":
        return np.dtype(np.float32)
    return np.dtype(dtype.name)


def _round_bf16(x: Any) -> Any:
    """float32 values rounded to the nearest bfloat16 (ties to even), as float32."""
    a = np.asarray(x, dtype=np.float32)
    bits = a.view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
    out = np.where(np.isnan(a), a, rounded.astype(np.uint32).view(np.float32))
    return out.astype(np.float32) if np.ndim(x) else np.float32(out)


def bf16_bits(x: Any) -> Any:
    return (np.asarray(_round_bf16(x), dtype=np.float32).view(np.uint32) >> 16).astype(np.uint16)


def _frombf16_bits(bits: Any) -> Any:
    return (np.asarray(bits).astype(np.uint32) << 16).view(np.float32)


def cast_value(value: Any, src: Dtype, dst: Dtype) -> Any:
    """`value` of type `src` converted to `dst` with the IR's Cast semantics."""
    v = np.asarray(value)
    if dst.is_bool:
        out = v != 0
    elif dst.is_int and src.is_float:
        wide = np.int64 if dst.bits == 64 else np.int32
        info = np.iinfo(wide)
        ok = (v > info.min - 1.0) & (v < info.max + 1.0)
        tmp = np.where(ok, np.trunc(np.where(ok, v, 0)), 0).astype(wide)
        out = np.where(ok, tmp, info.min).astype(wide).astype(_np_dtype(dst))
    else:
        out = v.astype(_np_dtype(dst))
        if dst.name == "bfloat16":
            out = _round_bf16(out)
    return out if np.ndim(value) else out[()]


class _Compiler(Visitor):
    """Turns IR nodes into closures over an environment of variable values."""

    def __init__(self, buffers: dict[Buf, int], slots: dict[E.Var, int]):
        self.buffers = buffers  # root buffer -> slot holding its flat numpy array
        self.slots = slots

    def slot(self, var: E.Var) -> int:
        if var not in self.slots:
            self.slots[var] = len(self.slots) + len(self.buffers)
        return self.slots[var]

    def buffer_slot(self, buf: Buf) -> int:
        root = buf.root
        if root not in self.buffers:
            self.buffers[root] = -1 - len(self.buffers)
        return self.buffers[root]

    # -- expressions ----------------------------------------------------------
    def expr(self, e: E.Expr) -> Fn:
        fn = self.visit(e)
        if e.dtype.name == "bfloat16" and not isinstance(e, (E.Load, E.Var, E.Imm)):
            inner = fn
            return lambda env: _round_bf16(inner(env))
        return fn

    def generic_visit(self, node: E.Expr | S.Stmt) -> Fn:
        raise TypeError(f"cannot evaluate {type(node).__name__}")

    def visit_Imm(self, e: E.Imm) -> Fn:
        value = _np_dtype(e.dtype).type(e.value)
        return lambda env: value

    def visit_Var(self, e: E.Var) -> Fn:
        slot = self.slot(e)
        return lambda env: env[slot]

    def visit_BinaryOp(self, e: E.BinaryOp) -> Fn:
        a, b, row = self.expr(e.a), self.expr(e.b), e.row
        if e.dtype.is_bool and not row.accepts(e.dtype):
            raise TypeError("arithmetic on bool")
        op = row.interp if e.dtype.is_float else (row.interp_int or row.interp)
        return lambda env: op(a(env), b(env))

    def visit_Cmp(self, e: E.Cmp) -> Fn:
        a, b, op = self.expr(e.a), self.expr(e.b), e.row.interp
        return lambda env: op(a(env), b(env))

    def visit_Select(self, e: E.Select) -> Fn:
        c, t, f = self.expr(e.cond), self.expr(e.true_value), self.expr(e.false_value)
        if e.dtype.lanes == 1:
            return lambda env: t(env) if c(env) else f(env)
        return lambda env: np.where(c(env), t(env), f(env))

    def visit_Cast(self, e: E.Cast) -> Fn:
        v, src, dst = self.expr(e.value), e.value.dtype, e.dtype
        return lambda env: cast_value(v(env), src, dst)

    def visit_Bitcast(self, e: E.Bitcast) -> Fn:
        return self._bitcast(self.expr(e.value), e.value.dtype, e.dtype)

    def visit_Call(self, e: E.Call) -> Fn:
        fn, args, nd = e.row.interp, [self.expr(a) for a in e.args], _np_dtype(e.dtype)
        if e.dtype.lanes == 1:
            return lambda env: nd.type(fn(*(a(env) for a in args)))
        return lambda env: np.asarray(fn(*(a(env) for a in args)), dtype=nd)

    def visit_Reduce(self, e: E.Reduce) -> Fn:
        combine = e.row.interp if e.dtype.is_float else (e.row.interp_int or e.row.interp)
        init, body = self.expr(e.init), self.expr(e.body)
        slots = [self.slot(v) for v in e.vars]
        stops = [self.expr(s) for s in e.stops]
        nd = _np_dtype(e.dtype)
        bf16 = e.dtype.name == "bfloat16"
        last = len(slots) - 1

        def run(env: Env) -> Any:
            acc = init(env)
            bounds = [int(s(env)) for s in stops]

            def axis(k: int, acc: Any) -> Any:
                slot = slots[k]
                for i in range(bounds[k]):
                    env[slot] = np.int64(i)
                    if k == last:
                        acc = combine(acc, body(env))
                        acc = _round_bf16(acc) if bf16 else acc
                    else:
                        acc = axis(k + 1, acc)
                return acc

            out = axis(0, acc)
            return np.asarray(out, dtype=nd) if e.dtype.lanes > 1 else nd.type(out)

        return run

    def visit_LaneReduce(self, e: E.LaneReduce) -> Fn:
        value = self.expr(e.value)
        combine = e.row.interp if e.dtype.is_float else (e.row.interp_int or e.row.interp)
        nd = _np_dtype(e.dtype)
        bf16 = e.dtype.name == "bfloat16"

        def run(env: Env) -> Any:
            v = np.asarray(value(env))
            while v.shape[0] > 1:
                half = v.shape[0] // 2
                v = np.asarray(combine(v[:half], v[half:]))
                v = _round_bf16(v) if bf16 else v
            return nd.type(v[0])

        return run

    def visit_Ramp(self, e: E.Ramp) -> Fn:
        base, stride = self.expr(e.base), self.expr(e.stride)
        steps = np.arange(e.lanes, dtype=np.int64)
        return lambda env: base(env) + stride(env) * steps

    def visit_Broadcast(self, e: E.Broadcast) -> Fn:
        v, lanes, nd = self.expr(e.value), e.lanes, _np_dtype(e.dtype)
        return lambda env: np.full(lanes, v(env), dtype=nd)

    def _bitcast(self, v: Fn, src: Dtype, dst: Dtype) -> Fn:
        def run(env: Env) -> Any:
            x = np.asarray(v(env))
            if src.name == "bfloat16":
                x = bf16_bits(x)
            out = x.view(np.uint16 if dst.name == "bfloat16" else _np_dtype(dst))
            if dst.name == "bfloat16":
                out = _frombf16_bits(out)
            return out if x.ndim else out[()]

        return run

    def offset(self, buf: Buf, indices: tuple[E.Expr, ...]) -> Fn:
        parts = [(self.expr(i), self.expr(s)) for i, s in zip(indices, buf.strides)]
        if not parts:
            return lambda env: np.int64(0)
        return lambda env: sum(i(env) * s(env) for i, s in parts)

    def visit_Load(self, e: E.Load) -> Fn:
        slot, offset = self.buffer_slot(e.buf), self.offset(e.buf, e.indices)
        lanes = e.dtype.lanes
        bf16 = e.buf.dtype.name == "bfloat16"

        def load(env: Env) -> Any:
            off = offset(env)
            if lanes > 1:
                off = np.broadcast_to(off, (lanes,))
            value = env[slot][off]
            return _frombf16_bits(value) if bf16 else value

        return load

    # -- statements -----------------------------------------------------------
    def stmt(self, s: S.Stmt) -> Callable[[Env], None]:
        return self.visit(s)

    def visit_Block(self, s: S.Block) -> Callable[[Env], None]:
        parts = [self.stmt(c) for c in s.stmts]

        def block(env: Env) -> None:
            for p in parts:
                p(env)

        return block

    def visit_For(self, s: S.For) -> Callable[[Env], None]:
        slot, start, stop = self.slot(s.var), self.expr(s.start), self.expr(s.stop)
        body = self.stmt(s.body)

        def loop(env: Env) -> None:
            for i in range(int(start(env)), int(stop(env))):
                env[slot] = np.int64(i)
                body(env)

        return loop

    def visit_Let(self, s: S.Let) -> Callable[[Env], None]:
        slot, value = self.slot(s.var), self.expr(s.value)

        def let(env: Env) -> None:
            env[slot] = value(env)

        return let

    def visit_Allocate(self, s: S.Allocate) -> Callable[[Env], None]:
        slot, buf = self.buffer_slot(s.buf), s.buf
        size = self.expr(buf.extent())
        storage = np.uint16 if buf.dtype.name == "bfloat16" else _np_dtype(buf.dtype)

        def allocate(env: Env) -> None:
            env[slot] = np.zeros(int(size(env)), dtype=storage)

        return allocate

    def visit_Free(self, s: S.Free) -> Callable[[Env], None]:
        slot = self.buffer_slot(s.buf)
        return lambda env: env.pop(slot, None)

    def visit_ExternalCall(self, s: S.ExternalCall) -> Callable[[Env], None]:
        fn = ROUTINES[s.fn]
        operands: list[Callable[[Env], Any]] = []
        for a in s.args:
            if isinstance(a, Buf):
                operands.append(partial(_tensor_view, self.buffer_slot(a), a))
            elif isinstance(a, E.Expr):
                operands.append(_as_number(self.expr(a)))
            else:
                operands.append(lambda env, v=a: v)
        slot, out = self.buffer_slot(s.buf), s.buf

        def call(env: Env) -> None:
            with torch.no_grad():
                result = fn(*(op(env) for op in operands))
            _tensor_view(slot, out, env).copy_(result)

        return call

    def visit_Store(self, s: S.Store) -> Callable[[Env], None]:
        slot, offset = self.buffer_slot(s.buf), self.offset(s.buf, s.indices)
        value = self.expr(s.value)
        bf16 = s.buf.dtype.name == "bfloat16"

        def store(env: Env) -> None:
            v = value(env)
            env[slot][offset(env)] = bf16_bits(v) if bf16 else v

        return store


def _as_number(fn: Fn) -> Callable[[Env], Any]:
    return lambda env: fn(env).item()


def _tensor_view(slot: int, buf: Buf, env: Env) -> torch.Tensor:
    """The tensor of `buf`'s sizes and strides over its memory in `env` (for library calls)."""
    flat = torch.from_numpy(env[slot])
    if buf.dtype.name == "bfloat16":
        flat = flat.view(torch.int16).view(torch.bfloat16)
    sizes = buf.static_dims()
    strides = tuple(getattr(s, "value", None) for s in buf.strides)
    if sizes is None or None in strides:
        raise NotImplementedError(f"an external call on {buf.name}, of symbolic sizes")
    return flat.as_strided(sizes, strides)


def evaluate(e: E.Expr, env: dict[E.Var, Any] | None = None) -> Any:
    """The value of an expression that loads no buffers, given values for its variables."""
    slots: dict[E.Var, int] = {}
    fn = _Compiler({}, slots).expr(e)
    values = {slot: _np_dtype(v.dtype).type((env or {})[v]) for v, slot in slots.items()}
    with np.errstate(all="ignore"):
        return np.asarray(fn(values))


def tensor_memory(t: torch.Tensor) -> np.ndarray:
    """A flat numpy view of the memory a strided tensor addresses (bfloat16 as uint16)."""
    extent = 0
    if t.numel():
        extent = 1 + sum((d - 1) * s for d, s in zip(t.shape, t.stride()))
    flat = torch.as_strided(t.detach(), (extent,), (1,), t.storage_offset())
    if t.dtype == torch.bfloat16:
        return flat.view(torch.int16).numpy().view(np.uint16)
    return flat.numpy()


class IREvaluator:
    """Runs a statement over tensors and scalars bound to its parameters."""

    def __init__(self, stmt: S.Stmt, params: Sequence[Buf | E.Var]):
        self.params = list(params)
        buffers: dict[Buf, int] = {}
        slots: dict[E.Var, int] = {}
        compiler = _Compiler(buffers, slots)
        self.param_slots = [
            compiler.buffer_slot(p) if isinstance(p, Buf) else compiler.slot(p) for p in self.params
        ]
        self.run_stmt = compiler.stmt(stmt)

    def run(self, args: Sequence[Any]) -> None:
        """Execute with `args[i]` bound to `params[i]`: tensors for Bufs, numbers for Vars."""
        env: Env = {}
        for param, slot, arg in zip(self.params, self.param_slots, args):
            if isinstance(param, Buf):
                env[slot] = tensor_memory(arg)
            else:
                env[slot] = _np_dtype(param.dtype).type(arg)
        with np.errstate(all="ignore"):
            self.run_stmt(env)
