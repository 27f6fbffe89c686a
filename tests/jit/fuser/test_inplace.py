"""In-place writes to graph inputs inside fusion groups (issue 11): the kernel stores into the
input's own storage, as eager does; inputs that overlap a written one take the fallback."""

import pytest
import torch
from torch import nn

import nncfuse
from nncfuse.jit.fuser import inplace
from nncfuse.tensorexpr.codegen.entry import overlaps
from nncfuse.tensorexpr.meta import TensorMeta

BACKENDS = [pytest.param(True, id="llvm"), pytest.param(False, id="interp")]


def _kinds(f, *args):
    return [n.kind() for n in nncfuse.fusion_groups(f.graph_for(*args))]


def _ops(f, *args):
    """The ops of each fusion group's subgraph."""
    return [[n.kind() for n in g.g("Subgraph").nodes() if n.kind() != "prim::Constant"]
            for g in nncfuse.fusion_groups(f.graph_for(*args))]


def check(fn, *args, use_llvm=True, groups=1, calls=3, module=None):
    """`fn` through nncfuse against eager on fresh copies of `args`, `calls` times: results,
    every argument's values after the call, and that each tensor argument kept its storage.
    Returns the fused function."""
    f = nncfuse.jit(module if module is not None else fn, use_llvm=use_llvm)
    for _ in range(calls):
        mine = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
        theirs = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
        pointers = [a.data_ptr() for a in mine if isinstance(a, torch.Tensor)]
        got = f(*mine)
        want = fn(*theirs)
        torch.testing.assert_close(got, want, equal_nan=True)
        torch.testing.assert_close(mine, theirs, equal_nan=True)
        assert pointers == [a.data_ptr() for a in mine if isinstance(a, torch.Tensor)]
    if groups is not None:
        fresh = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
        assert len(_kinds(f, *fresh)) == groups, f.graph_for(*fresh)
    return f


def add_then_read(x, y):
    x.add_(y)
    return torch.sigmoid(x * 2)


def chain(x, y):
    a = x * 3  # reads the old x
    x.mul_(y).sigmoid_()
    return a + x  # reads the new x


def mask_relu(x, m):
    x.masked_fill_(m, 0.0)
    return x.relu_()


def clamp_only(x, y):
    x.clamp_(-0.5, 0.5)
    x.sub_(y, alpha=2)


def slice_assign(x, y):
    x[:, :4] = torch.tanh(y) * 2


def slice_assign_last(x, y):
    x[..., 2:5] = y.sigmoid()


def copy_in(x, y):
    x.copy_(y * y)
    return x + 1


@pytest.mark.parametrize("use_llvm", BACKENDS)
@pytest.mark.parametrize(
    "fn, shapes",
    [
        (add_then_read, [(8, 8), (8, 8)]),
        (add_then_read, [(4, 6), (6,)]),
        (chain, [(8, 8), (8,)]),
        (clamp_only, [(16, 5), (16, 5)]),
        (slice_assign, [(8, 8), (8, 4)]),
        (slice_assign_last, [(3, 4, 7), (4, 3)]),
        (copy_in, [(5, 5), (5, 5)]),
    ],
)
def test_writes_reach_the_input(fn, shapes, use_llvm):
    args = [torch.randn(s) for s in shapes]
    f = check(fn, *args, use_llvm=use_llvm)
    assert any("copy_" in op for ops in _ops(f, *args) for op in ops)


@pytest.mark.parametrize("use_llvm", BACKENDS)
def test_masked_fill_with_a_broadcast_mask_returns_the_input(use_llvm):
    x, m = torch.randn(8, 8), torch.rand(8) > 0.5
    f = check(mask_relu, x, m, use_llvm=use_llvm)
    y = x.clone()
    assert f(y, m) is y or f(y, m).data_ptr() == y.data_ptr()


def test_views_of_the_input_see_the_write():
    f = nncfuse.jit(add_then_read)
    for _ in range(3):
        base = torch.randn(6, 8)
        x = base[1:5]  # a view with an offset
        y = torch.randn(4, 8)
        want = base.clone()
        want[1:5] += y
        f(x, y)
        torch.testing.assert_close(base, want)
    assert _kinds(f, base[1:5], y)


def test_a_non_contiguous_input_is_written_in_place():
    base = torch.randn(8, 6)
    check(add_then_read, base.t(), torch.randn(6, 8))
    check(slice_assign, torch.randn(8, 8).t(), torch.randn(8, 4))


def test_the_same_tensor_twice_takes_the_fallback():
    def f(x, y):
        x.add_(y.flip(0))  # fused, x[i] would read y[n-1-i] after writing it if y is x
        return x * 2

    fused = nncfuse.jit(f)
    for _ in range(3):
        fused(torch.randn(8, 4), torch.randn(8, 4))
    for _ in range(2):
        x = torch.randn(8, 4)
        x2 = x.clone()
        got = fused(x, x)
        want = f(x2, x2)
        torch.testing.assert_close(got, want)
        torch.testing.assert_close(x, x2)
    assert _kinds(fused, x, torch.randn(8, 4))


def test_overlapping_views_take_the_fallback():
    def f(x, y):
        x.mul_(2.0)
        return x + y

    fused = nncfuse.jit(f)
    for _ in range(3):
        fused(torch.randn(7), torch.randn(7))
    base = torch.randn(8)
    want_base = base.clone()
    got = fused(base[1:], base[:-1])
    want = f(want_base[1:], want_base[:-1])
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(base, want_base)


def test_reads_of_other_elements_of_the_written_input():
    def flip_add(x):
        x.add_(x.flip(0))  # x[i] += x[n-1-i]: the reads must all come before the writes
        return x

    check(flip_add, torch.randn(9, 3))
    check(flip_add, torch.randn(9, 3), use_llvm=False)

    def shifted(x):
        x[1:] += x[:-1]  # eager refuses the partial overlap: so must nncfuse
        return x * 1

    with pytest.raises(RuntimeError, match="single memory location"):
        shifted(torch.randn(10))
    f = nncfuse.jit(shifted)
    with pytest.raises(RuntimeError, match="single memory location"):
        f(torch.randn(10))


def test_overlaps():
    base = torch.randn(10)
    assert overlaps(base[2:5], (base[4:],))
    assert not overlaps(base[2:5], (base[5:], torch.randn(3), 2.0))
    assert overlaps(base, (base,))
    assert not overlaps(base[:0], (base,))
    m = torch.randn(4, 4)
    assert overlaps(m.t(), (m[3],))


def test_module_with_inplace_relu():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.act = nn.ReLU(inplace=True)

        def forward(self, x, y):
            return self.act(x) * y

    m = M()
    check(m, torch.randn(8, 8), torch.randn(8, 8), module=M())


def test_residual_add_inplace():
    def block(x, r):
        r += x
        return r

    check(block, torch.randn(64, 32), torch.randn(64, 32))


def test_leaf_requiring_grad_raises_as_eager():
    f = nncfuse.jit(add_then_read)
    with pytest.raises(RuntimeError, match="leaf"):
        for _ in range(3):
            f(torch.randn(4, requires_grad=True), torch.randn(4))


def test_writes_eager_rejects_still_raise():
    def cast(x):
        x.add_(1.5)
        return x * 2

    f = nncfuse.jit(cast)
    with pytest.raises(RuntimeError):
        f(torch.arange(4))

    def grow(x, y):
        x.add_(y)
        return x * 2

    g = nncfuse.jit(grow)
    with pytest.raises(RuntimeError):
        g(torch.randn(4), torch.randn(3, 4))


def test_inputs_used_in_blocks_are_left_alone():
    def f(x, y, flag: bool):
        x.add_(y)
        if flag:
            x.mul_(2.0)
        return x * y

    fused = nncfuse.jit(f)
    for flag in (True, False, True):
        a, b = torch.randn(5), torch.randn(5)
        a2 = a.clone()
        torch.testing.assert_close(fused(a, b, flag), f(a2, b, flag))
        torch.testing.assert_close(a, a2)


def test_plan_refuses_views_other_than_a_slice_assignment():
    def f(x):
        v = x[0]
        x.add_(1.0)
        return v * 2  # v sees the write: x is left alone

    check(f, torch.randn(3, 4), groups=None)
    graph = torch.jit.script(f).graph
    assert not inplace.functionalize_input_writes(graph)


# -- the end-to-end patterns: everything after the GEMMs is one kernel -------------------


def lstm_cell(x, h, c, w_ih, w_hh, b):
    gates = x @ w_ih.t() + h @ w_hh.t() + b
    i, f, g, o = gates.chunk(4, 1)
    i, f, g, o = torch.sigmoid(i), torch.sigmoid(f), torch.tanh(g), torch.sigmoid(o)
    c2 = f * c + i * g
    h2 = o * torch.tanh(c2)
    return h2, c2


def rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def rotary(q, cos, sin):
    q = q.view(2, 4, 8, 32).transpose(1, 2)  # (batch, heads, seq, dim)
    return q * cos + rotate_half(q) * sin


def attention_scores(q, k, mask):
    b, t, hd = q.shape
    qh = q.view(b, t, 4, hd // 4).transpose(1, 2) * 0.125
    kh = k.view(b, t, 4, hd // 4).transpose(1, 2)
    s = qh @ kh.transpose(-2, -1)
    s.masked_fill_(mask[:t, :t] == 0, float("-inf"))
    return s


def merge_heads(x, scale: float):
    b, h, t, d = x.shape
    return (x * scale).transpose(1, 2).reshape(b, t, h * d)


@pytest.mark.parametrize("use_llvm", BACKENDS)
def test_lstm_cell_is_one_kernel(use_llvm):
    n, hid = 4, 16
    args = [torch.randn(n, hid), torch.randn(n, hid), torch.randn(n, hid),
            torch.randn(4 * hid, hid), torch.randn(4 * hid, hid), torch.randn(4 * hid)]
    f = check(lstm_cell, *args, use_llvm=use_llvm)
    (ops,) = _ops(f, *args)  # one kernel: the two GEMMs as external calls, then the gates
    assert ops.count("aten::matmul") == 2 and {"aten::sigmoid", "aten::tanh"} <= set(ops)


@pytest.mark.parametrize("use_llvm", BACKENDS)
def test_rotary_embedding_is_one_kernel(use_llvm):
    args = [torch.randn(2, 4, 8 * 32), torch.randn(4, 32), torch.randn(4, 32)]
    f = check(rotary, *args, use_llvm=use_llvm)
    (ops,) = _ops(f, *args)
    assert "aten::cat" in ops and "aten::neg" in ops


def test_attention_scale_and_causal_mask():
    q, k = torch.randn(2, 6, 32), torch.randn(2, 6, 32)
    mask = torch.tril(torch.ones(8, 8))
    f = check(attention_scores, q, k, mask, groups=None)
    ops = [op for g in _ops(f, q, k, mask) for op in g]
    assert "aten::masked_fill" in ops  # of a computed value: TorchScript's own rewrite
    check(merge_heads, torch.randn(2, 4, 6, 8), 0.5)


@pytest.mark.parametrize("use_llvm", BACKENDS)
def test_scale_and_causal_mask_written_into_the_scores(use_llvm):
    def mask_scores(s, mask):
        s.mul_(0.125)
        s.masked_fill_(mask[:6, :6] == 0, float("-inf"))  # constant bounds: they fuse
        return s

    s, mask = torch.randn(2, 4, 6, 6), torch.tril(torch.ones(8, 8))
    f = check(mask_scores, s, mask, use_llvm=use_llvm)
    (ops,) = _ops(f, s, mask)
    assert {"aten::masked_fill", "aten::copy_", "aten::slice"} <= set(ops)


def test_a_read_of_the_old_value_does_not_move_past_the_write_back():
    def f(x0, x1):  # from fuzz seed 700017: hardsigmoid(x0) must read x0 before neg_
        v0 = torch.nn.functional.hardsigmoid(x0)
        x0.neg_()
        v3 = x0.cumsum(-1)  # not fusible: splits the groups
        v5 = torch.log(v0 + 0.5)
        return torch.lerp(x0, v5, x1) + v3

    check(f, torch.rand(4, dtype=torch.float64), torch.rand((), dtype=torch.float64), groups=2)


def test_a_read_of_the_old_value_and_a_reduction_of_the_new_in_one_group():
    def f(x0, x1):  # the seed's program as it was, now that sum fuses: one group
        v0 = torch.nn.functional.hardsigmoid(x0)
        x0.neg_()
        v3 = x0.sum(-1, keepdim=True)
        return torch.lerp(x0, torch.log(v0 + 0.5), x1) + v3

    for use_llvm in (True, False):
        check(f, torch.rand(4, dtype=torch.float64), torch.rand((), dtype=torch.float64),
              use_llvm=use_llvm, groups=1)


def test_a_read_through_a_view_a_group_took_in_does_not_move_past_the_write():
    def f(x0, x2):  # from fuzz seed 141937: the sum reads x0 through v0 before sigmoid_
        v0 = x0.reshape(-1)  # (taken into hardswish's group, then moved back out of it)
        v2 = v0.sum(-1, keepdim=True)
        v6 = torch.asin(torch.nn.functional.hardswish(v0))
        v7 = torch.pow(-1.5, x2)
        v9 = torch.sign(x0.sigmoid_())
        return v6, v7, v9, torch.sqrt(v2.to(torch.int16))

    check(f, torch.tensor(-59.25), torch.tensor(0.5), groups=None)


def test_a_copy_of_another_dtype_and_shape_is_read_as_the_input():
    def f(x0, x1):  # from fuzz seed 700081: later readers must see x0's dtype and shape
        x0.copy_(x1)
        return torch.rsqrt(x0) * 2

    check(f, torch.rand(1, 3, dtype=torch.bfloat16), torch.randint(1, 5, (3,), dtype=torch.int32),
          groups=None)


def slice_then_read(x, y):
    x[..., 2:5] = torch.tanh(y)
    return x * 2


def box_then_read(x, y):
    x[1:3, :4] = y * y
    return torch.sigmoid(x) + x[0:1]  # a view of x after the write: left unfused


def rows_then_read(x, y):
    x[2:4] = y + 1
    return x.relu()


@pytest.mark.parametrize("use_llvm", BACKENDS)
def test_readers_after_a_slice_assignment_read_the_new_value(use_llvm):
    f = check(slice_then_read, torch.randn(3, 4, 7), torch.randn(3, 4, 3), use_llvm=use_llvm)
    (ops,) = _ops(f, torch.randn(3, 4, 7), torch.randn(3, 4, 3))
    assert {"aten::cat", "aten::copy_", "aten::tanh", "aten::mul"} <= set(ops)
    check(rows_then_read, torch.randn(6, 5), torch.randn(2, 5), use_llvm=use_llvm)
    check(rows_then_read, torch.randn(5, 6).t(), torch.randn(2, 5), use_llvm=use_llvm)
    check(box_then_read, torch.randn(5, 6), torch.randn(2, 4), use_llvm=use_llvm, groups=None)


def test_writes_into_elements_that_share_memory_raise_as_eager():
    def through_expand(x, y):
        x.unsqueeze(0).expand(3, 4)[0:3].copy_(y)
        return x * 2

    def into_expanded(x, y):
        x.add_(y)
        return x * 2

    for fn, x, y in [(through_expand, torch.randn(4), torch.randn(3, 4)),
                     (into_expanded, torch.randn(3, 1).expand(3, 4), torch.randn(3, 4))]:
        with pytest.raises(RuntimeError, match="single memory location"):
            fn(x.clone() if fn is through_expand else x, y)
        f = nncfuse.jit(fn)
        with pytest.raises(RuntimeError, match="single memory location"):
            f(x.clone() if fn is through_expand else x, y)
    assert not inplace._distinct_elements(TensorMeta.of(torch.randn(3, 1).expand(3, 4)))
    assert not inplace._distinct_elements(TensorMeta.of(torch.randn(9).as_strided((3, 3), (1, 1))))
    assert inplace._distinct_elements(TensorMeta.of(torch.randn(4, 6)[:, ::2].t()))


# -- in-place ops through views of an input (not slice assignments) ---------------------------


def transposed_add(x, y):
    x.transpose(0, 1).add_(y)
    return y * 2 + 1


def row_relu(x, y):
    x[0].relu_()
    return y * 2 + 1


def flat_mul(x, y):
    x.view(-1).mul_(2)
    return y.sigmoid() * 3


def strided_mul(x, y):
    x[:, ::2].mul_(y)
    return y * 2 + 1


def permuted_sub(x, y):
    x.permute(2, 0, 1).sub_(y)
    return y.exp() + 1


def row_masked_fill(x, m):
    x[1].masked_fill_(m, float("nan"))
    return m.float() * 2 + 1


def read_view_then_write(x, y):
    a = x.t() * 2  # the old values, through another view
    x.t().add_(y)
    return a + 1


def sliced_transpose_sub(x, y):
    x.t()[1:].sub_(y[1:])  # a chain of two views
    return y.sigmoid() + 1


def transposed_add_returns_input(x, y):
    x.t().add_(y)
    return x


VIEW_WRITES = {
    "sliced_transpose_sub": (sliced_transpose_sub, (4, 3), (3, 4)),
    "transposed_add_returns_input": (transposed_add_returns_input, (4, 3), (3, 4)),
    "transposed_add": (transposed_add, (4, 3), (3, 4)),
    "row_relu": (row_relu, (4, 3), (3,)),
    "flat_mul": (flat_mul, (4, 3), (3,)),
    "strided_mul": (strided_mul, (4, 5), (4, 3)),
    "permuted_sub": (permuted_sub, (2, 3, 4), (4, 2, 3)),
    "read_view_then_write": (read_view_then_write, (4, 3), (3, 4)),
}


def _into_bigger(shape):
    """A tensor of `shape` inside a bigger one (an offset and padding around it), and the
    bigger one: a write outside `shape`'s elements would show in it."""
    base = torch.randn(*(n + 2 for n in shape))
    return base, base[tuple(slice(1, n + 1) for n in shape)]


@pytest.mark.parametrize("use_llvm", BACKENDS)
@pytest.mark.parametrize("name", list(VIEW_WRITES))
def test_in_place_ops_on_views_of_an_input_write_as_eager(name, use_llvm):
    fn, x_shape, y_shape = VIEW_WRITES[name]
    x, y = torch.randn(*x_shape), torch.randn(*y_shape)
    x.view(-1)[:3] = torch.tensor([float("nan"), float("-inf"), -0.0])
    f = check(fn, x, y, use_llvm=use_llvm)
    assert "aten::copy_" in sum(_ops(f, x.clone(), y), []), f.graph_for(x.clone(), y)
    if name == "flat_mul":
        return  # view(-1) needs a contiguous x
    for _ in range(2):  # the whole storage: nothing outside x's elements changes
        base, inner = _into_bigger(x_shape)
        theirs = base.clone()
        f(inner, y)
        fn(theirs[tuple(slice(1, n + 1) for n in x_shape)], y)
        torch.testing.assert_close(base, theirs, equal_nan=True, rtol=0, atol=0)
    check(fn, torch.randn(*reversed(x_shape)).transpose(0, -1), y, use_llvm=use_llvm,
          groups=None)  # a non-contiguous input


@pytest.mark.parametrize("use_llvm", BACKENDS)
def test_masked_fill_on_a_view_with_a_broadcast_mask(use_llvm):
    f = check(row_masked_fill, torch.randn(4, 3), torch.rand(3) > 0.5, use_llvm=use_llvm)
    assert "aten::copy_" in sum(_ops(f, torch.randn(4, 3), torch.rand(3) > 0.5), [])


def read_view_after_write(x, y):
    v = x.t()
    x.t().add_(y)
    return v * 2  # sees the new values


def read_input_after_view_write(x, y):
    x.t().add_(y)
    return x * 2


def two_writes_on_one_view(x, y):
    v = x.t()
    v.add_(y)
    v.mul_(2)
    return y + 1


def returned_written_view(x, y):
    return x.t().add_(y)


def diagonal_write(x):
    x.diagonal().add_(1)
    return x * 2


@pytest.mark.parametrize("fn", [read_view_after_write, read_input_after_view_write,
                                two_writes_on_one_view, returned_written_view])
def test_view_writes_it_cannot_prove_exact_stay_exact(fn):
    """Unfused (or partly fused) but exact: values, storage and returned views as eager."""
    x, y = torch.randn(4, 3), torch.randn(3, 4)
    f = check(fn, x, y, groups=None)
    mine, theirs = x.clone(), x.clone()
    got, want = f(mine, y), fn(theirs, y)
    torch.testing.assert_close(mine, theirs)
    if fn is returned_written_view:
        assert got.data_ptr() == mine.t().data_ptr() and got.stride() == want.stride()
    check(diagonal_write, torch.randn(3, 3), groups=None)


def test_an_in_place_op_on_a_view_is_a_view_write():
    def f(x, y):
        x[1:3].t().mul_(y)
        return y * 2

    graph = torch.jit.script(f).graph
    shapes = {"aten::slice": (2, 3), "aten::t": (3, 2), "aten::mul_": (3, 2)}
    for value, shape in zip(graph.inputs(), [(4, 3), (3, 2)]):
        value.setType(TensorMeta.of(torch.empty(shape)).to_type())
    for node in graph.nodes():
        if node.kind() in shapes:
            example = torch.empty(4, 3)[1:3] if node.kind() == "aten::slice" else \
                torch.empty(4, 3)[1:3].t()
            node.output().setType(TensorMeta.of(example).to_type())
    written = inplace.functionalize_input_writes(graph)
    kinds = [n.kind() for n in graph.nodes()]
    assert "aten::mul_" not in kinds and "aten::mul" in kinds, graph
    assert any(isinstance(n, torch._C.Node) and n.kind() == "aten::copy_" for n in written), graph


def stack_then_write(x, y):
    v = x.squeeze()  # a returned view: the write to x stays as the program wrote it
    s = torch.nn.functional.silu(torch.stack([y, x], 0))
    w = x.tanh_()
    return v, w, torch.sqrt(s)


def cat_then_write(x, y):
    c = torch.cat([y, x], 0)
    v = x.t()
    x.mul_(2)
    return v, (c * 3).relu()


@pytest.mark.parametrize("fn,shapes", [(stack_then_write, [(), ()]),
                                       (cat_then_write, [(3, 3), (2, 3)])])
def test_a_list_read_before_a_write_does_not_move_past_it(fn, shapes):
    """Fuzzer seeds 51130, 50760: a stack or cat reads the input through its list; the fuser
    took the list for no reader of the written input and moved the cat past the write."""
    for size in (1, 2):
        f = nncfuse.jit(fn, min_group_size=size)
        for _ in range(3):
            args = [torch.rand(s) for s in shapes]
            mine, theirs = [a.clone() for a in args], [a.clone() for a in args]
            torch.testing.assert_close(f(*mine), fn(*theirs))
            torch.testing.assert_close(mine, theirs)
