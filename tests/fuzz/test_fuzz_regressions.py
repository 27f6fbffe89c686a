"""Bugs the differential fuzzer (`nncfuse.fuzz`) found in the core, each as its minimized repro.

Each test names the seed that found it (`python -m nncfuse.fuzz --replay SEED`).
"""

import numpy as np
import pytest
import torch

import nncfuse
from nncfuse.tensorexpr.ops import _fma_scalar


def _check(fn, *args, use_llvm):
    fused = nncfuse.jit(fn, use_llvm=use_llvm, min_group_size=1)
    for _ in range(3):
        torch.testing.assert_close(fused(*args), fn(*args), equal_nan=True)


def test_interpreter_fma_rounding_next_to_float_max():
    """Seed 1109: the interpreter's fma raised OverflowError when the result rounds near
    float32's largest value (the neighbour it compared against was infinity)."""

    def f(x, y):
        return torch.rsub(y, x, alpha=0.5)  # x - 0.5 * y: one fma

    big = torch.finfo(torch.float32).max
    x = torch.tensor([-big, big, 1.5, -big])
    y = torch.tensor([1.0, -1.0, 2.0, 3e31])
    _check(f, x, y, use_llvm=False)


@pytest.mark.filterwarnings("ignore:overflow encountered")
def test_interpreter_fma_overflow_rounds_like_ieee():
    """Just past float32's largest value an fma rounds back to it; half an ulp past, to inf."""
    big = np.float32(np.finfo(np.float32).max)
    half_ulp = np.float32(2.0**103)
    one = np.float32(1.0)
    assert _fma_scalar(big, one, one) == big
    assert _fma_scalar(-big, one, -one) == -big
    assert _fma_scalar(big, one, half_ulp) == np.inf  # a tie: to even, which is infinity
    assert _fma_scalar(big, one, np.float32(2.0**102)) == big


@pytest.mark.parametrize("n", [2, 37])
def test_llvm_scalar_fmod_by_nan(n):
    """Seeds 24117 and 22995: fmod(x, NaN) with x converted from an integer compiled to
    nothing: LLVM turned the libm call into `frem nnan` (poison for a NaN operand) and
    deleted the store, leaving the output uninitialized."""

    def f(x):
        return torch.isnan(torch.fmod(x, float("nan"))), torch.remainder(x, float("nan"))

    x = torch.arange(-n // 2, n - n // 2, dtype=torch.int16)
    _check(torch.jit.script(f), x, use_llvm=True)


@pytest.mark.parametrize("repeat", [1, 4])  # a scalar loop, and a vector loop with a tail
def test_interpreter_pow_by_a_half_follows_c(repeat):
    """Seed 53984: the interpreter's pow(-inf, 0.5) was NaN and pow(-0.0, 0.5) was -0.0
    (numpy's power takes a square root there); C's pow, which eager and the LLVM backend
    follow, gives inf and 0.0."""

    def f(x, y):
        return torch.pow(x, y)

    x = torch.tensor([-float("inf"), -0.0, 4.0, -2.0, float("inf")] * repeat)
    y = torch.tensor([0.5, 0.5, 0.5, 0.5, -0.5] * repeat)
    for use_llvm in (False, True):
        _check(torch.jit.script(f), x, y, use_llvm=use_llvm)


@pytest.mark.parametrize("use_llvm", [True, False], ids=["llvm", "interp"])
def test_float_floor_division_that_overflows_is_infinite(use_llvm):
    """Fuzzer seeds 20215, 62389: ATen uses `a` for `a - fmod(a, b)` where a / b overflows."""

    def f(a, b):
        return a // b

    a = torch.tensor([3e38, -3e38, 1.0, 3e38, float("inf")] * 4)
    b = torch.tensor([0.5, 0.5, 3.0, -0.25, 2.0] * 4)
    g = nncfuse.jit(f, min_group_size=1, use_llvm=use_llvm)
    g(a, b)
    torch.testing.assert_close(g(a, b), f(a, b), equal_nan=True)
    assert nncfuse.fusion_groups(g.graph_for(a, b))


@pytest.mark.parametrize("use_llvm", [True, False])
def test_no_read_of_an_eval_dropout_moves_past_a_write_to_its_input(use_llvm):
    """Seed 810384: eval dropout returns its input itself, which TorchScript's alias analysis
    does not know; the fuser moved `floor(dropout(x))` past `x.neg_()`, so it read -x."""
    fn = torch.jit.CompilationUnit("""
def f(x0: torch.Tensor):
    v0 = torch.nn.functional.dropout(x0, 0.5, False)
    v1 = torch.floor(v0)
    v4 = x0.neg_()
    return v1 - torch.clamp_max(v4, v0)
""").f
    fused = nncfuse.jit(fn, use_llvm=use_llvm, min_group_size=1)
    x = torch.tensor([0.6675905226948105, -2.5, 3.0], dtype=torch.float64)
    for _ in range(3):
        got_x, want_x = x.clone(), x.clone()
        torch.testing.assert_close(fused(got_x), fn(want_x))
        torch.testing.assert_close(got_x, want_x)
