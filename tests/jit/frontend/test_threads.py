"""Many threads calling one nncfuse.jit function: every call is eager's, each signature compiles
once, and TorchScript's optimize switch is left as it was."""

import random
import threading

import pytest
import torch

import nncfuse
from nncfuse.jit.fuser import guard
from nncfuse.jit.specialize import policy

THREADS = 8
ROUNDS = 3


def chain(a, b):
    return torch.sigmoid(a * b) + torch.tanh(b)


def twin(x, y):  # the same computation: the same kernels, compiled once for both
    return torch.sigmoid(x * y) + torch.tanh(y)


def _inputs():
    """Arguments of twelve signatures: sizes, dtypes, and strided (transposed) layouts, which
    profile by running where contiguous ones may be typed on meta tensors."""
    calls = []
    for dtype in (torch.float32, torch.float64):
        for shape in ((5,), (16,), (3, 7), (2, 3, 4)):
            calls.append((torch.randn(shape, dtype=dtype), torch.randn(shape, dtype=dtype)))
        for shape in ((4, 6), (9, 2)):
            a = torch.randn(shape[::-1], dtype=dtype).t()
            calls.append((a, torch.randn(shape, dtype=dtype)))
    return calls


def _run_threads(work):
    """`work(seed)` in THREADS threads at once, seeds 0..THREADS-1; fail on a deadlock."""
    threads = [threading.Thread(target=work, args=(seed,), daemon=True) for seed in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "deadlocked"


def _hammer(fns, calls):
    """Call the functions `fns` from THREADS threads at once (thread k calls fns[k % len(fns)]),
    each over `calls` in its own order; return the errors and each thread's optimize switch
    afterwards."""
    want = [chain(*args) for args in calls]
    barrier = threading.Barrier(THREADS)
    errors, switches = [], []

    def work(seed):
        fn = fns[seed % len(fns)]
        order = list(range(len(calls))) * ROUNDS
        random.Random(seed).shuffle(order)
        try:
            barrier.wait()
            for k in order:
                torch.testing.assert_close(fn(*calls[k]), want[k])
        except Exception as e:  # noqa: BLE001 - reported by the test
            errors.append(e)
        switches.append(torch._C._get_graph_executor_optimize())

    _run_threads(work)
    return errors, switches


def _count_compilations(monkeypatch):
    """Every graph optimized and every kernel compiled, as two lists that fill up."""
    optimized, compiled = [], []
    real_optimize, real_kernel = policy.Policy.optimize, guard.TensorExprKernel

    def optimize(self, graph, prog, dynamic=False):
        optimized.append(graph)
        return real_optimize(self, graph, prog, dynamic)

    def kernel(*args):
        compiled.append(args[0])
        return real_kernel(*args)

    monkeypatch.setattr(policy.Policy, "optimize", optimize)
    monkeypatch.setattr(guard, "TensorExprKernel", kernel)
    guard.clear_kernel_cache()  # each parameter compiles its kernels anew, in the threads
    return optimized, compiled


@pytest.mark.parametrize("use_llvm", [True, False], ids=["llvm", "interp"])
@pytest.mark.parametrize("meta", [True, False], ids=["meta", "profiled"])
def test_threads_get_eager_results_and_compile_each_signature_once(monkeypatch, use_llvm, meta):
    monkeypatch.setattr(policy, "_meta_is_cheap", lambda: meta)
    optimized, compiled = _count_compilations(monkeypatch)
    calls = _inputs()
    fns = [nncfuse.jit(f, use_llvm=use_llvm, max_specializations=len(calls), dynamic=False)
           for f in (chain, twin)]
    switch = torch._C._get_graph_executor_optimize()
    errors, switches = _hammer(fns, calls)
    assert errors == []
    assert switches == [switch] * THREADS
    assert torch._C._get_graph_executor_optimize() == switch
    for fn in fns:
        for args in calls:  # every signature has its kernel...
            assert len(nncfuse.fusion_groups(fn.graph_for(*args))) == 1
    assert len(optimized) == 2 * len(calls)  # ...optimized once per function
    assert len(compiled) == len(calls)  # ...and compiled once for both


def test_beyond_the_limit_threads_run_unfused():
    calls = _inputs()
    fn = nncfuse.jit(chain, max_specializations=3, dynamic=False)
    errors, _ = _hammer([fn], calls)
    assert errors == []
    fused = [len(nncfuse.fusion_groups(fn.graph_for(*args))) for args in calls]
    assert sorted(fused) == [0] * (len(calls) - 3) + [1] * 3


@pytest.mark.parametrize("meta", [True, False], ids=["meta", "profiled"])
def test_threads_share_dynamic_kernels_across_sizes(monkeypatch, meta):
    """Automatic dynamic under threads: a size class gets one dynamic plan, made once, which
    every thread reuses for the class's other sizes; every call is eager's."""
    monkeypatch.setattr(policy, "_meta_is_cheap", lambda: meta)
    optimized, compiled = _count_compilations(monkeypatch)
    calls = [(torch.randn(n), torch.randn(n)) for n in range(100, 140)]
    calls += [(torch.randn(n, 3), torch.randn(n, 3)) for n in range(5, 25)]
    fn = nncfuse.jit(chain)
    errors, _ = _hammer([fn], calls)
    assert errors == []
    # two classes (rank 1, rank 2 with a 3): a static and a dynamic plan each, at most
    assert len(optimized) <= 4 and len(compiled) <= 4
    for args in calls:
        assert len(nncfuse.fusion_groups(fn.graph_for(*args))) == 1


class Scaled(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(6), requires_grad=False)

    def forward(self, x, scale: float = 2.0):
        return torch.relu(x * self.w) * scale + self.w


def test_threads_calling_a_module_with_keywords():
    """A module runs its graph in the interpreter (GraphPlan); keywords bind on every call."""
    m = Scaled()
    fm = nncfuse.jit(m)
    xs = [torch.randn(shape) for shape in ((6,), (3, 6), (2, 2, 6), (5, 6))]
    barrier = threading.Barrier(THREADS)
    errors = []

    def work(seed):
        try:
            barrier.wait()
            for k in random.Random(seed).choices(range(len(xs)), k=4 * len(xs)):
                torch.testing.assert_close(fm(xs[k], scale=0.5), m(xs[k], scale=0.5))
        except Exception as e:  # noqa: BLE001 - reported by the test
            errors.append(e)

    _run_threads(work)
    assert errors == []
    assert all(len(nncfuse.fusion_groups(fm.graph_for(x, scale=0.5))) == 1 for x in xs)


def test_the_optimize_switch_is_per_thread():
    """`_run_as_built` turns TorchScript's optimizing passes off around a call and restores
    them; that is only safe with many threads because the switch is thread-local."""
    seen = []

    def other():
        seen.append(torch._C._get_graph_executor_optimize())
        torch._C._set_graph_executor_optimize(not seen[0])

    before = torch._C._get_graph_executor_optimize()
    t = threading.Thread(target=other)
    t.start()
    t.join()
    assert torch._C._get_graph_executor_optimize() == before


def _pooled_and_recorded(monkeypatch, name, record):
    """Two compile threads, kernels built whatever their size, the kernel cache empty, and
    `guard.<name>` wrapped so that `record` sees each call's arguments first."""
    monkeypatch.setattr(guard, "COMPILE_THREADS", 2)
    monkeypatch.setattr(policy, "_meta_is_cheap", lambda: False)
    real = getattr(guard, name)

    def recorded(*args):
        record(*args)
        return real(*args)

    monkeypatch.setattr(guard, name, recorded)
    guard.clear_kernel_cache()


def _three_groups(x, y):
    """Three fusion groups (cumsum does not fuse), two of them named alike."""
    a = torch.sigmoid(x * y) + 1.0
    b = torch.cumsum(a, 0)
    c = torch.sigmoid(b * y) + 2.0
    return torch.cumsum(c, 1) * torch.tanh(y)


def test_a_graphs_groups_compile_in_the_pool_named_in_graph_order(monkeypatch):
    """The kernels of one graph's groups are built by the compile threads; their op names are
    taken in the groups' order (the first alike-named group's serial is the lower), whichever
    thread finished first."""
    threads = []
    _pooled_and_recorded(monkeypatch, "TensorExprKernel",
                         lambda *args: threads.append(threading.current_thread().name))
    fn = nncfuse.jit(_three_groups)
    x, y = torch.randn(5, 7), torch.randn(5, 7)
    for _ in range(2):
        torch.testing.assert_close(fn(x, y), _three_groups(x, y))
    kinds = [n.kind() for n in nncfuse.fusion_groups(fn.graph_for(x, y))]
    assert len(kinds) == 3 and len(threads) == 3
    assert all(name.startswith("nncfuse-compile") for name in threads)
    alike = [k for k in kinds if k.startswith("nncfuse::fused_mul_sigmoid_add")]
    serials = [int(k.rsplit("_k", 1)[1]) if "_k" in k else 0 for k in alike]
    assert len(serials) == 2 and serials[0] < serials[1]



def _repeats(x, y):
    """Two identical groups, broken apart by cumsums, and a larger one between them."""
    a = torch.sigmoid(x * y) + 1.0
    b = torch.cumsum(a, 0)
    c = torch.tanh(torch.sigmoid(b * y) * 3.0 - b) / (b.abs() + 2.0)
    d = torch.cumsum(c, 1)
    return torch.cumsum(torch.sigmoid(d * y) + 1.0, 0)


def test_identical_groups_are_one_task_and_the_largest_starts_first(monkeypatch):
    """A graph's groups go to the compile threads once per distinct graph, the largest first
    (a thread handed a repeat would wait for another thread's kernel); the repeat reuses its
    first's kernel, in the groups' order, on the calling thread."""
    built = []
    _pooled_and_recorded(monkeypatch, "_build", lambda group, options: built.append(
        (threading.current_thread().name, guard._size(group))))
    fn = nncfuse.jit(_repeats)
    x, y = torch.randn(5, 7), torch.randn(5, 7)
    for _ in range(2):
        torch.testing.assert_close(fn(x, y), _repeats(x, y))
    kinds = [n.kind() for n in nncfuse.fusion_groups(fn.graph_for(x, y))]
    assert len(kinds) == 3 and kinds[0] == kinds[2] != kinds[1]
    pooled = [size for name, size in built if name.startswith("nncfuse-compile")]
    assert len(pooled) == 2 and pooled[0] > pooled[1]
    assert [name for name, _ in built if not name.startswith("nncfuse-compile")] == [
        threading.current_thread().name]


def _compile_in_child(queue):
    guard.clear_kernel_cache()
    fn = nncfuse.jit(_three_groups)
    x, y = torch.randn(4, 3), torch.randn(4, 3)
    fn(x, y)
    queue.put(bool(torch.allclose(fn(x, y), _three_groups(x, y))))


def test_a_forked_child_compiles_with_its_own_threads(monkeypatch):
    """After a fork the child has none of the parent's compile threads: it makes its own."""
    import multiprocessing

    monkeypatch.setattr(guard, "COMPILE_THREADS", 2)
    monkeypatch.setattr(policy, "_meta_is_cheap", lambda: False)
    guard.clear_kernel_cache()
    x, y = torch.randn(6, 2), torch.randn(6, 2)
    nncfuse.jit(_three_groups)(x, y)  # the parent's pool exists
    assert guard._pool
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_compile_in_child, args=(queue,))
    child.start()
    child.join(timeout=120)
    if child.is_alive():
        child.kill()
    assert child.exitcode == 0, "the child hung or failed"
    assert queue.get(timeout=5) is True
