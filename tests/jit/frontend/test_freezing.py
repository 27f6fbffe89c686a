"""Frozen inference, `nncfuse.jit(module, freeze=True)` (issue 14): folded, fused, and
guarded so that a changed parameter is seen by the next call."""

import threading

import pytest
import torch
from torch import nn

import nncfuse
from nncfuse.jit.fuser.runtime import kernel_of
from nncfuse.tensorexpr import external
from nncfuse.tensorexpr import stmt as S
from nncfuse.tensorexpr.external import mkl_packed_ok, onednn_dtype_ok
from nncfuse.tensorexpr.lowerings import external as lowering


class ConvBnAct(nn.Module):
    def __init__(self, cin=8, cout=16, stride=1, groups=1, act=None):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, groups=groups)
        self.bn = nn.BatchNorm2d(cout)
        self.act = act or nn.ReLU()

    def forward(self, x):
        return self.act(self.bn(self.conv(x)))


class Block(nn.Module):
    """A residual block's tail: conv, batch norm, residual add, relu."""

    def __init__(self, c=8):
        super().__init__()
        self.conv = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(c)

    def forward(self, x):
        return torch.relu(self.bn(self.conv(x)) + x)


def _randomize_bn(module):
    with torch.no_grad():
        for m in module.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.normal_()
                m.running_var.uniform_(0.5, 2.0)
                m.weight.normal_()
                m.bias.normal_()
    return module


def _check(fn, module, x):
    with torch.no_grad():
        got, want = fn(x), module(x)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def _groups(fn, x):
    with torch.no_grad():
        return nncfuse.fusion_groups(fn.graph_for(x))


MODULES = [
    pytest.param(lambda: ConvBnAct(), id="conv_bn_relu"),
    pytest.param(lambda: ConvBnAct(8, 8, stride=2, groups=8, act=nn.Hardtanh(0.0, 6.0)),
                 id="dwconv_bn_hardtanh_stride2"),
    pytest.param(lambda: ConvBnAct(act=nn.Hardswish()), id="conv_bn_hardswish"),
    pytest.param(lambda: ConvBnAct(act=nn.SiLU()), id="conv_bn_silu"),
    pytest.param(lambda: Block(), id="conv_bn_add_relu"),
    pytest.param(lambda: nn.Sequential(nn.Linear(32, 64), nn.GELU()), id="linear_gelu"),
]


@pytest.mark.parametrize("make", MODULES)
def test_frozen_matches_eager_and_fuses_the_convolution(make):
    module = _randomize_bn(make()).eval()
    x = torch.randn(2, 32) if isinstance(module, nn.Sequential) else torch.randn(2, 8, 10, 10)
    fn = nncfuse.jit(module, freeze=True)
    for _ in range(3):
        _check(fn, module, x)
    groups = _groups(fn, x)
    assert groups, "the GEMM or convolution and its epilogue form a group"
    kinds = {n.kind() for g in groups for n in g.g("Subgraph").nodes()}
    assert kinds & {"aten::conv2d", "aten::linear", "aten::_convolution"}
    assert "aten::batch_norm" not in kinds  # folded into the convolution by freezing
    assert fn.freezes == 1
    with torch.no_grad():
        assert fn(x).stride() == module(x).stride()  # contiguous, as eager returns it


def test_frozen_convolutions_run_channels_last_with_packed_weights():
    module = _randomize_bn(nn.Sequential(ConvBnAct(8, 16), ConvBnAct(16, 16, groups=16),
                                         nn.Conv2d(16, 8, 1))).eval()
    x = torch.randn(2, 8, 10, 10)
    fn = nncfuse.jit(module, freeze=True)
    _check(fn, module, x)
    _check(fn, module, x)
    calls = [s.fn for g in _groups(fn, x) for s in kernel_of(g).stmt.stmts
             if isinstance(s, S.ExternalCall)]
    assert len(calls) == 3
    if onednn_dtype_ok(torch.float32):
        # The model's input is made channels-last once; each convolution's output stays so.
        assert calls == ["nnc_mkldnn_convolution_pointwise_packed"] * 3



class InvertedResidual(nn.Module):
    """MobileNetV2's block: expand 1x1 + relu6, depthwise 3x3 + relu6, project 1x1, add."""

    def __init__(self, c=8, hidden=24):
        super().__init__()
        self.expand = ConvBnAct(c, hidden, act=nn.ReLU6())
        self.expand.conv = nn.Conv2d(c, hidden, 1)
        self.depthwise = ConvBnAct(hidden, hidden, groups=hidden, act=nn.ReLU6())
        self.project = nn.Conv2d(hidden, c, 1)

    def forward(self, x):
        return x + self.project(self.depthwise(self.expand(x)))


def test_inverted_residual_is_oneDNN_calls_with_their_post_ops():
    module = _randomize_bn(nn.Sequential(nn.Conv2d(4, 8, 3, padding=1), InvertedResidual(),
                                         InvertedResidual())).eval()
    x = torch.randn(2, 4, 9, 9)
    fn = nncfuse.jit(module, freeze=True)
    _check(fn, module, x)
    _check(fn, module, x)
    kernels = [kernel_of(g) for g in _groups(fn, x)]
    calls = [s.fn for k in kernels for s in k.stmt.stmts if isinstance(s, S.ExternalCall)]
    assert len(calls) == 6  # the first convolution, of two users, is a group of one: unfused
    if onednn_dtype_ok(torch.float32):
        # expand + relu6, depthwise + relu6, project + the residual add: packed weights
        assert calls == ["nnc_mkldnn_convolution_pointwise_packed",
                         "nnc_mkldnn_convolution_pointwise_packed",
                         "nnc_mkldnn_convolution_pointwise_binary_packed"] * 2

class Conv1D(nn.Module):
    """GPT-2's projection: addmm of the bias, the input's rows and a (k, n) weight."""

    def __init__(self, nx=256, nf=256):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(nx, nf) / 16)
        self.bias = nn.Parameter(torch.randn(nf))

    def forward(self, x):
        y = torch.addmm(self.bias, x.view(-1, 256), self.weight).view(2, 8, 256)
        return torch.tanh(y) * 0.5


class MatmulSilu(nn.Module):
    def __init__(self, k=256, n=512):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(k, n) / 16)

    def forward(self, x):
        return torch.nn.functional.silu(torch.matmul(x, self.weight)) + 1.0


@pytest.mark.skipif(not mkl_packed_ok(torch.float32), reason="no MKL packed GEMM here")
@pytest.mark.parametrize("make, routine", [
    (lambda: nn.Sequential(nn.Linear(256, 256), nn.GELU()), "nnc_mkl_linear_packed"),
    (lambda: nn.Sequential(nn.Linear(256, 512, bias=False), nn.SiLU()), "nnc_mkl_linear_packed"),
    (Conv1D, "nnc_mkl_mm_packed"),
    (MatmulSilu, "nnc_mkl_mm_packed"),
    (lambda: nn.Sequential(nn.Linear(256, 255), nn.GELU()), "nnc_aten_linear"),  # too small
])
def test_frozen_linears_run_mkls_gemm_on_a_weight_packed_once(make, routine):
    module = make().eval()
    x = torch.randn(2, 8, 256)
    fn = nncfuse.jit(module, freeze=True)
    _check(fn, module, x)
    (group,) = _groups(fn, x)
    kernel = kernel_of(group)
    (call,) = [s for s in kernel.stmt.stmts if isinstance(s, S.ExternalCall)]
    assert call.fn == routine
    if not routine.endswith("_packed"):
        return
    weights = [t for _, t in kernel.lowered.constants if t.dim() == 2]
    assert len(weights) == 1 and id(weights[0]) in external._packed
    packed = next(iter(external._packed[id(weights[0])][1].values()))
    for _ in range(2):
        _check(fn, module, x)
    assert next(iter(external._packed[id(weights[0])][1].values())) is packed  # not repacked
    with torch.no_grad():  # an optimizer step: frozen again, packed again, as eager computes
        next(module.parameters()).mul_(-1.5)
    _check(fn, module, x)
    assert fn.freezes == 2


def test_scripted_conv2d_fuses_once_frozen():
    # Unfrozen, a scripted nn.Conv2d's weights, strides and padding are GetAttrs and list
    # constructs; frozen, they are constants and the convolution joins the group.
    module = nn.Sequential(nn.Conv2d(4, 8, 3, stride=(2, 1), padding=(1, 2)), nn.ReLU6()).eval()
    x = torch.randn(3, 4, 9, 11)
    fn = nncfuse.jit(torch.jit.script(module), freeze=True)
    _check(fn, module, x)
    assert len(_groups(fn, x)) == 1
    with torch.no_grad():
        report = nncfuse.explain(fn, x)
    # The convolution counts as fused; only the input's change to channels-last stays out.
    assert [g.ops for g in report.groups] == [("aten::conv2d", "aten::hardtanh",
                                               "aten::contiguous")]
    assert report.fused_nodes == 3 and report.external_nodes == 0
    assert [u.kind for u in report.unfused] == ["aten::contiguous"]


def test_two_frozen_modules_of_one_shape_keep_their_own_weights():
    # Their groups print alike (weights are `<Tensor>` constants): each needs its own kernel.
    a, b = _randomize_bn(ConvBnAct()).eval(), _randomize_bn(ConvBnAct()).eval()
    x = torch.randn(2, 8, 6, 6)
    fa, fb = nncfuse.jit(a, freeze=True), nncfuse.jit(b, freeze=True)
    for _ in range(3):
        _check(fa, a, x)
        _check(fb, b, x)


def test_freezing_leaves_the_module_as_it_was():
    module = _randomize_bn(ConvBnAct()).eval()
    before = {k: v.clone() for k, v in module.state_dict().items()}
    fn = nncfuse.jit(module, freeze=True)
    _check(fn, module, torch.randn(1, 8, 6, 6))
    for k, v in module.state_dict().items():
        assert torch.equal(v, before[k]), k
    assert not isinstance(module, torch.jit.ScriptModule) and not module.training


def _step(module):
    opt = torch.optim.SGD(module.parameters(), lr=0.5, momentum=0.9)
    for p in module.parameters():
        p.grad = torch.randn_like(p)
    opt.step()


def _load(module):
    other = _randomize_bn(type(module)()).eval()
    module.load_state_dict(other.state_dict())


def _data_copy(module):
    module.conv.weight.data.copy_(torch.randn_like(module.conv.weight))


def _new_parameter(module):
    module.conv.weight = nn.Parameter(torch.randn_like(module.conv.weight))


def _buffer(module):
    with torch.no_grad():
        module.bn.running_mean.add_(1.0)


@pytest.mark.parametrize("change,freeze", [
    (_step, True), (_load, True), (_new_parameter, True), (_buffer, True),
    (_step, "checked"), (_data_copy, "checked"),
], ids=["optimizer_step", "load_state_dict", "new_parameter", "buffer_in_place",
        "optimizer_step_checked", "data_copy_checked"])
def test_a_changed_parameter_is_seen_by_the_next_call(change, freeze):
    module = _randomize_bn(ConvBnAct()).eval()
    x = torch.randn(2, 8, 7, 7)
    fn = nncfuse.jit(module, freeze=freeze)
    _check(fn, module, x)
    _check(fn, module, x)
    with torch.no_grad():
        stale = fn(x).clone()
    change(module)
    _check(fn, module, x)
    with torch.no_grad():
        assert not torch.allclose(fn(x), stale)
    assert fn.freezes == 2
    _check(fn, module, x)
    assert fn.freezes == 2  # unchanged since: no freezing again


def test_only_checked_freezing_keeps_a_copy_of_the_parameters():
    module = _randomize_bn(ConvBnAct()).eval()
    x = torch.randn(2, 8, 7, 7)
    fast, checked = nncfuse.jit(module, freeze=True), nncfuse.jit(module, freeze="checked")
    _check(fast, module, x)
    _check(checked, module, x)
    assert fast._frozen.snapshot.values == ()
    assert len(checked._frozen.snapshot.values) == len(module.state_dict())


def test_training_mode_runs_unfrozen_and_updates_the_users_statistics():
    module = _randomize_bn(ConvBnAct())
    reference = _randomize_bn(ConvBnAct())
    reference.load_state_dict(module.state_dict())
    x = torch.randn(4, 8, 6, 6)
    fn = nncfuse.jit(module, freeze=True)
    for _ in range(2):
        with torch.no_grad():
            torch.testing.assert_close(fn(x), reference(x), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(module.bn.running_mean, reference.bn.running_mean)
    assert fn.freezes == 0
    module.eval()
    reference.eval()
    _check(fn, reference, x)
    assert fn.freezes == 1
    module.bn.train()  # a submodule back in training: unfrozen again
    with torch.no_grad():
        fn(x)
    assert fn.freezes == 1


def test_grad_mode_runs_unfrozen_so_gradients_reach_the_parameters():
    module = _randomize_bn(ConvBnAct()).eval()
    x = torch.randn(2, 8, 6, 6)
    fn = nncfuse.jit(module, freeze=True)
    fn(x).sum().backward()
    assert module.conv.weight.grad is not None
    grad = module.conv.weight.grad.clone()
    module.zero_grad()
    module(x).sum().backward()
    torch.testing.assert_close(grad, module.conv.weight.grad)


def test_frozen_nan_and_negative_zero_parameters_are_stable():
    module = ConvBnAct().eval()
    with torch.no_grad():
        module.conv.weight[0] = float("nan")
        module.conv.bias[1] = -0.0
    x = torch.randn(1, 8, 5, 5)
    fn = nncfuse.jit(module, freeze="checked")
    with torch.no_grad():
        for _ in range(3):
            torch.testing.assert_close(fn(x), module(x), equal_nan=True)
    assert fn.freezes == 1  # NaN equals itself bit for bit: no freezing on every call


def test_frozen_threads():
    module = _randomize_bn(ConvBnAct()).eval()
    x = torch.randn(2, 8, 6, 6)
    fn = nncfuse.jit(module, freeze=True)
    with torch.no_grad():
        want = module(x)
    errors = []

    def run():
        try:
            with torch.no_grad():
                for _ in range(5):
                    torch.testing.assert_close(fn(x), want, rtol=1e-4, atol=1e-4)
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert fn.freezes == 1


def test_freeze_option_is_checked():
    with pytest.raises(ValueError):
        nncfuse.jit(ConvBnAct(), freeze="sometimes")


class PadConv(nn.Module):
    """MobileNetV2's TensorFlow padding in transformers: F.pad, then an unpadded conv."""

    def __init__(self, pad, value=0.0, stride=1):
        super().__init__()
        self.pad, self.value = pad, value
        self.conv = nn.Conv2d(8, 8, 3, stride=stride, groups=8)

    def forward(self, x):
        return torch.relu(self.conv(torch.nn.functional.pad(x, self.pad, value=self.value)))


@pytest.mark.parametrize("pad,value,stride,folded", [
    ((1, 1, 1, 1), 0.0, 1, True),
    ((2, 2, 1, 1), 0.0, 1, True),
    ((0, 1, 0, 1), 0.0, 2, False),  # asymmetric: stays a pad
    ((1, 1, 1, 1), 1.0, 1, False),  # not zero
    ((1, 1, 1, 1), -0.0, 1, False),
])
def test_a_symmetric_zero_pad_becomes_the_convolutions_padding(pad, value, stride, folded):
    module = PadConv(pad, value, stride).eval()
    x = torch.randn(2, 8, 10, 10)
    fn = nncfuse.jit(module, freeze=True)
    _check(fn, module, x)
    _check(fn, module, x)
    with torch.no_grad():
        graph = fn.graph_for(x)
    nodes = [n.kind() for n in graph.nodes()]
    nodes += [n.kind() for g in nncfuse.fusion_groups(graph) for n in g.g("Subgraph").nodes()]
    assert ("aten::pad" in nodes) != folded


class Unscriptable(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(4, 4, 3)

    def forward(self, x):
        return torch.relu(self.conv(x)) * len({id(x)})  # a set: TorchScript has none


def test_a_module_torchscript_cannot_freeze_runs_unfrozen_with_a_warning():
    module = Unscriptable().eval()
    x = torch.randn(1, 4, 6, 6)
    fn = nncfuse.jit(module, freeze=True)
    with pytest.warns(UserWarning, match="cannot"):
        _check(fn, module, x)
    assert fn.freezes == 0


def _scripted(module, x):
    return torch.jit.script(module)


def _traced(module, x):
    with torch.no_grad():
        return torch.jit.trace(module, (x,))


@pytest.mark.parametrize("wrap", [_scripted, _traced], ids=["scripted", "traced"])
@pytest.mark.parametrize("change", [_step, _load, _buffer],
                         ids=["optimizer_step", "load_state_dict", "buffer_in_place"])
def test_a_script_modules_changed_parameter_is_seen(wrap, change):
    x = torch.randn(2, 8, 7, 7)
    module = _randomize_bn(ConvBnAct()).eval()
    script = wrap(module, x)
    fn = nncfuse.jit(script, freeze=True)
    _check(fn, script, x)
    _check(fn, script, x)
    if change is _load:
        script.load_state_dict(_randomize_bn(ConvBnAct()).state_dict())
    else:
        change(script)
    _check(fn, script, x)
    assert fn.freezes == 2


def test_a_scripted_submodule_in_training_runs_unfrozen():
    x = torch.randn(4, 8, 6, 6)
    module = _randomize_bn(ConvBnAct()).eval()
    script, reference = torch.jit.script(module), torch.jit.script(module)
    fn = nncfuse.jit(script, freeze=True)
    _check(fn, script, x)
    script.bn.train()  # its batch norm now uses the batch's statistics, and updates its own
    reference.bn.train()
    with torch.no_grad():
        torch.testing.assert_close(fn(x), reference(x), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(script.bn.running_mean, reference.bn.running_mean)
    assert fn.freezes == 1


@pytest.mark.skipif(not mkl_packed_ok(torch.float32) or not onednn_dtype_ok(torch.float32),
                    reason="MKL's packed GEMM and oneDNN")
@pytest.mark.parametrize("make, routine", [  # (the constant weight packed at its 2nd call)
    (lambda: nn.Sequential(nn.Linear(256, 256), nn.GELU()), "nnc_mkldnn_linear_pointwise_reused"),
    (lambda: nn.Sequential(nn.Linear(256, 512, bias=False), nn.SiLU()),
     "nnc_mkldnn_linear_pointwise_reused"),
])
def test_frozen_linears_run_onednns_gemm_where_mkls_is_slow(monkeypatch, make, routine):
    monkeypatch.setattr(lowering, "mkl_sgemm_fast", lambda: False)
    module = make().eval()
    x = torch.randn(2, 64, 256)
    fn = nncfuse.jit(module, freeze=True)
    _check(fn, module, x)
    (group,) = _groups(fn, x)
    (call,) = [s for s in kernel_of(group).stmt.stmts if isinstance(s, S.ExternalCall)]
    assert call.fn == routine
