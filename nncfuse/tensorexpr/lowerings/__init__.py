"""Lowerings: aten op -> loop-IR expression, one module per op family, and their registry.

Importing the package registers every family; `registry` holds the table and
what the families share (operands, promotion, `pointwise`).
"""

from . import (  # noqa: F401
    activation,
    arithmetic,
    bitwise,
    casts,
    compare,
    external,
    normalization,
    reductions,
    shapes,
    unary,
)
from .casts import aliases  # noqa: F401 - for the fuser
from .external import (  # noqa: F401
    EXTERNAL_KINDS,
    external_problem,
    lower_external,
    onednn_gemm_alone,
    reusable_gemm,
)
from .registry import (  # noqa: F401 - names used outside the package
    VIEWS,
    Arg,
    ConstArg,
    Ctx,
    ListArg,
    Lowering,
    LoweringError,
    Promotion,
    RuntimeCheck,
    ScalarArg,
    TensorArg,
    elementwise_dtypes,
    lowering_for,
    pointwise,
    register,
    scalar_dtype,
    schema_overload,
)
