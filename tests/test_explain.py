"""nncfuse.explain and strict fusion on small functions and modules with known unfused nodes."""

import pytest
import torch

import nncfuse
from nncfuse.explain import is_compute, is_external
from nncfuse.jit.fuser import guard


def cumsum_between(a, b):
    x = torch.sigmoid(a) * b
    c = torch.cumsum(x, 0)
    y = torch.mm(c, b)
    return torch.tanh(y) + 1.0 - torch.relu(c)


def lone_relu(a):
    return torch.mm(torch.relu(a), a)


def all_fused(a, b):
    return torch.tanh(torch.mm(a, b)) * 2.0 + b


def categories(report):
    return {(u.kind, u.category) for u in report.unfused}


def test_an_op_without_lowering_between_elementwise_ops():
    a, b = torch.randn(8, 8), torch.randn(8, 8)
    report = nncfuse.explain(cumsum_between, a, b)
    assert categories(report) == {("aten::cumsum", "no lowering")}
    assert [g.ops for g in report.groups] == [
        ("aten::sigmoid", "aten::mul"),
        ("aten::mm", "aten::tanh", "aten::add", "aten::relu", "aten::sub")]
    assert report.groups[0].inputs == ([8, 8], [8, 8])
    assert report.groups[0].outputs == ([8, 8],)
    # the mm runs as an external call inside the second group: it counts as fused
    assert (report.fused_nodes, report.unfused_nodes, report.external_nodes) == (7, 1, 0)
    assert report.external == {}
    assert report.coverage == pytest.approx(7 / 8)
    assert report.top_reasons() == [("no lowering", "aten::cumsum", 1)]
    text = str(report)
    assert "aten::cumsum" in text and "no lowering" in text and "fused_sigmoid_mul" in text


def test_counts_agree_with_the_graph():
    a, b = torch.randn(8, 8), torch.randn(8, 8)
    fused = nncfuse.jit(cumsum_between)
    report = nncfuse.explain(fused, a, b)
    graph = fused.graph_for(a, b)
    groups = nncfuse.fusion_groups(graph)
    assert len(report.groups) == len(groups)
    assert report.fused_nodes == sum(
        1 for g in groups for n in g.g("Subgraph").nodes() if is_compute(n))
    outside = [n for n in graph.nodes() if is_compute(n) and not is_external(n)
               and n.kind() != "prim::If" and not guard.is_fused_op(n)]
    assert report.unfused_nodes == len(outside)


def test_a_lone_op_below_min_group_size():
    a = torch.randn(6, 6)
    report = nncfuse.explain(lone_relu, a)
    assert categories(report) == {("aten::relu", "below min_group_size")}
    assert report.groups == [] and report.coverage == 0.0
    one = nncfuse.explain(nncfuse.jit(lone_relu, min_group_size=1), a)
    assert one.unfused == [] and [g.ops for g in one.groups] == [("aten::relu",)]


@pytest.mark.parametrize("autograd", ["aot", "autodiff"])
def test_an_input_that_requires_grad(autograd):
    def f(a, b):
        return torch.sigmoid(a * b) + b

    # under autograd, the report is of the fused forward graph (AOT's, or autodiff's f inside
    # its node)
    report = nncfuse.explain(nncfuse.jit(f, autograd=autograd),
                             torch.randn(4, requires_grad=True), torch.randn(4))
    assert len(report.groups) == 1 and report.unfused == []
    with torch.no_grad():
        assert nncfuse.explain(f, torch.randn(4, requires_grad=True), torch.randn(4)).unfused == []


def test_reads_of_an_input_mutated_through_a_view_are_an_alias_problem():
    def f(a, b):
        x = a * 2.0
        y = x.sin()
        v = b[1:]
        v.add_(1.0)  # two in-place ops on one view: no write-back (jit/fuser/inplace.py)
        v.mul_(2.0)
        return y * b, x + b

    report = nncfuse.explain(f, torch.randn(6), torch.randn(6))
    assert ("aten::add_", "alias or mutation") in categories(report)
    assert any(c == "alias or mutation" and k != "aten::add_" for k, c in categories(report))


def test_reads_of_a_mutated_input_fuse_with_its_write_back():
    def f(a, b):
        x = a * 2.0
        y = x.sin()
        b.add_(1.0)
        return y * b, x + b

    report = nncfuse.explain(f, torch.randn(6), torch.randn(6))
    assert not any(c == "alias or mutation" for _, c in categories(report)), report


def test_a_group_that_fails_to_compile(monkeypatch):
    from nncfuse.tensorexpr.lowerings import registry as lowerings

    def broken(ctx):
        raise RuntimeError("lowering exploded")

    def seed(a):
        b = torch.conv2d(a, torch.ones(1, 1, 1, 1))
        return torch.mul(torch.sin(torch.mul(b, b)), 3.0)

    lowering = lowerings.REGISTRY["aten::sin"]
    monkeypatch.setitem(lowerings.REGISTRY, "aten::sin", lowering.__class__(
        lowering.kind, broken, lowering.overloads))
    guard.clear_kernel_cache()  # neither reuse a kernel nor leave the failure to other tests
    try:
        report = nncfuse.explain(seed, torch.randn(1, 1, 8, 8))
    finally:
        guard.clear_kernel_cache()
    assert report.groups == []
    assert categories(report) == {(k, "compile failure") for k in ("aten::mul", "aten::sin")}
    assert report.external == {"aten::conv2d": 1}
    assert [str(f) for f in report.compile_failures] == ["RuntimeError: lowering exploded"]
    assert "lowering exploded" in str(report)


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(16, 16)
        self.norm = torch.nn.LayerNorm(16)

    def forward(self, x):
        h = self.linear(x)
        h = torch.nn.functional.gelu(h) * 0.5 + x
        return self.norm(h)


def test_a_traced_module():
    x = torch.randn(2, 4, 16)
    with torch.no_grad():
        traced = torch.jit.trace(Block().eval(), (x,))
        report = nncfuse.explain(traced, x)
    assert report.external == {}  # the linear starts the group, as an external call
    # the residual and the layer norm after it are in the group too
    assert [g.ops for g in report.groups] == [
        ("aten::linear", "aten::gelu", "aten::mul", "aten::add", "aten::layer_norm")]
    assert categories(report) == set()
    assert report.coverage == 1.0


class Branchy(torch.nn.Module):
    def forward(self, x, flag: bool):
        if flag:
            x = torch.exp(x) * 2.0
            x = torch.cumsum(x, 1)
        return x - 1.0


def test_a_script_module_with_blocks():
    module = torch.jit.script(Branchy())
    x = torch.randn(3, 5)
    report = nncfuse.explain(module, x, True)
    assert [g.ops for g in report.groups] == [("aten::exp", "aten::mul")]
    assert categories(report) == {("aten::cumsum", "no lowering"),
                                  ("aten::sub", "below min_group_size")}


def test_strict_fusion_raises_with_the_nodes_left_outside():
    a, b = torch.randn(8, 8), torch.randn(8, 8)
    strict = nncfuse.jit(cumsum_between, strict=True)
    with pytest.raises(nncfuse.StrictFusionError) as info:
        for _ in range(3):  # the profiling call runs; the first optimized one raises
            strict(a, b)
    assert [(u.kind, u.category) for u in info.value.nodes] == [("aten::cumsum", "no lowering")]
    assert "aten::cumsum" in str(info.value)
    with pytest.raises(nncfuse.StrictFusionError):
        strict(a, b)  # every later call with the signature
    # explain still reads a strict function's graph
    assert nncfuse.explain(strict, a, b).unfused_nodes == 1


def test_strict_fusion_passes_when_only_external_ops_stay_outside():
    a, b = torch.randn(8, 8), torch.randn(8, 8)
    strict = nncfuse.jit(all_fused, strict=True)
    for _ in range(3):
        torch.testing.assert_close(strict(a, b), all_fused(a, b))
    assert len(nncfuse.fusion_groups(strict.graph_for(a, b))) == 1


def test_strict_fusion_counts_min_group_size():
    a = torch.randn(6, 6)
    with pytest.raises(nncfuse.StrictFusionError, match="below min_group_size"):
        strict = nncfuse.jit(lone_relu, strict=True)
        for _ in range(3):
            strict(a)
    relaxed = nncfuse.jit(lone_relu, strict=True, min_group_size=1)
    for _ in range(3):
        torch.testing.assert_close(relaxed(a), lone_relu(a))


def test_strict_fusion_from_the_environment(monkeypatch):
    monkeypatch.setenv("NNCFUSE_STRICT", "1")
    assert nncfuse.Options.from_env().strict
    strict = nncfuse.jit(cumsum_between)
    a, b = torch.randn(4, 4), torch.randn(4, 4)
    with pytest.raises(nncfuse.StrictFusionError):
        for _ in range(3):
            strict(a, b)
    # explain turns strict fusion off for the function it makes
    assert nncfuse.explain(cumsum_between, a, b).unfused_nodes == 1
    monkeypatch.setenv("NNCFUSE_STRICT", "0")
    assert not nncfuse.Options.from_env().strict


def test_explain_plugs_into_the_jit_through_its_hooks(monkeypatch):
    from nncfuse.explain import _strict_check, report_for
    from nncfuse.jit.specialize import fxgraph, hooks, policy

    assert _strict_check in hooks.STRICT_CHECKS and report_for in hooks.GRAPH_REPORTS
    assert not hasattr(policy, "strict_check") and not hasattr(fxgraph, "report")
    # the jit calls what is registered, in order: here a check that sees every new plan
    seen = []
    monkeypatch.setattr(hooks.STRICT_CHECKS, "_callbacks", ())  # restored afterwards
    hooks.STRICT_CHECKS.register(lambda plan, failures, options: seen.append(plan) or plan)
    strict = nncfuse.jit(cumsum_between, strict=True)
    a, b = torch.randn(4, 4), torch.randn(4, 4)
    for _ in range(3):  # no StrictFusionError: explain's check is not registered here
        torch.testing.assert_close(strict(a, b), cumsum_between(a, b))
    assert len(seen) == 1


def test_a_transformers_model_end_to_end():
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(
        vocab_size=100, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=32, torchscript=True, return_dict=False)
    torch.manual_seed(0)
    model = transformers.BertModel(config).eval()
    ids = torch.randint(0, 100, (1, 16))
    with torch.no_grad():
        traced = torch.jit.trace(model, (ids,), strict=False)
        report = nncfuse.explain(traced, ids)
        fused = nncfuse.jit(traced)
        expected = model(ids)
        for _ in range(3):
            got = fused(ids)
    # linears start groups where an elementwise op follows them, else stay outside
    assert report.external["aten::linear"] + sum(
        g.ops.count("aten::linear") for g in report.groups) >= 6
    assert report.fused_nodes >= 2 and report.groups
    # the residual adds and the layer norms after them fuse, and so does dropout (eval)
    assert any("aten::layer_norm" in g.ops and "aten::add" in g.ops for g in report.groups)
    assert any("aten::dropout" in g.ops for g in report.groups)
    assert 0.0 < report.coverage < 1.0
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("form", ["script", "trace"])
def test_script_and_traced_functions(form):
    a, b = torch.randn(8, 8), torch.randn(8, 8)
    fn = torch.jit.script(cumsum_between) if form == "script" else torch.jit.trace(
        cumsum_between, (a, b))
    report = nncfuse.explain(fn, a, b)
    assert categories(report) == {("aten::cumsum", "no lowering")}
    assert report.fused_nodes == 7 and report.external == {}  # the mm inside a group


def test_a_disabled_function_reports_why_nothing_fused(monkeypatch):
    monkeypatch.setenv("NNCFUSE_DISABLE", "1")
    report = nncfuse.explain(cumsum_between, torch.randn(4, 4), torch.randn(4, 4))
    assert report.groups == [] and report.graph is None
    assert "disabled" in report.note and "disabled" in str(report)


def test_a_signature_past_max_specializations_is_not_optimized():
    a, b = torch.randn(4, 4), torch.randn(4, 4)
    report = nncfuse.explain(nncfuse.jit(cumsum_between, max_specializations=0), a, b)
    assert report.groups == [] and report.unfused_nodes == 7
    assert {u.category for u in report.unfused} == {"not optimized"}
    assert "max_specializations" in report.note


def test_traced_size_arithmetic_is_bookkeeping():
    def halves(x):
        return torch.sigmoid(x[..., : x.shape[-1] // 2]) * 2.0

    x = torch.randn(4, 8)
    traced = torch.jit.trace(halves, (x,))
    assert "aten::floor_divide" in str(traced.graph)
    report = nncfuse.explain(traced, x)
    # The slice's end (x.shape[-1] // 2 through 0-dim tensors) is a size the group copies in;
    # the arithmetic on 0-dim tensors is not counted.
    assert categories(report) == set()
    assert report.fused_nodes == 3


def only_a_gemm(a, b):
    return torch.mm(a, b)


def test_nothing_to_fuse_says_so():
    report = nncfuse.explain(only_a_gemm, torch.randn(4, 4), torch.randn(4, 4))
    assert report.compute_nodes == 0 and report.external_nodes == 1
    assert "nothing to fuse" in str(report) and "100.0%" not in str(report)
