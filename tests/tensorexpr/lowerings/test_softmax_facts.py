"""softmax's two facts: exp(x - max) is `exp_nonpos` (its argument is <= 0 or NaN, so
LLVM leaves out exp's upper clamp), and the row max is `MaxOrdered` (a NaN is passed over:
it makes every output of its row NaN through its exp anyway; logsumexp's too). Against the
lowering without them (exp, Max) bit for bit, and eager, over extremal rows, dtypes,
layouts and backends."""

from __future__ import annotations

import math
import struct
from dataclasses import replace

import numpy as np
import pytest
import torch

from nncfuse.config import Options
from nncfuse.tensorexpr import expr as E
from nncfuse.tensorexpr import ops
from nncfuse.tensorexpr import stmt as S
from nncfuse.tensorexpr.codegen import llvm_codegen, vecmath
from nncfuse.tensorexpr.codegen.llvm_jit import vector_bits
from nncfuse.tensorexpr.dtype import Dtype
from nncfuse.tensorexpr.ir_eval import IREvaluator
from nncfuse.tensorexpr.ir_visitor import walk
from nncfuse.tensorexpr.kernel import TensorExprKernel
from nncfuse.tensorexpr.lowerings import reductions
from tests.conftest import slow_sample
from tests.fused import assert_exact
from tests.tensorexpr.helpers import buf
from tests.tensorexpr.test_dynamic import graph_of

nan, inf = math.nan, math.inf
FLOATS = [torch.float32, torch.float64, torch.float16, torch.bfloat16]

FNS = {
    "softmax": lambda x: torch.softmax(x, -1),
    "log_softmax": lambda x: torch.log_softmax(x, -1),
    "softmax_dim0": lambda x: torch.softmax(x, 0),
    "log_softmax_t": lambda x: torch.log_softmax(x.t(), -1),  # rows of stride > 1
    "softmax_producer": lambda x: torch.softmax(x * 0.5 - 1, -1),  # inlined into each loop
    "softmax_dtype": lambda x: torch.softmax(x, -1, dtype=torch.float64),
    "log_softmax_dtype": lambda x: torch.log_softmax(x, -1, dtype=torch.float32),
}


def extremal_rows(width, dtype):
    """Random rows and rows of NaN (first, last, all), infinities, -0.0, huge and tiny."""
    x = torch.randn(14, width, dtype=torch.float64) * 3
    x[0, 0] = nan
    x[1, -1] = nan  # in a vector loop's tail
    x[2, width // 2] = inf
    x[3] = -inf
    x[4] = -0.0
    x[5, ::2] = -0.0
    x[5, 1::2] = 0.0
    x[6, ::3] = -inf  # masked out
    x[7] = nan
    x[8, ::2], x[8, 1::2] = 3e38, -3e38  # x - max overflows to -inf
    x[9] = inf
    x[10] = -torch.rand(width, dtype=torch.float64) * 120  # exps from 1 down to denormals
    x[10, 0] = 0.0
    x[11, 0], x[11, -1] = inf, -inf
    x[12, ::2] = nan
    x[13] *= 1e30  # x - max finite, far below exp's range
    return x.to(dtype)


def kernels(fn, x, dynamic=False):
    graph = graph_of(fn, x)
    return [TensorExprKernel(graph, Options.from_env(use_llvm=llvm), dynamic=dynamic)
            for llvm in (True, False)]


def lower_as_before(patch):
    """softmax lowers as it did without the facts: exp, and the NaN-propagating Max."""
    row_max = reductions._row_max

    def nan_max(ctx, box, value, compute, op="Max", name=None):
        return row_max(ctx, box, value, compute, "Max" if op == "MaxOrdered" else op, name)

    patch.setattr(reductions, "_exp_shifted", lambda shifted: E.call("exp", shifted))
    patch.setattr(reductions, "_row_max", nan_max)


def names(stmt):
    return {n.name for n in walk(stmt) if isinstance(n, E.Call)} | {
        n.op for n in walk(stmt) if isinstance(n, E.Reduce)}


def check_against_before(fn, x, monkeypatch, dynamic=False, exp="exp_nonpos"):
    new = kernels(fn, x, dynamic)
    assert exp in names(new[0].stmt) and "Max" not in names(new[0].stmt)
    with monkeypatch.context() as patch:
        lower_as_before(patch)
        old = kernels(fn, x, dynamic)
    assert "exp" in names(old[0].stmt) and "MaxOrdered" not in names(old[0].stmt)
    want = fn(x)
    for k_new, k_old in zip(new, old):
        got = k_new.run([x])
        assert_exact(got, k_old.run([x]))
        # NaN where eager's is (a row with a NaN is all NaN: eager's max is NaN there).
        torch.testing.assert_close(got, want, equal_nan=True, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", FNS)
@pytest.mark.parametrize("width", [1, 7, 100, 1000])
def test_softmax_facts_keep_results_float32(name, width, monkeypatch):
    check_against_before(FNS[name], extremal_rows(width, torch.float32), monkeypatch)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("name", ["softmax", "log_softmax", "softmax_dtype", "log_softmax_t"])
def test_softmax_facts_keep_results_other_dtypes(name, dtype, monkeypatch):
    check_against_before(FNS[name], extremal_rows(100, dtype), monkeypatch)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("width", [1, 7, 100, 1000])
def test_logsumexp_max_passes_over_nans(width, dtype, monkeypatch):
    """logsumexp's row max is a MaxOrdered too; its exp stays exp (a row with +inf shifts
    by 0, not by its max)."""
    check_against_before(lambda x: torch.logsumexp(x, -1), extremal_rows(width, dtype),
                         monkeypatch, exp="exp")


@pytest.mark.slow
def test_softmax_facts_sweep(monkeypatch):
    cases = [(n, w, d) for n in FNS for w in (16, 33, 512, 600, 4100) for d in FLOATS]
    for k in np.random.default_rng(0).permutation(len(cases))[:slow_sample(len(cases))]:
        name, width, dtype = cases[k]
        check_against_before(FNS[name], extremal_rows(width, dtype), monkeypatch)


@pytest.mark.parametrize("name", ["softmax", "log_softmax", "softmax_producer"])
def test_softmax_facts_in_dynamic_kernels(name, monkeypatch):
    monkeypatch.setattr(reductions, "SYMBOLIC_EXTENTS", True)
    check_against_before(FNS[name], extremal_rows(37, torch.float32), monkeypatch,
                         dynamic=True)


def test_exp_arguments_are_never_positive(monkeypatch):
    """The promise `exp_nonpos` makes, checked where the interpreter evaluates it."""
    seen = []

    def checked(x):
        x = np.asarray(x)
        seen.append(x.size)
        assert not (x > 0).any(), x
        return np.exp(x)

    monkeypatch.setitem(ops.CALLS, "exp_nonpos", replace(ops.CALLS["exp_nonpos"],
                                                         interp=checked))
    for fn in FNS.values():
        for width in (1, 7, 100):
            for dtype in FLOATS:
                x = extremal_rows(width, dtype)
                (_, interp) = kernels(fn, x)
                torch.testing.assert_close(interp.run([x]), fn(x), equal_nan=True,
                                           atol=1e-5, rtol=1e-5)
    assert sum(seen) > 0


def _float_bits(value):
    """How LLVM prints float32 `value` where it is not a short decimal (88.8)."""
    return f"0x{struct.unpack('<Q', struct.pack('<d', np.float32(value)))[0]:016x}"


@pytest.mark.skipif(not (vecmath.vector_math() and vector_bits() >= 512),
                    reason="the inline exp and vmaxps: AVX-512 hosts")
def test_softmax_exp_has_no_upper_clamp():
    """exp's clamp at 88.8 is in exp's code, not in softmax's (whose max holds no NaN
    select either: `fcmp uno` is the NaN test of the NaN-propagating max)."""
    x = torch.randn(64, 128)
    clamp = _float_bits(88.8)
    exp_ir = kernels(lambda x: torch.exp(x) + 1, x)[0].get_code_text("ir")
    assert clamp in exp_ir.lower()
    for fn in (FNS["softmax"], FNS["log_softmax"]):
        ir = kernels(fn, x)[0].get_code_text("ir")
        assert clamp not in ir.lower() and "float -1.040000e+02" in ir
        assert "fcmp uno" not in ir
        assert {"exp_nonpos", "MaxOrdered"} <= names(kernels(fn, x)[1].stmt)
    assert "fcmp uno" in kernels(lambda x: x.amax(-1), x)[0].get_code_text("ir")


def _lanes_kernel(make, dtype, lanes, n):
    a, b, o = buf("a", [n], dtype), buf("b", [n], dtype), buf("o", [n], dtype)
    i = E.Var("i")
    index = E.Ramp(i * lanes, E.imm(1), lanes) if lanes > 1 else i
    body = S.Store(o, (index,), make(E.Load(a, (index,)), E.Load(b, (index,))))
    return S.For(i, E.imm(0), E.imm(n // lanes), body), [a, b, o]


def _run_llvm(stmt, params, tensors):
    jit = llvm_codegen.compile_stmt(stmt, params)  # keep it: it owns the machine code
    jit.cfunc(*(t.data_ptr() for t in tensors))
    return tensors[-1]


NONPOSITIVE = [0.0, -0.0, -1e-45, -1e-8, -0.5, -1.0, -10.0, -87.3, -87.4, -88.0, -100.0,
               -103.9, -104.0, -104.5, -150.0, -1e30, -inf, nan]


@pytest.mark.parametrize("lanes", [1, 8, 16, 32])
@pytest.mark.parametrize("dtype", FLOATS)
def test_exp_nonpos_is_exp_for_arguments_up_to_zero(dtype, lanes):
    n = 256
    x = torch.cat([torch.tensor(NONPOSITIVE, dtype=torch.float64),
                   -torch.rand(n - len(NONPOSITIVE), dtype=torch.float64) * 110]).to(dtype)
    out = {}
    for name in ("exp", "exp_nonpos"):
        stmt, params = _lanes_kernel(lambda a, b, f=name: E.call(f, a),
                                     Dtype(str(dtype).removeprefix("torch."), 1), lanes, n)
        out[name] = _run_llvm(stmt, params, [x, x, torch.zeros_like(x)]).clone()
        interp = torch.zeros_like(x)
        IREvaluator(stmt, params).run([x, x, interp])
        torch.testing.assert_close(out[name], interp, equal_nan=True)
    assert_exact(out["exp_nonpos"], out["exp"])


@pytest.mark.parametrize("lanes", [1, 8, 16, 32])
def test_max_ordered_passes_over_a_nan_second_operand(lanes):
    """`b if a < b else a`: LLVM (vmaxps at 16 lanes with AVX-512) as the interpreter,
    the sign of equal zeros included."""
    vals = torch.tensor([nan, inf, -inf, 0.0, -0.0, 1.0, -1.0, 1e-45])
    a, b = vals.repeat_interleave(8).repeat(4), vals.repeat(32)  # every pair
    stmt, params = _lanes_kernel(E.MaxOrdered, Dtype("float32", 1), lanes, 256)
    got = _run_llvm(stmt, params, [a, b, torch.zeros(256)])
    interp = torch.zeros(256)
    IREvaluator(stmt, params).run([a, b, interp])
    assert_exact(got, interp)
    want = torch.where(a < b, b, a)
    assert_exact(got, want)
    assert torch.equal(got.isnan(), a.isnan())
