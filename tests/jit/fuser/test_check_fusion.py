"""Scripted modules' shape checks inside fusion groups (`tensorexpr/shape_checks.py`): a
convolution and the batch norm after it fuse through BatchNorm2d's `_check_input_dim`, and a
bad input raises eager's error, from the check that raises it in eager."""

import pytest
import torch
from torch import nn

import nncfuse
from nncfuse.tensorexpr import shape_checks


def conv_bn_relu():
    torch.manual_seed(0)
    m = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU()).eval()
    bn = m[1]
    with torch.no_grad():  # statistics and affine parameters that are not the identity
        bn.running_mean.uniform_(-1, 1)
        bn.running_var.uniform_(0.5, 2)
        bn.weight.uniform_(-1, 1)
        bn.bias.uniform_(-1, 1)
    return m


def compiled(model, x, **options):
    f = nncfuse.jit(model, **options)
    with torch.no_grad():
        for _ in range(3):
            f(x)
    return f


@pytest.fixture(autouse=True)
def _inference():
    """Inference: without grad mode, the parameters' gradients take the training path."""
    with torch.no_grad():
        yield


def group_kinds(group):
    return [n.kind() for n in group.g("Subgraph").nodes() if n.kind() != "prim::Constant"]


def error_of(fn, x):
    with torch.no_grad(), pytest.raises(Exception) as info:
        fn(x)
    return info.type, str(info.value).strip().splitlines()[-1]


def test_scripted_conv_batch_norm_relu_is_one_group():
    m = conv_bn_relu()
    x = torch.randn(2, 3, 16, 16)
    f = compiled(m, x)
    groups = nncfuse.fusion_groups(f.graph_for(x))
    assert len(groups) == 1
    kinds = group_kinds(groups[0])
    assert kinds.index("aten::conv2d") < kinds.index("prim::If") < kinds.index("aten::batch_norm")
    assert "aten::relu" in kinds
    report = str(nncfuse.explain(f, x))
    assert "; 0 external" in report.splitlines()[0]  # no convolution left outside
    assert "conv2d batch_norm relu" in report


def _inputs():
    special = torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0, 0.0, 1e30])
    return {
        "random": torch.randn(2, 3, 16, 16),
        "extremal": special.repeat(2 * 3 * 8 * 8 // 6).reshape(2, 3, 8, 8),
        "non-contiguous": torch.randn(2, 3, 16, 32)[..., ::2],
        "channels-last": torch.randn(2, 3, 16, 16).to(memory_format=torch.channels_last),
        "empty batch": torch.randn(0, 3, 16, 16),
    }


@pytest.mark.parametrize("name", list(_inputs()))
def test_fused_checks_compute_as_eager(name):
    m = conv_bn_relu()
    x = _inputs()[name]
    f = compiled(m, x)
    assert len(nncfuse.fusion_groups(f.graph_for(x))) == 1
    with torch.no_grad():
        got, want = f(x), m(x)
    torch.testing.assert_close(got, want, equal_nan=True)
    assert got.stride() == want.stride()


@pytest.mark.parametrize("shape", [(3, 16, 16), (1, 1, 3, 16, 16)])
@pytest.mark.parametrize("compiled_first", [False, True])
def test_wrong_rank_raises_eagers_error(shape, compiled_first):
    """A 3-d input passes the convolution (unbatched) and fails the batch norm's check; a 5-d
    one fails the convolution. Eager's error either way, before and after the kernel."""
    m = conv_bn_relu()
    bad = torch.randn(shape)
    f = nncfuse.jit(m)
    if compiled_first:
        f = compiled(m, torch.randn(2, 3, 16, 16))
        assert len(nncfuse.fusion_groups(f.graph_for(torch.randn(2, 3, 16, 16)))) == 1
    assert error_of(f, bad) == error_of(m, bad)


@pytest.mark.parametrize("shape", [(3, 16, 16), (1, 1, 3, 16, 16)])
def test_wrong_rank_raises_torchscripts_error_for_a_script(shape):
    """A ScriptModule keeps TorchScript's error: the one the check (or the convolution)
    raises in an unoptimized run, not the batch norm's, which would come first if the check
    had moved after it."""
    m = conv_bn_relu()
    bad = torch.randn(shape)
    with torch.jit.optimized_execution(False):  # the graph as written
        want = error_of(torch.jit.script(m), bad)
    f = compiled(torch.jit.script(m), torch.randn(2, 3, 16, 16))
    assert error_of(f, bad) == want
    assert "expected 4D input" in want[1] or "conv2d" in want[1]


class SizeChecked(nn.Module):
    """A check of sizes with `or`: a `prim::If` of bools in the condition."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3)
        self.bn = nn.BatchNorm2d(8)

    def forward(self, x):
        y = self.conv(x)
        if y.size(1) != 8 or y.size(-1) < 4:
            raise ValueError(f"too small: {y.size(-1)}")
        return torch.relu(self.bn(y))


def test_size_check_fails_after_the_kernel_is_compiled():
    m = SizeChecked().eval()
    x = torch.randn(2, 3, 16, 16)
    f = compiled(m, x)
    (group,) = nncfuse.fusion_groups(f.graph_for(x))
    assert sum(map(shape_checks.is_check, group.g("Subgraph").nodes())) == 2
    with torch.no_grad():
        torch.testing.assert_close(f(x), m(x))
    small = torch.randn(2, 3, 5, 5)  # the conv's output is 3 wide
    assert error_of(f, small) == error_of(m, small) == (ValueError, "too small: 3")
    with torch.no_grad():
        torch.testing.assert_close(f(x), m(x))  # the kernel still serves good inputs


class ShapeChecked(nn.Module):
    """Checks through `x.shape`: a list of sizes, its items and its length."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3)

    def forward(self, x):
        y = self.conv(x)
        if len(y.shape) != 4 or y.shape[-1] != y.shape[-2]:
            raise ValueError("expected square images")
        return torch.relu(y) * 2.0


def test_checks_of_shape_items_fuse():
    m = ShapeChecked().eval()
    x = torch.randn(2, 3, 16, 16)
    f = compiled(m, x)
    (group,) = nncfuse.fusion_groups(f.graph_for(x))
    kinds = group_kinds(group)
    assert "aten::conv2d" in kinds and "aten::size" in kinds  # (its items: in the `or`)
    torch.testing.assert_close(f(x), m(x))
    wide = torch.randn(2, 3, 16, 20)
    assert error_of(f, wide) == error_of(m, wide) == (ValueError, "expected square images")


class ChecksAnArgument(nn.Module):
    """A check that reads an int argument is no constant in a kernel: it stays outside."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3)
        self.bn = nn.BatchNorm2d(8)

    def forward(self, x, n: int):
        y = self.conv(x)
        if y.size(1) != n:
            raise ValueError("channels")
        return torch.relu(self.bn(y))


def test_check_of_an_argument_stays_outside():
    m = ChecksAnArgument().eval()
    x = torch.randn(2, 3, 16, 16)
    f = nncfuse.jit(m)
    with torch.no_grad():
        for _ in range(3):
            f(x, 8)
        graph = f.graph_for(x, 8)
        torch.testing.assert_close(f(x, 8), m(x, 8))
        with pytest.raises(ValueError, match="channels"):
            f(x, 7)
    # the argument's check, and the batch norm's: the convolution may not cross the first
    assert sum(map(shape_checks.is_check, graph.nodes())) == 2
    kinds = [k for group in nncfuse.fusion_groups(graph) for k in group_kinds(group)]
    assert "aten::conv2d" not in kinds and "aten::batch_norm" in kinds


def checked_pointwise(x):
    if x.dim() != 2:
        raise ValueError("expected a matrix")
    return torch.relu(x * 2.0) + 1.0


def test_rank_check_folds_in_a_dynamic_kernel():
    f = nncfuse.jit(checked_pointwise, dynamic=True)
    for n in (5, 7, 9):
        x = torch.randn(3, n)
        torch.testing.assert_close(f(x), checked_pointwise(x))
    graph = f.graph_for(torch.randn(3, 11))
    (fused,) = nncfuse.fusion_groups(graph)
    assert "prim::TypeCheck" not in [n.kind() for n in graph.nodes()]  # dynamic: unguarded
    assert "prim::If" in group_kinds(fused)
    with pytest.raises(ValueError, match="expected a matrix"):
        f(torch.randn(3, 4, 5))


def test_bf16_autocast_fuses_checks_too():
    m = conv_bn_relu()
    x = torch.randn(2, 3, 16, 16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        f = compiled(m, x)
        graph = f.graph_for(x)
        with torch.no_grad():
            got, want = f(x), m(x)
    assert got.dtype == want.dtype
    torch.testing.assert_close(got, want, atol=2e-2, rtol=2e-2)
    kinds = [k for g in nncfuse.fusion_groups(graph) for k in group_kinds(g)]
    assert "aten::conv2d" in kinds and "aten::batch_norm" in kinds


def test_a_traced_views_size_reads_are_copied_into_groups_not_taken_as_checks():
    """A trace reads sizes for its views (`x.shape[0]`, as transformers' attention does):
    those are copied into the groups that need them, not held as a check's; the projection,
    its head split and what follows fuse as one group after the norm's (they failed to
    compile: an int output)."""

    def heads(x, w):
        h = torch.rsqrt(x * x + 1.0) * x  # (the sizes read of a value the group computes)
        y = torch.nn.functional.linear(h, w)
        q = y.view(h.shape[0], h.shape[1], -1, 8).transpose(1, 2)
        return torch.sin(q) * 2.0 + 1.0

    x, w = torch.randn(2, 6, 16), torch.randn(32, 16)
    with torch.no_grad():
        traced = torch.jit.trace(heads, (x, w))
        fused = nncfuse.jit(traced)
        for _ in range(3):
            got = fused(x, w)
        report = nncfuse.explain(fused, x, w)
    torch.testing.assert_close(got, heads(x, w))
    assert "compile failure" not in str(report), report
    assert len(nncfuse.fusion_groups(fused.graph_for(x, w))) == 2
