"""Which CPU kernels eager runs on this machine: ATen's dispatch capability.

ATen builds its vectorized CPU kernels three times (x86-64): for AVX-512,
for AVX2 (with FMA) and for the baseline ("default"), and at start-up picks
the widest the CPU supports, narrowed by ATEN_CPU_CAPABILITY (`default`,
`avx2`, `avx512`); `torch.backends.cpu.get_cpu_capability()` says which it
picked. What nncfuse mirrors follows from it:

- AVX-512 / AVX2: `Vectorized<T>` of 512 / 256 bits, transcendentals from
  SLEEF's AVX-512 / AVX2 variants, multiply-adds fused (`vec::fmadd`, and the
  compiler contracts `a + b * c`, as the kernels are built with FMA);
- default: `Vectorized<T>` is plain C++ mapping libm over its elements, and
  without FMA in the instruction set every multiply-add rounds twice.

The LLVM target is narrowed to the same instruction set (`llvm_jit`), so
kernels use no wider registers than eager's and honour ATEN_CPU_CAPABILITY.
oneDNN chooses its own ISA (the CPU, capped by ONEDNN_MAX_CPU_ISA): see gelu.
"""

from __future__ import annotations

import functools

import torch

AVX512, AVX2, DEFAULT = "avx512", "avx2", "default"


@functools.cache
def aten_capability() -> str:
    """`avx512`, `avx2` or `default`: the kernels ATen dispatches to in this process."""
    name = torch.backends.cpu.get_cpu_capability().upper()
    if name.startswith("AVX512"):
        return AVX512
    return AVX2 if name == "AVX2" else DEFAULT


def fuses_multiply_adds() -> bool:
    """Whether eager's float kernels round `a * b + c` once (FMA) or twice."""
    return aten_capability() != DEFAULT


def vector_math_is_sleef() -> bool:
    """Whether eager's vector loops call SLEEF (else libm, element by element)."""
    return aten_capability() != DEFAULT
