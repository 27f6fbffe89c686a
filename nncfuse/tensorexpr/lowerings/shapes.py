"""Views, shapes and concatenation: index arithmetic, never a copy inside a group.

A view's output element at `indices` is its input's element at other
indices; nothing is computed, so when the view is inlined into its consumer
(`inline_intermediates`) the consumer reads the view's source directly:

    (x + 1).transpose(0, 1).relu()    ->   for i: for j: out[i, j] = relu(x[j, i] + 1.f)

- reshape family (view, reshape, flatten, unflatten, squeeze, unsqueeze,
  view_as, reshape_as, contiguous): eager's result holds the input's
  elements in logical (row-major) order. Input and output dimensions are
  grouped into runs of equal products (size-1 dimensions left out); within a
  run, the output's indices give a linear index that is split into the
  input's with division and remainder by constant sizes, which `simplify`
  resolves against the loop ranges where the layout allows it.
- permutations (permute, transpose, t, movedim, swapaxes, swapdims, mT,
  numpy_T, adjoint): the input index of dimension `perm[k]` is output index
  `k`; `perm` comes from applying the op to a meta tensor.
- slices (slice with steps, select, narrow): `start + i * step` along one
  dimension.
- constant padding, flip, roll, tril, triu and repeat: fresh tensors in
  eager, but still the input at other indices (or a constant).
- index_select and gather: the index along one dim is loaded from a tensor of
  indices, a kernel input whose range is checked before the kernel runs
  (eager raises on an index out of range; the kernel never reads outside).
- cat and stack: the element of the part whose range along the dimension
  holds the index, a chain of `Select`s; each part is read at an index
  clamped into its range, so no lane reads outside a part even where the
  select discards it. `partition_loops` then splits the loop over that
  dimension at the part boundaries, so each part is read by its own loop
  with no select and no clamp ("cat writes each part in place").

The sizes these ops take are read from the profiled output type, which the
kernel is specialized to; the fuser only takes them when their operands are
constants (`constant_operands`), since a kernel cannot follow sizes that
change from call to call with the same input types. Returned views of a
group's inputs are moved out of the group by the fuser (they stay eager's
views); `require_private_alias` refuses the rest.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from .. import expr as E
from ..dtype import INDEX
from .casts import convert, fits, require_private_alias
from .registry import (
    Ctx,
    ListArg,
    LoweringError,
    TensorArg,
    register,
    scalar_dtype,
)

_RESHAPES = (
    "aten::view", "aten::reshape", "aten::flatten", "aten::unflatten", "aten::squeeze",
    "aten::unsqueeze", "aten::view_as", "aten::reshape_as", "aten::contiguous",
)
_RESHAPE_OVERLOADS = ("", "using_ints", "int", "dim", "dims")
_PERMUTATIONS = (
    "aten::permute", "aten::transpose", "aten::t", "aten::movedim", "aten::swapaxes",
    "aten::swapdims", "aten::mT", "aten::numpy_T", "aten::adjoint",
)
_PERMUTATION_OVERLOADS = ("", "int", "intlist", "a")


def _source(ctx: Ctx) -> TensorArg:
    """The viewed tensor, of the output's dtype; a returned view must be a private one."""
    source = ctx.args[0]
    if not isinstance(source, TensorArg):
        raise LoweringError(f"{ctx.node.kind()} of a non-tensor")
    if source.dtype != ctx.out_dtype:
        raise LoweringError(f"{ctx.node.kind()} changes the dtype")
    require_private_alias(ctx.node)
    return source


Monomial = tuple[int, tuple[E.Expr, ...]]  # (its factors: symbols, and sums of sizes)


def add_sizes(a: int | E.Expr, b: int | E.Expr) -> int | E.Expr:
    """`a + b`, sizes of a dynamic kernel: an int where both are, else an expression."""
    if isinstance(a, int) and isinstance(b, int):
        return a + b
    if isinstance(a, int) and a == 0:
        return b
    if isinstance(b, int) and b == 0:
        return a
    return E.as_expr(a, INDEX) + E.as_expr(b, INDEX)


def monomial(size: int | E.Expr) -> Monomial:
    """`size` (an int, a size symbol or a product of them: a dynamic kernel's sizes) as its
    int factor and its factors in name order; LoweringError for any other expression. A sum
    of sizes (`add_sizes`: a cat's length) is a factor of its own, as a symbol is, so that a
    reshape keeping it whole (an unsqueeze after a cat) maps it to itself:

        [2, s0 + 1, 8]  ->  (16, (s0 + 1,))
    """
    if isinstance(size, int):
        return size, ()
    if isinstance(size, E.Imm):
        return int(size.value), ()  # type: ignore[arg-type]
    if isinstance(size, E.Var):
        return 1, (size,)
    if isinstance(size, E.Mul):
        (a, va), (b, vb) = monomial(size.a), monomial(size.b)
        return a * b, tuple(sorted(va + vb, key=_factor_name))
    if isinstance(size, E.Add):
        monomial(size.a), monomial(size.b)  # (of sizes: raises for anything else)
        return 1, (size,)
    raise LoweringError(f"size {size} is not a product of size symbols")


def _factor_name(factor: E.Expr) -> str:
    """A monomial's factors' order: a symbol's name, a sum's printed form."""
    return factor.name if isinstance(factor, E.Var) else str(factor)


def _divides(a: Monomial, b: Monomial) -> bool:
    """Whether `a` divides `b` whatever the symbols' values."""
    rest = list(b[1])
    for v in a[1]:
        if v not in rest:
            return False
        rest.remove(v)
    return a[0] != 0 and b[0] % a[0] == 0


def _grows_input(p_in: int | E.Expr, p_out: int | E.Expr) -> bool:
    """In `reshape_indices`, whether the run of input dims grows (else the output's): the
    smaller product; with symbols, the one that divides the other (else LoweringError)."""
    if isinstance(p_in, int) and isinstance(p_out, int):
        return p_in < p_out
    a, b = monomial(p_in), monomial(p_out)
    if _divides(a, b) or _divides(b, a):
        return _divides(a, b)
    raise LoweringError("a reshape whose runs of dims are not products of each other")


def product(shape: Sequence[int | E.Expr]) -> Monomial:
    """The product of `shape`'s sizes as a `monomial`."""
    coef, syms = 1, ()
    for size in shape:
        c, v = monomial(size)
        coef, syms = coef * c, syms + v
    return coef, tuple(sorted(syms, key=_factor_name))


def reshape_indices(
    in_shape: Sequence[int | E.Expr], out_shape: Sequence[int | E.Expr],
    indices: Sequence[E.Expr],
) -> tuple[E.Expr, ...]:
    """Indices into a tensor of `in_shape` of the element that a row-major reshape to
    `out_shape` puts at `indices`. Sizes may be a dynamic kernel's products of symbols
    (`monomial`): runs of dims then close where their products are the same monomial, and
    no index is divided by a symbol (LoweringError: it may be 0)."""
    if product(in_shape) != product(out_shape):
        raise LoweringError(f"cannot reshape {tuple(in_shape)} to {tuple(out_shape)}")
    result: list[E.Expr] = [E.imm(0)] * len(in_shape)
    if math.prod(out_shape) == 0:
        return tuple(result)  # no element is ever read
    ins = [d for d, n in enumerate(in_shape) if n != 1]
    outs = [d for d, n in enumerate(out_shape) if n != 1]
    a = b = 0
    while a < len(ins):
        group_in, group_out = [ins[a]], [outs[b]]
        p_in, p_out = in_shape[ins[a]], out_shape[outs[b]]
        a, b = a + 1, b + 1
        while monomial(p_in) != monomial(p_out):
            if _grows_input(p_in, p_out):
                group_in.append(ins[a])
                p_in *= in_shape[ins[a]]
                a += 1
            else:
                group_out.append(outs[b])
                p_out *= out_shape[outs[b]]
                b += 1
        linear = indices[group_out[0]]
        for d in group_out[1:]:
            linear = linear * out_shape[d] + indices[d]
        for k, d in enumerate(group_in):
            inner = math.prod(in_shape[e] for e in group_in[k + 1 :])
            if not isinstance(inner, int) or (k > 0 and not isinstance(in_shape[d], int)):
                raise LoweringError("a reshape that divides an index by a size symbol")
            index = linear if inner == 1 else linear / inner
            result[d] = index if k == 0 else index % in_shape[d]
    return tuple(result)


@register(_RESHAPES, overloads=_RESHAPE_OVERLOADS, constant_operands=True, view=True,
          dynamic=True)
def reshape(ctx: Ctx) -> E.Expr:
    """The element at the same position in row-major order."""
    source = _source(ctx)
    return ctx.load_at(source, reshape_indices(source.shape, ctx.out_shape, ctx.indices))


def _permutation(ctx: Ctx, ndim: int) -> list[int]:
    """Output dimension k of the node is input dimension perm[k]: the op applied to a meta
    tensor whose strides name the dimensions."""
    name, _, overload = ctx.node.schema().partition("(")[0].partition(".")
    op = getattr(getattr(torch.ops.aten, name.split("::")[1]), overload or "default")
    probe = torch.empty_strided((1,) * ndim, [1 << d for d in range(ndim)], device="meta")
    try:
        out = op(probe, *(ctx.const(k) for k in range(1, len(ctx.args))))
    except (RuntimeError, IndexError, TypeError) as e:
        raise LoweringError(f"{ctx.node.kind()}: {e}") from e
    return [s.bit_length() - 1 for s in out.stride()]


@register(_PERMUTATIONS, overloads=_PERMUTATION_OVERLOADS, constant_operands=True, view=True,
          dynamic=True)
def permute(ctx: Ctx) -> E.Expr:
    """The input element whose indices are the output's, permuted."""
    source = _source(ctx)
    perm = _permutation(ctx, len(source.shape))
    if sorted(perm) != list(range(len(source.shape))):
        raise LoweringError(f"{ctx.node.kind()} is not a permutation")
    indices: list[E.Expr] = [E.imm(0)] * len(perm)
    for k, d in enumerate(perm):
        indices[d] = ctx.indices[k]
    return ctx.load_at(source, indices)


def _dim(ctx: Ctx, k: int, ndim: int) -> int:
    d = ctx.const(k)
    if not isinstance(d, int) or not -max(ndim, 1) <= d < max(ndim, 1):
        raise LoweringError(f"dimension {d} out of range")
    return d % max(ndim, 1)


def _along(ctx: Ctx, source: TensorArg, dim: int, index: E.Expr, keep: bool) -> E.Expr:
    """`source` at the output's indices, with `index` along `dim` (inserted if not `keep`)."""
    indices = list(ctx.indices)
    if keep:
        indices[dim] = index
    else:
        indices.insert(dim, index)
    return ctx.load_at(source, indices)


@register("aten::slice", overloads=("Tensor",), constant_operands=True, view=True,
          dynamic=True)
def slice_(ctx: Ctx) -> E.Expr:
    """Output index i along `dim` reads `start + i * step` (start clamped as eager does)."""
    source = _source(ctx)
    dim = _dim(ctx, 1, len(source.shape))
    size = source.shape[dim]
    start, step = ctx.const(2), ctx.const(4)
    start = 0 if start is None else start
    step = 1 if step is None else step
    if step < 1:
        raise LoweringError("slice step must be positive")
    if start < 0:
        start += size
    if isinstance(size, int):  # (symbolic: a whole slice, or bounds its guard admits)
        start = min(max(start, 0), size)
    if not isinstance(ctx.out_shape[dim], int) or ctx.out_shape[dim] > 1:
        index = ctx.indices[dim] * step + start
    else:
        index = E.as_expr(start, INDEX)
    return _along(ctx, source, dim, index, keep=True)


@register("aten::select", overloads=("int",), constant_operands=True, view=True,
          dynamic=True)
def select(ctx: Ctx) -> E.Expr:
    """The input at `index` along `dim`, the output's indices elsewhere."""
    source = _source(ctx)
    dim = _dim(ctx, 1, len(source.shape))
    index, size = ctx.const(2), source.shape[dim]
    if not -size <= index < size:
        raise LoweringError(f"select index {index} out of range")
    return _along(ctx, source, dim, E.imm(index % size), keep=False)


@register("aten::narrow", overloads=("",), constant_operands=True, view=True,
          dynamic=True)
def narrow(ctx: Ctx) -> E.Expr:
    """Output index i along `dim` reads `start + i`."""
    source = _source(ctx)
    dim = _dim(ctx, 1, len(source.shape))
    start, size = ctx.const(2), source.shape[dim]
    if start < 0:
        start += size
    return _along(ctx, source, dim, ctx.indices[dim] + start, keep=True)


# -- cat and stack ---------------------------------------------------------------------


def concat(
    ctx: Ctx, parts: Sequence[TensorArg], dim: int, lengths: Sequence[int | E.Expr],
    stacked: bool,
) -> E.Expr:
    """The element of the part whose range along `dim` holds the output's index there.

    Part p covers `[offset_p, offset_p + lengths[p])`; it is read at the index
    minus its offset, clamped into its range (the select evaluates every
    branch, and so do vector lanes). With `stacked`, each part lacks `dim`
    (its length is 1) and is read without it. In a dynamic kernel a length may
    be a product of size symbols (a KV cache's past length): its offsets are
    sums, and the kernel's guard makes sure that such a part is not empty
    (`graph_lowering._check_cat`), so that its clamped index is one of its own.
    """
    k = ctx.indices[dim]
    offsets: list[int | E.Expr] = [0]
    for n in lengths:
        offsets.append(add_sizes(offsets[-1], n))
    present = [p for p, n in enumerate(lengths) if not isinstance(n, int) or n > 0]
    if not present:
        return E.cast(ctx.out_dtype, E.imm(0))  # an empty output: never evaluated
    value: E.Expr | None = None
    for p in reversed(present):
        start = offsets[p]
        local = k if isinstance(start, int) and start == 0 else k - E.as_expr(start, INDEX)
        if p != present[0] and not stacked:
            local = E.Max(local, E.imm(0))
        if p != present[-1] and not stacked:
            last = lengths[p] - 1 if isinstance(lengths[p], int) else lengths[p] - E.imm(1)
            local = E.Min(local, E.as_expr(last, INDEX))
        indices = list(ctx.indices)
        if stacked:
            del indices[dim]
        else:
            indices[dim] = local
        element = convert(ctx.load_at(parts[p], indices), ctx.out_dtype)
        if value is None:
            value = element
        else:
            value = E.Select(E.cmp("<", k, E.as_expr(offsets[p + 1], INDEX)), element, value)
    assert value is not None
    return value


def _parts(ctx: Ctx) -> list[TensorArg]:
    items = ctx.args[0]
    if not isinstance(items, ListArg):
        raise LoweringError(f"{ctx.node.kind()} of a list not built in the group")
    if not all(isinstance(a, TensorArg) for a in items.items):
        raise LoweringError(f"{ctx.node.kind()} of something not a tensor")
    return list(items.items)  # type: ignore[arg-type]


@register(("aten::cat", "aten::concat", "aten::concatenate"), overloads=("",),
          constant_operands=True, dynamic=True)
def cat(ctx: Ctx) -> E.Expr:
    """Parts one after another along `dim`; 1-dim empty parts are skipped, as eager does."""
    parts = [p for p in _parts(ctx) if p.shape != (0,) or len(ctx.out_shape) == 1]
    dim = _dim(ctx, 1, len(ctx.out_shape))
    for p in parts:
        if len(p.shape) != len(ctx.out_shape):
            raise LoweringError("cat of tensors of different ranks")
    return concat(ctx, parts, dim, [p.shape[dim] for p in parts], stacked=False)


@register("aten::stack", overloads=("",), constant_operands=True)
def stack(ctx: Ctx) -> E.Expr:
    """Part p at index p of a new dimension `dim`."""
    parts = _parts(ctx)
    dim = _dim(ctx, 1, len(ctx.out_shape))
    for p in parts:
        if len(p.shape) + 1 != len(ctx.out_shape):
            raise LoweringError("stack of tensors of different ranks")
    return concat(ctx, parts, dim, [1] * len(parts), stacked=True)


# -- padding, flips, rolls, triangles: fresh tensors, still index arithmetic -------------------


def _source_of_type(ctx: Ctx) -> TensorArg:
    source = ctx.args[0]
    if not isinstance(source, TensorArg) or source.dtype != ctx.out_dtype:
        raise LoweringError(f"{ctx.node.kind()} of a non-tensor or to another dtype")
    return source


def _pad_value(ctx: Ctx, k: int) -> E.Expr:
    value = ctx.const(k)
    value = 0 if value is None else value
    if not fits(value, ctx.out_dtype):
        raise LoweringError(f"pad value {value!r} does not fit {ctx.out_dtype}: eager raises")
    return convert(E.imm(value, scalar_dtype(value)), ctx.out_dtype)


@register("aten::constant_pad_nd", overloads=("",), constant_operands=True)
@register("aten::pad", overloads=("",), constant_operands=True)
def constant_pad(ctx: Ctx) -> E.Expr:
    """`value` outside the input's range (pads `(before, after)` from the last dim back;
    negative pads crop), the input shifted by the `before` pads inside it."""
    source = _source_of_type(ctx)
    if ctx.node.kind() == "aten::pad" and ctx.const(2) != "constant":
        raise LoweringError(f"pad mode {ctx.const(2)!r}")
    pads = list(ctx.const(1))
    ndim = len(source.shape)
    if len(pads) % 2 or len(pads) // 2 > ndim:
        raise LoweringError("pad must have an even length of at most twice the dims")
    fill = _pad_value(ctx, 2 if ctx.node.kind() == "aten::constant_pad_nd" else 3)
    indices = list(ctx.indices)
    inside: list[E.Expr] = []
    for k in range(len(pads) // 2):
        d, before = ndim - 1 - k, pads[2 * k]
        size, i = source.shape[d], ctx.indices[d]
        local = i - before if before else i
        if before > 0:
            inside.append(E.cmp(">=", i, E.imm(before)))
            local = E.Max(local, E.imm(0))
        if before + size < ctx.out_shape[d]:
            inside.append(E.cmp("<", i, E.imm(before + size)))
            local = E.Min(local, E.imm(max(size - 1, 0)))
        indices[d] = local
    if math.prod(source.shape) == 0:
        return fill  # all padding
    value = ctx.load_at(source, indices)
    for cond in reversed(inside):
        value = E.Select(cond, value, fill)
    return value


@register("aten::flip", overloads=("",), constant_operands=True)
def flip(ctx: Ctx) -> E.Expr:
    """Index `size - 1 - i` along each flipped dim."""
    source = _source_of_type(ctx)
    ndim = len(source.shape)
    dims = {d % max(ndim, 1) for d in ctx.const(1)}
    indices = [
        E.imm(source.shape[d] - 1) - i if d in dims and source.shape[d] > 1 else i
        for d, i in enumerate(ctx.indices)
    ]
    return ctx.load_at(source, indices)


@register("aten::roll", overloads=("",), constant_operands=True)
def roll(ctx: Ctx) -> E.Expr:
    """Index `i - shift` modulo the size along each rolled dim (a select, which
    `partition_loops` splits); without dims, the flattened tensor rolls."""
    source = _source_of_type(ctx)
    shifts, dims = list(ctx.const(1)), list(ctx.const(2) or [])
    if not dims:
        if len(shifts) != 1:
            raise LoweringError("roll without dims takes one shift")
        n = math.prod(source.shape)
        if n == 0:
            return ctx.load_at(source, [E.imm(0)] * len(source.shape))  # never evaluated
        flat = reshape_indices((n,), ctx.out_shape, ctx.indices)[0]
        rolled = _rolled(flat, shifts[0], n)
        return ctx.load_at(source, reshape_indices(source.shape, (n,), (rolled,)))
    if len(shifts) != len(dims):
        raise LoweringError("roll takes a shift per dim")
    ndim = len(source.shape)
    indices = list(ctx.indices)
    for shift, d in zip(shifts, dims):
        d = d % max(ndim, 1)
        indices[d] = _rolled(indices[d], shift, source.shape[d])
    return ctx.load_at(source, indices)


def _rolled(i: E.Expr, shift: int, size: int) -> E.Expr:
    s = shift % size if size else 0
    if s == 0:
        return i
    return E.Select(E.cmp("<", i, E.imm(s)), i + (size - s), i - s)


@register(("aten::tril", "aten::triu"), overloads=("",), constant_operands=True)
def triangle(ctx: Ctx) -> E.Expr:
    """The input where column - row <= diagonal (tril) or >= diagonal (triu), else 0."""
    source = _source_of_type(ctx)
    if len(source.shape) < 2:
        raise LoweringError(f"{ctx.node.kind()} of fewer than 2 dims")
    diagonal = ctx.const(1) or 0
    row, col = ctx.indices[-2], ctx.indices[-1]
    op = "<=" if ctx.node.kind() == "aten::tril" else ">="
    keep = E.cmp(op, col, row + diagonal if diagonal else row)
    return E.Select(keep, ctx.load(source), E.cast(ctx.out_dtype, E.imm(0)))


@register("aten::repeat", overloads=("",), constant_operands=True)
def repeat(ctx: Ctx) -> E.Expr:
    """Index `i % size` along each dim (the repeats lead with new dims, read nowhere)."""
    source = _source_of_type(ctx)
    ndim = len(source.shape)
    if len(ctx.const(1)) < ndim:
        raise LoweringError("repeat takes at least one repeat per dim")
    indices = ctx.indices[len(ctx.indices) - ndim :]
    if math.prod(ctx.out_shape) == 0:
        return ctx.load_at(source, [E.imm(0)] * ndim)  # never evaluated
    return ctx.load_at(source, [
        i if n == out else i % n
        for i, n, out in zip(indices, source.shape, ctx.out_shape[len(ctx.out_shape) - ndim :])
    ])


# -- index_select, gather: a tensor of indices, read as a load ---------------------------------


def _index_arg(ctx: Ctx, k: int, size: int) -> TensorArg:
    """Operand `k`, an integer tensor of indices into a dimension of `size`: a kernel input,
    checked before the kernel runs (eager raises on an index outside `[0, size)`)."""
    index = ctx.args[k]
    if not isinstance(index, TensorArg):
        raise LoweringError(f"{ctx.node.kind()} of indices that are not a tensor")
    if index.numel and index.dtype.torch not in (torch.int32, torch.int64):
        raise LoweringError(f"{ctx.node.kind()} takes an int32 or int64 tensor of indices")

    def in_range(t: torch.Tensor) -> bool:
        return t.numel() == 0 or bool(t.min() >= 0) and bool(t.max() < size)

    ctx.require(index, in_range, f"{ctx.node.kind()}: index out of range in self")
    return index


def _of_scalar(ctx: Ctx, source: TensorArg) -> E.Expr:
    """index_select or gather of a 0-dim tensor: one index, which must be 0."""
    _dim(ctx, 1, 0)
    if _index_arg(ctx, 2, 1).numel != 1 or math.prod(ctx.out_shape) != 1:
        raise LoweringError(f"{ctx.node.kind()} of a 0-dim tensor takes one index")
    return ctx.load_at(source, [])


def _as_index(value: E.Expr) -> E.Expr:
    return value if value.dtype == INDEX else E.cast(INDEX, value)


@register("aten::index_select", overloads=("",), constant_operands=True)
def index_select(ctx: Ctx) -> E.Expr:
    """Output index i along `dim` reads the input at `index[i]`."""
    source = _source_of_type(ctx)
    if not source.shape:
        return _of_scalar(ctx, source)
    dim = _dim(ctx, 1, len(source.shape))
    index = _index_arg(ctx, 2, source.shape[dim])
    if len(index.shape) > 1:
        raise LoweringError("index_select takes a 1-dim tensor of indices")
    if not index.numel:
        return E.cast(ctx.out_dtype, E.imm(0))  # an empty output: never evaluated
    position = ctx.indices[dim] if index.shape else E.imm(0)
    read = _as_index(ctx.load_at(index, [position] * len(index.shape)))
    return _along(ctx, source, dim, read, keep=True)


@register("aten::gather", overloads=("",), constant_operands=True)
def gather(ctx: Ctx) -> E.Expr:
    """The input at the output's indices, with `index` at them along `dim`."""
    source = _source_of_type(ctx)
    if ctx.const(3):
        raise LoweringError("gather with a sparse gradient")
    if not source.shape:
        return _of_scalar(ctx, source)
    dim = _dim(ctx, 1, len(source.shape))
    index = _index_arg(ctx, 2, source.shape[dim])
    if index.shape != ctx.out_shape or len(index.shape) != len(source.shape) or any(
        n > m for d, (n, m) in enumerate(zip(index.shape, source.shape)) if d != dim
    ):
        raise LoweringError("gather's index must fit the input outside `dim`: eager raises")
    if not index.numel:
        return E.cast(ctx.out_dtype, E.imm(0))  # an empty output: never evaluated
    return _along(ctx, source, dim, _as_index(ctx.load(index)), keep=True)
