"""A trace's convolutions (`aten::_convolution`, which eager's autocast does not cast) as the
`conv*` calls they record: under CPU autocast, a traced model's convolutions and what follows
them take eager autocast's dtypes and fuse; outside autocast the trace runs as recorded."""

import pytest
import torch
from torch import nn

import nncfuse
from nncfuse.jit.rewrites.traced_convolutions import untrace_convolutions


def _kinds(graph) -> list[str]:
    return [n.kind() for n in graph.nodes() if n.kind() != "prim::Constant"]


@pytest.mark.parametrize("conv, x, kind", [
    (nn.Conv1d(4, 8, 3, padding=1), (2, 4, 9), "aten::conv1d"),
    (nn.Conv2d(4, 8, 3, stride=2, groups=2), (2, 4, 9, 9), "aten::conv2d"),
    (nn.Conv3d(4, 8, 1, bias=False), (2, 4, 3, 3, 3), "aten::conv3d"),
    (nn.ConvTranspose2d(4, 8, 3, stride=2, output_padding=1), (2, 4, 5, 5),
     "aten::conv_transpose2d"),
], ids=["conv1d", "conv2d", "conv3d", "transposed"])
def test_a_traced_convolution_becomes_the_call_it_records(conv, x, kind):
    x = torch.randn(*x)
    graph = torch.jit.trace(conv, x).inlined_graph
    torch._C._jit_pass_constant_propagation(graph)  # (as `policy.program` does first)
    assert "aten::_convolution" in _kinds(graph)
    assert untrace_convolutions(graph) == 1
    assert _kinds(graph).count(kind) == 1 and "aten::_convolution" not in _kinds(graph)
    graph.lint()
    fn = torch._C._create_function_from_graph("untraced", graph)
    with torch.no_grad():
        torch.testing.assert_close(fn(conv, x), conv(x))
        with torch.autocast("cpu", dtype=torch.bfloat16):  # now cast as eager's call is
            result, expected = fn(conv, x), conv(x)
    assert result.dtype == expected.dtype == torch.bfloat16
    torch.testing.assert_close(result, expected)


def test_a_convolution_of_geometry_not_constant_stays():
    @torch.jit.script
    def f(x, w, s: list[int]):
        return torch._convolution(x, w, None, s, [0, 0], [1, 1], False, [0, 0], 1,
                                  False, False, True, True)

    graph = f.graph.copy()
    assert untrace_convolutions(graph) == 0
    assert "aten::_convolution" in _kinds(graph)


class _ResidualBlock(nn.Module):
    def __init__(self, c: int = 16):
        super().__init__()
        torch.manual_seed(0)
        self.conv1 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c)
        self.conv2 = nn.Conv2d(c, c, 3, padding=1)
        self.act = nn.Hardtanh(0.0, 6.0)
        with torch.no_grad():
            self.bn1.running_mean.uniform_(-1, 1)
            self.bn1.running_var.uniform_(0.5, 2)

    def forward(self, x):
        return self.act(self.conv2(torch.relu(self.bn1(self.conv1(x)))) + x)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_a_traced_cnn_under_autocast_gives_eagers_dtypes_and_fuses(dtype):
    model = _ResidualBlock().eval()
    x = torch.randn(2, 16, 10, 10)
    x[0, 0, 0, :3] = torch.tensor([float("nan"), float("inf"), -0.0])
    with torch.no_grad():
        fused = nncfuse.jit(torch.jit.trace(model, x))
        for _ in range(3):  # in and out of autocast, in turn
            with torch.autocast("cpu", dtype=dtype):
                result, expected = fused(x), model(x)
                graph = fused.graph_for(x)
            assert result.dtype == expected.dtype
            torch.testing.assert_close(result, expected, rtol=2e-2, atol=2e-2, equal_nan=True)
            torch.testing.assert_close(fused(x), model(x), equal_nan=True)
    kinds = [n.kind() for g in nncfuse.fusion_groups(graph) for n in g.g("Subgraph").nodes()]
    assert kinds.count("aten::conv2d") == 2 and "aten::batch_norm" in kinds
