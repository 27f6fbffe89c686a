"""Scalar and vector element types of the loop IR.

A `Dtype` is a scalar kind (`float32`, `int64`, `bool`, ...) and a lane count.
`lanes == 1` is a scalar; `lanes > 1` is a SIMD vector of that many elements,
the type of `Ramp`, `Broadcast` and of any expression computed from them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# name -> (C spelling for the printer, size in bytes, torch dtype)
_SCALARS: dict[str, tuple[str, int, torch.dtype]] = {
    "bool": ("bool", 1, torch.bool),
    "uint8": ("uint8_t", 1, torch.uint8),
    "int8": ("int8_t", 1, torch.int8),
    "int16": ("int16_t", 2, torch.int16),
    "int32": ("int", 4, torch.int32),
    "int64": ("int64_t", 8, torch.int64),
    "float16": ("half", 2, torch.float16),
    "bfloat16": ("bfloat16", 2, torch.bfloat16),
    "float32": ("float", 4, torch.float32),
    "float64": ("double", 8, torch.float64),
}
_FROM_TORCH = {t: name for name, (_, _, t) in _SCALARS.items()}


@dataclass(frozen=True)
class Dtype:
    """An element type: a scalar kind and a number of SIMD lanes."""

    name: str
    lanes: int = 1

    def __post_init__(self) -> None:
        if self.name not in _SCALARS:
            raise ValueError(f"unknown scalar type {self.name!r}")
        if self.lanes < 1:
            raise ValueError(f"lanes must be positive, got {self.lanes}")

    @property
    def scalar(self) -> Dtype:
        return self if self.lanes == 1 else Dtype(self.name)

    def with_lanes(self, lanes: int) -> Dtype:
        return self if lanes == self.lanes else Dtype(self.name, lanes)

    @property
    def itemsize(self) -> int:
        return _SCALARS[self.name][1]

    @property
    def bits(self) -> int:
        return 1 if self.name == "bool" else 8 * self.itemsize

    @property
    def is_float(self) -> bool:
        return self.name.startswith(("float", "bfloat"))

    @property
    def is_int(self) -> bool:
        """Integral, bool excluded."""
        return self.name.startswith(("int", "uint"))

    @property
    def is_bool(self) -> bool:
        return self.name == "bool"

    @property
    def is_signed(self) -> bool:
        return self.is_float or self.name.startswith("int")

    @property
    def is_reduced_float(self) -> bool:
        """float16 and bfloat16: stored narrow, computed in float32."""
        return self.name in ("float16", "bfloat16")

    @property
    def torch(self) -> torch.dtype:
        return _SCALARS[self.name][2]

    def c_name(self) -> str:
        base = _SCALARS[self.name][0]
        return base if self.lanes == 1 else f"{base}<{self.lanes}>"

    def __str__(self) -> str:
        return self.c_name()

    def __repr__(self) -> str:
        return f"Dtype({self.name!r})" if self.lanes == 1 else f"Dtype({self.name!r}, {self.lanes})"


def from_torch(dtype: torch.dtype) -> Dtype:
    """The scalar Dtype of a torch dtype; ValueError for dtypes the IR lacks."""
    try:
        return Dtype(_FROM_TORCH[dtype])
    except KeyError:
        raise ValueError(f"dtype {dtype} is not supported by the loop IR") from None


BOOL = Dtype("bool")
UINT8 = Dtype("uint8")
INT8 = Dtype("int8")
INT16 = Dtype("int16")
INT32 = Dtype("int32")
INT64 = Dtype("int64")
FLOAT16 = Dtype("float16")
BFLOAT16 = Dtype("bfloat16")
FLOAT32 = Dtype("float32")
FLOAT64 = Dtype("float64")

#: The type of loop variables, buffer indices and shapes.
INDEX = INT64

ALL_SCALARS = tuple(Dtype(n) for n in _SCALARS)
