"""benchmarks/training.py's check on small models: after one training step, the parameters'
gradients of the nncfuse backend and of nncfuse.jit match eager's, and both fused."""

import sys
from pathlib import Path

import pytest
import torch

import nncfuse

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture(scope="module")
def training():
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import training

        yield training
    finally:
        sys.path.remove(str(BENCHMARKS))


@pytest.fixture(autouse=True)
def _fresh():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize("contender", ["nncfuse-backend", "nncfuse-jit"])
@pytest.mark.parametrize("workload", ["mlp", "block"])
def test_gradients_after_one_step_match_eager(training, workload, contender):
    torch.manual_seed(0)
    model = (training.MLP(16, 32) if workload == "mlp" else training.Block(16, 2)).train()
    inputs = (torch.randn(4, 16),) if workload == "mlp" else (torch.randn(2, 5, 16),)
    want, _, _ = training.gradients_after_one_step("eager", model, inputs)
    got, step, _ = training.gradients_after_one_step(contender, model, inputs)
    assert all(g is not None for g in want)
    assert training.compare_gradients(got, want) is None
    # A gradient off by a little more than the tolerance is caught.
    off = [g * (1 + 10 * training.RTOL) for g in got]
    assert training.compare_gradients(off, want) is not None
    step()  # a second step runs the compiled kernels
    if contender == "nncfuse-backend":
        from nncfuse.jit import fxgraph

        graphs = [g for cg in fxgraph.compiled_graphs()[-2:] for g in cg.graphs()]
        assert all(nncfuse.fusion_groups(g) for g in graphs)


def test_without_dropout_zeroes_every_probability(training):
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Dropout(0.5))
    model[0].attention_dropout = 0.1
    training.without_dropout(model)
    assert model.training and model[1].p == 0.0 and model[0].attention_dropout == 0.0


def test_zero_gradients_where_eager_has_none_match(training):
    want = [torch.ones(3), None]
    assert training.compare_gradients([torch.ones(3), torch.zeros(2)], want) is None
    assert training.compare_gradients([torch.ones(3), torch.ones(2)], want) is not None
    assert training.compare_gradients([None, None], want) is not None


def test_gradients_as_close_to_float64_as_eager_match(training):
    """Where float32 is far off itself, a gradient a few times as far from float64's as
    eager's matches; one off by more does not, nor anything off without float64's to ask."""
    exact = [torch.ones(4, dtype=torch.float64)]
    want = [torch.tensor([1.01, 1.0, 1.0, 1.0])]  # eager's: 1% off
    near = [torch.tensor([1.0, 0.96, 1.0, 1.0])]  # 4% off: 4x eager's distance
    far = [torch.tensor([1.0, 0.5, 1.0, 1.0])]
    assert training.compare_gradients(near, want) is not None
    assert training.compare_gradients(near, want, lambda: exact) is None
    assert training.compare_gradients(far, want, lambda: exact) is not None


def test_training_kernels_times_each_fused_kernel_against_its_aten_ops(training):
    """benchmarks/training_kernels.py: the backward GEMM of the MLP carries the GELU backward
    as its epilogue, and each kernel it times computes what the ATen ops it is timed against
    compute (on the random inputs it times them with)."""
    import training_kernels

    from nncfuse.jit import fxgraph

    torch.manual_seed(0)
    model, inputs = training.MLP(16, 32).train(), (torch.randn(4, 16),)
    fxgraph.clear_compiled_graphs()
    _, step, _ = training.gradients_after_one_step("nncfuse-jit", model, inputs)
    step()
    kinds = {cg.kind: cg for cg in fxgraph.compiled_graphs()}
    backward = [row for g in kinds["backward"].graphs() for row in training_kernels.kernels_of(g)]
    assert any({"mm", "erf", "exp"} <= set(ops) for _, _, _, ops in backward)
    rows = [row for cg in kinds.values() for g in cg.graphs()
            for row in training_kernels.kernels_of(g)]
    assert rows and all(inputs is not None for _, _, inputs, _ in rows)
    for name, kernel, inputs, _ in rows:
        got, want = kernel.call(inputs), kernel.fallback(inputs)
        want = want if isinstance(want, tuple) else (want,)
        assert len(got) == len(want), name
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4, msg=name)
    timed = training_kernels.groups_of(next(iter(kinds["forward"].graphs())))
    assert timed and all(fused > 0 and unfused > 0 for _, fused, unfused, _ in timed)
