"""Real models as the yardstick: transformers' model classes, eager vs TorchScript vs
torch.compile vs nncfuse, with what nncfuse fuses and where eager's time goes.

    pip install -e ".[models]"                      # transformers (matplotlib: ".[plot]")
    python benchmarks/models.py                     # every model, 1 thread
    python benchmarks/models.py --quick             # smoke run: small shapes, few rounds
    python benchmarks/models.py --models bert,resnet --threads 1,all --chart docs/models.png
    python benchmarks/models.py --models bert --dtype bfloat16   # under torch.autocast
    python benchmarks/models.py --models bert --dtype bfloat16 --cast   # model.to(bfloat16)

Models are built from small configs with random weights (nothing is downloaded),
in `eval()` and under `torch.no_grad()`, and traced with
`torch.jit.trace(model, inputs, strict=False)` (configs with `torchscript=True,
return_dict=False`, so they return tuples of tensors). Contenders, side by side
in one process, interleaved rounds (`harness.measure`), medians:

- eager:         the model itself;
- TorchScript:   the traced module run plainly (not frozen; the profiling executor);
- torch.compile: `torch.compile(model)` (Inductor, default mode);
- torch.compile frozen: `torch.compile(model, options={"freezing": True})` (Inductor's
                 `torch._inductor.config.freezing`: weights as constants, batch norm folded,
                 weights prepacked for oneDNN; nncfuse-frozen's counterpart);
- nncfuse:       `nncfuse.jit(traced)`;
- nncfuse-frozen: `nncfuse.jit(traced, freeze=True)` (TorchScript's freezing: batch norm
                 folded into convolutions; guarded by parameter identity, version, value);
- nncfuse-backend: `torch.compile(model, backend="nncfuse")` (Dynamo's graphs, AOTAutograd's
                 inference graphs, through nncfuse: `nncfuse/backend.py`).

Each contender's outputs are checked against eager's (`assert_close`, rtol 1e-3,
atol 1e-4) before timing; one that fails is reported and not timed. Per model
the table gives the speed over eager, nncfuse's coverage (`nncfuse.explain`:
fused over non-external compute nodes) and the most common reasons nodes stay
outside. The compute profile runs every contender under `torch.profiler`: the
outermost external op's inclusive time (GEMM, convolution, attention, embedding:
`nncfuse.explain.EXTERNAL_KINDS`, and the routines torch.compile's code calls for
them), over the profiled loop's wall time, is the external share; the rest is the
contender's median times one minus its share: the time a fuser can do something about.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import copy
import functools
import importlib
import math
import os
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from harness import (
    Timing,
    copy_time,
    fmt_time,
    geomean,
    measure,
    min_bytes,
    quiet_transformers,
    select,
)
from report import LABELS, draw_speedups, machine_info

import nncfuse
from nncfuse.explain import EXTERNAL_KINDS
from nncfuse.testing import MULTIPLIER, rms

CONTENDERS = ("eager", "script", "compile", "compile-frozen", "nncfuse", "nncfuse-frozen",
              "nncfuse-backend")
WARM_CACHE = Path(__file__).resolve().parent / "results" / "inductor-cache"
RTOL, ATOL = 1e-3, 1e-4
#: under `--dtype bfloat16|float16` (autocast): what Inductor meets against eager autocast
AUTOCAST_TOL = 2e-2


@dataclass(frozen=True)
class Spec:
    """A model: how to build it (quick or not) and a description of its inputs."""

    name: str
    family: str
    build: Callable[[bool], tuple[torch.nn.Module, tuple[torch.Tensor, ...]]]


class CausalMask(torch.nn.Module):
    """A decoder called with a prepared 4-D causal mask.

    transformers builds the causal mask with `torch.vmap`, which `torch.jit.trace`
    cannot record; given a 4-D boolean mask, the model uses it as it is.
    """

    def __init__(self, model: torch.nn.Module, seq: int):
        super().__init__()
        self.model = model
        self.register_buffer("mask", torch.ones(seq, seq, dtype=torch.bool).tril()[None, None])

    def forward(self, ids: torch.Tensor) -> Any:
        return self.model(ids, attention_mask=self.mask)


def _tokens(quick: bool, vocab: int = 1000) -> tuple[torch.Tensor]:
    return (torch.randint(0, vocab, (1, 32 if quick else 128)),)


def _image(quick: bool) -> tuple[torch.Tensor]:
    return (torch.randn(1, 3, 64 if quick else 224, 64 if quick else 224),)


_TS = {"torchscript": True, "return_dict": False}


def _bert(quick: bool) -> Any:
    from transformers import BertConfig, BertModel
    config = BertConfig(vocab_size=1000, hidden_size=256, num_hidden_layers=2 if quick else 4,
                        num_attention_heads=4, intermediate_size=1024, **_TS)
    return BertModel(config), _tokens(quick)


def _gpt2(quick: bool) -> Any:
    from transformers import GPT2Config, GPT2Model
    config = GPT2Config(vocab_size=1000, n_embd=256, n_layer=2 if quick else 4, n_head=4,
                        n_positions=256, use_cache=False, **_TS)
    ids = _tokens(quick)
    return CausalMask(GPT2Model(config), ids[0].shape[1]), ids


def _llama(quick: bool) -> Any:
    from transformers import LlamaConfig, LlamaModel
    config = LlamaConfig(vocab_size=1000, hidden_size=256, intermediate_size=688,
                         num_hidden_layers=2 if quick else 4, num_attention_heads=4,
                         num_key_value_heads=2, max_position_embeddings=256, use_cache=False,
                         **_TS)
    ids = _tokens(quick)
    return CausalMask(LlamaModel(config), ids[0].shape[1]), ids


def _t5(quick: bool) -> Any:
    from transformers import T5Config, T5EncoderModel
    config = T5Config(vocab_size=1000, d_model=256, d_kv=64, d_ff=1024, num_heads=4,
                      num_layers=2 if quick else 4, use_cache=False, **_TS)
    return T5EncoderModel(config), _tokens(quick)


def _vit(quick: bool) -> Any:
    from transformers import ViTConfig, ViTModel
    config = ViTConfig(hidden_size=256, num_hidden_layers=2 if quick else 4,
                       num_attention_heads=4, intermediate_size=1024,
                       image_size=64 if quick else 224, patch_size=16, **_TS)
    return ViTModel(config), _image(quick)


def _resnet(quick: bool) -> Any:
    from transformers import ResNetConfig, ResNetModel
    config = ResNetConfig(embedding_size=64, hidden_sizes=[64, 128, 256, 512],
                          depths=[1, 1, 1, 1] if quick else [2, 2, 2, 2], layer_type="basic",
                          **_TS)  # ResNet-18's shape
    return ResNetModel(config), _image(quick)


def _mobilenet(quick: bool) -> Any:
    from transformers import MobileNetV2Config, MobileNetV2Model
    config = MobileNetV2Config(depth_multiplier=0.5 if quick else 1.0,
                               image_size=64 if quick else 224, **_TS)
    return MobileNetV2Model(config), _image(quick)


def _convnext(quick: bool) -> Any:
    from transformers import ConvNextConfig, ConvNextModel
    config = ConvNextConfig(hidden_sizes=[40, 80, 160, 320],
                            depths=[1, 1, 1, 1] if quick else [2, 2, 2, 2], **_TS)  # ~atto
    return ConvNextModel(config), _image(quick)


MODELS = [
    Spec("bert", "encoder (BERT)", _bert),
    Spec("gpt2", "decoder (GPT-2)", _gpt2),
    Spec("llama", "decoder (Llama: RMSNorm, rotary, SwiGLU)", _llama),
    Spec("t5", "encoder (T5: relative position bias)", _t5),
    Spec("vit", "vision transformer (ViT)", _vit),
    Spec("resnet", "CNN, batch norm (ResNet-18 shape)", _resnet),
    Spec("mobilenet", "CNN, depthwise (MobileNetV2)", _mobilenet),
    Spec("convnext", "CNN, depthwise 7x7 + LayerNorm (ConvNeXt)", _convnext),
]


@dataclass
class Result:
    model: str
    threads: int
    shape: tuple[int, ...]
    load_before: float
    timings: dict[str, Timing] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    report: Any = None  # nncfuse.explain's
    shares: dict[str, float] = field(default_factory=dict)  # external share, from profiles
    copy_s: float | None = None  # a copy of the bytes the model must move (the roofline)

    def roofline(self, contender: str) -> float | None:
        """The copy's time over the contender's: 1.0 would be as fast as memcpy."""
        t = self.median(contender)
        return None if t is None or self.copy_s is None else self.copy_s / t

    def median(self, contender: str) -> float | None:
        t = self.timings.get(contender)
        return t.median if t else None

    def speedup(self, contender: str) -> float | None:
        e, t = self.median("eager"), self.median(contender)
        return e / t if e and t else None

    def rest(self, contender: str) -> float | None:
        """Time outside external ops: the median times the profiled share of the rest."""
        t, share = self.median(contender), self.shares.get(contender)
        return None if t is None or share is None else t * (1.0 - share)


def _build(contender: str, model: torch.nn.Module, traced: Any) -> Callable[..., Any]:
    if contender == "eager":
        return model
    if contender == "script":
        return traced
    if contender == "compile":
        return torch.compile(model)
    if contender == "compile-frozen":
        return torch.compile(model, options={"freezing": True})
    if contender == "nncfuse-backend":
        importlib.import_module("nncfuse.backend")  # registers "nncfuse" (as the entry point does)
        return torch.compile(model, backend="nncfuse")
    if contender == "nncfuse-frozen":
        return nncfuse.jit(traced, freeze=True)
    return nncfuse.jit(traced)


#: What the profiler records for external ops: explain's kinds, plus the routines that
#: torch.compile's generated code calls for them directly.
PROFILED_EXTERNAL = EXTERNAL_KINDS | {
    "aten::_scaled_dot_product_flash_attention_for_cpu", "mkldnn::_convolution_pointwise",
    "mkldnn::_linear_pointwise", "mkl::_mkl_linear",
}


def external_share(fn: Callable[[], Any], calls: int) -> float:
    """The share of `fn`'s time (wall, profiler running) spent in external ops: the outermost
    external op's inclusive time over the whole loop's (Python and kernels included)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        loop_us = (time.perf_counter() - start) * 1e6
    external = 0.0
    for e in prof.events():
        if e.name in PROFILED_EXTERNAL:
            parent = e.cpu_parent
            while parent is not None and parent.name not in PROFILED_EXTERNAL:
                parent = parent.cpu_parent
            if parent is None:
                external += e.cpu_time_total
    return min(1.0, external / loop_us)


def check_outputs(got: Any, expected: Any, rtol: float, atol: float,
                  exact: Callable[[], Any]) -> None:
    """Raise unless `got` matches eager's `expected` within (rtol, atol), or, where it does
    not, each of its tensors has eager's dtype and is at most `MULTIPLIER` times as far from
    float64 eager's (`exact()`, root mean square) as eager's own: deep networks in bfloat16
    (ResNet-18 at 224x224) amplify rounding beyond any fixed tolerance, Inductor's too."""
    try:
        torch.testing.assert_close(got, expected, rtol=rtol, atol=atol)
        return
    except AssertionError as e:
        problem = e
    leaves = torch.utils._pytree.tree_leaves
    for g, w, x in zip(leaves(got), leaves(expected), leaves(exact()), strict=True):
        if not isinstance(w, torch.Tensor) or not w.is_floating_point():
            continue
        if g.dtype != w.dtype or g.shape != w.shape or not (g.isfinite() == w.isfinite()).all():
            raise problem
        ours, theirs = rms(g, x), rms(w, x)
        if ours > MULTIPLIER * theirs + atol:
            raise AssertionError(f"{problem}; against float64 eager: rms error {ours:.2e}, "
                                 f"eager's {theirs:.2e}")


def _float64(model: torch.nn.Module, inputs: tuple[Any, ...]) -> Any:
    """Eager's outputs of a float64 copy of `model` on float64 `inputs`, autocast off."""
    wide = tuple(t.double() if t.is_floating_point() else t for t in inputs)
    with torch.autocast("cpu", enabled=False):
        return copy.deepcopy(model).double()(*wide)


def _error(e: Exception) -> str:
    text = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return f"{type(e).__name__}: {text[:160]}"


def run_model(spec: Spec, threads: int, args: argparse.Namespace) -> Result:
    torch.manual_seed(0)
    model, inputs = spec.build(args.quick)
    model.eval()
    if args.cast:  # (the model and its floating inputs in the dtype; no autocast)
        dtype = getattr(torch, args.dtype)
        model = model.to(dtype)
        inputs = tuple(t.to(dtype) if t.is_floating_point() else t for t in inputs)
    result = Result(spec.name, threads, tuple(inputs[0].shape), os.getloadavg()[0])
    torch._dynamo.reset()
    rtol, atol = (RTOL, ATOL) if args.dtype == "float32" else (AUTOCAST_TOL, AUTOCAST_TOL)
    with torch.no_grad(), contextlib.ExitStack() as stack:
        traced = torch.jit.trace(model, inputs, strict=False)  # (float32: no casts baked in)
        if args.dtype != "float32" and not args.cast:
            stack.enter_context(torch.autocast("cpu", dtype=getattr(torch, args.dtype)))
        expected = model(*inputs)
        exact = functools.cache(lambda: _float64(model, inputs))  # (once, where needed)
        ready: dict[str, Callable[[], Any]] = {}
        for contender in args.contenders:
            try:
                fn = _build(contender, model, traced)
                for _ in range(3):  # profiling, compiling, the executors' own warm-up
                    got = fn(*inputs)
                check_outputs(got, expected, rtol, atol, exact)
            except Exception as e:  # noqa: BLE001 - a failure disqualifies, the run goes on
                result.errors[contender] = _error(e)
                print(f"  !! {contender} on {spec.name}: {result.errors[contender]}", flush=True)
                if os.environ.get("MODELS_TRACEBACK"):
                    traceback.print_exc()
                continue
            ready[contender] = lambda fn=fn: fn(*inputs)
            if contender == "nncfuse":
                result.report = nncfuse.explain(fn, *inputs)
        for contender, fn in ready.items():
            result.shares[contender] = external_share(fn, 3 if args.quick else 20)
        result.timings = measure(ready, rounds=args.rounds, target_s=args.target_ms / 1e3,
                                 warmup=1, clock=args.clock)
        state = [*model.parameters(), *model.buffers()]
        result.copy_s = copy_time(min_bytes(state, inputs, expected), threads, args.clock)
    torch._dynamo.reset()
    return result


# -- output -----------------------------------------------------------------------------------
def _t(seconds: float | None) -> str:
    return "-" if seconds is None else fmt_time(seconds).strip()


def _x(ratio: float | None) -> str:
    return "-" if ratio is None else f"{ratio:.2f}x"


def _coverage(r: Result) -> str:
    rep = r.report
    if rep is None:
        return "-"
    return f"{rep.fused_nodes}/{rep.compute_nodes} ({100 * rep.coverage:.0f}%)"


def _reasons(r: Result, n: int = 3) -> str:
    if r.report is None:
        return "-"
    counts = collections.Counter()
    for u in r.report.unfused:
        counts[(u.category, u.kind.split("::")[-1])] += 1
    by_category: dict[str, list[str]] = {}
    for (category, kind), m in counts.most_common():
        by_category.setdefault(category, []).append(f"{kind} {m}")
    top = sorted(by_category, key=lambda c: -r.report.reasons()[c])[:n]
    return "; ".join(f"{c} {r.report.reasons()[c]} ({', '.join(by_category[c][:3])})"
                     for c in top)


def print_tables(results: list[Result], contenders: list[str], clock: str) -> list[str]:
    """Print the tables; return the speed table as Markdown rows (for the README)."""
    others = [c for c in contenders if c != "eager"]
    head = ["model", "thr", "input"] + [LABELS[c] for c in contenders] + [
        f"{LABELS[c]} vs eager" for c in others] + ["nncfuse coverage", "groups",
                                                     "nncfuse roofline"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in results:
        cells = [r.model, str(r.threads), "x".join(map(str, r.shape))]
        cells += ["FAILED" if c in r.errors else _t(r.median(c)) for c in contenders]
        cells += [_x(r.speedup(c)) for c in others]
        cells += [_coverage(r), "-" if r.report is None else str(len(r.report.groups))]
        roof = r.roofline("nncfuse")
        cells.append("-" if roof is None else f"{100 * roof:.1f}%")
        lines.append("| " + " | ".join(cells) + " |")
    print(f"\nmedian {clock} time per call; vs eager = eager / contender (>1: faster); coverage = "
          "nncfuse's fused / non-external compute nodes (nncfuse.explain); roofline = a copy of "
          "the bytes the model must move (weights, inputs, outputs) over nncfuse's time\n")
    print("\n".join(lines))
    for t in sorted({r.threads for r in results}):
        mine = [r for r in results if r.threads == t]
        print(f"\n{t} thread(s), geomean speedup over eager: " + ", ".join(
            f"{LABELS[c]} {_x(geomean(s for r in mine if (s := r.speedup(c))))}"
            for c in others))

    print("\ncompute profile (torch.profiler on each contender): the share of eager's time in "
          "external ops (GEMM, convolution, attention, embedding) and, per contender, the "
          "time outside them\n(median x profiled share of the rest); rest vs eager = eager's "
          "rest / the contender's\n")
    prof = ["model", "thr", "eager external"] + [f"{LABELS[c]} rest" for c in contenders] + [
        f"{LABELS[c]} rest vs eager" for c in others]
    plines = ["| " + " | ".join(prof) + " |", "|" + "---|" * len(prof)]
    for r in results:
        share = r.shares.get("eager")
        cells = [r.model, str(r.threads), "-" if share is None else f"{100 * share:.0f}%"]
        cells += [_t(r.rest(c)) for c in contenders]
        cells += [_x(r.rest("eager") / r.rest(c)) if r.rest(c) and r.rest("eager") else "-"
                  for c in others]
        plines.append("| " + " | ".join(cells) + " |")
    print("\n".join(plines))

    print("\nwhat stays outside nncfuse's groups (category, count, top ops):")
    for r in results:
        print(f"  {r.model:<10} {_reasons(r)}")
        for c, e in r.errors.items():
            print(f"  {'':<10} {LABELS[c]} FAILED: {e}")
    return lines + [""] + plines


def write_chart(path: Path, results: list[Result], contenders: list[str],
                machine: dict[str, Any], clock: str) -> None:
    """Speedup over eager per model, one panel per thread setting (log scale), as the suite's."""
    names = list(dict.fromkeys(r.model for r in results))
    panels: dict[int, dict[tuple[str, str], float]] = {}
    for r in results:
        for c in contenders:
            panels.setdefault(r.threads, {})[r.model, c] = r.speedup(c) or math.nan
    covered = {r.model: r.report.coverage for r in results if r.report is not None}
    labels = [f"{n} ({100 * covered[n]:.0f}% fused)" if n in covered else n for n in names]
    title = (f"transformers models (nncfuse's coverage in brackets)\n{machine['cpu_model']}, "
             f"torch {machine['torch']}, nncfuse {machine['nncfuse_revision']}")
    draw_speedups(path, panels, names, labels, contenders, clock, title, fontsize=10)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", help="comma-separated names (default: all): " + ",".join(
        s.name for s in MODELS))
    p.add_argument("--threads", default="1",
                   help="comma-separated thread counts; 'all' = CPUs available (default 1)")
    p.add_argument("--rounds", type=int, help="timed rounds per model (default 10; quick 3)")
    p.add_argument("--target-ms", type=float,
                   help="length of one timed batch in ms (default 50; quick 5)")
    p.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                   help="what the table reports: wall time (default) or the process's CPU "
                        "time, steadier on a loaded machine at 1 thread")
    p.add_argument("--contenders", default=",".join(CONTENDERS),
                   help="comma-separated subset of " + ",".join(CONTENDERS))
    p.add_argument("--quick", action="store_true", help="smoke run: small shapes, few rounds")
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="float32",
                   help="bfloat16 / float16: every contender runs under torch.autocast('cpu') "
                        "of that dtype (traced in float32); outputs checked to "
                        f"rtol = atol = {AUTOCAST_TOL}")
    p.add_argument("--cast", action="store_true",
                   help="with --dtype bfloat16 / float16: the models cast to it "
                        "(`model.to(dtype)`, floating inputs too) instead of autocast")
    p.add_argument("--inductor-cache", choices=["cold", "warm"], default="warm",
                   help=f"warm: reuse {WARM_CACHE} (default; the run is about steady state); "
                        "cold: the environment's own")
    p.add_argument("--chart", type=Path, help="also draw a PNG chart (needs matplotlib)")
    args = p.parse_args(argv)
    if args.cast and args.dtype == "float32":
        p.error("--cast needs --dtype bfloat16 or float16")
    args.rounds = args.rounds or (3 if args.quick else 10)
    args.target_ms = args.target_ms or (5.0 if args.quick else 50.0)
    select(p, args, CONTENDERS, MODELS)
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    transformers = quiet_transformers("models.py")
    if args.inductor_cache == "warm":
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(WARM_CACHE)
    start = time.perf_counter()
    initial = torch.get_num_threads()
    results = []
    try:
        for threads in args.thread_settings:
            torch.set_num_threads(threads)
            for spec in args.specs:
                print(f"[{threads} thread{'s' if threads > 1 else ''}] {spec.name}: "
                      f"{spec.family}", flush=True)
                results.append(run_model(spec, threads, args))
    finally:
        torch.set_num_threads(initial)
    machine = machine_info(args.thread_settings, None)
    print(f"\n{machine['cpu_model']}, {machine['cpus_available']} CPUs, torch {machine['torch']}, "
          f"transformers {transformers.__version__}, nncfuse {machine['nncfuse_revision']}; "
          f"1-minute load average {min(r.load_before for r in results):.2f} to "
          f"{max(r.load_before for r in results):.2f} before each model")
    print_tables(results, args.contenders, args.clock)
    print(f"\ntotal {time.perf_counter() - start:.0f} s")
    if args.chart is not None:
        write_chart(args.chart, results, args.contenders, machine, args.clock)


if __name__ == "__main__":
    main()
