"""vectorize_reductions: column sums of few columns walk several rows per step (`row_steps`),
against the interpreter and eager: random, NaN/Inf, zero-size, odd and symbolic extents."""

import pytest
import torch

import nncfuse
from nncfuse.jit.fuser.guard import clear_kernel_cache
from nncfuse.tensorexpr import expr as E
from nncfuse.tensorexpr import stmt as S
from nncfuse.tensorexpr.codegen.llvm_jit import vector_bits
from nncfuse.tensorexpr.dtype import FLOAT32, INT64
from nncfuse.tensorexpr.ir_visitor import walk
from nncfuse.tensorexpr.passes import vectorize_reductions
from nncfuse.tensorexpr.passes.simplify import simplify
from nncfuse.tensorexpr.passes.vectorize_reductions import row_steps
from tests.tensorexpr.helpers import assert_expected_inline, buf, run, text, var


def _column_sums(rows, columns=32, dtype=FLOAT32):
    """`out[j] = sum(x[columns * r + j] for r < rows)` for j < columns: the nest and its
    reduction (`rows` an int or a Var)."""
    n = rows * columns if isinstance(rows, int) else 64 * columns
    x, out, j, r = buf("x", [n], dtype), buf("out", [columns], dtype), var("j"), var("r")
    stop = E.imm(rows) if isinstance(rows, int) else rows
    total = E.Reduce("Add", E.identity("Add", dtype), E.Load(x, (r * columns + j,)), (r,),
                     (stop,))
    return x, out, j, total


def _nest(out, j, value):
    return S.For(j, E.imm(0), E.imm(out.dims[0].value), S.Store(out, (j,), value))


def test_row_steps_text():
    x, out, j, total = _column_sums(10)
    got = text(simplify(row_steps(total))).replace(" for ", "\nfor ").replace(" + (", "\n+ (")
    assert_expected_inline(got, """\
reduce_add(reduce_add(-0.f, x[128 * r_1 + j] + x[128 * r_1 + j + 32]
+ (x[128 * r_1 + j + 64] + x[128 * r_1 + j + 96])
for r_1 < 2), x[32 * r + j + 256]
for r < 2)""")


@pytest.mark.parametrize("rows", [8, 10, 11, 131])
@pytest.mark.parametrize("steps", [2, 4])
def test_row_steps_sums_the_same_points(rows, steps):
    """Every point once, whatever the tail: integers exactly, floats within rounding."""
    for dtype, make in ((INT64, lambda n: torch.randint(-1000, 1000, (n,))),
                        (FLOAT32, lambda n: torch.randn(n))):
        x, out, j, total = _column_sums(rows, dtype=dtype)
        data = make(rows * 32)
        want = run(_nest(out, j, total), [x, out], [data, torch.zeros(32, dtype=data.dtype)])[1]
        got = run(_nest(out, j, row_steps(total, steps)), [x, out],
                  [data, torch.zeros(32, dtype=data.dtype)])[1]
        torch.testing.assert_close(got, want, rtol=0 if dtype == INT64 else 1e-5, atol=1e-5)


def test_row_steps_chain_products_in_fused_multiply_adds():
    """A step of float products: one product, then fused multiply-adds (rounded once each):
    the sums within rounding of float64's, NaN and infinities as eager's."""
    x, out, j, total = _column_sums(8)
    a, r = buf("a", [8]), total.vars[0]
    products = E.Reduce("Add", total.init, E.Load(a, (r,)) * total.body, total.vars,
                        total.stops)
    got = text(simplify(row_steps(products))).replace(", fma", ",\nfma")
    assert_expected_inline(got, """\
reduce_add(-0.f,
fma(a[4 * r + 3], x[128 * r + j + 96],
fma(a[4 * r + 2], x[128 * r + j + 64],
fma(a[4 * r + 1], x[128 * r + j + 32], a[4 * r] * x[128 * r + j]))) for r < 2)""")
    for special in (None, float("nan"), float("inf")):
        data, weights = torch.randn(8 * 32), torch.randn(8)
        if special is not None:
            data[3 * 32 + 5] = special
        want = (weights.double()[:, None] * data.double().view(8, 32)).sum(0).float()
        got = run(_nest(out, j, row_steps(products)), [x, a, out],
                  [data, weights, torch.zeros(32)])[2]
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5, equal_nan=True)


def test_row_steps_symbolic_extent():
    """A run-time row count: `rows / steps` steps, then `rows % steps` points (any may be 0)."""
    n = var("n")
    x, out, j, total = _column_sums(n)
    stepped = row_steps(total)
    assert isinstance(stepped, E.Reduce) and isinstance(stepped.init, E.Reduce)
    for rows in (0, 1, 3, 4, 9, 64):
        data = torch.randn(64 * 32)
        args = [data, torch.zeros(32), rows]
        want = data[:rows * 32].view(rows, 32).sum(0)
        got = run(_nest(out, j, stepped), [x, out, n], args)[1]
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_row_steps_leaves_alone():
    """Not a sum, a sum that contains another, fewer than two steps' points."""
    x, out, j, total = _column_sums(64)
    product = E.Reduce("Mul", E.identity("Mul", FLOAT32), total.body, total.vars, total.stops)
    nested = E.Reduce("Add", total.init, total, (var("s"),), (E.imm(3),))
    short = _column_sums(7)[3]
    assert row_steps(product) is product
    assert row_steps(nested) is nested
    assert row_steps(short) is short


def _innermost_reduces(stmt):
    return [n for n in walk(stmt) if isinstance(n, E.Reduce)
            and not any(isinstance(m, E.Reduce) for m in walk(n.body))]


def _kernel(fn, *args, **options):
    f = nncfuse.jit(torch.jit.trace(fn, args), min_group_size=1, **options)
    f(*args)
    (group,) = nncfuse.fusion_groups(f.graph_for(*args))
    return f, nncfuse.TensorExprKernel(group.g("Subgraph")).stmt


def _batched_column_sums(x):
    return x.sum(1)


@pytest.mark.parametrize("rows", [0, 1, 7, 9, 131, 1000])
@pytest.mark.parametrize("columns", [3, 16, 32, 48])
def test_batched_column_sums_against_eager(rows, columns):
    """Column sums of a batch (the column loop inside the batch's): each point once."""
    x = torch.randn(5, rows, columns)
    if rows > 3:
        x[0, 2, 0], x[1, 3, -1], x[2, 1, 1 % columns] = float("nan"), float("inf"), -float("inf")
    f, _ = _kernel(_batched_column_sums, x)
    for _ in range(2):
        torch.testing.assert_close(f(x), x.sum(1), rtol=1e-5, atol=1e-4, equal_nan=True)
    clear_kernel_cache()


def test_batched_column_sums_walk_rows_in_steps():
    """32 float32 columns: as many registers as they fill (two with AVX-512), each sum
    walking ACCUMULATORS rows per step; 128 columns fill ACCUMULATORS registers (one row
    per step)."""
    native = vector_bits() // 32
    for columns in (32, 128):
        registers = vectorize_reductions.ACCUMULATORS
        while registers > 1 and columns < registers * native:
            registers //= 2
        _, stmt = _kernel(_batched_column_sums, torch.randn(4, 256, columns))
        clear_kernel_cache()
        for inner in _innermost_reduces(stmt):
            loads = [n for n in walk(inner.body) if isinstance(n, E.Load)]
            assert inner.dtype.lanes == registers * native, text(stmt)
            steps = vectorize_reductions.ACCUMULATORS if registers < 4 else 1
            assert len(loads) == steps, text(stmt)


def test_batched_column_sums_of_symbolic_rows():
    """A dynamic kernel (the row count a symbol): the steps and the tail computed at run
    time, the right sums at each count."""
    f = nncfuse.jit(torch.jit.trace(_batched_column_sums, torch.randn(3, 5, 16)),
                    min_group_size=1, dynamic=True)
    for rows in (5, 37, 200, 0, 3):
        x = torch.randn(3, rows, 16)
        for _ in range(2):
            torch.testing.assert_close(f(x), x.sum(1), rtol=1e-5, atol=1e-4)
    assert nncfuse.fusion_groups(f.graph_for(x))
    clear_kernel_cache()
