"""Conversions and math calls for llvm_codegen.

Casts follow `ir_eval.cast_value`: float to integer converts to int32
(int64 for 64-bit targets) with out-of-range and NaN giving that type's
minimum, as x86's cvtt instructions do, then wraps to the target width.
Vector intrinsics call SLEEF in chunks of the widest width it offers
(`vecmath`), or run lane by lane where it has no such function.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import llvmlite.ir as ir

from .. import expr as E
from ..dtype import BOOL, FLOAT32, Dtype
from . import vecmath

if TYPE_CHECKING:
    from .llvm_codegen import LLVMCodeGen

I32 = ir.IntType(32)


def _fbits(dtype: Dtype) -> int:
    return {"float16": 16, "float32": 32, "float64": 64}[dtype.name]


def emit_cast(cg: LLVMCodeGen, v: Any, src: Dtype, dst: Dtype) -> Any:
    from .llvm_codegen import ll_type

    b = cg.builder
    lanes = src.lanes
    src, dst = src.scalar, dst.scalar
    if src == dst:
        return v
    if src.name == "bfloat16":
        return emit_cast(
            cg, cg.bf16_to_f32(v, lanes), FLOAT32.with_lanes(lanes), dst.with_lanes(lanes)
        )
    if dst.name == "bfloat16":
        f = emit_cast(cg, v, src.with_lanes(lanes), FLOAT32.with_lanes(lanes))
        return cg.f32_to_bf16(f, lanes)
    target = ll_type(dst.with_lanes(lanes))
    if dst.is_bool:
        zero = ir.Constant(v.type, None)
        return b.fcmp_unordered("!=", v, zero) if src.is_float else b.icmp_unsigned("!=", v, zero)
    if src.is_bool:
        return b.uitofp(v, target) if dst.is_float else b.zext(v, target)
    if src.is_float and dst.is_float:
        return b.fpext(v, target) if _fbits(dst) > _fbits(src) else b.fptrunc(v, target)
    if dst.is_float:
        return b.sitofp(v, target) if src.is_signed else b.uitofp(v, target)
    if src.is_int and dst.is_int:
        if dst.bits < src.bits:
            return b.trunc(v, target)
        if dst.bits == src.bits:
            return v
        return b.sext(v, target) if src.is_signed else b.zext(v, target)
    return _float_to_int(cg, v, src, dst, lanes)


def _float_to_int(cg: LLVMCodeGen, v: Any, src: Dtype, dst: Dtype, lanes: int) -> Any:
    from .llvm_codegen import ll_type

    b = cg.builder
    width = 64 if dst.bits == 64 else 32
    wide = Dtype(f"int{width}", lanes)
    limit = float(2 ** (width - 1))
    fdt = src.with_lanes(lanes)
    in_range = b.and_(
        b.fcmp_ordered(">=", v, cg.const(fdt, -limit)), b.fcmp_ordered("<", v, cg.const(fdt, limit))
    )
    safe = b.select(in_range, v, cg.const(fdt, 0.0))
    out = b.select(in_range, b.fptosi(safe, ll_type(wide)), cg.const(wide, -(2 ** (width - 1))))
    return out if dst.bits == width else b.trunc(out, ll_type(dst.with_lanes(lanes)))


def emit_call(cg: LLVMCodeGen, e: E.Call) -> Any:
    b = cg.builder
    args = [cg.expr(a) for a in e.args]
    dtype = e.dtype
    if dtype.scalar.name in ("float16", "bfloat16"):
        wide = FLOAT32.with_lanes(dtype.lanes)
        args = [emit_cast(cg, a, dtype, wide) for a in args]
        return emit_cast(cg, _call(cg, e.name, args, wide), wide, dtype)
    if e.name == "powi":
        return _powi(cg, args[0], args[1], dtype)
    if e.name == "abs" and not dtype.is_float:
        (x,) = args
        if not dtype.is_signed:
            return x
        zero = ir.Constant(x.type, None)
        return b.select(b.icmp_signed("<", x, zero), b.sub(zero, x), x)
    return _call(cg, e.name, args, dtype)


def _powi(cg: LLVMCodeGen, a: Any, b: Any, dtype: Dtype) -> Any:
    """Integer power by squaring, unrolled over the exponent's bits (see `E.INTRINSICS`)."""
    from .llvm_codegen import ll_type

    bld = cg.builder
    one, zero, minus_one = (cg.const(dtype, v) for v in (1, 0, -1))
    bit_type = ll_type(BOOL.with_lanes(dtype.lanes))
    result, base = one, a
    for bit in range(dtype.bits - 1 if dtype.is_signed else dtype.bits):
        odd = bld.trunc(bld.lshr(b, cg.const(dtype, bit)), bit_type)
        result = bld.select(odd, bld.mul(result, base), result)
        base = bld.mul(base, base)
    if not dtype.is_signed:
        return result
    at_minus_one = bld.select(bld.trunc(b, bit_type), minus_one, one)
    small = bld.select(
        bld.icmp_signed("==", a, one),
        one,
        bld.select(bld.icmp_signed("==", a, minus_one), at_minus_one, zero),
    )
    return bld.select(bld.icmp_signed("<", b, zero), small, result)


def _call(cg: LLVMCodeGen, name: str, args: list[Any], dtype: Dtype) -> Any:
    value_type = args[0].type
    if name in vecmath.LLVM_NATIVE:
        return cg.intrinsic(vecmath.LLVM_NATIVE[name], value_type, args)
    if dtype.lanes == 1:
        if name in vecmath.LLVM_SCALAR:
            return cg.intrinsic(name, value_type, args)
        fn = cg.declare(vecmath.libm_name(name, dtype.name), value_type, [a.type for a in args])
        return cg.builder.call(fn, args)
    width = vecmath.sleef_width(name, dtype.name, cg.vector_bits)
    while width and (width > dtype.lanes or dtype.lanes % width):
        width //= 2
    symbol = vecmath.sleef_name(name, dtype.name, width) if width and width >= 2 else None
    if symbol is None:
        return _per_lane(cg, name, args, dtype)
    chunk_type = ir.VectorType(value_type.element, width)
    fn = cg.declare(symbol, chunk_type, [chunk_type] * len(args))
    chunks = [
        cg.builder.call(fn, [_slice(cg, a, k, width) for a in args])
        for k in range(0, dtype.lanes, width)
    ]
    return _concat(cg, chunks)


def _per_lane(cg: LLVMCodeGen, name: str, args: list[Any], dtype: Dtype) -> Any:
    b = cg.builder
    out = ir.Constant(args[0].type, ir.Undefined)
    for lane in range(dtype.lanes):
        k = ir.Constant(I32, lane)
        lane_args = [b.extract_element(a, k) for a in args]
        out = b.insert_element(out, _call(cg, name, lane_args, dtype.scalar), k)
    return out


def _slice(cg: LLVMCodeGen, v: Any, start: int, width: int) -> Any:
    if v.type.count == width:
        return v
    mask = ir.Constant(ir.VectorType(I32, width), list(range(start, start + width)))
    return cg.builder.shuffle_vector(v, ir.Constant(v.type, ir.Undefined), mask)


def _concat(cg: LLVMCodeGen, parts: list[Any]) -> Any:
    while len(parts) > 1:
        merged = []
        for a, c in zip(parts[::2], parts[1::2]):
            n = a.type.count
            mask = ir.Constant(ir.VectorType(I32, 2 * n), list(range(2 * n)))
            merged.append(cg.builder.shuffle_vector(a, c, mask))
        if len(parts) % 2:
            raise NotImplementedError("concatenating an odd number of vector chunks")
        parts = merged
    return parts[0]
