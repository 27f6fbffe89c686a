"""Comparisons, selection, clamps, bitwise ops, conversions and expand: what OpInfo leaves out.

Every case runs a function through `nncfuse.jit` (LLVM and the interpreter)
and compares with eager exactly: dtype, shape, values (NaN where eager has
NaN), and whether the ops fused. Inputs are 67 elements long where it
matters, so that both the vector loop and its scalar tail run.
"""

import warnings

import pytest
import torch

import nncfuse

NAN, INF = float("nan"), float("inf")
INTS = [torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64]
FLOATS = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
# Values where conversions and comparisons differ between ways of computing them.
SPECIAL = [NAN, INF, -INF, 0.0, -0.0, 0.1, -0.5, 255.9, -1.5, 300.0, -300.0, 70000.0, 3e9, -3e9,
           2.0**31, -(2.0**31) - 1, 1e19, -1e19, 2.0**63, 65535.5, 1 + 2**-11 + 2**-40]


def long(values, dtype):
    """`values` as a tensor of `dtype`, tiled to 67 elements."""
    t = torch.tensor(values, dtype=torch.float64 if isinstance(values[0], float) else None)
    return t.to(dtype).repeat(67 // len(values) + 1)[:67]


def check(fn, *args, fused=True, traced=False):
    """Results of `fn` through nncfuse equal eager's on `args`, fused or not as said."""
    want = fn(*args)
    for use_llvm in (True, False):
        if traced:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                target = torch.jit.trace(fn, args, check_trace=False)
        else:
            target = fn
        f = nncfuse.jit(target, min_group_size=1, use_llvm=use_llvm)
        for _ in range(2):
            got = f(*args)
        for g, w in zip(got, want) if isinstance(want, tuple) else [(got, want)]:
            torch.testing.assert_close(g, w, rtol=0, atol=0, equal_nan=True)
        groups = nncfuse.fusion_groups(f.graph_for(*args))
        if fused:  # every op, not just some
            inside = [k for g in groups for k in aten_kinds(g.g("Subgraph"))]
            assert sorted(inside) == sorted(aten_kinds(f.graph)), f.graph_for(*args)
        else:
            assert not groups, f.graph_for(*args)
    return got


def aten_kinds(graph):
    return [n.kind() for n in graph.nodes() if n.kind().startswith("aten::")]


# -- conversions -------------------------------------------------------------------


@pytest.mark.parametrize("src", FLOATS)
@pytest.mark.parametrize("dst", [*INTS, torch.bool, *FLOATS])
def test_to_converts_extremal_values_as_eager(src, dst):
    """NaN, infinities and out-of-range values, and double rounding into float16/bfloat16."""
    x = long(SPECIAL, src)
    check(lambda x: x.to(dst), x, fused=src != dst, traced=True)


@pytest.mark.parametrize("src", [*INTS, torch.bool])
@pytest.mark.parametrize("dst", [*INTS, torch.bool, *FLOATS])
def test_to_converts_integers_as_eager(src, dst):
    info = torch.iinfo(src) if src != torch.bool else None
    values = [0, 1] if info is None else [info.min, info.max, 0, 1, -1, 2**24 + 1, 65519, 300]
    x = long(values, src)
    check(lambda x: x.to(dst), x, fused=src != dst, traced=True)


def same_type(x):
    return x.to(torch.float32)


def same_type_copied(x):
    return x.to(torch.float32, copy=True)


def same_type_inside(x):
    return x.to(torch.float32) * 2


def same_type_of_computed(x):
    return (x * 2).to(torch.float32)


def same_type_twice(x):
    y = x * 2
    return y, y.to(torch.float32)


def test_to_the_same_type_keeps_eager_aliasing():
    """Eager returns the input itself: a fused copy is only made where nobody can tell."""
    x = torch.randn(67)
    assert check(same_type, x, fused=False).data_ptr() == x.data_ptr()
    assert check(same_type_copied, x).data_ptr() != x.data_ptr()
    check(same_type_inside, x)
    check(same_type_of_computed, x)
    # y * 2 fuses; its returned alias is computed outside the group, as eager's alias of it
    f = nncfuse.jit(same_type_twice, min_group_size=1)
    f(x)
    y, z = f(x)
    assert y.data_ptr() == z.data_ptr()
    torch.testing.assert_close(y, x * 2, rtol=0, atol=0)
    groups = nncfuse.fusion_groups(f.graph_for(x))
    assert [aten_kinds(g.g("Subgraph")) for g in groups] == [["aten::mul"]]


def to_spellings(x, y):
    a = x.to(torch.float64)
    b = x.to(y)
    c = x.to("cpu", torch.int32)
    d = x.to(dtype=torch.int8, copy=True)
    e = x.double() + x.half()
    return a, b, c, d, e


def test_to_spellings_fuse():
    x, y = long([1.5, -2.5, 300.0, NAN], torch.float32), torch.zeros(3, dtype=torch.int16)
    check(to_spellings, x, y)


def test_to_channels_last():
    x = torch.randn(2, 3, 4, 5)
    check(lambda x: x.to(torch.float64, memory_format=torch.channels_last), x, traced=True)
    # The same type in another layout is a copy, not the input itself.
    check(lambda x: x.to(torch.float32, memory_format=torch.channels_last), x, traced=True)


def type_as(x, y):
    return x.type_as(y), (x.type_as(x) + 1).type_as(y)


def type_as_same(x):
    return x.type_as(x)


def test_type_as():
    x, y = long([1.5, -2.5, 300.0, NAN], torch.float32), torch.zeros(2, dtype=torch.int8)
    check(type_as, x, y)
    check(type_as_same, x, fused=False)


def clones(x):
    return (x.t() * 2).clone(), x.sin().clone(memory_format=torch.contiguous_format) + x


def clone_of_input(x):
    return x.clone()


def test_clone_copies_in_the_layout_eager_gives():
    x = torch.tensor(SPECIAL[:12], dtype=torch.float32).reshape(3, 4)
    got = check(clones, x)
    assert [g.stride() for g in got] == [w.stride() for w in clones(x)]
    got = check(clone_of_input, x.t())  # preserve_format: the transposed strides
    assert got.stride() == (1, 4) and got.data_ptr() != x.data_ptr()


# -- expand --------------------------------------------------------------------------


def expand_and_add(x, y):
    return x.expand(3, 4) + y.expand([2, 3, -1]) + x.expand_as(y)


def expand_of_computed(x):
    return (x * 2).expand(5, 3, 4)


def expand_of_input(x):
    return x.expand(5, 3, 4)


def test_expand_broadcasts_and_fuses():
    x, y = torch.randn(4), torch.randn(3, 4)
    check(expand_and_add, x, y)
    check(expand_and_add, torch.randn(1), torch.randn(3, 1))


def test_expand_as_output():
    """A returned expand of a value computed inside has eager's 0 strides; of an input, it
    is eager's view of that input (unfused)."""
    x = torch.randn(3, 1)
    got = check(expand_of_computed, x)
    assert got.stride() == expand_of_computed(x).stride() == (0, 1, 0)
    got = check(expand_of_input, x, fused=False)
    assert got.data_ptr() == x.data_ptr()


# -- comparisons -----------------------------------------------------------------------


def compare_numbers(x):
    return x == 0.1, x < 0.1, x >= 300, x != -1, x > 16777216.0, x <= True


@pytest.mark.parametrize("dtype", [*FLOATS, *INTS, torch.bool])
def test_comparisons_convert_numbers_to_the_common_type(dtype):
    """A float16 tensor is compared with 0.1 rounded to float16; int8 with 300 wrapped."""
    x = long([0.1, 300.0, 44.0, -1.0, 255.0, 16777217.0, NAN, 1.0], torch.float64).to(dtype)
    check(compare_numbers, x)


def compare_tensors(x, y, z):
    return x < y, x == z, torch.ne(z, y), torch.greater_equal(x, z), torch.less(y, 0.5)


def test_comparisons_of_mixed_types_and_0dim_tensors():
    x = long([0.1, 1.0, NAN, -INF, 300.0], torch.float16)
    y = torch.tensor(0.1, dtype=torch.float64)  # 0-dim: rounded to float16
    z = long([44, 300, 1, -1, 0, 7], torch.int16)
    check(compare_tensors, x, y, z)


def compare_scalar_inputs(x, s: float, n: int):
    return x == s, x < n, torch.isnan(x), torch.logical_not(x)


def test_comparisons_with_scalar_inputs():
    x = long([0.1, 1.0, NAN, 0.0, -0.0, 3.0], torch.float16)
    check(compare_scalar_inputs, x, 0.1, 1)
    check(compare_scalar_inputs, x.to(torch.int8), 0.1, 300)


# -- where, masked_fill ----------------------------------------------------------------


def where_mixed(c, x, y):
    return (
        torch.where(c, x, y),
        torch.where(c, x, 2.5),
        torch.where(c, 1, y),
        torch.where(c, 1.0, 2),
        torch.where(c, True, 2),
    )


@pytest.mark.parametrize("dtypes", [(torch.int8, torch.float16), (torch.uint8, torch.int64),
                                    (torch.bool, torch.bfloat16), (torch.float64, torch.int32)])
def test_where_promotes_like_eager(dtypes):
    c = long([True, False, True], torch.bool)
    x = long([1.0, -2.0, 100.0, 0.1], dtypes[0])
    y = torch.tensor(0.3, dtype=dtypes[1])
    check(where_mixed, c, x, y)
    check(where_mixed, c, x, long([0.3, NAN, 7.0], dtypes[1]))


def where_scalar_input(c, x, s: float):
    return torch.where(c, x, s)


def test_where_with_a_scalar_input():
    c = long([True, False, True], torch.bool)
    check(where_scalar_input, c, torch.randn(67, dtype=torch.float64), 0.5)
    # Into float32 eager range-checks the number (1e39 raises): the kernel checks it first.
    x = torch.randn(67)
    check(where_scalar_input, c, x, 0.5)
    f = nncfuse.jit(where_scalar_input, min_group_size=1)
    f(c, x, 0.5)
    assert nncfuse.fusion_groups(f.graph_for(c, x, 0.5))
    with pytest.raises(RuntimeError, match="cannot be converted to type float without overflow"):
        f(c, x, 1e39)


def masked_fill(x, m, v):
    return x.masked_fill(m, 2.7), x.masked_fill(m, v), x.masked_fill(m, -2.7)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int8, torch.bool])
def test_masked_fill(dtype):
    x = long([1.0, 0.0, -3.0], dtype)
    m = long([True, False], torch.bool)
    check(masked_fill, x, m, torch.tensor(5, dtype=dtype))
    # A mask with more dimensions broadcasts the input.
    check(masked_fill, x[:3], torch.tensor([[True], [False]]), torch.tensor(1, dtype=dtype))


# -- maximum, minimum, clamp -----------------------------------------------------------


def min_max(x, y):
    return torch.maximum(x, y), torch.minimum(x, y), torch.max(x, y), torch.min(y, x)


@pytest.mark.parametrize("dtypes", [(torch.float32, torch.float32), (torch.int8, torch.float16),
                                    (torch.bool, torch.bool), (torch.uint8, torch.int8)])
def test_maximum_minimum(dtypes):
    x = long([NAN, 1.0, -2.0, 0.0, 100.0], dtypes[0])
    y = long([1.0, NAN, -3.0, -0.0], dtypes[1])
    check(min_max, x, y)


def clamps(x, lo, hi):
    return (
        x.clamp(0.5, 2.0),
        x.clamp(2.0, 0.5),  # min > max: max
        x.clamp(min=-1.0),
        x.clamp(max=1),
        torch.clamp(x, lo, hi),
        torch.clamp(x, min=lo),
        torch.clamp(x, max=hi),
        torch.clamp_min(x, lo),
        torch.clamp_max(x, hi),
        torch.clip(x, -1, 1),
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int8, torch.int64])
def test_clamp(dtype):
    x = long([NAN, 3.0, -3.0, 0.7, 1.0, -INF], torch.float64).to(dtype)
    lo = long([0.0, NAN, -5.0, 1.0], dtype)
    check(clamps, x, lo, torch.tensor(2, dtype=dtype))


def clamp_scalar_inputs(x, m, lo: float, n: int):
    return x.clamp(min=lo), x.clamp(max=n), x.masked_fill(m, lo), x.masked_fill(m, n)


def test_number_inputs_fuse_with_eager_range_checks():
    """Eager range-checks numbers it converts for clamp and masked_fill (raising on overflow);
    the kernel checks number inputs the same way before running."""
    m = long([True, False], torch.bool)
    check(clamp_scalar_inputs, long([NAN, 3.0, -3.0], torch.float64), m, 0.5, 2)
    check(clamp_scalar_inputs, long([NAN, 3.0, -3.0], torch.float32), m, 0.5, 2)
    f = nncfuse.jit(clamp_scalar_inputs, min_group_size=1)
    x = long([0, 3, -3], torch.int8)
    f(x, m, 0.5, 2)
    assert nncfuse.fusion_groups(f.graph_for(x, m, 0.5, 2))
    with pytest.raises(RuntimeError, match="overflow"):
        f(x, m, 0.5, 300)


def nan_bounds(x):
    nan = float("nan")
    return x.clamp(min=nan), x.clamp(max=nan), x.clamp(nan, 1.0), torch.clamp_min(x, nan)


def test_clamp_with_nan_bounds_is_nan():
    check(nan_bounds, long([NAN, 3.0, -3.0, 0.5], torch.float32))


def clamp_bool(x):
    return x.clamp(min=0), x.clamp(0.5, 1.0)


def test_clamp_promotes_integers_and_bool():
    check(clamp_bool, long([True, False], torch.bool))
    check(lambda x: x.clamp(min=0.5), long([0, 3, -2], torch.int8), traced=True)


# -- bitwise -----------------------------------------------------------------------------


def bitwise(a, b):
    return a & b, a | 3, a ^ b, ~a, a << b, a >> 2, a >> b, a << 257


def bitwise_functions(a, b):
    return (
        torch.bitwise_and(a, b),
        torch.bitwise_or(a, 2),
        torch.bitwise_xor(a, b),
        torch.bitwise_not(a),
        torch.bitwise_left_shift(a, b),
        torch.bitwise_right_shift(a, 3),
        torch.bitwise_left_shift(5, b),
    )


@pytest.mark.parametrize("dtype", INTS)
def test_bitwise_and_shifts_out_of_range(dtype):
    """Shifts by negative amounts and by at least the width, as ATen's kernels do them."""
    info = torch.iinfo(dtype)
    a = long([info.min, info.max, -1 if info.min else 0, 1, 0x5A], dtype)
    b = long([-3, -1, 0, 1, 7, 8, 15, 16, 31, 32, 63, 64, 100], torch.int64).to(dtype)
    check(bitwise, a, b)
    check(bitwise_functions, a, b)


def bool_ops(a, b):
    return a & b, a | b, a ^ b, ~a, a & 3


def test_bitwise_on_bool():
    a, b = long([True, False, True], torch.bool), long([True, True, False, False], torch.bool)
    check(bool_ops, a, b)
