"""The op table: every row is a node, every LLVM name one that codegen emits, and the
printer, interpreter and LLVM all follow the row."""

import math

import numpy as np
import pytest
import torch

from nncfuse.tensorexpr import expr as E
from nncfuse.tensorexpr import ops
from nncfuse.tensorexpr import stmt as S
from nncfuse.tensorexpr.codegen import llvm_codegen
from nncfuse.tensorexpr.dtype import BOOL, FLOAT32, INT32, UINT8
from nncfuse.tensorexpr.ir_eval import IREvaluator
from tests.tensorexpr.helpers import buf

ROWS = [*ops.BINARY.values(), *ops.CMP.values(), *ops.CALLS.values()]


def _subclasses(cls):
    for sub in cls.__subclasses__():
        yield sub
        yield from _subclasses(sub)


def test_every_binary_node_is_a_row_and_every_row_a_node():
    assert {c.__name__ for c in _subclasses(E.BinaryOp)} == set(ops.BINARY)
    assert all(c.row is ops.BINARY[c.__name__] for c in _subclasses(E.BinaryOp))


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.name)
def test_codegen_knows_every_llvm_name(row):
    emit = row.llvm
    names = [n for n in (emit.float, emit.signed, emit.unsigned) if n is not None]
    assert names, f"{row.name} has no LLVM emission"
    if row.name in ops.CMP:
        assert emit.float in llvm_codegen.FCMP
        assert {emit.signed, emit.unsigned} <= llvm_codegen.ICMP
        return
    for name in names:
        assert name in llvm_codegen.INSTRUCTIONS or name in llvm_codegen.EMITTERS, name


def _operands(dtype):
    if dtype.is_float:
        return [0.0, -0.0, 1.5, -2.5, math.nan, math.inf, 7.0, -3.0]
    if dtype.is_bool:
        return [True, False, True, True, False, False, True, False]
    if dtype.is_signed:
        return [0, -1, 5, -7, 2**31 - 1, -(2**31), 3, 1]
    return [0, 255, 5, 7, 128, 1, 3, 2]


def _kernel(make, dtype, out_dtype, lanes):
    n = 8
    a, b, o = buf("a", [n], dtype), buf("b", [n], dtype), buf("o", [n], out_dtype)
    i = E.Var("i")
    index = E.Ramp(E.imm(0), E.imm(1), lanes) if lanes > 1 else i
    value = make(E.Load(a, (index,)), E.Load(b, (index,)))
    body = S.Store(o, (index,), value)
    stmt = body if lanes > 1 else S.For(i, E.imm(0), E.imm(n), body)
    return stmt, [a, b, o]


def _pairs(dtype):
    x = _operands(dtype)
    return x, x[1:] + x[:1]


def _row_cases():
    """Every row with every dtype it takes; integer Div and Mod are left to the arithmetic
    tests, which keep zero divisors out."""
    for row in [*ops.BINARY.values(), *ops.CMP.values()]:
        for dtype in (FLOAT32, INT32, UINT8, BOOL):
            if row.llvm.pick(dtype) is None or not row.accepts(dtype):
                continue
            if row.name in ("Div", "Mod") and not dtype.is_float:
                continue
            yield pytest.param(row, dtype, id=f"{row.name}-{dtype}")


@pytest.mark.parametrize("lanes", [1, 8])
@pytest.mark.parametrize(("row", "dtype"), list(_row_cases()))
def test_llvm_and_interpreter_follow_the_row(row, dtype, lanes):
    cls = getattr(E, row.name, None)
    if row.name in ops.BINARY:
        make = lambda a, b: cls(a, b)  # noqa: E731
    else:
        make = lambda a, b: E.Cmp(row.name, a, b)  # noqa: E731
    out = BOOL if row.name in ops.CMP else dtype
    stmt, params = _kernel(make, dtype, out, lanes)
    x, y = _pairs(dtype)
    if row.name in ("Shl", "Shr"):
        y = [v % dtype.bits for v in y]  # shifts are defined for [0, bits)
    tensors = [torch.tensor(x, dtype=dtype.torch), torch.tensor(y, dtype=dtype.torch),
               torch.zeros(8, dtype=out.torch)]
    cg = llvm_codegen.LLVMCodeGen(stmt, params)
    name = row.llvm.pick(dtype)
    if name in llvm_codegen.INSTRUCTIONS or name in llvm_codegen.FCMP | llvm_codegen.ICMP:
        assert f" {name} " in cg.ir_text()
    jit = llvm_codegen.compile_stmt(stmt, params)  # keep it: it owns the machine code
    jit.cfunc(*(t.data_ptr() for t in tensors))
    interp = [t.clone() for t in tensors[:2]] + [torch.zeros(8, dtype=out.torch)]
    IREvaluator(stmt, params).run(interp)
    torch.testing.assert_close(tensors[2], interp[2], rtol=0, atol=0, equal_nan=True)
    with np.errstate(all="ignore"):
        fn_np = row.interp if dtype.is_float else (row.interp_int or row.interp)
        want = fn_np(np.array(x, dtype=dtype.name), np.array(y, dtype=dtype.name))
    assert np.array_equal(interp[2].numpy(), want, equal_nan=dtype.is_float and out == dtype)


def test_printer_spells_rows():
    a, b = E.Var("a", INT32), E.Var("b", INT32)
    assert str(E.Add(a, E.Mul(a, b))) == "a + a * b"
    assert str(E.Mul(E.Add(a, b), b)) == "(a + b) * b"
    assert str(E.Sub(a, E.Sub(a, b))) == "a - (a - b)"
    assert str(E.Max(a, E.Shl(a, b))) == "max(a, a << b)"
    assert str(E.Or(E.cmp("<", a, b), E.cmp("==", a, b))) == "a < b | a == b"
    assert str(E.call("powi", a, b)) == "powi(a, b)"


def test_calls_check_their_rows_typing_rule():
    x, k = E.Var("x", FLOAT32), E.Var("k", INT32)
    with pytest.raises(TypeError):
        E.call("sin", k)
    with pytest.raises(TypeError):
        E.call("powi", x, x)
    with pytest.raises(TypeError):
        E.call("atan2", x)
    assert E.call("abs", k).dtype == INT32
    assert not any(row.fold for row in ops.CALLS.values())
