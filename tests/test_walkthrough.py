"""The seed program of the NNC walkthrough, end to end, with its dumps."""

import re

import pytest
import torch

import nncfuse
from nncfuse.jit.fuser.guard import clear_kernel_cache
from nncfuse.tensorexpr import capability


def seed(a):
    b = torch.conv2d(a, torch.ones(1, 1, 1, 1) * 0.5)
    x = torch.mul(b, b)
    y = torch.sin(x)
    return torch.mul(y, y)


def run_seed(capsys, shape=(1, 1, 128, 128)):
    clear_kernel_cache()  # compile again, so that the kernel stages are logged
    f = nncfuse.jit(seed)
    a = torch.randn(shape)
    for _ in range(3):
        torch.testing.assert_close(f(a), seed(a))
    return f, capsys.readouterr().err


def test_silent_without_log_level(capsys):
    _, err = run_seed(capsys)
    assert err == ""


def test_fuser_dump_headers(monkeypatch, capsys):
    monkeypatch.setenv("NNCFUSE_LOG_LEVEL", "tensorexpr_fuser.py")
    _, err = run_seed(capsys)
    headers = [
        "Before TExprFuser:",
        "After creating fusion groups:",
        "After guarding fusion groups:",
        "After TExprFuser:",
    ]
    positions = [err.index(f"] {h}") for h in headers]
    assert positions == sorted(positions)
    assert all(line.startswith("[DUMP tensorexpr_fuser.py:") for line in err.splitlines())
    assert "prim::TensorExprGroup_0" in err and "prim::TypeCheck" in err
    assert "Considering node" not in err  # that is GRAPH_DEBUG


def test_fuser_debug_says_why_not(monkeypatch, capsys):
    monkeypatch.setenv("NNCFUSE_LOG_LEVEL", ">>tensorexpr_fuser")
    _, err = run_seed(capsys)
    assert "Merging aten::conv2d into" in err  # the conv joins the group as an external call


def test_kernel_and_llvm_dumps(monkeypatch, capsys):
    monkeypatch.setenv("NNCFUSE_LOG_LEVEL", "tensorexpr_fuser:>>kernel:>>llvm_codegen")
    _, err = run_seed(capsys)
    for header in [
        "TensorExprKernel graph:",
        "Original Stmt:",
        "Final Stmt:",
        "LLVM module before optimizations",
        "LLVM module after optimizations",
        "LLVM generated assembly code",
    ]:
        assert header in err
    final = err.split("Final Stmt:")[1].split("LLVM module")[0]
    body = [re.sub(r"^\[DEBUG kernel.py:\d+\] ", "", line) for line in final.splitlines()[1:]]
    loops = [line for line in body if "for (" in line]
    assert len(loops) == 1, final  # one sweep over memory
    assert "Ramp(" in final and "Allocate" not in final
    assert final.count("sin(") == 1  # sin computed once per element
    # vector math as eager's kernels do it: SLEEF, or libm lane by lane in its default ones
    assert ("Sleef_sinf" in err) == capability.vector_math_is_sleef()
    original = err.split("Original Stmt:")[1].split("After inline")[0]
    assert original.count("aten_mul") >= 2 and "aten_sin" in original


@pytest.mark.parametrize("backend", ["llvm", "interpreter"])
def test_results_after_a_shape_change(monkeypatch, backend):
    if backend == "interpreter":
        monkeypatch.setenv("NNCFUSE_DONT_USE_LLVM", "1")
    f = nncfuse.jit(seed)
    for shape in [(1, 1, 32, 32), (2, 1, 5, 7), (1, 1, 32, 32)]:
        a = torch.randn(shape)
        for _ in range(2):
            torch.testing.assert_close(f(a), seed(a))
        assert len(nncfuse.fusion_groups(f.graph_for(a))) == 1
