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


# -- the caches ---------------------------------------------------------------------------------

_CACHES = "/sys/devices/system/cpu/cpu0/cache"


@functools.cache
def last_level_cache_bytes() -> int | None:
    """The size of the largest data cache of CPU 0 (Linux's sysfs), None where unknown."""
    sizes = []
    for index in range(8):
        try:
            with open(f"{_CACHES}/index{index}/type") as f:
                kind = f.read().strip()
            with open(f"{_CACHES}/index{index}/size") as f:
                text = f.read().strip()
        except OSError:
            break
        if kind != "Instruction" and text[:-1].isdigit() and text[-1] in "KM":
            sizes.append(int(text[:-1]) << (10 if text[-1] == "K" else 20))
    return max(sizes, default=None)


#: The least `streaming_bytes`, and what it is where the caches are unknown.
MIN_STREAMING_BYTES = 8 << 20


@functools.cache
def streaming_bytes() -> int:
    """The output size from which kernels write with non-temporal stores (`kernel`), and
    a softmax computes its exponentials twice to write them once (`lowerings.reductions`).

    Non-temporal stores skip the read for ownership of each line but send the data to
    memory, so a consumer reads it back from there; they pay only for outputs that would
    leave the last-level cache anyway. So: half that cache (an input as large as the
    output shares it), and at least 8 MB. Measured (1 thread, inputs in cache): 16 MB
    outputs with a 480 MB L3 (Xeon) were no faster with non-temporal stores, and slower
    in 4 of 6 workloads at the median (softmax 2.07 -> 2.50 ms, a multiply 2.96 -> 3.56:
    the writes compete for memory with the other processes); with a 32 MB L3 (an EPYC
    CCD) the threshold is 16 MB; where the size is unknown, 8 MB (measured 1.3-1.7x
    faster from 8 MB on when the output goes to memory).
    """
    return max(MIN_STREAMING_BYTES, (last_level_cache_bytes() or 0) // 2)
