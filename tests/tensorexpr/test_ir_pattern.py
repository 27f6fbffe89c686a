"""Rewrite patterns (`ir_pattern`) and the simplifier's rules written with them."""

from nncfuse.tensorexpr import expr as E
from nncfuse.tensorexpr.dtype import BOOL, FLOAT32, FLOAT64, INT8, INT32
from nncfuse.tensorexpr.ir_pattern import Const, Node, Rules, Wild, max_, rule
from nncfuse.tensorexpr.passes.simplify import simplify

x, y = Wild("x"), Wild("y")


def test_numbers_match_immediates_and_broadcasts_with_the_sign_of_zero():
    f = E.Var("f", FLOAT32)
    rules = Rules([rule(x + 0, x)])
    assert rules.rewrite(f + 0.0) is f
    assert rules.rewrite(E.Add(f, E.imm(-0.0, FLOAT32))) is None
    v = E.Broadcast(f, 4)
    assert rules.rewrite(v + 0.0) is v  # sugar broadcasts the number
    b = E.Var("b", BOOL)
    assert rules.rewrite(E.Add(b, E.imm(False, BOOL))) is None  # a bool is not the number 0


def test_a_name_bound_twice_needs_equal_expressions():
    i, j = E.Var("i"), E.Var("j")
    rules = Rules([rule(max_(x, x), x)])
    assert rules.rewrite(E.Max(i + 1, i + 1)) == i + 1
    assert rules.rewrite(E.Max(i, j)) is None


def test_conditions_and_function_replacements_see_the_node_and_bindings():
    c = Const("c")
    rules = Rules([
        rule(Node(E.Mul, x, c), lambda e, x, c: E.Add(x, x), when=lambda e, x, c: c.value == 2),
    ])
    i = E.Var("i")
    assert rules.rewrite(i * 2) == i + i
    assert rules.rewrite(i * 3) is None
    assert rules.rewrite(i + 2) is None  # no rule for Add: never tried


def test_simplifier_rules_keep_float_semantics():
    f = E.Var("f", FLOAT32)
    k = E.Var("k", INT32)
    assert str(simplify(0.0 + f)) == "0.f + f"  # -0. would become +0.
    assert simplify(0 + k) is k
    assert simplify(f - 0.0) is f
    assert str(simplify(f - (-0.0))) == "f - -0.f"
    assert simplify(f / 1.0) is f
    assert simplify(1.0 * f) is f
    assert simplify(E.Xor(k, E.imm(0, INT32))) is k
    b = E.Var("b", BOOL)
    same = E.Or(b, E.imm(False, BOOL))
    assert simplify(same) is same  # unchanged: the very same object
    assert simplify(E.Min(f, f)) is f


def test_simplifier_folds_casts_selects_and_round_trips():
    k = E.Var("k", INT8)
    assert simplify(E.Cast(INT8, E.Cast(INT32, k))) is k  # int8 -> int32 -> int8
    narrowing = E.Cast(INT32, E.Cast(INT8, E.Var("w", INT32)))
    assert simplify(narrowing) is narrowing
    f = E.Var("f", FLOAT32)
    assert simplify(E.Cast(FLOAT32, E.Cast(FLOAT64, f))) is f
    assert str(simplify(E.Cast(INT32, E.imm(-2.5, FLOAT32)))) == "int(-2)"
    g = E.Var("g", FLOAT32)
    assert simplify(E.select(E.imm(True, BOOL), f, g)) is f
    assert simplify(E.select(E.cmp("<", E.imm(3), E.imm(2)), f, g)) is g
    assert str(simplify(E.call("sin", E.imm(0.0, FLOAT32)))) == "sin(0.f)"  # calls never fold
