"""Random tensors for the differential fuzzer: dtypes, shapes, layouts and extremal values.

A `TensorSpec` says what a tensor input looks like (dtype, shape, layout);
`make_tensor` fills one with random values from a seeded generator, in that
layout. Layouts are the ones fused kernels must index correctly:

    contiguous     row-major
    transposed     the last two dimensions swapped in memory
    permuted       the dimensions in a random order in memory
    channels_last  NHWC memory for a 4-d tensor
    sliced         every other element of one dimension, at a storage offset;
                   the skipped elements hold garbage a wrong read would pick up
    expanded       some dimensions broadcast with stride 0

Values mix ordinary numbers, small integers (floor/round ties, exact
division) and, for some tensors, extremal ones: NaN, ±Inf, -0.0, the largest
and smallest normal and a subnormal for floats; the limits for integers.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch

from .op_specs import DTYPE_CLASSES, FLOATS

#: How often each dtype is drawn for a new tensor input (float32 is the common case).
DTYPE_WEIGHTS: dict[torch.dtype, float] = {
    torch.float32: 4, torch.float64: 1.5, torch.float16: 1.5, torch.bfloat16: 1.5,
    torch.int8: 1, torch.int16: 0.7, torch.int32: 1, torch.int64: 1.5, torch.uint8: 1,
    torch.bool: 1.2,
}
LAYOUTS = ("contiguous", "transposed", "permuted", "channels_last", "sliced", "expanded")
_DIMS = [1, 2, 3, 4, 5, 7, 8]
_LONG_DIMS = [16, 17, 31, 33, 64]


@dataclass(frozen=True)
class TensorSpec:
    """A tensor input: dtype, shape, and memory layout (`detail` parametrizes the layout)."""

    dtype: torch.dtype
    shape: tuple[int, ...]
    layout: str = "contiguous"
    detail: tuple[int, ...] = ()

    @property
    def source_shape(self) -> tuple[int, ...]:
        """The shape of the values before layout: expanded dimensions are 1."""
        if self.layout != "expanded":
            return self.shape
        return tuple(1 if d in self.detail else n for d, n in enumerate(self.shape))


def pick_dtype(rng: random.Random, dtype_class: str = "any") -> torch.dtype:
    choices = DTYPE_CLASSES[dtype_class]
    return rng.choices(choices, [DTYPE_WEIGHTS[d] for d in choices])[0]


def base_shape(rng: random.Random) -> tuple[int, ...]:
    """The broadcast shape of a program: 0-d to 4-d, mostly <= 64 elements, sometimes empty."""
    if rng.random() < 0.1:  # long rows: vector loops plus a tail
        return tuple([rng.choice([1, 2, 3])] * rng.randint(0, 1) + [rng.choice(_LONG_DIMS)])
    rank = rng.choices(range(5), [1, 3, 3, 2, 2])[0]
    while True:
        shape = [rng.choice(_DIMS) for _ in range(rank)]
        if _numel(shape) <= 64:
            break
    if rank and rng.random() < 0.05:
        shape[rng.randrange(rank)] = 0
    return tuple(shape)


def derive_shape(rng: random.Random, base: tuple[int, ...]) -> tuple[int, ...]:
    """A shape that broadcasts to `base`: a suffix of it, some dimensions set to 1."""
    if rng.random() < 0.45:
        return base
    if rng.random() < 0.15:
        return ()
    rank = rng.randint(0, len(base))
    suffix = base[len(base) - rank :]
    return tuple(1 if rng.random() < 0.3 else n for n in suffix)


def pick_layout(rng: random.Random, shape: tuple[int, ...]) -> tuple[str, tuple[int, ...]]:
    """A random layout that makes sense for `shape`, with its detail."""
    rank = len(shape)
    options = ["contiguous"] * 4
    if rank >= 2:
        options += ["transposed", "permuted"]
    if rank == 4:
        options.append("channels_last")
    if rank >= 1:
        options.append("sliced")
    if any(n > 1 for n in shape):
        options.append("expanded")
    layout = rng.choice(options)
    if layout == "permuted":
        perm = list(range(rank))
        rng.shuffle(perm)
        return layout, tuple(perm)
    if layout == "sliced":
        return layout, (rng.randrange(rank),)
    if layout == "expanded":
        dims = [d for d, n in enumerate(shape) if n > 1]
        return layout, tuple(sorted(rng.sample(dims, rng.randint(1, len(dims)))))
    return layout, ()


def random_spec(rng: random.Random, base: tuple[int, ...], dtype_class: str = "any") -> TensorSpec:
    shape = derive_shape(rng, base)
    layout, detail = pick_layout(rng, shape) if rng.random() < 0.5 else ("contiguous", ())
    return TensorSpec(pick_dtype(rng, dtype_class), shape, layout, detail)


def _numel(shape: tuple[int, ...] | list[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _float_values(rng: random.Random, gen: torch.Generator, shape, dtype) -> torch.Tensor:
    style = rng.choice(["normal", "normal", "integers", "unit", "positive", "wide"])
    if style == "integers":  # exact in every float type; halves are rounding ties
        v = torch.randint(-12, 13, shape, generator=gen, dtype=torch.float64) / 2
    elif style == "unit":
        v = torch.rand(shape, generator=gen, dtype=torch.float64) * 2 - 1
    elif style == "positive":
        v = torch.rand(shape, generator=gen, dtype=torch.float64) * 4 + 1e-3
    elif style == "wide":
        v = torch.randn(shape, generator=gen, dtype=torch.float64) * 50
    else:
        v = torch.randn(shape, generator=gen, dtype=torch.float64) * rng.choice([1.0, 3.0])
    v = v.to(dtype)
    if rng.random() < 0.3:
        info = torch.finfo(dtype)
        specials = [float("nan"), float("inf"), -float("inf"), -0.0, 0.0, info.max, -info.max,
                    info.tiny, info.tiny / 4, 1.0]
        v = _sprinkle(rng, gen, v, torch.tensor(specials, dtype=dtype))
    return v


def _int_values(rng: random.Random, gen: torch.Generator, shape, dtype) -> torch.Tensor:
    if dtype == torch.bool:
        return torch.rand(shape, generator=gen) < 0.5
    low = 0 if dtype == torch.uint8 else -10
    v = torch.randint(low, 21 + low, shape, generator=gen, dtype=torch.int64)
    v = v.to(dtype)
    if rng.random() < 0.2:
        info = torch.iinfo(dtype)
        specials = [info.max, info.min, info.min + 1, 0, 1, info.max - 1]
        if dtype != torch.uint8:
            specials.append(-1)
        v = _sprinkle(rng, gen, v, torch.tensor(specials, dtype=dtype))
    return v


def _sprinkle(rng, gen, v: torch.Tensor, specials: torch.Tensor) -> torch.Tensor:
    """`v` with about a quarter of its elements replaced by random picks from `specials`."""
    if v.numel() == 0:
        return v
    where = torch.rand(v.shape, generator=gen) < rng.choice([0.1, 0.25, 0.5])
    pick = torch.randint(0, len(specials), v.shape, generator=gen)
    return torch.where(where, specials[pick], v)


def random_values(rng: random.Random, gen: torch.Generator, dtype, shape) -> torch.Tensor:
    """A contiguous tensor of random values of `dtype` (see the module docstring)."""
    if dtype in FLOATS:
        return _float_values(rng, gen, shape, dtype)
    return _int_values(rng, gen, shape, dtype)


def _garbage(dtype: torch.dtype) -> float | int | bool:
    """What a sliced tensor holds between its elements: a value wrong reads reveal."""
    if dtype == torch.bool:
        return True
    return 77 if dtype in FLOATS or dtype == torch.uint8 else -77


def lay_out(spec: TensorSpec, values: torch.Tensor) -> torch.Tensor:
    """`values` (of `spec.source_shape`) in `spec`'s layout."""
    rank = len(spec.shape)
    if spec.layout == "transposed":
        return values.transpose(-1, -2).contiguous().transpose(-1, -2)
    if spec.layout == "permuted":
        perm = list(spec.detail)
        inverse = [perm.index(d) for d in range(rank)]
        return values.permute(perm).contiguous().permute(inverse)
    if spec.layout == "channels_last":
        return values.contiguous(memory_format=torch.channels_last)
    if spec.layout == "sliced":
        (dim,) = spec.detail
        wide = list(spec.shape)
        wide[dim] = 2 * wide[dim] + 1
        base = torch.full(wide, _garbage(spec.dtype), dtype=spec.dtype)
        view = base.narrow(dim, 1, 2 * spec.shape[dim]).unflatten(dim, (spec.shape[dim], 2))
        view = view.select(dim + 1, 0)
        view.copy_(values)
        return view
    if spec.layout == "expanded":
        return values.expand(spec.shape)
    return values.contiguous()


def make_tensor(rng: random.Random, gen: torch.Generator, spec: TensorSpec) -> torch.Tensor:
    """A random tensor as `spec` describes."""
    return lay_out(spec, random_values(rng, gen, spec.dtype, spec.source_shape))


def describe(name: str, value: object, spec: TensorSpec | None = None) -> str:
    """One line about an input: its type, layout and strides, or its value if a number."""
    if not isinstance(value, torch.Tensor):
        return f"{name} = {value!r}"
    layout = f" {spec.layout}{list(spec.detail) if spec.detail else ''}" if spec else ""
    dtype = str(value.dtype).replace("torch.", "")
    return (
        f"{name}: {dtype}{list(value.shape)}{layout} stride={value.stride()} "
        f"offset={value.storage_offset()}"
    )


def tensor_source(value: torch.Tensor) -> str:
    """Python text that rebuilds `value` exactly: its storage, then `as_strided`."""
    storage = torch.empty(0, dtype=value.dtype)
    n = value.untyped_storage().nbytes() // value.element_size()
    storage.set_(value.untyped_storage(), 0, (n,), (1,))
    data = storage.tolist()
    return (
        f"torch.tensor({data!r}, dtype={value.dtype}).as_strided("
        f"{tuple(value.shape)}, {value.stride()}, {value.storage_offset()})"
    )


def clone_input(t: torch.Tensor) -> torch.Tensor:
    """A copy of `t` with its whole storage (the elements a layout skips included), at the
    same offset, sizes and strides: what a program may write into, afresh."""
    storage = t.untyped_storage().clone()
    return torch.empty(0, dtype=t.dtype).set_(storage, t.storage_offset(), t.size(), t.stride())


def storage_of(t: torch.Tensor) -> torch.Tensor:
    """All of `t`'s storage as a 1-d tensor of its dtype: to compare every element of it."""
    n = t.untyped_storage().nbytes() // t.element_size()
    return torch.empty(0, dtype=t.dtype).set_(t.untyped_storage(), 0, (n,), (1,))
