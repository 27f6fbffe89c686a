"""Parallel loops: large kernels run on torch's threads with results identical to one thread."""

import os
import subprocess
import sys

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


#: Run under OMP_THREAD_LIMIT: libgomp grants each parallel region at most that many threads,
#: whatever torch.set_num_threads asked for (4), as it grants fewer under OMP_DYNAMIC on a
#: loaded machine. A kernel that chunked its loop by the count asked for, not the count of the
#: team it got, would leave chunks unwritten: outputs are allocated filled with NaN to show them.
FEWER_THREADS = """
import ctypes, sys, torch, nncfuse
from nncfuse.jit.fuser.runtime import kernel_of
from nncfuse.tensorexpr.codegen import entry, llvm_jit
entry.EMPTY_STRIDED = lambda sizes, strides, dtype: torch.empty_strided(
    sizes, strides, dtype=dtype).fill_(float("nan"))
gomp = ctypes.CDLL(llvm_jit.torch_library("libgomp.so.1"))
torch.set_num_threads(4)
assert gomp.omp_get_thread_limit() == int(sys.argv[1]) < torch.get_num_threads()
def f(x, y):  # nncfuse issue 36 item 7's function
    return torch.sigmoid(x * y) + torch.tanh(y) * 2.0
for shape in [(4096,), (777, 1031)]:
    x, y = torch.randn(shape), torch.randn(shape)
    g = nncfuse.jit(f)
    g(x, y)
    out = g(x, y)
    (group,) = nncfuse.fusion_groups(g.graph_for(x, y))
    assert "/* parallel */" in str(kernel_of(group).stmt)
    assert not out.isnan().any(), (shape, int(out.isnan().sum()))
    torch.testing.assert_close(out, f(x, y))
"""


@pytest.mark.parametrize("limit", [1, 3])
def test_parallel_loops_cover_the_range_with_fewer_threads_than_asked(tmp_path, limit):
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    env = {**os.environ, "OMP_THREAD_LIMIT": str(limit), "PYTHONPATH": root}
    script = tmp_path / "fewer_threads.py"  # a file: TorchScript reads the function's source
    script.write_text(FEWER_THREADS)
    done = subprocess.run([sys.executable, str(script), str(limit)], env=env, cwd=root,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr


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


def _rms_norm_swiglu(x, w, gate, up):
    """A decoder layer's elementwise work: RMSNorm, then SwiGLU of the two projections."""
    normed = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w
    return normed, torch.nn.functional.silu(gate) * up


@pytest.mark.parametrize("rows, parallel", [(1, False), (2048, True)])
def test_decode_sized_kernels_stay_serial_and_prefill_sized_ones_go_parallel(
        threads, rows, parallel):
    """A decode step (one row: 256 and 688 wide) is a few microseconds of work per kernel, less
    than starting a thread team (at 2 threads a decode token would fork once per kernel); a
    long prompt's prefill is worth the threads."""
    threads(2)
    f = nncfuse.jit(_rms_norm_swiglu)
    args = (torch.randn(1, rows, 256), torch.randn(256), torch.randn(1, rows, 688),
            torch.randn(1, rows, 688))
    for _ in range(2):
        got = f(*args)
    for g, e in zip(got, _rms_norm_swiglu(*args)):
        torch.testing.assert_close(g, e)
    groups = nncfuse.fusion_groups(f.graph_for(*args))
    assert groups
    marked = ["/* parallel" in str(kernel_of(g).stmt) for g in groups]
    assert any(marked) if parallel else not any(marked)
