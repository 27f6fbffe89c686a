"""partition_loops (cat's loops, one per part) and tile_transposes (2-D tiles for transposes)."""

import math

import pytest
import torch

from nncfuse.tensorexpr import expr as E
from nncfuse.tensorexpr import stmt as S
from nncfuse.tensorexpr.dtype import FLOAT32
from nncfuse.tensorexpr.ir_visitor import walk
from nncfuse.tensorexpr.loopnest import compute
from nncfuse.tensorexpr.passes.flatten_indices import flatten_indices
from nncfuse.tensorexpr.passes.insert_allocations import insert_allocations
from nncfuse.tensorexpr.passes.partition_loops import partition_loops
from nncfuse.tensorexpr.passes.simplify import simplify
from nncfuse.tensorexpr.passes.split_loops import MIN_INNER, split_loops
from nncfuse.tensorexpr.passes.tile_transposes import MIN_STRIDE, TILE, tile_transposes
from tests.tensorexpr.helpers import buf, same_results, text


def cat_body(a, b):
    def body(i, j):
        left = E.Load(a, (i, E.Min(j, E.imm(2)))) + 1.0
        right = E.Load(b, (i, E.Max(j - 3, E.imm(0)))) * 2.0
        return E.Select(E.cmp("<", j, E.imm(3)), left, right)

    return body


def test_partition_loops_gives_each_part_a_loop_without_selects_or_clamps():
    a, b, out = buf("a", [4, 3]), buf("b", [4, 5]), buf("out", [4, 8])
    _, nest = compute("out", FLOAT32, [4, 8], cat_body(a, b), out=out)
    split = partition_loops(nest)
    assert not [n for n in walk(split) if isinstance(n, (E.Select, E.Min, E.Max))], text(split)
    assert "out[i, j] = a[i, j] + 1.f;" in text(split)
    assert "out[i, j_1 + 3] = b[i, j_1] * 2.f;" in text(split)
    same_results(nest, split, [a, b, out],
                 lambda: [torch.randn(4, 3), torch.randn(4, 5), torch.empty(4, 8)])


def test_partition_loops_leaves_loops_without_comparisons():
    a, out = buf("a", [4, 8]), buf("out", [4, 8])
    _, nest = compute("out", FLOAT32, [4, 8], lambda i, j: E.Load(a, (i, j)) * 2.0, out=out)
    assert partition_loops(nest) is nest


def transposed_sum(n):
    x, y, out = buf("x", [n, n]), buf("y", [n, n]), buf("out", [n, n])
    _, nest = compute("out", FLOAT32, [n, n],
                      lambda i, j: E.Load(x, (i, j)) + E.Load(y, (j, i)), out=out)
    return simplify(flatten_indices(nest)), [x, y, out]


def test_tile_transposes_tiles_a_transposed_read():
    n = 4 * TILE  # y's stride in the inner loop is n, at least MIN_STRIDE
    flat, params = transposed_sum(n)
    tiled = tile_transposes(flat)
    loops = [line.strip() for line in text(tiled).splitlines() if "for" in line]
    assert loops == [
        f"for (int64_t io = 0; io < {n // TILE}; io++) /* parallel */ {{",  # the work asks
        f"for (int64_t jo = 0; jo < {n // TILE}; jo++) {{",
        f"for (int64_t ji_r = 0; ji_r < {TILE}; ji_r++) {{",  # y's tile, copied row by row
        f"for (int64_t ii_c = 0; ii_c < {TILE}; ii_c++) {{",
        f"for (int64_t ii = 0; ii < {TILE}; ii++) {{",
        f"for (int64_t ji = 0; ji < {TILE}; ji++) {{",
    ], text(tiled)
    # The copy reads y along its rows; the sum reads the tile, not y, at a stride of TILE.
    copy, _ = (s for s in walk(tiled) if isinstance(s, S.Store))
    assert copy.buf.name == "y_tile"
    assert f"= y[{TILE * n} * jo + {n} * ji_r + {TILE} * io + ii_c];" in text(copy), text(copy)
    assert f"y_tile[{TILE * TILE} * io + {TILE} * ji + ii]" in text(tiled), text(tiled)
    assert "y[" not in text(tiled).split("out[")[1], text(tiled)
    same_results(flat, insert_allocations(tiled, params), params,
                 lambda: [torch.randn(n, n), torch.randn(n, n), torch.empty(n, n)])


def test_tile_transposes_copies_no_tile_of_a_buffer_the_nest_writes():
    n = 8 * TILE
    x, out = buf("x", [n, n]), buf("out", [n, n])
    # out = x.t() in place of x: the tile would hold stale values; only tiling is safe.
    _, nest = compute("x", FLOAT32, [n, n], lambda i, j: E.Load(x, (j, i)) + 1.0, out=x)
    flat = simplify(flatten_indices(nest))
    tiled = tile_transposes(flat)
    assert tiled is not flat and "_tile" not in text(tiled), text(tiled)
    del out


def test_tile_transposes_leaves_short_strides_and_short_extents():
    flat, _ = transposed_sum(MIN_STRIDE // 2)  # a short stride: rows stay in cache
    assert tile_transposes(flat) is flat
    x, y, out = buf("x", [8 * TILE, 2 * TILE - 1]), buf("y", [2 * TILE - 1, 8 * TILE]), \
        buf("out", [8 * TILE, 2 * TILE - 1])
    _, nest = compute("out", FLOAT32, [8 * TILE, 2 * TILE - 1],
                      lambda i, j: E.Load(x, (i, j)) + E.Load(y, (j, i)), out=out)
    flat = simplify(flatten_indices(nest))
    assert tile_transposes(flat) is flat  # fewer than two tiles across


@pytest.mark.parametrize("n", [4 * TILE + 3, 5 * TILE - 1])
def test_tile_transposes_runs_the_rows_and_columns_past_the_last_whole_tile(n):
    flat, params = transposed_sum(n)
    tiled = tile_transposes(flat)
    assert "y_tile" in text(tiled), text(tiled)
    loops = [line.strip() for line in text(tiled).splitlines() if "for" in line]
    assert f"for (int64_t jt = {n // TILE * TILE}; jt < {n}; jt++) {{" in loops, loops
    assert f"for (int64_t i = {n // TILE * TILE}; i < {n}; i++) {{" in loops, loops
    same_results(flat, insert_allocations(tiled, params), params,
                 lambda: [torch.randn(n, n), torch.randn(n, n), torch.empty(n, n)])


def symbolic_transposed_sum(cols):
    """out[s0, cols] = x[s0, cols] + y[cols, s0].t(): the rows a size symbol."""
    s0 = E.Var("s0")
    x, y, out = buf("x", [s0, cols]), buf("y", [cols, s0]), buf("out", [s0, cols])
    _, nest = compute("out", FLOAT32, [s0, cols],
                      lambda i, j: E.Load(x, (i, j)) + E.Load(y, (j, i)), out=out)
    return simplify(flatten_indices(nest)), [x, y, out, s0]


@pytest.mark.parametrize("cols", [4 * TILE, 4 * TILE + 5])
def test_tile_transposes_tiles_symbolic_extents_with_tails(cols):
    flat, params = symbolic_transposed_sum(cols)
    tiled = tile_transposes(flat)
    assert "y_tile" in text(tiled) and f"s0 / {TILE}" in text(tiled), text(tiled)
    # the sum reads y through its tile, at a constant stride
    sums = [s for s in walk(tiled) if isinstance(s, S.Store) and s.buf.name == "out"]
    assert any("y_tile[" in text(s) for s in sums), text(tiled)
    for rows in (0, 1, TILE - 1, 2 * TILE, 3 * TILE + 7):
        same_results(flat, insert_allocations(tiled, params[:3]), params,
                     lambda: [torch.randn(rows, cols), torch.randn(cols, rows),
                              torch.empty(rows, cols), rows])


def flip_next_to_a_reuse(x, d):
    a, _ = x.chunk(2, 0)
    return torch.div(a, d, rounding_mode="trunc"), torch.sqrt(torch.ceil(a.flip(0)))


@pytest.mark.parametrize("use_llvm", [True, False])
def test_reuse_outputs_keeps_a_temporary_a_fused_loop_reads_at_another_row(use_llvm):
    """Fuzzer seed 91989: `a` lived in the division's output, whose store shares a loop with
    the flip's read of `a[16 - i]`; the vector body overwrote what the tail then read."""
    import nncfuse

    x, d = torch.rand(33) * 3, torch.tensor(-2)
    f = nncfuse.jit(flip_next_to_a_reuse, min_group_size=1, use_llvm=use_llvm)
    f(x, d)
    for got, want in zip(f(x, d), flip_next_to_a_reuse(x, d)):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_tile_transposes_copies_no_tiles_beyond_their_memory_bound(monkeypatch):
    from nncfuse.tensorexpr.passes import tile_transposes as pass_module

    flat, _ = transposed_sum(8 * TILE)
    monkeypatch.setattr(pass_module, "MAX_TILE_BYTES", 8 * TILE * TILE * 4 - 1)
    tiled = tile_transposes(flat)
    assert tiled is not flat and "_tile" not in text(tiled), text(tiled)


def head_merge(heads, seq, dim):
    """out[s, h * dim + d] = x[h, s, d]: a reshape of a transposed tensor merging (h, d)."""
    x, out = buf("x", [heads, seq, dim]), buf("out", [seq, heads * dim])
    _, nest = compute("out", FLOAT32, [seq, heads * dim], lambda s, k: E.Load(
        x, (k / dim, s, k % dim)) * 2.0, out=out)
    return simplify(flatten_indices(nest)), [x, out]


def test_split_loops_splits_a_merged_dim_into_its_two_loops():
    flat, params = head_merge(4, 8, 64)
    assert "/ 64" in text(flat) and "% 64" in text(flat)
    split = split_loops(flat)
    loops = [line.strip() for line in text(split).splitlines() if "for" in line]
    assert loops[1:] == ["for (int64_t j_o = 0; j_o < 4; j_o++) {",
                         "for (int64_t j_i = 0; j_i < 64; j_i++) {"], text(split)
    assert "/" not in text(split) and "%" not in text(split)
    assert "x[512 * j_o + 64 * i + j_i]" in text(split), text(split)
    same_results(flat, split, params, lambda: [torch.randn(4, 8, 64), torch.empty(8, 256)])


def test_split_loops_leaves_short_divisors_and_other_loops():
    flat, _ = head_merge(4, 8, MIN_INNER // 2)  # an inner loop too short to vectorize
    assert split_loops(flat) is flat
    a, out = buf("a", [16, 64]), buf("out", [16, 64])
    _, nest = compute("out", FLOAT32, [16, 64], lambda i, j: E.Load(a, (i, j)) + 1.0, out=out)
    flat = simplify(flatten_indices(nest))
    assert split_loops(flat) is flat


def masked_softmax(x, mask):
    return torch.softmax(x + mask, -1)


def _masked_inputs(mask_shape, layout):
    x = torch.randn(2, 3, 8, 40) * 4
    x[0, 0, 0, :5] = torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0, 0.0])
    x[0, 1, 2] = -float("inf")  # a row of -inf: NaN, as eager
    x[1, 2, 3, 7] = float("inf")
    if layout == "transposed":
        x = x.transpose(1, 2).contiguous().transpose(1, 2)
    mask = torch.randn(mask_shape).masked_fill(torch.rand(mask_shape) < 0.3, -1e4)
    mask.view(-1)[1] = -float("inf")
    return x, mask


@pytest.mark.parametrize("use_llvm", [True, False])
@pytest.mark.parametrize("layout", ["contiguous", "transposed"])
@pytest.mark.parametrize("mask_shape", [(2, 1, 1, 40), (1, 1, 8, 40), (40,)],
                         ids=["padding", "causal", "row"])
def test_reuse_outputs_a_masked_softmax_adds_the_mask_into_its_output(
        mask_shape, layout, use_llvm):
    """`softmax(x + mask)`: the sum lives in the output, as the exponentials do (its first
    store reads the sum where it writes; the scaling after it stores in place, the same row),
    so the kernel allocates no temporary of the output's size."""
    import nncfuse
    from nncfuse.jit.fuser import runtime

    x, mask = _masked_inputs(mask_shape, layout)
    f = nncfuse.jit(masked_softmax, use_llvm=use_llvm)
    f(x, mask)
    torch.testing.assert_close(f(x, mask), masked_softmax(x, mask), equal_nan=True)
    [group] = nncfuse.fusion_groups(f.graph_for(x, mask))
    stmt = runtime.kernel_of(group).stmt
    big = [s for s in walk(stmt) if isinstance(s, S.Allocate)
           and all(isinstance(d, E.Imm) for d in s.buf.dims)
           and math.prod(d.value for d in s.buf.dims) >= x.numel()]
    assert not big, stmt
