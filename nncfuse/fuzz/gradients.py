"""gradients: a case's input gradients through `nncfuse.jit` against eager autograd's.

`python -m nncfuse.fuzz --backend llvm,grad` adds this check to each case
(`oracle.check_gradients`): the case's float32 and float64 tensor inputs become leaves that
require grad, and the program's outputs that require grad are reduced to one loss with
fixed random weights (in float64):

    loss = sum((out_k.double() * w_k).sum() for each output k that requires grad)

whose gradients with respect to the inputs (`torch.autograd.grad`; an input it does not reach
has zeros) are compared, on the calls of the case (A profiling, A optimized, B), with
eager's: float64 to `(1e-7, 1e-7)`, float32 to `(1e-4, 1e-5)`, and where a float16 or
bfloat16 input feeds the program to that type's precision (its values round there in the
forward), the absolute tolerance scaled by the largest gradient (a broadcast input's
gradient sums many terms). A case whose
eager run raises under autograd (an in-place write to a leaf that requires grad) or has no
output that requires grad is skipped.

A difference where TorchScript's own executor (the script called after its profiling runs,
which differentiates by TorchScript's formulas) gives nncfuse's gradients is counted as
`torchscript`, not as nncfuse's mismatch: the relu family's gradients at NaN inputs and
under infinite gradients, which nncfuse's fused kernels keep
(`jit/training/eager_gradients.py`), and other formulas' NaN where eager's are finite.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch

from .inputs import clone_input

__all__ = ["check"]

#: (rtol, atol relative to the largest gradient) per dtype of the input
TOLERANCES = {torch.float32: (1e-4, 1e-5), torch.float64: (1e-7, 1e-7)}
#: ... and where a float16 or bfloat16 input feeds the program: its values round to that
#: type's precision in the forward (one ulp apart is within the forward's tolerance)
REDUCED = {torch.float16: (2e-3, 1e-4), torch.bfloat16: (1.6e-2, 1e-3)}
CALLS = (0, 0, 1)  # input set per call: profile on A, run A optimized, then B


class Skip(Exception):
    """Eager cannot differentiate the case: nothing to compare."""


def _leaves(args: Sequence[Any]) -> list[Any]:
    out = []
    for a in args:
        if isinstance(a, torch.Tensor):
            a = clone_input(a)
            if a.dtype in TOLERANCES:
                a = a.detach().requires_grad_(True)
        out.append(a)
    return out


def _weights(outs: Sequence[Any], seed: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(o.shape, generator=gen, dtype=torch.float64) for o in outs]


def gradients(fn: Callable[..., Any], args: Sequence[Any], seed: int
              ) -> tuple[list[torch.Tensor], list[torch.dtype]]:
    """The gradients of the weighted loss of `fn(*args)`'s outputs that require grad with
    respect to `args`' float inputs, and those inputs' dtypes. Raises `Skip` where no output
    requires grad."""
    args = _leaves(args)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        outs = fn(*args)
    outs = outs if isinstance(outs, tuple) else (outs,)
    reached = [o for o in outs if isinstance(o, torch.Tensor) and o.requires_grad]
    if not reached:
        raise Skip("no output requires grad")
    loss = sum((o.double() * w).sum() for o, w in zip(reached, _weights(reached, seed)))
    leaves = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
    grads = torch.autograd.grad(loss, leaves, allow_unused=True)
    return ([torch.zeros_like(x) if g is None else g for x, g in zip(leaves, grads)],
            [x.dtype for x in leaves])


def differ(got: Sequence[torch.Tensor], want: Sequence[torch.Tensor],
           dtypes: Sequence[torch.dtype], reduced: torch.dtype | None = None) -> str:
    """'' if each gradient is within its dtype's tolerance of eager's (the `reduced` float
    type's where the program reads one), else what differs."""
    for k, (g, w, dtype) in enumerate(zip(got, want, dtypes)):
        rtol, atol = REDUCED[reduced] if reduced is not None else TOLERANCES[dtype]
        finite = w[w.isfinite()]
        scale = float(finite.abs().max()) if finite.numel() else 1.0
        try:
            torch.testing.assert_close(g, w, rtol=rtol, atol=atol * max(scale, 1.0),
                                       equal_nan=True)
        except AssertionError as e:
            return f"gradient of float input {k}: " + " ".join(str(e).split())
    return ""


def check(eager: Callable[..., Any], script: Any, inputs: Sequence[Sequence[Any]], seed: int,
          fused: Callable[..., Any]) -> tuple[str, int, str]:
    """(kind, call, message) of the first call whose gradients differ from eager's: kind is
    "mismatch", "crash" or "torchscript" (TorchScript's executor gives nncfuse's gradients
    too); ("", 0, "") if none does. Raises `Skip` where eager cannot differentiate the case."""
    wants = []
    for args in inputs:
        try:
            wants.append(gradients(eager, args, seed))
        except Skip:
            raise
        except Exception as e:  # noqa: BLE001 - eager's own error: nothing to compare
            raise Skip(f"eager raised {type(e).__name__}") from e
    kinds = {a.dtype for args in inputs for a in args if isinstance(a, torch.Tensor)}
    reduced = torch.bfloat16 if torch.bfloat16 in kinds else \
        torch.float16 if torch.float16 in kinds else None
    for call, k in enumerate(CALLS):
        want, dtypes = wants[k]
        try:
            got, _ = gradients(fused, inputs[k], seed)
        except Exception as e:  # noqa: BLE001 - eager differentiated it
            return "crash", call, f"{type(e).__name__}: {str(e)[:300]}"
        message = differ(got, want, dtypes, reduced)
        if message:
            for _ in range(2):  # TorchScript's executor optimizes after its profiling runs
                try:
                    gradients(script, inputs[k], seed)
                except Exception:  # noqa: BLE001
                    break
            try:
                theirs, _ = gradients(script, inputs[k], seed)
            except Exception:  # noqa: BLE001
                theirs = None
            kind = "torchscript" if theirs is not None and not differ(
                got, theirs, dtypes, reduced) else "mismatch"
            return kind, call, message
    return "", 0, ""
