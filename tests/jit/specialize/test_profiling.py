"""Profiling a program whose early `return` (or `break`) leaves TorchScript's Uninitialized
placeholders in the paths that skip it: the profile nodes must not be handed one (the
interpreter raised "Can't convert Uninitialized to a Python object" on the first call)."""

import torch
from torch import nn

import nncfuse


def first_large(xs: list[torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    for t in xs:
        if bool(t.sum() > 1000.0):
            return t * 2.0
    return (x.sin() * 2.0 + 1.0).relu()


def test_an_early_return_in_a_loop_profiles_and_fuses_the_rest():
    fused = nncfuse.jit(first_large)
    x = torch.randn(64)
    for xs in ([x, x], [x, torch.full((64,), 100.0)], [x, x]):
        torch.testing.assert_close(fused(xs, x), first_large(xs, x))
    assert nncfuse.fusion_groups(fused.graph_for([x, x], x))


def test_a_transformer_encoder_layer_runs():
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(32, 4, 64, batch_first=True).eval()
    fused = nncfuse.jit(layer)
    x = torch.randn(2, 8, 32)
    with torch.no_grad():
        for _ in range(3):
            torch.testing.assert_close(fused(x), layer(x))
