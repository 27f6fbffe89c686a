"""GEMMs under `torch.autocast("cpu")`: eager autocast, torch.compile (Inductor) and nncfuse.jit
side by side on an MLP, per-call time and each one's error against eager autocast.

    python benchmarks/autocast_mlp.py                       # 1 thread, 64 x 1024 -> 4096 -> 1024
    python benchmarks/autocast_mlp.py --dtype float16 --quick

The block is `LayerNorm(Linear(GELU(Linear(x))) + x)` in `eval()` under `torch.no_grad()`.
nncfuse under autocast writes eager's casts out, fuses each GEMM with its epilogue and casts a
weight once per version (`nncfuse/jit/fuser/autocast_casts.py`, `cast_cache.py`). The error
lines are the largest absolute difference from eager autocast's result: the tests'
tolerances (`tests/jit/frontend/test_autocast.py`) are no tighter than Inductor's.
"""

from __future__ import annotations

import argparse

import torch
from harness import fmt_time, measure
from torch import nn

import nncfuse


class Mlp(nn.Module):
    def __init__(self, width: int, hidden: int):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(width, hidden), nn.Linear(hidden, width)
        self.norm = nn.LayerNorm(width)

    def forward(self, x):
        return self.norm(self.fc2(nn.functional.gelu(self.fc1(x))) + x)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dtype", choices=["bfloat16", "float16"], default="bfloat16")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--width", type=int, default=1024)
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--quick", action="store_true", help="few rounds")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    dtype = getattr(torch, args.dtype)
    model = Mlp(args.width, args.hidden).eval()
    x = torch.randn(args.batch, args.width)
    contenders = {"eager": model, "compile": torch.compile(model), "nncfuse": nncfuse.jit(model)}
    with torch.no_grad(), torch.autocast("cpu", dtype=dtype):
        expected = model(x)
        for name, fn in contenders.items():
            for _ in range(3):
                got = fn(x)
            print(f"{name:8} max |error| vs eager autocast {(got - expected).abs().max():.2e}",
                  flush=True)
        groups = nncfuse.fusion_groups(contenders["nncfuse"].graph_for(x))
        print("nncfuse groups:", [sorted({n.kind() for n in g.g("Subgraph").nodes()}
                                         - {"prim::Constant"}) for g in groups])
        timings = measure({k: (lambda f=f: f(x)) for k, f in contenders.items()},
                          rounds=3 if args.quick else 10, target_s=0.05)
    base = timings["eager"].median
    print(f"\n{args.batch} x {args.width} -> {args.hidden} -> {args.width}, {args.dtype} "
          f"autocast, {args.threads} thread(s); median per call, eager / contender")
    for name, t in timings.items():
        print(f"  {name:8} {fmt_time(t.median)}  {base / t.median:.2f}x")


if __name__ == "__main__":
    main()
