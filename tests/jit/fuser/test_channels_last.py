"""bfloat16 convolutions and the layout-keeping ops after them typed channels-last inside the
optimized graph: results, and the strides of what the graph returns, are eager's; a weight's
channels-last copy is made once per version; float32 ones only in inference (module weights
that autograd does not track); channels-last inputs are left alone."""

import pytest
import torch
from torch import nn

import nncfuse
from nncfuse.jit.fuser import cast_cache
from nncfuse.jit.fuser.runtime import kernel_of
from nncfuse.tensorexpr import stmt as S
from nncfuse.tensorexpr.external import onednn_dtype_ok


class _Block(nn.Module):
    """Convolutions (3x3, depthwise, 1x1), batch norm, a zero pad, a residual add, a max pool,
    and a reader that does not keep the layout (a flatten)."""

    def __init__(self, c: int = 8):
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(3, c, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(c)
        self.dw = nn.Conv2d(c, c, 3, groups=c)
        self.pw = nn.Conv2d(c, c, 1)
        with torch.no_grad():
            self.bn.running_mean.uniform_(-1, 1)
            self.bn.running_var.uniform_(0.5, 2)

    def forward(self, x):
        y = torch.relu(self.bn(self.conv(x)))
        z = self.dw(nn.functional.pad(y, [1, 1, 1, 1]))
        z = nn.functional.hardtanh(self.pw(z) + y, 0.0, 6.0)
        return nn.functional.max_pool2d(z, 2), z.flatten(1)


def _fused(model, x):
    with torch.no_grad():
        return nncfuse.jit(torch.jit.trace(model, x, check_trace=False))


def _kinds(graph) -> list[str]:
    kinds = [n.kind() for n in graph.nodes()]
    for g in nncfuse.fusion_groups(graph):
        kinds += [n.kind() for n in g.g("Subgraph").nodes()]
    return kinds


def _as_eager(results, expected, tol):
    for r, e in zip(results, expected):
        assert r.dtype == e.dtype and r.stride() == e.stride()
        torch.testing.assert_close(r, e, rtol=tol, atol=tol, equal_nan=True)


@pytest.mark.parametrize("mode", ["autocast", "cast"])
def test_bfloat16_convolutions_run_channels_last_and_return_eagers_layout(mode):
    model = _Block().eval()
    x = torch.randn(2, 3, 10, 10)
    x[0, 0, 0, :4] = torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0])
    if mode == "cast":
        model, x = model.to(torch.bfloat16), x.to(torch.bfloat16)
    fused = _fused(model, x)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=mode == "autocast"):
        for _ in range(3):
            _as_eager(fused(x), model(x), 2e-2)
        graph = fused.graph_for(x)
    kinds = _kinds(graph)
    # (the 3x3's weight: the depthwise and 1x1 weights are laid out channels-last already)
    assert kinds.count("nncfuse::channels_last_weight") == 1
    # conversions only at the edges: the input, the max pool's result, the flatten's operand
    # (the zero pad, batch norm, activations and the add keep the layout)
    assert kinds.count("aten::contiguous") == 3, kinds
    nodes = [*graph.nodes(), *(n for g in nncfuse.fusion_groups(graph)
                               for n in g.g("Subgraph").nodes())]
    convs = [n for n in nodes if n.kind() in ("aten::conv2d", "aten::_convolution")]
    assert len(convs) == 3
    for conv in convs:
        strides = conv.output().type().strides()
        assert strides[1] == 1, strides  # (NHWC: the channel dim is the innermost)


def test_float32_convolutions_of_module_weights_go_channels_last_in_inference_only():
    model = _Block().eval()
    x = torch.randn(2, 3, 10, 10)
    x[0, 0, 0, :4] = torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0])
    fused = _fused(model, x)
    with torch.no_grad():
        for _ in range(3):
            _as_eager(fused(x), model(x), 1e-4)
        graph = fused.graph_for(x)
    kinds = _kinds(graph)
    assert kinds.count("nncfuse::channels_last_weight") == 1 and "aten::contiguous" in kinds
    calls = [s.fn for g in nncfuse.fusion_groups(graph)
             for s in kernel_of(g).stmt.stmts if isinstance(s, S.ExternalCall)]
    if onednn_dtype_ok(torch.float32):  # (the weights taken packed from the second call)
        assert calls and all(fn.endswith("_reused") for fn in calls), calls
    # where autograd tracks the weights (a training step's graph), the layout stays eager's
    traced = _fused(model, x)
    for _ in range(3):
        _as_eager(traced(x), model(x), 1e-4)
    assert "nncfuse::channels_last_weight" not in _kinds(traced.graph_for(x))


def test_channels_last_inputs_are_left_alone():
    model = _Block().eval().to(torch.bfloat16)
    nhwc = torch.randn(2, 3, 10, 10).to(torch.bfloat16).contiguous(
        memory_format=torch.channels_last)
    fused = _fused(model, nhwc)
    with torch.no_grad():
        for _ in range(3):
            _as_eager(fused(nhwc), model(nhwc), 2e-2)
        graph = fused.graph_for(nhwc)
    assert "aten::contiguous" not in [n.kind() for n in graph.nodes()]


def test_a_weight_updated_in_place_between_calls_is_seen():
    model = _Block().eval().to(torch.bfloat16)
    x = torch.randn(2, 3, 10, 10, dtype=torch.bfloat16)
    fused = _fused(model, x)
    with torch.no_grad():
        for _ in range(4):
            _as_eager(fused(x), model(x), 2e-2)
            model.pw.weight.mul_(-1.5)


def test_a_weights_channels_last_copy_is_made_once_per_version():
    weight = nn.Parameter(torch.randn(4, 3, 3, 3))
    with torch.no_grad():
        first = cast_cache.cached_channels_last(weight)
        assert first.is_contiguous(memory_format=torch.channels_last)
        assert cast_cache.cached_channels_last(weight) is first
        weight.add_(1)
        second = cast_cache.cached_channels_last(weight)
        assert second is not first
        torch.testing.assert_close(second, weight.detach(), rtol=0, atol=0)
    with torch.enable_grad():  # (autograd tracks it: a fresh copy, which it differentiates)
        assert cast_cache.cached_channels_last(weight).requires_grad


@pytest.mark.parametrize("mode", ["autocast", "cast"])
def test_the_backends_convolutions_too(mode):
    torch._dynamo.reset()
    model = _Block().eval()
    x = torch.randn(2, 3, 10, 10)
    if mode == "cast":
        model, x = model.to(torch.bfloat16), x.to(torch.bfloat16)
    compiled = torch.compile(model, backend="nncfuse")
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=mode == "autocast"):
        for _ in range(3):
            _as_eager(compiled(x), model(x), 2e-2)
    torch._dynamo.reset()


def test_float16_only_ungrouped_convolutions_go_channels_last():
    model = _Block().eval()
    x = torch.randn(2, 3, 10, 10)
    fused = _fused(model, x)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.float16):
        for _ in range(3):
            _as_eager(fused(x), model(x), 2e-2)
        graph = fused.graph_for(x)
    nodes = [*graph.nodes(), *(n for g in nncfuse.fusion_groups(graph)
                               for n in g.g("Subgraph").nodes())]
    layouts = sorted((n.inputsAt(8 if n.kind() != "aten::conv2d" else 6).toIValue(),
                      n.output().type().strides()[1] == 1) for n in nodes
                     if n.kind() in ("aten::conv2d", "aten::_convolution"))
    assert layouts == [(1, True), (1, True), (8, False)]  # ((groups, channels-last))


def _ir_type(dtype: str, sizes: tuple[int, ...]) -> str:
    """TorchScript IR's complete type of a contiguous tensor."""
    strides = [1] * len(sizes)
    for k in range(len(sizes) - 2, -1, -1):
        strides[k] = strides[k + 1] * sizes[k + 1]
    return (f"{dtype}({', '.join(map(str, sizes))}, strides={strides}, requires_grad=0, "
            "device=cpu)")


def test_a_max_pool_with_indices_keeps_the_layout_of_both_its_outputs():
    """AOTAutograd's max pool (values and indices): both typed channels-last after a bfloat16
    convolution; a reader of the indices that keeps no layout reads them converted back."""
    from nncfuse.jit.fuser.channels_last import convolutions_to_channels_last
    x, w = _ir_type("BFloat16", (1, 4, 8, 8)), _ir_type("BFloat16", (8, 4, 3, 3))
    c, p = _ir_type("BFloat16", (1, 8, 8, 8)), _ir_type("BFloat16", (1, 8, 4, 4))
    i, f = _ir_type("Long", (1, 8, 4, 4)), _ir_type("Long", (1, 128))
    graph = torch._C.parse_ir(f"""
      graph(%x : {x}, %w : {w}):
        %none : NoneType = prim::Constant()
        %one : int = prim::Constant[value=1]()
        %two : int = prim::Constant[value=2]()
        %false : bool = prim::Constant[value=0]()
        %s : int[] = prim::ListConstruct(%one, %one)
        %k : int[] = prim::ListConstruct(%two, %two)
        %c : {c} = aten::convolution(%x, %w, %none, %s, %s, %s, %false, %s, %one)
        %p : {p}, %i : {i} = aten::max_pool2d_with_indices(%c, %k, %k, %s, %s, %false)
        %r : {p} = aten::relu(%p)
        %f : {f} = aten::flatten(%i, %one, %two)
        return (%r, %f)""")
    assert convolutions_to_channels_last(graph) == 1
    pool = next(n for n in graph.nodes() if n.kind() == "aten::max_pool2d_with_indices")
    assert pool.inputsAt(0).node().kind() == "aten::convolution"  # (no conversion between)
    assert [v.type().strides() for v in pool.outputs()] == [[128, 1, 32, 8]] * 2
    relu = next(n for n in graph.nodes() if n.kind() == "aten::relu")
    assert relu.output().type().strides() == [128, 1, 32, 8]
    flatten = next(n for n in graph.nodes() if n.kind() == "aten::flatten")
    back = flatten.inputsAt(0).node()
    assert back.kind() == "aten::contiguous" and back.output().type().strides() == [128, 16, 4, 1]


def test_small_float32_1x1_convolutions_take_atens_routine_on_one_thread():
    """A float32 1x1 convolution of a small weight, few rows, one thread: ATen's own routine
    (eager's choice there, and the faster) and the loops, in NCHW; the chained 3x3s after it
    stay oneDNN's, channels-last, their weights packed."""
    from nncfuse.tensorexpr.external import NATIVE_1X1_WEIGHT, native_conv_faster
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert native_conv_faster(1, (1, 1), (1, 1), (1, 1), 32 * 64, 16 * 16)
        assert not native_conv_faster(1, (1, 1), (1, 1), (1, 1), NATIVE_1X1_WEIGHT, 4)
        assert not native_conv_faster(1, (1, 1), (1, 1), (1, 1), 24 * 144, 56 * 56)  # (work)
        assert not native_conv_faster(1, (3, 3), (1, 1), (1, 1), 32 * 64, 16 * 16)
        assert not native_conv_faster(1, (1, 1), (2, 2), (1, 1), 32 * 64, 16 * 16)
        assert not native_conv_faster(16, (1, 1), (1, 1), (1, 1), 32 * 64, 16 * 16)
        torch.manual_seed(0)
        model = nn.Sequential(nn.Conv2d(8, 16, 1), nn.BatchNorm2d(16), nn.ReLU6(),
                              nn.Conv2d(16, 16, 3, padding=1), nn.ReLU(),
                              nn.Conv2d(16, 16, 3, padding=1), nn.ReLU()).eval()
        x = torch.randn(1, 8, 12, 12)
        x[0, 0, 0, :4] = torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0])
        fused = _fused(model, x)
        with torch.no_grad():
            for _ in range(3):
                _as_eager([fused(x)], [model(x)], 1e-4)
            graph = fused.graph_for(x)
        calls = [s.fn for g in nncfuse.fusion_groups(graph)
                 for s in kernel_of(g).stmt.stmts if isinstance(s, S.ExternalCall)]
        assert len(calls) == 3 and "mkldnn" not in calls[0], calls
        if onednn_dtype_ok(torch.float32):
            assert all(c.startswith("nnc_mkldnn_convolution_pointwise") for c in calls[1:])
            assert _kinds(graph).count("nncfuse::channels_last_weight") == 2
    finally:
        torch.set_num_threads(threads)


def test_a_float32_convolution_alone_stays_nchw():
    """A float32 convolution that no other retyped one feeds or reads would pay both
    conversions for itself: it stays in eager's layout (a reduced-precision one does not)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(8, 8, 3, groups=8, padding=1), nn.Hardtanh(0, 6)).eval()
    x = torch.randn(2, 8, 10, 10)
    for dtype, expected in ((torch.float32, 0), (torch.bfloat16, 1)):
        m, xs = model.to(dtype), x.to(dtype)
        fused = _fused(m, xs)
        with torch.no_grad():
            for _ in range(3):
                _as_eager([fused(xs)], [m(xs)], 1e-4 if dtype == torch.float32 else 2e-2)
            kinds = _kinds(fused.graph_for(xs))
        assert kinds.count("aten::contiguous") == 2 * expected, (dtype, kinds)
