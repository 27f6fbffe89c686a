"""Each schedule pass: its text before and after on a small nest, and same interpreter results."""

from collections.abc import Callable

import torch

from nncfuse.tensorexpr import expr as E
from nncfuse.tensorexpr import stmt as S
from nncfuse.tensorexpr.buffer import Buf
from nncfuse.tensorexpr.dtype import FLOAT32, INT64
from nncfuse.tensorexpr.ir_visitor import walk
from nncfuse.tensorexpr.loopnest import as_block, compute
from nncfuse.tensorexpr.passes.collapse_loops import collapse_loops
from nncfuse.tensorexpr.passes.cse import eliminate_common_subexpressions
from nncfuse.tensorexpr.passes.dead_stores import eliminate_dead_stores
from nncfuse.tensorexpr.passes.flatten_indices import flatten_indices
from nncfuse.tensorexpr.passes.fuse_loops import fuse_loops
from nncfuse.tensorexpr.passes.hoist_loads import hoist_loads
from nncfuse.tensorexpr.passes.inline import inline_intermediates
from nncfuse.tensorexpr.passes.insert_allocations import insert_allocations
from nncfuse.tensorexpr.passes.simplify import simplify
from nncfuse.tensorexpr.passes.vectorize import vectorize_inner_loops
from tests.tensorexpr.helpers import assert_expected_inline, buf, same_results, text, var


def seed_program(n=4, m=8):
    """The walkthrough's mul -> sin -> mul as three compute nests."""
    t0 = buf("t0", [n, m])
    mul, s1 = compute(
        "aten_mul", FLOAT32, [n, m], lambda i, j: E.Load(t0, (i, j)) * E.Load(t0, (i, j))
    )
    sin, s2 = compute("aten_sin", FLOAT32, [n, m], lambda i, j: E.call("sin", E.Load(mul, (i, j))))
    out, s3 = compute(
        "aten_mul_1", FLOAT32, [n, m], lambda i, j: E.Load(sin, (i, j)) * E.Load(sin, (i, j))
    )
    return t0, out, S.Block((s1, s2, s3))


def rand_args(*shapes):
    return lambda: [torch.randn(s if isinstance(s, tuple) else (s,)) for s in shapes]


def test_inline_substitutes_single_uses_only():
    t0, out, prog = seed_program()
    after = inline_intermediates(prog, outputs=[out])
    # aten_mul, read once, is substituted; aten_sin, read twice, stays a nest of its own.
    assert_expected_inline(text(after), """\
{
  for (int64_t i = 0; i < 4; i++) {
    for (int64_t j = 0; j < 8; j++) {
      aten_sin[i, j] = sin(t0[i, j] * t0[i, j]);
    }
  }
  for (int64_t i_1 = 0; i_1 < 4; i_1++) {
    for (int64_t j_1 = 0; j_1 < 8; j_1++) {
      aten_mul_1[i_1, j_1] = aten_sin[i_1, j_1] * aten_sin[i_1, j_1];
    }
  }
}""")
    aten_sin = next(s.buf for s in walk(after) if isinstance(s, S.Store))
    before = insert_allocations(prog, params=[t0, out])
    same_results(before, insert_allocations(after, params=[t0, out]), [t0, out],
                 rand_args((4, 8), (4, 8)))
    assert aten_sin.name == "aten_sin"


def test_repeated_reads_stay_linear_and_end_as_lets():
    """lerp(x, x, x) nested: each value read three times. Substituting would grow the
    expression exponentially; fusing, forwarding and dropping dead stores keeps it linear."""
    x = buf("x", [16])
    prev, nests = x, []
    for k in range(12):
        src = prev
        b, nest = compute(f"t{k}", FLOAT32, [16], lambda i, src=src: (
            E.Load(src, (i,)) * E.Load(src, (i,)) - E.Load(src, (i,))))
        nests.append(nest)
        prev = b
    prog = S.Block(tuple(nests))
    stmt = inline_intermediates(prog, outputs=[prev])
    stmt = eliminate_common_subexpressions(fuse_loops(simplify(stmt)))
    stmt = eliminate_dead_stores(stmt, params=[x, prev])
    assert len(text(stmt).splitlines()) < 40  # linear in the chain's length
    assert text(stmt).count("for (") == 1 and "t3[" not in text(stmt)
    before = insert_allocations(prog, params=[x, prev])
    same_results(before, stmt, [x, prev], rand_args(16, 16))


def test_fuse_loops_sinks_a_nest_past_independent_ones():
    x, b = buf("x", [4, 8]), buf("b", [8])
    p, s1 = compute("p", FLOAT32, [4, 8], lambda i, j: E.Load(x, (i, j)) * 2.0)
    q, s2 = compute("q", FLOAT32, [8], lambda j: E.call("exp", E.Load(b, (j,))))
    o, s3 = compute("o", FLOAT32, [4, 8], lambda i, j: E.Load(p, (i, j)) * E.Load(q, (j,))
                    + E.Load(p, (i, j)))
    fused = fuse_loops(S.Block((s1, s2, s3)))
    nests = as_block(fused).stmts
    assert len(nests) == 2 and "q[" in text(nests[0]) and "p[i, j] = " in text(nests[1])
    same_results(S.Block((s1, s2, s3)), fused, [x, b, p, q, o],
                 rand_args((4, 8), 8, (4, 8), 8, (4, 8)))


def test_dead_stores_and_lets_are_dropped():
    x, tmp, out = buf("x", [8]), buf("tmp", [8]), buf("out", [8])
    i, v, w = var(), E.Var("v", FLOAT32), E.Var("w", FLOAT32)
    body = S.Block((
        S.Let(v, E.call("sin", E.Load(x, (i,)))),
        S.Let(w, E.Load(x, (i,)) * 3.0),
        S.Store(tmp, (i,), v),
        S.Store(out, (i,), v * v),
    ))
    after = eliminate_dead_stores(S.For(i, E.imm(0), E.imm(8), body), params=[x, out])
    assert_expected_inline(text(after), """\
for (int64_t i = 0; i < 8; i++) {
  float v = sin(x[i]);
  out[i] = v * v;
}""")


def test_inline_keeps_expensive_values_that_a_broadcast_reuses():
    b, a = buf("b", [8]), buf("a", [4, 8])
    e, s1 = compute("e", FLOAT32, [8], lambda j: E.call("exp", E.Load(b, (j,))))
    out, s2 = compute("out", FLOAT32, [4, 8], lambda i, j: E.Load(e, (j,)) * E.Load(a, (i, j)))
    prog = S.Block((s1, s2))
    assert inline_intermediates(prog, outputs=[out]) is prog
    cheap, s1c = compute("c", FLOAT32, [8], lambda j: E.Load(b, (j,)) * 2.0)
    out2, s2c = compute(
        "out", FLOAT32, [4, 8], lambda i, j: E.Load(cheap, (j,)) * E.Load(a, (i, j))
    )
    assert "c[" not in text(inline_intermediates(S.Block((s1c, s2c)), outputs=[out2]))


def test_fuse_loops_merges_same_space_elementwise_nests():
    x = buf("x", [4, 8])
    y, s1 = compute("y", FLOAT32, [4, 8], lambda i, j: E.call("sin", E.Load(x, (i, j))))
    z, s2 = compute("z", FLOAT32, [4, 8], lambda i, j: E.Load(y, (i, j)) * 2.0)
    fused = fuse_loops(S.Block((s1, s2)))
    assert text(fused).count("for (") == 2
    assert "y[i, j] = sin(x[i, j]);" in text(fused) and "z[i, j] = y[i, j] * 2.f;" in text(fused)
    same_results(S.Block((s1, s2)), fused, [x, y, z], rand_args((4, 8), (4, 8), (4, 8)))


def test_fuse_loops_refuses_reads_of_other_iterations():
    x = buf("x", [8])
    y, s1 = compute("y", FLOAT32, [8], lambda i: E.Load(x, (i,)))
    z, s2 = compute("z", FLOAT32, [8], lambda i: E.Load(y, (E.imm(7) - i,)))
    prog = S.Block((s1, s2))
    assert fuse_loops(prog) is prog


def _group_stats_then_output(channel: Callable[[E.Expr], E.Expr]) -> tuple[S.Block, list[Buf]]:
    """A group norm's shape: a sum per (sample, group of 2 channels), then every element
    reads its group's sum at `channel(c)`."""
    x = buf("x", [2, 6, 4])

    def total(b: E.Expr, g: E.Expr) -> E.Expr:
        r, s = E.Var("r"), E.Var("s")
        return E.Reduce("Add", E.imm(0.0, FLOAT32), E.Load(x, (b, 2 * g + r, s)), (r, s),
                        (E.imm(2), E.imm(4)))

    m, s1 = compute("m", FLOAT32, [2, 3], total)
    out, s2 = compute("out", FLOAT32, [2, 6, 4],
                      lambda b, c, k: E.Load(x, (b, c, k)) - E.Load(m, (b, channel(c))))
    return S.Block((s1, s2)), [x, m, out]


def test_fuse_loops_splits_a_loop_to_sweep_each_group_once():
    prog, bufs = _group_stats_then_output(lambda c: c / 2)
    fused = fuse_loops(prog)
    assert_expected_inline(text(fused), """\
{
  for (int64_t i = 0; i < 2; i++) {
    for (int64_t j = 0; j < 3; j++) {
      m[i, j] = reduce_add(0.f, x[i, 2 * j + r, s] for r < 2, s < 4);
      for (int64_t j_i = 0; j_i < 2; j_i++) {
        for (int64_t k = 0; k < 4; k++) {
          out[i, 2 * j + j_i, k] = x[i, 2 * j + j_i, k] - m[i, j];
        }
      }
    }
  }
}""")
    same_results(prog, fused, bufs, rand_args((2, 6, 4), (2, 3), (2, 6, 4)))
    # A group read at another channel than the loop's own (c % 3): not one group per row.
    other, _ = _group_stats_then_output(lambda c: c % 3)
    assert fuse_loops(other) is other


def test_cse_forwards_stores_and_binds_repeats():
    x = buf("x", [16])
    i = var()
    y, z = buf("y", [16]), buf("z", [16])
    body = S.Block(
        (
            S.Store(y, (i,), E.call("sin", E.Load(x, (i,)) * E.Load(x, (i,)))),
            S.Store(z, (i,), E.Load(y, (i,)) * E.Load(y, (i,))),
        )
    )
    prog = S.For(i, E.imm(0), E.imm(16), body)
    after = eliminate_common_subexpressions(prog)
    assert_expected_inline(text(after), """\
for (int64_t i = 0; i < 16; i++) {
  float v = x[i];
  float v_1 = sin(v * v);
  y[i] = v_1;
  z[i] = v_1 * v_1;
}""")
    same_results(prog, after, [x, y, z], rand_args(16, 16, 16))



def test_cse_leaves_the_branches_of_a_select_that_reduces():
    # Bound before the select, the row's sum would run for every row, not only for the rows
    # whose condition fails (codegen runs only the branch taken); the condition is shared.
    x, c = buf("x", [4, 8]), buf("c", [4])
    y, z = buf("y", [4]), buf("z", [4])
    i, r = var(), var("r")

    def row_sum() -> E.Expr:
        return E.reduce("Add", E.Load(x, (i, r)), [(r, 8)])

    cond = E.cmp(">", E.Load(c, (i,)), E.imm(0.0, FLOAT32))
    prog = S.For(i, E.imm(0), E.imm(4), S.Block((
        S.Store(y, (i,), E.select(cond, E.Load(c, (i,)), row_sum())),
        S.Store(z, (i,), E.select(cond, E.imm(1.0, FLOAT32), row_sum() * row_sum())),
    )))
    after = eliminate_common_subexpressions(prog)
    assert_expected_inline(text(after), """\
for (int64_t i = 0; i < 4; i++) {
  bool v = c[i] > 0.f;
  y[i] = v ? c[i] : reduce_add(-0.f, x[i, r] for r < 8);
  z[i] = v ? 1.f : reduce_add(-0.f, x[i, r] for r < 8) * reduce_add(-0.f, x[i, r] for r < 8);
}""")
    same_results(prog, after, [x, c, y, z], rand_args((4, 8), 4, 4, 4))


def test_cse_returns_a_loop_with_nothing_to_share_itself():
    x, y = buf("x", [16]), buf("y", [16])
    i = var()
    prog = S.For(i, E.imm(0), E.imm(16), S.Store(y, (i,), E.call("sin", E.Load(x, (i,)))))
    assert eliminate_common_subexpressions(prog) is prog

def test_flatten_indices_uses_strides_and_broadcasts():
    a = buf("a", [8, 4], strides=[1, 8])  # a transposed input
    b = buf("b", [4])
    out, nest = compute("out", FLOAT32, [8, 4], lambda i, j: E.Load(a, (i, j)) + E.Load(b, (j,)))
    flat = simplify(flatten_indices(nest))
    assert "out[4 * i + j] = a[i + 8 * j] + b[j];" in text(flat)
    same_results(
        nest, flat, [a, b, out], lambda: [torch.randn(4, 8).t(), torch.randn(4), torch.empty(8, 4)]
    )


def test_collapse_loops_only_when_dense():
    a, out = buf("a", [16, 8]), buf("out", [16, 8])
    _, nest = compute("out", FLOAT32, [16, 8], lambda i, j: E.Load(a, (i, j)) * 2.0, out=out)
    flat = simplify(flatten_indices(nest))
    collapsed = collapse_loops(flat)
    assert text(collapsed).splitlines()[0] == "for (int64_t i = 0; i < 128; i++) {"
    assert "out[i] = a[i] * 2.f;" in text(collapsed)
    same_results(flat, collapsed, [a, out], rand_args((16, 8), (16, 8)))
    bias = buf("bias", [8])
    _, bnest = compute("out", FLOAT32, [16, 8], lambda i, j: E.Load(bias, (j,)) * 2.0, out=out)
    bflat = simplify(flatten_indices(bnest))
    assert collapse_loops(bflat) is bflat


def test_vectorize_splits_main_and_tail():
    a, out = buf("a", [100]), buf("out", [100])
    _, nest = compute(
        "out", FLOAT32, [100], lambda i: E.call("exp", E.Load(a, (i,))) * 2.0, out=out
    )
    flat = simplify(flatten_indices(nest))
    vec = simplify(vectorize_inner_loops(flat, vector_bits=512))
    lines = text(vec).splitlines()
    assert lines[1] == "  for (int64_t i = 0; i < 6; i++) {"
    assert "out[Ramp(16 * i, 1, 16)] = exp(a[Ramp(16 * i, 1, 16)]) * Broadcast(2.f, 16);" in text(
        vec
    )
    assert "for (int64_t i_1 = 96; i_1 < 100; i_1++) {" in text(vec)
    same_results(flat, vec, [a, out], rand_args(100, 100))


def test_vectorize_lanes_follow_the_widest_type_and_gathers_strided():
    a = buf("a", [32], dtype=E.Dtype("float64"))
    out = buf("out", [16], dtype=E.Dtype("float64"))
    i = var()
    nest = S.For(i, E.imm(0), E.imm(16), S.Store(out, (i,), E.Load(a, (i * 2,))))
    vec = simplify(vectorize_inner_loops(nest, vector_bits=512))
    assert "a[Ramp(16 * i, 2, 8)]" in text(vec)
    same_results(
        nest,
        vec,
        [a, out],
        lambda: [torch.randn(32, dtype=torch.float64), torch.zeros(16, dtype=torch.float64)],
    )


def test_vectorize_leaves_loop_invariant_stores_scalar():
    out, a = buf("out", [1]), buf("a", [8])
    i = var()
    nest = S.For(i, E.imm(0), E.imm(16), S.Store(out, (E.imm(0),), E.Load(a, (i,))))
    assert vectorize_inner_loops(nest) is nest


def test_insert_allocations_brackets_temporaries():
    b, a = buf("b", [8]), buf("a", [4, 8])
    e, s1 = compute("e", FLOAT32, [8], lambda j: E.call("exp", E.Load(b, (j,))))
    out, s2 = compute("out", FLOAT32, [4, 8], lambda i, j: E.Load(e, (j,)) * E.Load(a, (i, j)))
    lines = text(insert_allocations(S.Block((s1, s2)), params=[a, b, out])).splitlines()
    assert lines[1] == "  Allocate(e, float, {8});"
    assert lines[-2] == "  Free(e);"


def test_simplify_rules():
    i, j = var("i"), var("j")
    x = E.Var("x", FLOAT32)
    assert text(simplify((E.imm(1.0, FLOAT32) + E.imm(2.0, FLOAT32)) * x)) == "3.f * x"
    assert text(simplify(x + 0.0)) == "x + 0.f"  # would turn -0. into +0.
    assert text(simplify(x + (-0.0))) == "x"
    assert text(simplify(x * 1.0)) == "x"
    assert text(simplify((i * 4 + 1) * 2 + j - 2)) == "8 * i + j"
    loop = S.For(
        i,
        E.imm(0),
        E.imm(4),
        S.For(
            j, E.imm(0), E.imm(3), S.Store(buf("o", [64]), ((j * 4 + i) / 4 + (j * 4 + i) % 4,), x)
        ),
    )
    assert "o[j + i] = x;" in text(simplify(loop))
    assert (
        text(simplify(S.For(i, E.imm(0), E.imm(1), S.Store(buf("o", [1]), (i,), x)))) == "o[0] = x;"
    )
    assert text(simplify(S.For(i, E.imm(0), E.imm(0), S.Store(buf("o", [1]), (i,), x)))) == "{\n}"


def test_simplify_folds_with_interpreter_semantics():
    assert simplify(E.imm(-7, INT64) / E.imm(2, INT64)).value == -3  # truncation
    assert simplify(E.imm(-7, INT64) % E.imm(2, INT64)).value == -1
    nan = E.imm(float("nan"), FLOAT32)
    assert str(simplify(E.Max(E.imm(1.0, FLOAT32), nan))) == "NAN"


def test_parallelize_marks_only_large_outer_loops():
    from nncfuse.tensorexpr.passes.parallelize import parallelize_outer_loops

    a, out = buf("a", [1 << 16]), buf("out", [1 << 16])
    _, nest = compute("out", FLOAT32, [1 << 16], lambda i: E.call("sin", E.Load(a, (i,))), out=out)
    big = parallelize_outer_loops(S.Block((nest,)), grain=1000)
    assert "/* parallel */" in text(big)
    assert parallelize_outer_loops(S.Block((nest,)), grain=10**9) == S.Block((nest,))


def test_collapse_loops_ignores_float_division():
    a, out = buf("a", [16, 8]), buf("out", [16, 8])
    _, nest = compute("out", FLOAT32, [16, 8], lambda i, j: 1.0 / E.Load(a, (i, j)), out=out)
    collapsed = collapse_loops(simplify(flatten_indices(nest)))
    assert text(collapsed).splitlines()[0] == "for (int64_t i = 0; i < 128; i++) {"


def _row_program(stop=4, write_mean=False):
    """`out[i, j] = x[i, j] - mean[i]` after `mean[i] = x[i, 0]`; with `write_mean`, the
    inner loop also stores into a view of `mean`."""
    x, mean, out = buf("x", [12]), buf("mean", [3]), buf("out", [12])
    i, j = var("i"), var("j")
    inner = [S.Store(out, (i * 4 + j,), E.Load(x, (i * 4 + j,)) - E.Load(mean, (i,)))]
    if write_mean:
        view = Buf("mean_view", FLOAT32, mean.dims, mean.strides, base=mean)
        inner.append(S.Store(view, (i,), E.Load(x, (i * 4 + j,))))
    body = S.Block((S.Store(mean, (i,), E.Load(x, (i * 4,))),
                    S.For(j, E.imm(0), E.imm(stop) if isinstance(stop, int) else stop,
                          S.Block(tuple(inner)))))
    return x, mean, out, S.For(i, E.imm(0), E.imm(3), body)


def test_hoist_loads_reads_a_row_statistic_once_per_row():
    x, mean, out, prog = _row_program()
    after = hoist_loads(prog)
    assert_expected_inline(text(after), """\
for (int64_t i = 0; i < 3; i++) {
  mean[i] = x[i * 4];
  {
    float mean_0 = mean[i];
    for (int64_t j = 0; j < 4; j++) {
      out[i * 4 + j] = x[i * 4 + j] - mean_0;
    }
  }
}""")
    same_results(prog, after, [x, mean, out], rand_args(12, 3, 12))


def test_hoist_loads_leaves_loads_of_what_the_loop_writes_or_may_not_run():
    _, _, _, prog = _row_program(write_mean=True)
    assert hoist_loads(prog) is prog  # the loop stores into the buffer's memory
    _, _, _, prog = _row_program(stop=0)
    assert hoist_loads(prog) is prog  # no iteration: the load may be out of bounds
    _, _, _, prog = _row_program(stop=E.Var("n"))
    assert hoist_loads(prog) is prog  # a symbolic extent may be 0
