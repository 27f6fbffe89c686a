"""Conversions and views: to(dtype), type_as, clone, expand, expand_as.

Also what the other families share about converting values as eager does:
`convert` turns an element into another dtype exactly as TensorIterator and
`to` do, and `checked` converts a number operand the way `Scalar::to<T>()`
does, where eager raises instead of wrapping a value that does not fit.

Some of these ops return their input itself (`to` the same dtype without
`copy`, `type_as` the same dtype) or a view of it (`expand`): eager's result
shares memory with the input. A fused kernel always writes a fresh tensor,
which is only indistinguishable while nothing else can see the input: see
`require_private_alias`.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import torch

from .. import expr as E
from ..dtype import FLOAT32, INT64, Dtype
from .registry import VIEWS, Arg, Ctx, LoweringError, ScalarArg, TensorArg, register

# TorchScript passes a MemoryFormat as an int: its value in c10::MemoryFormat.
_MEMORY_FORMATS = (
    torch.contiguous_format,
    torch.preserve_format,
    torch.channels_last,
    torch.channels_last_3d,
)
_VIEWS = ("aten::expand", "aten::expand_as")
_CONVERSIONS = ("aten::to", "aten::type_as")


def convert(value: E.Expr, dtype: Dtype) -> E.Expr:
    """`value` converted to `dtype` as eager converts tensor elements.

    That is C's conversion (the IR's `Cast`) but for two cases: float16 and
    bfloat16 convert from and to float (c10::Half, c10::BFloat16), so wider
    values are rounded to float32 first and then again; and the compiler
    converts float to uint8 through int64 (to narrower signed types it goes
    through int32, as `Cast` does), which shows for float64 beyond int32
    (float32 values that large are multiples of 256: either way gives 0).
    """
    src = value.dtype.scalar
    if src == dtype.scalar:
        return value
    if (dtype.is_reduced_float and not src.is_reduced_float) or (
        src.is_reduced_float and (dtype.is_int or dtype.is_bool)
    ):
        value = E.cast(FLOAT32, value)
    if dtype.name == "uint8" and src.name == "float64":
        value = E.cast(INT64, value)
    return E.cast(dtype, value)


def _limits(dtype: Dtype) -> tuple[float, float]:
    info = torch.finfo(dtype.torch) if dtype.is_float else torch.iinfo(dtype.torch)
    return info.min, info.max


def fits(value: bool | int | float, dtype: Dtype) -> bool:
    """Whether eager converts the number `value` to `dtype` without raising (c10::overflows)."""
    if dtype.is_bool or isinstance(value, bool):
        return True
    lo, hi = _limits(dtype)
    if isinstance(value, int):
        if dtype.is_int and not dtype.is_signed and value < 0:
            return -value <= hi  # negative numbers wrap around into unsigned types
        return lo <= value <= hi
    if math.isnan(value) or math.isinf(value):
        return dtype.is_float
    return float(lo) <= value <= float(hi)  # compared as C++ does, in double


def always_fits(src: Dtype, dst: Dtype) -> bool:
    """Whether every value of type `src` converts to `dst` without eager's overflow error."""
    if dst.is_bool or src.is_bool:
        return True
    if src.is_float and not dst.is_float:
        return False  # NaN and infinities
    (src_lo, src_hi), (dst_lo, dst_hi) = _limits(src), _limits(dst)
    if dst.is_int and not dst.is_signed:
        return src_hi <= dst_hi and -src_lo <= dst_hi
    return dst_lo <= src_lo and src_hi <= dst_hi


def checked(ctx: Ctx, arg: Arg, dtype: Dtype) -> E.Expr:
    """Number operand `arg` (or a 0-dim tensor's item) as `dtype`, where eager checks the range.

    Eager raises when the value does not fit (`fits`); for a number that is
    a kernel input, the kernel checks it before running and raises the same
    error; a value that might not fit and cannot be checked is refused (the
    group runs unfused).
    """
    if isinstance(arg, ScalarArg) and arg.const is not None:
        if not fits(arg.const, dtype):
            raise LoweringError(f"{arg.const!r} does not fit {dtype}: eager raises")
    elif not isinstance(arg, (ScalarArg, TensorArg)):
        raise LoweringError(f"operand {arg} is not a number")
    elif not always_fits(arg.dtype, dtype):
        if isinstance(arg, TensorArg) and arg.shape:
            raise LoweringError(f"a {arg.dtype} tensor may not fit {dtype}, where eager raises")
        ctx.require(arg, functools.partial(_fits_value, dtype=dtype),
                    f"value cannot be converted to type {_CPP_NAMES[dtype.name]} without overflow")
    return convert(ctx.load(arg), dtype)


# How c10 names the types in its overflow error.
_CPP_NAMES = {
    "float32": "float", "float64": "double", "float16": "c10::Half",
    "bfloat16": "c10::BFloat16", "int8": "int8_t", "int16": "int16_t", "int32": "int",
    "int64": "int64_t", "uint8": "uint8_t", "bool": "bool",
}


def _fits_value(value: Any, dtype: Dtype) -> bool:
    """`fits` for a kernel input at run time: a number or a 0-dim tensor."""
    return fits(value.item() if isinstance(value, torch.Tensor) else value, dtype)


@functools.cache
def _argument_names(schema: str) -> tuple[str, ...]:
    return tuple(a.name for a in torch._C.parse_schema(schema).arguments)


def _constant_inputs(node: Any) -> dict[str, Any]:
    """The node's constant inputs by argument name."""
    names = _argument_names(node.schema())
    values = {}
    for name, value in zip(names, node.inputs()):
        if value.node().kind() == "prim::Constant":
            values[name] = value.toIValue()
    return values


def _keeps_layout(value: Any, memory_format: int | None) -> bool:
    """Whether `to(memory_format=...)` returns a tensor typed like `value` as `value` itself."""
    if memory_format is None or _MEMORY_FORMATS[memory_format] == torch.preserve_format:
        return True
    ty = value.type()
    sizes, strides = ty.sizes(), ty.strides()
    if sizes is None or strides is None or None in sizes or None in strides:
        return True  # unknown: assume it may alias
    meta = torch.empty_strided(sizes, strides, dtype=ty.dtype(), device="meta")
    return meta.to(memory_format=_MEMORY_FORMATS[memory_format]) is meta


#: Views that copy where the input's strides cannot be viewed in the result's shape.
_MAY_COPY = ("aten::reshape", "aten::reshape_as", "aten::flatten", "aten::contiguous")


def _copies(node: Any) -> bool:
    """Whether eager's `node` (one of `_MAY_COPY`) returns a fresh tensor for inputs of its
    input's type: a reshape whose strides no view of the result's shape has (`x.transpose(1,
    2).reshape(b, s, h * d)`), a contiguous of a tensor that is not. False where a size or
    stride is unknown."""
    x, y = node.inputsAt(0).type(), node.output().type()
    if not isinstance(x, torch._C.TensorType) or not isinstance(y, torch._C.TensorType):
        return False
    sizes, strides, shape = x.sizes(), x.strides(), y.sizes()
    if None in (sizes, strides, shape, x.dtype()) or None in (*sizes, *strides, *shape):
        return False
    meta = torch.empty_strided(sizes, strides, dtype=x.dtype(), device="meta")
    if node.kind() == "aten::contiguous":
        fmt = _constant_inputs(node).get("memory_format", 0)
        return fmt is not None and meta.contiguous(memory_format=_MEMORY_FORMATS[fmt]) is not meta
    try:
        meta.view(shape)  # what reshape returns where ATen's computeStride finds strides
    except RuntimeError:
        return True
    return False


def aliases(node: Any) -> bool:
    """Whether eager's result of `node` is (or may be) its first input, or a view of it."""
    if node.kind() in VIEWS:
        return not (node.kind() in _MAY_COPY and _copies(node))
    if node.kind() not in _CONVERSIONS:
        return False
    dtypes = {node.inputsAt(0).type().dtype(), node.output().type().dtype()}
    if len(dtypes) == 2 and None not in dtypes:  # unknown types may alias
        return False
    options = _constant_inputs(node)
    return not options.get("copy", False) and _keeps_layout(
        node.inputsAt(0), options.get("memory_format")
    )


def require_private_alias(node: Any) -> None:
    """Let `node`, whose result aliases its input in eager, be computed as a copy.

    Inside a group that is exact: the fuser leaves out values anything writes
    to. A group output is different: the caller would see a fresh tensor
    where eager hands out the input's memory. That is only unobservable when
    the memory the alias shares is private to it: a value computed in the
    group whose aliases (itself included) are not returned but for this one.
    (The fuser moves the other returned aliases out of its groups:
    `subgraph.move_aliases_out`.)
    """
    if not _returned(node.output()) or not aliases(node):
        return  # (a reshape that copies in eager as well)
    source = node.inputsAt(0)
    while source.node().kind() != "prim::Param" and aliases(source.node()):
        source = source.node().inputsAt(0)
    if source.node().kind() == "prim::Param" or _returned_aliases(source) > 1:
        raise LoweringError(f"{node.kind()} would return a copy where eager shares memory")


def _returned_aliases(base: Any) -> int:
    """How many of `base` and the values aliasing it through alias nodes are returned."""
    count, todo = 0, [base]
    while todo:
        value = todo.pop()
        count += _returned(value)
        todo += [u.user.output() for u in value.uses()
                 if u.offset == 0 and u.user.kind() != "prim::Return" and aliases(u.user)]
    return count


def _returned(value: Any) -> bool:
    return any(use.user.kind() == "prim::Return" for use in value.uses())


_TO_OVERLOADS = (
    "dtype",
    "device",
    "other",
    "dtype_layout",
    "prim_dtype",
    "prim_Device",
    "prim_other",
)


@register("aten::to", overloads=_TO_OVERLOADS)
@register("aten::type_as", overloads=("",))
@register("aten::clone", overloads=("",))
def to(ctx: Ctx) -> E.Expr:
    """`self` converted to the profiled output type (a copy, for clone: its layout is the
    profiled output's, whatever the memory_format); all options must be constants."""
    names = _argument_names(ctx.node.schema())
    for k, name in enumerate(names[: len(ctx.args)]):
        if name in ("self", "other"):
            continue
        value = ctx.const(k)
        if name == "pin_memory" and value:
            raise LoweringError("to(pin_memory=True)")
        if name == "layout" and value not in (None, 0):  # 0: torch.strided
            raise LoweringError("to() a layout other than strided")
    source = ctx.args[0]
    if not isinstance(source, TensorArg):
        raise LoweringError("to() of a non-tensor")
    if aliases(ctx.node):
        require_private_alias(ctx.node)
    return convert(ctx.load(source), ctx.out_dtype)


@register(_VIEWS, overloads=("",), constant_operands=True, view=True, dynamic=True)
def expand(ctx: Ctx) -> E.Expr:
    """A broadcast view: each output element reads the input element it broadcasts from."""
    source = ctx.args[0]
    if not isinstance(source, TensorArg) or source.dtype != ctx.out_dtype:
        raise LoweringError("expand of a non-tensor")
    require_private_alias(ctx.node)
    return ctx.load(source)
