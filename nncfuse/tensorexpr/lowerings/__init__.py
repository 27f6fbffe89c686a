"""Lowerings: aten op -> loop-IR expression, one module per op family, and their registry.

Importing the package registers every family; `registry` holds the table and
what the families share (operands, promotion, `pointwise`).
"""

from . import activation, arithmetic, bitwise, casts, compare, reductions, unary  # noqa: F401
from .registry import (  # noqa: F401 - names used outside the package
    Arg,
    ConstArg,
    Ctx,
    Lowering,
    LoweringError,
    Promotion,
    ScalarArg,
    TensorArg,
    elementwise_dtypes,
    lowering_for,
    pointwise,
    register,
    scalar_dtype,
    schema_overload,
)
