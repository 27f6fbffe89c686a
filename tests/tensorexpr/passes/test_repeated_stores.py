"""eliminate_dead_stores: a temporary whose values an output also stores is read from the output.

GELU's backward in the MLP's training step is both returned transposed (`t_3`, the weight
gradient's operand) and summed over its rows (the bias gradient): the value was stored
twice, into a temporary and into the output, and the sum read the temporary.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import pytest
import torch

import nncfuse
from nncfuse.jit.fuser.runtime import kernel_of
from nncfuse.tensorexpr import expr as E
from nncfuse.tensorexpr import stmt as S
from nncfuse.tensorexpr.dtype import FLOAT32
from nncfuse.tensorexpr.ir_visitor import walk
from nncfuse.tensorexpr.kernel import TensorExprKernel
from nncfuse.tensorexpr.passes.dead_stores import eliminate_dead_stores
from nncfuse.tensorexpr.passes.insert_allocations import insert_allocations
from tests.fused import BACKENDS
from tests.tensorexpr.helpers import assert_expected_inline, buf, same_results, text, var


def _program(out_index=None, value_of_out=None, second_out_store=False):
    """`tmp[i] = v; out[i] = v` over 8 elements, then a sum of `tmp` into `s`."""
    x, tmp, out, s = buf("x", [8]), buf("tmp", [8]), buf("out", [8]), buf("s", [1])
    i, r, v = var(), var("r"), E.Var("v", FLOAT32)
    body = [S.Let(v, E.call("sin", E.Load(x, (i,)))), S.Store(tmp, (i,), v),
            S.Store(out, (out_index(i) if out_index is not None else i,),
                    value_of_out if value_of_out is not None else v)]
    nests = [S.For(i, E.imm(0), E.imm(8), S.Block(tuple(body)))]
    if second_out_store:
        nests.append(S.Store(out, (E.imm(0),), E.Load(x, (E.imm(1),))))
    total = E.reduce("Add", E.Load(tmp, (r,)), [(r, 8)])
    nests.append(S.Store(s, (E.imm(0),), total))
    return S.Block(tuple(nests)), [x, out, s]


def _stored(stmt):
    return sorted(n.buf.root.name for n in walk(stmt) if isinstance(n, S.Store))


def test_the_temporary_is_read_from_the_output_and_not_stored():
    stmt, params = _program()
    after = eliminate_dead_stores(stmt, params=params, outputs=params[1:])
    assert_expected_inline(text(after), """\
{
  for (int64_t i = 0; i < 8; i++) {
    float v = sin(x[i]);
    out[i] = v;
  }
  s[0] = reduce_add(-0.f, out[r] for r < 8);
}""")
    same_results(insert_allocations(stmt, params), insert_allocations(after, params), params,
                 lambda: [torch.randn(8), torch.zeros(8), torch.zeros(1)])


def test_the_same_offset_written_another_way_is_the_same_element():
    stmt, params = _program(out_index=lambda i: E.imm(1) + (i - 1))
    assert _stored(eliminate_dead_stores(stmt, params=params, outputs=params[1:])) == ["out", "s"]


@pytest.mark.parametrize("case", ["not an allocated output", "another element", "another value",
                                  "the output stored twice"])
def test_the_temporary_stays_where_the_output_may_not_hold_its_values(case):
    stmt, params = {
        "not an allocated output": lambda: _program(),
        "another element": lambda: _program(out_index=lambda i: E.imm(7) - i),
        "another value": lambda: _program(value_of_out=E.Var("v", FLOAT32) * 2.0),
        "the output stored twice": lambda: _program(second_out_store=True),
    }[case]()
    outputs = [] if case == "not an allocated output" else params[1:]
    after = eliminate_dead_stores(stmt, params=params, outputs=outputs)
    assert "tmp" in _stored(after), text(after)


def _gelu_grad(x, g):
    """GELU's backward as AOTAutograd decomposes it, returned transposed and summed by rows."""
    cdf = (torch.erf(x * 0.7071067811865476) + 1) * 0.5
    y = g * (cdf + x * (torch.exp(x * x * -0.5) * 0.3989422804014327))
    return y.t(), y.sum(0)


def _fused(fn, *args, use_llvm=True):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        traced = torch.jit.trace(fn, args, check_trace=False)
    fused = nncfuse.jit(traced, min_group_size=1, use_llvm=use_llvm)
    for _ in range(3):
        got = fused(*args)
    want = fn(*args)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, equal_nan=True)
        assert a.stride() == b.stride() and a.dtype == b.dtype
    return [kernel_of(g) for g in nncfuse.fusion_groups(fused.graph_for(*args))]


def _value_stores(kernel):
    """Stores of the kernel's 2-d value: those not of the row sum's output."""
    return [n for n in walk(kernel.stmt) if isinstance(n, S.Store) and "sum" not in n.buf.name]


@pytest.mark.parametrize("use_llvm", BACKENDS)
@pytest.mark.parametrize("layout", ["contiguous", "transposed input", "broadcast input"])
def test_gelu_backward_matches_eager_and_is_stored_once_where_layouts_agree(layout, use_llvm):
    x = torch.randn(64, 48)
    x[0, :4] = torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0])
    g = {"contiguous": torch.randn(64, 48), "transposed input": torch.randn(48, 64).t(),
         "broadcast input": torch.randn(48)}[layout]
    (kernel,) = _fused(_gelu_grad, x, g, use_llvm=use_llvm)
    if layout == "transposed input":  # `t_3` is of `g`'s layout, the row-major temporary not
        return
    assert len(_value_stores(kernel)) == 1, kernel.stmt
    assert not any(isinstance(n, S.Allocate) for n in walk(kernel.stmt)), kernel.stmt


@pytest.mark.parametrize("use_llvm", BACKENDS)
def test_zero_size(use_llvm):
    _fused(_gelu_grad, torch.randn(0, 48), torch.randn(0, 48), use_llvm=use_llvm)


def _strided_out(x, g):
    y = g * torch.erf(x)
    return y.t().contiguous(), y.sum(0)  # the output's layout is not the temporary's


@pytest.mark.parametrize("use_llvm", BACKENDS)
def test_an_output_of_another_layout_keeps_the_temporary(use_llvm):
    (kernel,) = _fused(_strided_out, torch.randn(64, 48), torch.randn(64, 48), use_llvm=use_llvm)
    assert len(_value_stores(kernel)) == 2, kernel.stmt


def _in_place(x, g):
    x.mul_(g)
    return x, x.sum(0)


@pytest.mark.parametrize("use_llvm", BACKENDS)
def test_a_write_back_into_an_input_is_not_what_the_sum_reads(use_llvm):
    x, g = torch.randn(64, 48), torch.randn(64, 48)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        traced = torch.jit.trace(_in_place, (x.clone(), g), check_trace=False)
    fused = nncfuse.jit(traced, min_group_size=1, use_llvm=use_llvm)
    for _ in range(3):
        fused(x.clone(), g)
    a = x.clone()
    got = fused(a, g)
    b = x.clone()
    want = _in_place(b, g)
    torch.testing.assert_close(got[0], want[0])
    torch.testing.assert_close(got[1], want[1])
    torch.testing.assert_close(a, b)
    assert got[0].data_ptr() == a.data_ptr()


def _copy_program(copy_index=None, second_tmp_store=False):
    """`tmp[i] = sin(x[i])`, a sum of `tmp`, then `out[i] = tmp[i]` in its own loop."""
    x, tmp, out, s = buf("x", [8]), buf("tmp", [8]), buf("out", [8]), buf("s", [1])
    i, j, r = var(), var("j"), var("r")
    nests = [S.For(i, E.imm(0), E.imm(8), S.Store(tmp, (i,), E.call("sin", E.Load(x, (i,)))))]
    if second_tmp_store:
        nests.append(S.Store(tmp, (E.imm(0),), E.Load(x, (E.imm(1),))))
    nests.append(S.Store(s, (E.imm(0),), E.reduce("Add", E.Load(tmp, (r,)), [(r, 8)])))
    at = copy_index(j) if copy_index else j
    nests.append(S.For(j, E.imm(0), E.imm(8), S.Store(out, (j,), E.Load(tmp, (at,)))))
    return S.Block(tuple(nests)), [x, out, s]


def test_a_later_copy_into_the_output_becomes_the_temporarys_store():
    stmt, params = _copy_program()
    after = eliminate_dead_stores(stmt, params=params, outputs=params[1:])
    assert_expected_inline(text(after), """\
{
  for (int64_t i = 0; i < 8; i++) {
    out[i] = sin(x[i]);
  }
  s[0] = reduce_add(-0.f, out[r] for r < 8);
  for (int64_t j = 0; j < 8; j++) {
  }
}""")
    same_results(insert_allocations(stmt, params), insert_allocations(after, params), params,
                 lambda: [torch.randn(8), torch.zeros(8), torch.zeros(1)])


@pytest.mark.parametrize("case", ["another element", "the temporary stored twice",
                                  "not an allocated output"])
def test_a_later_copy_stays_where_it_is_not_of_the_same_elements(case):
    stmt, params = _copy_program(
        copy_index=(lambda j: E.imm(7) - j) if case == "another element" else None,
        second_tmp_store=case == "the temporary stored twice")
    outputs = [] if case == "not an allocated output" else params[1:]
    after = eliminate_dead_stores(stmt, params=params, outputs=outputs)
    assert "tmp" in _stored(after), text(after)


def test_a_copy_of_part_of_the_temporary_stays_a_copy():
    """The output holds 4 of the temporary's 8 elements (a chunk's first piece): storing the
    temporary there wrote past the output's end (fuzzer seeds 7162, 20226, 31177)."""
    x, tmp, out, s = buf("x", [8]), buf("tmp", [8]), buf("out", [4]), buf("s", [1])
    i, j, r = var(), var("j"), var("r")
    stmt = S.Block((
        S.For(i, E.imm(0), E.imm(8), S.Store(tmp, (i,), E.call("sin", E.Load(x, (i,))))),
        S.Store(s, (E.imm(0),), E.reduce("Add", E.Load(tmp, (r + E.imm(4),)), [(r, 4)])),
        S.For(j, E.imm(0), E.imm(4), S.Store(out, (j,), E.Load(tmp, (j,))))))
    after = eliminate_dead_stores(stmt, params=[x, out, s], outputs=[out, s])
    assert "tmp" in _stored(after), text(after)


def _chunks(x):
    a, b = (x & 2).chunk(2, 0)
    return a, b.expm1()


@pytest.mark.parametrize("use_llvm", BACKENDS)
def test_a_chunks_first_piece_returned_beside_the_rest(use_llvm):
    x = torch.randint(-100, 100, (7,), dtype=torch.int8)
    fused = nncfuse.jit(_chunks, use_llvm=use_llvm)
    for _ in range(3):
        got = fused(x)
    want = _chunks(x)
    torch.testing.assert_close(got[0], want[0])
    torch.testing.assert_close(got[1], want[1])


@pytest.mark.parametrize("contender", ["nncfuse-jit", "nncfuse-jit-aot", "nncfuse-backend"])
def test_the_mlps_gelu_backward_stores_its_value_once(contender, monkeypatch):
    """Through every path (the backend's copy of `t_3` is a later nest, past the column
    sum), the MLP's backward kernels need no temporary, and its gradients match eager's
    (those of the third step: the autodiff path's first profiles)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks"))
    try:
        import training
    finally:
        sys.path.pop(0)
    torch.manual_seed(0)
    model, inputs = training.MLP(32, 64).train(), (torch.randn(8, 32),)
    built: list[TensorExprKernel] = []  # (kept here: a dropped function's kernels are freed)
    init = TensorExprKernel.__init__

    def keep(self, *args, **kwargs):
        init(self, *args, **kwargs)
        built.append(self)

    monkeypatch.setattr(TensorExprKernel, "__init__", keep)
    got = training.gradients_after_one_step(contender, model, inputs, first_steps=3)[0]
    want = training.gradients_after_one_step("eager", model, inputs)[0]
    assert training.compare_gradients(got, want, lambda: training.exact_gradients(model, inputs)) \
        is None
    kernels = [k for k in built if "erf" in str(k.stmt) and "exp" in str(k.stmt)]
    assert kernels
    for kernel in kernels:
        assert not any(isinstance(n, S.Allocate) for n in walk(kernel.stmt)), kernel.stmt


def _overwritten(between):
    """`out[i] = sin(x[i]); <between>; out[i] = out2-like value` in one loop body."""
    x, out, other = buf("x", [8]), buf("out", [8]), buf("other", [8])
    i, v = var(), E.Var("v", FLOAT32)
    body = [S.Let(v, E.call("sin", E.Load(x, (i,)))), S.Store(out, (i,), v),
            *between(x, out, other, i), S.Store(out, (i,), v * v)]
    return S.For(i, E.imm(0), E.imm(8), S.Block(tuple(body))), [x, out, other]


def test_a_store_that_a_later_store_overwrites_is_dropped():
    stmt, params = _overwritten(lambda x, out, other, i: [S.Store(other, (i,), E.Load(x, (i,)))])
    after = eliminate_dead_stores(stmt, params=params)
    assert_expected_inline(text(after), """\
for (int64_t i = 0; i < 8; i++) {
  float v = sin(x[i]);
  other[i] = x[i];
  out[i] = v * v;
}""")
    same_results(stmt, after, params, lambda: [torch.randn(8) for _ in params])


def test_a_store_read_before_it_is_overwritten_stays():
    stmt, params = _overwritten(lambda x, out, other, i: [S.Store(other, (i,), E.Load(out, (i,)))])
    assert text(eliminate_dead_stores(stmt, params=params)).count("out[i] =") == 2


def test_a_store_of_another_element_is_not_overwritten():
    x, out = buf("x", [8]), buf("out", [8])
    i = var()
    stmt = S.For(i, E.imm(0), E.imm(4), S.Block((
        S.Store(out, (i,), E.Load(x, (i,))), S.Store(out, (i + 4,), E.Load(x, (i,)) * 2.0))))
    assert eliminate_dead_stores(stmt, params=[x, out]) is stmt


def test_a_store_that_the_overwriting_store_reads_stays():
    """A logsumexp of one element: its maximum stored, then the result computed from it into
    the same element (fuzzer seed 11571)."""
    x, out = buf("x", [1]), buf("out", [1])
    zero = (E.imm(0),)
    stmt = S.Block((
        S.Store(out, zero, E.call("exp", E.Load(x, zero))),
        S.Store(out, zero, E.call("log", E.Load(out, zero)) + E.Load(x, zero)),
    ))
    assert eliminate_dead_stores(stmt, params=[x, out]) is stmt
