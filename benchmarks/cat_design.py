"""cat's two lowerings on `torch.cat([x + 1, y * 2], 1).relu()`, 2 x (1024 x 512) float32.

    python benchmarks/cat_design.py parts      # one loop per part (partition_loops), the default
    python benchmarks/cat_design.py selects    # one loop over the output, a select per element

Run each in its own process: identical groups share a compiled kernel within one.
"""

import sys

import torch
from harness import compare
from workloads import cat_relu

import nncfuse
import nncfuse.tensorexpr.kernel as kernel


def main() -> None:
    mode = sys.argv[1] if len(sys.argv) > 1 else "parts"
    torch.set_num_threads(1)
    args = (torch.randn(1024, 512), torch.randn(1024, 512))
    if mode == "selects":
        kernel.partition_loops = lambda stmt: stmt  # type: ignore[assignment]
    fused = nncfuse.jit(cat_relu)
    compiled = torch.compile(cat_relu)
    for _ in range(3):
        fused(*args)
        compiled(*args)
    torch.testing.assert_close(fused(*args), cat_relu(*args), rtol=0, atol=0)
    times = compare({"eager": lambda: cat_relu(*args), "torch.compile": lambda: compiled(*args),
                     f"nncfuse ({mode})": lambda: fused(*args)})
    print(", ".join(f"{k} {v * 1e6:.0f} us" for k, v in times.items()))


if __name__ == "__main__":
    main()
