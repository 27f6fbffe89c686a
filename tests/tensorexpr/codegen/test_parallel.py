"""Parallel loops: large kernels run on torch's threads with results identical to one thread."""

import pytest
import torch

import nncfuse
from nncfuse.jit.fuser.runtime import kernel_of


def chain(a, b):
    return torch.sin(a * b) * torch.exp(-a) + b


@pytest.fixture
def threads():
    before = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(before)


@pytest.mark.parametrize("shape", [(1 << 20,), (777, 1031), (3, 5, 70001)])
def test_parallel_kernel_equals_serial_and_eager(threads, shape):
    f = nncfuse.jit(chain)
    a, b = torch.randn(shape), torch.randn(shape)
    results = []
    for n in (1, 2, 3):
        threads(n)
        f(a, b)
        results.append(f(a, b))
    assert torch.equal(results[0], results[1]) and torch.equal(results[0], results[2])
    torch.testing.assert_close(results[0], chain(a, b))
    (group,) = nncfuse.fusion_groups(f.graph_for(a, b))
    stmt = str(kernel_of(group).stmt)
    assert "/* parallel */" in stmt
    assert "GOMP_parallel" in kernel_of(group).get_code_text("ir")


def test_small_kernels_stay_serial():
    f = nncfuse.jit(chain)
    a, b = torch.randn(100), torch.randn(100)
    f(a, b)
    (group,) = nncfuse.fusion_groups(f.graph_for(a, b))
    assert "/* parallel */" not in str(kernel_of(group).stmt)


@pytest.mark.parametrize("shape", [(1 << 21,), (2048, 1001)])
def test_large_outputs_stream_past_the_caches(threads, shape):
    f = nncfuse.jit(chain)
    a, b = torch.randn(shape), torch.randn(shape)
    f(a, b)
    for n in (1, 2):
        threads(n)
        torch.testing.assert_close(f(a, b), chain(a, b))
    (group,) = nncfuse.fusion_groups(f.graph_for(a, b))
    ir_text = kernel_of(group).get_code_text("ir")
    # Rows of 1001 floats leave vectors unaligned: plain stores there.
    assert ("!nontemporal" in ir_text) == (shape[-1] % 16 == 0)


def test_large_outputs_ask_for_huge_pages():
    f = nncfuse.jit(chain)
    a, b = torch.randn(1 << 21), torch.randn(1 << 21)  # 8 MB outputs
    f(a, b)
    torch.testing.assert_close(f(a, b), chain(a, b))
    (group,) = nncfuse.fusion_groups(f.graph_for(a, b))
    assert "huge_pages(" in kernel_of(group).call.source
    small = nncfuse.jit(chain)
    x = torch.randn(1000)
    small(x, x)
    (group,) = nncfuse.fusion_groups(small.graph_for(x, x))
    assert "huge_pages(" not in kernel_of(group).call.source



def test_compiled_modules_leave_no_cycles_to_collect():
    """A kernel's llvmlite module (with a parallel loop's outlined function, and loops'
    phis) is taken apart once its text is made: reference counting frees its instructions
    and blocks, not a garbage collection."""
    import gc

    from llvmlite import ir

    f = nncfuse.jit(chain)
    a, b = torch.randn(777, 1031), torch.randn(777, 1031)
    f(a, b)
    (group,) = nncfuse.fusion_groups(f.graph_for(a, b))
    assert "GOMP_parallel" in kernel_of(group).get_code_text("ir")
    gc.collect()
    enabled = gc.isenabled()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        kernel = nncfuse.TensorExprKernel(group.g("Subgraph"))
        gc.collect()
        left = [o for o in gc.garbage if isinstance(o, (ir.Instruction, ir.Block))]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        if enabled:
            gc.enable()
    torch.testing.assert_close(kernel.run([a, b]), kernel.fallback([a, b]))
    assert not left, left[:5]
