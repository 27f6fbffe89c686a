"""llvm_codegen: vector loads of lanes at constant offsets from one scalar index (`_window`):
one load of the window and a shuffle, the same values as the interpreter's load per lane;
a select with a reduction in a branch as a branch; independent reductions in one loop."""

import re

import pytest
import torch

from nncfuse.tensorexpr import expr as E
from nncfuse.tensorexpr import stmt as S
from nncfuse.tensorexpr.buffer import Buf
from nncfuse.tensorexpr.codegen.llvm_codegen import LLVMCodeGen, _window, compile_stmt
from nncfuse.tensorexpr.dtype import FLOAT32, INDEX, UINT8
from nncfuse.tensorexpr.ir_eval import IREvaluator

LANES = 16


def _ramp(base: E.Expr, stride: int = 1) -> E.Ramp:
    return E.Ramp(base, E.imm(stride), LANES)


def _splat(value: int) -> E.Broadcast:
    return E.Broadcast(E.imm(value), LANES)


def _indices(i: E.Var) -> dict[str, E.Expr]:
    """Vector indices into a buffer of 64 * 8 elements, for row `i` of 8 rows."""
    base = E.Broadcast(i * 64, LANES)
    return {
        "repeat": base + _ramp(E.imm(0)) % _splat(4),  # 0 1 2 3 0 1 2 3 ...
        "spread": base + _ramp(E.imm(0)) / _splat(4),  # 0 0 0 0 1 1 1 1 ...
        "aligned": _ramp(i * 64) % _splat(64) / _splat(2) + base,  # 64 | 64 * i
        "stride 2": _ramp(i * 64, 2),
        "clamped": base + E.Min(_ramp(E.imm(-4)), _splat(7)) + _splat(4),  # a cat's read
        "reversed": _ramp(i * 64 + 15, -1),
    }


@pytest.mark.parametrize("kind", list(_indices(E.Var("i"))))
@pytest.mark.parametrize("dtype", [FLOAT32, UINT8])
def test_window_loads_as_the_interpreter(kind, dtype):
    i = E.Var("i")
    index = _indices(i)[kind]
    assert _window(index, LANES) is not None
    src = Buf.make("src", dtype, [64 * 8])
    out = Buf.make("out", dtype, [LANES * 8])
    nest = S.For(i, E.imm(0), E.imm(8), S.Store(out, (_ramp(i * LANES),), E.Load(src, (index,))))
    torch_dtype = torch.float32 if dtype == FLOAT32 else torch.uint8
    x = torch.arange(64 * 8).to(torch_dtype)
    if dtype == FLOAT32:
        x[::7] = float("nan")
        x[3::11] = -0.0
    got, want = torch.empty(LANES * 8, dtype=torch_dtype), torch.empty(LANES * 8, dtype=torch_dtype)
    jit = compile_stmt(nest, [src, out])
    jit.cfunc(x.data_ptr(), got.data_ptr())
    IREvaluator(nest, [src, out]).run([x, want])
    torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)


def test_not_windows():
    """Offsets that span two vectors or more, a base not a multiple of the divisor, a base that
    may be negative, a loaded index: a load per lane."""
    i = E.Var("i")
    idx = Buf.make("idx", INDEX, [LANES])
    for index in (
        _ramp(i * 64, 3),
        _ramp(i * 6) % _splat(4),
        _ramp(i * 64 - 64) / _splat(64),
        E.Load(idx, (_ramp(E.imm(0)),)),
    ):
        assert _window(index, LANES) is None, index


def _as_the_interpreter(stmt, params, inputs, out_shapes):
    """`stmt` compiled and interpreted on `inputs`: the same outputs, bit for bit; the
    unoptimized LLVM IR."""
    got = [torch.empty(s) for s in out_shapes]
    want = [torch.empty(s) for s in out_shapes]
    jit = compile_stmt(stmt, params)  # (kept: its code lives as long as it does)
    jit.cfunc(*(t.data_ptr() for t in (*inputs, *got)))
    IREvaluator(stmt, params).run([*inputs, *want])
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=0, atol=0, equal_nan=True)
    return LLVMCodeGen(stmt, params, "fused", frozenset()).ir_text()


def test_a_select_with_a_reduction_in_a_branch_runs_only_that_branch():
    x, c, out = Buf.make("x", FLOAT32, [32]), Buf.make("c", FLOAT32, [4]), Buf.make(
        "out", FLOAT32, [4])
    i, r = E.Var("i"), E.Var("r")
    total = E.reduce("Add", E.Load(x, (i * 8 + r,)), [(r, 8)])
    positive = E.cmp(">", E.Load(c, (i,)), E.imm(0.0, FLOAT32))
    stmt = S.For(i, E.imm(0), E.imm(4), S.Store(out, (i,), E.select(
        positive, E.Load(c, (i,)), total)))
    ir_text = _as_the_interpreter(stmt, [x, c, out], [torch.randn(32), torch.tensor(
        [1.0, -1.0, float("nan"), 2.0])], [4])
    # the row's loop is in the branch's block, after the condition's branch
    assert re.search(r"br i1 .*select\.true.*select\.false", ir_text)
    assert ir_text.index("select.false:") < ir_text.index("r.rheader:")


def test_independent_reductions_of_adjacent_lets_share_a_loop():
    x, out = Buf.make("x", FLOAT32, [32]), Buf.make("out", FLOAT32, [4])
    i = E.Var("i")
    v1, v2, v3 = (E.Var("v", FLOAT32) for _ in range(3))

    def row(body):
        r = E.Var("r")
        return E.reduce("Add", body(E.Load(x, (i * 8 + r,))), [(r, 8)])

    stmt = S.For(i, E.imm(0), E.imm(4), S.Block((
        S.Let(v1, row(lambda v: v)),
        S.Let(v2, row(lambda v: v - v1)),  # uses v1: a loop of its own
        S.Let(v3, row(lambda v: v * v) + E.imm(1.0, FLOAT32)),  # joins v1's loop
        S.Store(out, (i,), v1 + v2 * v3),
    )))
    ir_text = _as_the_interpreter(stmt, [x, out], [torch.randn(32)], [4])
    assert len(re.findall(r"^r\.rheader.*:", ir_text, re.M)) == 2

    def split_row(body):  # a vectorized row's shape: the tail's sum starts from the head's
        r, t = E.Var("r"), E.Var("r")
        head = E.reduce("Add", body(E.Load(x, (i * 8 + r,))), [(r, 6)])
        return E.Reduce("Add", head, body(E.Load(x, (i * 8 + t + 6,))), (t,), (E.imm(2),))

    stmt = S.For(i, E.imm(0), E.imm(4), S.Block((
        S.Let(v1, split_row(lambda v: v)),
        S.Let(v2, split_row(lambda v: v * v)),
        S.Store(out, (i,), v1 + v2),
    )))
    ir_text = _as_the_interpreter(stmt, [x, out], [torch.randn(32)], [4])
    assert len(re.findall(r"^r\.rheader.*:", ir_text, re.M)) == 2  # the heads', the tails'
