"""One op alone: eager PyTorch against nncfuse with `min_group_size=1`, side by side.

    python benchmarks/single_ops.py [--n 4194304] [--threads 1] [--rounds 7]

A lone op is not fused by default (`min_group_size=2`, as in NNC); this shows
what fusing it would give: ATen's kernel against nncfuse's loop and vector
math on the same tensor (normal, sd 1), timed side by side in interleaved
rounds (`harness.compare`); the table has medians and the ratio.
"""

from __future__ import annotations

import argparse

import torch
from harness import compare

import nncfuse

OPS = {
    "exp": "torch.exp(x)", "expm1": "torch.expm1(x)", "log": "torch.log(x.abs())",
    "log1p": "torch.log1p(x.abs())", "sin": "torch.sin(x)", "cos": "torch.cos(x)",
    "tan": "torch.tan(x)", "asin": "torch.asin(x * 0.3)", "atan": "torch.atan(x)",
    "sinh": "torch.sinh(x)", "tanh": "torch.tanh(x)", "sigmoid": "torch.sigmoid(x)",
    "erf": "torch.erf(x)", "erfc": "torch.erfc(x)", "lgamma": "torch.lgamma(x)",
    "sqrt": "torch.sqrt(x.abs())", "rsqrt": "torch.rsqrt(x.abs())", "relu": "torch.relu(x)",
    "gelu": "torch.nn.functional.gelu(x)",
    "gelu_tanh": "torch.nn.functional.gelu(x, approximate='tanh')",
    "silu": "torch.nn.functional.silu(x)", "mish": "torch.nn.functional.mish(x)",
    "elu": "torch.nn.functional.elu(x)", "softplus": "torch.nn.functional.softplus(x)",
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1 << 22)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--target-ms", type=float, default=50)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    x = torch.randn(args.n)
    print(f"{args.n} float32 elements, {args.threads} thread(s), median of {args.rounds} rounds")
    print(f"{'op':10s} {'eager':>10s} {'nncfuse':>10s} {'speed-up':>9s}")
    for name, body in OPS.items():
        # Strip the op's own argument preparation (x.abs(), x * 0.3) from the timing.
        arg = body[body.index("(") + 1 : body.rindex(")")].split(",")[0]
        call = body.replace(arg, "x", 1)
        unit = torch.jit.CompilationUnit(f"def f(x):\n    return {call}\n")
        fused = nncfuse.jit(unit.f, min_group_size=1)
        data = eval(arg, {"torch": torch, "x": x})  # noqa: S307 - a fixed table above
        plain = eval(f"lambda x: {call}", {"torch": torch})  # noqa: S307
        fused(data)  # a first call may run in the profiling interpreter (eager's ops)
        torch.testing.assert_close(fused(data), plain(data), equal_nan=True)
        times = compare({"eager": lambda: plain(data), "nncfuse": lambda: fused(data)},
                        rounds=args.rounds, target_s=args.target_ms / 1e3)
        e, f = times["eager"], times["nncfuse"]
        print(f"{name:10s} {e * 1e3:8.2f}ms {f * 1e3:8.2f}ms {e / f:8.2f}x")


if __name__ == "__main__":
    main()
