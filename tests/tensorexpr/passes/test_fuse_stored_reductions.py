"""fuse_stored_reductions: a softmax's sum accumulates in the loop that stores its exps, with
the same results bit for bit (on and off, LLVM and interpreter, 1 and 2 threads)."""

from __future__ import annotations

import math

import pytest
import torch

import nncfuse
from nncfuse.jit.fuser.guard import clear_kernel_cache
from nncfuse.tensorexpr import expr as E
from nncfuse.tensorexpr import stmt as S
from nncfuse.tensorexpr.dtype import FLOAT32
from nncfuse.tensorexpr.ir_visitor import walk
from nncfuse.tensorexpr.kernel import TensorExprKernel
from nncfuse.tensorexpr.passes import fuse_stored_reductions as F
from tests.fused import BACKENDS, assert_exact
from tests.tensorexpr.helpers import buf, same_results, var


def softmax(x):
    return torch.softmax(x, -1)


def _fused(fn, x, use_llvm=True):
    """fn(x) through nncfuse, and the kernel's final Stmt."""
    clear_kernel_cache()
    traced = torch.jit.trace(fn, (x,))
    f = nncfuse.jit(traced, min_group_size=1, use_llvm=use_llvm)
    f(x)
    (group,) = nncfuse.fusion_groups(f.graph_for(x))
    return f(x), TensorExprKernel(group.g("Subgraph"))


def _with_and_without(fn, x, monkeypatch, use_llvm=True):
    on, kernel = _fused(fn, x, use_llvm)
    with monkeypatch.context() as m:
        m.setattr(F, "MIN_ELEMENTS", math.inf)
        off, plain = _fused(fn, x, use_llvm)
    clear_kernel_cache()
    return on, off, kernel, plain


def _sums_of_output(stmt, name):
    """The reductions that read back the buffer `name` with vector loads."""
    return [n for n in walk(stmt) if isinstance(n, E.Reduce) and n.dtype.lanes > 1
            and any(isinstance(m, E.Load) and m.buf.name == name for m in walk(n.body))]


def _rows(*shape):
    x = torch.randn(*shape) * 4
    flat = x.view(-1, shape[-1])
    flat[0, :3] = torch.tensor([float("nan"), 1.0, 2.0])
    flat[1, 5] = float("inf")
    flat[-1, :] = -0.0
    if flat.shape[0] > 3:
        flat[2, 7] = float("-inf")
    return x


@pytest.mark.parametrize("shape", [(64, 512), (64, 1000), (16, 1024), (8, 4096), (3, 5, 640),
                                   (4, 9000), (2, 16384)])  # (blocked sums, `BLOCK`)
@pytest.mark.parametrize("threads", [1, 2])
def test_same_bits_as_the_separate_sum(shape, threads, monkeypatch):
    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        x = _rows(*shape)
        on, off, kernel, plain = _with_and_without(softmax, x, monkeypatch)
    finally:
        torch.set_num_threads(saved)
    assert_exact(on, off)
    torch.testing.assert_close(on, softmax(x), equal_nan=True)
    assert _sums_of_output(plain.stmt, "aten_softmax")  # (what the pass takes)
    assert not _sums_of_output(kernel.stmt, "aten_softmax")
    inner = [n for loop in walk(kernel.stmt) if isinstance(loop, S.For)
             for n in walk(loop.body) if isinstance(n, S.Allocate)]
    assert inner and all(n.buf.name.startswith("softmax_rsum_acc") for n in inner)
    # the accumulators live on the stack, which LLVM promotes to registers
    assert "alloca" in kernel.jit.ir_text
    ir, before = kernel.get_code_text("ir"), plain.get_code_text("ir")
    assert ir.count("alloca") == before.count("alloca")
    assert ir.count("@malloc(") == before.count("@malloc(")


@pytest.mark.parametrize("use_llvm", BACKENDS)
def test_noncontiguous_and_scaled_rows(use_llvm, monkeypatch):
    x = _rows(512, 48).t()  # rows of 512 along a strided dim: read through a transpose
    fn = lambda x: torch.softmax(x * 2 - 1, -1) + 1  # noqa: E731
    on, off, _, _ = _with_and_without(fn, x, monkeypatch, use_llvm)
    assert_exact(on, off)
    torch.testing.assert_close(on, fn(x), equal_nan=True)


def test_short_rows_stay_as_they_were(monkeypatch):
    x = torch.randn(64, F.MIN_ELEMENTS // 2)
    on, off, kernel, plain = _with_and_without(softmax, x, monkeypatch)
    assert str(kernel.stmt) == str(plain.stmt)


# -- the pass on small programs -------------------------------------------------------------------

def _program(row=512, sum_lanes=64, stored=None, part_offset=0, vectors=None):
    """For rows i < 2: out[row i + j] = exp(x[row i + j]) in 16-lane vectors, then
    s[i] = 1 / lanes_add of a `sum_lanes`-lane sum over `out` (or `stored`)."""
    x, out, s = buf("x", [2 * row]), buf("out", [2 * row]), buf("s", [2])
    i, j, r = var("i"), var("j"), var("r")

    def ramp(base, lanes):
        return E.Ramp(base, E.imm(1), lanes)

    store = S.Store(out, (ramp(row * i + 16 * j, 16),),
                    E.call("exp", E.Load(x, (ramp(row * i + 16 * j, 16),))))
    vectors = row // sum_lanes if vectors is None else vectors
    total = E.Reduce("Add", E.Broadcast(E.Imm.make(-0.0, FLOAT32), sum_lanes),
                     E.Load(stored or out, (ramp(row * i + sum_lanes * r + part_offset,
                                                 sum_lanes),)), (r,), (E.imm(vectors),))
    value = E.Imm.make(1.0, FLOAT32) / E.LaneReduce("Add", total)
    body = S.Block((S.For(j, E.imm(0), E.imm(row // 16), store), S.Store(s, (i,), value)))
    return S.Block((S.For(i, E.imm(0), E.imm(2), body),)), [x, out, s]


def _args(row=512):
    return lambda: [torch.randn(2 * row), torch.zeros(2 * row), torch.zeros(2)]


@pytest.mark.parametrize("sum_lanes", [16, 32, 64])
def test_the_pass_keeps_the_results(sum_lanes):
    stmt, params = _program(sum_lanes=sum_lanes)
    fused = F.fuse_stored_reductions(stmt)
    assert fused is not stmt
    assert not any(isinstance(n, E.Reduce) for n in walk(fused))
    same_results(stmt, fused, params, _args())


def test_a_part_of_the_row():
    """A sum over the middle of what the loop stores: the loop runs in three pieces."""
    stmt, params = _program(part_offset=64, vectors=2)
    fused = F.fuse_stored_reductions(stmt)
    assert not any(isinstance(n, E.Reduce) for n in walk(fused))
    assert sum(isinstance(n, S.For) for n in walk(fused)) == 4  # rows; before, in, after
    same_results(stmt, fused, params, _args())


@pytest.mark.parametrize("kind", ["other buffer", "past the loop", "odd offset", "short"])
def test_what_the_pass_leaves(kind):
    other = buf("other", [1024])
    stmt, _ = {
        "other buffer": lambda: _program(stored=other),
        "past the loop": lambda: _program(part_offset=64),
        "odd offset": lambda: _program(part_offset=8, vectors=2),
        "short": lambda: _program(row=256),
    }[kind]()
    assert F.fuse_stored_reductions(stmt) is stmt


def test_blocked_sums_in_the_interpreter(monkeypatch):
    """A row long enough for `vectorize_reductions`' blocks, and a scalar tail."""
    x = _rows(2, 8200)
    on, off, kernel, _ = _with_and_without(softmax, x, monkeypatch, use_llvm=False)
    assert_exact(on, off)
    torch.testing.assert_close(on, softmax(x), equal_nan=True)
    assert any(isinstance(n, S.Allocate) and "_acc" in n.buf.name for n in walk(kernel.stmt))


def _gapped_program(where):
    """Rows of 1024 stored in 16-lane vectors and 8 64-lane vectors summed, one of the two
    indices with a term that is not a multiple of its variable: the sum reads vectors 0-3 and
    5-8 (`64 * r + 64 * (r / 4)`), or the loop stores 16-lane vectors 0-1, 4-5, ...
    (`16 * j + 32 * (j / 2)`), which `linear` sees as atoms that vanish at the variable's
    zero: not the stores of one vector after the other that the pass assumes."""
    row = 1024
    x, out, s = buf("x", [2 * row]), buf("out", [3 * row]), buf("s", [2])
    i, j, r = var("i"), var("j"), var("r")
    gap = {"read": (64 * r + 64 * E.Div(r, E.imm(4)), 16 * j, row // 16),
           "store": (64 * r, 16 * j + 32 * E.Div(j, E.imm(2)), row // 32)}
    read, stored, stop = gap[where]
    store = S.Store(out, (E.Ramp(row * i + stored, E.imm(1), 16),),
                    E.call("exp", E.Load(x, (E.Ramp(row * i + 16 * j, E.imm(1), 16),))))
    total = E.Reduce("Add", E.Broadcast(E.Imm.make(-0.0, FLOAT32), 64),
                     E.Load(out, (E.Ramp(row * i + read, E.imm(1), 64),)), (r,), (E.imm(8),))
    body = S.Block((S.For(j, E.imm(0), E.imm(stop), store),
                    S.Store(s, (i,), E.LaneReduce("Add", total))))
    stmt = S.Block((S.For(i, E.imm(0), E.imm(2), body),))
    return stmt, [x, out, s], lambda: [torch.randn(2 * row), torch.zeros(3 * row), torch.zeros(2)]


@pytest.mark.parametrize("where", ["read", "store"])
def test_an_index_not_linear_in_its_variable(where):
    stmt, params, args = _gapped_program(where)
    same_results(stmt, F.fuse_stored_reductions(stmt), params, args)
