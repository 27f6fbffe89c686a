"""The NNC walkthrough's test program, fused by nncfuse.

Run with the walkthrough's dumps:

    NNCFUSE_LOG_LEVEL="tensorexpr_fuser:>>kernel:>>llvm_codegen" python examples/walkthrough.py
"""

import torch

import nncfuse


def foo(a):
    b = torch.conv2d(a, torch.randn(1, 1, 1, 1))  # an external call at the group's start
    x = torch.mul(b, b)  # fusible
    y = torch.sin(x)  # fusible
    z = torch.mul(y, y)  # fusible
    return z


def main() -> None:
    torch.manual_seed(0)
    fused = nncfuse.jit(foo)
    for shape in [(1, 1, 128, 128), (1, 1, 64, 96)]:
        a = torch.randn(*shape)
        for _ in range(3):
            torch.manual_seed(1)
            got = fused(a)
        torch.manual_seed(1)
        want = foo(a)
        torch.testing.assert_close(got, want)
        groups = nncfuse.fusion_groups(fused.graph_for(a))
        print(
            f"input {tuple(shape)}: matches eager; {len(groups)} fusion group(s): "
            f"{[g.kind() for g in groups]}"
        )


if __name__ == "__main__":
    main()
