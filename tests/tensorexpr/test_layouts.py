"""Inputs in any layout are read in place, and outputs get the strides eager gives them."""

import pytest
import torch

import nncfuse
from nncfuse.jit.fuser.runtime import kernel_of


def f(a, b):
    return torch.sigmoid(a * 2.0) + b * b


LAYOUTS = {
    "channels_last": lambda: torch.randn(2, 5, 7, 3).to(memory_format=torch.channels_last),
    "transposed": lambda: torch.randn(2, 5, 3, 7).transpose(2, 3),
    "step_sliced": lambda: torch.randn(4, 10, 7, 6)[::2, ::2, :, ::2],
    "expanded": lambda: torch.randn(5, 1, 1).expand(2, 5, 7, 3),
    "zero_size": lambda: torch.randn(2, 0, 7, 3),
    "offset_view": lambda: torch.randn(3, 5, 7, 3)[1:],
}


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_layout_read_in_place_with_eager_strides(layout):
    a = LAYOUTS[layout]()
    b = torch.randn(a.shape[-1])  # broadcast along the last dimension
    fused = nncfuse.jit(f)
    for _ in range(2):
        got = fused(a, b)
    want = f(a, b)
    torch.testing.assert_close(got, want)
    assert got.stride() == want.stride()
    (group,) = nncfuse.fusion_groups(fused.graph_for(a, b))
    kernel = kernel_of(group)
    # The kernel's input buffer has the input's own strides: no copy was made.
    (buf,) = [p for p in kernel.lowered.inputs if getattr(p, "ndim", 0) == 4]
    assert tuple(s.value for s in buf.strides) == a.stride()


def test_channels_last_outputs_stay_channels_last():
    a = torch.randn(2, 8, 5, 5).to(memory_format=torch.channels_last)
    out = nncfuse.jit(f)(a, torch.randn(5))
    out = nncfuse.jit(f)(a, torch.randn(5))
    assert out.is_contiguous(memory_format=torch.channels_last)
