"""Visitor and Mutator dispatch: by class name, else the nearest base class, else children."""

from nncfuse.tensorexpr import expr as E
from nncfuse.tensorexpr import stmt as S
from nncfuse.tensorexpr.dtype import INT32
from nncfuse.tensorexpr.ir_visitor import Mutator, Visitor, method_for
from tests.tensorexpr.helpers import buf


class _Kinds(Visitor):
    def __init__(self):
        self.seen = []

    def visit_BinaryOp(self, e):
        self.seen.append(("binary", type(e).__name__))
        self.generic_visit(e)

    def visit_Mul(self, e):
        self.seen.append(("mul", "Mul"))
        self.generic_visit(e)

    def visit_Var(self, e):
        self.seen.append(("var", e.name))


def test_visit_calls_the_nearest_class_method_and_recurses_by_default():
    i, j = E.Var("i"), E.Var("j")
    store = S.Store(buf("o", [8]), (i,), E.cast(buf("o", [8]).dtype, (i + j) * i))
    v = _Kinds()
    v.visit(S.For(i, E.imm(0), E.imm(8), S.Block((S.Let(j, i), store))))
    # For's var, Let's var and value, the Store's index, then its value: (i + j) * i
    assert v.seen == [("var", "i"), ("var", "j"), ("var", "i"), ("var", "i"), ("mul", "Mul"),
                      ("binary", "Add"), ("var", "i"), ("var", "j"), ("var", "i")]
    assert method_for(_Kinds, "visit_", E.Add) is _Kinds.visit_BinaryOp
    assert method_for(_Kinds, "visit_", E.Cast) is None


class _Negate(Mutator):
    def mutate_Imm(self, e):
        return E.imm(-e.value, e.dtype) if e.dtype == INT32 else e


def test_mutator_rebuilds_only_what_changed():
    k = E.Var("k", INT32)
    index = E.Var("i") * 2
    tree = E.Add(k, E.imm(3, INT32))
    assert _Negate().mutate(index) is index  # int64 immediates stay: the very same object
    new = _Negate().mutate(tree)
    assert str(new) == "k + int(-3)" and new.a is k
