"""Buffers: named, typed, strided regions of memory that loads and stores address.

A buffer is a kernel argument (an input or output tensor) or a temporary
that the schedule allocates. Its shape and strides are expressions (immediates
today). Buffers compare by identity. `flat()` gives a one-dimensional view of
the same memory; `root` is the buffer that owns the memory, which is what
codegen binds to a pointer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .dtype import INDEX, Dtype
from .expr import Expr, Imm, imm

DimLike = Expr | int


def _as_index(d: DimLike) -> Expr:
    return imm(d) if isinstance(d, int) else d


def contiguous_strides(dims: Sequence[Expr]) -> tuple[Expr, ...]:
    """Row-major strides of `dims`, folded where the dims are immediates."""
    strides: list[Expr] = []
    acc: Expr = imm(1)
    for d in reversed(dims):
        strides.append(acc)
        acc = _fold_mul(acc, d)
    return tuple(reversed(strides))


def span(dims: Sequence[int], strides: Sequence[int]) -> int:
    """Elements from the first to one past the last that sizes `dims` and `strides` address
    (0 for an empty tensor): the memory a strided tensor needs, an expanded one's too."""
    return 0 if 0 in dims else 1 + sum((d - 1) * s for d, s in zip(dims, strides))


def _fold_mul(a: Expr, b: Expr) -> Expr:
    if isinstance(a, Imm) and isinstance(b, Imm):
        return imm(a.value * b.value)  # type: ignore[operator]
    return a * b


@dataclass(frozen=True, eq=False)
class Buf:
    """A buffer of `dtype` elements with shape `dims` and element strides `strides`."""

    name: str
    dtype: Dtype
    dims: tuple[Expr, ...]
    strides: tuple[Expr, ...]
    base: Buf | None = None

    def __post_init__(self) -> None:
        if self.dtype.lanes != 1:
            raise TypeError("buffers hold scalars")
        if len(self.dims) != len(self.strides):
            raise TypeError(f"{self.name}: {len(self.dims)} dims but {len(self.strides)} strides")
        for e in (*self.dims, *self.strides):
            if e.dtype != INDEX:
                raise TypeError(f"{self.name}: dims and strides must be {INDEX}")

    @staticmethod
    def make(
        name: str,
        dtype: Dtype,
        dims: Sequence[DimLike],
        strides: Sequence[DimLike] | None = None,
    ) -> Buf:
        """A buffer from ints or expressions; contiguous unless `strides` are given."""
        dims_e = tuple(_as_index(d) for d in dims)
        strides_e = (
            contiguous_strides(dims_e) if strides is None else tuple(_as_index(s) for s in strides)
        )
        return Buf(name, dtype, dims_e, strides_e)

    @property
    def ndim(self) -> int:
        return len(self.dims)

    @property
    def root(self) -> Buf:
        return self.base if self.base is not None else self

    def static_dims(self) -> tuple[int, ...] | None:
        """The dims as ints, or None if any is symbolic."""
        if all(isinstance(d, Imm) for d in self.dims):
            return tuple(d.value for d in self.dims)  # type: ignore[union-attr,misc]
        return None

    def is_contiguous(self) -> bool:
        dims = self.static_dims()
        if dims is None:
            return self.strides == contiguous_strides(self.dims)
        expect = 1
        for d, s in zip(reversed(dims), reversed(self.strides)):
            if d != 1 and (not isinstance(s, Imm) or s.value != expect):
                return False
            expect *= d
        return True

    def extent(self) -> Expr:
        """Number of elements between the first and one past the last addressed element."""
        dims = self.static_dims()
        strides = [s.value if isinstance(s, Imm) else None for s in self.strides]
        if dims is not None and None not in strides:
            return imm(span(dims, strides))  # type: ignore[arg-type]
        total: Expr = imm(1)
        for d, s in zip(self.dims, self.strides):
            total = total + (d - 1) * s
        return total

    def flat(self) -> Buf:
        """A one-dimensional, unit-stride view of this buffer's memory."""
        return Buf(self.name, self.dtype, (self.extent(),), (imm(1),), base=self.root)

    def __repr__(self) -> str:
        return f"Buf({self.name!r}, {self.dtype.name})"
