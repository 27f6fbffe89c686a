"""LLM decoding through the backends: transformers' `model.generate`, eager vs torch.compile
(Inductor) vs nncfuse, side by side in one process.

    pip install -e ".[models]"                          # transformers
    PYTHONPATH=. python benchmarks/generate.py          # every model, 1 and 2 threads
    PYTHONPATH=. python benchmarks/generate.py --quick  # smoke run: fewer tokens and rounds
    PYTHONPATH=. python benchmarks/generate.py --models gpt2 --threads 2 --contenders nncfuse

(`PYTHONPATH=.`: the checkout's nncfuse, not an installed one; the header says which ran.)
Models are built from small configs with random weights (nothing is downloaded), in
`eval()` and under `torch.no_grad()`: Llama (hidden 256, intermediate 688, 4 layers, 4
heads, 2 key-value heads) with transformers' dynamic cache and with
`cache_implementation="static"`, and GPT-2 (n_embd 256, 4 layers, 4 heads). Each generate
is greedy: a 32-token prompt, 32 new tokens (16 with `--quick`). The compiled contenders
patch the model's forward, as transformers' docs do:
`model.forward = torch.compile(model.forward, backend=...)`, so generate's Python
(logits processing, cache bookkeeping) runs eagerly for all three.

Per model and thread setting:

- *first*: the wall time of the first generate (Dynamo's trace, every compile it
  triggers, prefill and decode). Inductor gets a fresh `TORCHINDUCTOR_CACHE_DIR` per model
  and thread setting, so its first generate compiles for real (in-process caches still
  serve a later thread setting code it already loaded, as nncfuse's object-code table does);
- *second*: the wall time of the second generate (what the first left to compile: the
  static cache's prefill on an allocated cache is a new graph), against tok/s's steady state;
- *compiles*: how many graphs Dynamo handed the backend over the whole run, warm-up and
  timed generates included (the backend callable is wrapped and counted): prefill and decode
  should compile once each, and a count that grows with the rounds is a recompile per call;
- *tok/s*: new tokens over the median wall time of a full generate, timed in interleaved
  rounds after warm-up (`harness.measure`, one generate per sample);
- *RSS*: the growth of the process's peak resident set (`getrusage`) over the contender's
  build and first two generates, then the process peak at the end (one process: later
  contenders only show what they add above the earlier peak);
- every contender's generated tokens are checked equal to eager's (greedy decoding).
"""

from __future__ import annotations

import argparse
import copy
import os
import resource
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from harness import Timing, measure, quiet_transformers, select, timed_call
from report import LABELS, machine_info

import nncfuse

CONTENDERS = ("eager", "compile", "nncfuse")
WARM_CACHE = Path(__file__).resolve().parent / "results" / "inductor-cache"  # models.py's
PROMPT = 32


@dataclass(frozen=True)
class Spec:
    """A causal LM: its builder and the keyword arguments its generate calls take."""

    name: str
    family: str
    build: Callable[[], torch.nn.Module]
    generate_kwargs: dict[str, Any] = field(default_factory=dict)


def _llama() -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM
    config = LlamaConfig(vocab_size=1000, hidden_size=256, intermediate_size=688,
                         num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=256)
    return LlamaForCausalLM(config)


def _llama1024() -> torch.nn.Module:
    """A Llama whose weights decide the decode time (27M parameters, 109 MB in float32; a
    vocabulary of 1024: ATen packs int4 weights of a multiple of 16 rows only)."""
    from transformers import LlamaConfig, LlamaForCausalLM
    config = LlamaConfig(vocab_size=1024, hidden_size=1024, intermediate_size=2816,
                         num_hidden_layers=2, num_attention_heads=16, num_key_value_heads=16,
                         max_position_embeddings=256)
    return LlamaForCausalLM(config)


def _gpt2() -> torch.nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel
    config = GPT2Config(vocab_size=1000, n_embd=256, n_layer=4, n_head=4, n_positions=256)
    return GPT2LMHeadModel(config)


MODELS = [
    Spec("llama", "Llama, dynamic cache", _llama),
    Spec("llama-static", "Llama, static cache", _llama, {"cache_implementation": "static"}),
    Spec("gpt2", "GPT-2, dynamic cache", _gpt2),
    Spec("llama1024", "Llama (hidden 1024, 2 layers), dynamic cache", _llama1024),
]
QUANT = ("none", "bf16", "int8", "int4")


def quantize(model: torch.nn.Module, quant: str) -> torch.nn.Module:
    """`model` with its linears' weights quantized by torchao, weight-only, in place: int8
    per output channel (`Int8WeightOnlyConfig`), or int4 in groups of 128 in the CPU's
    packed layout (`_weight_int4pack_mm_for_cpu`; torchao 0.18's `Int4WeightOnlyConfig`
    packs for CUDA only); or, "bf16", the whole model cast to bfloat16."""
    if quant == "none":
        return model
    if quant == "bf16":
        return model.to(torch.bfloat16)
    from torchao.quantization import Int8WeightOnlyConfig, quantize_
    if quant == "int8":
        config: Any = Int8WeightOnlyConfig()
    else:
        from torchao.prototype.quantization.int4 import PrototypeInt4WeightOnlyConfig
        config = PrototypeInt4WeightOnlyConfig(group_size=128, set_inductor_config=False)
    quantize_(model, config)
    return model


class Counted:
    """A torch.compile backend that counts the graphs Dynamo hands it."""

    def __init__(self, backend: Callable[..., Any]):
        self.backend = backend
        self.calls = 0

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
        self.calls += 1
        return self.backend(gm, example_inputs)


def _backend(contender: str) -> Callable[..., Any]:
    if contender == "nncfuse":
        from nncfuse.backend import nncfuse
        return nncfuse
    from torch._dynamo import lookup_backend
    return lookup_backend("inductor")


def peak_rss_mb() -> float:
    """The process's peak resident set so far, in MB (Linux reports KB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


@dataclass
class Result:
    model: str
    threads: int
    new_tokens: int
    load_before: float
    timings: dict[str, Timing] = field(default_factory=dict)
    first: dict[str, float] = field(default_factory=dict)
    second: dict[str, float] = field(default_factory=dict)
    compiles: dict[str, int] = field(default_factory=dict)
    rss_mb: dict[str, float] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)

    def tok_s(self, contender: str) -> float | None:
        t = self.timings.get(contender)
        return self.new_tokens / t.median if t else None


def run_model(spec: Spec, threads: int, args: argparse.Namespace,
              quant: str = "none") -> Result:
    """Every contender's first generate, compiles, RSS and tokens, then the timed rounds, on
    the model quantized as `quant` says (eager's tokens on it are the reference)."""
    torch._dynamo.reset()  # no code or guards carried over from another model or thread count
    # A fresh Inductor cache per model and thread setting: its first generate really compiles.
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = (
        tempfile.mkdtemp(dir=args.inductor_root) if args.inductor_cache == "cold"
        else str(WARM_CACHE))
    torch.manual_seed(0)
    base = quantize(spec.build().eval(), quant)
    ids = torch.randint(0, base.config.vocab_size, (1, PROMPT))
    kwargs = dict(max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens,
                  do_sample=False, disable_compile=True, **spec.generate_kwargs)
    name = spec.name if quant == "none" else f"{spec.name} {quant}"
    result = Result(name, threads, args.new_tokens, os.getloadavg()[0])
    runs: dict[str, Callable[[], Any]] = {}
    counters: dict[str, Counted] = {}
    reference = None
    for contender in args.contenders:
        rss = peak_rss_mb()
        try:
            model = copy.deepcopy(base)
            if contender != "eager":
                # Dynamo's automatic-dynamic sizes of a fresh process: the sizes an earlier
                # contender's compiles saw of the same code would mark this one's dims dynamic
                # (its decode graph then has a symbolic row count).
                torch._dynamo.pgo.reset_code_state()
                counters[contender] = Counted(_backend(contender))
                model.forward = torch.compile(model.forward, backend=counters[contender])

            def run(model: torch.nn.Module = model) -> torch.Tensor:
                with torch.no_grad():
                    return model.generate(ids, **kwargs)

            out, result.first[contender] = timed_call(run)
            # The second generate: what the first one left to compile (a static cache's
            # prefill on an allocated cache is a new graph; plans built on a second call).
            again, result.second[contender] = timed_call(run)
            result.rss_mb[contender] = peak_rss_mb() - rss
            if reference is None:
                reference = out
            if not torch.equal(again, out):
                raise AssertionError("the second generate's tokens differ from the first's")
            if contender != "eager" and not torch.equal(out, reference):
                same = int((out[0] == reference[0]).long().cumprod(0).sum()) - PROMPT
                raise AssertionError(f"tokens differ from eager's after {same} new tokens")
            runs[contender] = run
        except Exception as e:  # noqa: BLE001 - reported, not timed
            if os.environ.get("SUITE_TRACEBACK"):
                traceback.print_exc()
            result.errors[contender] = f"{type(e).__name__}: {str(e)[:200]}"
    # One generate per sample (target 0): a generate takes tens of milliseconds already.
    result.timings = measure(runs, rounds=args.rounds, target_s=0.0, warmup=args.warmup,
                             clock=args.clock)
    for contender, counted in counters.items():
        result.compiles[contender] = counted.calls
    return result


def print_tables(results: list[Result], contenders: list[str]) -> list[str]:
    """One line per model and thread setting: tok/s, first generate, compiles, RSS growth."""
    heads = ["model", "thr"] + [f"{LABELS[c]} tok/s" for c in contenders]
    heads += [f"{LABELS[c]} first" for c in contenders if c != "eager"]
    heads += [f"{LABELS[c]} second" for c in contenders if c != "eager"]
    heads += [f"{LABELS[c]} compiles" for c in contenders if c != "eager"]
    heads += [f"{LABELS[c]} +RSS MB" for c in contenders]
    heads += ["spread"]
    lines = ["| " + " | ".join(heads) + " |", "|" + "---|" * len(heads)]
    for r in results:
        cells = [r.model, str(r.threads)]
        for c in contenders:
            v = r.tok_s(c)
            cells.append("FAILED" if c in r.errors else "-" if v is None else f"{v:.0f}")
        cells += [f"{r.first[c]:.1f} s" if c in r.first else "-"
                  for c in contenders if c != "eager"]
        cells += [f"{1e3 * r.second[c]:.0f} ms" if c in r.second else "-"
                  for c in contenders if c != "eager"]
        cells += [str(r.compiles.get(c, "-")) for c in contenders if c != "eager"]
        cells += [f"{r.rss_mb[c]:.0f}" if c in r.rss_mb else "-" for c in contenders]
        spread = max((t.max / t.min for t in r.timings.values()), default=None)
        cells.append("-" if spread is None else f"{spread:.2f}")
        lines.append("| " + " | ".join(cells) + " |")
    print("\n".join(lines))
    for r in results:
        for c, e in r.errors.items():
            print(f"  {r.model} [{r.threads}] {LABELS[c]} FAILED: {e}")
    return lines


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", help="comma-separated names (default: all): " + ",".join(
        s.name for s in MODELS))
    p.add_argument("--threads", default="1,2",
                   help="comma-separated thread counts; 'all' = CPUs available (default 1,2)")
    p.add_argument("--rounds", type=int, help="timed rounds (default 15; quick 5)")
    p.add_argument("--new-tokens", type=int, help="tokens per generate (default 32; quick 16)")
    p.add_argument("--contenders", default=",".join(CONTENDERS),
                   help="comma-separated subset of " + ",".join(CONTENDERS))
    p.add_argument("--quant", default="none",
                   help="comma-separated weight quantizations of every contender's model, "
                        "of " + ",".join(QUANT) + ' (default none; int8 and int4 need '
                        'torchao: pip install -e ".[quant]")')
    p.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                   help="the clock tok/s is timed on (cpu: steadier on a loaded machine, "
                        "for one thread only)")
    p.add_argument("--quick", action="store_true",
                   help="smoke run: fewer tokens and rounds, a warm Inductor cache")
    p.add_argument("--inductor-cache", choices=["cold", "warm"],
                   help=f"cold: a fresh cache per model and thread setting (default); warm: "
                        f"reuse {WARM_CACHE} (quick's default: first generates are then not "
                        "Inductor's real compile time)")
    args = p.parse_args(argv)
    args.inductor_cache = args.inductor_cache or ("warm" if args.quick else "cold")
    args.rounds = args.rounds or (5 if args.quick else 15)
    args.new_tokens = args.new_tokens or (16 if args.quick else 32)
    args.warmup = 1 if args.quick else 2
    select(p, args, CONTENDERS, MODELS)
    args.quant = args.quant.split(",")
    if not set(args.quant) <= set(QUANT):
        p.error(f"--quant: choose from {','.join(QUANT)}")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    transformers = quiet_transformers("generate.py")
    start = time.perf_counter()
    initial = torch.get_num_threads()
    results = []
    with tempfile.TemporaryDirectory(prefix="generate-inductor-") as root:
        args.inductor_root = root
        try:
            for threads in args.thread_settings:
                torch.set_num_threads(threads)
                for spec in args.specs:
                    for quant in args.quant:
                        print(f"[{threads} thread{'s' if threads > 1 else ''}] {spec.name}: "
                              f"{spec.family}, weights {quant}", flush=True)
                        results.append(run_model(spec, threads, args, quant))
        finally:
            torch.set_num_threads(initial)
    machine = machine_info(args.thread_settings, None)
    print(f"\n{machine['cpu_model']}, {machine['cpus_available']} CPUs, torch {machine['torch']}, "
          f"transformers {transformers.__version__}, nncfuse {machine['nncfuse_revision']} "
          f"(imported from {Path(nncfuse.__file__).parent}); "
          f"{args.new_tokens} new tokens after {PROMPT}; 1-minute load average "
          f"{min(r.load_before for r in results):.2f} to "
          f"{max(r.load_before for r in results):.2f} before each model")
    print_tables(results, args.contenders)
    print(f"peak RSS {peak_rss_mb():.0f} MB; total {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
