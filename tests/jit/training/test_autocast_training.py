"""Training under `torch.autocast("cpu")`, fused: `loss.backward()` inside the region (or after
it), through `nncfuse.jit`'s autodiff (the rewrites `autocast_casts` and `explicit_promotions`)
and the backend (AOTAutograd's trace records eager's casts). Results have eager autocast's
dtypes, parameters' gradients are float32 and close to eager autocast's.

Tolerance: relative to the largest gradient, `TOL`. On these modules Inductor's gradients differ
from eager autocast's by up to 2e-7 of it (it rounds as eager does); nncfuse's autodiff path by
up to 6e-3 in bfloat16 (a bfloat16 ulp is 4e-3: oneDNN applies the GELU post-op to the GEMM's
float32 accumulator, before eager's rounding, `docs/guide/mixed-precision.md`), so the
tolerance is two bfloat16 ulps, the one torch.testing takes for bfloat16 (1.6e-2)."""

import copy

import pytest
import torch
from torch import nn

import nncfuse
from nncfuse.jit.fuser import cast_cache
from nncfuse.jit.training.autodiff import AutodiffPlan

DTYPES = [torch.bfloat16, torch.float16]
TOL = 1.6e-2


class Residual(nn.Module):
    """A pre-norm MLP with a residual: the promotion of the bfloat16 GEMM's result by the
    float32 residual is what autodiff's formulas missed."""

    def __init__(self, width: int = 16):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.fc1 = nn.Linear(width, 4 * width)
        self.fc2 = nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(nn.functional.gelu(self.fc1(self.norm(x))))


def _pair(make=Residual):
    torch.manual_seed(0)
    model = make()
    return model, copy.deepcopy(model)


def _loss(out: torch.Tensor) -> torch.Tensor:
    weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
    return (out.float() * weights).sum()


def _step(fn, model, x, dtype, inside: bool = True) -> torch.Tensor:
    model.zero_grad()
    with torch.autocast("cpu", dtype=dtype):
        out = fn(x)
        loss = _loss(out)
        if inside:
            loss.backward()
    if not inside:
        loss.backward()
    return out


def _same_gradients(model, reference) -> None:
    grads = [(p.grad, q.grad) for p, q in zip(model.parameters(), reference.parameters())]
    scale = max(float(q.abs().max()) for _, q in grads)
    for p, q in grads:
        assert p.dtype == q.dtype == torch.float32
        torch.testing.assert_close(p, q, rtol=TOL, atol=TOL * scale)


def _train_as_eager(fn, model, reference, x, dtype, inside: bool = True,
                    result_dtype: torch.dtype | None = None, tol: float = TOL) -> None:
    """Three steps of `fn` (profile, build, run the plan) against eager's `reference`: the
    results' dtypes (`result_dtype` where given) and values, the gradients."""
    for _ in range(3):
        result = _step(fn, model, x, dtype, inside)
        expected = _step(reference, reference, x, dtype, inside)
        assert result.dtype == expected.dtype == (result_dtype or expected.dtype)
        torch.testing.assert_close(result, expected, rtol=tol, atol=tol)
        _same_gradients(model, reference)


def _plan(fused) -> AutodiffPlan:
    plans = [p for p in fused.policy.plans.values() if isinstance(p, AutodiffPlan)]
    assert len(plans) == 1
    return plans[0]


@pytest.mark.parametrize("inside", [True, False], ids=["backward_inside", "backward_after"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_autodiff_trains_fused_with_eagers_dtypes_and_gradients(dtype, inside):
    model, reference = _pair()
    fused = nncfuse.jit(model)
    x = torch.randn(2, 8, 16)
    _train_as_eager(fused, model, reference, x, dtype, inside)
    # One differentiable graph (the casts joined it), its f holding the GEMMs in reduced
    # precision, fused with their epilogues.
    (outer,) = _plan(fused).outers()
    assert len(outer.entries) == 1
    f_graphs, df_graphs = _plan(fused).fused_graphs()
    groups = [n for g in f_graphs for n in nncfuse.fusion_groups(g)]
    linears = [n for group in groups for n in group.g("Subgraph").nodes()
               if n.kind() == "aten::linear"]
    assert len(linears) == 2
    assert all(n.inputsAt(1).type().dtype() == dtype for n in linears)
    assert [n for g in df_graphs for n in nncfuse.fusion_groups(g)]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_backend_trains_fused_under_autocast(dtype):
    from nncfuse.backend import clear_compiled_graphs, compiled_graphs

    clear_compiled_graphs()
    torch._dynamo.reset()
    model, reference = _pair()
    compiled = torch.compile(model, backend="nncfuse")
    x = torch.randn(2, 8, 16)
    _train_as_eager(compiled, model, reference, x, dtype)
    kinds = {g.kind for g in compiled_graphs()}
    assert {"forward", "backward"} <= kinds
    torch._dynamo.reset()


def _mixed_norm() -> nn.Module:
    return nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 16), nn.LayerNorm(16))


def test_a_norm_of_a_reduced_input_with_float32_weights_trains_fused():
    """A layer norm of a bfloat16 GEMM result with float32 weights gives bfloat16 in eager,
    computed in float32: so it is computed, its input cast up and its result down
    (`promotions.py`), and its gradients keep the input's and the weights' dtypes."""
    model, reference = _pair(_mixed_norm)
    fused = nncfuse.jit(model)
    x = torch.randn(4, 16)
    _train_as_eager(fused, model, reference, x, torch.bfloat16, result_dtype=torch.bfloat16)
    assert _plan(fused).outers()


class SumToFloat(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.fc(x)).sum(-1, dtype=torch.float32)


def test_an_op_that_mixes_dtypes_otherwise_trains_unfused_as_eager():
    """A sum of a bfloat16 tensor to float32 (`dtype=`): autodiff's formula would give the
    bfloat16 operand a float32 gradient (`promotions.py` refuses it), and AOTAutograd's
    trace of the program may lose eager's dtypes: it runs as eager."""
    model, reference = _pair(SumToFloat)
    fused = nncfuse.jit(model)
    x = torch.randn(4, 16)
    _train_as_eager(fused, model, reference, x, torch.bfloat16, result_dtype=torch.float32,
                    tol=0)
    assert not _plan(fused).outers()


def test_weight_copies_are_not_stale_after_an_optimizer_step():
    """Inference under autocast between training steps reads weights' cached reduced-precision
    copies (`cast_cache.py`): each `optimizer.step()` bumps the weights' versions, so the
    next call casts them anew, as eager does."""
    cast_cache.clear()
    model, reference = _pair()
    fused = nncfuse.jit(model)
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.01) for m in (model, reference)]
    x = torch.randn(2, 8, 16)
    previous = None
    for _ in range(4):
        _step(fused, model, x, torch.bfloat16)
        _step(reference, reference, x, torch.bfloat16)
        for optimizer in optimizers:
            optimizer.step()
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            result, expected = fused(x), reference(x)
        torch.testing.assert_close(result, expected, rtol=TOL, atol=TOL)
        assert previous is None or not torch.equal(result, previous)  # (the weights moved)
        previous = result
