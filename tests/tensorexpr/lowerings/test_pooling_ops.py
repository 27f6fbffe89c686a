"""max_pool2d (values, and indices as max_pool2d_with_indices gives them) and
adaptive_avg_pool2d, fused, against eager: windows with padding, strides, dilation and
ceil_mode, ties, NaN and -inf, channels-last and non-contiguous inputs, every dtype."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tests.fused import BACKENDS, FLOATS, assert_exact, run_fused

#: (kernel, stride, padding, dilation, ceil_mode)
WINDOWS = [
    (3, 2, 1, 1, False),       # ResNet's stem
    (2, 2, 0, 1, False),
    (3, 1, 1, 1, False),
    ((3, 2), (2, 1), (1, 0), 1, True),
    (3, 2, 0, 2, True),
    (2, [], 1, 1, False),      # stride [] is the kernel size
]


def _input(dtype: torch.dtype, shape=(2, 3, 9, 8)) -> torch.Tensor:
    torch.manual_seed(0)
    if dtype.is_floating_point:
        x = torch.randn(shape).round(decimals=1).to(dtype)  # (ties in many windows)
        x.view(-1)[:6] = torch.tensor([float("nan"), float("inf"), -0.0, float("-inf"),
                                       float("nan"), 0.0])
        return x
    return torch.randint(-5, 5, shape, dtype=dtype)


@pytest.mark.parametrize("use_llvm", BACKENDS)
@pytest.mark.parametrize("window", WINDOWS, ids=str)
@pytest.mark.parametrize("dtype", [*FLOATS, torch.int32, torch.uint8], ids=str)
def test_max_pool2d_values_and_indices(dtype, window, use_llvm):
    if dtype == torch.uint8:
        x = _input(torch.int32).abs().to(torch.uint8)
    else:
        x = _input(dtype)
    kernel, stride, padding, dilation, ceil = window

    def values(x):
        return F.max_pool2d(x, kernel, stride, padding, dilation, ceil) + 0

    def both(x):
        v, i = F.max_pool2d(x, kernel, stride, padding, dilation, ceil, return_indices=True)
        return v + 0, i + 0

    assert_exact(run_fused(values, x, use_llvm=use_llvm), values(x))
    for got, want in zip(run_fused(both, x, use_llvm=use_llvm), both(x)):
        assert_exact(got, want)


def test_a_window_of_nans_and_infinities_takes_atens_index():
    """ATen keeps the last NaN of a window, else the first max; a window of -inf only points
    at its first element inside the input."""
    x = torch.tensor([[[[float("nan"), 1.0, float("nan"), 2.0],
                        [float("-inf"), float("-inf"), 3.0, 3.0],
                        [float("-inf"), float("-inf"), 5.0, float("nan")],
                        [float("-inf"), float("-inf"), 1.0, 5.0]]]])

    def both(x):
        v, i = F.max_pool2d(x, 2, 2, return_indices=True)
        return v * 1, i * 1

    for got, want in zip(run_fused(both, x), both(x)):
        assert_exact(got, want)


@pytest.mark.parametrize("layout", ["channels_last", "transposed"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_pooling_of_other_layouts(dtype, layout):
    x = _input(dtype, (2, 16, 12, 10))
    x = x.to(memory_format=torch.channels_last) if layout == "channels_last" else x.transpose(2, 3)

    def f(x):
        return F.max_pool2d(torch.relu(x), 3, 2, 1), F.adaptive_avg_pool2d(x * 2, (1, 1))

    got, want = run_fused(f, x), f(x)
    for g, w in zip(got, want):
        assert g.stride() == w.stride()
        torch.testing.assert_close(g, w, equal_nan=True, rtol=0 if g.dtype == torch.float32
                                   else 1e-2, atol=1e-6 if g.dtype == torch.float32 else 1e-2)


@pytest.mark.parametrize("use_llvm", BACKENDS)
@pytest.mark.parametrize("size", [(1, 1), (5, 7), (3, 3), (4, 1)], ids=str)
@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_adaptive_avg_pool2d(dtype, size, use_llvm):
    x = _input(dtype, (2, 3, 9, 8)).nan_to_num(0.0, 1e3, -1e3)

    def f(x):
        return F.adaptive_avg_pool2d(x, size) * 1

    got, want = run_fused(f, x, use_llvm=use_llvm), f(x)
    tolerance = {torch.float32: 1e-6, torch.float64: 1e-12}.get(dtype, 1e-2)
    torch.testing.assert_close(got, want, rtol=tolerance, atol=tolerance)
    x[0, 0, 0, 0] = float("nan")
    torch.testing.assert_close(run_fused(f, x, use_llvm=use_llvm), f(x), equal_nan=True,
                               rtol=tolerance, atol=tolerance)
