"""Reductions (issue #10) against eager and torch.compile, side by side in one process.

    python benchmarks/reductions.py [--threads 1,2] [--clock cpu] [-k SUBSTRING] [--quick]

The roofline column is nncfuse's distance from the memory limit: the time a tensor copy
takes to move as many bytes as the workload must (its inputs read once, its outputs written
once: `harness.min_bytes`), measured at the same size and thread count (`harness.copy_time`),
over nncfuse's time.

nncfuse runs with `min_group_size=1`, so that a lone reduction (softmax,
layer_norm, sum) is a group of its own; with the default (2, as NNC) a lone
node stays eager unless its lowering fuses alone (`Lowering.alone`). Each
contender is checked against eager first. Every thread count in `--threads`
is measured in turn (`torch.set_num_threads`), and the geomeans of the ratios
close each table.

Shapes: rows of a transformer's activations (4096 tokens x 768 or 1024
features; softmax also over 128-wide attention rows and 4096-wide
vocabulary-like rows); batch_norm over a ResNet stage (8 x 64 x 56 x 56).
"""

from __future__ import annotations

import argparse
import warnings

import torch
import torch.nn.functional as F
from harness import copy_time, fmt_time, geomean, measure, min_bytes
from workloads import Workload, _randn, select

import nncfuse

NAMES = ["softmax_rows", "layer_norm_affine", "residual_layer_norm", "sum_rows", "sum_cols",
         "rms_norm", "layer_norm_8192", "residual_layer_norm_8192", "masked_softmax",
         "instance_norm", "heads_merge"]


# -- workloads of the issue that the suite does not have -----------------------------------------

def log_softmax_rows(x):
    return torch.log_softmax(x, -1)


def softmax_rows_(x):
    return torch.softmax(x, -1)


def batch_norm_relu(x, mean, var, w, b):
    return torch.relu(F.batch_norm(x, mean, var, w, b, False, 0.1, 1e-5))


def var_mean_rows(x):
    return torch.var_mean(x, -1)


def group_norm_affine(x, w, b):
    return F.group_norm(x, 32, w, b, 1e-5)


def _channel_affine(shape):
    return torch.randn(shape), torch.randn(shape[1]), torch.randn(shape[1])


def _batch_norm(shape, channels_last=False):
    x = torch.randn(shape)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    c = shape[1]
    return x, torch.randn(c), torch.rand(c) + 0.5, torch.randn(c), torch.randn(c)


EXTRA = [
    Workload("softmax_rows_128", softmax_rows_, _randn, (32768, 128), (64, 128)),
    Workload("softmax_rows_4096", softmax_rows_, _randn, (1024, 4096), (64, 64)),
    Workload("log_softmax_rows", log_softmax_rows, _randn, (4096, 1024), (64, 64)),
    Workload("log_softmax_rows_128", log_softmax_rows, _randn, (32768, 128), (64, 128)),
    Workload("batch_norm_relu_nchw", batch_norm_relu, _batch_norm, (8, 64, 56, 56),
             (1, 8, 8, 8)),
    Workload("batch_norm_relu_nhwc", batch_norm_relu, lambda s: _batch_norm(s, True),
             (8, 64, 56, 56), (1, 8, 8, 8)),
    Workload("var_mean_rows", var_mean_rows, _randn, (4096, 1024), (64, 64)),
    Workload("group_norm", group_norm_affine, _channel_affine, (16, 256, 32, 32), (2, 64, 4, 4)),
]


def workloads(patterns: list[str] | None) -> list[Workload]:
    chosen = select(NAMES) + EXTRA
    if not patterns:
        return chosen
    return [w for w in chosen if any(p in w.name for p in patterns)]


def run(threads: int, chosen: list[Workload], rounds: int, clock: str, quick: bool) -> None:
    torch.set_num_threads(threads)
    print(f"threads={threads} clock={clock}")
    print(f"{'workload':24} {'shape':>15} {'eager':>10} {'compile':>10} {'nncfuse':>10}"
          f" {'vs eager':>9} {'vs compile':>10} groups {'roofline':>8}")
    vs_eager, vs_compile = [], []
    for w in chosen:
        inputs = w.inputs(quick)
        fused = nncfuse.jit(w.fn, min_group_size=1)
        compiled = torch.compile(w.fn)
        want = w.fn(*inputs)
        for f in (fused, compiled):
            f(*inputs)
            # Sums round differently from eager's cascade (both within a few ulps of exact).
            torch.testing.assert_close(f(*inputs), want, atol=1e-3, rtol=1e-5)
        groups = len(nncfuse.fusion_groups(fused.graph_for(*inputs)))
        t = measure({"eager": lambda: w.fn(*inputs), "compile": lambda: compiled(*inputs),
                     "nncfuse": lambda: fused(*inputs)}, rounds=rounds, clock=clock)
        t = {k: v.median for k, v in t.items()}
        vs_eager.append(t["eager"] / t["nncfuse"])
        vs_compile.append(t["compile"] / t["nncfuse"])
        shape = "x".join(map(str, w.quick_shape if quick else w.shape))
        roof = copy_time(min_bytes(inputs, want), threads, clock) / t["nncfuse"]
        print(f"{w.name:24} {shape:>15} {fmt_time(t['eager']):>10} {fmt_time(t['compile']):>10}"
              f" {fmt_time(t['nncfuse']):>10} {vs_eager[-1]:8.2f}x"
              f" {vs_compile[-1]:9.2f}x {groups:6} {100 * roof:7.0f}%", flush=True)
    print(f"{'geomean':24} {'':>15} {'':>10} {'':>10} {'':>10} {geomean(vs_eager):8.2f}x"
          f" {geomean(vs_compile):9.2f}x  (min vs compile {min(vs_compile):.2f}x)")
    print("roofline: a copy of as many bytes as the workload reads and writes at least (its"
          " inputs and outputs once),\nover nncfuse's time: 100% = as fast as memcpy\n")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", default=str(torch.get_num_threads()),
                   help="comma-separated thread counts, each measured in turn")
    p.add_argument("-k", dest="patterns", action="append")
    p.add_argument("--rounds", type=int, default=11)
    p.add_argument("--clock", choices=("wall", "cpu"), default="wall")
    p.add_argument("--quick", action="store_true",
                   help="smoke run: each workload's quick shape, 3 rounds")
    args = p.parse_args()
    if args.quick:
        args.rounds = 3
    warnings.simplefilter("ignore")
    chosen = workloads(args.patterns)
    for threads in (int(t) for t in args.threads.split(",")):
        run(threads, chosen, args.rounds, args.clock, args.quick)


if __name__ == "__main__":
    main()
