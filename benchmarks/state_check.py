"""The per-call cost of guarding a module's state: `nncfuse.jit(module)` checks, on every call,
that the module still holds what its plans were specialized to (`jit/specialize/module_state.py`:
training flags, parameters, submodules, the attributes its code reads). This times that check
alone, and a whole call of a small transformer block beside eager's, in one process.

    python benchmarks/state_check.py [--width 64] [--rounds 7]
"""

from __future__ import annotations

import argparse
import timeit

import torch
from torch import nn

import nncfuse


class Block(nn.Module):
    """A pre-norm transformer block: ten submodules, twelve parameters."""

    def __init__(self, width: int):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.q, self.k, self.v, self.o = (nn.Linear(width, width) for _ in range(4))
        self.fc1, self.fc2 = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)
        self.act, self.drop = nn.GELU(), nn.Dropout(0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.ln1(x)
        scores = self.q(h) @ self.k(h).transpose(-1, -2) * h.shape[-1] ** -0.5
        x = x + self.drop(self.o(torch.softmax(scores, -1) @ self.v(h)))
        return x + self.drop(self.fc2(self.act(self.fc1(self.ln2(x)))))


def _best_us(fn, number: int, rounds: int) -> float:
    return min(timeit.repeat(fn, number=number, repeat=rounds)) / number * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    torch.set_num_threads(1)
    model = Block(args.width).eval()
    fused = nncfuse.jit(model)
    x = torch.randn(1, 4, args.width)
    with torch.no_grad():
        for _ in range(3):
            fused(x)
        state = fused._state.module
        check = _best_us(state.fresh, 100_000, args.rounds)
        empty = _best_us(lambda: None, 100_000, args.rounds)
        call = _best_us(lambda: fused(x), 2_000, args.rounds)
        eager = _best_us(lambda: model(x), 2_000, args.rounds)
    print(f"state check: {check:.2f} us ({len(state.keys)} entries; an empty call {empty:.3f} us)")
    print(f"a call: nncfuse {call:.1f} us, eager {eager:.1f} us")


if __name__ == "__main__":
    main()
