"""Checking nncfuse against eager PyTorch on OpInfo's samples (needs the `test` extra).

`OPS` names, in OpInfo's spelling, the ops nncfuse fuses (elementwise and reductions). For
one sample, `run_sample` traces a function calling the op (non-tensor
arguments become constants), runs it through `nncfuse.jit(traced,
min_group_size=1)` and compares with eager: dtype, shape, strides of
non-trivial dimensions, and values within `torch.testing.assert_close`'s
defaults (NaN where eager has NaN). `sweep` does that over many samples and
counts.

Where a result differs from eager's beyond a fixed tolerance, the fuzzer's state check, the
tests and the benchmarks judge it against float64 eager instead (`rounding_explains`): as
close as eager's own result in the same precision, within `MULTIPLIER` times, is rounding.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

import nncfuse

#: against float64 eager, a result may be this many times as far (root mean square) as eager's
#: own in the same precision: the rule of `torch._dynamo.utils.same(fp64_ref=...)`, by which
#: PyTorch's benchmarks check compilers
MULTIPLIER = 3.0


def rms(a: torch.Tensor, b: torch.Tensor) -> float:
    """The root mean square of `a - b`, in float64 (0 for empty tensors)."""
    return float((a.double() - b.double()).square().mean().sqrt()) if a.numel() else 0.0


def rounding_explains(got: tuple[Any, ...], want: tuple[Any, ...], exact: tuple[Any, ...],
                      atol: float | None = None) -> bool:
    """Whether each tensor of `got` is as close to float64 `exact` as eager's `want` is,
    within `MULTIPLIER` (root mean square, plus `atol`, by default 1e-7 of `exact`'s largest
    magnitude): dtypes and shapes as eager's, non-floating tensors equal, non-finite elements
    where eager's are.

        got 1.0000002, want 1.0000001, exact 1.00000015   -> True  (rounding)
        got 1.001,     want 1.0000001, exact 1.00000015   -> False
    """
    for g, w, e in zip(got, want, exact, strict=True):
        if not (g.dtype == w.dtype and g.shape == w.shape):
            return False
        g, w, e = g.detach(), w.detach(), e.detach()
        if not g.is_floating_point():
            if not torch.equal(g, w):
                return False
            continue
        finite = w.isfinite()
        if not (torch.equal(g.isfinite(), finite)
                and torch.equal(g[~finite].isnan(), w[~finite].isnan())
                and torch.equal(g[~finite & ~w.isnan()], w[~finite & ~w.isnan()])):
            return False
        g, w, e = g[finite], w[finite], e[finite]
        slack = atol if atol is not None else 1e-7 * float(e.abs().max()) if e.numel() else 0.0
        if rms(g, e) > MULTIPLIER * rms(w, e) + slack:
            return False
    return True


#: (OpInfo name, variant) for every op nncfuse is meant to fuse.
OPS: list[tuple[str, str]] = [
    *((n, "") for n in (
        "add", "sub", "rsub", "mul", "true_divide", "floor_divide", "neg", "abs",
        "reciprocal", "sqrt", "rsqrt", "square", "exp", "expm1", "log", "log2", "log10",
        "log1p", "sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "tanh",
        "sigmoid", "erf", "erfc", "lgamma", "floor", "ceil", "round", "trunc", "frac", "sign",
        "nn.functional.relu", "nn.functional.relu6", "nn.functional.leaky_relu",
        "nn.functional.elu", "nn.functional.gelu", "nn.functional.silu",
        "nn.functional.mish", "nn.functional.softplus", "nn.functional.hardtanh",
        "nn.functional.hardsigmoid", "nn.functional.hardswish", "nn.functional.hardshrink",
        "nn.functional.threshold", "pow", "atan2", "hypot", "fmod", "remainder", "maximum",
        "minimum", "clamp", "clamp_min", "clamp_max", "where", "masked_fill", "lerp", "addcmul",
        "eq", "ne", "lt", "le", "gt", "ge", "isnan", "logical_not", "bitwise_and", "bitwise_or",
        "bitwise_xor", "bitwise_not", "bitwise_left_shift", "bitwise_right_shift", "to",
        # reductions (issue #10)
        "sum", "mean", "prod", "amax", "amin", "any", "all", "var", "std", "logsumexp",
        "softmax", "log_softmax", "nn.functional.layer_norm", "argmax", "argmin",
        "linalg.vector_norm", "nn.functional.group_norm",
    )),
    ("div", "no_rounding_mode"), ("div", "trunc_rounding"), ("div", "floor_rounding"),
    ("max", "binary"), ("min", "binary"),
    # reductions with two outputs, normalizations, eval dropout (issue #10)
    ("max", "reduction_with_dim"), ("max", "reduction_no_dim"),
    ("min", "reduction_with_dim"), ("min", "reduction_no_dim"),
    ("var_mean", ""), ("var_mean", "unbiased"), ("std_mean", ""), ("std_mean", "unbiased"),
    ("nn.functional.batch_norm", ""), ("nn.functional.instance_norm", ""),
    ("nn.functional.rms_norm", ""), ("norm", ""), ("norm", "inf"),
    # pooling (issue #40): max_pool2d, adaptive_avg_pool2d to 1x1
    ("nn.functional.max_pool2d", ""), ("nn.functional.adaptive_avg_pool2d", ""),
]

DTYPES = [
    torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.int16,
    torch.int32, torch.int64, torch.uint8, torch.bool,
]


def opinfos() -> list[Any]:
    """The OpInfo entries of `OPS`, in that order."""
    from torch.testing._internal.common_methods_invocations import op_db

    index = {(op.name, op.variant_test_name): op for op in op_db}
    return [index[key] for key in OPS]


def op_id(op: Any) -> str:
    return op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")


def dtypes_of(op: Any) -> list[torch.dtype]:
    supported = op.supported_dtypes("cpu")
    return [d for d in DTYPES if d in supported]


def samples(op: Any, dtype: torch.dtype) -> Iterator[Any]:
    """OpInfo's reference inputs (sample inputs plus extremal values) for `op` at `dtype`."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield from op.reference_inputs("cpu", dtype)


@dataclass
class Outcome:
    matched: bool = False
    fused: bool = False
    crashed: bool = False
    skipped: bool = False
    message: str = ""
    out_of_scope: str = ""  # why nncfuse is not meant to fuse the sample; it must still match


def _out_of_scope(sample: Any, wants: tuple[torch.Tensor, ...]) -> str:
    """Why nncfuse is not meant to fuse `sample` ("" if it is): eager's results in a dtype
    nncfuse has not, or a normalization in training mode (it writes running statistics in
    place; issue #10 fuses batch norm in inference)."""
    if any(w.is_complex() for w in wants):
        return "a complex result (nncfuse has no complex dtypes)"
    if sample.kwargs.get("training") is True:
        return "a normalization in training mode (inference only)"
    return ""


def _split(sample: Any) -> tuple[list[torch.Tensor], Any]:
    """The sample's tensors, and a function rebuilding its call from them."""
    slots = [sample.input, *sample.args]
    kw = dict(sample.kwargs)
    tensors: list[torch.Tensor] = []
    places: list[tuple[str, Any]] = []
    for k, v in enumerate(slots):
        if isinstance(v, torch.Tensor):
            places.append(("pos", k))
            tensors.append(v)
    for k, v in kw.items():
        if isinstance(v, torch.Tensor):
            places.append(("kw", k))
            tensors.append(v)

    def rebuild(ts: tuple[torch.Tensor, ...]) -> tuple[list[Any], dict[str, Any]]:
        a, k = list(slots), dict(kw)
        for (where, key), t in zip(places, ts):
            if where == "pos":
                a[key] = t
            else:
                k[key] = t
        return a, k

    return tensors, rebuild


def _same(got: Any, want: torch.Tensor) -> str:
    if not isinstance(got, torch.Tensor):
        return f"got {type(got).__name__}, want a tensor"
    try:
        torch.testing.assert_close(got, want, equal_nan=True)
    except AssertionError as e:
        return str(e).splitlines()[0] + " " + " ".join(str(e).splitlines()[1:4])
    for size, a, b in zip(want.shape, got.stride(), want.stride()):
        if size > 1 and a != b:
            return f"strides {got.stride()} != eager's {want.stride()}"
    return ""


def run_sample(op: Any, sample: Any) -> Outcome:
    """Run one OpInfo sample through nncfuse and compare with eager."""
    tensors, rebuild = _split(sample)
    if not tensors:
        return Outcome(skipped=True, message="no tensor inputs")

    def call(*ts: torch.Tensor) -> Any:
        a, k = rebuild(ts)
        return op.op(*a, **k)

    try:
        want = call(*[t.clone() for t in tensors])
    except Exception as e:  # noqa: BLE001 - eager rejects the sample: nothing to compare
        return Outcome(skipped=True, message=f"eager raised {type(e).__name__}")
    wants = tuple(want) if isinstance(want, tuple) else (want,)  # max.dim: (values, indices)
    if not wants or not all(isinstance(w, torch.Tensor) for w in wants):
        return Outcome(skipped=True, message="eager returns no tensor")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            traced = torch.jit.trace(call, tuple(tensors), check_trace=False)
    except Exception as e:  # noqa: BLE001
        return Outcome(skipped=True, message=f"cannot trace: {type(e).__name__}")
    outcome = Outcome(out_of_scope=_out_of_scope(sample, wants))
    try:
        fused = nncfuse.jit(traced, min_group_size=1)
        fused(*tensors)
        got = fused(*tensors)
        outcome.fused = bool(nncfuse.fusion_groups(fused.graph_for(*tensors)))
    except Exception as e:  # noqa: BLE001 - a crash of ours, reported
        outcome.crashed = True
        outcome.message = f"{type(e).__name__}: {e}"
        return outcome
    gots = tuple(got) if isinstance(got, tuple) else (got,)
    if len(gots) != len(wants):
        outcome.message = f"{len(gots)} outputs, eager has {len(wants)}"
    else:
        outcome.message = "; ".join(m for g, w in zip(gots, wants) if (m := _same(g, w)))
    outcome.matched = not outcome.message
    return outcome


@dataclass
class Tally:
    total: int = 0
    matched: int = 0
    fused: int = 0
    crashed: int = 0
    out_of_scope: int = 0  # samples nncfuse is not meant to fuse (`Outcome.out_of_scope`)
    failures: list[str] = field(default_factory=list)

    @property
    def fusible(self) -> int:
        """Samples nncfuse is meant to fuse."""
        return self.total - self.out_of_scope

    def add(self, where: str, outcome: Outcome) -> None:
        if outcome.skipped:
            return
        self.total += 1
        self.matched += outcome.matched
        self.fused += outcome.fused
        self.crashed += outcome.crashed
        self.out_of_scope += bool(outcome.out_of_scope)
        if not outcome.matched:
            self.failures.append(f"{where}: {outcome.message}")


def sweep(
    ops: list[Any] | None = None, limit: int | None = None, dtypes: list[torch.dtype] | None = None
) -> dict[tuple[str, torch.dtype], Tally]:
    """Outcomes per (op, dtype) over the first `limit` samples of each (all if None)."""
    results: dict[tuple[str, torch.dtype], Tally] = {}
    for op in ops if ops is not None else opinfos():
        for dtype in dtypes_of(op):
            if dtypes is not None and dtype not in dtypes:
                continue
            tally = results.setdefault((op_id(op), dtype), Tally())
            for k, sample in enumerate(samples(op, dtype)):
                if limit is not None and k >= limit:
                    break
                tally.add(f"{op_id(op)}[{dtype}] #{k}", run_sample(op, sample))
    return results
