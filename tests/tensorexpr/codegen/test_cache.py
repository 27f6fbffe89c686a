"""NNCFUSE_CACHE_DIR: a second process loads object code instead of compiling it."""

import os
import subprocess
import sys
from pathlib import Path

import torch

import nncfuse
from nncfuse.jit.fuser.runtime import kernel_of
from nncfuse.tensorexpr.passes.parallelize import GRAIN

ROOT = Path(__file__).resolve().parents[3]

PROGRAM = """
import torch, nncfuse
def f(a, b):
    return torch.sigmoid(a * b) + torch.cos(b)
g = nncfuse.jit(f)
a, b = torch.randn(1000), torch.randn(1000)
g(a, b)
torch.testing.assert_close(g(a, b), f(a, b))
print("ok")
"""

#: Two kernels, both with parallel loops (sizes above the parallel grain), compiled in
#: the order the command line gives: the IR text (the cache key) of each must not depend
#: on what the process compiled before it.
TWO_KERNELS = f"""
import sys, torch, nncfuse
from nncfuse.jit.fuser.runtime import kernel_of
def kernel_a(a, b):
    return torch.sigmoid(a * b) + torch.cos(b)
def kernel_b(x):
    return torch.tanh(x) * 2 + x
n = {4 * GRAIN}
calls = {{
    "A": (kernel_a, (torch.randn(n), torch.randn(n))),
    "B": (kernel_b, (torch.randn(n),)),
}}
for key in sys.argv[1:]:
    fn, args = calls[key]
    g = nncfuse.jit(fn)
    g(*args)
    torch.testing.assert_close(g(*args), fn(*args))
    (group,) = nncfuse.fusion_groups(g.graph_for(*args))
    assert "GOMP_parallel" in kernel_of(group).get_code_text("ir")
print("ok")
"""


def run(cache_dir, tmp_path, program=PROGRAM, args=()):
    # PYTHONPATH: the child imports this checkout, not whichever nncfuse is installed
    env = {**os.environ, "NNCFUSE_CACHE_DIR": str(cache_dir), "NNCFUSE_LOG_LEVEL": ">llvm_jit",
           "PYTHONPATH": str(ROOT)}
    script = tmp_path / "program.py"
    script.write_text(program)
    done = subprocess.run([sys.executable, str(script), *args], env=env, capture_output=True,
                          text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
    return done.stderr


def test_second_process_loads_from_the_cache(tmp_path):
    cache = tmp_path / "cache"
    first = run(cache, tmp_path)
    assert "Object code cached" in first and "from the cache" not in first
    assert len(list(cache.glob("*.o"))) == 1
    second = run(cache, tmp_path)
    assert "Object code from the cache" in second and "cached:" not in second


def test_cache_key_does_not_depend_on_compile_order(tmp_path):
    cache = tmp_path / "cache"
    first = run(cache, tmp_path, TWO_KERNELS, ["A", "B"])
    assert first.count("Object code cached: ") == 2 and "from the cache" not in first
    second = run(cache, tmp_path, TWO_KERNELS, ["B", "A"])
    assert "cached: " not in second and second.count("Object code from the cache: ") == 2, second
    assert len(list(cache.glob("*.o"))) == 2


def two_loops(x, y):
    return torch.sin(x) * 2, torch.cos(y) + 1


def test_same_graph_gives_the_same_ir_text():
    """Outlined loops are numbered within their kernel: recompiling changes no byte."""
    args = (torch.randn(2 * GRAIN), torch.randn(3, GRAIN))
    g = nncfuse.jit(two_loops)
    g(*args)
    (group,) = nncfuse.fusion_groups(g.graph_for(*args))
    subgraph = group.g("Subgraph")
    texts = [nncfuse.TensorExprKernel(subgraph).jit.ir_text for _ in range(2)]
    assert texts[0] == texts[1] == kernel_of(group).jit.ir_text
    name = kernel_of(group).name
    assert f'@"{name}.par0"' in texts[0] and f'@"{name}.par1"' in texts[0]


DYNAMIC = """
import sys, torch, nncfuse
def f(a, b):
    return torch.sigmoid(a * b) + torch.cos(b)
g = nncfuse.jit(f, dynamic=True)
for n in map(int, sys.argv[1:]):
    a, b = torch.randn(n, 7), torch.randn(7)
    torch.testing.assert_close(g(a, b), f(a, b))
print("ok")
"""


def test_dynamic_kernels_are_keyed_by_their_size_class_not_sizes(tmp_path):
    cache = tmp_path / "cache"
    first = run(cache, tmp_path, DYNAMIC, ["1000", "17"])
    assert first.count("Object code cached") == 1  # one kernel for both sizes
    second = run(cache, tmp_path, DYNAMIC, ["5", "300"])  # other sizes, the same class
    assert "Object code from the cache" in second and "cached:" not in second
    assert len(list(cache.glob("*.o"))) == 1


def test_identical_ir_is_optimized_once_per_process(monkeypatch):
    """A module whose IR text this process compiled before reuses its object code: LLVM
    optimizes it once; each kernel still gets its own engine, and runs."""
    from nncfuse.tensorexpr.codegen import llvm_jit

    def f(x):
        return torch.tanh(x) * 2 + x

    x = torch.randn(2 * GRAIN)
    g = nncfuse.jit(f)
    g(x)
    (group,) = nncfuse.fusion_groups(g.graph_for(x))
    optimized = []
    real = llvm_jit._optimized
    monkeypatch.setattr(llvm_jit, "_optimized", lambda text: optimized.append(text) or real(text))
    kernels = [nncfuse.TensorExprKernel(group.g("Subgraph")) for _ in range(2)]
    assert optimized == []  # the object code of g's kernel, not LLVM's pipeline again
    assert kernels[0].jit.engine is not kernels[1].jit.engine
    for k in kernels:
        torch.testing.assert_close(k.run([x]), f(x))
    assert "tanh" in kernels[1].get_code_text("ir")  # the optimized module, made again
