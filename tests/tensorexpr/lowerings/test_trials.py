"""GEMM and convolution trials kept by what decides them (`lowerings/trials.py`, issue 12)."""

import pytest
import torch
import torch.nn.functional as F

import nncfuse
from nncfuse import TensorExprKernel
from nncfuse.config import Options
from nncfuse.tensorexpr.lowerings import external, trials
from nncfuse.tensorexpr.lowerings.external import ONEDNN_LINEAR_ROWS
from nncfuse.tensorexpr.meta import TensorMeta
from tests.jit.frontend.test_threads import THREADS, _run_threads


def linear_gelu(x, w, b):
    return F.gelu(F.linear(x, w, b))


def conv_add_relu(x, w, b, r):
    return torch.relu(F.conv2d(x, w, b, 1, 1) + r)


def mm_tanh(a, b):
    return torch.tanh(torch.mm(a, b))


def conv_add(x, w, r):
    return torch.add(F.conv2d(x, w, None, 1, 1), r, alpha=1)


def conv_add_float_alpha(x, w, r):
    return torch.add(F.conv2d(x, w, None, 1, 1), r, alpha=1.0)


def linear_args(rows=ONEDNN_LINEAR_ROWS, dtype=torch.float32):
    return torch.randn(rows, 32).to(dtype), torch.randn(16, 32).to(dtype), torch.randn(16).to(dtype)


def conv_args():
    return torch.randn(2, 8, 6, 6), torch.randn(8, 8, 3, 3), torch.randn(8), torch.randn(2, 8, 6, 6)


def subgraph(fn, args):
    """The graph of `fn`'s one fusion group for `args`."""
    fused = nncfuse.jit(fn)
    with torch.no_grad():
        for _ in range(2):
            fused(*args)
        (group,) = nncfuse.fusion_groups(fused.graph_for(*args))
    return group.g("Subgraph")


@pytest.fixture
def counted(monkeypatch):
    """The number of trials run so far (a list of one), the kept outcomes forgotten first."""
    trials.clear()
    runs = [0]
    run = external._trial

    def trial(*args, **kwargs):
        runs[0] += 1
        return run(*args, **kwargs)

    monkeypatch.setattr(external, "_trial", trial)
    yield runs
    trials.clear()


def examples(graph):
    """Random inputs of `graph`'s input types."""
    metas = [TensorMeta.from_type(v.type()) for v in graph.inputs()]
    return [torch.empty_strided(m.sizes, m.strides, dtype=m.dtype).normal_() for m in metas]


def build(graph, use_llvm=True):
    return TensorExprKernel(graph.copy(), Options.from_env(use_llvm=use_llvm))


CASES = [
    (linear_gelu, linear_args()),
    (linear_gelu, linear_args(4)),
    (linear_gelu, linear_args(ONEDNN_LINEAR_ROWS, torch.bfloat16)),
    (conv_add_relu, conv_args()),
    (mm_tanh, (torch.randn(8, 24), torch.randn(24, 8))),
]


@pytest.mark.parametrize("fn, args", CASES, ids=lambda c: getattr(c, "__name__", ""))
def test_a_repeated_gemm_skips_its_trial_and_lowers_to_the_same_ir(fn, args, counted):
    graph = subgraph(fn, args)
    trials.clear()
    counted[0] = 0
    first = build(graph)
    assert counted[0] == 1
    again = build(graph)
    assert counted[0] == 1  # the kept outcome
    assert str(again.stmt) == str(first.stmt)
    assert again.get_code_text() == first.get_code_text()
    inputs = examples(graph)
    with torch.no_grad():
        torch.testing.assert_close(again.run(inputs), first.run(inputs))
    trials.clear()
    assert str(build(graph).stmt) == str(first.stmt)  # as a trial of its own gives
    assert counted[0] == 2


def test_the_interpreter_takes_the_kept_outcome_too(counted):
    graph = subgraph(linear_gelu, linear_args())
    trials.clear()
    counted[0] = 0  # (the jit's own compile of the group ran one, unless a kernel was kept)
    llvm = build(graph)
    interpreted = build(graph, use_llvm=False)
    assert counted[0] == 1 and str(interpreted.stmt) == str(llvm.stmt)


def test_what_the_trial_reads_makes_another_key(counted):
    x, w, b = linear_args()
    runs = []
    for args in [(x, w, b), (x.t().contiguous().t(), w, b),  # another layout: its own trial
                 (x[:, :16].repeat(1, 2), w, b),             # same sizes and strides: kept
                 (x[:8], w, b)]:                             # other sizes
        build(subgraph(linear_gelu, args))
        runs.append(counted[0])
    assert runs == [1, 2, 2, 3]
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1 if threads > 1 else 2)
        build(subgraph(linear_gelu, (x, w, b)))
        assert counted[0] == 4
    finally:
        torch.set_num_threads(threads)


def test_constants_that_compare_equal_are_told_apart(counted):
    x, w, r = torch.randn(2, 8, 6, 6), torch.randn(8, 8, 3, 3), torch.randn(2, 8, 6, 6)
    build(subgraph(conv_add, (x, w, r)))
    build(subgraph(conv_add_float_alpha, (x, w, r)))
    assert counted[0] == 2
    assert trials._constant(1) != trials._constant(1.0) != trials._constant(True)
    assert trials._constant((1, 2)) == trials._constant((1, 2))


class Frozen(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(32, 16)

    def forward(self, x):
        return F.gelu(self.fc(x))


def test_a_constant_weight_has_no_key(counted):
    # A frozen module's weight is a constant: its values decide the trial, so it runs each time.
    module = torch.jit.freeze(torch.jit.script(Frozen().eval()))
    x = torch.randn(ONEDNN_LINEAR_ROWS, 32)
    fused = nncfuse.jit(module)
    with torch.no_grad():
        for _ in range(3):
            got = fused(x)
        torch.testing.assert_close(got, module(x))
        (group,) = nncfuse.fusion_groups(fused.graph_for(x))
    graph = group.g("Subgraph")
    counted[0] = 0
    build(graph)
    build(graph)
    assert counted[0] == 2


def test_threads_lowering_the_same_gemm_get_the_same_ir(counted):
    graph = subgraph(linear_gelu, linear_args())
    trials.clear()
    counted[0] = 0  # (the jit's own compile of the group ran one, unless a kernel was kept)
    texts, errors = [], []

    def lower(seed):
        try:
            for _ in range(3):
                texts.append(str(build(graph, use_llvm=False).stmt))
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    _run_threads(lower)
    assert not errors and len(texts) == 3 * THREADS and len(set(texts)) == 1
    assert 1 <= counted[0] <= THREADS  # at most one trial per thread before one is kept
