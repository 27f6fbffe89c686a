"""Dynamic shapes: one function called over many sizes, nncfuse against torch.compile.

    python benchmarks/dynamic.py --clock cpu                 # 200 random sizes per workload
    python benchmarks/dynamic.py --sizes 30 -k gelu -k softmax --no-compile

For each workload (the suite's elementwise, reduction and shape ones, and a
transformer block, attention and MLP, over sequence lengths 1..512: see
`CASES`), each contender is built fresh and called once at each of `--sizes`
random sizes (the same sizes for all; a dim of 1 now and then): the table
gives the kernels it compiled and the total time of the sweep, compiles
included. Contenders:

    eager          PyTorch
    nncfuse        the default policy: static first, dynamic when a size changes
    nncfuse-static dynamic=False: a static kernel per size, up to 12, then unfused
    compile-dyn    torch.compile(dynamic=True) (Inductor)

Then, at one size of at least 64K elements, the steady state: the dynamic
kernel against the static one (the goal: within 10%) and torch.compile's,
timed side by side in interleaved rounds (`harness.measure`); ratios are to
the static kernel. "dynamic" is the default policy's kernel after two other
sizes (the dims that changed are symbols, the others static), "dynamic-all"
that of dynamic=True (every size a symbol).
"""

from __future__ import annotations

import argparse
import random
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from harness import measure
from workloads import (
    bcast_add_mul,
    bias_gelu_erf,
    cat_relu,
    gelu_tanh,
    layer_norm_affine,
    residual_layer_norm,
    rms_norm,
    silu,
    softmax_rows,
    sum_rows,
    transpose_add,
)

import nncfuse
from nncfuse.jit.fuser import guard

Inputs = tuple[torch.Tensor, ...]


@dataclass(frozen=True)
class Case:
    """A workload called at sizes `n`: `build(n)` are its inputs, `steady` the size timed."""

    name: str
    fn: Callable[..., torch.Tensor]
    build: Callable[[int], Inputs]
    low: int
    high: int
    steady: int


def _rows(cols: int, *extra: Callable[[int], torch.Tensor]) -> Callable[[int], Inputs]:
    return lambda n: (torch.randn(n, cols), *(e(n) for e in extra))


CASES = [
    Case("gelu_tanh", gelu_tanh, lambda n: (torch.randn(n),), 1, 1 << 20, 65536 + 77),
    Case("silu", silu, lambda n: (torch.randn(n),), 1, 1 << 20, 65536 + 77),
    Case("bias_gelu_erf", bias_gelu_erf, _rows(1024, lambda n: torch.randn(1024)), 1, 512, 67),
    Case("bcast_add_mul", bcast_add_mul,
         _rows(1024, lambda n: torch.randn(1024), lambda n: torch.randn(n, 1)), 1, 512, 67),
    Case("softmax_rows", softmax_rows, _rows(1024), 1, 512, 67),
    Case("layer_norm_affine", layer_norm_affine,
         _rows(768, lambda n: torch.randn(768), lambda n: torch.randn(768)), 1, 512, 87),
    Case("residual_layer_norm", residual_layer_norm,
         _rows(768, lambda n: torch.randn(n, 768), lambda n: torch.randn(768),
               lambda n: torch.randn(768)), 1, 512, 87),
    Case("rms_norm", rms_norm, _rows(768, lambda n: torch.randn(768)), 1, 512, 87),
    Case("sum_rows", sum_rows, _rows(1024), 1, 512, 67),
    Case("transpose_add", transpose_add,
         lambda n: (torch.randn(n, 256), torch.randn(256, n)), 1, 2048, 300),
    Case("cat_relu", cat_relu, lambda n: (torch.randn(n, 512), torch.randn(n, 512)), 1, 512, 67),
]


class TransformerBlock(torch.nn.Module):
    """A pre-norm transformer block (attention, then an MLP) of width 256 and 4 heads, for one
    sequence of any length: the head split `view(1, -1, 4, 64).transpose(1, 2)` carries it."""

    def __init__(self, width: int = 256, heads: int = 4):
        super().__init__()
        self.heads, self.head = heads, width // heads
        self.ln1, self.ln2 = torch.nn.LayerNorm(width), torch.nn.LayerNorm(width)
        self.qkv = torch.nn.Linear(width, 3 * width)
        self.proj = torch.nn.Linear(width, width)
        self.fc1, self.fc2 = torch.nn.Linear(width, 4 * width), torch.nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(self.ln1(x)).chunk(3, -1)
        q = q.reshape(1, -1, self.heads, self.head).transpose(1, 2)
        k = k.reshape(1, -1, self.heads, self.head).transpose(1, 2)
        v = v.reshape(1, -1, self.heads, self.head).transpose(1, 2)
        attention = torch.softmax(q @ k.transpose(-2, -1) * self.head ** -0.5, -1)
        y = (attention @ v).transpose(1, 2).reshape(1, -1, self.heads * self.head)
        x = x + self.proj(y)
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.ln2(x))))


_BLOCK = TransformerBlock().eval().requires_grad_(False)  # inference: a server's lengths
CASES.append(Case("transformer_block", _BLOCK, lambda n: (torch.randn(1, n, 256),), 1, 512, 257))


class Counter:
    """Kernels nncfuse compiles (successfully), counted while installed."""

    def __init__(self) -> None:
        self.count = 0
        self.dynamic = 0
        self._real = guard.TensorExprKernel

        def kernel(*args: Any) -> Any:
            k = self._real(*args)
            self.count += 1
            self.dynamic += bool(k.dynamic)
            return k

        guard.TensorExprKernel = kernel  # type: ignore[misc]

    def close(self) -> None:
        guard.TensorExprKernel = self._real  # type: ignore[misc]


def _build(contender: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    if contender == "eager":
        return fn
    if contender == "nncfuse":
        return nncfuse.jit(fn)
    if contender == "nncfuse-static":
        return nncfuse.jit(fn, dynamic=False)
    if contender == "nncfuse-dyn":
        return nncfuse.jit(fn, dynamic=True)
    torch._dynamo.reset()
    return torch.compile(fn, dynamic=True)


def _compiles(contender: str, counter: Counter | None) -> str:
    if counter is not None:
        return f"{counter.count} ({counter.dynamic} dyn)"
    if contender.startswith("compile"):
        return str(torch._dynamo.utils.counters["stats"]["unique_graphs"])
    return "-"


def sweep(case: Case, sizes: list[int], contenders: list[str]) -> dict[str, Any]:
    """Each contender over all sizes: kernels compiled, total seconds, checked against eager."""
    inputs = [case.build(n) for n in sizes]
    want = [case.fn(*args) for args in inputs]
    results: dict[str, Any] = {}
    for contender in contenders:
        guard.clear_kernel_cache()
        torch._dynamo.utils.counters.clear()
        counter = Counter() if contender.startswith("nncfuse") else None
        try:
            fn = _build(contender, case.fn)
            start = time.perf_counter()
            outs = [fn(*args) for args in inputs]
            total = time.perf_counter() - start
            for got, expect in zip(outs, want):
                torch.testing.assert_close(got, expect, rtol=1e-4, atol=1e-4)
            results[contender] = (_compiles(contender, counter), total, fn)
        except Exception as e:  # noqa: BLE001 - reported in the table
            results[contender] = (f"failed: {type(e).__name__}", float("nan"), None)
        finally:
            if counter is not None:
                counter.close()
    return results


def steady(case: Case, built: dict[str, Any], clock: str) -> dict[str, float]:
    """Median seconds per call at `case.steady`, each contender warmed up at that size."""
    args = case.build(case.steady)
    auto = _build("nncfuse", case.fn)
    for n in (case.steady + 3, case.steady + 5):  # two other sizes: the rows become a symbol
        auto(*case.build(n))
    fns = {"static": _build("nncfuse-static", case.fn), "dynamic": auto,
           "dynamic-all": _build("nncfuse-dyn", case.fn)}
    if built.get("compile-dyn") is not None:
        fns["compile-dyn"] = built["compile-dyn"]
    fns["eager"] = case.fn
    timings = measure({k: (lambda f=f: f(*args)) for k, f in fns.items()}, clock=clock)
    return {k: t.median for k, t in timings.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, default=200)
    parser.add_argument("-k", action="append", default=[], help="workloads whose name has this")
    parser.add_argument("--clock", choices=("wall", "cpu"), default="cpu")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--no-compile", action="store_true", help="leave out torch.compile")
    parser.add_argument("--seed", type=int, default=0)
    opts = parser.parse_args()
    torch.set_num_threads(opts.threads)
    warnings.filterwarnings("ignore")
    contenders = ["eager", "nncfuse", "nncfuse-static"]
    if not opts.no_compile:
        contenders.append("compile-dyn")
    cases = [c for c in CASES if not opts.k or any(k in c.name for k in opts.k)]
    print(f"{opts.sizes} random sizes per workload, threads={opts.threads}, clock={opts.clock}")
    for case in cases:
        rng = random.Random(opts.seed)
        sizes = [rng.randint(case.low, case.high) for _ in range(opts.sizes)]
        results = sweep(case, sizes, contenders)
        print(f"\n{case.name}: sizes {min(sizes)}..{max(sizes)}")
        print(f"  {'contender':16} {'kernels':>14} {'total s':>9}")
        for name, (compiles, total, _) in results.items():
            print(f"  {name:16} {compiles:>14} {total:9.3f}")
        times = steady(case, {k: v[2] for k, v in results.items()}, opts.clock)
        numel = case.build(case.steady)[0].numel()
        base = times["static"]
        row = "  ".join(f"{k} {v * 1e6:.1f} us ({v / base:.2f}x)" for k, v in times.items())
        print(f"  steady state at {numel} elements: {row}")


if __name__ == "__main__":
    main()
