"""Which machine function computes each intrinsic, scalar and vector.

Vectors of transcendentals call SLEEF (exported by libtorch_cpu.so; eager
PyTorch's vectorized CPU kernels use its 1.0-ULP variants) at the widest
width the host supports; LLVM's own vector intrinsics would be split into
scalar libm calls. Operations LLVM lowers to instructions (sqrt, fabs,
floor, ...) stay LLVM intrinsics. Scalars use LLVM intrinsics or libm.

Variant choice, by measurement (`benchmarks/vecmath.py`): for float32, the
3.5-ULP variants are 2-2.6x faster than the 1.0-ULP ones and stay within
`torch.testing.assert_close`'s tolerance of eager over the whole float
range for the functions in `FAST_F32`; sinh and cosh do not (near overflow),
nor do the others have fast variants. SLEEF's asinh and acosh overflow for
large inputs where eager (libm) does not, so those run lane by lane in libm.
SLEEF's fmod gives NaN for quotients beyond 2**53 where libm is exact; eager
does the same in its vector loops (libm only in their tails), and so do we.
float32 exp and erf vectors are not calls at all: `llvm_math.py` computes
them inline (polynomials and, for erf, an exp), 1.1x and 4.4x faster than
SLEEF's 1.0-ULP variants. The measured errors are in the README.

Where eager's kernels are the baseline ones (ATEN_CPU_CAPABILITY=default, or
a CPU without AVX2), its vector loops call libm element by element, and so
do ours: no SLEEF and no inline polynomials (`capability`).
"""

from __future__ import annotations

from .. import capability
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
    "hypot": "_u05",
    "fmod": "",
    "nextafter": "",
}

#: float32 functions whose 3.5-ULP SLEEF variant is used (see the module docstring).
FAST_F32 = {"sin", "cos", "tan", "asin", "acos", "atan", "tanh", "exp2", "log", "log2", "atan2"}

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
    fast = dtype_name == "float32" and fn in FAST_F32
    name = f"Sleef_{fn}{letter}{lanes}{'_u35' if fast else SLEEF_SUFFIX[fn]}"
    return name if has_symbol(name) else None


def vector_math() -> bool:
    """Whether vectors of transcendentals are computed as vectors (SLEEF, inline), as eager's
    AVX2 and AVX-512 kernels do, rather than lane by lane in libm, as its default ones do."""
    return capability.vector_math_is_sleef()


def sleef_width(fn: str, dtype_name: str, vector_bits: int) -> int | None:
    """The widest SLEEF vector width for `fn` no wider than the host's registers."""
    if not vector_math():
        return None
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
