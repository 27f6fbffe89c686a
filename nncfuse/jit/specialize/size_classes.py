"""size_classes: which signatures one dynamic plan serves, and which of their sizes vary.

A size class is a signature without its sizes (`size_class`): what a dynamic
kernel's guard checks (rank, dtype, device, requires_grad, dims of 1, which
dims are equal, the layout class). The policy keeps a `ClassState` per class:
the shapes of its first signature and the dims that have differed since.
Automatic dynamic (torch.compile's) makes only those dims symbolic: the
sizes of the others stay static in the kernels (`static_sizes`), and the
dynamic plan is pinned to them (`serves`); when a pinned dim changes too, the
policy makes a more general plan.

    (8, 1024), then (13, 1024)   ->   varied {(0, 0)}: static {1024}, s0 for 8, 13, ...

A class is more general than another (`generalizes`) when it is the same but
for dims of equal size: (6, 8) with (6, 8) generalizes (7, 7) with (7, 7).
A dynamic kernel binds one symbol per number of its class, so its guard admits
the calls of every class it generalizes (given its static sizes): past every
bound the policy runs those with that plan instead of unfused.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from . import scripting

Shapes = tuple[tuple[int, ...] | None, ...]  # per argument: a tensor's sizes, or None
Pins = tuple[tuple[int | None, ...] | None, ...]  # per argument and dim: a static size or None


def autocast_state() -> Any:
    """False outside autocast; inside, the CPU's autocast dtype (or True for another device's
    autocast): part of every signature and size class, so that a plan made under one never
    runs a call under another."""
    if not torch._C._is_any_autocast_enabled():
        return False
    return torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else True


def size_class(args: tuple[Any, ...]) -> tuple[Any, ...] | None:
    """What a dynamic plan is valid for: the signature without the sizes. Per tensor its
    dtype, device, requires_grad, and per dim: one, or a number shared by the dims of equal
    size, broadcast (stride 0) or row-major over the non-broadcast dims. None when a tensor
    has another layout (it gets static plans)."""
    numbers: dict[int, int] = {}
    out: list[Any] = [torch.is_grad_enabled(), autocast_state()]
    for a in args:
        if not isinstance(a, torch.Tensor):
            out.append(scripting.annotation(a) if type(a) in (list, tuple, dict) else type(a))
            continue
        dims: list[Any] = []
        expect = 1
        empty = a.numel() == 0  # no element is read: any strides will do
        for size, stride in zip(reversed(a.shape), reversed(a.stride())):
            if size == 1:
                dims.append("one")
                continue
            number = numbers.setdefault(size, len(numbers))
            if stride == 0 and not empty:
                dims.append(("broadcast", number))
                continue
            if size > 1 and stride != expect and not empty:
                return None
            dims.append(number)
            expect *= size
        out.append((a.dtype, a.device, a.requires_grad, tuple(reversed(dims))))
    return tuple(out)


def shapes(args: tuple[Any, ...]) -> Shapes:
    return tuple(tuple(a.shape) if isinstance(a, torch.Tensor) else None for a in args)


@dataclass
class ClassState:
    """One size class of a policy: its first shapes, the dims that varied, its dynamic plan."""

    first: Shapes
    varied: set[tuple[int, int]] = field(default_factory=set)
    plan: Any = None  # the dynamic plan, serving the signatures that match `pins`
    pins: Pins = ()

    def note(self, now: Shapes) -> None:
        """Record the dims of `now` (a signature of this class) that differ from the first."""
        for i, (first, sizes) in enumerate(zip(self.first, now)):
            if first is not None and sizes is not None:
                self.varied |= {(i, d) for d, (a, b) in enumerate(zip(first, sizes)) if a != b}

    def static_sizes(self, now: Shapes) -> frozenset[int]:
        """Sizes a dynamic kernel for `now` keeps static: those of dims that never varied,
        unless a varying dim has that size too."""
        fixed, moving = set(), set()
        for i, sizes in enumerate(now):
            for d, size in enumerate(sizes or ()):
                (moving if (i, d) in self.varied else fixed).add(size)
        return frozenset(fixed - moving - {1})

    def adopt(self, plan: Any, now: Shapes, static: frozenset[int]) -> None:
        """`plan` is the class's dynamic plan, compiled for `now` with `static` sizes."""
        self.plan = plan
        self.pins = tuple(
            None if sizes is None else tuple(s if s in static else None for s in sizes)
            for sizes in now
        )

    def serves(self, now: Shapes) -> bool:
        """Whether the class's dynamic plan holds for `now`: its static sizes are `now`'s."""
        return self.plan is not None and all(
            pins is None or all(p is None or p == s for p, s in zip(pins, sizes or ()))
            for pins, sizes in zip(self.pins, now)
        )


def generalizes(general: tuple[Any, ...] | None, specific: tuple[Any, ...] | None) -> bool:
    """Whether size class `general` is `specific` but for dims of equal size in `specific`
    that it numbers apart (its dynamic kernels give them symbols of their own, which the
    guard binds one by one): every number of `general` stands for one of `specific`."""
    if general is None or specific is None or len(general) != len(specific):
        return False
    numbers: dict[int, int] = {}
    for g, s in zip(general, specific):
        if not (isinstance(g, tuple) and isinstance(s, tuple) and len(g) == len(s) == 4):
            if g != s:
                return False
            continue
        if g[:3] != s[:3] or len(g[3]) != len(s[3]):
            return False
        for a, b in zip(g[3], s[3]):
            if isinstance(a, tuple) != isinstance(b, tuple) or (a == "one") != (b == "one"):
                return False
            if a == "one":
                continue
            a, b = (a[1], b[1]) if isinstance(a, tuple) else (a, b)
            if numbers.setdefault(a, b) != b:
                return False
    return True
