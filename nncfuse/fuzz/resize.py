"""resize: one fuzz case at several sizes, against the same dynamic kernels.

`python -m nncfuse.fuzz --backend llvm,sizes` adds this check to each case
(`oracle.check_sizes`):
the program goes through `nncfuse.jit(..., dynamic=True)` and is called on
input set A, then on copies of it at other sizes (`resized`): each distinct
size of the inputs is mapped to another (consistently, so broadcasts stay
valid) — larger, 0, 1, or random — and fresh values are drawn in the same
dtypes and layouts. Every call is compared with eager as `oracle` compares
them; a size where eager raises must raise in nncfuse too.

    x0: (4, 7) y: (7,)   ->   (9, 12) (12,)   (0, 7) (7,)   (4, 1) (1,)   ...
"""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Any

import torch

from .inputs import make_tensor
from .program import Case


def _maps(values: list[int], rng: random.Random) -> list[dict[int, int]]:
    """Size substitutions: all grown, one to 0, one to 1, all random."""
    if not values:
        return []
    maps = [{v: v + 5 for v in values}, {rng.choice(values): 0}, {rng.choice(values): 1},
            {v: rng.randint(2, 40) for v in values}]
    return maps


def resized(case: Case, rng: random.Random, gen: torch.Generator) -> list[tuple[Any, ...]]:
    """Input sets like set A at other sizes (see the module docstring)."""
    params, base = case.program.params, case.inputs[0]
    values = sorted({s for p, v in zip(params, base) if isinstance(v, torch.Tensor)
                     for s in v.shape if s != 1})
    sets = []
    for mapping in _maps(values, rng):
        inputs: list[Any] = []
        for p, v in zip(params, base):
            if not isinstance(v, torch.Tensor) or p.spec is None:
                inputs.append(v)
                continue
            shape = tuple(mapping.get(s, s) for s in p.spec.shape)
            inputs.append(make_tensor(rng, gen, replace(p.spec, shape=shape)))
        sets.append(tuple(inputs))
    return sets


def describe_sizes(inputs: tuple[Any, ...]) -> str:
    return "sizes " + ", ".join(str(tuple(v.shape)) for v in inputs if isinstance(v, torch.Tensor))
