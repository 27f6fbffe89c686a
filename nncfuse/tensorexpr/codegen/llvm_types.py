"""llvm_types: the LLVM types of IR dtypes, shared by every LLVM emitter (a leaf module).

bool is `i1` as a value and a byte in memory; bfloat16, which llvmlite cannot
spell, is carried as its 16 bits (`i16`) and widened to float32 for
arithmetic.
"""

from __future__ import annotations

import llvmlite.ir as ir
import numpy as np

from ..dtype import Dtype
from ..ir_eval import bf16_bits

I1, I8, I16, I32, I64 = (ir.IntType(n) for n in (1, 8, 16, 32, 64))
F32, F64 = ir.FloatType(), ir.DoubleType()
PTR = ir.PointerType()
_SCALAR = {
    "bool": I1,
    "uint8": I8,
    "int8": I8,
    "int16": I16,
    "int32": I32,
    "int64": I64,
    "float16": ir.HalfType(),
    "bfloat16": I16,
    "float32": F32,
    "float64": F64,
}


def ll_type(dtype: Dtype) -> ir.Type:
    """The LLVM type of values of `dtype` (bool as i1, bfloat16 as its bits)."""
    t = _SCALAR[dtype.name]
    return t if dtype.lanes == 1 else ir.VectorType(t, dtype.lanes)


def memory_type(dtype: Dtype) -> ir.Type:
    """The LLVM type elements of `dtype` have in memory (bool as a byte)."""
    return I8 if dtype.is_bool else _SCALAR[dtype.name]


def type_suffix(t: ir.Type) -> str:
    """The suffix of an overloaded intrinsic's name for values of type `t` (`v16f32`)."""
    if isinstance(t, ir.VectorType):
        return f"v{t.count}{type_suffix(t.element)}"
    if isinstance(t, ir.IntType):
        return f"i{t.width}"
    return {"float": "f32", "double": "f64", "half": "f16"}[str(t)]


def bf16_constant_bits(value: float) -> int:
    """The 16 bits of `value` rounded to bfloat16 (as the interpreter rounds)."""
    return int(bf16_bits(np.float32(value)))
