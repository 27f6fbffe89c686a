"""Calls under `torch.autocast("cpu")`: eager autocast's result dtypes and values, and a plan made
under autocast never serves a call outside it (or under another dtype), nor the reverse.

TorchScript preoptimizes each callee for the ambient autocast with its own casts (layer norm and
gelu in float32, where eager's CPU autocast keeps them in bfloat16); inlined into the graph that
nncfuse specializes, those casts gave float32 results under autocast and bfloat16-rounded ones
outside it. Ops that eager autocast casts (GEMMs, convolutions: they have an AutocastCPU kernel)
stay outside fusion groups under autocast, so that eager's autocast casts their operands."""

import copy

import pytest
import torch
from torch import nn

import nncfuse

DTYPES = [torch.bfloat16, torch.float16]


def _block() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 16), nn.LayerNorm(16))


def _close(result: torch.Tensor, expected: torch.Tensor, reduced: bool) -> None:
    assert result.dtype == expected.dtype
    tol = 2e-2 if reduced else 1e-5
    torch.testing.assert_close(result, expected, rtol=tol, atol=tol)


@pytest.mark.parametrize("script", [False, True], ids=["module", "script_module"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_module_under_autocast_then_outside(dtype, script):
    model = _block().eval()
    fused = nncfuse.jit(torch.jit.script(model) if script else model)
    x = torch.randn(4, 16)
    with torch.no_grad():
        for _ in range(3):  # (profile, optimize, run the plan) in and out of autocast, in turn
            with torch.autocast("cpu", dtype=dtype):
                _close(fused(x), model(x), reduced=True)
            _close(fused(x), model(x), reduced=False)


def test_a_function_first_called_under_autocast_returns_float32_outside():
    def f(a, b):
        return torch.mm(a, b).relu() + 1

    fused = nncfuse.jit(f)
    a, b = torch.randn(8, 8), torch.randn(8, 8)
    for _ in range(3):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            _close(fused(a, b), f(a, b), reduced=True)
    for _ in range(3):
        _close(fused(a, b), f(a, b), reduced=False)
    with torch.autocast("cpu", dtype=torch.float16):  # another dtype: another plan
        _close(fused(a, b), f(a, b), reduced=True)


def test_elementwise_work_still_fuses_under_autocast():
    def f(a, b):
        return torch.sigmoid(a * b) + torch.tanh(b) * 2.0

    fused = nncfuse.jit(f)
    a, b = torch.randn(64), torch.randn(64)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        for _ in range(2):
            _close(fused(a, b), f(a, b), reduced=False)  # (no op here that autocast casts)
        assert nncfuse.fusion_groups(fused.graph_for(a, b))


@pytest.mark.parametrize("autograd", ["autodiff", "aot"])
def test_training_under_autocast_gives_eagers_dtypes_and_gradients(autograd):
    model = _block()
    reference = copy.deepcopy(model)
    fused = nncfuse.jit(model, autograd=autograd)
    x = torch.randn(4, 16)
    for _ in range(3):
        for enabled in (True, False):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=enabled):
                result, expected = fused(x), reference(x)
            _close(result, expected, reduced=enabled)
            result.float().square().sum().backward()
            expected.float().square().sum().backward()
            for p, q in zip(model.parameters(), reference.parameters()):
                torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5)
            model.zero_grad()
            reference.zero_grad()
