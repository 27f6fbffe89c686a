"""Memory that goes back: the kernels of a dropped nncfuse.jit function (their LLVM engines, ops
and table entries) are freed with it, while identical kernels are shared by the functions that
live.

The RSS measurements run in a fresh interpreter (`_MEASURE`), so that what other tests built
does not blur them. Fresh kernels also pay, per kernel, ~55 KB that llvmlite's new pass
manager never frees (each `create_pass_builder` leaks its PassInstrumentationCallbacks, with
the callbacks every run adds), and each new Python function ~10 KB in TorchScript's
process-wide compilation unit: neither is nncfuse's to free, so the strict bound is measured
on new functions whose object code was compiled before, the loose one on fresh kernels.
"""

import gc
import json
import os
import subprocess
import sys
import weakref

import torch

import nncfuse
from nncfuse.jit.fuser import guard, runtime

FUNCTIONS = 300  # measured; the first WARM_UP are built and dropped before the baseline
WARM_UP = 50
WRAPS = 600

_MEASURE = r"""
import gc, json, os, sys, tempfile, warnings, weakref
import torch
import nncfuse
from nncfuse.jit.fuser import guard, runtime

warnings.simplefilter("error", UserWarning)  # a function that did not script fails the test
N, WARM_UP, WRAPS = map(int, sys.argv[1:])
# Two functions per body: `a<i>` compiles it, `b<i>` (a new function) finds its object code.
source = "".join(f"def {p}{i}(a, b):\n    return (a * b + {i}.0).sin() * b\n\n"
                 for p in "ab" for i in range(N + WARM_UP + 1))
path = os.path.join(tempfile.mkdtemp(), "generated.py")
with open(path, "w") as f:
    f.write(source)
functions = {"torch": torch}
exec(compile(source, path, "exec"), functions)
x, y = torch.randn(16), torch.randn(16)


def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def build(names):
    for name in names:
        g = nncfuse.jit(functions[name])
        g(x, y)
        g(x, y)
    gc.collect()


build([f"a{i}" for i in range(WARM_UP)])
start = rss()
build([f"a{i}" for i in range(WARM_UP, WARM_UP + N)])
fresh = rss()
build([f"b{i}" for i in range(WARM_UP, WARM_UP + N)])
again = rss()

g = nncfuse.jit(functions[f"a{N + WARM_UP}"])
g(x, y)
(node,) = nncfuse.fusion_groups(g.graph_for(x, y))
refs = [weakref.ref(g), weakref.ref(runtime.kernel_of(node))]
del g, node
gc.collect()
dead = [r() is None for r in refs]
tables = [len(runtime._kernels), len(guard._compiled)]

same = functions["a0"]
for _ in range(50):
    nncfuse.jit(same)(x, y)
gc.collect()
before = rss()
for _ in range(WRAPS):
    nncfuse.jit(same)(x, y)
gc.collect()
print(json.dumps({"fresh": (fresh - start) / N, "again": (again - fresh) / N, "dead": dead,
                  "tables": tables, "wrap": (rss() - before) / WRAPS}))
"""


def test_dropped_functions_give_their_memory_back():
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    env = dict(os.environ, PYTHONPATH=root)
    env.pop("NNCFUSE_CACHE_DIR", None)
    done = subprocess.run(
        [sys.executable, "-c", _MEASURE, str(FUNCTIONS), str(WARM_UP), str(WRAPS)],
        cwd=root, env=env, capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout.strip().splitlines()[-1])
    print(got)
    assert got["dead"] == [True, True], "a dropped function or its kernel is still alive"
    assert got["tables"] == [0, 0], "the kernel tables keep dropped kernels"
    # (before: ~160 KB per function, each kernel kept with its engine, op and object code)
    assert got["again"] < 0.05 * 2**20, got
    assert got["fresh"] < 0.1 * 2**20, got
    assert got["wrap"] < 2 * 1024, got


def twice(a, b):
    return (a * b + 1.0).sin() * b


def twice_too(a, b):  # the same body: the same kernel
    return (a * b + 1.0).sin() * b


def _kernel(fn, *args):
    (node,) = nncfuse.fusion_groups(fn.graph_for(*args))
    return runtime.kernel_of(node), node.kind()


def test_a_kernel_lives_while_a_function_uses_it():
    x, y = torch.randn(16), torch.randn(16)
    first, second = nncfuse.jit(twice), nncfuse.jit(twice_too)
    kernel, kind = _kernel(first, x, y)
    assert _kernel(second, x, y) == (kernel, kind)  # shared
    ref = weakref.ref(kernel)
    del first, kernel
    gc.collect()
    assert ref() is not None and runtime.is_fused_op_kind(kind)
    for _ in range(3):
        torch.testing.assert_close(second(x, y), twice(x, y))
    z = torch.randn(16)
    torch.testing.assert_close(second(z, y), twice(z, y))
    del second
    gc.collect()
    assert ref() is None and not runtime.is_fused_op_kind(kind)


def test_an_op_name_is_taken_again_once_free():
    x, y = torch.randn(8), torch.randn(8)
    fn = nncfuse.jit(twice)
    _, kind = _kernel(fn, x, y)
    del fn
    gc.collect()
    guard.clear_kernel_cache()  # (the object code too: this compiles anew)
    fn = nncfuse.jit(twice_too)
    assert _kernel(fn, x, y)[1] == kind
    torch.testing.assert_close(fn(x, y), twice(x, y))


def trained(a, b):
    return ((a * b + 2.0).sin() * b).sum()


def test_a_dropped_training_functions_programs_and_ops_go():
    """autodiff's differentiable graphs run as ops that hold their programs (f, df and their
    kernels): dropped with the function, they are deregistered and freed."""
    a, b = torch.randn(16, requires_grad=True), torch.randn(16)
    fn = nncfuse.jit(trained)
    for _ in range(3):
        fn(a, b).backward()
        expected = a.grad.clone()
        a.grad = None
        trained(a, b).backward()
        torch.testing.assert_close(expected, a.grad)
        a.grad = None
    (plan,) = fn._plans.values()
    entries = [weakref.ref(e) for outer in plan.outers() for e in outer.entries]
    kinds = [e().kind for e in entries]
    assert entries and all(torch._C._jit_get_operation(k)[0] is not None for k in kinds)
    del fn, plan
    gc.collect()
    assert all(e() is None for e in entries)
    assert all(torch._C._jit_get_operation(k)[0] is None for k in kinds)  # deregistered
