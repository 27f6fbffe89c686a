"""GEMMs and convolutions in groups as external calls, with fused epilogues (issue 14)."""

import gc
import math
import warnings

import pytest
import torch
import torch.nn.functional as F

import nncfuse
from nncfuse.jit.fuser.runtime import kernel_of
from nncfuse.tensorexpr import stmt as S
from nncfuse.tensorexpr.buffer import Buf
from nncfuse.tensorexpr.dtype import FLOAT32
from nncfuse.tensorexpr.external import onednn_dtype_ok
from nncfuse.tensorexpr.ir_eval import IREvaluator
from nncfuse.tensorexpr.lowerings import external as lowering
from nncfuse.tensorexpr.lowerings.external import (
    ONEDNN_LINEAR_MANY_ROWS,
    ONEDNN_LINEAR_ROWS,
    ONEDNN_LINEAR_WEIGHT,
    ONEDNN_SGEMM_WORK,
    REUSED_GEMM_WORK,
    REUSED_SGEMM_WORK,
)

BACKENDS = [pytest.param(True, id="llvm"), pytest.param(False, id="interpreter")]


def linear_gelu(x, w, b):
    return F.gelu(F.linear(x, w, b))


def addmm_relu(b, x, w):
    return torch.relu(torch.addmm(b, x, w))


def conv_relu(x, w, b):
    return torch.relu(F.conv2d(x, w, b, 1, 1))


def depthwise_hardtanh(x, w):
    return F.hardtanh(F.conv2d(x, w, None, 1, 1, 1, 8), 0.0, 6.0)


def conv_silu(x, w, b):
    return F.silu(F.conv2d(x, w, b, 1, 1))


def conv_add_relu(x, w, b, r):
    return torch.relu(F.conv2d(x, w, b, 1, 1) + r)


def mm_tanh_scale(a, b):
    return torch.tanh(torch.mm(a, b)) * 2.0 + 1.0


def linear_silu_mul(x, w, b):
    return F.silu(F.linear(x, w, b)) * x[..., :16]


def inputs(name, n, dtype):
    def r(*shape):
        return torch.randn(*shape).to(dtype)

    return {
        "linear_gelu": lambda: (r(n, 32), r(16, 32), r(16)),
        "addmm_relu": lambda: (r(16), r(n, 32), r(32, 16)),
        "conv_relu": lambda: (r(n, 4, 10, 10), r(8, 4, 3, 3), r(8)),
        "conv_silu": lambda: (r(n, 4, 10, 10), r(8, 4, 3, 3), r(8)),
        "depthwise_hardtanh": lambda: (r(n, 8, 9, 9), r(8, 1, 3, 3)),
        "conv_add_relu": lambda: (r(n, 8, 6, 6), r(8, 8, 3, 3), r(8), r(n, 8, 6, 6)),
        "mm_tanh_scale": lambda: (r(n, 24), r(24, 8)),
        "linear_silu_mul": lambda: (r(n, 32), r(16, 32), r(16)),
    }[name]()


CASES = {f.__name__: f for f in (linear_gelu, addmm_relu, conv_relu, conv_silu,
                                 depthwise_hardtanh, conv_add_relu, mm_tanh_scale,
                                 linear_silu_mul)}
#: whose whole epilogue oneDNN computes (float32): the kernel has no loops (relu and hardtanh
#: are the loops': oneDNN's give 0 for NaN)
ONEDNN = {"linear_gelu", "conv_silu"}
#: float32 linears run MKL's GEMM (through ATen) and nncfuse's loops, not oneDNN's
MKL = torch._C.has_mkl


@pytest.fixture(autouse=True)
def mkl_sgemm_fast(monkeypatch):
    """These tests state an Intel CPU's choices (MKL's float32 GEMM where torch has MKL),
    whatever this one's; `test_float32_gemms_take_onednn_where_mkl_is_slow` the others'."""
    monkeypatch.setattr(lowering, "mkl_sgemm_fast", lambda: MKL)


def kernels(fused, *args):
    return [kernel_of(g) for g in nncfuse.fusion_groups(fused.graph_for(*args))]


def check(fn, args, use_llvm=True, dtype=torch.float32):
    fused = nncfuse.jit(fn, use_llvm=use_llvm)
    with torch.no_grad():
        for _ in range(3):
            got = fused(*args)
        want = fn(*args)
    tol = dict(rtol=2e-2, atol=5e-2) if dtype == torch.bfloat16 else dict(rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(got, want, equal_nan=True, **tol)
    for g, w in zip(*(t if isinstance(t, tuple) else (t,) for t in (got, want))):
        assert g.stride() == w.stride()
    (kernel,) = kernels(fused, *args)
    return kernel


@pytest.mark.parametrize("use_llvm", BACKENDS)
@pytest.mark.parametrize("n", [1, 4])
@pytest.mark.parametrize("name", CASES)
def test_matches_eager_float32(name, n, use_llvm):
    kernel = check(CASES[name], inputs(name, n, torch.float32), use_llvm)
    calls = [s for s in kernel.stmt.stmts if isinstance(s, S.ExternalCall)]
    assert len(calls) == 1
    # A float32 linear is ATen's (MKL), with nncfuse's epilogue: faster than oneDNN's.
    onednn = name in ONEDNN and not (name == "linear_gelu" and (MKL or n < ONEDNN_LINEAR_ROWS))
    # (a float32 convolution alone stays in eager's layout: `channels_last._chained`)
    if onednn and onednn_dtype_ok(torch.float32):
        assert calls[0].fn.startswith("nnc_mkldnn_") and len(kernel.stmt.stmts) == 1
    elif not onednn:
        assert len(kernel.stmt.stmts) > 1  # nncfuse's loops run the epilogue


def external_calls(kernel):
    return [s for s in kernel.stmt.stmts if isinstance(s, S.ExternalCall)]


@pytest.mark.skipif(MKL or not onednn_dtype_ok(torch.float32), reason="float32 GEMMs: MKL's")
@pytest.mark.parametrize("rows", [ONEDNN_LINEAR_ROWS - 1, ONEDNN_LINEAR_ROWS])
def test_linear_post_op_in_onednn_from_enough_rows_without_mkl(rows):
    kernel = check(linear_gelu, inputs("linear_gelu", rows, torch.float32))
    (call,) = external_calls(kernel)
    fused = rows >= ONEDNN_LINEAR_ROWS
    assert (call.fn == "nnc_mkldnn_linear_pointwise") == fused
    assert (len(kernel.stmt.stmts) == 1) == fused


@pytest.mark.skipif(not onednn_dtype_ok(torch.bfloat16), reason="oneDNN takes no bfloat16 here")
@pytest.mark.parametrize("rows", [1, ONEDNN_LINEAR_ROWS - 1, ONEDNN_LINEAR_ROWS])
def test_a_bfloat16_linear_is_onednns_with_its_post_op_where_the_work_pays(rows):
    kernel = check(linear_gelu, inputs("linear_gelu", rows, torch.bfloat16), dtype=torch.bfloat16)
    (call,) = external_calls(kernel)
    fused = rows * 16 * 32 >= REUSED_GEMM_WORK
    assert (call.fn == "nnc_mkldnn_linear_pointwise_reused") == fused
    assert (len(kernel.stmt.stmts) == 1) == fused


@pytest.mark.skipif(not MKL, reason="float32 GEMMs are MKL's only where torch has MKL")
@pytest.mark.parametrize("rows", [1, ONEDNN_LINEAR_ROWS, 128])
def test_float32_linear_is_atens_gemm_with_the_bias_added_by_the_loops(rows):
    kernel = check(linear_gelu, inputs("linear_gelu", rows, torch.float32))
    (call,) = external_calls(kernel)
    assert call.fn == "nnc_aten_linear" and call.args[2] is None  # no bias: the loops add it
    assert "t2[" in str(kernel.stmt)  # the loops read the bias


@pytest.mark.skipif(not MKL or not onednn_dtype_ok(torch.float32), reason="MKL and oneDNN")
@pytest.mark.parametrize("rows, n, onednn", [
    (ONEDNN_LINEAR_ROWS, ONEDNN_LINEAR_WEIGHT // 256, True),
    (ONEDNN_LINEAR_ROWS - 1, ONEDNN_LINEAR_WEIGHT // 256, False),
    (ONEDNN_LINEAR_ROWS, ONEDNN_LINEAR_WEIGHT // 256 - 1, False),
    (ONEDNN_LINEAR_MANY_ROWS, 64, True),  # many rows: oneDNN whatever the weight
    (ONEDNN_LINEAR_MANY_ROWS - 1, 64, False),
])
def test_a_float32_linear_of_a_large_weight_is_onednns_with_its_post_op(rows, n, onednn):
    x, w, b = torch.randn(rows, 256), torch.randn(n, 256) / 16, torch.randn(n)
    (call,) = external_calls(check(linear_gelu, (x, w, b)))
    assert (call.fn == "nnc_mkldnn_linear_pointwise") == onednn


def mm_relu(x, w):
    return torch.relu(torch.mm(x, w))


def linear_plain(x, w, b):
    return torch.sigmoid(F.linear(x, w, b))


def extremal(t):
    """`t` with NaN, +-Inf, -0.0, large, tiny and denormal values in its first rows."""
    t = t.clone()
    t[0, 0], t[0, 1], t[1, 2], t[2, :] = float("nan"), float("inf"), float("-inf"), -0.0
    t[3, 3], t[3, 4], t[4, 5], t[4, 6] = 1e30, -1e-30, 1e-40, -3e-42
    return t


@pytest.mark.skipif(not onednn_dtype_ok(torch.float32), reason="oneDNN takes no float32 here")
@pytest.mark.parametrize("use_llvm", BACKENDS)
@pytest.mark.parametrize("case, m, k, n, onednn", [
    ("mm", 128, 256, 256, True),
    ("mm", 128, 64, 64, False),  # too little work: oneDNN's fixed cost
    ("mm", 2048, 1024, 1, False),  # one column: MKL's
    ("mm", ONEDNN_LINEAR_ROWS - 1, 256, 1024, False),
    ("addmm", 128, 256, 256, True),  # the bias added by the loops
    ("linear", 128, 256, 256, True),
    ("mm_t", 128, 256, 256, True),  # backward layouts: transposed operands
    ("t_mm", 256, 128, 256, True),
])
def test_float32_gemms_take_onednn_where_mkl_is_slow(monkeypatch, case, m, k, n, onednn,
                                                     use_llvm):
    monkeypatch.setattr(lowering, "mkl_sgemm_fast", lambda: False)
    assert (min(m, k, n) >= ONEDNN_LINEAR_ROWS and m * k * n >= ONEDNN_SGEMM_WORK) == onednn
    x, w, b = extremal(torch.randn(m, k)), torch.randn(k, n) / 16, torch.randn(n)
    b[:3] = torch.tensor([float("inf"), -0.0, float("nan")])[:n]
    fn, args = {
        "mm": (mm_relu, (x, w)),
        "addmm": (addmm_relu, (b, x, w)),
        "linear": (linear_plain, (x, w.t().contiguous(), b)),
        "mm_t": (mm_relu, (x, torch.randn(n, k).t())),
        "t_mm": (mm_relu, (torch.randn(k, m).t(), w)),
    }[case]
    (call,) = external_calls(check(fn, args, use_llvm))
    # a linear's weight, which the next call may pass again: oneDNN's linear, which packs it
    # once it is, where that pays (REUSED_SGEMM_WORK)
    reused = onednn and case == "linear" and m * k * n >= REUSED_SGEMM_WORK
    routine = ("nnc_mkldnn_linear_pointwise_reused" if reused else
               "nnc_mkldnn_linear_pointwise" if case == "linear" else "nnc_mkldnn_mm")
    assert (call.fn == routine) == onednn
    if case in ("addmm", "linear") and not reused:
        assert onednn and call.args[2 if case == "linear" else 1] is not b  # loops add it


def addmm_scaled(b, x, w):
    return torch.relu(torch.addmm(b, x, w, beta=0.5))


def linear_twice(x, w, b):
    y = F.linear(x, w, b)
    return y, torch.sigmoid(y)


@pytest.mark.parametrize("use_llvm", BACKENDS)
@pytest.mark.parametrize("case, bias_shape, routine", [
    ("addmm", (16,), "nnc_aten_mm"),  # GPT-2's Conv1D: the bias added by the loops
    ("addmm", (1, 16), "nnc_aten_mm"),
    ("addmm", (4, 16), "nnc_aten_mm"),
    ("addmm", (4, 1), "nnc_aten_mm"),
    ("addmm_scaled", (16,), "nnc_aten_addmm"),  # beta 0.5: the routine scales the bias
    ("linear_twice", (16,), "nnc_aten_linear"),  # the sum is an output and read again
])
def test_a_bias_moves_into_the_loops_where_it_adds_as_eager(case, bias_shape, routine, use_llvm):
    fn = {"addmm": addmm_relu, "addmm_scaled": addmm_scaled, "linear_twice": linear_twice}[case]
    x, bias = torch.randn(4, 32), torch.randn(bias_shape)
    x[0, 0], x[1, :] = float("nan"), 0.0
    bias.view(-1)[0] = float("inf")
    bias.view(-1)[-1] = -0.0
    if case == "linear_twice":
        args = (x, torch.randn(16, 32), bias)
    else:
        args = (bias, x, torch.randn(32, 16))
    kernel = check(fn, args, use_llvm)  # NaN where eager's is, Inf, -0.0: as eager
    (call,) = external_calls(kernel)
    assert call.fn == routine
    fused = nncfuse.jit(fn, use_llvm=use_llvm)
    with torch.no_grad():
        got, want = [fused(*args) for _ in range(3)][-1], fn(*args)
    for g, w in zip(*(t if isinstance(t, tuple) else (t,) for t in (got, want))):
        numbers = ~w.isnan()
        assert torch.equal(g.signbit()[numbers], w.signbit()[numbers])  # -0.0 stays -0.0


@pytest.mark.parametrize("name", CASES)
def test_matches_eager_bfloat16(name):
    check(CASES[name], inputs(name, 2, torch.bfloat16), dtype=torch.bfloat16)


@pytest.mark.parametrize("name", ["linear_gelu", "conv_add_relu", "mm_tanh_scale"])
def test_float64_runs_aten_and_the_loops(name):
    kernel = check(CASES[name], inputs(name, 3, torch.float64))
    assert kernel.stmt.stmts[0].fn.startswith("nnc_aten_")  # oneDNN takes no float64


@pytest.mark.parametrize("use_llvm", BACKENDS)
def test_non_contiguous_inputs(use_llvm):
    x = torch.randn(32, 6).t()  # (6, 32), transposed
    check(linear_gelu, (x, torch.randn(16, 32), torch.randn(16)), use_llvm)
    xc = torch.randn(2, 4, 10, 10).to(memory_format=torch.channels_last)
    check(conv_relu, (xc, torch.randn(8, 4, 3, 3), torch.randn(8)), use_llvm)
    xs = torch.randn(2, 8, 12, 12)[:, :, ::2, 1:7]
    check(conv_add_relu, (xs, torch.randn(8, 8, 3, 3), torch.randn(8),
                          torch.randn(2, 8, 6, 6)), use_llvm)



@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_an_expanded_gemm_operand_compiles(dtype):
    # A broadcast input (stride 0) of an mm: the routine's trial operands are random values
    # over the memory it spans (copy_ refuses to write elements that share memory); the group
    # compiled to be the fused kernel, not left unfused by a failed trial (fuzzer seed 43130).
    def fn(x, w):
        return torch.nn.functional.gelu(torch.mm(x, w)) * 2.0

    fused = nncfuse.jit(fn)
    x, w = torch.randn(1, 7, dtype=dtype).expand(3, 7), torch.randn(7, 5, dtype=dtype)
    for _ in range(3):
        torch.testing.assert_close(fused(x, w), fn(x, w))
    assert fused.compile_failures == []
    assert nncfuse.fusion_groups(fused.graph_for(x, w))

class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(32, 16)
        self.conv = torch.nn.Conv2d(4, 4, 3, padding=1)

    def forward(self, x, y):
        return F.gelu(self.fc(x)) * 2.0, torch.relu(self.conv(y) + y)


@pytest.mark.parametrize("form", ["script", "trace"])
def test_a_parameter_changed_after_compiling_is_seen(form):
    model = MLP().eval()
    x, y = torch.randn(4, 32), torch.randn(2, 4, 6, 6)
    with torch.no_grad():
        module = torch.jit.script(model) if form == "script" else torch.jit.trace(model, (x, y))
        fused = nncfuse.jit(module)
        for _ in range(3):
            fused(x, y)
        assert nncfuse.fusion_groups(fused.graph_for(x, y))
        module.fc.weight.add_(1.0)  # in place, as an optimizer step does
        module.conv.bias.mul_(-2.0)
        got = fused(x, y)
        torch.testing.assert_close(got, module(x, y))
        state = {k: torch.randn_like(v) for k, v in model.state_dict().items()}
        module.load_state_dict(state)
        torch.testing.assert_close(fused(x, y), module(x, y))


def test_explain_counts_the_gemm_as_fused():
    args = inputs("mm_tanh_scale", 4, torch.float32)
    report = nncfuse.explain(mm_tanh_scale, *args)
    assert report.groups[0].ops[0] == "aten::mm"
    assert report.external == {} and report.coverage == 1.0
    assert report.fused_nodes == 4


def test_printed_stmt_shows_the_external_call():
    kernel = check(mm_tanh_scale, inputs("mm_tanh_scale", 4, torch.float32))
    text = str(kernel.stmt)
    assert text.splitlines()[1].strip() == 'ExternalCall(aten_mm, "nnc_aten_mm", {t0, t1}, {});'
    fused = check(linear_gelu, inputs("linear_gelu", ONEDNN_LINEAR_ROWS, torch.float32))
    if MKL:
        assert 'ExternalCall(aten_linear, "nnc_aten_linear", {t0, t1}, {None});' in str(
            fused.stmt)
    conv = check(conv_silu, inputs("conv_silu", 2, torch.float32))
    if onednn_dtype_ok(torch.float32):
        assert ('ExternalCall(aten_conv2d, "nnc_mkldnn_convolution_pointwise", '
                "{t0, t1, t2}, "
                "{(1, 1), (1, 1), (1, 1), 1, 'swish', (), None});") in str(conv.stmt)


@pytest.mark.parametrize("name", ["conv_relu", "depthwise_hardtanh", "conv_add_relu",
                                  "addmm_relu", "conv_silu", "linear_gelu"])
def test_nan_and_infinities_through_the_epilogue_as_eager(name):
    """A NaN or infinite pixel (or feature) through the external call and its activation:
    where eager's relu or hardtanh keeps a NaN, so does nncfuse (oneDNN's would give 0)."""
    args = inputs(name, 2, torch.float32)
    x = args[1] if name == "addmm_relu" else args[0]
    x.view(-1)[:4] = torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0])
    check(CASES[name], args)


def test_an_external_call_reads_group_inputs_only():
    def f(a, w):
        return torch.relu(torch.mm(torch.sigmoid(a) * 2.0, w)) + 1.0

    args = (torch.randn(4, 8), torch.randn(8, 8))
    fused = nncfuse.jit(f)
    for _ in range(3):
        torch.testing.assert_close(fused(*args), f(*args))
    ops = [[n.kind() for n in g.g("Subgraph").nodes() if n.kind() != "prim::Constant"]
           for g in nncfuse.fusion_groups(fused.graph_for(*args))]
    assert ops == [["aten::sigmoid", "aten::mul"], ["aten::mm", "aten::relu", "aten::add"]]


def test_the_interpreter_runs_an_external_call():
    x, w, o = (Buf.make(n, FLOAT32, s) for n, s in (("x", (4, 8)), ("w", (3, 8)), ("o", (4, 3))))
    stmt = S.Block((S.ExternalCall(o, "nnc_aten_linear", (x, w, None)),))
    line = str(stmt).splitlines()[1].strip()
    assert line == 'ExternalCall(o, "nnc_aten_linear", {x, w}, {None});'
    a, b, out = torch.randn(4, 8), torch.randn(3, 8), torch.empty(4, 3)
    IREvaluator(stmt, [x, w, o]).run([a, b, out])
    torch.testing.assert_close(out, F.linear(a, b))


class ConvBnRelu(torch.nn.Module):
    def __init__(self, affine=True):
        super().__init__()
        self.conv = torch.nn.Conv2d(8, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8, affine=affine)
        self.bn.running_mean.normal_()
        self.bn.running_var.uniform_(0.5, 2.0)
        if affine:
            self.bn.weight.data.normal_()
            self.bn.bias.data.normal_()

    def forward(self, x):
        return torch.relu(self.bn(self.conv(x)))


@pytest.mark.parametrize("use_llvm", BACKENDS)
@pytest.mark.parametrize("affine", [True, False])
@pytest.mark.parametrize("fold", [False, True])
def test_conv_batch_norm_relu_is_one_group(affine, use_llvm, fold, monkeypatch):
    import nncfuse.tensorexpr.lowerings.external as lowering

    monkeypatch.setattr(lowering, "FOLD_BATCH_NORM", fold)
    model = ConvBnRelu(affine).eval()
    x = torch.randn(2, 8, 10 + fold, 10)  # another shape: kernels are cached by their graph
    with torch.no_grad():
        fused = nncfuse.jit(torch.jit.trace(model, (x,)), use_llvm=use_llvm)
        for _ in range(3):
            got = fused(x)
        torch.testing.assert_close(got, model(x))
        (group,) = nncfuse.fusion_groups(fused.graph_for(x))
        ops = [n.kind() for n in group.g("Subgraph").nodes() if n.kind() != "prim::Constant"]
        # (and the result converted back from channels-last, where the layout is inside)
        assert ops in (["aten::_convolution", "aten::batch_norm", "aten::relu"],
                       ["aten::_convolution", "aten::batch_norm", "aten::relu",
                        "aten::contiguous"])
        (call,) = [s for s in kernel_of(group).stmt.stmts if isinstance(s, S.ExternalCall)]
        if fold and onednn_dtype_ok(torch.float32):  # batch norm in the weights, relu in loops
            assert call.fn == "nnc_mkldnn_convolution_bn_pointwise"
        model.bn.running_var.mul_(3.0)  # statistics are read at call time too
        torch.testing.assert_close(fused(x), model(x))


def batch_norm_fn(x, mean, var, w, b):
    return torch.relu(F.batch_norm(x, mean, var, w, b, False, 0.1, 1e-3)) + 1.0


def batch_norm_training(x, mean, var, w, b):
    return torch.relu(F.batch_norm(x, mean, var, w, b, True, 0.1, 1e-3)) + 1.0


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_batch_norm_inference_matches_eager(dtype):
    x = torch.randn(3, 5, 7, dtype=dtype)
    mean, w, b = (torch.randn(5, dtype=dtype) for _ in range(3))
    var = torch.rand(5, dtype=dtype) + 0.5
    fused = nncfuse.jit(batch_norm_fn)
    for _ in range(3):
        got = fused(x, mean, var, w, b)
    torch.testing.assert_close(got, batch_norm_fn(x, mean, var, w, b))
    ops = [n.kind() for g in nncfuse.fusion_groups(fused.graph_for(x, mean, var, w, b))
           for n in g.g("Subgraph").nodes()]
    assert "aten::batch_norm" in ops


def test_batch_norm_in_training_mode_does_not_fuse():
    x, mean, w, b = torch.randn(4, 3, 5), torch.zeros(3), torch.ones(3), torch.zeros(3)
    var = torch.ones(3)
    fused = nncfuse.jit(batch_norm_training)
    m2, v2 = mean.clone(), var.clone()
    for _ in range(3):
        got = fused(x, mean, var, w, b)
        want = batch_norm_training(x, m2, v2, w, b)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(mean, m2)  # the running statistics were updated alike


@pytest.mark.skipif(not torch._C.has_mkl, reason="no MKL packed GEMM here")
def test_mkls_packed_gemm_follows_the_weight_and_the_rows():
    from nncfuse.tensorexpr.external import ROUTINES

    linear, mm = ROUTINES["nnc_mkl_linear_packed"], ROUTINES["nnc_mkl_mm_packed"]
    w, b, wt = torch.randn(16, 32), torch.randn(16), torch.randn(32, 16)
    for rows in (3, 8, 1):  # a new row count packs again; the result is the same
        x = torch.randn(rows, 32)
        torch.testing.assert_close(linear(x, w, b), F.linear(x, w, b))
        torch.testing.assert_close(linear(x.view(1, rows, 32), w, None), F.linear(x, w)[None])
        torch.testing.assert_close(mm(x, wt), x @ wt)
    w.mul_(2.0)  # written in place: the version changed, packed again
    wt.copy_(torch.randn(32, 16))
    torch.testing.assert_close(linear(x, w, b), F.linear(x, w, b))
    torch.testing.assert_close(mm(x, wt), x @ wt)


@pytest.mark.parametrize("kind", ["aten::mm", "aten::bmm", "aten::addmm", "aten::matmul",
                                  "aten::linear"])
def test_a_gemm_routine_is_its_torch_binding_and_gives_the_ops_bits(kind):
    """The in-kernel GEMMs call the unboxed `torch` binding (cheaper than the OpOverload, most
    of all right after a GEMM has emptied the caches), with the node's operands in schema
    order (addmm's keyword-only beta and alpha by name), and give the OpOverload's result."""
    from nncfuse.tensorexpr.external import BINDINGS, ROUTINES, aten_op, aten_routine

    routine = ROUTINES[aten_routine(kind)]
    cells = [c.cell_contents for c in getattr(routine, "__closure__", None) or ()]
    assert routine is BINDINGS[kind] or BINDINGS[kind] in cells  # addmm: the keyword wrapper
    torch.manual_seed(0)
    x, w, b = torch.randn(7, 5), torch.randn(5, 3), torch.randn(3)
    operands = {
        "aten::mm": (x, w),
        "aten::bmm": (x[None].expand(2, 7, 5), w[None].expand(2, 5, 3)),
        "aten::addmm": (b, x, w, 0.5, 2.0),  # beta, alpha: keyword-only in the schema
        "aten::matmul": (x, w),
        "aten::linear": (x, w.t(), b),
    }[kind]
    got, want = routine(*operands), aten_op(kind)(*operands)
    assert torch.equal(got, want) and got.stride() == want.stride()


def weight_gradient(g, x):
    return torch.mm(g.t(), x)


def projection(b, x, w):
    return torch.addmm(b, x, w).view(2, 64, -1)


@pytest.mark.skipif(not onednn_dtype_ok(torch.float32), reason="oneDNN takes no float32 here")
@pytest.mark.parametrize("use_llvm", BACKENDS)
@pytest.mark.parametrize("mkl_fast", [False, True])
@pytest.mark.parametrize("case", ["weight_gradient", "projection", "small"])
def test_a_gemm_alone_is_a_kernel_where_onednn_beats_mkl(monkeypatch, case, mkl_fast, use_llvm):
    monkeypatch.setattr(lowering, "mkl_sgemm_fast", lambda: mkl_fast)
    fn, args = {
        "weight_gradient": (weight_gradient, (extremal(torch.randn(128, 256)),
                                              torch.randn(128, 256))),
        "projection": (projection, (torch.randn(256), extremal(torch.randn(128, 256)),
                                    torch.randn(256, 256))),
        "small": (weight_gradient, (torch.randn(64, 64), torch.randn(64, 64))),
    }[case]
    fused = nncfuse.jit(fn, use_llvm=use_llvm)
    for _ in range(3):
        got = fused(*args)
    want = fn(*args)
    torch.testing.assert_close(got, want, equal_nan=True, rtol=1e-4, atol=1e-4)
    assert got.stride() == want.stride() and (got._base is None) == (want._base is None)
    found = kernels(fused, *args)
    if mkl_fast or case == "small":
        assert found == []  # a library call alone: ATen's, unfused
    else:
        (kernel,) = found
        (call,) = external_calls(kernel)
        assert call.fn == "nnc_mkldnn_mm"


def test_a_reused_weight_is_packed_from_its_second_call_and_follows_its_updates():
    from nncfuse.tensorexpr import external

    packs = []

    def pack(t):
        packs.append(t)
        return t.clone()

    w = torch.randn(64, 32).bfloat16()
    assert external.reused_weight(w, ("geometry",), pack) is None  # (seen: not packed yet)
    packed = external.reused_weight(w, ("geometry",), pack)
    assert packed is not None and len(packs) == 1
    assert external.reused_weight(w, ("geometry",), pack) is packed and len(packs) == 1
    assert external.reused_weight(w, ("another",), pack) is None  # (another geometry)
    w.add_(1)  # (a new version: seen again, then packed again)
    assert external.reused_weight(w, ("geometry",), pack) is None
    assert external.reused_weight(w, ("geometry",), pack) is not None and len(packs) == 2
    torch.testing.assert_close(packs[-1], w, rtol=0, atol=0)
    w.data = torch.randn(64, 32).bfloat16()  # (new storage)
    assert external.reused_weight(w, ("geometry",), pack) is None
    for _ in range(3):  # a new tensor at every call is never packed
        assert external.reused_weight(torch.randn(8).bfloat16(), ("geometry",), pack) is None
    assert len(packs) == 2
    key = id(w)
    del w, packed
    assert key not in external._packed and key not in external._sightings  # (forgotten)


@pytest.mark.skipif(not onednn_dtype_ok(torch.bfloat16), reason="oneDNN takes no bfloat16 here")
@pytest.mark.parametrize("form", ["cast", "autocast"])
def test_bfloat16_weights_of_a_module_are_packed_and_their_updates_seen(form):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(4, 16, 3), torch.nn.SiLU(), torch.nn.Flatten(),
                                torch.nn.Linear(16 * 6 * 6, 64), torch.nn.GELU()).eval()
    x = torch.randn(2, 4, 8, 8)
    x[0, 0, 0, :4] = torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0])
    if form == "cast":
        model, x = model.to(torch.bfloat16), x.to(torch.bfloat16)
    from nncfuse.tensorexpr import external

    gc.collect()
    before = set(external._packed)
    fused = nncfuse.jit(model)
    for step in range(5):  # (a region each: eager's autocast keeps its copies within one)
        with torch.no_grad(), torch.autocast("cpu", torch.bfloat16, enabled=form == "autocast"):
            got, want = fused(x), model(x)
            calls = sorted(s.fn for k in kernels(fused, x) for s in external_calls(k))
        assert got.dtype == want.dtype == torch.bfloat16
        torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2, equal_nan=True)
        if step == 2:
            with torch.no_grad():
                model[0].weight.mul_(-1.5)
                model[3].weight.mul_(-1.5)
    assert calls == ["nnc_mkldnn_convolution_pointwise_reused",
                     "nnc_mkldnn_linear_pointwise_reused"]
    mine = set(external._packed) - before
    assert len(mine) == 2
    del fused, model  # (the packed forms go with the weights, and their cached copies)
    gc.collect()
    assert not mine & set(external._packed)


@pytest.mark.skipif(not onednn_dtype_ok(torch.bfloat16), reason="oneDNN takes no bfloat16 here")
@pytest.mark.parametrize("dtype", ["BFloat16", "Float"])
@pytest.mark.parametrize("rows", [1, 16])
def test_a_bfloat16_linear_alone_is_a_kernel_where_the_work_pays(dtype, rows):
    def typ(*sizes):
        strides = [math.prod(sizes[k + 1:]) for k in range(len(sizes))]
        return f"{dtype}({', '.join(map(str, sizes))}, strides={strides}, requires_grad=0, " \
               "device=cpu)"

    graph = torch._C.parse_ir(f"""graph(%x : {typ(rows, 32)}, %w : {typ(16, 32)}):
  %none : NoneType = prim::Constant()
  %y : {typ(rows, 16)} = aten::linear(%x, %w, %none)
  return (%y)""")
    (node,) = [n for n in graph.nodes() if n.kind() == "aten::linear"]
    assert lowering.onednn_gemm_alone(node) == (
        dtype == "BFloat16" and rows * 16 * 32 >= REUSED_GEMM_WORK)


@pytest.mark.skipif(not onednn_dtype_ok(torch.bfloat16), reason="oneDNN takes no bfloat16 here")
def test_a_linears_packed_weight_serves_every_row_count(monkeypatch):
    from nncfuse.tensorexpr import external

    packs = []
    pack = external._pack_linear
    monkeypatch.setattr(external, "_pack_linear",
                        lambda rows, w: packs.append(rows) or pack(rows, w))
    linear = external.ROUTINES["nnc_mkldnn_linear_pointwise_reused"]
    w, b = torch.randn(64, 32).bfloat16(), torch.randn(64).bfloat16()
    for rows in (32, 32, 1, 1, 32, 5):  # (a prefill, a decode, ...: packed once)
        x = torch.randn(rows, 32).bfloat16()
        torch.testing.assert_close(linear(x, w, b, "none", (), None), F.linear(x, w, b),
                                   rtol=0, atol=0)
    assert packs == [32]


@pytest.mark.parametrize("through", ["jit", "backend"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_weights_packed_under_inference_mode_too(through, dtype):
    # An inference tensor tracks no version: a cast made under inference mode is not one
    # (the cast cache makes its copies outside it), and one that is, is never packed.
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(4, 16, 3), torch.nn.SiLU(), torch.nn.Flatten(),
                                torch.nn.Linear(16 * 6 * 6, 64), torch.nn.GELU()).eval()
    x = torch.randn(2, 4, 8, 8)
    fn = nncfuse.jit(model) if through == "jit" else torch.compile(model, backend="nncfuse")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # (a fallback to the unfused graph warns)
        for _ in range(3):
            with torch.inference_mode(), torch.autocast("cpu", torch.bfloat16,
                                                        enabled=dtype == torch.bfloat16):
                got, want = fn(x), model(x)
            tol = 2e-2 if dtype == torch.bfloat16 else 1e-4
            torch.testing.assert_close(got, want, rtol=tol, atol=tol)
    with torch.inference_mode():
        made = torch.nn.Linear(64, 64).bfloat16()  # (inference tensors themselves)
        fused = nncfuse.jit(made)
        for _ in range(3):
            torch.testing.assert_close(fused(x.view(-1, 64)[:4].bfloat16()),
                                       made(x.view(-1, 64)[:4].bfloat16()), rtol=0, atol=0)
    torch._dynamo.reset()


@pytest.mark.skipif(not onednn_dtype_ok(torch.bfloat16), reason="oneDNN takes no bfloat16 here")
@pytest.mark.parametrize("fn", ["nnc_mkldnn_convolution_pointwise_reused",
                                "nnc_mkldnn_linear_pointwise_reused"])
def test_a_call_site_takes_its_packed_weight_at_once_until_the_weight_changes(fn, monkeypatch):
    from nncfuse.tensorexpr import external

    lookups = []
    reused = external.reused_weight
    monkeypatch.setattr(external, "reused_weight",
                        lambda *a: lookups.append(1) or reused(*a))
    conv = fn.startswith("nnc_mkldnn_convolution")
    site = external.site_routine(fn)

    def operands(x, w):
        if conv:
            return (x, w, None, (1, 1), (1, 1), (1, 1), 1, "none", (), None)
        return (x, w, None, "none", (), None)

    def expected(x, w):
        return F.conv2d(x, w, None, 1, 1) if conv else F.linear(x, w)

    def image(size):
        x = torch.randn(1, 8, size, size).bfloat16()
        return x.contiguous(memory_format=torch.channels_last) if conv else x.view(-1, 8)

    w = torch.randn(16, 8, 3, 3).bfloat16() if conv else torch.randn(16, 8).bfloat16()
    x = image(6)
    for step in range(9):
        if step == 4:
            w.mul_(-2)  # (in place: a new version)
        if step == 6:
            w = w.clone()  # (another tensor, equal)
        if step == 8 and conv:
            x = image(5)  # (another input size: another packed form)
        torch.testing.assert_close(site(*operands(x, w)), expected(x, w), rtol=2e-2, atol=2e-2)
    # looked up: the first two calls (seen, then packed), the two after the write, the two
    # for the new tensor, and a convolution's new input size; taken at once otherwise
    assert len(lookups) == (7 if conv else 6)
    packed = [v for t in external._packed.values() if t[0]() is w for v in t[1].values()]
    assert len(packed) == 1
    gone = __import__("weakref").ref(packed[0])
    del w, packed
    gc.collect()
    assert gone() is None  # (the site keeps it weakly: it goes with the weight)
