"""llvm_codegen: vector loads of lanes at constant offsets from one scalar index (`_window`):
one load of the window and a shuffle, the same values as the interpreter's load per lane."""

import pytest
import torch

from nncfuse.tensorexpr import expr as E
from nncfuse.tensorexpr import stmt as S
from nncfuse.tensorexpr.buffer import Buf
from nncfuse.tensorexpr.codegen.llvm_codegen import _window, compile_stmt
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
