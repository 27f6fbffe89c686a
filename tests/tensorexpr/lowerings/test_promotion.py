"""nncfuse's type promotion equals torch._prims_common's on every combination of kinds."""

import itertools

import torch
from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND as KIND
from torch._prims_common import elementwise_dtypes as reference

from nncfuse.tensorexpr.lowerings import Promotion, elementwise_dtypes

DTYPES = [
    torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
    torch.float16, torch.bfloat16, torch.float32, torch.float64,
]
OPERANDS = [(d, n) for d in DTYPES for n in (0, 1)] + [True, 2, 2.5]


def test_matches_prims_common():
    combos = itertools.chain(
        itertools.product(OPERANDS, repeat=2), itertools.product(OPERANDS[::3], repeat=3)
    )
    checked = 0
    for combo in combos:
        if not any(isinstance(c, tuple) for c in combo):
            continue
        examples = [
            torch.empty((1,) * c[1], dtype=c[0], device="meta") if isinstance(c, tuple) else c
            for c in combo
        ]
        for kind in Promotion:
            want = reference(*examples, type_promotion_kind=KIND[kind.name])
            assert elementwise_dtypes(list(combo), kind) == tuple(want), (combo, kind)
            checked += 1
    assert checked > 5000
