"""Speed and accuracy of the vector math nncfuse can call, per function and SLEEF variant.

    python benchmarks/vecmath.py [--n 2097152]

For every float32 intrinsic: time one pass over n typical floats (normal,
sd 3) through each SLEEF variant libtorch_cpu.so exports (1 thread, best
of 10 runs; huge arguments take slow reduction paths), the maximum
error in ULPs against a float64 reference over inputs covering the whole
float range (random bit patterns, a normal sample, special values), and how
many results differ from eager PyTorch beyond `torch.testing.assert_close`'s
tolerance; the same for what nncfuse itself computes (the fused op through
`nncfuse.jit`, e.g. its inline exp). `vecmath.FAST_F32` was chosen from this
table.
"""

from __future__ import annotations

import argparse
import ctypes
import time

import torch

import nncfuse
from nncfuse.tensorexpr.codegen.llvm_jit import compile_ir, has_symbol

UNARY = [
    "sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "tanh", "asinh", "acosh",
    "atanh", "exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "erf", "erfc", "lgamma",
]
BINARY = ["atan2", "pow", "fmod"]
VARIANTS = ["_u10", "_u15", "_u35", ""]


def loop_ir(fn: str, nargs: int) -> str:
    """A loop applying SLEEF `fn` (16 x float) to nargs input arrays."""
    vec = "<16 x float>"
    params = ", ".join(f"ptr noalias %a{k}" for k in range(nargs))
    loads = "\n".join(
        f"  %p{k} = getelementptr float, ptr %a{k}, i64 %i\n  %v{k} = load {vec}, ptr %p{k}"
        for k in range(nargs)
    )
    args = ", ".join(f"{vec} %v{k}" for k in range(nargs))
    return f"""
declare {vec} @{fn}({", ".join([vec] * nargs)})
define void @k({params}, ptr noalias %b, i64 %n) {{
entry:
  br label %loop
loop:
  %i = phi i64 [0, %entry], [%i2, %loop]
{loads}
  %s = call {vec} @{fn}({args})
  %pb = getelementptr float, ptr %b, i64 %i
  store {vec} %s, ptr %pb
  %i2 = add i64 %i, 16
  %c = icmp slt i64 %i2, %n
  br i1 %c, label %loop, label %exit
exit:
  ret void
}}"""


def inputs(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Whole-range float32 inputs: random bit patterns, a normal sample, special values."""
    g = torch.Generator().manual_seed(0)
    bits = torch.randint(-(2**31), 2**31 - 1, (n // 2,), generator=g).to(torch.int32)
    special = torch.tensor(
        [0.0, -0.0, float("inf"), -float("inf"), float("nan"), 1e-45, -1e-45, 1.0, -1.0,
         3.1415927, 88.7, -103.9, 1e38, -1e38, 0.5, 2.0],
        dtype=torch.float32,
    )
    x = torch.cat([bits.view(torch.float32), torch.randn(n // 2, generator=g) * 10, special])
    y = torch.cat([torch.randn(n // 2, generator=g) * 5, x[: n // 2 + special.numel()]])
    return x[:n], y[:n]


def max_ulp(got: torch.Tensor, ref: torch.Tensor) -> float:
    """Largest error in float32 ULPs of the float64 reference, over finite results."""
    ok = torch.isfinite(ref) & torch.isfinite(got)
    r = ref.float().abs()
    ulp = (torch.nextafter(r, torch.tensor(float("inf"))) - r).double()
    err = ((got.double() - ref).abs() / ulp)[ok]
    return err.max().item() if err.numel() else 0.0


def measure(name: str, x: torch.Tensor, y: torch.Tensor) -> list[str]:
    nargs = 2 if name in BINARY else 1
    args = [x, y][:nargs]
    eager_fn = getattr(torch, name, None) or getattr(torch.special, name)
    eager = eager_fn(*args)
    reference = eager_fn(*(a.double() for a in args))
    cells = [f"eager {max_ulp(eager, reference):.2f}", _nncfuse(name, args, eager, reference)]
    for variant in VARIANTS:
        symbol = f"Sleef_{name}f16{variant}"
        if not has_symbol(symbol):
            continue
        jit = compile_ir(loop_ir(symbol, nargs), "k", None, [ctypes.c_void_p] * (nargs + 1)
                         + [ctypes.c_int64])
        out = torch.empty_like(x)
        typical = [torch.randn_like(a) * 3 for a in args]
        pointers = [a.data_ptr() for a in typical] + [out.data_ptr(), x.numel()]
        best = min(_timed(jit.cfunc, pointers) for _ in range(10))
        jit.cfunc(*[a.data_ptr() for a in args], out.data_ptr(), x.numel())
        far = int((~torch.isclose(out, eager, rtol=1.3e-6, atol=1e-5, equal_nan=True)).sum())
        cells.append(f"{variant or 'exact'}: {max_ulp(out, reference):.2f} ulp, "
                     f"{best * 1e9 / x.numel():.2f} ns/elt, {far} far from eager")
    return cells


def _nncfuse(name: str, args: list[torch.Tensor], eager: torch.Tensor, ref: torch.Tensor) -> str:
    """The op as nncfuse runs it: error, speed on typical inputs, results far from eager."""
    fn = nncfuse.jit(torch.jit.CompilationUnit(
        f"def f(a, b):\n    return torch.{name}(a{', b' if name in BINARY else ''})\n"
    ).f, min_group_size=1)
    b = args[-1]
    fn(args[0], b)  # a first call may run in the profiling interpreter (eager's ops)
    out = fn(args[0], b)
    typical = [torch.randn_like(a) * 3 for a in args]
    fn(typical[0], typical[-1])
    best = min(_timed(fn, [typical[0], typical[-1]]) for _ in range(10))
    far = int((~torch.isclose(out, eager, rtol=1.3e-6, atol=1e-5, equal_nan=True)).sum())
    return (f"nncfuse: {max_ulp(out, ref):.2f} ulp, {best * 1e9 / out.numel():.2f} ns/elt, "
            f"{far} far")


def _timed(fn, args) -> float:
    start = time.perf_counter()
    fn(*args)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1 << 21)
    n = parser.parse_args().n // 16 * 16
    torch.set_num_threads(1)
    x, y = inputs(n)
    for name in UNARY + BINARY:
        print(f"{name:7} " + " | ".join(measure(name, x, y)))


if __name__ == "__main__":
    main()
