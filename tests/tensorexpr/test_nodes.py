"""Constructor invariants of the IR nodes and the printer's text."""

import pytest

from nncfuse.tensorexpr import expr as E
from nncfuse.tensorexpr import stmt as S
from nncfuse.tensorexpr.dtype import BOOL, FLOAT16, FLOAT32, FLOAT64, INT8, INT32, INT64, Dtype
from tests.tensorexpr.helpers import assert_expected_inline, buf, text, var


def test_binary_operands_must_agree():
    with pytest.raises(TypeError):
        E.Add(E.imm(1.0, FLOAT32), E.imm(1.0, FLOAT64))
    assert E.Add(E.imm(1, INT32), E.imm(2, INT32)).dtype == INT32


def test_immediates_check_their_range_and_kind():
    with pytest.raises(TypeError):
        E.Imm(INT8, 300)
    with pytest.raises(TypeError):
        E.Imm(FLOAT32, 1)  # an int is not a float immediate
    assert E.Imm.make(300, INT8).value == 44  # wraps like a C conversion
    assert E.Imm.make(0.1, FLOAT32).value != 0.1  # rounded to float32
    assert E.Imm.make(1e10, FLOAT16).value == float("inf")


def test_indices_must_be_int64_and_agree_with_rank():
    a = buf("a", [4, 4])
    with pytest.raises(TypeError):
        E.Load(a, (E.imm(0),))
    with pytest.raises(TypeError):
        E.Load(a, (E.imm(0, INT32), E.imm(0, INT32)))
    with pytest.raises(TypeError):
        S.Store(a, (E.imm(0), E.imm(0)), E.imm(1.0, FLOAT64))


def test_vectors_have_consistent_lanes():
    r = E.Ramp(var(), E.imm(1), 8)
    assert r.dtype == Dtype("int64", 8)
    a = buf("a", [64])
    assert E.Load(a, (r,)).dtype == Dtype("float32", 8)
    with pytest.raises(TypeError):
        E.Select(E.cmp("<", r, E.Broadcast(E.imm(3), 8)), E.imm(1.0, FLOAT32), E.imm(2.0, FLOAT32))
    with pytest.raises(TypeError):
        E.Cast(FLOAT32, r)  # a cast keeps the lane count


def test_vars_compare_by_identity_and_trees_structurally():
    i, j = E.Var("i"), E.Var("i")
    assert i != j
    assert E.Add(i, E.imm(1)) == E.Add(i, E.imm(1))
    assert E.Add(i, E.imm(1)) != E.Add(j, E.imm(1))


def test_intrinsics_need_float_arguments():
    with pytest.raises(TypeError):
        E.call("sin", E.imm(1))
    assert E.call("abs", E.imm(-1)).dtype == INT64
    with pytest.raises(TypeError):
        E.call("pow", E.imm(1.0, FLOAT32))


def test_negation_is_exact_for_signed_zero():
    x = E.Var("x", FLOAT32)
    assert text(-x) == "-0.f - x"


def test_printer_golden_loop_nest():
    a, out = buf("a", [4, 8]), buf("out", [4, 8])
    i, j, v = var("i"), var("j"), E.Var("v", FLOAT32)
    body = S.Block(
        (
            S.Let(v, E.call("sin", E.Load(a, (i, j)))),
            S.Store(out, (i, j), v * v + 0.5),
        )
    )
    nest = S.Block((S.For(i, E.imm(0), E.imm(4), S.For(j, E.imm(0), E.imm(8), body)),))
    assert_expected_inline(text(nest), """\
{
  for (int64_t i = 0; i < 4; i++) {
    for (int64_t j = 0; j < 8; j++) {
      float v = sin(a[i, j]);
      out[i, j] = v * v + 0.5f;
    }
  }
}""")


def test_printer_precedence_and_names():
    i, i2 = E.Var("i"), E.Var("i")
    assert text((i - (i2 - 1)) * 2) == "(i - (i_1 - 1)) * 2"
    assert text(E.select(E.cmp("<", i, 3), i, i2)) == "i < 3 ? i : i_1"
    assert text(E.Max(E.imm(1.5, FLOAT64), E.imm(-0.0, FLOAT64))) == "max(1.5, -0.)"
    assert text(E.Cast(INT8, E.imm(2.5, FLOAT32))) == "int8_t(2.5f)"
    assert text(E.imm(float("nan"), FLOAT32)) == "NAN"
    assert text(E.imm(True, BOOL)) == "true"
    a = buf("a", [64])
    assert text(E.Load(a, (E.Ramp(i * 16, E.imm(1), 16),))) == "a[Ramp(i * 16, 1, 16)]"


def test_printer_allocate_free_parallel():
    t = buf("tmp", [16])
    i = var()
    s = S.Block(
        (
            S.Allocate(t),
            S.For(i, E.imm(0), E.imm(16), S.Store(t, (i,), E.imm(0.0, FLOAT32)), parallel=True),
            S.Free(t),
        )
    )
    assert_expected_inline(text(s), """\
{
  Allocate(tmp, float, {16});
  for (int64_t i = 0; i < 16; i++) /* parallel */ {
    tmp[i] = 0.f;
  }
  Free(tmp);
}""")
