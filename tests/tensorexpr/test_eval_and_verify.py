"""The interpreter's pinned-down semantics, and the verifier's rules."""

import math

import numpy as np
import pytest
import torch

from nncfuse.tensorexpr import expr as E
from nncfuse.tensorexpr import stmt as S
from nncfuse.tensorexpr.dtype import BFLOAT16, BOOL, FLOAT32, INT8, INT32, UINT8
from nncfuse.tensorexpr.ir_eval import cast_value, evaluate
from nncfuse.tensorexpr.ir_verifier import IRError, verify
from tests.tensorexpr.helpers import buf, run, var


def ev(e):
    return evaluate(e).item()


def test_integer_division_truncates_and_wraps():
    assert ev(E.imm(-7, INT32) / E.imm(2, INT32)) == -3
    assert ev(E.imm(7, INT32) / E.imm(-2, INT32)) == -3
    assert ev(E.imm(-7, INT32) % E.imm(3, INT32)) == -1
    assert ev(E.imm(2**31 - 1, INT32) + E.imm(1, INT32)) == -(2**31)


def test_max_min_propagate_nan_and_keep_first_on_ties():
    nan, one = E.imm(math.nan, FLOAT32), E.imm(1.0, FLOAT32)
    assert math.isnan(ev(E.Max(one, nan))) and math.isnan(ev(E.Max(nan, one)))
    assert math.isnan(ev(E.Min(one, nan))) and math.isnan(ev(E.Min(nan, one)))
    neg0, pos0 = E.imm(-0.0, FLOAT32), E.imm(0.0, FLOAT32)
    assert math.copysign(1, ev(E.Max(neg0, pos0))) == -1  # as torch.maximum(-0., 0.)
    assert math.copysign(1, ev(E.Min(pos0, neg0))) == 1


def test_float_to_int_conversion_is_defined():
    values = np.array([1e10, -1e10, np.nan, np.inf, -2.7, 300.0], dtype=np.float32)
    assert cast_value(values, FLOAT32, INT32).tolist() == [-(2**31)] * 4 + [-2, 300]
    assert cast_value(values, FLOAT32, UINT8).tolist() == [0, 0, 0, 0, 254, 44]
    assert cast_value(values, FLOAT32, INT8).tolist()[-2:] == [-2, 44]
    assert cast_value(np.float32(np.nan), FLOAT32, BOOL)


def test_bfloat16_rounds_to_nearest_even():
    values = torch.tensor([1.0 + 2**-8, 1.0 + 3 * 2**-8, 3.14159, -1e-3, float("nan")])
    got = cast_value(values.numpy(), FLOAT32, BFLOAT16)
    want = values.to(torch.bfloat16).float().numpy()
    np.testing.assert_array_equal(got, want)


def test_loads_and_stores_follow_strides():
    a = buf("a", [3, 2], strides=[1, 3])
    out = buf("out", [3, 2])
    i, j = var("i"), var("j")
    nest = S.For(
        i, E.imm(0), E.imm(3), S.For(j, E.imm(0), E.imm(2), S.Store(out, (i, j), E.Load(a, (i, j))))
    )
    src = torch.arange(6.0).reshape(2, 3).t()
    (_, res) = run(nest, [a, out], [src, torch.zeros(3, 2)])
    torch.testing.assert_close(res, src)


def test_verifier_catches_scope_and_allocation_errors():
    i, v = var("i"), E.Var("v", FLOAT32)
    out, tmp = buf("out", [4]), buf("tmp", [4])
    with pytest.raises(IRError, match="out of scope"):
        verify(S.Store(out, (i,), v), outputs=[out])
    with pytest.raises(IRError, match="not allocated"):
        verify(S.For(i, E.imm(0), E.imm(4), S.Store(tmp, (i,), E.imm(0.0, FLOAT32))))
    with pytest.raises(IRError, match="input buffer"):
        verify(S.For(i, E.imm(0), E.imm(4), S.Store(out, (i,), E.imm(0.0, FLOAT32))), inputs=[out])
    with pytest.raises(IRError, match="bound twice"):
        verify(S.Block((S.Let(v, E.imm(1.0, FLOAT32)), S.Let(v, E.imm(2.0, FLOAT32)))))
    with pytest.raises(IRError, match="never freed"):
        verify(S.Allocate(tmp))
    verify(S.Block((S.Allocate(tmp), S.Free(tmp))))


def test_verifier_before_allocation_takes_temporaries_as_live():
    i = var("i")
    out, tmp = buf("out", [4]), buf("tmp", [4])
    nest = S.Block((
        S.For(i, E.imm(0), E.imm(4), S.Store(tmp, (i,), E.imm(1.0, FLOAT32))),
        S.For(i, E.imm(0), E.imm(4), S.Store(out, (i,), E.Load(tmp, (i,)))),
    ))
    with pytest.raises(IRError, match="bound twice"):
        verify(nest, outputs=[out], allocated=False)  # the other rules still hold
    j = var("j")
    copy = S.For(j, E.imm(0), E.imm(4), S.Store(out, (j,), E.Load(tmp, (j,))))
    nest = S.Block((nest.stmts[0], copy))
    verify(nest, outputs=[out], allocated=False)
    with pytest.raises(IRError, match="not allocated"):
        verify(nest, outputs=[out])
