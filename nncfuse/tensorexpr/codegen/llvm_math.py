"""Conversions and math calls for llvm_codegen.

Casts follow `ir_eval.cast_value`: float to integer converts to int32
(int64 for 64-bit targets) with out-of-range and NaN giving that type's
minimum, as x86's cvtt instructions do, then wraps to the target width.
Vector intrinsics call SLEEF in chunks of the widest width it offers
(`vecmath`), or run lane by lane where it has no such function (or where
eager's kernels call libm: `vecmath.vector_math`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import llvmlite.ir as ir

from .. import expr as E
from .. import ops
from ..dtype import BOOL, FLOAT32, Dtype
from . import vecmath
from .llvm_jit import host_features
from .llvm_types import F32, I32, ll_type

if TYPE_CHECKING:
    from .llvm_codegen import LLVMCodeGen


def _fbits(dtype: Dtype) -> int:
    return {"float16": 16, "float32": 32, "float64": 64}[dtype.name]


def emit_cast(cg: LLVMCodeGen, v: Any, src: Dtype, dst: Dtype) -> Any:
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
    b = cg.builder
    if src.name == "float16":  # every half is exactly a float; 2**31 is not a half
        v, src = b.fpext(v, ll_type(FLOAT32.with_lanes(lanes))), FLOAT32
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
    """The intrinsic call `e`, by its row's LLVM column (`EMITTERS`)."""
    args = [cg.expr(a) for a in e.args]
    dtype = e.dtype
    if dtype.scalar.is_reduced_float:
        wide = FLOAT32.with_lanes(dtype.lanes)
        args = [emit_cast(cg, a, dtype, wide) for a in args]
        return emit_cast(cg, cg.emit(e.row, args, wide), wide, dtype)
    return cg.emit(e.row, args, dtype)


def _abs(cg: LLVMCodeGen, x: Any) -> Any:
    """Integer abs, wrapping: abs(MIN) is MIN."""
    b = cg.builder
    zero = ir.Constant(x.type, None)
    return b.select(b.icmp_signed("<", x, zero), b.sub(zero, x), x)


def _powi(cg: LLVMCodeGen, a: Any, b: Any, dtype: Dtype) -> Any:
    """Integer power by squaring, unrolled over the exponent's bits (see `ops.CALLS`)."""
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
    inline = dtype.name == "float32" and dtype.lanes > 1 and vecmath.vector_math()
    if name == "exp_nonpos":  # exp of x <= 0 or NaN: inline without the upper clamp
        if inline:
            return _inline_exp(cg, args[0], dtype.lanes, nonpositive=True)
        name = "exp"
    if name == "exp" and inline:
        return _inline_exp(cg, args[0], dtype.lanes)
    if name == "erf" and inline:
        return _inline_erf(cg, args[0], dtype.lanes)
    if name in vecmath.LLVM_NATIVE:
        return cg.intrinsic(vecmath.LLVM_NATIVE[name], value_type, args)
    if dtype.lanes == 1:
        if name == "fmod":
            # frem is C's fmod; a call of libm's fmod LLVM may rewrite into `frem nnan`,
            # which is poison when an operand is NaN (LLVM 22 does, for fmodf(finite, NaN)).
            return cg.builder.frem(*args)
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
        cg.builder.call(fn, [slice_lanes(cg, a, k, width) for a in args])
        for k in range(0, dtype.lanes, width)
    ]
    return concat_lanes(cg, chunks)


def _horner(cg: LLVMCodeGen, coefficients: Sequence[float], t: Any) -> Any:
    """The polynomial with `coefficients` (highest degree first) at float32 vector `t`."""
    dtype = FLOAT32.with_lanes(t.type.count)
    p = cg.const(dtype, coefficients[0])
    for coefficient in coefficients[1:]:
        p = cg.intrinsic("fma", t.type, [p, t, cg.const(dtype, coefficient)])
    return p


# exp(x) = 2**n * exp(r), n = rint(x / ln 2), r = x - n ln 2 (ln 2 split in two parts so
# that n * LN2_HI is exact); exp(r) = 1 + r * P(r), P of degree 5 fitted (minimax of the
# relative error over |r| <= ln 2 / 2, then rounded to float32) and evaluated by Horner's
# rule: 6 multiply-adds, within 1.07 ULP over the float range (Cephes' 1 + r + r**2 Q(r),
# 8 operations, 1.24 ULP: simulated in float32 over 8M arguments, `benchmarks/vecmath.py`).
LN2_HI, LN2_LO = 0.693359375, -2.12194440e-4
#: 1.5 * 2**23: a float32 sum of it and t (|t| < 2**22) rounds t to an integer (t = x / ln 2
#: is within [-151, 129]: x is clamped to [-104, 88.8] first, or `in_normal_range`).
ROUNDER = 12582912.0
EXP_POLY = (1.3365257764235139e-3, 8.35438258945942e-3, 4.167226329445839e-2,
            1.6666662693023682e-1, 0.5, 1.0)


def _inline_exp(cg: LLVMCodeGen, x: Any, lanes: int, in_normal_range: bool = False,
                nonpositive: bool = False) -> Any:
    """exp of a float32 vector inline, about 1 ULP: no call, so nothing is spilled around one.

    Measured 2-3x faster than SLEEF's `expf16_u10` in fused loops (benchmarks/vecmath.py
    for the error). Results below 2**-126 (x < -87.3) are scaled in two steps, so they
    come out as denormals, as eager's do; large x overflows to inf; NaN stays NaN. With
    AVX-512, vscalefps scales in one instruction, with the same results (`_scalef`).
    `in_normal_range`: the caller guarantees -87 < x < 88, so none of that is needed.
    `nonpositive`: the caller guarantees x <= 0 or NaN (`exp_nonpos`), so the clamp at
    88.8 never acts and is left out (the same results there; softmax 4096 x 1024 at one
    thread 1.47 -> 1.42 ms, 32768 x 128 1.67 -> 1.62). Beyond 88.8 the result is
    unspecified (+inf gives NaN); the clamp at -104 stays (x - max may be -1e30).
    """
    b = cg.builder
    f32 = FLOAT32.with_lanes(lanes)
    i32 = Dtype("int32", lanes)

    def c(value: float) -> Any:
        return cg.const(f32, value)

    def fma(p: Any, q: Any, r: Any) -> Any:
        return cg.intrinsic("fma", p.type, [p, q, r])

    xc = x
    if not (in_normal_range or nonpositive):
        xc = b.select(b.fcmp_ordered(">", xc, c(88.8)), c(88.8), xc)
    if not in_normal_range:
        xc = b.select(b.fcmp_ordered("<", xc, c(-104.0)), c(-104.0), xc)
    # rint(x / ln 2) as a multiply-add and a subtract: vrndscaleps is 2 micro-ops (8 cycles)
    n = b.fsub(fma(xc, c(1.4426950408889634), c(ROUNDER)), c(ROUNDER))
    r = fma(n, c(-LN2_HI), xc)
    r = fma(n, c(-LN2_LO), r)
    p = fma(_horner(cg, EXP_POLY, r), r, c(1.0))
    ni = b.fptosi(n, ll_type(i32))

    def pow2(k: Any) -> Any:
        biased = b.shl(b.add(k, cg.const(i32, 127)), cg.const(i32, 23))
        return b.bitcast(biased, x.type)

    if in_normal_range:
        return b.fmul(p, pow2(ni))
    if lanes in (16, 32, 64) and "avx512f" in host_features():
        return _scalef(cg, p, n, lanes)
    # 2**n as two powers of two, each a normal float: n is in [-150, 128].
    half = b.ashr(ni, cg.const(i32, 1))
    result = b.fmul(b.fmul(p, pow2(half)), pow2(b.sub(ni, half)))
    return b.select(b.fcmp_unordered("uno", x, x), x, result)


# erf(x) = x * P(x**2) for |x| < 1; 1 - Q(|x| - 1.5) for 1 <= |x| < 2 and 1 - R(|x| - 2.96)
# for 2 <= |x| <= 3.93, where Q and R fit erfc; beyond 3.92 erf rounds to 1.
# `benchmarks/fit_erf.py` fits them.
ERF_SMALL = (-5.63146430067718e-4, 4.917563404887915e-3, -2.6711324229836464e-2,
             1.1280180513858795e-1, -3.7612324953079224e-1, 1.1283791065216064)
ERF_MIDDLE = (3.53813920810353e-05, -1.540553756058216e-3, 2.379816258326173e-3,
              4.7012437134981155e-3, -1.9328592345118523e-2, 1.4870827086269855e-2,
              4.45990152657032e-2, -1.3875220715999603e-1, 1.7839543521404266e-1,
              -1.1893028765916824e-1, 3.38948518037796e-2)
ERF_LARGE = (9.996820153901353e-06, -2.6070900275954045e-05, -3.5396126349951373e-06,
             1.432261342415586e-4, -4.3635329348035157e-4, 8.514877990819514e-4,
             -1.2066896306350827e-3, 1.2667244300246239e-3, -9.735262719914317e-4,
             5.231270915828645e-4, -1.7673950060270727e-4, 2.8382681193761528e-05)
ERF_MIDDLE_CENTER, ERF_TWO, ERF_CENTER, ERF_ONE = 1.5, 2.0, 2.96, 3.93


def _inline_erf(cg: LLVMCodeGen, x: Any, lanes: int) -> Any:
    """erf of a float32 vector inline, by polynomials only: no exp, no division, no branch.

        |x| < 1: x * P(x**2)        1 <= |x| < 2: 1 - Q(|x| - 1.5)
        2 <= |x| <= 3.93: 1 - R(|x| - 2.96)   (Q, R: one Horner, each lane's coefficients)

    Within 2.3 ULP for |x| < 1, 0.72 for 1 <= |x| < 2 and 0.53 beyond, where
    chains like acos(erf(x)) magnify every ULP (a rational function over the
    whole range was faster but 6 ULP off there: the fuzzer found it). Q and R
    approximate erfc, so that the float32 rounding of their constant term is
    small beside erf's ULP. Selecting coefficients (blends, off the FMA ports)
    costs less than evaluating both; the exp of the former `1 - exp(-x**2 + R)`
    cost as much as R (gelu 128 x 1024 at 1 thread 99 -> 81 us, bias_gelu_erf
    3.25 -> 2.54 ms). Skipping the far piece in vectors with no lane beyond 2
    was faster on gelu's x / sqrt(2) of normal x (69 us), 13% slower where half
    the vectors have one (x + b, both normal): a mispredicted branch. SLEEF's
    `erff16_u10`, in double-float arithmetic, made gelu (erf) 2.5x slower than
    eager's oneDNN kernel. erf(-0.0) is -0.0, erf(+-inf) is +-1, NaN stays NaN.
    """
    b = cg.builder
    f32 = FLOAT32.with_lanes(lanes)

    def c(value: float) -> Any:
        return cg.const(f32, value)

    a = cg.intrinsic("fabs", x.type, [x])
    near_zero = b.fmul(a, _horner(cg, ERF_SMALL, b.fmul(a, a)))
    # NaN stays NaN through the polynomial, and copysign gives it x's sign.
    clamped = b.select(b.fcmp_ordered(">", a, c(ERF_ONE)), c(ERF_ONE), a)
    far = b.fcmp_ordered(">=", a, c(ERF_TWO))
    t = b.fsub(clamped, b.select(far, c(ERF_CENTER), c(ERF_MIDDLE_CENTER)))
    middle = (0.0,) * (len(ERF_LARGE) - len(ERF_MIDDLE)) + ERF_MIDDLE
    erfc = b.select(far, c(ERF_LARGE[0]), c(middle[0]))
    for large_k, middle_k in zip(ERF_LARGE[1:], middle[1:]):
        erfc = cg.intrinsic("fma", x.type, [erfc, t, b.select(far, c(large_k), c(middle_k))])
    magnitude = b.select(b.fcmp_ordered("<", a, c(1.0)), near_zero, b.fsub(c(1.0), erfc))
    return cg.intrinsic("copysign", x.type, [magnitude, x])


def _per_lane(cg: LLVMCodeGen, name: str, args: list[Any], dtype: Dtype) -> Any:
    b = cg.builder
    out = ir.Constant(args[0].type, ir.Undefined)
    for lane in range(dtype.lanes):
        k = ir.Constant(I32, lane)
        lane_args = [b.extract_element(a, k) for a in args]
        out = b.insert_element(out, _call(cg, name, lane_args, dtype.scalar), k)
    return out


def _scalef(cg: LLVMCodeGen, p: Any, n: Any, lanes: int) -> Any:
    """`p * 2**n` by AVX-512's vscalefps, 16 lanes at a time: one rounding, so the same
    results as the two-step product (denormals, overflow to inf, NaN through), and
    none of its integer work: softmax rows 1.1 -> 1.4x eager at 256 x 1024."""
    f16 = ir.VectorType(F32, 16)
    mask = ir.IntType(16)
    fn = cg.declare("llvm.x86.avx512.mask.scalef.ps.512", f16, [f16, f16, f16, mask, I32])
    current_rounding = ir.Constant(I32, 4)
    parts = [
        cg.builder.call(fn, [slice_lanes(cg, p, k, 16), slice_lanes(cg, n, k, 16),
                             ir.Constant(f16, ir.Undefined), ir.Constant(mask, -1),
                             current_rounding])
        for k in range(0, lanes, 16)
    ]
    return concat_lanes(cg, parts)


def slice_lanes(cg: LLVMCodeGen, v: Any, start: int, width: int) -> Any:
    if v.type.count == width:
        return v
    mask = ir.Constant(ir.VectorType(I32, width), list(range(start, start + width)))
    return cg.builder.shuffle_vector(v, ir.Constant(v.type, ir.Undefined), mask)


def concat_lanes(cg: LLVMCodeGen, parts: list[Any]) -> Any:
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


#: The call emitters `ops.CALLS` names, as `(codegen, row, operands, dtype) -> value`
#: (`llvm_codegen.EMITTERS` holds them with the others): `math` is the machine's
#: function of that name (`_call`).
EMITTERS: dict[str, Callable[[LLVMCodeGen, ops.Op, Sequence[Any], Dtype], Any]] = {
    "math": lambda cg, row, args, dtype: _call(cg, row.name, list(args), dtype),
    "powi": lambda cg, row, args, dtype: _powi(cg, *args, dtype),
    "iabs": lambda cg, row, args, dtype: _abs(cg, *args),
    "identity": lambda cg, row, args, dtype: args[0],
}
