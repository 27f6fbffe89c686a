"""Reductions: sum, mean, prod, amax, amin, max/min (over all dims, or with dim: values and
indices), any, all, argmax, argmin, var, std, var_mean, std_mean, logsumexp,
linalg_vector_norm, softmax, log_softmax; dropout in eval; max_pool2d and
adaptive_avg_pool2d (a max, a mean, over each window). (Normalizations that reduce
over rows, such as layer_norm, are in `normalization.py`.)

An output element of a reduction is a `Reduce` over the reduced dims of its
input. Ops that reduce and then broadcast the result back over the reduced
dims (softmax, log_softmax) give each row statistic its own intermediate nest
over the kept dims (`Ctx.intermediate`), which the output nest loads: the
statistic is computed once per row, not once per element, and `fuse_loops`
then runs the statistics and the output of a row in one sweep while the row
is in cache. Ops with two outputs (max.dim, var_mean) share their row
intermediates through `Ctx.shared`.

Numerics follow ATen's CPU kernels (`ReduceOps.cpp`, `ReduceOpsKernel.cpp`,
`SoftMaxKernel.cpp`):

- float16 and bfloat16 accumulate in float32 and round once at the end;
  mean is the float32 sum divided by the count, then rounded;
- sums are vectorized into several accumulators and combined pairwise
  (`vectorize_reductions`), as close to eager's cascade as a serial sum is not;
- max and min propagate NaN (the `Max`/`Min` rows), and their indices are
  those of the first max or the first NaN; amax/amin of an empty dim raise in
  eager, so such nodes stay unfused; max_pool2d's windows too (its padding
  reads as -inf, which no element is below);
- adaptive_avg_pool2d sums each window in the accumulation type and divides by its
  size, as ATen's CPU kernel (`AdaptiveAvgPoolKernel.cpp`);
- var/std are two-pass (the mean, then the mean squared deviation), never
  E[x^2] - E[x]^2: over contiguous float32/float16/bfloat16 rows of one dim the sums
  are float32 (`_RowSums`: the deviations from a float32 mean, corrected for its
  rounding), and rows where float32 may fall short (non-finite, out of its range,
  nearly constant) take float64 in a branch only they run; otherwise in float64 as
  eager's Welford accumulates; var_mean's mean
  is NaN where Welford's is (an infinity before the row's last element: over
  one dim, the float64 sum of the row but its last element, which the mean
  adds, is then not finite, so the row is swept twice, not three times);
- softmax is `exp(x - max) * (1 / sum)`, log_softmax `x - max - log(sum)`
  (over the last dim of float16/bfloat16 with the sum and its log rounded to
  that type, as ATen keeps them); a float32 softmax keeps its exponentials in
  the output and scales them there (kernels with reductions write no streaming
  stores: `llvm_codegen.compile_stmt`, so computing them again for an uncached
  output does not pay).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

from .. import expr as E
from ..dtype import BOOL, FLOAT64, INT64, UINT8, Dtype
from ..meta import TensorMeta
from .casts import require_private_alias
from .registry import Ctx, LoweringError, TensorArg, compute_type, register, schema_overload

Index = tuple[E.Expr, ...]


def _tensor(ctx: Ctx, k: int = 0) -> TensorArg:
    arg = ctx.arg(k)
    if not isinstance(arg, TensorArg):
        raise LoweringError("reductions take a tensor")
    return arg


def _normalize(dims: Sequence[int], ndim: int) -> tuple[int, ...]:
    """Dims in [0, ndim), sorted, as eager wraps them (a 0-dim tensor takes 0 and -1)."""
    rank = max(ndim, 1)
    out = set()
    for d in dims:
        if not -rank <= d < rank:
            raise LoweringError(f"dim {d} out of range")
        out.add(d % rank)
    if len(out) != len(list(dims)):
        raise LoweringError("a dim appears twice: eager raises")
    return tuple(sorted(d for d in out if d < ndim))


def _dims(ctx: Ctx, k: int, ndim: int) -> tuple[int, ...]:
    """The reduced dims given by operand `k` (an int, a list, None or [] for all)."""
    value = ctx.const(k)
    if value is None:
        return tuple(range(ndim))
    if isinstance(value, int):
        value = [value]
    if not isinstance(value, (list, tuple)) or not all(isinstance(d, int) for d in value):
        raise LoweringError(f"reduced dims must be constant ints, got {value!r}")
    if not value:
        return tuple(range(ndim))
    return _normalize(value, ndim)


#: Whether a dynamic kernel reduces over symbolic extents (sum, mean, softmax: tested in
#: tests/tensorexpr/test_dynamic.py). `vectorize_reductions` vectorizes them with a tail
#: computed at run time: a row sum at 67x1024 6.3 us against 4.8 static (the dynamic entry's
#: cost; 46.6 us unvectorized), softmax 35.9 against 31.2 us. Off: such groups get static kernels.
SYMBOLIC_EXTENTS = True


class _Box:
    """How the output of a reduction over `dims` of `x` indexes `x`."""

    def __init__(self, x: TensorArg, dims: tuple[int, ...], keepdim: bool):
        self.x, self.dims, self.keepdim = x, dims, keepdim
        self.kept = tuple(d for d in range(len(x.shape)) if d not in dims)
        self.sizes = tuple(x.shape[d] for d in dims)
        if not SYMBOLIC_EXTENTS and not all(isinstance(s, int) for s in self.sizes):
            raise LoweringError("a reduction over a symbolic extent (see SYMBOLIC_EXTENTS)")
        self.count = math.prod(self.sizes)  # an expression in a dynamic kernel (size symbols)
        #: whether the reduced dims may hold no element (a symbol may be 0): where eager
        #: raises on that, the op is not fused
        self.may_be_empty = not isinstance(self.count, int) or self.count == 0

    def kept_indices(self, out: Index) -> Index:
        """The output index without the reduced dims (which keepdim leaves at 0)."""
        if self.keepdim:
            return tuple(out[d] for d in self.kept)
        return tuple(out)

    def load(self, kept: Index, reduced: Index, dtype: Dtype | None = None) -> E.Expr:
        """x at kept-dims index `kept` and reduced-dims index `reduced`."""
        idx: list[E.Expr] = [E.imm(0)] * len(self.x.shape)
        for d, i in zip(self.kept, kept):
            idx[d] = i
        for d, i in zip(self.dims, reduced):
            idx[d] = i
        value: E.Expr = E.Load(self.x.buf, tuple(idx))
        return value if dtype is None else E.cast(dtype, value)

    def reduce(
        self, op: str, kept: Index, body: Callable[[Index], E.Expr], init: E.Expr
    ) -> E.Expr:
        """`init` combined with `body(reduced index)` over the reduced dims."""
        names = "rstuvw"
        rvars = tuple(E.Var(names[k] if k < len(names) else f"r{k}") for k in range(len(self.dims)))
        value = body(rvars)
        if not rvars:
            return E.combine(op, init, value)
        return E.Reduce(op, init, value, rvars,
                        tuple(E.imm(s) if isinstance(s, int) else s for s in self.sizes))


def _box(ctx: Ctx, dims_at: int | None, keepdim_at: int | None) -> _Box:
    x = _tensor(ctx)
    ndim = len(x.shape)
    dims = tuple(range(ndim)) if dims_at is None else _dims(ctx, dims_at, ndim)
    keepdim = bool(ctx.const(keepdim_at)) if keepdim_at is not None else False
    return _Box(x, dims, keepdim)


def _input(box: _Box, ctx: Ctx, kept: Index, compute: Dtype) -> Callable[[Index], E.Expr]:
    """The input element converted as eager converts it: to the result type (the `dtype=`
    argument), then to the type it accumulates in."""
    return lambda r: E.cast(compute, E.cast(ctx.out_dtype, box.load(kept, r)))


def _zero(dtype: Dtype) -> E.Expr:
    return E.imm(False if dtype.is_bool else 0.0 if dtype.is_float else 0, dtype)


def _alone_from(elements: int, widest_row: int | None = None) -> Callable[[Any], bool]:
    """`Lowering.alone`: a node whose input has at least `elements` elements (for
    `widest_row`, a last dim at most that wide) is a kernel of its own; below those
    eager's op is as fast (call overhead). The sizes come from `benchmarks/reductions.py`
    at 1 and 2 threads."""

    def alone(node: Any) -> bool:
        meta = TensorMeta.from_type(node.inputsAt(0).type())
        if meta is None:
            return False
        wide = widest_row is not None and bool(meta.sizes) and meta.sizes[-1] > widest_row
        numel = math.prod(meta.sizes)
        return numel >= elements and not wide

    return alone


# -- sum, mean, prod ----------------------------------------------------------------------------

#: op -> (position of dims, of keepdim) per schema overload; None: all dims, no keepdim.
_SUM_ARGS = {"": (None, None), "dim_IntList": (1, 2), "dim": (1, 2), "dim_int": (1, 2)}


def _accumulate(
    ctx: Ctx, op: str, bool_error: str, init: Callable[[Dtype], E.Expr], widen: bool = True
) -> tuple[_Box, E.Expr, Dtype]:
    """sum, mean and prod: the box of reduced dims, `op` (a row of ops.BINARY) over the
    input from `init(compute)`, in the computation type (float32 for float16/bfloat16;
    with `widen` False, the result type itself)."""
    dims_at, keepdim_at = _SUM_ARGS[schema_overload(ctx.node) or ""]
    box = _box(ctx, dims_at, keepdim_at)
    if ctx.out_dtype.is_bool:
        raise LoweringError(bool_error)
    compute = compute_type(ctx.out_dtype) if widen else ctx.out_dtype
    kept = box.kept_indices(ctx.indices)
    return box, box.reduce(op, kept, _input(box, ctx, kept, compute), init(compute)), compute


@register(("aten::sum", "aten::mean"), overloads=("", "dim_IntList", "dim"))
def sum_mean(ctx: Ctx) -> E.Expr:
    """Accumulated in the result type (float32 for float16/bfloat16); mean then divides."""
    box, total, compute = _accumulate(ctx, "Add", "a bool sum", _zero)
    if ctx.node.kind() == "aten::mean":
        if not compute.is_float:
            raise LoweringError("mean of integers: eager raises")
        count = box.count  # (a symbol's product: 0 rows give 0 / 0, NaN, as eager)
        total = total / (E.imm(float(count), compute) if isinstance(count, int)
                         else E.cast(compute, count))
    return E.cast(ctx.out_dtype, total)


@register("aten::prod", overloads=("", "dim_int"))
def prod(ctx: Ctx) -> E.Expr:
    """Accumulated in the result type, float16 and bfloat16 too, as ATen's kernel multiplies
    `scalar_t`s: each product rounds there, and one past its range is infinite (a float16
    row of -3.19, 65504, -0., 1.: NaN, where a float32 product is 0; fuzz seed 100856)."""
    _, total, _ = _accumulate(
        ctx, "Mul", "a bool product", lambda c: E.imm(1.0 if c.is_float else 1, c),
        widen=False)
    return E.cast(ctx.out_dtype, total)


# -- amax, amin, any, all -----------------------------------------------------------------------


@register(("aten::amax", "aten::amin"), overloads=("",))
@register(("aten::max", "aten::min"), overloads=("",))
def amax_amin(ctx: Ctx) -> E.Expr:
    """NaN propagates; an empty reduced dim raises in eager, so it is not fused. `max(x)`,
    `min(x)`: over all dims."""
    full = ctx.node.kind() in ("aten::max", "aten::min")
    box = _box(ctx, None, None) if full else _box(ctx, 1, 2)
    if box.may_be_empty:
        raise LoweringError("amax/amin over an empty dim: eager raises")
    op = "Max" if ctx.node.kind() in ("aten::amax", "aten::max") else "Min"
    dtype = box.x.dtype
    if dtype != ctx.out_dtype:
        raise LoweringError("amax/amin keep the input's type")
    compute = _extreme_type(dtype)
    kept = box.kept_indices(ctx.indices)
    value = box.reduce(op, kept, lambda r: box.load(kept, r, compute), E.identity(op, compute))
    return E.cast(ctx.out_dtype, value)


_ANY_ARGS = {"": (None, None), "dim": (1, 2), "dims": (1, 2)}


@register(("aten::any", "aten::all"), overloads=("", "dim", "dims"))
def any_all(ctx: Ctx) -> E.Expr:
    """`x != 0` or-ed (any) or and-ed (all); uint8 inputs give uint8 results, as eager's."""
    dims_at, keepdim_at = _ANY_ARGS[schema_overload(ctx.node) or ""]
    box = _box(ctx, dims_at, keepdim_at)
    is_any = ctx.node.kind() == "aten::any"
    kept = box.kept_indices(ctx.indices)
    op = "Or" if is_any else "And"
    value = box.reduce(
        op, kept, lambda r: E.cast(BOOL, box.load(kept, r)), E.imm(not is_any, BOOL)
    )
    return E.cast(ctx.out_dtype, value)


# -- dropout in eval ----------------------------------------------------------------------------

_DROPOUTS = ("aten::dropout", "aten::feature_dropout", "aten::alpha_dropout",
             "aten::feature_alpha_dropout")


def _dropout_problem(node: object) -> str | None:
    train = node.inputsAt(2)  # type: ignore[attr-defined]
    if train.node().kind() != "prim::Constant" or train.toIValue() is not False:
        return "dropout in training (random): only eval's identity fuses"
    return None


@register(_DROPOUTS, overloads=("",), constant_operands=True, view=True, problem=_dropout_problem)
def dropout(ctx: Ctx) -> E.Expr:
    """In eval (`train` False) the input itself, as eager returns it: a view, so a group
    returns it only where the copy is unobservable (`require_private_alias`)."""
    x = _tensor(ctx)
    if ctx.const(2) is not False or x.dtype != ctx.out_dtype:
        raise LoweringError("dropout in training")
    require_private_alias(ctx.node)
    return ctx.load(x)


# -- var, std -----------------------------------------------------------------------------------


def _var_args(ctx: Ctx) -> tuple[int | None, int | None, float]:
    """(dims position, keepdim position, correction) of var/std's overloads."""
    overload = schema_overload(ctx.node) or ""
    if overload == "":
        return None, None, 1.0 if ctx.const(1) in (None, True) else 0.0
    if overload == "dim":
        return 1, 3, 1.0 if ctx.const(2) in (None, True) else 0.0
    correction = ctx.const(2)
    return 1, 3, 1.0 if correction is None else float(correction)


# Eager's Welford var/std are 2-60x slower than the fused two passes from 1024 elements on.
_VAR_ALONE = _alone_from(1024)


def _var_problem(node: Any) -> str | None:
    """Why var/std of this node's input may not fuse: float64 values. Eager's Welford mean
    moves by `(x - mean) / k`, so it stays finite where a float64 sum overflows (eight
    elements of -1.8e308: mean -1.8e308, variance 0), and turns NaN where a deviation does
    (1.8e308 then -1.8e308); float64 sums, exact for narrower floats, are not for these."""
    ty = node.inputsAt(0).type()
    if isinstance(ty, torch._C.TensorType) and ty.dtype() == torch.float64:
        return "var/std of float64: eager's Welford recurrence (no overflowing sum) runs"
    return None


@register(("aten::var", "aten::std"), overloads=("", "dim", "correction"), alone=_VAR_ALONE,
          problem=_var_problem)
def var_std(ctx: Ctx) -> E.Expr:
    """The variance over `max(0, N - correction)`: of contiguous rows of float32, float16 or
    bfloat16, from float32 sums (`_RowSums`), where they are exact enough, else in float64;
    otherwise two passes in float64, as eager's Welford accumulates (`std_var_kernel_impl`:
    squares of float32 values overflow no sooner)."""
    box, correction = _var_box(ctx, "var/std")
    kept = box.kept_indices(ctx.indices)
    sums = _RowSums.of(ctx, box)
    if sums is None:
        value = _two_pass_variance(ctx, box, kept, correction)
    else:
        value = sums.pick(kept, sums.variance(kept, correction),
                          _constant_rows_variance(box, correction),
                          _shifted_variance(box, kept, correction))
    if ctx.node.kind() in ("aten::std", "aten::std_mean"):
        value = E.call("sqrt", value)
    return E.cast(ctx.out_dtype, value)


@register(("aten::var_mean", "aten::std_mean"), overloads=("", "dim", "correction"),
          outputs=2, alone=_VAR_ALONE, problem=_var_problem)
def var_std_mean(ctx: Ctx) -> E.Expr:
    """`(var, mean)` or `(std, mean)`: var_std's sums, which give the mean output; it is NaN
    where Welford's is (an infinity before the row's last element)."""
    if ctx.output == 0:
        return var_std(ctx)
    box, _ = _var_box(ctx, "var_mean/std_mean")
    kept = box.kept_indices(ctx.indices)
    nan = E.imm(math.nan, FLOAT64)
    sums = _RowSums.of(ctx, box)
    if sums is not None:
        slow = E.select(_welford_poisoned(box, kept), nan, _shifted_mean(box, kept))
        m0 = E.cast(FLOAT64, E.Load(sums.m0.buf, kept))
        return E.cast(ctx.out_dtype, sums.pick(kept, sums.mean(kept), m0, slow))
    mean = E.Load(_mean_of(ctx, box, FLOAT64).buf, kept)
    head = _head_sum(ctx, box)
    poisoned = (_welford_poisoned(box, kept) if head is None
                else _nonfinite(E.Load(head.buf, kept)))
    return E.cast(ctx.out_dtype, E.select(poisoned, nan, mean))


def _var_box(ctx: Ctx, what: str) -> tuple[_Box, float]:
    """The box of a var/std node's reduced dims, and its correction."""
    dims_at, keepdim_at, correction = _var_args(ctx)
    box = _box(ctx, dims_at, keepdim_at)
    if not ctx.out_dtype.is_float or box.x.dtype != ctx.out_dtype:
        raise LoweringError(f"{what} of a non-float tensor")
    return box, correction


def _divisor(box: _Box, correction: float) -> E.Expr:
    return E.imm(max(0.0, box.count - correction), FLOAT64)


def _constant_rows_variance(box: _Box, correction: float) -> E.Expr:
    """A constant row's variance: 0 over `N - correction`, NaN where that is 0 (eager's 0 / 0:
    two elements with correction 2)."""
    return E.imm(0.0 if box.count - correction > 0 else math.nan, FLOAT64)


def _two_pass_variance(ctx: Ctx, box: _Box, kept: Index, correction: float) -> E.Expr:
    """The mean (an intermediate over the kept dims), then the squared deviations from it,
    in float64."""
    m = E.Load(_mean_of(ctx, box, FLOAT64).buf, kept)

    def deviation(r: Index) -> E.Expr:
        d = box.load(kept, r, FLOAT64) - m
        return d * d

    return box.reduce("Add", kept, deviation, _zero(FLOAT64)) / _divisor(box, correction)


class _RowSums:
    """A contiguous row's statistics from float32 sums: its mean `m0` rounded to float32,
    then the deviations from it, `a = sum(x - m0)` and `b = sum((x - m0)^2)`, each summed in
    vector lanes (two sweeps of the row, the second from the cache: codegen runs the two
    sums in one loop, `llvm_codegen.join_reductions`), with which

        var = (b - a^2 / N) / (N - correction),   mean = m0 + a / N     (in float64)

    are exact for any `m0` but for the sums' roundings; `a` makes up for `m0`'s own (a
    constant row's variance is 0 exactly, and the mean of `1e4 + randn` is rounded once).
    Where those roundings may show (`exact` is false: a non-finite value, float32's range
    overflowed or underflowed by the squares, or a row so nearly constant that `a^2 / N`
    is most of `b`), the row is computed in float64 instead, in a branch only such rows run
    (`ir_visitor.branches_reduce`); a constant row (`b` 0: zeros of padding) is found so by
    one more sweep from the cache, not computed again. 4096 x 1024 float32 rows, 1 thread:
    0.85 ms in two float64 sweeps, 0.44-0.57 ms so (torch.compile's two float32 sweeps:
    0.57-0.75, side by side).

        float v = reduce_add(0.f, t0[1024 * i + r] for r < 1024) / 1024.f;
        float v_1 = reduce_add(0.f, t0[1024 * i + r] - v for r < 1024);
        float v_2 = reduce_add(0.f, (t0[1024 * i + r] - v) * (t0[1024 * i + r] - v) ...);
        aten_var_mean[i] = float(exact(v_1, v_2) ? (double(v_2) - ...) / 1023. : <float64>);
    """

    #: The most of `b` that `a^2 / N` may be (the cancellation at most doubles the error).
    SHIFT = 0.25
    #: Below this much of `b` per element, float32's subnormal squares may have lost bits.
    TINY = 2.0 ** -120

    def __init__(self, box: _Box, m0: TensorArg, a: TensorArg, b: TensorArg):
        self.box, self.m0, self.a, self.b = box, m0, a, b
        self.n = E.imm(float(box.count), FLOAT64)

    @staticmethod
    def of(ctx: Ctx, box: _Box) -> _RowSums | None:
        """The sums of `box`'s rows, shared by a node's outputs; None unless the rows are of
        one contiguous dim of float32, float16 or bfloat16, at least two elements long."""
        x = box.x
        if (x.dtype == FLOAT64 or len(box.dims) != 1 or not box.kept
                or not isinstance(box.count, int) or box.count < 2
                or not E.is_const(x.buf.strides[box.dims[0]], 1)):
            return None
        if "sums" not in ctx.shared:
            rows = [x.shape[d] for d in box.kept]
            f32 = compute_type(x.dtype)

            def total(kept: Index, body: Callable[[E.Expr], E.Expr]) -> E.Expr:
                return box.reduce("Add", kept, lambda r: body(box.load(kept, r, f32)), _zero(f32))

            def mean(*kept: E.Expr) -> E.Expr:
                return total(kept, lambda v: v) / E.imm(float(box.count), f32)

            m0 = ctx.intermediate("m0", f32, rows, mean)

            def deviations(*kept: E.Expr) -> E.Expr:
                return total(kept, lambda v: v - E.Load(m0.buf, kept))

            def squares(*kept: E.Expr) -> E.Expr:
                m = E.Load(m0.buf, kept)
                return total(kept, lambda v: (v - m) * (v - m))

            a = ctx.intermediate("a", f32, rows, deviations)
            b = ctx.intermediate("b", f32, rows, squares)
            ctx.shared["sums"] = _RowSums(box, m0, a, b)
        return ctx.shared["sums"]

    def _load(self, t: TensorArg, kept: Index) -> E.Expr:
        return E.cast(FLOAT64, E.Load(t.buf, kept))

    def _shift(self, kept: Index) -> E.Expr:
        a = self._load(self.a, kept)
        return a * a / self.n

    def exact(self, kept: Index) -> E.Expr:
        """Whether the float32 sums give the row's results (NaN compares false)."""
        b = self._load(self.b, kept)
        inf = E.imm(math.inf, FLOAT64)
        tiny = E.imm(self.TINY * self.box.count, FLOAT64)
        most = b * E.imm(self.SHIFT, FLOAT64)
        return E.And(E.And(E.cmp(">", b, tiny), E.cmp("<", b, inf)),
                     E.cmp("<=", self._shift(kept), most))

    def constant(self, kept: Index) -> E.Expr:
        """Whether the row is constant, for rows whose `b` is 0 (a padding row of zeros):
        a sweep from the cache that finds every `|x - m0|` 0, run only for those rows (`b`
        is also 0 where the squares underflow)."""
        f32 = self.m0.dtype
        m0 = E.Load(self.m0.buf, kept)
        spread = self.box.reduce(
            "Add", kept, lambda r: E.call("abs", self.box.load(kept, r, f32) - m0), _zero(f32))
        zero = E.imm(0.0, FLOAT64)
        return E.select(E.cmp("==", self._load(self.b, kept), zero),
                        E.cmp("==", spread, _zero(f32)), E.imm(False, BOOL))

    def pick(self, kept: Index, fast: E.Expr, constant: E.Expr, slow: E.Expr) -> E.Expr:
        """`fast` where the float32 sums are exact, `constant` for a constant row, else
        `slow`: each of the last two computed only for the rows that take it."""
        return E.select(self.exact(kept), fast,
                        E.select(self.constant(kept), constant, slow))

    def variance(self, kept: Index, correction: float) -> E.Expr:
        return (self._load(self.b, kept) - self._shift(kept)) / _divisor(self.box, correction)

    def mean(self, kept: Index) -> E.Expr:
        return self._load(self.m0, kept) + self._load(self.a, kept) / self.n


def _shifted_sum(box: _Box, kept: Index, square: bool) -> E.Expr:
    """The float64 sum of a row's deviations from its first element (squared or not)."""
    first = box.load(kept, (E.imm(0),), FLOAT64)

    def deviation(r: Index) -> E.Expr:
        d = box.load(kept, r, FLOAT64) - first
        return d * d if square else d

    return box.reduce("Add", kept, deviation, _zero(FLOAT64))


def _shifted_variance(box: _Box, kept: Index, correction: float) -> E.Expr:
    """A row's variance in float64 from its deviations from its first element, `x0`:
    `(sum(d^2) - sum(d)^2 / N) / (N - correction)`, where `sum(d)^2 / N = N (mean - x0)^2`
    is at most N times the result (x0 is one of the row's elements), so float64 keeps the
    result to float32's precision for rows of up to 2^20 elements; a constant row gives 0."""
    n = E.imm(float(box.count), FLOAT64)
    # (the sum of deviations twice: this runs for rare rows only, and a Let would run it
    # for every row)
    shift = _shifted_sum(box, kept, False) * _shifted_sum(box, kept, False) / n
    return (_shifted_sum(box, kept, True) - shift) / _divisor(box, correction)


def _shifted_mean(box: _Box, kept: Index) -> E.Expr:
    """A row's mean in float64: its first element plus the mean deviation from it."""
    n = E.imm(float(box.count), FLOAT64)
    return box.load(kept, (E.imm(0),), FLOAT64) + _shifted_sum(box, kept, False) / n


def _head_sum(ctx: Ctx, box: _Box) -> TensorArg | None:
    """var_mean's over one dim of at least two elements: an intermediate, the float64 sum of
    each row but its last element (None otherwise). The mean is that plus the last element,
    over the count; and since float64 sums of float values do not overflow, the head is
    finite exactly when Welford's mean is not poisoned. One sweep then gives both, where
    `_welford_poisoned` sweeps the row again:

        head[i] = sum(double(x[i, r]) for r < 1023);
        mean[i] = (head[i] + double(x[i, 1023])) / 1024.;
        aten_var_mean_1[i] = float(head[i] - head[i] != head[i] - head[i] ? NAN : mean[i]);
    """
    if (ctx.node.kind() not in ("aten::var_mean", "aten::std_mean") or len(box.dims) != 1
            or not isinstance(box.count, int) or box.count < 2):
        return None
    key = f"head{box.dims}"
    if key not in ctx.shared:
        def head(*kept: E.Expr) -> E.Expr:
            r = E.Var("r")
            value = box.load(kept, (r,), FLOAT64)
            return E.Reduce("Add", _zero(FLOAT64), value, (r,), (E.imm(box.count - 1),))

        shape = [box.x.shape[d] for d in box.kept]
        ctx.shared[key] = ctx.intermediate("head", FLOAT64, shape, head)
    return ctx.shared[key]


def _nonfinite(value: E.Expr) -> E.Expr:
    """Whether `value` is an infinity or NaN: `value - value` is NaN exactly then."""
    d = value - value
    return E.cmp("!=", d, d)


def _welford_poisoned(box: _Box, kept: Index) -> E.Expr:
    """Whether eager's Welford mean of the row is NaN where the sum's is not: an infinity
    (or NaN) before the row's last element makes every later `x - mean` NaN; one in the
    last element only gives that infinity, as the sum does. `x - x` is 0 but for those,
    so their sum over the elements before the last (in the input's computation type, a
    full vector's width) is NaN exactly when the row is poisoned."""
    compute = compute_type(box.x.dtype)
    zero = _zero(compute)
    if box.count <= 1:
        return E.imm(False, BOOL)
    if len(box.dims) == 1:  # the elements before the last: a shorter range
        r = E.Var("r")
        v = box.load(kept, (r,), compute)
        early = E.Reduce("Add", zero, v - v, (r,), (E.imm(box.count - 1),))
        return E.cmp("!=", early, early)

    def before_last(r: Index) -> E.Expr:
        v = box.load(kept, r, compute)
        flat: E.Expr = E.imm(0)
        for i, size in zip(r, box.sizes):
            flat = flat * size + i
        return E.select(E.cmp("<", flat, E.imm(box.count - 1)), v - v, zero)

    total = box.reduce("Add", kept, before_last, zero)
    return E.cmp("!=", total, total)


def _mean_of(ctx: Ctx, box: _Box, compute: Dtype) -> TensorArg:
    """An intermediate: the mean of `box` at each kept index (one per node: its outputs
    share it)."""
    key = f"mean{box.dims}"
    if key in ctx.shared:
        return ctx.shared[key]
    head = _head_sum(ctx, box) if compute == FLOAT64 else None

    def mean(*kept: E.Expr) -> E.Expr:
        if head is not None:
            last = box.load(kept, (E.imm(box.count - 1),), compute)
            return (E.Load(head.buf, kept) + last) / E.imm(float(box.count), compute)
        total = box.reduce("Add", kept, lambda r: box.load(kept, r, compute), _zero(compute))
        return total / E.imm(float(box.count), compute)

    ctx.shared[key] = ctx.intermediate("mean", compute, [box.x.shape[d] for d in box.kept], mean)
    return ctx.shared[key]


# -- softmax, log_softmax, logsumexp ------------------------------------------------------------


def _row_box(ctx: Ctx, dims: tuple[int, ...]) -> _Box:
    return _Box(_tensor(ctx), dims, keepdim=True)


def _row_max(ctx: Ctx, box: _Box, value: Callable[[Index, Index], E.Expr],
             compute: Dtype, op: str = "Max", name: str | None = None) -> TensorArg:
    def row_max(*kept: E.Expr) -> E.Expr:
        return box.reduce(op, kept, lambda r: value(kept, r), E.identity(op, compute))

    shape = [box.x.shape[d] for d in box.kept]
    return ctx.intermediate(name or op.lower(), compute, shape, row_max)


def _exp_shifted(shifted: E.Expr) -> E.Expr:
    """exp of `x - max` over x's row: <= 0, or NaN (a NaN x, or an infinite max), so
    `exp_nonpos`, which skips exp's overflow handling."""
    return E.call("exp_nonpos", shifted)


def _exp_sum(ctx: Ctx, box: _Box, value: Callable[[Index, Index], E.Expr], top: TensorArg,
             compute: Dtype, finish: Callable[[E.Expr], E.Expr], name: str) -> TensorArg:
    """An intermediate: `finish(sum of exp(x - max))` at each kept index."""

    def exp_sum(*kept: E.Expr) -> E.Expr:
        m = E.Load(top.buf, kept)
        body = lambda r: _exp_shifted(value(kept, r) - m)  # noqa: E731
        return finish(box.reduce("Add", kept, body, _zero(compute)))

    return ctx.intermediate(name, compute, [box.x.shape[d] for d in box.kept], exp_sum)


# Alone, from 64K elements (256 x 768 on) over rows up to 4096 wide, at 1 thread: softmax
# 1.1-1.5x eager (4096 wide 1.1-1.26x), log_softmax 1.6-2.2x; 8192 wide 1.0-1.1x.
_ROWS_ALONE = _alone_from(1 << 16, widest_row=4096)
# layer_norm: 1.3-1.5x eager at 256 x 768 (in cache), 1.1-1.9x from 4096 x 768 to 8192 x 768
# and 1.3-2.0x over 4096-wide rows (from memory, next rows prefetched); 8192 wide 1.0x.
LAYER_NORM_ALONE = _alone_from(1 << 16, widest_row=4096)


@register(("aten::softmax", "aten::log_softmax"), overloads=("int",), alone=_ROWS_ALONE)
def softmax(ctx: Ctx) -> E.Expr:
    """max, then the sum of exp(x - max), per row; then every element of the row."""
    x = _tensor(ctx)
    out = ctx.out_dtype
    if not out.is_float:
        raise LoweringError("softmax of a non-float type")
    compute = compute_type(out)
    dim = ctx.const(1)
    if not isinstance(dim, int):
        raise LoweringError("softmax dim must be a constant int")
    box = _row_box(ctx, _normalize([dim], len(x.shape)))
    log = ctx.node.kind() == "aten::log_softmax"

    def value(kept: Index, r: Index) -> E.Expr:
        return E.cast(compute, E.cast(out, box.load(kept, r)))

    if box.count == 0 or not box.dims:  # an empty row, or a 0-dim tensor: elementwise
        one = value(box.kept_indices(ctx.indices), tuple(ctx.indices[d] for d in box.dims))
        shifted = one - one  # x - max: 0, or NaN for an infinity or NaN
        return E.cast(out, shifted if log else _exp_shifted(shifted))
    # The max of the row's non-NaN values: a NaN makes every output NaN through its exp
    # (into the sum), as eager's NaN max does, in one instruction per vector, not three
    # (with exp_nonpos, 1 thread: 32768 x 128 1.56 -> 1.33 ms, 4096 x 1024 1.47 -> 1.42).
    top = _row_max(ctx, box, value, compute, "MaxOrdered", "max")
    if not log and out == compute:
        return _softmax_in_place(ctx, box, value, top, compute)
    if log:
        scale = _exp_sum(ctx, box, value, top, compute, _log_sum(ctx, box, out), "logsum")
    else:
        one = E.imm(1.0, compute)
        scale = _exp_sum(ctx, box, value, top, compute, lambda s: one / s, "rsum")
    kept = box.kept_indices(ctx.indices)
    here = tuple(ctx.indices[d] for d in box.dims)
    m, s = E.Load(top.buf, kept), E.Load(scale.buf, kept)
    shifted = value(kept, here) - m
    return E.cast(out, shifted - s if log else _exp_shifted(shifted) * s)


def _softmax_in_place(ctx: Ctx, box: _Box, value: Callable[[Index, Index], E.Expr],
                      top: TensorArg, compute: Dtype) -> E.Expr:
    """`exp(x - max)` as an intermediate, its sum, then the intermediate scaled: ATen's
    order, one exponential per element; `reuse_outputs` keeps the exponentials in the
    output's memory."""
    shape = list(box.x.shape)

    def exp(*idx: E.Expr) -> E.Expr:
        kept = tuple(idx[d] for d in box.kept)
        here = tuple(idx[d] for d in box.dims)
        return _exp_shifted(value(kept, here) - E.Load(top.buf, kept))

    exps = ctx.intermediate("exp", compute, shape, exp)

    def reciprocal(*kept: E.Expr) -> E.Expr:
        def body(r: Index) -> E.Expr:
            idx: list[E.Expr] = [E.imm(0)] * len(shape)
            for d, i in zip(box.kept, kept):
                idx[d] = i
            for d, i in zip(box.dims, r):
                idx[d] = i
            return E.Load(exps.buf, tuple(idx))

        return E.imm(1.0, compute) / box.reduce("Add", kept, body, _zero(compute))

    scale = ctx.intermediate("rsum", compute, [shape[d] for d in box.kept], reciprocal)
    kept = box.kept_indices(ctx.indices)
    return E.Load(exps.buf, tuple(ctx.indices)) * E.Load(scale.buf, kept)


def _log_sum(ctx: Ctx, box: _Box, out: Dtype) -> Callable[[E.Expr], E.Expr]:
    """log of a row's sum; ATen's last-dim kernel keeps the sum and its log in the tensor's
    type, so for float16/bfloat16 both round to it."""
    if not (out.is_reduced_float and box.dims == (len(box.x.shape) - 1,)):
        return lambda s: E.call("log", s)
    narrow = lambda e: E.cast(e.dtype, E.cast(out, e))  # noqa: E731
    return lambda s: narrow(E.call("log", narrow(s)))


@register("aten::logsumexp", overloads=("",))
def logsumexp(ctx: Ctx) -> E.Expr:
    """`max + log(sum(exp(x - max)))`, with the max of a row of infinities taken as 0."""
    x = _tensor(ctx)
    out = ctx.out_dtype
    if not out.is_float or (x.dtype.is_float and x.dtype != out):
        raise LoweringError("logsumexp gives the input's float type (integers: the default)")
    box = _box(ctx, 1, 2)
    compute = compute_type(out)
    rows = _Box(x, box.dims, True)

    def value(kept: Index, r: Index) -> E.Expr:
        return rows.load(kept, r, compute)

    # As softmax's: a NaN in the row makes its sum, and so the result, NaN anyway. (Its exp
    # is no `exp_nonpos`: a row with +inf takes its max as 0, x - 0 may be positive.)
    top = _row_max(ctx, rows, value, compute, "MaxOrdered", "max")
    kept = box.kept_indices(ctx.indices)
    m = E.Load(top.buf, kept)
    finite = E.select(E.cmp("==", E.call("abs", m), E.imm(math.inf, compute)),
                      E.imm(0.0, compute), m)
    # Eager runs it as tensor ops (`logsumexp_out_impl`): float16/bfloat16 round after each.
    narrow = (lambda e: E.cast(compute, E.cast(out, e))) if out.is_reduced_float \
        else (lambda e: e)
    body = lambda r: narrow(E.call("exp", narrow(value(kept, r) - finite)))  # noqa: E731
    total = narrow(box.reduce("Add", kept, body, _zero(compute)))
    return E.cast(out, narrow(E.call("log", total)) + finite)


# -- argmax, argmin, max.dim, min.dim -------------------------------------------------------------


def _best(ctx: Ctx, x: TensorArg, dims: tuple[int, ...], op: str, compute: Dtype) -> TensorArg:
    """The max (min) over `dims` per kept index: an intermediate that a node's outputs share
    (max.dim's values and indices)."""
    key = f"{op}{dims}"
    if key not in ctx.shared:
        rows = _Box(x, dims, True)
        ctx.shared[key] = _row_max(
            ctx, rows, lambda kept, r: rows.load(kept, r, compute), compute, op)
    return ctx.shared[key]


def _extreme_type(dtype: Dtype) -> Dtype:
    """The type max and min compare in: float32 for reduced floats, uint8 for bool."""
    return UINT8 if dtype.is_bool else compute_type(dtype)


def _first_index(box: _Box, kept: Index, best: E.Expr, compute: Dtype) -> E.Expr:
    """The first (row-major) index over the box's dims that holds `best`, or the first NaN
    (which is then the max and the min), as eager's kernels pick it."""

    def first(r: Index) -> E.Expr:
        v = box.load(kept, r, compute)
        hit = E.cmp("==", v, best)
        if compute.is_float:
            hit = E.Or(hit, E.cmp("!=", v, v))
        flat: E.Expr = E.imm(0)
        for i, size in zip(r, box.sizes):
            flat = flat * size + i
        return E.select(hit, flat, E.imm(box.count))

    return box.reduce("Min", kept, first, E.imm(box.count))


@register(("aten::argmax", "aten::argmin"), overloads=("",))
def argmax_argmin(ctx: Ctx) -> E.Expr:
    """Two passes: the max (min), then the first index that holds it, or the first NaN (which
    is then the max), as eager; over all dims (dim=None) the index is row-major."""
    x = _tensor(ctx)
    ndim = len(x.shape)
    dims = tuple(range(ndim)) if ctx.const(1) is None else _normalize([ctx.const(1)], ndim)
    keepdim = bool(ctx.const(2))
    box = _Box(x, dims, keepdim and ctx.const(1) is not None)
    if box.may_be_empty:
        raise LoweringError("argmax/argmin over an empty dim: eager raises")
    if x.dtype.is_bool or ctx.out_dtype != INT64:
        raise LoweringError("argmax/argmin of bool")
    op = "Max" if ctx.node.kind() == "aten::argmax" else "Min"
    compute = compute_type(x.dtype)
    best = _best(ctx, x, dims, op, compute)
    kept = box.kept_indices(ctx.indices) if ctx.const(1) is not None or not keepdim else ()
    return _first_index(box, kept, E.Load(best.buf, kept), compute)


# max.dim: 2-6x eager from 64x128 on (1x at 8x128).
@register(("aten::max", "aten::min"), overloads=("dim",), constant_operands=True, outputs=2,
          alone=_alone_from(8192))
def max_min_dim(ctx: Ctx) -> E.Expr:
    """`(values, indices)` over one dim: the max (min), NaN if the row holds one, and the index
    of its first occurrence (of the first NaN); both from one intermediate per row."""
    x = _tensor(ctx)
    box = _box(ctx, 1, 2)
    if x.shape and box.may_be_empty:
        raise LoweringError("max/min over an empty dim: eager raises")
    op = "Max" if ctx.node.kind() == "aten::max" else "Min"
    compute = _extreme_type(x.dtype)
    kept = box.kept_indices(ctx.indices)
    best = E.Load(_best(ctx, x, box.dims, op, compute).buf, kept)
    return _value_or_index(ctx, x, best, lambda: _first_index(box, kept, best, compute),
                           "max/min")


def _value_or_index(ctx: Ctx, x: TensorArg, best: E.Expr, index: Callable[[], E.Expr],
                    what: str) -> E.Expr:
    """Output 0 of a (values, indices) node: `best` in the input's type; output 1: `index()`,
    int64."""
    if ctx.output == 0:
        if ctx.out_dtype != x.dtype:
            raise LoweringError(f"{what} values keep the input's type")
        return E.cast(ctx.out_dtype, best)
    if ctx.out_dtype != INT64:
        raise LoweringError(f"{what} indices are int64")
    return index()


# -- linalg_vector_norm ----------------------------------------------------------------------------


@register("aten::linalg_vector_norm", overloads=("",))
def vector_norm(ctx: Ctx) -> E.Expr:
    """`ord` 2: sqrt of the sum of squares; 1: sum of |x|; inf, -inf: max, min of |x|; 0: the
    count of nonzeros; other p: (sum |x|^p)^(1/p). In float32 for reduced floats. Over one
    element every p but 0 is |x|, as eager's is (sqrt(x * x) would overflow from 1.9e19)."""
    x = _tensor(ctx)
    out = ctx.out_dtype
    if not out.is_float or not x.dtype.is_float:
        raise LoweringError("vector_norm of a non-float tensor")
    p = ctx.const(1)
    p = 2.0 if p is None else float(p)
    box = _box(ctx, 2, 3)
    compute = compute_type(out)
    kept = box.kept_indices(ctx.indices)
    magnitude = lambda r: E.call("abs", E.cast(compute, E.cast(out, box.load(kept, r))))  # noqa
    if p != 0 and box.count == 1:
        p = math.inf
    if math.isinf(p):
        if box.may_be_empty:
            raise LoweringError("an infinity norm over an empty dim: eager raises")
        op = "Max" if p > 0 else "Min"
        return E.cast(out, box.reduce(op, kept, magnitude, E.identity(op, compute)))
    zero = _zero(compute)
    if p == 0:
        ones = lambda r: E.cast(compute, E.cmp("!=", magnitude(r), zero))  # noqa: E731
        return E.cast(out, box.reduce("Add", kept, ones, zero))
    if p == 1:
        return E.cast(out, box.reduce("Add", kept, magnitude, zero))
    if p == 2:
        squares = lambda r: magnitude(r) * magnitude(r)  # noqa: E731
        return E.cast(out, E.call("sqrt", box.reduce("Add", kept, squares, zero)))
    power = E.imm(p, compute)
    powers = lambda r: E.call("pow", magnitude(r), power)  # noqa: E731
    total = box.reduce("Add", kept, powers, zero)
    return E.cast(out, E.call("pow", total, E.imm(1.0 / p, compute)))


# -- pooling ----------------------------------------------------------------------------------


def _pairs(ctx: Ctx, k: int, default: list[int] | None) -> tuple[int, int]:
    """Operand `k` of max_pool2d as (height, width): one int is both, [] the default."""
    value = ctx.const(k)
    if isinstance(value, int):
        value = [value]
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, int) for v in value):
        raise LoweringError("max_pool2d's sizes must be constant ints")
    if not value and default is not None:
        value = default
    if len(value) == 1:
        value = [value[0], value[0]]
    if len(value) != 2:
        raise LoweringError("max_pool2d takes one or two sizes")
    return value[0], value[1]


class _Windows:
    """max_pool2d's windows over the last two dims of `x` (operands 1-4: kernel size,
    stride, padding, dilation), with the reduction variables `p` (rows) and `q` (columns)."""

    def __init__(self, ctx: Ctx, x: TensorArg):
        self.kernel = _pairs(ctx, 1, None)
        stride = _pairs(ctx, 2, list(self.kernel))
        padding = _pairs(ctx, 3, None)
        dilation = _pairs(ctx, 4, None)
        self.height, self.width = x.shape[-2:]
        if not isinstance(self.height, int) or not isinstance(self.width, int):
            raise LoweringError("max_pool2d over symbolic sizes")
        if min(*self.kernel, *stride, *dilation) < 1 or any(
                p < 0 or 2 * p > k for p, k in zip(padding, self.kernel)):
            raise LoweringError("max_pool2d's arguments: eager raises")
        self.x, self.compute = x, compute_type(x.dtype)
        self.vars = (E.Var("p"), E.Var("q"))
        self.start = tuple(zip(stride, padding, dilation))

    def at(self, out: Index) -> tuple[E.Expr, E.Expr]:
        """The input row and column that the window of output index `out` reads at (p, q)."""
        (sh, ph, dh), (sw, pw, dw) = self.start
        p, q = self.vars
        return out[-2] * sh - ph + p * dh, out[-1] * sw - pw + q * dw

    def inside(self, h: E.Expr, w: E.Expr) -> E.Expr:
        return E.And(E.And(E.cmp(">=", h, 0), E.cmp("<", h, self.height)),
                     E.And(E.cmp(">=", w, 0), E.cmp("<", w, self.width)))

    def load(self, out: Index, h: E.Expr, w: E.Expr) -> E.Expr:
        clamp = lambda v, size: E.Min(E.Max(v, E.imm(0)), E.imm(size - 1))  # noqa: E731
        at = (*out[:-2], clamp(h, self.height), clamp(w, self.width))
        return E.cast(self.compute, E.Load(self.x.buf, at))

    def reduce(self, op: str, body: E.Expr, init: E.Expr) -> E.Expr:
        return E.Reduce(op, init, body, self.vars, tuple(map(E.imm, self.kernel)))

    def max(self, out: Index) -> E.Expr:
        """The window's max: the padding reads as the lowest value, NaN wins."""
        h, w = self.at(out)
        lowest = E.identity("Max", self.compute)
        return self.reduce("Max", E.select(self.inside(h, w), self.load(out, h, w), lowest),
                           lowest)

    def index(self, out: Index, best: E.Expr) -> E.Expr:
        """Where in its plane the window's max `best` is, as ATen's CPU kernel finds it (it
        takes a value greater than the one it holds, or a NaN): the last NaN, else the first
        position of the max."""
        h, w = self.at(out)
        value, inside = self.load(out, h, w), self.inside(h, w)
        flat = h * self.width + w
        plane = E.imm(self.height * self.width)
        first = self.reduce("Min", E.select(E.And(inside, E.cmp("==", value, best)), flat,
                                            plane), plane)
        if not self.compute.is_float:
            return first
        nan = E.And(inside, E.cmp("!=", value, value))
        last_nan = self.reduce("Max", E.select(nan, flat, E.imm(-1)), E.imm(-1))
        return E.select(E.cmp("!=", best, best), last_nan, first)


def _pooled(ctx: Ctx) -> TensorArg:
    x = _tensor(ctx)
    if x.dtype.is_bool or len(x.shape) not in (3, 4):
        raise LoweringError("max_pool2d of a tensor of 3 or 4 dims, not bool")
    return x


@register("aten::max_pool2d", overloads=("",), constant_operands=True)
def max_pool2d(ctx: Ctx) -> E.Expr:
    """The max of each window, the padding -inf (the type's lowest for integers), NaN
    winning (ATen's CPU kernel keeps a NaN once it meets one); tensors of 3 or 4 dims,
    the output's size as profiled (which eager's `ceil_mode` decided; each window starts
    inside the input or its left padding):

        out[n, c, i, j] = max over (p, q) of x[n, c, 2 i - 1 + p, 2 j - 1 + q]   (3x3, stride
                          2, padding 1; rows and columns outside x are -inf)
    """
    x = _pooled(ctx)
    if x.dtype != ctx.out_dtype:
        raise LoweringError("max_pool2d keeps the input's type")
    return E.cast(ctx.out_dtype, _Windows(ctx, x).max(ctx.indices))


@register("aten::max_pool2d_with_indices", overloads=("",), constant_operands=True, outputs=2)
def max_pool2d_with_indices(ctx: Ctx) -> E.Expr:
    """max_pool2d's values and, for each, where in its plane the window's max is (`index`):
    both from one intermediate of the maxima."""
    x = _pooled(ctx)
    windows = _Windows(ctx, x)
    if "max" not in ctx.shared:
        ctx.shared["max"] = ctx.intermediate("max", windows.compute, ctx.out_shape,
                                             lambda *out: windows.max(out))
    best = E.Load(ctx.shared["max"].buf, tuple(ctx.indices))
    return _value_or_index(ctx, x, best, lambda: windows.index(ctx.indices, best),
                           "max_pool2d")


@register("aten::adaptive_avg_pool2d", overloads=("",), constant_operands=True)
def adaptive_avg_pool2d(ctx: Ctx) -> E.Expr:
    """The mean of each window, as ATen's CPU kernel takes them: output row `i` of `n`
    averages input rows `floor(i * h / n)` to `ceil((i + 1) * h / n)` (columns alike),
    summed in the accumulation type (float32 for float16/bfloat16), then divided by the
    window's size. The reduction runs over the widest window, the positions past a
    narrower one's end adding nothing:

        out[c, i, j] = (sum over p < 2, q < 2 of (p < hi - lo ? x[c, lo + p, ...] : 0))
                       / ((hi - lo) * (wi - wo))              (lo = 3 i / 2, hi = ...)
    """
    x = _tensor(ctx)
    if not x.dtype.is_float or x.dtype != ctx.out_dtype or len(x.shape) not in (3, 4):
        raise LoweringError("adaptive_avg_pool2d of a float tensor of 3 or 4 dims")
    sizes, outs = x.shape[-2:], ctx.out_shape[-2:]
    if not all(isinstance(v, int) and v > 0 for v in (*sizes, *outs)):
        raise LoweringError("adaptive_avg_pool2d of empty or symbolic sizes")
    compute = compute_type(x.dtype)
    lead, index = ctx.indices[:-2], ctx.indices[-2:]
    offsets, counts, widest = [], [], []
    for i, size, out in zip(index, sizes, outs):
        lo = E.Div(i * size, E.imm(out))  # (indices are not negative: C's division floors)
        hi = E.Div(i * size + (size + out - 1), E.imm(out))
        offsets.append(lo)
        counts.append(hi - lo)
        widest.append(max((k * size + size + out - 1) // out - k * size // out
                          for k in range(out)))
    rows, cols = E.Var("p"), E.Var("q")
    inside = E.And(E.cmp("<", rows, counts[0]), E.cmp("<", cols, counts[1]))
    last = [E.imm(size - 1) for size in sizes]
    at = (E.Min(offsets[0] + rows, last[0]), E.Min(offsets[1] + cols, last[1]))
    value = E.cast(compute, E.Load(x.buf, (*lead, *at)))
    body = E.select(inside, value, _zero(compute))
    total = E.Reduce("Add", _zero(compute), body, (rows, cols), tuple(map(E.imm, widest)))
    return E.cast(ctx.out_dtype, total / E.cast(compute, counts[0] * counts[1]))
