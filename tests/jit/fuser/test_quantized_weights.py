"""Matrix products over int8 and packed int4 weights (weight-only quantization) as reductions
that read the quantized weight (`jit/fuser/quantized_weights.py`): the rewritten graph, and
eager's results, on hand-written graphs (no torchao needed) and on torchao's linears."""

import pytest
import torch

import nncfuse
from nncfuse.jit.fuser.quantized_weights import MAX_ROWS
from nncfuse.tensorexpr.capability import AVX2, AVX512, aten_capability

BACKENDS = [pytest.param(True, id="llvm"), pytest.param(False, id="interp")]


def linear_f32(x, w, s):
    return torch.mm(x, w.t().to(torch.float32)) * s


def linear_as_x(x, w, s):
    return torch.mm(x, w.t().to(x.dtype)) * s


def cast_then_t(x, w, s):
    return torch.mm(x, w.to(torch.float32).t()) * s


def _group_ops(f, *args):
    graph = f.graph_for(*args)
    groups = nncfuse.fusion_groups(graph)
    inside = [n.kind() for g in groups for n in g.g("Subgraph").nodes()]
    outside = [n.kind() for n in graph.nodes()]
    return inside, outside, graph


def _check(fn, x, w, s, use_llvm=True, rewritten=True, **tol):
    f = nncfuse.jit(fn, use_llvm=use_llvm)
    for _ in range(3):
        got = f(x, w, s)
        torch.testing.assert_close(got, fn(x, w, s), equal_nan=True, **tol)
    inside, outside, graph = _group_ops(f, x, w, s)
    assert ("aten::sum" in inside) == rewritten, graph
    assert ("aten::mm" in inside + outside) != rewritten, graph
    if rewritten:  # the int8 weight goes into the kernel: no float copy of it is made
        assert "aten::to" not in outside, graph


def _weights(n, k, dtype=torch.int8):
    lo, hi = (-128, 128) if dtype == torch.int8 else (0, 256)
    return torch.randint(lo, hi, (n, k), dtype=dtype), torch.rand(n) / 64


@pytest.mark.parametrize("use_llvm", BACKENDS)
@pytest.mark.parametrize("m,n,k", [(1, 37, 1000), (1, 64, 1), (3, 19, 129), (MAX_ROWS, 8, 70)])
def test_rows_as_dot_products(use_llvm, m, n, k):
    w, s = _weights(n, k)
    _check(linear_f32, torch.randn(m, k), w, s, use_llvm)


@pytest.mark.parametrize("fn", [linear_as_x, cast_then_t])
def test_spellings(fn):
    w, s = _weights(33, 65)
    _check(fn, torch.randn(1, 65), w, s)


def test_uquantized_weights():
    w, s = _weights(24, 100, torch.uint8)
    _check(linear_f32, torch.randn(2, 100), w, s)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_reduced_precision(dtype):
    """Products in float32, rounded once, as eager's GEMM accumulates: within a rounding of
    eager's result (the additions' order differs)."""
    w, s = _weights(40, 200)
    x, s = torch.randn(2, 200, dtype=dtype), s.to(dtype)
    _check(linear_as_x, x, w, s, atol=1e-2, rtol=1e-2)


def test_extremal_and_strided_inputs():
    w, s = _weights(16, 48)
    x = torch.randn(48, 2).t()  # not contiguous
    x[0, 3], x[1, 5], x[1, 7] = float("nan"), float("inf"), -0.0
    _check(linear_f32, x, w, s)
    _check(linear_f32, torch.full((1, 48), float("-inf")), w, s)


def test_zero_sizes():
    w, s = _weights(16, 0)
    _check(linear_f32, torch.randn(1, 0), w, s)
    w, s = _weights(16, 8)
    _check(linear_f32, torch.randn(0, 8), w, s)


def test_left_alone():
    """More rows than MAX_ROWS (a GEMM reuses the weight across rows), a weight whose K axis
    is strided, a float weight: the matrix product stays."""
    w, s = _weights(16, 48)
    _check(linear_f32, torch.randn(MAX_ROWS + 1, 48), w, s, rewritten=False)
    _check(linear_f32, torch.randn(1, 48), w.t().contiguous().t(), s, rewritten=False)
    _check(linear_f32, torch.randn(1, 48), w.float(), s, rewritten=False)


def _compiled_sums(config, rows, kind="aten::sum", **tol):
    """Through the backend, torchao's `config` on a two-linear MLP against eager, on `rows`
    rows: the count of `kind` nodes (reductions) in the fusion groups."""
    pytest.importorskip("torchao")
    from torchao.quantization import quantize_

    from nncfuse.backend import clear_compiled_graphs, compiled_graphs
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 384, bias=False), torch.nn.SiLU(),
                                torch.nn.Linear(384, 256)).eval()
    quantize_(model, config())
    torch._dynamo.reset()
    clear_compiled_graphs()
    compiled = torch.compile(model, backend="nncfuse")
    x = torch.randn(1, rows, 256)
    with torch.no_grad():
        for _ in range(3):
            torch.testing.assert_close(compiled(x), model(x), **tol)
    graphs = [g for c in compiled_graphs() for g in c.graphs()]
    kinds = [n.kind() for g in graphs for group in nncfuse.fusion_groups(g)
             for n in group.g("Subgraph").nodes()]
    return kinds.count(kind)


@pytest.mark.parametrize("rows", [1, 7])
def test_torchao_int8_weight_only(rows):
    def config():
        from torchao.quantization import Int8WeightOnlyConfig
        return Int8WeightOnlyConfig()
    assert (_compiled_sums(config, rows) == 2) == (rows <= MAX_ROWS)


@pytest.mark.parametrize("rows", [1, 40])
def test_torchao_int4_weight_only(rows):
    def config():
        from torchao.prototype.quantization.int4 import PrototypeInt4WeightOnlyConfig
        return PrototypeInt4WeightOnlyConfig(group_size=128, set_inductor_config=False)
    # (three sums a linear: the activations' sum per group, the products' sums per group over
    # both nibbles of the packed bytes, the groups' total; beyond MAX_ROWS rows, a GEMM per
    # nibble)
    kind = "aten::sum" if rows <= MAX_ROWS else "aten::mm"
    count = _compiled_sums(config, rows, kind, rtol=1e-4, atol=1e-4)
    assert count == 2 * (3 if rows <= MAX_ROWS else 2) * (aten_capability() in (AVX512, AVX2))


# -- int4: ATen's packed layout ----------------------------------------------------------------
def int4mm(x, p, sz):
    return torch.ops.aten._weight_int4pack_mm_for_cpu(x, p, 32, sz)


def _int4(n, k, group=32):
    """A weight of `n` rows packed by ATen, with scales and zero points per group of `k`."""
    q = torch.randint(0, 16, (n, k), dtype=torch.int32)
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1)
    sz = torch.stack([torch.rand(k // group, n) / 8, torch.randn(k // group, n) / 8], -1)
    return packed, sz


def _check_int4(x, p, sz, rewritten=True):
    f = nncfuse.jit(int4mm)
    for _ in range(3):
        torch.testing.assert_close(f(x, p, sz), int4mm(x, p, sz), equal_nan=True,
                                   rtol=1e-5, atol=1e-5)
    inside, outside, graph = _group_ops(f, x, p, sz)
    rewritten = rewritten and aten_capability() in (AVX512, AVX2)
    kind = "aten::sum" if x.shape[0] <= MAX_ROWS else "aten::mm"
    assert (kind in inside) == rewritten, graph
    assert ("aten::_weight_int4pack_mm_for_cpu" in outside) != rewritten, graph


@pytest.mark.parametrize("m,n,k", [(1, 64, 64), (3, 192, 96), (MAX_ROWS, 128, 32)])
def test_int4_rows_as_dot_products(m, n, k):
    p, sz = _int4(n, k)
    _check_int4(torch.randn(m, k), p, sz)


@pytest.mark.parametrize("m,n,k", [(MAX_ROWS + 1, 64, 64), (32, 192, 96), (100, 128, 32)])
def test_int4_rows_as_a_gemm_of_the_dequantized_weight(m, n, k):
    p, sz = _int4(n, k)
    _check_int4(torch.randn(m, k), p, sz)


@pytest.mark.parametrize("m", [4, MAX_ROWS + 1])
def test_int4_extremal_inputs(m):
    """Rows with a NaN, an infinity and -0.0, both infinities, a finite x whose products with
    the codes overflow: eager's results (factored, the sums of the second row would be NaN
    where eager's are infinite, the last row's infinite; eager's kernel runs instead)."""
    p, sz = _int4(64, 64)
    x = torch.randn(m, 64)
    x[0, 3], x[1, 5], x[1, 7] = float("nan"), float("inf"), -0.0
    x[2, 9], x[2, 50], x[-1, 40] = float("inf"), -float("inf"), 3e38
    _check_int4(x, p, sz)
    _check_int4(torch.zeros(m, 64), p, sz)


def test_int4_left_alone():
    """Rows of a block ATen packs otherwise (48 of 64), bfloat16 activations (ATen's kernel
    is vectorized for them): ATen's kernel runs."""
    p, sz = _int4(48, 64)
    _check_int4(torch.randn(1, 64), p, sz, rewritten=False)
    p, sz = _int4(64, 64)
    f = nncfuse.jit(int4mm)
    xb, szb = torch.randn(1, 64, dtype=torch.bfloat16), sz.bfloat16()
    for _ in range(3):
        torch.testing.assert_close(f(xb, p, szb), int4mm(xb, p, szb))
    assert "aten::sum" not in _group_ops(f, xb, p, szb)[0]
