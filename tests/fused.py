"""Helpers shared by the per-family op tests: run through nncfuse, compare bit for bit."""

import warnings

import pytest
import torch

import nncfuse

BACKENDS = [pytest.param(True, id="llvm"), pytest.param(False, id="interp")]
FLOATS = [torch.float32, torch.float64, torch.float16, torch.bfloat16]


def run_fused(fn, *args, use_llvm=True):
    """`fn(*args)` through nncfuse (after its profiling call), asserting that it fused.

    With tensors only, `fn` is traced (numbers in it become constants);
    otherwise it is scripted, and its numbers are inputs of the graph.
    """
    if all(isinstance(a, torch.Tensor) for a in args):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fn = torch.jit.trace(lambda *a: fn(*a), args, check_trace=False)
    f = nncfuse.jit(fn, min_group_size=1, use_llvm=use_llvm)
    f(*args)
    out = f(*args)
    assert nncfuse.fusion_groups(f.graph_for(*args)), "nothing was fused"
    return out


def assert_exact(got, want):
    """Same dtype and values bit for bit, the sign of zeros included (NaN is any NaN)."""
    torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)
    if want.is_floating_point():
        numbers = ~want.isnan()
        assert torch.equal(got.signbit()[numbers], want.signbit()[numbers]), (got, want)


def check(fn, *args, exact=True, use_llvm=True):
    """`fn(*args)` fused equals eager: bit for bit, or within assert_close's tolerance."""
    got = run_fused(fn, *args, use_llvm=use_llvm)
    want = fn(*args)
    if exact:
        assert_exact(got, want)
    else:
        torch.testing.assert_close(got, want, equal_nan=True)
    return got


def assert_step_as_eager(fused, model, reference, x):
    """One call of `fused` (running `model`) and of `reference` (eager's copy) on copies of
    `x`: the same result, and the same gradients of the input and of the parameters."""
    x, x_ref = x.clone().requires_grad_(), x.clone().requires_grad_()
    out, ref = fused(x), reference(x_ref)
    torch.testing.assert_close(out, ref)
    seed = torch.randn_like(ref)
    torch.testing.assert_close(torch.autograd.grad(out, [x, *model.parameters()], seed),
                               torch.autograd.grad(ref, [x_ref, *reference.parameters()], seed))


def assert_as_close_as_eager(got, want, exact, atol=1e-5):
    """Each tensor of `got` within assert_close of eager's `want`, or, where rounding moves
    both, no farther from float64 eager's `exact` than eager's own error allows
    (`nncfuse.testing.rounding_explains`): a sum with cancellation (a weight's gradient)
    differs between two float32 orders of the same terms by more than assert_close allows."""
    from nncfuse.testing import rounding_explains

    for g, w, x in zip(got, want, exact, strict=True):
        try:
            torch.testing.assert_close(g, w)
        except AssertionError:
            assert rounding_explains((g,), (w,), (x,), atol), (g, w)


def backend_kernel_stmts(model, x, dtype=torch.bfloat16, tol=2e-2):
    """`model` through the nncfuse backend, called three times under `torch.autocast("cpu",
    dtype)` with results and dtypes asserted as eager autocast's; the top-level statements
    of the kernels of its one compiled graph."""
    from nncfuse import backend
    from nncfuse.jit.fuser.runtime import kernel_of

    torch._dynamo.reset()
    backend.clear_compiled_graphs()
    compiled = torch.compile(model, backend="nncfuse")
    for _ in range(3):
        with torch.no_grad(), torch.autocast("cpu", dtype=dtype):
            got, want = compiled(x), model(x)
        assert got.dtype == want.dtype and got.shape == want.shape
        torch.testing.assert_close(got, want, rtol=tol, atol=tol, equal_nan=True)
    (graph,) = backend.compiled_graphs()
    stmts = [s for g in graph.graphs() for group in nncfuse.fusion_groups(g)
             for s in kernel_of(group).stmt.stmts]
    torch._dynamo.reset()
    return stmts
