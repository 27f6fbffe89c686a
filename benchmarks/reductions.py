"""Reductions (issue #10) against eager and torch.compile, side by side in one process.

    python benchmarks/reductions.py [--threads N] [-k SUBSTRING]

nncfuse runs with `min_group_size=1`, so that a lone reduction (softmax,
layer_norm, sum) is a group of its own; with the default (2, as NNC) a lone
node stays eager. Each contender is checked against eager first.
"""

from __future__ import annotations

import argparse
import warnings

import torch
from harness import compare, fmt_time
from workloads import select

import nncfuse

NAMES = ["softmax_rows", "layer_norm_affine", "residual_layer_norm", "sum_rows", "sum_cols",
         "rms_norm"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    p.add_argument("-k", dest="patterns", action="append")
    p.add_argument("--rounds", type=int, default=11)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    warnings.simplefilter("ignore")
    print(f"threads={args.threads}")
    print(f"{'workload':22} {'shape':>12} {'eager':>10} {'compile':>10} {'nncfuse':>10}"
          f" {'vs eager':>9} {'vs compile':>10} groups")
    for w in select(args.patterns or NAMES):
        inputs = w.inputs()
        fused = nncfuse.jit(w.fn, min_group_size=1)
        compiled = torch.compile(w.fn)
        want = w.fn(*inputs)
        for f in (fused, compiled):
            f(*inputs)
            # Sums round differently from eager's cascade (both within a few ulps of exact).
            torch.testing.assert_close(f(*inputs), want, atol=1e-3, rtol=1e-5)
        groups = len(nncfuse.fusion_groups(fused.graph_for(*inputs)))
        t = compare({"eager": lambda: w.fn(*inputs), "compile": lambda: compiled(*inputs),
                     "nncfuse": lambda: fused(*inputs)}, rounds=args.rounds)
        shape = "x".join(map(str, w.shape))
        print(f"{w.name:22} {shape:>12} {fmt_time(t['eager']):>10} {fmt_time(t['compile']):>10}"
              f" {fmt_time(t['nncfuse']):>10} {t['eager'] / t['nncfuse']:8.2f}x"
              f" {t['compile'] / t['nncfuse']:9.2f}x {groups}")


if __name__ == "__main__":
    main()
