"""chunk/split/unbind spelled as slices of their profiled sizes (`_chunks_to_slices`) only where
the plan's signature fixes the input's size: a module attribute replaced by one of another
shape, or a tensor sized by an int argument's value, must give eager's result or error."""

import warnings

import pytest
import torch

import nncfuse


class Chunk(torch.nn.Module):  # a part returned unfused, a part in a group
    def __init__(self, n):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(n, 4), requires_grad=False)

    def forward(self, x):
        a, b = self.w.chunk(2, 0)
        return a * x, b


class Split(torch.nn.Module):
    def __init__(self, n):
        super().__init__()
        self.register_buffer("w", torch.randn(n, 4))

    def forward(self, x):
        a, b = (self.w * 2).split(4, 0)  # the slices in a group: its fallback runs them
        return a * x + b


class SplitWithSizes(torch.nn.Module):
    def __init__(self, n):
        super().__init__()
        self.register_buffer("w", torch.randn(n, 4))

    def forward(self, x):
        a, b = self.w.split([2, 4], 0)
        return a.sum(0) * x, b + 1


class Unbind(torch.nn.Module):
    def __init__(self, n):
        super().__init__()
        self.register_buffer("w", torch.randn(n, 4))

    def forward(self, x):
        a, b = self.w.unbind(0)  # 3 rows: eager's unpacking raises
        return a * x + b


def _outcome(fn, *args):
    try:
        out = fn(*args)
    except Exception as e:  # noqa: BLE001 - eager's error is the expected outcome
        return type(e)
    return out if isinstance(out, tuple) else (out,)


def _same(got, want):
    if isinstance(want, type):
        assert isinstance(got, type), f"eager raised {want.__name__}, nncfuse returned {got}"
        return
    assert not isinstance(got, type), f"nncfuse raised {got.__name__}"
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape
        torch.testing.assert_close(g, w, rtol=0, atol=0)


@pytest.mark.parametrize("make, x, sizes", [
    (Chunk, torch.randn(1, 4), (6, 8, 7, 1)),
    (Split, torch.randn(1, 4), (8, 6, 9)),
    (SplitWithSizes, torch.randn(4), (6, 7)),
    (Unbind, torch.randn(4), (2, 3)),
])
@pytest.mark.parametrize("how", ["script", "trace"])
def test_replaced_attribute_of_another_size(make, x, sizes, how):
    module = make(sizes[0]).eval()
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        compiled = torch.jit.script(module) if how == "script" else torch.jit.trace(
            module, (x,), check_trace=False)
        fused = nncfuse.jit(compiled, min_group_size=1)
        for n in sizes:
            buffer = torch.randn(n, 4)
            if isinstance(module.w, torch.nn.Parameter):
                buffer = torch.nn.Parameter(buffer, requires_grad=False)
            module.w = compiled.w = buffer
            for _ in range(3):  # profiling runs, then the plan
                _same(_outcome(fused, x), _outcome(module, x))


def arange_chunks(x, n: int):
    a, b = torch.arange(n, dtype=torch.float32).chunk(2)
    return a + x, b


def test_tensor_sized_by_an_int_argument():
    fused = nncfuse.jit(arange_chunks, min_group_size=1)
    x = torch.randn(1)
    for n in (6, 6, 6, 8, 5, 1):
        _same(_outcome(fused, x, n), _outcome(arange_chunks, x, n))


def chunk_of_argument(x):
    a, b = (x + 1).chunk(2, 1)
    return a * b


def test_argument_chunks_still_fuse_as_slices():
    fused = nncfuse.jit(chunk_of_argument, min_group_size=1)
    x = torch.randn(3, 6)
    for _ in range(3):
        _same(_outcome(fused, x), _outcome(chunk_of_argument, x))
    graph = fused.graph_for(x)
    kinds = {n.kind() for g in nncfuse.fusion_groups(graph) for n in g.g("Subgraph").nodes()}
    assert "aten::slice" in kinds
    assert graph.findNode("aten::chunk") is None


@pytest.mark.parametrize("dynamic", [None, True])
def test_argument_of_varying_size(dynamic):
    fused = nncfuse.jit(chunk_of_argument, min_group_size=1, dynamic=dynamic)
    for w in (6, 6, 8, 8, 10, 7, 1):
        x = torch.randn(3, w)
        _same(_outcome(fused, x), _outcome(chunk_of_argument, x))


def slice_write(x, e):
    x[:, 2:5] = e
    return x * 2


@pytest.mark.parametrize("dynamic", [None, True])
def test_slice_write_rebuilt_at_varying_sizes(dynamic):
    fused = nncfuse.jit(slice_write, min_group_size=1, dynamic=dynamic)
    for w in (8, 8, 9, 9, 10, 12, 5):
        x, e = torch.randn(3, w), torch.randn(3, 3)
        mine = x.clone()
        _same(_outcome(fused, mine, e), _outcome(slice_write, x, e))
        assert torch.equal(mine, x)


def write_through_chunk(x, y):
    a, b = x.chunk(2, 1)
    a.mul_(y)  # an in-place write through a slice of the argument
    return x + 1


@pytest.mark.parametrize("dynamic", [None, True])
def test_write_through_a_chunk_at_varying_sizes(dynamic):
    fused = nncfuse.jit(write_through_chunk, min_group_size=1, dynamic=dynamic)
    for w in (6, 6, 8, 8, 10, 7):
        x, y = torch.randn(3, w), torch.randn(3, 1)
        mine = x.clone()
        _same(_outcome(fused, mine, y), _outcome(write_through_chunk, x, y))
        assert torch.equal(mine, x)


class BufferWrite(torch.nn.Module):
    def __init__(self, n):
        super().__init__()
        self.register_buffer("w", torch.randn(3, n))

    def forward(self, e):
        a, b = self.w.chunk(2, 1)
        a.copy_(e)  # a slice write into a buffer, then a read of all of it
        return self.w * 2


@pytest.mark.parametrize("how", ["script", "trace"])
def test_write_into_a_replaced_buffer(how):
    module, twin = BufferWrite(6), BufferWrite(6)
    e = torch.randn(3, 1)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        compiled = torch.jit.script(module) if how == "script" else torch.jit.trace(
            module, (e,), check_trace=False)
        fused = nncfuse.jit(compiled, min_group_size=1)
        for n in (6, 8, 5):
            buffer = torch.randn(3, n)
            compiled.w, twin.w = buffer, buffer.clone()
            for _ in range(3):
                _same(_outcome(fused, e), _outcome(twin, e))
                assert torch.equal(compiled.w, twin.w)
