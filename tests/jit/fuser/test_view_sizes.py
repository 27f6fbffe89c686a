"""Views sized by other tensors' sizes (`jit/fuser/sizes.py`): GPT-2's Conv1D, attention heads,
traced size arithmetic. They fuse, the sizes' tensors become guarded group inputs the kernel
never reads, and other sizes take the fallback or a dynamic kernel, never a wrong answer."""

import warnings

import pytest
import torch

import nncfuse
from nncfuse.jit.fuser import runtime
from nncfuse.jit.fuser.supported import why_not_fusible
from nncfuse.tensorexpr import expr as E
from nncfuse.tensorexpr import stmt as S
from nncfuse.tensorexpr.ir_visitor import walk
from tests.fused import assert_exact
from tests.jit.fuser.test_tensorexpr_fuser import optimized


def traced(fn, *args):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.jit.trace(fn, args, check_trace=False)


def kernels(graph):
    """(kernel, its group's subgraph) of each compiled group of an optimized graph."""
    return [(runtime.kernel_of(n), n.g("Subgraph")) for n in nncfuse.fusion_groups(graph)
            if runtime.is_fused_op(n)]


def fused_kinds(graph):
    return {n.kind() for _, sub in kernels(graph) for n in sub.nodes()}


def loaded(kernel):
    """Names of the buffers the kernel's loops read, and of those its external calls take."""
    names = {n.buf.name for n in walk(kernel.stmt) if isinstance(n, E.Load)}
    for n in walk(kernel.stmt):
        if isinstance(n, S.ExternalCall):
            names |= {b.name for b in n.args if hasattr(b, "name")}
    return names


def sizes_only_inputs(kernel, subgraph):
    """The kernel's input buffers whose graph inputs only `aten::size` reads."""
    return [p for p, v in zip(kernel.lowered.inputs, subgraph.inputs())
            if v.uses() and all(u.user.kind() == "aten::size" for u in v.uses())]


def check(f, fn, *args):
    got, want = f(*args), fn(*args)
    got = got if isinstance(got, tuple) else (got,)
    want = want if isinstance(want, tuple) else (want,)
    for g, w in zip(got, want):
        assert g.shape == w.shape
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6, equal_nan=True)


# -- GPT-2's Conv1D: view(-1, x.size(-1)), addmm, view(x.size(0), x.size(1), nf) ------------


def conv1d_gelu(x, w, b):
    h = torch.addmm(b, x.view(-1, x.size(-1)), w)
    h = h.view(x.size(0), x.size(1), w.size(1))
    return 0.5 * h * (1.0 + torch.tanh(0.79788456 * (h + 0.044715 * torch.pow(h, 3.0))))


def test_conv1d_pattern_fuses_the_view_after_the_gemm():
    x, w, b = torch.randn(2, 16, 32), torch.randn(32, 48), torch.randn(48)
    fn = traced(conv1d_gelu, x, w, b)
    f, graph = optimized(fn, x, w, b)
    check(f, conv1d_gelu, x, w, b)
    assert "aten::view" in fused_kinds(graph) and "aten::tanh" in fused_kinds(graph)
    for kernel, sub in kernels(graph):
        for buf in sizes_only_inputs(kernel, sub):
            assert buf.name not in loaded(kernel)  # x gives its sizes only
    report = nncfuse.explain(fn, x, w, b)  # all but the GEMM's input: eager's view of x
    assert [(u.kind, u.category) for u in report.unfused] == [
        ("aten::view", "below min_group_size")]


# -- attention's head split and merge ------------------------------------------------------


def heads(x, mask):
    b, s = x.size(0), x.size(1)
    q = x.view(b, s, 4, -1).transpose(1, 2) * 0.125
    scores = (q + mask).softmax(-1)
    return scores.transpose(1, 2).reshape(b, s, -1) + 1.0


@pytest.mark.parametrize("trace", [True, False], ids=["traced", "scripted"])
def test_head_split_and_merge_fuse(trace):
    x, mask = torch.randn(2, 8, 32), torch.randn(8)
    fn = traced(heads, x, mask) if trace else heads
    f, graph = optimized(fn, x, mask)
    check(f, heads, x, mask)
    kinds = fused_kinds(graph)
    assert {"aten::view", "aten::transpose", "aten::reshape", "aten::softmax"} <= kinds
    assert "aten::size" in kinds  # the sizes are copied in
    assert len(nncfuse.fusion_groups(graph)) == 1


# -- sizes from an input the group does not otherwise use ------------------------------------


def sized_by(x, y):
    return (y * 2).view(x.size(0), x.size(1), -1) + 1


@pytest.mark.parametrize("layout", ["contiguous", "transposed"])
def test_sizes_from_an_otherwise_unused_input(layout):
    x = torch.randn(4, 6, 2) if layout == "contiguous" else torch.randn(2, 6, 4).transpose(0, 2)
    y = torch.randn(24, 2)
    before = x.clone()
    f, graph = optimized(sized_by, x, y)
    check(f, sized_by, x, y)
    assert_exact(x, before)
    [(kernel, sub)] = kernels(graph)
    [buf] = sizes_only_inputs(kernel, sub)
    assert buf.name not in loaded(kernel)
    assert {"aten::view", "aten::mul", "aten::add"} <= fused_kinds(graph)
    # guarded like any input: the group's TypeCheck checks x
    checks = [n for n in graph.nodes() if n.kind() == "prim::TypeCheck"]
    assert checks and any(v.debugName().startswith("x") for v in checks[0].inputs())


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_a_size_that_changes_between_calls(dynamic):
    """Other sizes of x, with y of the same shape: the guard refuses them (the fallback runs,
    then another specialization), or a dynamic kernel takes them; never the old sizes."""
    y = torch.randn(24, 2)
    f = nncfuse.jit(sized_by, dynamic=dynamic)
    for shape in [(4, 6, 2), (4, 6, 2), (4, 6, 2), (2, 12, 2), (3, 8, 2), (12, 2, 2),
                  (1, 24, 2), (4, 6, 2), (2, 12, 2), (2, 12, 2)]:
        x = torch.randn(*shape)
        check(f, sized_by, x, y)


def sized_scaled(x, y):
    return (y * 2).view(x.size(0), 6) * x


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_sizes_of_a_changing_input_it_reads(dynamic):
    f = nncfuse.jit(sized_scaled, dynamic=dynamic)
    for n in [4, 4, 4, 8, 2, 16, 1, 0, 4, 8, 8]:
        x, y = torch.randn(n, 6), torch.randn(n * 3, 2)
        check(f, sized_scaled, x, y)


def regrouped(x, y):
    return (y + 1).view(x.size(0), x.size(1) // 2, 2).relu()


def transposed_sizes(x, y):
    return (y + 1).view(x.size(1), x.size(0)) * 2


def test_zero_size_dims():
    x, y = torch.randn(0, 6), torch.randn(0, 6)
    f, graph = optimized(regrouped, x, y)
    check(f, regrouped, x, y)
    assert "aten::view" in fused_kinds(graph)
    check(f, regrouped, torch.randn(2, 6), torch.randn(2, 6))  # then elements: the fallback
    x, y = torch.randn(5, 0), torch.randn(5, 0)
    f, graph = optimized(transposed_sizes, x, y)
    check(f, transposed_sizes, x, y)
    assert "aten::view" in fused_kinds(graph)


# -- traced size arithmetic: rotate_half, repeat_kv --------------------------------------------


def rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1) * 2.0


def repeat_kv(x):
    b, kv, s, d = x.shape
    x = x[:, :, None, :, :].expand(b, kv, 2, s, d)
    return x.reshape(b, kv * 2, s, d) + 1.0


@pytest.mark.parametrize("fn", [rotate_half, repeat_kv])
def test_traced_size_arithmetic(fn):
    x = torch.randn(2, 3, 5, 8)
    t = traced(fn, x)
    assert "prim::NumToTensor" in str(t.graph)
    f, graph = optimized(t, x)
    check(f, fn, x)
    report = nncfuse.explain(t, x)
    assert report.coverage == 1.0, report
    x = torch.randn(2, 3, 5, 6)  # another size: the fallback, right
    check(f, fn, x)


# -- what stays unfused ---------------------------------------------------------------------


def size_then_resize(x, y):
    n = x.size(0)
    x.unsqueeze_(0)
    return (y * 2).view(n, -1) + 1, x


def test_a_size_read_before_its_tensor_changes_shape():
    """x changes shape in place after its size is read: the view may not read it later."""
    x, y = torch.randn(4, 6), torch.randn(8, 3)
    f = nncfuse.jit(size_then_resize)
    for _ in range(3):
        got, want = f(x.clone(), y), size_then_resize(x.clone(), y)
        assert_exact(got[0], want[0])
        assert got[1].shape == want[1].shape


def size_of_a_number(x, n: int):
    return (x * 2).view(n + x.size(1), -1) + 1


def test_size_arithmetic_with_a_number_is_not_copied():
    x = torch.randn(4, 6)
    f, graph = optimized(size_of_a_number, x, 2)
    check(f, size_of_a_number, x, 2)
    check(f, size_of_a_number, x, 6)  # another n, same types: the view must not be fused
    view = next(n for n in graph.nodes() if n.kind() == "aten::view")
    assert "not a constant" in why_not_fusible(view)


def divided(x, y):
    return (y * 2).view(x.size(0) // x.size(1), -1) + 1


def test_a_size_divided_by_a_size_is_not_copied():
    """Only constant divisors are taken (a size may be 0)."""
    x, y = torch.randn(4, 2), torch.randn(4, 3)
    f, graph = optimized(divided, x, y)
    check(f, divided, x, y)
    assert "aten::view" not in fused_kinds(graph)


def head_merge(h, p, v):
    a = torch.matmul(p, v).transpose(1, 2).contiguous()
    return a.view(h.size(0), -1, 256)


def test_a_head_merge_reads_rows_not_gathers():
    """T5's attention output: the view merges (heads, dim) of a transposed matmul result; the
    kernel's loops split at the head size (`split_loops`), no index divides per element."""
    h, p = torch.randn(1, 16, 256), torch.randn(1, 4, 16, 16)
    v = torch.randn(1, 16, 4, 64).transpose(1, 2)
    f, graph = optimized(traced(head_merge, h, p, v), h, p, v)
    check(f, head_merge, h, p, v)
    [(kernel, _)] = kernels(graph)
    assert not [n for n in walk(kernel.stmt) if isinstance(n, (E.Div, E.Mod))], kernel.stmt


def unpacked_heads_merge(x):
    b, h, s, d = x.shape  # prim::ListUnpack of aten::size(x)
    return x.transpose(1, 2).reshape(b, s, h * d)


def unpacked_partly(x, y):
    b, h, s, d = x.shape  # `h` and `d` only: the unpacking's other outputs unused
    return (y + 1).view(h * d, -1)


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_sizes_unpacked_from_a_shape(dynamic):
    """`b, h, s, d = x.shape` gives size expressions (one per output of the unpacking): the
    heads merge after attention (a copy in eager: no view has its strides) fuses, and other
    sizes take the fallback or another kernel, never the old sizes."""
    f = nncfuse.jit(unpacked_heads_merge, dynamic=dynamic)
    for shape in [(2, 3, 8, 4), (2, 3, 8, 4), (2, 3, 8, 4), (1, 4, 5, 6), (2, 3, 8, 4),
                  (3, 2, 1, 4)]:
        x = torch.randn(*shape)
        x.view(-1)[:3] = torch.tensor([float("nan"), -float("inf"), -0.0])
        got = f(x)
        assert_exact(got, unpacked_heads_merge(x))
    x = torch.randn(2, 3, 8, 4)
    assert {"aten::transpose", "aten::reshape"} <= fused_kinds(f.graph_for(x))
    g, graph = optimized(unpacked_partly, x, torch.randn(24, 8))
    check(g, unpacked_partly, x, torch.randn(24, 8))
    assert {"aten::view", "aten::add"} <= fused_kinds(graph)
