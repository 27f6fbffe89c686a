"""Reduce and LaneReduce at the IR level: printer, verifier, interpreter, LLVM, numpy agree."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from nncfuse.tensorexpr import expr as E
from nncfuse.tensorexpr import stmt as S
from nncfuse.tensorexpr.codegen.llvm_codegen import compile_stmt
from nncfuse.tensorexpr.dtype import BFLOAT16, BOOL, FLOAT32, FLOAT64, INT32, INT64
from nncfuse.tensorexpr.ir_verifier import IRError, verify
from nncfuse.tensorexpr.ir_visitor import Mutator, children
from nncfuse.tensorexpr.passes.flatten_indices import flatten_indices
from nncfuse.tensorexpr.passes.simplify import simplify

from .helpers import buf, run, text, var

DTYPES = {FLOAT32: torch.float32, FLOAT64: torch.float64, INT32: torch.int32,
          INT64: torch.int64, BOOL: torch.bool, BFLOAT16: torch.bfloat16}


def row_reduce(op: str, dtype=FLOAT32, rows: int = 3, cols: int = 37, init=None):
    """out[i] = reduce(op) over j of a[i, j], flattened for codegen."""
    a, out = buf("a", [rows, cols], dtype), buf("out", [rows], dtype)
    i, r = var("i"), var("r")
    value = E.reduce(op, E.Load(a, (i, r)), [(r, cols)], init)
    stmt = S.For(i, E.imm(0), E.imm(rows), S.Store(out, (i,), value))
    return simplify(flatten_indices(stmt)), [a, out]


def both(stmt, params, args):
    """Interpreter and LLVM outputs for the same inputs."""
    interp = run(stmt, params, [t.clone() for t in args])
    fn = compile_stmt(stmt, params, "reduce_test")
    compiled = [t.clone() for t in args]
    fn.cfunc(*(t.data_ptr() for t in compiled))
    return interp, compiled


def test_prints_and_walks():
    a = buf("a", [4, 8])
    i, r = var("i"), var("r")
    e = E.reduce("Add", E.Load(a, (i, r)), [(r, 8)], 0.0)
    assert text(e) == "reduce_add(0.f, a[i, r] for r < 8)"
    assert list(children(e))[:2] == [e.init, e.body]
    assert Mutator().mutate(e) is e
    lane = E.LaneReduce("Max", E.Broadcast(E.Load(a, (i, r)), 4))
    assert text(lane) == "lanes_max(Broadcast(a[i, r], 4))"
    assert lane.dtype == FLOAT32


def test_rejects_bad_nodes():
    a = buf("a", [4])
    r = var("r")
    with pytest.raises(ValueError):
        E.reduce("Sub", E.Load(a, (r,)), [(r, 4)])
    with pytest.raises(TypeError):
        E.Reduce("Add", E.imm(0, INT64), E.Load(a, (r,)), (r,), (E.imm(4),))
    with pytest.raises(TypeError):
        E.LaneReduce("Add", E.Broadcast(E.Load(a, (r,)), 3))


def test_verifier_scopes_the_variables():
    a, out = buf("a", [8]), buf("out", [1])
    r = var("r")
    value = E.reduce("Add", E.Load(a, (r,)), [(r, 8)])
    verify(S.Store(out, (E.imm(0),), value), inputs=[a], outputs=[out])
    leak = S.Store(out, (E.imm(0),), value + E.cast(FLOAT32, r))
    with pytest.raises(IRError):
        verify(leak, inputs=[a], outputs=[out])


@pytest.mark.parametrize("op", ["Add", "Mul", "Max", "Min"])
@pytest.mark.parametrize("dtype", [FLOAT32, FLOAT64, INT32, BFLOAT16])
def test_row_reduce_matches_numpy(op, dtype):
    stmt, params = row_reduce(op, dtype)
    torch.manual_seed(0)
    if dtype.is_float:
        x = (torch.rand(3, 37, dtype=torch.float64) + 0.5).to(DTYPES[dtype])
    else:
        x = torch.randint(-5, 6, (3, 37), dtype=DTYPES[dtype])
    out = torch.zeros(3, dtype=DTYPES[dtype])
    (_, interp), (_, compiled) = both(stmt, params, [x, out])
    torch.testing.assert_close(interp, compiled, rtol=0, atol=0)
    if dtype != BFLOAT16:
        fn = {"Add": np.add, "Mul": np.multiply, "Max": np.maximum, "Min": np.minimum}[op]
        want = torch.from_numpy(fn.reduce(x.numpy(), axis=1))
        torch.testing.assert_close(interp, want.to(interp.dtype))


@pytest.mark.parametrize("op", ["Max", "Min"])
def test_nan_propagates(op):
    stmt, params = row_reduce(op)
    x = torch.rand(3, 37)
    x[0, 5] = float("nan")
    x[2, 0] = float("nan")
    out = torch.zeros(3)
    (_, interp), (_, compiled) = both(stmt, params, [x, out])
    want = x.amax(1) if op == "Max" else x.amin(1)
    torch.testing.assert_close(interp, want, equal_nan=True)
    torch.testing.assert_close(compiled, want, equal_nan=True)


@pytest.mark.parametrize("op", ["And", "Or"])
def test_bool_reduce(op):
    stmt, params = row_reduce(op, BOOL, init=op == "And")
    x = torch.rand(3, 37) < 0.9
    x[1] = True
    out = torch.zeros(3, dtype=torch.bool)
    (_, interp), (_, compiled) = both(stmt, params, [x, out])
    want = x.all(1) if op == "And" else x.any(1)
    assert torch.equal(interp, want) and torch.equal(compiled, want)


def test_multi_axis_and_vector_lanes():
    """A column reduction over two axes, 4 lanes at a time, then the lanes combined."""
    a, out = buf("a", [5, 3, 8]), buf("out", [2])
    r, k = var("r"), var("k")
    ramp = E.Ramp(E.imm(0), E.imm(1), 8)
    body = E.Load(a.flat(), (E.Broadcast(r * 24 + k * 8, 8) + ramp,))
    cols = E.reduce("Add", body, [(r, 5), (k, 3)])
    total = E.LaneReduce("Add", cols)
    top = E.LaneReduce("Max", cols)
    stmt = S.Block((S.Store(out.flat(), (E.imm(0),), total),
                    S.Store(out.flat(), (E.imm(1),), top)))
    x = torch.rand(5, 3, 8)
    (_, interp), (_, compiled) = both(stmt, [a, out], [x, torch.zeros(2)])
    torch.testing.assert_close(interp, compiled, rtol=0, atol=0)
    want = torch.stack([x.sum(), x.sum((0, 1)).max()])
    torch.testing.assert_close(interp, want)


def test_simplify_drops_unit_and_empty_axes():
    a = buf("a", [4, 1])
    r, k = var("r"), var("k")
    e = E.reduce("Add", E.Load(a, (r, k)), [(r, 4), (k, 1)], 0.0)
    assert text(simplify(e)) == "reduce_add(0.f, a[r, 0] for r < 4)"
    empty = E.reduce("Max", E.Load(a, (r, k)), [(r, 0)])
    assert text(simplify(empty)) == "-INFINITY"


def _softmax_like(extra_read: bool):
    x, out = buf("x", [4, 8]), buf("out", [4, 8])
    e, s = buf("e", [4, 8]), buf("s", [4])
    i, j, j2, r = var("i"), var("j"), var("j"), var("r")
    body = [
        S.For(j, E.imm(0), E.imm(8), S.Store(e, (i, j), E.call("exp", E.Load(x, (i, j))))),
        S.Store(s, (i,), E.reduce("Add", E.Load(e, (i, r)), [(r, 8)], 0.0)),
        S.For(j2, E.imm(0), E.imm(8),
              S.Store(out, (i, j2), E.Load(e, (i, j2)) / E.Load(s, (i,)))),
    ]
    if extra_read:  # reads the row after `out` overwrote it: e must keep its own memory
        body.append(S.Store(s, (i,), E.reduce("Max", E.Load(e, (i, r)), [(r, 8)])))
    return S.For(i, E.imm(0), E.imm(4), S.Block(tuple(body))), [x, out, s]


def test_reuse_outputs_keeps_a_temporary_in_the_buffer_overwriting_it():
    from nncfuse.tensorexpr.passes.reuse_outputs import reuse_outputs

    stmt, params = _softmax_like(False)
    new = reuse_outputs(stmt, params)
    assert "e[" not in text(new) and "out[i, j_1] = out[i, j_1] / s[i]" in text(new)
    x = torch.randn(4, 8)
    got = run(new, params, [x, torch.zeros(4, 8), torch.zeros(4)])[1]
    torch.testing.assert_close(got, x.exp() / x.exp().sum(-1, True))
    stmt, params = _softmax_like(True)
    assert reuse_outputs(stmt, params) is stmt


@pytest.mark.parametrize("unroll", [False, True], ids=["kept", "unrolled"])
def test_reduction_loops_are_not_unrolled_by_llvm(monkeypatch, unroll):
    """A reduction's loop carries `llvm.loop.unroll.disable` (its full unrolling was most of
    the LLVM time of training kernels): the optimized code keeps the loop, and agrees."""
    from nncfuse.tensorexpr.codegen import llvm_codegen

    monkeypatch.setattr(llvm_codegen, "UNROLL_REDUCTIONS", unroll)
    stmt, params = row_reduce("Add", FLOAT32, rows=3, cols=37)
    fn = compile_stmt(stmt, params, f"reduce_unroll_{unroll}")
    assert ("llvm.loop.unroll.disable" in fn.ir_text) is not unroll
    body = fn.optimized_ir.split("define ", 1)[1]
    assert (body.count("fadd float") < 37) is not unroll  # 37 adds a row once unrolled
    a = torch.randn(3, 37)
    out = torch.empty(3)
    fn.cfunc(a.data_ptr(), out.data_ptr())
    torch.testing.assert_close(out, a.sum(1))
