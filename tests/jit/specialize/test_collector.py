"""The garbage collector paused while nncfuse traces and compiles (jit/specialize/collector.py)."""

import gc
import threading

import pytest
import torch

import nncfuse
from nncfuse.jit.fuser import guard
from nncfuse.jit.specialize import collector


@pytest.fixture(autouse=True)
def enabled():
    was = gc.isenabled()
    gc.enable()
    yield
    if not was:
        gc.disable()


def test_paused_nests_and_enables_again_when_the_last_leaves():
    with collector.paused():
        assert not gc.isenabled()
        with collector.paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()


def test_a_collector_the_program_disabled_stays_disabled():
    gc.disable()
    with collector.paused():
        pass
    assert not gc.isenabled()


def test_an_error_inside_enables_it_again():
    with pytest.raises(ValueError), collector.paused():
        raise ValueError
    assert gc.isenabled()


def test_threads_pausing_at_once():
    inside, leave = threading.Barrier(3), threading.Event()
    states = []

    def hold():
        with collector.paused():
            inside.wait()
            leave.wait()
        states.append(gc.isenabled())

    threads = [threading.Thread(target=hold) for _ in range(2)]
    for t in threads:
        t.start()
    inside.wait()
    assert not gc.isenabled()
    leave.set()
    for t in threads:
        t.join()
    assert gc.isenabled() and len(states) == 2


def test_kernels_compile_without_collections(monkeypatch):
    seen = []
    compile_all = guard._compile_all

    def spy(*args, **kwargs):
        seen.append(gc.isenabled())
        return compile_all(*args, **kwargs)

    monkeypatch.setattr(guard, "_compile_all", spy)

    def f(x, y):
        return (x * y).sin() + y.exp()

    fused = nncfuse.jit(f)
    x, y = torch.randn(8, 16), torch.randn(8, 16)
    for _ in range(3):
        torch.testing.assert_close(fused(x, y), f(x, y))
    assert seen and not any(seen)
    assert gc.isenabled()


def test_growing_groups_leaves_no_cycles_to_collect():
    """What group surgery drops is freed by reference counting: after a fuser pass, a
    collection finds none of `subgraph._absorb`'s closures (its `lookup` calls itself)."""

    def f(x, y):
        return ((x * y).sin() + y.exp()).relu() * x

    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        fused = nncfuse.jit(f)
        x, y = torch.randn(8, 16), torch.randn(8, 16)
        for _ in range(3):
            torch.testing.assert_close(fused(x, y), f(x, y))
        gc.collect()
        left = [o.__qualname__ for o in gc.garbage if type(o).__name__ == "function"]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    assert nncfuse.fusion_groups(fused.graph_for(x, y))
    assert not [name for name in left if name.startswith("_absorb.")], left
