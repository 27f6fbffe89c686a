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


@pytest.mark.parametrize("contender", ["nncfuse-backend", "nncfuse-jit", "nncfuse-jit-aot"])
@pytest.mark.parametrize("workload", ["mlp", "block"])
def test_gradients_after_one_step_match_eager(training, workload, contender):
    torch.manual_seed(0)
    model = (training.MLP(16, 32) if workload == "mlp" else training.Block(16, 2)).train()
    inputs = (torch.randn(4, 16),) if workload == "mlp" else (torch.randn(2, 5, 16),)
    want, _, _ = training.gradients_after_one_step("eager", model, inputs)
    # (the third step's: nncfuse-jit's first profiles, its second compiles)
    got, step, _ = training.gradients_after_one_step(contender, model, inputs, first_steps=3)
    assert all(g is not None for g in want)
    assert training.compare_gradients(got, want) is None
    # A gradient off by a little more than the tolerance is caught.
    off = [g * (1 + 10 * training.RTOL) for g in got]
    assert training.compare_gradients(off, want) is not None
    step()  # a second step runs the compiled kernels
    if contender == "nncfuse-backend":
        from nncfuse.jit.specialize import fxgraph

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


@pytest.mark.parametrize("contender", ["nncfuse-jit", "nncfuse-jit-aot"])
def test_training_kernels_times_each_fused_kernel_against_its_aten_ops(training, contender):
    """benchmarks/training_kernels.py: the backward GEMM of the MLP carries the GELU backward
    as its epilogue, and each kernel it times computes what the ATen ops it is timed against
    compute (on the random inputs it times them with); both mechanisms' graphs are found."""
    import training_kernels

    torch.manual_seed(0)
    model, inputs = training.MLP(16, 32).train(), (torch.randn(4, 16),)
    _, step, _ = training.gradients_after_one_step(contender, model, inputs)
    step()
    step()
    found = training_kernels.graphs_of(step)
    backward = [row for kind, g in found if kind == "backward"
                for row in training_kernels.kernels_of(g)]
    assert any({"mm", "erf", "exp"} <= set(ops) for _, _, _, ops in backward)
    rows = [row for _, g in found for row in training_kernels.kernels_of(g)]
    assert rows and all(inputs is not None for _, _, inputs, _ in rows)
    for name, kernel, inputs, _ in rows:
        got, want = kernel.call(inputs), kernel.fallback(inputs)
        want = want if isinstance(want, tuple) else (want,)
        assert len(got) == len(want), name
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4, msg=name)
    forward = next(g for kind, g in found if kind == "forward")
    timed = training_kernels.groups_of(forward)
    assert timed and all(fused > 0 and unfused > 0 for _, fused, unfused, _ in timed)


@pytest.mark.parametrize("contender", ["eager", "nncfuse-jit"])
def test_gemm_calls_of_a_step_count_those_inside_nncfuse_kernels(training, contender):
    """training_kernels.py --gemms: the MLP's step makes five GEMMs (two linears forward, three
    products backward: no input gradient), in eager as ATen calls and in nncfuse partly as
    the kernels' external calls; each is recorded with its operands' layouts."""
    import training_kernels

    torch.manual_seed(0)
    model, inputs = training.MLP(16, 32).train(), (torch.randn(4, 16),)
    _, step, _ = training.gradients_after_one_step(contender, model, inputs)
    step()
    recorder = training_kernels._GemmCalls()
    with recorder:
        step()
    assert len(recorder.calls) == 5
    for fn, args, kwargs in recorder.calls:
        assert isinstance(fn(*training_kernels._made(args), **training_kernels._made(kwargs)),
                          torch.Tensor)


def test_step_ops_profile_each_contenders_ops_by_kind(training):
    """training_kernels.py --ops: a step's ops with their calls per step (the MLP's two
    linears forward are addmm in eager), each op of one kind."""
    import training_kernels

    torch.manual_seed(0)
    model, inputs = training.MLP(16, 32).train(), (torch.randn(4, 16),)
    _, step, _ = training.gradients_after_one_step("eager", model, inputs)
    best = training_kernels.step_ops({"eager": step}, rounds=2, per_round=2)["eager"]
    seconds, calls = best["aten::addmm"]
    assert seconds > 0 and calls == 2
    kinds = {training_kernels.kind_of(op) for op in best}
    assert {"GEMMs", "optimizer"} <= kinds
    assert training_kernels.kind_of("nncfuse::fused_mm_view_mul") == "fused kernels"
    assert training_kernels.kind_of("graph_0_cpp_fused_gelu_view_2") == "fused kernels"
    assert training_kernels.kind_of("aten::transpose") == "views, allocation"
    assert training_kernels.kind_of("aten::zeros") == "fills"
