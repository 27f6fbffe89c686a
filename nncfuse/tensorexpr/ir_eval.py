"""An interpreter for the loop IR: the reference semantics every backend is tested against.

The statement is translated once into nested Python closures (one per node)
over numpy scalars and arrays; running it calls the closures. Vectors are
numpy arrays, scalars numpy scalars of the node's dtype, so integer
arithmetic wraps and float32 math rounds as compiled code does. bfloat16,
which numpy lacks, is held in float32 values rounded to bfloat16 after every
operation and stored as its 16 bits.

Semantics that C leaves open are pinned down here and matched by LLVM codegen:
float-to-integer conversion goes through int32 (int64 for 64-bit targets),
yielding that type's minimum when out of range or NaN, then wraps.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from fractions import Fraction
from typing import Any

import numpy as np
import torch

from . import expr as E
from . import stmt as S
from .buffer import Buf
from .dtype import Dtype

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


def _trunc_div(a: Any, b: Any) -> Any:
    safe_b = np.where(b == 0, 1, b)
    q = a // safe_b
    fix = (a % safe_b != 0) & ((a < 0) != (safe_b < 0))
    return (q + fix.astype(q.dtype)).astype(q.dtype)


def _max(a: Any, b: Any) -> Any:
    out = np.where(a < b, b, a)
    if np.issubdtype(out.dtype, np.floating):
        out = np.where(np.isnan(b), b, out)
    return out


def _min(a: Any, b: Any) -> Any:
    out = np.where(b < a, b, a)
    if np.issubdtype(out.dtype, np.floating):
        out = np.where(np.isnan(b), b, out)
    return out


def _powi(a: Any, b: Any) -> Any:
    """Integer `a ** b` by squaring, wrapping around; `b < 0` as ATen's powi (`E.INTRINSICS`)."""
    a, b = np.asarray(a), np.asarray(b)
    result, base = np.ones_like(a), a
    for bit in range(8 * a.dtype.itemsize):
        result = np.where((b >> bit) & 1 != 0, result * base, result)
        base = base * base
    if np.issubdtype(a.dtype, np.signedinteger):
        at_minus_one = np.where(b & 1 != 0, -1, 1)
        small = np.where(a == 1, 1, np.where(a == -1, at_minus_one, 0))
        result = np.where(b < 0, small, result)
    return result.astype(a.dtype)


def _fma(a: Any, b: Any, c: Any) -> Any:
    """`a * b + c` rounded once, as the fma instruction; numpy has none, so in exact rationals."""
    a, b, c = np.broadcast_arrays(np.asarray(a), np.asarray(b), np.asarray(c))
    out = np.empty(a.shape, a.dtype)
    for k in np.ndindex(a.shape):
        out[k] = _fma_scalar(a[k], b[k], c[k])
    return out


def _fma_scalar(a: Any, b: Any, c: Any) -> Any:
    kind = a.dtype.type
    if not (np.isfinite(a) and np.isfinite(b)):
        return kind(a * b + c)  # an infinite or NaN product is exact
    if not np.isfinite(c):
        return c
    exact = Fraction(float(a)) * Fraction(float(b)) + Fraction(float(c))
    if exact == 0:  # the sign of a zero sum follows IEEE addition
        return kind(float(a) * float(b) + float(c))
    try:
        r = kind(float(exact))  # float() of a Fraction rounds correctly to float64
    except OverflowError:
        return kind(np.inf if exact > 0 else -np.inf)
    if not np.isfinite(r) or Fraction(float(r)) == exact:
        return r
    # Rounding through float64 can round twice: take the nearer neighbour, ties to even.
    other = np.nextafter(r, kind(np.inf if exact > Fraction(float(r)) else -np.inf))
    if np.isfinite(other):
        beyond = Fraction(float(other))
    else:  # r is the largest finite value: rounding treats infinity as one ulp further out
        beyond = 2 * Fraction(float(r)) - Fraction(float(np.nextafter(r, kind(0))))
    near, far = abs(exact - Fraction(float(r))), abs(exact - beyond)
    if far < near or (far == near and int(other.view(f"u{other.itemsize}")) % 2 == 0):
        return other
    return r


def _torch_fn(name: str) -> Callable[..., Any]:
    fn = getattr(torch.special, name, None) or getattr(torch, name)

    def apply(*args: Any) -> Any:
        return fn(*(torch.from_numpy(np.asarray(a)) for a in args)).numpy()

    return apply


def _overflowing_early(fn: Callable[..., Any]) -> Callable[..., Any]:
    """sinh or cosh as SLEEF computes them: infinite once |x| > log(max float), where exp
    overflows, though the true value is finite up to log(2 max). Eager's vector loops
    (and so compiled kernels) use SLEEF; this keeps the interpreter their oracle."""

    def apply(x: Any) -> Any:
        x = np.asarray(x)
        y = fn(x)
        big = np.abs(x) > np.log(np.finfo(x.dtype).max)
        return np.where(big, np.copysign(np.inf, y), y)

    return apply


_CALLS: dict[str, Callable[..., Any]] = {
    "sin": np.sin,
    "cos": np.cos,
    "tan": np.tan,
    "asin": np.arcsin,
    "acos": np.arccos,
    "atan": np.arctan,
    "sinh": _overflowing_early(np.sinh),
    "cosh": _overflowing_early(np.cosh),
    "tanh": np.tanh,
    "asinh": np.arcsinh,
    "acosh": np.arccosh,
    "atanh": np.arctanh,
    "exp": np.exp,
    "exp2": np.exp2,
    "expm1": np.expm1,
    "log": np.log,
    "log2": np.log2,
    "log10": np.log10,
    "log1p": np.log1p,
    "sqrt": np.sqrt,
    "abs": np.abs,
    "floor": np.floor,
    "ceil": np.ceil,
    "trunc": np.trunc,
    "rint": np.rint,
    "erf": _torch_fn("erf"),
    "erfc": _torch_fn("erfc"),
    "lgamma": _torch_fn("lgamma"),
    # numpy's power takes a square root for an exponent of 0.5, so pow(-inf, 0.5) is NaN and
    # pow(-0.0, 0.5) is -0.0; C's pow (eager's, SLEEF's) gives inf and 0.0.
    "pow": _torch_fn("pow"),
    "atan2": np.arctan2,
    "fmod": np.fmod,
    "copysign": np.copysign,
    "nextafter": np.nextafter,
    "powi": _powi,
    "fma": _fma,
}

_BINARY: dict[type, Callable[[Any, Any], Any]] = {
    E.Add: np.add,
    E.Sub: np.subtract,
    E.Mul: np.multiply,
    E.Max: _max,
    E.Min: _min,
    E.And: np.bitwise_and,
    E.Or: np.bitwise_or,
    E.Xor: np.bitwise_xor,
    E.Shl: np.left_shift,
    E.Shr: np.right_shift,
}
_CMP: dict[str, Callable[[Any, Any], Any]] = {
    "==": np.equal,
    "!=": np.not_equal,
    "<": np.less,
    "<=": np.less_equal,
    ">": np.greater,
    ">=": np.greater_equal,
}


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


class _Compiler:
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
        fn = self._expr(e)
        if e.dtype.name == "bfloat16" and not isinstance(e, (E.Load, E.Var, E.Imm)):
            inner = fn
            return lambda env: _round_bf16(inner(env))
        return fn

    def _expr(self, e: E.Expr) -> Fn:
        nd = _np_dtype(e.dtype)
        if isinstance(e, E.Imm):
            value = nd.type(e.value)
            return lambda env: value
        if isinstance(e, E.Var):
            slot = self.slot(e)
            return lambda env: env[slot]
        if isinstance(e, E.BinaryOp):
            return self._binary(e, nd)
        if isinstance(e, E.Cmp):
            a, b, op = self.expr(e.a), self.expr(e.b), _CMP[e.op]
            return lambda env: op(a(env), b(env))
        if isinstance(e, E.Select):
            c, t, f = self.expr(e.cond), self.expr(e.true_value), self.expr(e.false_value)
            if e.dtype.lanes == 1:
                return lambda env: t(env) if c(env) else f(env)
            return lambda env: np.where(c(env), t(env), f(env))
        if isinstance(e, E.Cast):
            v, src, dst = self.expr(e.value), e.value.dtype, e.dtype
            return lambda env: cast_value(v(env), src, dst)
        if isinstance(e, E.Bitcast):
            v, src = self.expr(e.value), e.value.dtype
            return self._bitcast(v, src, e.dtype)
        if isinstance(e, E.Call):
            fn, args = _CALLS[e.name], [self.expr(a) for a in e.args]
            return lambda env: (
                nd.type(fn(*(a(env) for a in args)))
                if e.dtype.lanes == 1
                else (np.asarray(fn(*(a(env) for a in args)), dtype=nd))
            )
        if isinstance(e, E.Ramp):
            base, stride, lanes = self.expr(e.base), self.expr(e.stride), e.lanes
            steps = np.arange(lanes, dtype=np.int64)
            return lambda env: base(env) + stride(env) * steps
        if isinstance(e, E.Broadcast):
            v, lanes = self.expr(e.value), e.lanes
            return lambda env: np.full(lanes, v(env), dtype=nd)
        if isinstance(e, E.Load):
            return self._load(e)
        raise TypeError(f"cannot evaluate {type(e).__name__}")

    def _binary(self, e: E.BinaryOp, nd: np.dtype) -> Fn:
        a, b = self.expr(e.a), self.expr(e.b)
        if isinstance(e, (E.Div, E.Mod)) and not e.dtype.is_float:
            if isinstance(e, E.Div):
                return lambda env: (
                    nd.type(_trunc_div(a(env), b(env)))
                    if e.dtype.lanes == 1
                    else (_trunc_div(a(env), b(env)))
                )
            return lambda env: np.fmod(a(env), b(env))
        if isinstance(e, E.Div):
            op = np.divide
        elif isinstance(e, E.Mod):
            op = np.fmod
        else:
            op = _BINARY[type(e)]
        if e.dtype.is_bool and op in (np.add, np.multiply):
            raise TypeError("arithmetic on bool")
        return lambda env: op(a(env), b(env))

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

    def _load(self, e: E.Load) -> Fn:
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
        if isinstance(s, S.Block):
            parts = [self.stmt(c) for c in s.stmts]

            def block(env: Env) -> None:
                for p in parts:
                    p(env)

            return block
        if isinstance(s, S.For):
            slot, start, stop, body = self.slot(s.var), self.expr(s.start), self.expr(s.stop), None
            body = self.stmt(s.body)

            def loop(env: Env) -> None:
                for i in range(int(start(env)), int(stop(env))):
                    env[slot] = np.int64(i)
                    body(env)

            return loop
        if isinstance(s, S.Let):
            slot, value = self.slot(s.var), self.expr(s.value)

            def let(env: Env) -> None:
                env[slot] = value(env)

            return let
        if isinstance(s, S.Store):
            return self._store(s)
        if isinstance(s, S.Allocate):
            slot, buf = self.buffer_slot(s.buf), s.buf
            size = self.expr(buf.extent())
            storage = np.uint16 if buf.dtype.name == "bfloat16" else _np_dtype(buf.dtype)

            def allocate(env: Env) -> None:
                env[slot] = np.zeros(int(size(env)), dtype=storage)

            return allocate
        if isinstance(s, S.Free):
            slot = self.buffer_slot(s.buf)
            return lambda env: env.pop(slot, None)
        raise TypeError(f"cannot evaluate {type(s).__name__}")

    def _store(self, s: S.Store) -> Callable[[Env], None]:
        slot, offset, value = self.buffer_slot(s.buf), self.offset(s.buf, s.indices), None
        value = self.expr(s.value)
        bf16 = s.buf.dtype.name == "bfloat16"

        def store(env: Env) -> None:
            v = value(env)
            env[slot][offset(env)] = bf16_bits(v) if bf16 else v

        return store


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
