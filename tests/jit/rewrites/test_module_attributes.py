"""A Python module's optional tensor attributes (a convolution's or linear's `bias`) as what
the module holds: the convolution fuses with what follows it, and a bias set to None or
replaced later is seen (the module's state is checked on every call)."""

import copy

import pytest
import torch
from torch import nn

import nncfuse


def _block(bias: bool) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(4, 8, 3, padding=1, bias=bias), nn.ReLU(),
                         nn.Conv2d(8, 8, 3, padding=1), nn.Hardtanh(0.0, 6.0))


def _kinds(fused, x) -> list[str]:
    return [n.kind() for g in nncfuse.fusion_groups(fused.graph_for(x))
            for n in g.g("Subgraph").nodes()]


@pytest.mark.parametrize("bias", [True, False])
def test_a_scripted_modules_convolutions_fuse(bias):
    model = _block(bias).eval()
    fused = nncfuse.jit(model)
    x = torch.randn(2, 4, 10, 10)
    with torch.no_grad():
        for _ in range(3):
            torch.testing.assert_close(fused(x), model(x))
        assert _kinds(fused, x).count("aten::conv2d") == 2


def test_a_bias_replaced_or_dropped_later_is_seen():
    model = _block(True).eval()
    fused = nncfuse.jit(model)
    x = torch.randn(2, 4, 10, 10)
    with torch.no_grad():
        for change in (None, lambda: setattr(model[0], "bias", nn.Parameter(torch.ones(8))),
                       lambda: setattr(model[2], "bias", None)):
            if change is not None:
                change()
            for _ in range(3):
                torch.testing.assert_close(fused(x), model(x))


def test_the_bias_gets_eagers_gradient():
    model = _block(True)
    reference = copy.deepcopy(model)
    fused = nncfuse.jit(model)
    x = torch.randn(2, 4, 10, 10)
    for _ in range(3):
        fused(x).square().sum().backward()
        reference(x).square().sum().backward()
        for p, q in zip(model.parameters(), reference.parameters()):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-4)
        model.zero_grad()
        reference.zero_grad()


def _bn_block() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(4, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                         nn.Conv2d(8, 8, 3, padding=1, groups=8), nn.BatchNorm2d(8),
                         nn.ReLU6())


def test_a_modules_batch_norms_fuse_in_eval():
    """`training` is a constant of the plan (the state check sees a flip), so batch norm's
    `training` operand is one and it lowers."""
    model = _bn_block().eval()
    fused = nncfuse.jit(model)
    x = torch.randn(2, 4, 10, 10)
    with torch.no_grad():
        for _ in range(3):
            torch.testing.assert_close(fused(x), model(x))
        graph = fused.graph_for(x)
    outside = [n.kind() for n in graph.nodes() if n.kind() == "aten::batch_norm"]
    assert not outside and len(nncfuse.fusion_groups(graph)) == 2


def test_batch_norm_flipped_between_train_and_eval_keeps_eagers_statistics():
    model = _bn_block()
    reference = copy.deepcopy(model)
    fused = nncfuse.jit(model)
    x = torch.randn(2, 4, 10, 10)
    with torch.no_grad():
        for mode in (False, True, False, True, True, False):
            model.train(mode)
            reference.train(mode)
            for _ in range(2):
                torch.testing.assert_close(fused(x), reference(x))
            for name, b in reference.named_buffers():
                torch.testing.assert_close(model.get_buffer(name), b)
