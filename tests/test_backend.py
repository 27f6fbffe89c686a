"""torch.compile(backend="nncfuse"): Dynamo's FX graphs (and AOTAutograd's forward and backward)
through nncfuse. torch.compile is slow to start: graphs stay small, Dynamo is reset per test."""

import copy
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
import torch

import nncfuse

ROOT = Path(__file__).resolve().parents[1]
BACKENDS = ["nncfuse", "nncfuse_ts"]


@pytest.fixture(scope="module")
def backend():
    """nncfuse.backend, imported (Dynamo with it) and registered, once for the module."""
    import nncfuse.backend

    return nncfuse.backend


@pytest.fixture(autouse=True)
def _fresh(backend):
    torch._dynamo.reset()
    backend.clear_compiled_graphs()
    yield
    torch._dynamo.reset()


def _groups(graphs):
    """(kind, fusion groups per optimized signature) of each compiled graph."""
    return [(g.kind, [len(nncfuse.fusion_groups(opt)) for opt in g.graphs()]) for g in graphs]


def _run(fn, *args, backend_name="nncfuse", calls=2, **compile_options):
    compiled = torch.compile(fn, backend=backend_name, **compile_options)
    with torch.no_grad():
        results = [compiled(*args) for _ in range(calls)]
        expected = fn(*args)
    for got in results:
        torch.testing.assert_close(got, expected)


def chain(a, b):
    return torch.sigmoid(a * b) + torch.tanh(b) * 2.0


# -- registration ------------------------------------------------------------------------------
def test_the_entry_points_name_the_backends(backend):
    tomllib = pytest.importorskip("tomllib")  # Python 3.11
    table = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]
    assert table["torch_dynamo_backends"] == {
        "nncfuse": "nncfuse.backend:nncfuse", "nncfuse_ts": "nncfuse.backend:nncfuse_ts"}
    from torch._dynamo.backends.registry import lookup_backend

    assert lookup_backend("nncfuse") is backend.nncfuse
    assert lookup_backend("nncfuse_ts") is backend.nncfuse_ts


def test_dynamo_loads_the_entry_point_and_import_nncfuse_does_not_import_dynamo():
    # A fresh process: Dynamo finds the names as entry points (as after `pip install`) and
    # imports nncfuse.backend itself, which then must not register them a second time.
    code = textwrap.dedent("""
        import sys
        import torch
        import nncfuse
        assert "torch._dynamo" not in sys.modules, "import nncfuse imported torch._dynamo"
        assert "nncfuse.backend" not in sys.modules
        from importlib.metadata import EntryPoint
        from torch._dynamo.backends import registry
        registry._lazy_import()
        for name in ("nncfuse", "nncfuse_ts"):
            registry._BACKENDS[name] = EntryPoint(
                name, f"nncfuse.backend:{name}", "torch_dynamo_backends")
        f = torch.compile(lambda x: torch.sigmoid(x) * 2.0 + 1.0, backend="nncfuse")
        x = torch.randn(8)
        with torch.no_grad():
            torch.testing.assert_close(f(x), torch.sigmoid(x) * 2.0 + 1.0)
        import nncfuse.backend
        assert registry.lookup_backend("nncfuse") is nncfuse.backend.nncfuse
        assert registry.lookup_backend("nncfuse_ts") is nncfuse.backend.nncfuse_ts
        print("ok")
    """)
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]


# -- inference ---------------------------------------------------------------------------------
@pytest.mark.parametrize("name", BACKENDS)
def test_an_elementwise_chain_runs_one_kernel(backend, name, monkeypatch, capsys):
    monkeypatch.setenv("NNCFUSE_LOG_LEVEL", ">backend")
    _run(chain, torch.randn(16, 16), torch.randn(16, 16), backend_name=name)
    kind = "inference" if name == "nncfuse" else "dynamo"
    assert _groups(backend.compiled_graphs()) == [(kind, [1])]
    (compiled,) = backend.compiled_graphs()
    assert compiled.reason is None and compiled.policy.compile_failures == []
    log = capsys.readouterr().err
    assert "converted to TorchScript" in log and "1 group(s); 5 of 5 compute nodes fused" in log


@pytest.mark.parametrize("name", BACKENDS)
def test_a_graph_break_gives_two_graphs_both_fused(backend, name):
    class Net(torch.nn.Module):
        def forward(self, x):
            y = torch.sigmoid(x) * 2.0
            torch._dynamo.graph_break()
            return torch.tanh(y) + x

    _run(Net(), torch.randn(4, 8), backend_name=name)
    assert [groups for _, groups in _groups(backend.compiled_graphs())] == [[1], [1]]


def test_ops_without_a_lowering_run_unfused(backend, monkeypatch, capsys):
    monkeypatch.setenv("NNCFUSE_LOG_LEVEL", ">backend")

    def f(x):
        y = torch.cumsum(torch.sigmoid(x) * x, 0)
        return torch.nn.functional.layer_norm(y, (8,)) * 2.0 + 1.0

    _run(f, torch.randn(4, 8))
    assert _groups(backend.compiled_graphs()) == [("inference", [2])]
    log = capsys.readouterr().err
    # layer norm decomposes into reductions and elementwise ops that fuse
    # (jit/specialize/decompose.py)
    assert "no lowering: aten::cumsum" in log and "native_layer_norm" not in log


def test_views_that_are_their_input_fold_away(backend):
    def f(a, b):
        return a.t().t() * b, torch.mm(a, b).t().t(), a.transpose(0, 1).transpose(1, 0)

    a, b = torch.randn(6, 6), torch.randn(6, 6)
    _run(f, a, b)
    (compiled,) = backend.compiled_graphs()
    kinds = [n.kind() for n in compiled.graph.nodes()]
    # the returned transposes of an input stay (a view of the input is what eager returns)
    assert kinds.count("aten::t") == 0 and kinds.count("aten::transpose") == 2


def test_mm_and_elementwise(backend):
    def f(a, b):
        return torch.relu(torch.mm(a, b) + 1.0) * torch.sigmoid(a)

    _run(f, torch.randn(8, 8), torch.randn(8, 8))
    assert _groups(backend.compiled_graphs()) == [("inference", [1])]


def test_convolutions_fuse_with_their_batch_norm_and_activation(backend):
    """AOTAutograd's `aten::convolution` runs inside the group of what follows it, as a
    trace's `_convolution` does: one group per convolution here, none left outside."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
        torch.nn.Conv2d(8, 8, 3, padding=1, groups=8, bias=False), torch.nn.BatchNorm2d(8),
        torch.nn.Hardtanh(0.0, 6.0)).eval()
    x = torch.randn(2, 3, 12, 12)
    x[0, 0, 0, :3] = torch.tensor([float("nan"), float("inf"), -0.0])
    compiled = torch.compile(model, backend="nncfuse")
    with torch.no_grad():
        for _ in range(3):
            torch.testing.assert_close(compiled(x), model(x), equal_nan=True)
    (graph,) = backend.compiled_graphs()
    (optimized,) = graph.graphs()
    groups = nncfuse.fusion_groups(optimized)
    inside = [n.kind() for g in groups for n in g.g("Subgraph").nodes()]
    assert len(groups) == 2 and inside.count("aten::convolution") == 2
    assert not [n for n in optimized.nodes() if n.kind() == "aten::convolution"]


def _varargs(x, *rest):  # TorchScript compiles no varargs
    return x + len(rest)


def test_a_graph_torchscript_cannot_take_runs_as_the_fx_graph(backend):
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    y = graph.call_function(torch.sigmoid, (graph.call_function(_varargs, (x,)),))
    graph.output(graph.call_function(torch.mul, (y, 2.0)))
    gm = torch.fx.GraphModule(torch.nn.Module(), graph)
    x = torch.randn(5)
    compiled = backend.nncfuse_ts(gm, [x])
    torch.testing.assert_close(compiled(x), torch.sigmoid(x) * 2.0)
    assert compiled.program is None and compiled.reason.startswith("not converted to TorchScript")


def test_constants_folded_at_compile_time_are_real_tensors(backend):
    # Backends compile under Dynamo's fake-tensor mode; the causal mask of AOTAutograd's
    # attention folds into a constant, which must not be a fake tensor.
    def attend(q):
        return torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)

    _run(attend, torch.randn(1, 4, 3), calls=3)
    (compiled,) = backend.compiled_graphs()
    assert compiled.reason is None and compiled.program is not None


def test_a_torchscript_run_that_fails_falls_back_to_the_fx_graph(backend):
    gm = torch.fx.symbolic_trace(lambda x: torch.sigmoid(x) * 2.0)
    compiled = backend.nncfuse_ts(gm, [torch.randn(3)])

    def fails(*args):
        raise RuntimeError("a TorchScript failure\nin detail")

    compiled.policy.call = fails
    x = torch.randn(3)
    with pytest.warns(UserWarning, match="nncfuse: graph .* runs unfused from now on: the Tor"):
        torch.testing.assert_close(compiled(x), torch.sigmoid(x) * 2.0)
    assert compiled.program is None
    assert compiled.reason == ("the TorchScript program failed: RuntimeError: "
                               "a TorchScript failure ... in detail")


def test_tensor_constants_read_from_the_graph_module(backend):
    _run(lambda a: a * torch.tensor([1.0, 2.0, 3.0]) + 1.0, torch.randn(4, 3))
    (compiled,) = backend.compiled_graphs()
    assert compiled.program.receiver is not None  # a get_attr: the graph keeps `self`


def _uses(graph):
    """Each node of `graph` but the constants: its kind and inputs (a constant's value, else
    which node's output or which graph input it is); the graph's text up to the order and
    names of its constants."""
    where = {v.unique(): ("input", k) for k, v in enumerate(graph.inputs())}
    uses = []
    for node in graph.nodes():
        if node.kind() == "prim::Constant":
            continue
        uses.append((node.kind(), [repr(v.toIValue()) if v.node().kind() == "prim::Constant"
                                   else where[v.unique()] for v in node.inputs()]))
        where |= {o.unique(): (len(uses), j) for j, o in enumerate(node.outputs())}
    return [*uses, [where[v.unique()] for v in graph.outputs()]]


def test_fx_code_compiles_as_a_function_as_the_module_would(backend, monkeypatch):
    # The graphs' code compiles as a function without `self` (TorchScript's own parser, no
    # attribute types): the same program as scripting the module, which it no longer needs.
    from nncfuse.jit.specialize import fxgraph
    from nncfuse.jit.specialize.policy import program

    converted = []
    convert = fxgraph._convert
    monkeypatch.setattr(fxgraph, "_convert", lambda gm, ex, *w: converted.append((gm, ex)) or
                        convert(gm, ex, *w))
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.LayerNorm(16),
                                torch.nn.Linear(16, 4))
    compiled = torch.compile(model, backend="nncfuse")
    x = torch.randn(5, 8)
    compiled(x).sum().backward()
    assert [g.kind for g in backend.compiled_graphs()] == ["forward", "backward"]
    for (gm, examples), graph in zip(converted, backend.compiled_graphs()):
        fx_graph = fxgraph._scriptable(gm, examples)
        assert fxgraph._compiled_function(fx_graph) is not None
        assert graph.program.receiver is None
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # TorchScript's, on the module's attributes
            scripted = torch.jit.script(fxgraph._module(gm, fx_graph)).graph.copy()
        scripted.eraseInput(0)  # `self`, unused
        assert _uses(graph.program.graph) == _uses(program(scripted, None).graph)


@pytest.mark.parametrize("name", BACKENDS)
def test_dynamic_shapes_from_dynamo(backend, name):
    f = torch.compile(lambda a: torch.sigmoid(a) * a + 1.0, backend=name, dynamic=True)
    for n in (3, 5, 9):
        a = torch.randn(n, 4)
        with torch.no_grad():
            for _ in range(2):
                torch.testing.assert_close(f(a), torch.sigmoid(a) * a + 1.0)
    # One graph, sizes as inputs, fused at every size (through AOTAutograd, whose inputs show
    # Dynamo's symbolic dims, one dynamic plan runs the later sizes without a signature
    # of their own: `fxgraph._last_plan`)
    (compiled,) = backend.compiled_graphs()
    graphs = compiled.graphs()
    assert graphs and all(len(nncfuse.fusion_groups(g)) == 1 for g in graphs)
    assert len(graphs) == (1 if name == "nncfuse" else 3)


# -- training ----------------------------------------------------------------------------------
class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(16, 32)
        self.fc2 = torch.nn.Linear(32, 8)

    def forward(self, x):
        return self.fc2(torch.nn.functional.gelu(self.fc1(x)) * 1.5 + 0.5)


def test_training_an_mlp_matches_eager(backend):
    model = MLP()
    compiled_model = copy.deepcopy(model)
    compiled = torch.compile(compiled_model, backend="nncfuse")
    x = torch.randn(4, 16)
    for _ in range(2):  # profiling, then the kernels
        for m in (model, compiled_model):
            m.zero_grad()
        expected, got = model(x), compiled(x)
        torch.testing.assert_close(got, expected)
        expected.square().sum().backward()
        got.square().sum().backward()
        for p, q in zip(model.parameters(), compiled_model.parameters()):
            torch.testing.assert_close(q.grad, p.grad)
    kinds = _groups(backend.compiled_graphs())
    assert [k for k, _ in kinds] == ["forward", "backward"]
    assert all(groups and min(groups) >= 1 for _, groups in kinds)


def test_gradcheck_through_the_backend(backend):
    def f(a, b):
        return torch.sigmoid(a * b) * torch.tanh(b) + a

    a = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    b = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(torch.compile(f, backend="nncfuse"), (a, b))
    kinds = _groups(backend.compiled_graphs())
    assert [k for k, _ in kinds] == ["forward", "backward"]
    assert all(groups and min(groups) >= 1 for _, groups in kinds)


def _trained_alike(model):
    """Two training steps of `model` and of a torch.compile'd copy, side by side, on a batch of
    4x8: outputs and parameters' gradients equal."""
    compiled_model = copy.deepcopy(model)
    compiled = torch.compile(compiled_model, backend="nncfuse")
    x = torch.randn(4, 8)
    for _ in range(2):
        for m in (model, compiled_model):
            m.zero_grad()
        expected, got = model(x), compiled(x)
        torch.testing.assert_close(got, expected)
        (expected * 3.0).sum().backward()
        (got * 3.0).sum().backward()
        for p, q in zip(model.parameters(), compiled_model.parameters()):
            torch.testing.assert_close(q.grad, p.grad)


def test_training_through_decomposed_ops_matches_eager(backend):
    # relu's and sigmoid's backward, layer norm and its backward decompose into ops that fuse.
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.LayerNorm(16), torch.nn.ReLU(),
                                torch.nn.Linear(16, 8), torch.nn.Sigmoid())
    _trained_alike(model)
    (forward, backward) = backend.compiled_graphs()
    assert backward.reason is None and nncfuse.fusion_groups(backward.graphs()[0])


class Block(torch.nn.Module):
    """Layer norm, softmax, batch norm (running statistics updated), dropout 0, GELU."""

    def __init__(self):
        super().__init__()
        self.norm = torch.nn.LayerNorm(16)
        self.fc = torch.nn.Linear(16, 16)
        self.bn = torch.nn.BatchNorm1d(16)
        self.drop = torch.nn.Dropout(0.0)

    def forward(self, x):
        h = torch.softmax(self.fc(self.norm(x)), -1) * x
        return self.drop(torch.nn.functional.gelu(self.bn(h))) + x


def _step_as_eager(model, compiled_model, compiled, x):
    """One step of `model` and of its copy `compiled_model` (run as `compiled`) on `x`:
    outputs, parameters' gradients and buffers (batch norm's) as eager's."""
    for m in (model, compiled_model):
        m.zero_grad()
    expected, got = model(x), compiled(x)
    torch.testing.assert_close(got, expected)
    (expected * expected.detach()).sum().backward()
    (got * got.detach()).sum().backward()
    for p, q in zip(model.parameters(), compiled_model.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-5)
    for p, q in zip(model.buffers(), compiled_model.buffers()):
        torch.testing.assert_close(q, p)


def test_training_normalizations_and_softmax_decompose_and_fuse(backend):
    model = Block().train()
    compiled_model = copy.deepcopy(model)
    compiled = torch.compile(compiled_model, backend="nncfuse")
    for _ in range(2):
        x = torch.randn(6, 16)
        _step_as_eager(model, compiled_model, compiled, x)
    unfused = {n.kind() for g in backend.compiled_graphs() for opt in g.graphs()
               for n in opt.nodes() if n.kind().startswith("aten::")}
    assert unfused & {"aten::native_layer_norm", "aten::native_layer_norm_backward",
                      "aten::_softmax_backward_data", "aten::native_batch_norm_backward",
                      "aten::_native_batch_norm_legit_functional", "aten::var_mean"} == set()
    assert all(nncfuse.fusion_groups(g.graphs()[0]) for g in backend.compiled_graphs())


def test_a_number_minus_a_tensor_from_a_math_kernel_fuses(backend):
    # SiLU's backward is ATen's math kernel, whose C++ `1 - sigmoid` is empty_like, fill and
    # sub: as rsub it fuses with the sigmoid and the rest of the backward (one group, no fill).
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.SiLU(), torch.nn.Linear(16, 8))
    _trained_alike(model)
    (_, backward) = backend.compiled_graphs()
    assert any(n.target is torch.ops.aten.fill.Scalar for n in backward.gm.graph.nodes)
    kinds = [n.kind() for n in backward.graphs()[0].nodes()]
    assert "aten::fill" not in kinds and "aten::empty_like" not in kinds
    assert len(nncfuse.fusion_groups(backward.graphs()[0])) == 1


@pytest.mark.parametrize("dtype, number, rewritten", [
    (torch.float32, 1, True), (torch.float32, 0.5, True), (torch.float64, 0.1, True),
    (torch.float32, 0.1, False),  # 0.1 rounds in float32: fill's value, not rsub's opmath one
    (torch.float16, 1e-5, False), (torch.int32, 1, False),  # int: rsub of a float promotes
    (torch.float32, float("nan"), False), (torch.float32, True, False)])
def test_number_minus_a_tensor_is_rsub_where_it_is_the_same_tensor(backend, dtype, number,
                                                                    rewritten):
    from nncfuse.jit.specialize import fxgraph

    def f(y):
        filled = torch.ops.aten.fill.Scalar(torch.ops.aten.empty_like.default(y), number)
        return torch.ops.aten.sub.Tensor(filled, y)

    y = torch.arange(6, dtype=dtype).reshape(2, 3)
    gm = torch.fx.experimental.proxy_tensor.make_fx(f)(y)
    graph = fxgraph._scriptable(gm, [y])
    targets = [n.target for n in graph.nodes if n.op == "call_function"]
    assert (targets == [torch.ops.aten.rsub]) is rewritten
    fresh = fxgraph._module(gm, graph)
    assert torch.equal(fresh(y), f(y)) or (not rewritten and f(y).isnan().all())


def test_training_with_dynamic_sizes_converts_the_size_inputs(backend):
    # AOTAutograd's graphs take symbolic sizes as unannotated inputs: they are ints.
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    compiled_model = copy.deepcopy(model)
    compiled = torch.compile(compiled_model, backend="nncfuse", dynamic=True)
    for n in (3, 5):
        x = torch.randn(n, 8)
        for m in (model, compiled_model):
            m.zero_grad()
        expected, got = model(x), compiled(x)
        torch.testing.assert_close(got, expected)
        expected.sum().backward()
        got.sum().backward()
        for p, q in zip(model.parameters(), compiled_model.parameters()):
            torch.testing.assert_close(q.grad, p.grad)
    graphs = backend.compiled_graphs()
    assert [(g.kind, g.reason) for g in graphs] == [("forward", None), ("backward", None)]
    assert any(isinstance(v.type(), torch._C.IntType) for v in graphs[0].graph.inputs())


def test_nncfuse_disable_runs_the_fx_graphs(backend, monkeypatch):
    monkeypatch.setenv("NNCFUSE_DISABLE", "1")
    _run(chain, torch.randn(8), torch.randn(8))
    (compiled,) = backend.compiled_graphs()
    assert compiled.graphs() == []  # no signature was optimized


def test_dynamo_symbolic_sizes_reuse_one_dynamic_kernel(backend, monkeypatch):
    """With dynamic=True Dynamo hands over one graph with SymInt sizes: nncfuse gives it a
    dynamic kernel at once and runs every size with it."""
    from nncfuse.jit.fuser import guard

    compiled = []
    real = guard.TensorExprKernel

    def kernel(*args):
        k = real(*args)
        compiled.append(k.dynamic)
        return k

    monkeypatch.setattr(guard, "TensorExprKernel", kernel)
    guard.clear_kernel_cache()

    def fn(x, b):
        return torch.nn.functional.gelu(x + b) * 2.0 + x.shape[0]

    f = torch.compile(fn, backend="nncfuse", dynamic=True)
    for n in [8, 13, 5, 40, 300, 2]:
        x, b = torch.randn(n, 16), torch.randn(16)
        torch.testing.assert_close(f(x, b), fn(x, b))
    assert compiled == [True]


def _repeat_kv(cache, new, scale):
    """A decode step's key cache grown by one row, repeated for grouped-query attention
    (transformers' `repeat_kv`), read up to its length: sizes computed from the length."""
    k = torch.cat([cache, new], dim=2)
    b, h, n, d = k.shape
    k2 = k[:, :, None, :, :].expand(b, h, 2, n, d).reshape(b, h * 2, n, d)
    return k, k2[:, :, : cache.shape[2] + 1] * scale


def test_sizes_computed_from_a_symbolic_length_fuse(backend):
    """Dynamo's symbolic cache length makes the expand's, the view's and the slice's sizes
    computed values (`sym_size + 1`); where they follow from the input's, they are constants
    to the fuser (`symbolic_sizes.py`), and the repeat fuses into the kernel that grows the
    cache, a dynamic one: one plan serves every length, more lengths than plans may be made."""
    from nncfuse.jit.fuser import runtime
    from nncfuse.jit.specialize.plans import UnfusedPlan

    f = torch.compile(_repeat_kv, backend="nncfuse")  # the length alone becomes symbolic
    with torch.no_grad():
        for n in [5, 6, 9, 9, 17, *range(20, 40)]:
            cache, new = torch.randn(1, 2, n, 8), torch.randn(1, 2, 1, 8)
            scale = torch.randn(8)
            scale[0] = float("-inf")
            got, expected = f(cache, new, scale), _repeat_kv(cache, new, scale)
            for g, e in zip(got, expected):
                torch.testing.assert_close(g, e)
    compiled = backend.compiled_graphs()[-1]  # (the first, for n = 5, is static)
    assert not any(isinstance(p, UnfusedPlan) for p in compiled.policy.plans.values())
    graph = compiled.graphs()[-1]
    assert any(isinstance(v.type(), torch._C.IntType) for v in graph.inputs())
    outside = {n.kind() for n in graph.nodes()}
    assert not {"aten::expand", "aten::clone", "aten::slice", "aten::cat", "aten::view"} & outside
    kernels = [runtime.kernel_of(n) for n in nncfuse.fusion_groups(graph)]
    assert len(kernels) == 1 and kernels[0].dynamic


def test_a_dynamic_plan_runs_new_lengths_without_a_signature(backend, monkeypatch):
    """A graph of Dynamo's symbolic sizes whose plan serves every length checks a call with
    the last call's C++ tensor check, its symbolic dims and their strides left out, and
    the numbers' types: no `signature` per decode step."""
    from nncfuse.jit.specialize import fxgraph

    f = torch.compile(_repeat_kv, backend="nncfuse")
    with torch.no_grad():
        for n in (5, 6, 7, 7):
            f(torch.randn(1, 2, n, 8), torch.randn(1, 2, 1, 8), torch.randn(8))
        signatures = []
        real = fxgraph.signature
        monkeypatch.setattr(fxgraph, "signature", lambda args: signatures.append(1) or real(args))
        for n in (9, 30, 8, 64, 7):
            cache, new, scale = torch.randn(1, 2, n, 8), torch.randn(1, 2, 1, 8), torch.randn(8)
            for g, e in zip(f(cache, new, scale), _repeat_kv(cache, new, scale)):
                torch.testing.assert_close(g, e)
    assert signatures == []


# -- training graphs as one autograd node (autograd.FusedGraph) --------------------------------
def _fused_node(tensor):
    return type(tensor.grad_fn).__name__ == "_FusedBackward"


def test_a_training_graph_runs_as_one_nncfuse_autograd_node(backend):
    model = MLP()
    compiled_model = copy.deepcopy(model)
    compiled = torch.compile(compiled_model, backend="nncfuse")
    x = torch.randn(4, 16, requires_grad=True)
    cx = x.detach().clone().requires_grad_()
    for _ in range(3):
        expected, got = model(x), compiled(cx)
        assert _fused_node(got) and not _fused_node(expected)
        torch.testing.assert_close(got, expected)
        grads = torch.autograd.grad(expected.sin().sum(), [x, *model.parameters()])
        got_grads = torch.autograd.grad(got.sin().sum(), [cx, *compiled_model.parameters()])
        for g, w in zip(got_grads, grads):
            torch.testing.assert_close(g, w)
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        out = compiled(cx).sum()
        out.backward()
        out.backward()
    # A second derivative is eager's (the unfused program differentiated again).
    a = torch.randn(5, dtype=torch.float64, requires_grad=True)
    f = torch.compile(lambda t: torch.sigmoid(t) * t, backend="nncfuse")
    (g,) = torch.autograd.grad(f(a).sum(), a, create_graph=True)
    (gg,) = torch.autograd.grad(g.sum(), a)
    (e,) = torch.autograd.grad(torch.sigmoid(a) * a, a, torch.ones(5, dtype=a.dtype),
                               create_graph=True)
    torch.testing.assert_close(g, e)
    torch.testing.assert_close(gg, torch.autograd.grad(e.sum(), a)[0])


def test_training_graphs_it_cannot_trace_go_through_aotautograd(backend, monkeypatch, capsys):
    # An output that does not require grad, an output that is a view of an input: AOTAutograd's
    # own runtime runs them (the reason logged), with eager's results and gradients.
    def two(a, b):
        return (a * b).sin(), (b > 0).sum()

    def view(a, b):
        return a.t(), (a * b).cos()

    monkeypatch.setenv("NNCFUSE_LOG_LEVEL", "backend")
    for fn in (two, view):
        a = torch.randn(3, 4, requires_grad=True)
        b = torch.randn(3, 4)
        compiled = torch.compile(fn, backend="nncfuse")
        for _ in range(2):
            got, expected = compiled(a, b), fn(a, b)
            assert not _fused_node(got[0]) and not _fused_node(got[1])
            torch.testing.assert_close(got, expected)
            (g,) = torch.autograd.grad(got[0].sum() + got[1].float().sum() * 0, a,
                                       allow_unused=True)
            (w,) = torch.autograd.grad(expected[0].sum(), a)
            torch.testing.assert_close(g, w)
        torch._dynamo.reset()
    assert capsys.readouterr().err.count("through AOTAutograd's runtime") == 2


def test_inference_after_training_and_buffers_written_in_place(backend):
    # Batch norm's running statistics (buffers written in place) through the autograd node;
    # under no_grad Dynamo compiles an inference graph (AOTAutograd's).
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.BatchNorm1d(8), torch.nn.Tanh())
    compiled_model = copy.deepcopy(model)
    compiled = torch.compile(compiled_model, backend="nncfuse")
    for _ in range(2):
        x = torch.randn(5, 8)
        expected, got = model(x), compiled(x)
        assert _fused_node(got)
        torch.testing.assert_close(got, expected)
        expected.sum().backward()
        got.sum().backward()
        for p, q in zip(model.parameters(), compiled_model.parameters()):
            torch.testing.assert_close(q.grad, p.grad)
        for p, q in zip(model.buffers(), compiled_model.buffers()):
            torch.testing.assert_close(q, p)
    with torch.no_grad():
        got = compiled(x)
        torch.testing.assert_close(got, model(x))
    assert got.grad_fn is None
    assert [g.kind for g in backend.compiled_graphs()][-1] == "inference"


def test_a_repeated_signature_takes_its_plan_and_another_layout_its_own(backend):
    # CompiledGraph checks a call against the last signature's tensors (TensorGuards) before
    # building the signature: another layout, dtype, requires_grad or grad mode is another plan.
    from nncfuse.config import Options

    gm = torch.fx.symbolic_trace(lambda a, b: torch.sigmoid(a) * b + a)
    a, b = torch.randn(6, 6), torch.randn(6, 6)
    examples = [a, b]
    graph = backend.CompiledGraph(gm, examples, "inference", Options.from_env())
    calls = [(a, b), (a.t(), b), (a, b), (a.double(), b.double()), (a, b.t()), (a, b),
             (a.clone().requires_grad_(), b), (a.clone(), b)]
    with torch.no_grad():
        for _ in range(3):
            for x, y in calls:
                torch.testing.assert_close(graph(x, y), gm(x, y))
    for x, y in calls[:2]:
        with torch.enable_grad():
            torch.testing.assert_close(graph(x, y), gm(x, y))
    assert len(graph.policy.plans) == 7  # five without grad, two with
    assert graph._last is not None


def test_a_training_graph_with_a_dropout(backend):
    # The fused node's gradient uses the forward's mask; its second derivative (the program
    # run again) would draw another, so it raises, as Inductor's double backward does.
    def fn(x, w):
        return torch.nn.functional.dropout((x * w).sin(), 0.5, training=True)

    compiled = torch.compile(fn, backend="nncfuse")
    x = torch.randn(256, dtype=torch.float64)
    w = torch.randn(256, dtype=torch.float64, requires_grad=True)
    for _ in range(2):
        y = compiled(x, w)
        assert _fused_node(y)
        kept = (y != 0).to(y.dtype)
        assert 0 < kept.mean() < 1
        (g,) = torch.autograd.grad(y.sum(), w, retain_graph=True)
        torch.testing.assert_close(g, kept * 2.0 * x * torch.cos(x * w))
    with pytest.raises(RuntimeError, match="second derivative"):
        torch.autograd.grad(y.sum(), w, create_graph=True)


def test_an_inference_tensor_argument_of_a_training_graph(backend):
    # An inference tensor has no version counter: one the backward does not save is an
    # argument as any other (eager's results, gradients and second derivative); one it saves
    # raises eager's error.
    compiled = torch.compile(lambda x, w: (x + w).sin(), backend="nncfuse")
    w = torch.randn(4, dtype=torch.float64, requires_grad=True)
    for _ in range(2):
        with torch.inference_mode():
            x = torch.randn(4, dtype=torch.float64)
        got = compiled(x, w)
        assert _fused_node(got)
        torch.testing.assert_close(got, (x + w).sin())
        (g,) = torch.autograd.grad(got.sum(), w, create_graph=True)
        torch.testing.assert_close(g, (x + w).cos())
        torch.testing.assert_close(torch.autograd.grad(g.sum(), w)[0], -(x + w).sin())
    saves = torch.compile(lambda x, w: (x * w).sin(), backend="nncfuse")
    with pytest.raises(RuntimeError, match="Inference tensors cannot be saved for backward"):
        (lambda x, w: (x * w).sin())(x, w)
    with pytest.raises(RuntimeError, match="Inference tensors cannot be saved for backward"):
        saves(x, w)


def test_a_second_derivative_through_batch_norms_running_statistics(backend):
    # Buffers the graph writes and no output reads: a second derivative runs the FX graph
    # again on copies of them (eager's values; the buffers stepped once).
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4),
                                torch.nn.Tanh()).double()
    compiled_model = copy.deepcopy(model)
    compiled = torch.compile(compiled_model, backend="nncfuse")
    for _ in range(2):
        x = torch.randn(5, 4, dtype=torch.float64, requires_grad=True)
        cx = x.detach().clone().requires_grad_()
        expected, got = model(x), compiled(cx)
        assert _fused_node(got)
        (w,) = torch.autograd.grad(expected.sin().sum(), x, create_graph=True)
        (g,) = torch.autograd.grad(got.sin().sum(), cx, create_graph=True)
        torch.testing.assert_close(g, w)
        torch.testing.assert_close(
            torch.autograd.grad(g.square().sum(), [cx, *compiled_model.parameters()]),
            torch.autograd.grad(w.square().sum(), [x, *model.parameters()]))
        torch.testing.assert_close(list(compiled_model.buffers()), list(model.buffers()))


# -- training through TorchScript's autodiff (autograd="autodiff") --------------------------------
class Attention(torch.nn.Module):
    """Layer norm, single-head attention (softmax), GELU, residuals: a transformer's block."""

    def __init__(self):
        super().__init__()
        self.norm = torch.nn.LayerNorm(16)
        self.qkv = torch.nn.Linear(16, 48)
        self.out = torch.nn.Linear(16, 16)
        self.fc = torch.nn.Linear(16, 16)

    def forward(self, x):
        q, k, v = self.qkv(self.norm(x)).chunk(3, -1)
        h = x + self.out(torch.softmax(q @ k.transpose(-1, -2) * 0.25, -1) @ v)
        return h + torch.nn.functional.gelu(self.fc(h))


def _autodiff_plans(backend):
    """The autodiff plans of the graphs compiled: every graph one Dynamo graph, no AOT trace."""
    from nncfuse.jit.training.autodiff import AutodiffPlan

    graphs = backend.compiled_graphs()
    assert graphs and all(g.kind == "dynamo" and g.reason is None for g in graphs)
    return [p for g in graphs for p in g.policy.plans.values() if isinstance(p, AutodiffPlan)]


@pytest.mark.parametrize("model", [MLP, Attention, Block], ids=lambda m: m.__name__)
def test_training_through_autodiff_matches_eager_and_fuses(backend, model):
    torch.manual_seed(0)
    model = model().train()
    compiled_model = copy.deepcopy(model)
    compiled = torch.compile(compiled_model, backend=backend.make_backend(autograd="autodiff"))
    for _ in range(3):  # profiling the program, then f and df, then the kernels
        x = torch.randn(6, 16) if isinstance(model, Block) else torch.randn(2, 5, 16)
        _step_as_eager(model, compiled_model, compiled, x)
    (plan,) = _autodiff_plans(backend)
    forward, backward = plan.fused_graphs()
    assert plan.aot.joints() == []  # (not the AOTAutograd plan it falls back to)
    assert sum(len(nncfuse.fusion_groups(g)) for g in forward) >= 1
    assert sum(len(nncfuse.fusion_groups(g)) for g in backward) >= 1


def test_gradcheck_through_the_backend_with_autodiff(backend, monkeypatch):
    monkeypatch.setenv("NNCFUSE_AUTOGRAD", "autodiff")  # (the environment sets the option too)

    def f(a, b):
        return torch.sigmoid(a * b) * torch.tanh(b) + a

    a = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    b = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    compiled = torch.compile(f, backend=backend.make_backend())
    for _ in range(2):  # fused from the third call: gradcheck's
        compiled(a, b).sum().backward()
    assert torch.autograd.gradcheck(compiled, (a, b))
    (plan,) = _autodiff_plans(backend)
    forward, backward = plan.fused_graphs()
    assert [len(nncfuse.fusion_groups(g)) for g in forward] == [1]
    assert all(nncfuse.fusion_groups(g) for g in backward) and backward


def test_a_training_graph_autodiff_cannot_take_goes_through_aotautograd(backend, monkeypatch,
                                                                         capsys):
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    y = graph.call_function(torch.sigmoid, (graph.call_function(_varargs, (x,)),))
    graph.output((graph.call_function(torch.mul, (y, 2.0)),))  # (as Dynamo's: a tuple)
    gm = torch.fx.GraphModule(torch.nn.Module(), graph)
    monkeypatch.setenv("NNCFUSE_LOG_LEVEL", "backend")
    x = torch.randn(5, requires_grad=True)
    compiled = backend.make_backend(autograd="autodiff")(gm, [x])
    assert not isinstance(compiled, backend.CompiledGraph)
    torch.testing.assert_close(compiled(x), (torch.sigmoid(x) * 2.0,))
    (g,) = torch.autograd.grad(compiled(x)[0].sum(), x)
    (w,) = torch.autograd.grad((torch.sigmoid(x) * 2.0).sum(), x)
    torch.testing.assert_close(g, w)
    err = capsys.readouterr().err
    assert "Training graph through AOTAutograd, not autodiff: not converted" in err


def test_sym_sum_of_sizes_converts(backend):
    """Dynamo sums symbolic sizes with `torch.sym_sum` (GPT-2's decode step: the cache
    length `1 + past`); TorchScript has no such op, so it is written as additions, and the
    graph runs through nncfuse, not as the FX graph."""

    def f(x, y):
        n = sum([1, x.shape[0], y.shape[0]])
        return torch.arange(n, dtype=torch.float32) * 2 + 1

    g = torch.compile(f, backend="nncfuse", dynamic=True)
    for k in (3, 5):
        x, y = torch.randn(k), torch.randn(k + 1)
        torch.testing.assert_close(g(x, y), f(x, y))
    graphs = backend.compiled_graphs()
    assert any(torch.sym_sum in (n.target for n in cg.gm.graph.nodes) for cg in graphs)
    assert all(cg.program is not None for cg in graphs), [cg.reason for cg in graphs]
