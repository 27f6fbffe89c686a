"""inline_intermediates: a copy read several times is substituted into each read, where its
rows stay rows (Llama's rotary embedding copied the q and k GEMM outputs into transposed
temporaries and read each three times); a copy that moves its innermost dimension, or whose
source a later nest writes, stays."""

import torch

from nncfuse.tensorexpr import expr as E
from nncfuse.tensorexpr import stmt as S
from nncfuse.tensorexpr.dtype import FLOAT32
from nncfuse.tensorexpr.loopnest import compute
from nncfuse.tensorexpr.passes.inline import inline_intermediates
from nncfuse.tensorexpr.passes.insert_allocations import insert_allocations
from tests.tensorexpr.helpers import assert_expected_inline, buf, same_results, text


def _rotary(copy):
    """`tmp = copy(mm)` (2, 4, 8), then `out = tmp * c + rotate_half(tmp)`, reading tmp twice."""
    mm, c = buf("mm", [4, 16]), buf("c", [4, 8])
    tmp, s1 = compute("tmp", FLOAT32, [2, 4, 8], copy(mm))
    out, s2 = compute("out", FLOAT32, [2, 4, 8], lambda j, k, lane: (
        E.Load(tmp, (j, k, lane)) * E.Load(c, (k, lane))
        + E.Load(tmp, (j, k, (lane + 4) % 8))))
    return S.Block((s1, s2)), [mm, c, out]


def _run_both(prog, params, after):
    shapes = [tuple(int(d.value) for d in p.dims) for p in params]
    same_results(insert_allocations(prog, params=params), insert_allocations(after, params=params),
                 params, lambda: [torch.randn(s) for s in shapes])


def test_a_copy_that_keeps_its_rows_is_read_from_its_source():
    prog, params = _rotary(lambda mm: lambda j, k, lane: E.Load(mm, (k, j * 8 + lane)))
    after = inline_intermediates(prog, outputs=params[2:])
    assert_expected_inline(text(after), """\
{
  for (int64_t i = 0; i < 2; i++) {
    for (int64_t j = 0; j < 4; j++) {
      for (int64_t k = 0; k < 8; k++) {
        out[i, j, k] = mm[j, i * 8 + k] * c[j, k] + mm[j, i * 8 + (k + 4) % 8];
      }
    }
  }
}""")
    _run_both(prog, params, after)


def test_a_broadcast_copy_is_read_from_its_source():
    prog, params = _rotary(lambda mm: lambda j, k, lane: E.Load(mm, (k, lane)))
    after = inline_intermediates(prog, outputs=params[2:])
    assert "tmp" not in text(after)
    _run_both(prog, params, after)


def test_a_copy_that_transposes_its_innermost_dimension_stays():
    # tmp[j, k, lane] = mm[lane, ...]: read from mm, each vector of tmp would be a gather
    def copy(mm):
        return lambda j, k, lane: E.Load(mm, (lane % 4, k * 4 + j))
    prog, params = _rotary(copy)
    assert inline_intermediates(prog, outputs=params[2:]) is prog


def test_a_copy_whose_source_a_later_nest_writes_stays():
    prog, params = _rotary(lambda mm: lambda j, k, lane: E.Load(mm, (k, j * 8 + lane)))
    mm = params[0]
    _, write = compute("mm", FLOAT32, [4, 16], lambda k, n: E.Load(mm, (k, n)) * 2.0)
    write_back = S.Block((*prog.stmts[:1], _retarget(write, mm), *prog.stmts[1:]))
    after = inline_intermediates(write_back, outputs=params[2:])
    assert "tmp[" in text(after)


def _retarget(nest, target):
    """`nest`, a compute nest, storing into `target` instead of its own buffer."""
    if isinstance(nest, S.For):
        return S.For(nest.var, nest.start, nest.stop, _retarget(nest.body, target))
    if isinstance(nest, S.Block):
        return S.Block(tuple(_retarget(s, target) for s in nest.stmts))
    return S.Store(target, nest.indices, nest.value)


def _transposed_rotary(x, w, cos, sin):
    """Llama's q: a GEMM's output seen as (batch, heads, seq, dim), rotated."""
    q = (x @ w).view(1, 8, 2, 16).transpose(1, 2)
    rotated = torch.cat((-q[..., 8:], q[..., :8]), dim=-1)
    return q * cos + rotated * sin


def test_the_rotary_embedding_of_a_transposed_gemm_reads_the_gemm_output():
    import nncfuse
    from nncfuse.jit.fuser.runtime import kernel_of

    torch.manual_seed(0)
    x, w = torch.randn(8, 32), torch.randn(32, 32)
    cos, sin = torch.randn(8, 16).cos(), torch.randn(8, 16).sin()
    x[0, 0], x[1, 3] = float("nan"), -0.0
    f = nncfuse.jit(_transposed_rotary)
    for _ in range(3):
        got = f(x, w, cos, sin)
    torch.testing.assert_close(got, _transposed_rotary(x, w, cos, sin), equal_nan=True)
    groups = nncfuse.fusion_groups(f.graph_for(x, w, cos, sin))
    assert groups
    for g in groups:
        assert "Allocate(" not in str(kernel_of(g).stmt)  # no transposed copy of the GEMM

    def wide(t):
        return t.double().requires_grad_()
    args = (wide(torch.randn(8, 32)), wide(w), cos.double(), sin.double())
    assert torch.autograd.gradcheck(nncfuse.jit(_transposed_rotary), args)


def test_a_view_of_a_dense_input_is_read_from_its_source():
    """A view's index through the flat offset (`a / 16 * 16 + a % 16`: the int4 product's
    packed weight): one element per lane, however it is spelled, so no copy."""
    def view(mm):
        return lambda j, k, lane: E.Load(mm, ((j * 32 + k * 8 + lane) / 16,
                                              (j * 32 + k * 8 + lane) % 16))
    prog, params = _rotary(view)
    after = inline_intermediates(prog, outputs=params[2:])
    assert "tmp" not in text(after)
    _run_both(prog, params, after)
