"""Which machine function computes each intrinsic, scalar and vector.

Vectors of transcendentals call SLEEF (exported by libtorch_cpu.so, the same
routines eager PyTorch's vectorized CPU kernels use, 1.0 ULP unless noted)
at the widest width the host supports; LLVM's own vector intrinsics would be
split into scalar libm calls. Operations LLVM lowers to instructions
(sqrt, fabs, floor, ...) stay LLVM intrinsics. Scalars use LLVM intrinsics
or libm.
"""

from __future__ import annotations

from .llvm_jit import has_symbol

#: SLEEF accuracy suffix per intrinsic (u10 = 1.0 ULP, u15 = 1.5 ULP, "" = exact).
SLEEF_SUFFIX = {
    "sin": "_u10",
    "cos": "_u10",
    "tan": "_u10",
    "asin": "_u10",
    "acos": "_u10",
    "atan": "_u10",
    "sinh": "_u10",
    "cosh": "_u10",
    "tanh": "_u10",
    "asinh": "_u10",
    "acosh": "_u10",
    "atanh": "_u10",
    "exp": "_u10",
    "exp2": "_u10",
    "expm1": "_u10",
    "log": "_u10",
    "log2": "_u10",
    "log10": "_u10",
    "log1p": "_u10",
    "erf": "_u10",
    "erfc": "_u15",
    "lgamma": "_u10",
    "pow": "_u10",
    "atan2": "_u10",
    "fmod": "",
    "nextafter": "",
}

#: Intrinsics LLVM turns into instructions, for scalars and vectors alike.
LLVM_NATIVE = {
    "sqrt": "sqrt",
    "abs": "fabs",
    "floor": "floor",
    "ceil": "ceil",
    "trunc": "trunc",
    "rint": "rint",
    "copysign": "copysign",
    "fma": "fma",
}

#: Scalar transcendentals with an LLVM intrinsic (lowered to libm by LLVM).
LLVM_SCALAR = {"sin", "cos", "exp", "exp2", "log", "log2", "log10", "pow"}


def _suffix(dtype_name: str) -> str:
    return "f" if dtype_name == "float32" else ""


def sleef_name(fn: str, dtype_name: str, lanes: int) -> str | None:
    """The SLEEF symbol computing `fn` on `lanes` x `dtype_name`, if the process has it."""
    if fn not in SLEEF_SUFFIX or dtype_name not in ("float32", "float64"):
        return None
    letter = "f" if dtype_name == "float32" else "d"
    name = f"Sleef_{fn}{letter}{lanes}{SLEEF_SUFFIX[fn]}"
    return name if has_symbol(name) else None


def sleef_width(fn: str, dtype_name: str, vector_bits: int) -> int | None:
    """The widest SLEEF vector width for `fn` no wider than the host's registers."""
    bits = 32 if dtype_name == "float32" else 64
    lanes = vector_bits // bits
    while lanes >= 2:
        if sleef_name(fn, dtype_name, lanes):
            return lanes
        lanes //= 2
    return None


def libm_name(fn: str, dtype_name: str) -> str:
    """The C math library function for a scalar `fn` (float or double)."""
    return fn + _suffix(dtype_name)
