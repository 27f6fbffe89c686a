"""nncfuse.jit under autograd through TorchScript's autodiff (autograd="autodiff",
jit/training/autodiff.py): eager's gradients, with the differentiable graphs' f and df fused."""

import copy
import re

import pytest
import torch

import nncfuse
from nncfuse.config import Options
from nncfuse.jit.training.autodiff import AutodiffPlan
from tests.fused import assert_as_close_as_eager, assert_step_as_eager


def _plan(fused):
    plans = [p for p in fused.policy.plans.values() if isinstance(p, AutodiffPlan)]
    assert len(plans) == 1
    return plans[0]


def _groups(fused):
    """(fusion groups in the f graphs, in the df graphs) of the autodiff plan."""
    entries = [e for outer in _plan(fused).outers() for e in outer.entries]
    assert entries, "no differentiable graph was built"
    count = lambda plans: sum(len(nncfuse.fusion_groups(p.graph)) for p in plans  # noqa: E731
                              if p.graph is not None)
    return (sum(count(e.f.policy.plans.values()) for e in entries),
            sum(count(d.policy.plans.values()) for e in entries for d in e._dfs.values()))


def chain(x, w, b):
    return ((x * w).sin() + b).exp() * 0.5 - w


def mlp(x, w, b):
    return torch.nn.functional.gelu(torch.nn.functional.linear(x, w, b)) * 2.0 + 1.0


def powered(x, w, b):
    """GELU's tanh form written out, as traced models hold it: pow's backward is an `If`."""
    h = torch.nn.functional.linear(x, w, b)
    return h + 0.044715 * torch.pow(h, 3.0)


def layer_norm(x, w, b):
    return torch.nn.functional.layer_norm(x * 2.0 + 1.0, (x.shape[-1],), w, b).tanh()


def softmax(x, w, b):
    return torch.softmax(x * w + b, -1) * 3.0


def attention(x, w, b):
    return torch.matmul(torch.softmax(torch.matmul(x, w.transpose(-1, -2)) * 0.5, -1), w) + b


def _args(fn, dtype=torch.float32):
    torch.manual_seed(0)
    if fn in (mlp, powered):
        shapes = [(4, 6), (5, 6), (5,)]
    elif fn is layer_norm:
        shapes = [(4, 6), (6,), (6,)]
    elif fn is attention:
        shapes = [(2, 3, 4, 6), (2, 3, 5, 6), (6,)]
    else:
        shapes = [(4, 6), (4, 6), (6,)]
    return [torch.randn(*s, dtype=dtype, requires_grad=True) for s in shapes]


PROGRAMS = [chain, mlp, powered, layer_norm, softmax, attention]


def _steps(fused, args, n=3):
    """`n` forward and backward calls: the profiling runs of the program, f and df."""
    for _ in range(n):
        out = fused(*args)
        torch.autograd.grad(out.sum(), args)


@pytest.mark.parametrize("fn", PROGRAMS, ids=lambda f: f.__name__)
def test_gradcheck_float64(fn):
    fused = nncfuse.jit(fn, autograd="autodiff")
    args = _args(fn, torch.float64)
    _steps(fused, args)
    assert torch.autograd.gradcheck(fused, args)
    forward, backward = _groups(fused)
    assert forward >= 1 and backward >= 1


@pytest.mark.parametrize("fn", PROGRAMS, ids=lambda f: f.__name__)
def test_float32_grads_match_eager(fn):
    fused = nncfuse.jit(fn, autograd="autodiff")
    args = _args(fn)
    for _ in range(4):  # profiling and compiled calls alike
        out, ref = fused(*args), fn(*args)
        torch.testing.assert_close(out, ref)
        assert out.grad_fn is not None
        seed = torch.randn_like(ref)
        torch.testing.assert_close(torch.autograd.grad(out, args, seed),
                                   torch.autograd.grad(ref, args, seed))


def test_retain_graph_and_a_second_derivative():
    fused = nncfuse.jit(chain, autograd="autodiff")
    args = _args(chain)
    _steps(fused, args)
    out = fused(*args).sum()
    out.backward(retain_graph=True)
    first = [a.grad.clone() for a in args]
    out.backward()
    torch.testing.assert_close([a.grad for a in args], [2 * g for g in first])
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        out.backward()
    # A second derivative: the graph again, unfused, under eager autograd.
    grads = torch.autograd.grad(fused(*args).sum(), args, create_graph=True)
    want = torch.autograd.grad(chain(*args).sum(), args, create_graph=True)
    torch.testing.assert_close(grads, want)
    assert all(g.grad_fn is not None for g in grads)
    torch.testing.assert_close(torch.autograd.grad(sum(g.sum() for g in grads), args),
                               torch.autograd.grad(sum(w.sum() for w in want), args))


def two(x, y):
    return x.sin() * 2.0 + 1.0, (y * y).exp() + x


def test_unused_output_gives_none_as_eager():
    fused = nncfuse.jit(two, autograd="autodiff")
    x, y = (torch.randn(3, 4, requires_grad=True) for _ in range(2))
    for _ in range(3):
        a, _b = fused(x, y)
        ref, _ = two(x, y)
        got = torch.autograd.grad(a.sum(), (x, y), allow_unused=True)
        want = torch.autograd.grad(ref.sum(), (x, y), allow_unused=True)
        assert got[1] is None and want[1] is None
        torch.testing.assert_close(got[0], want[0])
        both = fused(x, y)
        seeds = [torch.randn(3, 4) for _ in range(2)]
        torch.testing.assert_close(torch.autograd.grad(both, (x, y), seeds),
                                   torch.autograd.grad(two(x, y), (x, y), seeds))


def compared_only(x, y):
    a = x * x
    return a * a, (a - y * 2.0).lt(3)  # (y reaches no differentiable output)


@pytest.mark.parametrize("x_size, y_size", [((3, 4), (3, 4)), ((), (1, 0, 1))],
                         ids=["sized", "empty"])
def test_an_input_that_reaches_no_differentiable_output_has_no_gradient(x_size, y_size):
    """Its gradient in df is an undefined tensor whatever the call (`AutogradZero`), which a
    TorchScript function cannot return to Python: it comes back as None, as eager's."""
    fused = nncfuse.jit(compared_only, autograd="autodiff", min_group_size=1)
    for _ in range(4):
        x = torch.randn(x_size, dtype=torch.float64, requires_grad=True)
        y = torch.randn(y_size, dtype=torch.float64, requires_grad=True)
        (a, b), (ref, want_b) = fused(x, y), compared_only(x, y)
        torch.testing.assert_close(b, want_b)
        got = torch.autograd.grad(a.sum(), (x, y), allow_unused=True)
        want = torch.autograd.grad(ref.sum(), (x, y), allow_unused=True)
        assert got[1] is None and want[1] is None
        torch.testing.assert_close(got[0], want[0])
    assert _groups(fused)[1] > 0  # (the backward ran fused)


def pair(x, y):
    h = (x * y).sin()
    return h * 2.0, (h.exp() + x) * y  # (one differentiable graph, two outputs)


def test_a_df_that_raises_is_not_run_again(monkeypatch):
    """A df specialized to gradients not all given that raises where it runs (ConvNeXt's)
    gives eager's gradients through zeros, and is not tried again at later steps."""
    from nncfuse.jit.training import autodiff

    original, runs = autodiff._Entry.df, []

    def df(self, given, captured, vjps):
        made = original(self, given, captured, vjps)
        if all(given):
            return made

        def raising(*args):
            runs.append(given)
            raise RuntimeError("strides() called on an undefined Tensor")

        raising.constants = made.constants
        return raising

    monkeypatch.setattr(autodiff._Entry, "df", df)
    fused = nncfuse.jit(pair, autograd="autodiff")
    x, y = (torch.randn(3, 4, requires_grad=True) for _ in range(2))
    for _ in range(4):
        a, _b = fused(x, y)
        got = torch.autograd.grad(a.sum(), (x, y), allow_unused=True)
        ref, _ = pair(x, y)
        want = torch.autograd.grad(ref.sum(), (x, y), allow_unused=True)
        torch.testing.assert_close(got, want)
    assert len(runs) == 1  # (the first step's; then the zeros at once)


def test_module_parameters_accumulate():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.LayerNorm(16))
    ref = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.LayerNorm(16))
    ref.load_state_dict(model.state_dict())
    fused = nncfuse.jit(model, autograd="autodiff")
    x = torch.randn(4, 8)
    for _ in range(3):
        model.zero_grad()
        ref.zero_grad()
        fused(x).pow(2).sum().backward()
        ref(x).pow(2).sum().backward()
        for p, q in zip(model.parameters(), ref.parameters()):
            torch.testing.assert_close(p.grad, q.grad)
    assert _plan(fused).outers()


def shapes_only(x):
    return x.t().reshape(-1)[1:]


def test_nothing_differentiable_runs_the_aot_plan():
    fused = nncfuse.jit(shapes_only, autograd="autodiff")
    x = torch.randn(3, 4, requires_grad=True)
    for _ in range(2):
        (g,) = torch.autograd.grad(fused(x).sum(), x)
        torch.testing.assert_close(g, torch.autograd.grad(shapes_only(x).sum(), x)[0])
    assert not _plan(fused).outers()


def with_cls_token(x, c):
    return torch.tanh(torch.cat([c.expand(x.shape[0], 1, 4), x], 1)).sin() * 2


def rotary(x, w):
    h = x.shape[-1] // 2
    return x * w.cos() + torch.cat((-x[..., h:], x[..., :h]), -1) * w.sin()


def stacked(x, w):
    return torch.stack([x.sin() * w, x], 1).tanh() * 2


def shared_list(x, w):
    """One list read by two differentiable graphs and by a cat outside them."""
    parts = [x * 2.0, w]
    return torch.cat(parts, 0).sin() * 3.0, torch.stack(parts, 0).exp() * 2.0, torch.cat(parts, 0)


def unbound(x, w):
    """unbind's list inside the graph, captured by f for cat's backward."""
    return torch.cat((x * w).sin().unbind(0), 0).exp() * 2.0


LISTS = {with_cls_token: [(2, 3, 4), (1, 1, 4)], rotary: [(2, 3, 4), (2, 3, 4)],
         stacked: [(3, 4), (3, 4)], shared_list: [(3, 4), (3, 4)], unbound: [(3, 4), (3, 4)]}


@pytest.mark.parametrize("fn", LISTS, ids=lambda f: f.__name__)
def test_a_list_of_tensors_into_a_differentiable_graph(fn):
    """A list built outside a differentiable graph (ViT's cls token `cat`, Llama's rotary
    halves): the op takes its tensors and f builds the list (`_spread`), so each gets its
    gradient (before: the AOT plan ran; earlier, the gradients were wrong); unbind's list
    captured inside (before: a crash at the second call)."""
    fused = nncfuse.jit(fn, autograd="autodiff")
    torch.manual_seed(0)
    args = [torch.randn(*s, dtype=torch.float64, requires_grad=True) for s in LISTS[fn]]
    for _ in range(3):
        got, want = fused(*args), fn(*args)
        torch.testing.assert_close(got, want)
        got, want = (v if isinstance(v, tuple) else (v,) for v in (got, want))
        seeds = [torch.randn_like(v) for v in want]
        torch.testing.assert_close(torch.autograd.grad(got, args, seeds, retain_graph=True),
                                   torch.autograd.grad(want, args, seeds, retain_graph=True))
        # Only the first output's gradient given (the others' folded as undefined).
        torch.testing.assert_close(torch.autograd.grad(got[0], args, seeds[0]),
                                   torch.autograd.grad(want[0], args, seeds[0]))
    assert _plan(fused).outers()
    assert torch.autograd.gradcheck(fused, args)


def unbound_twice(x, w):
    y = (x * w).sin().unbind(0)
    return torch.stack(y, 0).exp() * 2.0 + y[0]


def appended(x, w, n: int = 2):
    parts = [x * 2.0, w]
    for i in range(n):
        parts.append(x * float(i))
    return torch.cat(parts, 0).sin() * 3.0


@pytest.mark.parametrize("fn", [unbound_twice, appended], ids=lambda f: f.__name__)
def test_a_list_not_built_by_a_list_construct_runs_the_aot_plan(fn):
    """A list that an op made outside (unbind's, read twice) or that the program changes
    (`append` in a loop): its tensors are not known where the graph is built, so no
    gradient could reach them; the AOT plan runs, with eager's gradients."""
    fused = nncfuse.jit(fn, autograd="autodiff")
    args = [torch.randn(3, 4, dtype=torch.float64, requires_grad=True) for _ in range(2)]
    for _ in range(3):
        got = torch.autograd.grad(fused(*args).sum(), args)
        torch.testing.assert_close(got, torch.autograd.grad(fn(*args).sum(), args))
    assert not _plan(fused).outers()
    assert torch.autograd.gradcheck(fused, args)


def test_option(monkeypatch):
    with pytest.raises(ValueError, match="autograd"):
        Options(autograd="nnc")
    monkeypatch.setenv("NNCFUSE_AUTOGRAD", "aot")
    assert Options.from_env().autograd == "aot"
    monkeypatch.delenv("NNCFUSE_AUTOGRAD")
    assert Options.from_env().autograd == "autodiff"
    assert Options().autograd == "autodiff"


def _kinds(fused, df=True):
    """The kinds of the nodes of the df (or f) plans' graphs, fusion groups' subgraphs
    included; a fused op's kind without the `_k<n>` the runtime adds to a name taken by an
    earlier kernel (another test's)."""
    entries = [e for outer in _plan(fused).outers() for e in outer.entries]
    kinds = set()
    fns = [d for e in entries for d in e._dfs.values()] if df else [e.f for e in entries]
    blocks = [p.graph.block() for d in fns for p in d.policy.plans.values()
              if p.graph is not None]
    while blocks:
        for node in blocks.pop().nodes():
            kinds.add(re.sub(r"_k\d+$", "", node.kind()))
            blocks += node.blocks()
            if node.hasAttribute("Subgraph"):
                blocks.append(node.g("Subgraph").block())
    return kinds


def test_linear_weight_gradient_is_an_mm():
    """linear's backward formula writes the weight gradient as a 2-d `matmul` of a
    transposed view: decomposed to `mm` (a GEMM that fuses, or takes oneDNN's routine alone),
    with eager's gradients."""
    fused = nncfuse.jit(mlp, autograd="autodiff")
    args = _args(mlp)
    _steps(fused, args)
    seed = torch.randn(4, 5)
    torch.testing.assert_close(torch.autograd.grad(fused(*args), args, seed),
                               torch.autograd.grad(mlp(*args), args, seed))
    kinds = _kinds(fused)
    assert "aten::mm" in kinds and "aten::matmul" not in kinds


def projection(x, w, b):
    return torch.nn.functional.linear((x * 2.0).sin(), w, b).transpose(0, 1)


def projection_no_bias(x, w, b):
    # (flip, which autodiff has no formula for, keeps the transpose outside the graph)
    return torch.nn.functional.linear((x * 2.0).sin(), w).transpose(0, 1).flip(0) + b


@pytest.mark.parametrize("fn", [projection, projection_no_bias], ids=lambda f: f.__name__)
def test_linear_read_outside_is_a_gemm(fn):
    """A linear whose result f returns (read by views outside, as attention's projections)
    is decomposed to an mm (and the bias's add) on the flattened input, a GEMM kernel
    (oneDNN's routine where it is the faster), where `linear` stayed outside the kernels
    (an addmm too: ATen's, outside every kernel); df's 3-d
    `matmul` (the input's gradient) to an `mm` of the flattened gradient; eager's
    gradients, float64's too."""
    torch.manual_seed(0)
    shapes = [(2, 3, 6), (5, 6), (5,)]
    args = [torch.randn(*s, requires_grad=True) for s in shapes]
    fused = nncfuse.jit(fn, autograd="autodiff")
    for _ in range(4):
        out, ref = fused(*args), fn(*args)
        torch.testing.assert_close(out, ref)
        seed = torch.randn_like(ref)
        torch.testing.assert_close(torch.autograd.grad(out, args, seed),
                                   torch.autograd.grad(ref, args, seed))
    kinds = _kinds(fused, df=False)
    assert "aten::linear" not in kinds and "aten::addmm" not in kinds
    assert "aten::mm" in kinds
    assert "aten::matmul" not in _kinds(fused)  # (the input's gradient: 3-d times 2-d)
    fused = nncfuse.jit(fn, autograd="autodiff")
    args = [a.detach().double().requires_grad_() for a in args]
    _steps(fused, args)
    assert torch.autograd.gradcheck(fused, args)


class Conv1D(torch.nn.Module):
    """transformers' GPT-2 projection: a GEMM of the flattened input, viewed back."""

    def __init__(self, k, n):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(k, n) / k ** 0.5)
        self.bias = torch.nn.Parameter(torch.randn(n))

    def forward(self, x):
        out = torch.addmm(self.bias, x.view(-1, x.size(-1)), self.weight)
        return out.view(x.size()[:-1] + (self.weight.size(-1),))


class Projected(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc, self.proj = Conv1D(6, 8), Conv1D(8, 6)

    def forward(self, x):
        return self.proj(torch.nn.functional.gelu(self.fc(x))) + x


def test_a_gemm_between_views_joins_the_differentiable_graphs():
    """GPT-2's Conv1D (view, addmm, view) is a linear of the unflattened input
    (`flat_linear.py`), so that it joins the graphs around it: no addmm stays outside under
    eager autograd, f fuses it with the GELU, and the weights' gradients come out contiguous
    (a transposed mm's `t` is the mm of the transposed operands), as eager's; eager's
    gradients, float64's by gradcheck."""
    torch.manual_seed(0)
    model, reference = Projected(), Projected()
    reference.load_state_dict(model.state_dict())
    traced = torch.jit.trace(model, (torch.randn(2, 3, 6),))
    fused = nncfuse.jit(traced, autograd="autodiff")
    for _ in range(4):
        x = torch.randn(2, 3, 6, requires_grad=True)
        out, ref = fused(x), reference(x)
        torch.testing.assert_close(out, ref)
        seed = torch.randn_like(ref)
        got = torch.autograd.grad(out, [x, *model.parameters()], seed)
        want = torch.autograd.grad(ref, [x, *reference.parameters()], seed)
        torch.testing.assert_close(got, want)
        assert [g.stride() for g in got] == [w.stride() for w in want]
    outer = _plan(fused).outers()[0].graph
    assert not outer.findAllNodes("aten::addmm")
    assert {"nncfuse::fused_linear_gelu", "nncfuse::fused_linear_add"} <= _kinds(fused, df=False)
    forward, backward = _groups(fused)
    assert forward >= 1 and backward >= 1
    traced = torch.jit.trace(Projected().double(), (torch.randn(2, 3, 6).double(),))
    fused = nncfuse.jit(traced, autograd="autodiff")
    x = torch.randn(2, 3, 6, dtype=torch.float64, requires_grad=True)
    params = list(traced.parameters())
    _steps(fused, [x])
    assert torch.autograd.gradcheck(lambda x, *p: fused(x), [x, *params])


class Normed(torch.nn.Module):
    """A submodule that returns a tuple, as Llama's decoder layer's RMSNorm and residual."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(6))

    def forward(self, x):
        x = x * 2.0
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight, x


class Attended(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = Normed()
        self.q, self.k = torch.nn.Linear(6, 8, bias=False), torch.nn.Linear(6, 8, bias=False)

    def forward(self, x):
        h, residual = self.norm(x)
        q, k = self.q(h).view(2, 3, 2, 4), self.k(h).view(2, 3, 2, 4)
        return (q.transpose(1, 2) * k.transpose(1, 2)).sum() + residual.sum()


def test_a_traced_submodules_tuple_does_not_split_the_graphs():
    """A traced submodule's returned tuple is unpacked at once (`fold_tuples`): the
    projections that read it join a differentiable graph with the norm's last multiply,
    where they stayed outside, under eager autograd (Llama's q, k, v); eager's gradients."""
    torch.manual_seed(0)
    model, reference = Attended(), Attended()
    reference.load_state_dict(model.state_dict())
    fused = nncfuse.jit(torch.jit.trace(model, (torch.randn(2, 3, 6),)), autograd="autodiff")
    for _ in range(4):
        x = torch.randn(2, 3, 6, requires_grad=True)
        out, ref = fused(x), reference(x)
        torch.testing.assert_close(out, ref)
        torch.testing.assert_close(torch.autograd.grad(out, [x, *model.parameters()]),
                                   torch.autograd.grad(ref, [x, *reference.parameters()]))
    outer = _plan(fused).outers()[0].graph
    assert not outer.findAllNodes("aten::linear") and not outer.findAllNodes("prim::TupleUnpack")


class ChannelsLast(torch.nn.Module):
    """ConvNeXt's embeddings' norm (over channels, permuted: a channels-last result) and a
    block: a depthwise convolution, the norm and MLP channels-last, the residual added,
    whose result eager gives channels-last."""

    def __init__(self):
        super().__init__()
        self.stem = torch.nn.LayerNorm(4)
        self.conv = torch.nn.Conv2d(4, 4, 3, padding=1, groups=4)
        self.norm, self.fc = torch.nn.LayerNorm(4), torch.nn.Linear(4, 4)

    def forward(self, x):
        x = self.stem(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
        h = self.fc(self.norm(self.conv(x).permute(0, 2, 3, 1)))
        return x + torch.nn.functional.gelu(h).permute(0, 3, 1, 2)


@pytest.mark.parametrize("then_conv", [False, True])
def test_channels_last_results_keep_eagers_layout(then_conv):
    """f's kernels write their outputs contiguous; where eager's is channels-last (the
    profiled type says), it is given back so, and its gradient too, so that a convolution
    that reads it runs (forward and backward) in eager's layout (ConvNeXt's backward
    convolutions took 3x as long on a contiguous input and a channels-last gradient)."""
    torch.manual_seed(0)
    block = ChannelsLast()
    model = torch.nn.Sequential(block, torch.nn.Conv2d(4, 4, 1)) if then_conv else block
    reference = copy.deepcopy(model)
    wide = copy.deepcopy(model).double()
    fused = nncfuse.jit(torch.jit.trace(model, (torch.randn(2, 4, 5, 5),)), autograd="autodiff")
    for _ in range(4):
        x = torch.randn(2, 4, 5, 5, requires_grad=True)
        out, ref = fused(x), reference(x)
        torch.testing.assert_close(out, ref)
        assert out.stride() == ref.stride()
        seed = torch.randn_like(ref)
        x64 = x.detach().double().requires_grad_()
        assert_as_close_as_eager(
            torch.autograd.grad(out, [x, *model.parameters()], seed),
            torch.autograd.grad(ref, [x, *reference.parameters()], seed),
            torch.autograd.grad(wide(x64), [x64, *wide.parameters()], seed.double()))
    assert _plan(fused).outers()


class BatchNormed(torch.nn.Module):
    """A batch norm between a layer and ReLU6 (MobileNetV2's), then one more on the sum."""

    def __init__(self, first, second, layer):
        super().__init__()
        self.layer, self.first, self.second = layer, first, second

    def forward(self, x):
        y = torch.nn.functional.relu6(self.first(self.layer(x)))
        return torch.nn.functional.silu(self.second(y * 2.0)) + y


NORMS = {  # (first norm, second norm, layer, input shape)
    "affine": (lambda: torch.nn.BatchNorm2d(4), lambda: torch.nn.BatchNorm2d(4),
               lambda: torch.nn.Conv2d(3, 4, 3, padding=1), (3, 3, 5, 5)),
    "no_affine_cumulative": (lambda: torch.nn.BatchNorm2d(4, affine=False),
                             lambda: torch.nn.BatchNorm2d(4, momentum=None),
                             lambda: torch.nn.Conv2d(3, 4, 1), (2, 3, 4, 3)),
    "no_running_stats": (lambda: torch.nn.BatchNorm2d(4, track_running_stats=False),
                         lambda: torch.nn.BatchNorm2d(4),
                         lambda: torch.nn.Conv2d(3, 4, 1), (2, 3, 3, 3)),
    "1d": (lambda: torch.nn.BatchNorm1d(4), lambda: torch.nn.BatchNorm1d(4),
           lambda: torch.nn.Linear(3, 4), (6, 3)),
    "1d_sequence": (lambda: torch.nn.BatchNorm1d(4), lambda: torch.nn.BatchNorm1d(4),
                    lambda: torch.nn.Conv1d(3, 4, 1), (2, 3, 7)),
}


def _normed(name, dtype=torch.float32):
    torch.manual_seed(0)
    first, second, layer, shape = NORMS[name]
    model = BatchNormed(first(), second(), layer()).to(dtype)
    with torch.no_grad():
        for norm in (model.first, model.second):
            if norm.weight is not None:
                norm.weight.uniform_(0.5, 1.5)
                norm.bias.uniform_(-1.0, 1.0)
            if norm.running_var is not None:
                norm.running_var.uniform_(0.5, 2.0)
                norm.running_mean.uniform_(-1.0, 1.0)
    return model, shape


@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("name", list(NORMS))
def test_batch_norms_fuse_with_eagers_results_and_running_statistics(name, training):
    """f's batch norms (the `training` flag folded: the variant's key fixes it) are their
    statistics, normalization and running statistics' updates in f's kernels: eager's
    results, gradients and running statistics, step after step."""
    model, shape = _normed(name)
    model.train(training)
    reference = copy.deepcopy(model)
    fused = nncfuse.jit(torch.jit.script(model), autograd="autodiff")
    for _ in range(4):
        assert_step_as_eager(fused, model, reference, torch.randn(shape) * 3.0 + 1.0)
        torch.testing.assert_close(list(model.buffers()), list(reference.buffers()))
    kinds = _kinds(fused, df=False)
    assert "aten::_batch_norm_impl_index" not in kinds
    assert "aten::rsqrt" in kinds  # (inside a fusion group's subgraph)
    assert _groups(fused)[0] >= 1
    # (training's backward too: its sums and the input's gradient, in df's kernels)
    assert "aten::_batch_norm_impl_index_backward" not in _kinds(fused)


@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
def test_batch_norm_gradcheck_float64(training):
    model, shape = _normed("affine", torch.float64)
    model.train(training)
    fused = nncfuse.jit(torch.jit.script(model), autograd="autodiff")
    x = torch.randn(shape, dtype=torch.float64, requires_grad=True)
    _steps(fused, [x])
    assert "aten::_batch_norm_impl_index" not in _kinds(fused, df=False)
    assert "aten::_batch_norm_impl_index_backward" not in _kinds(fused)
    assert torch.autograd.gradcheck(fused, [x])


def test_a_channels_last_batch_norm_stays_atens():
    """ATen's batch norm of a channels-last tensor is faster than the kernel: kept."""
    model, shape = _normed("affine")
    reference = copy.deepcopy(model)
    fused = nncfuse.jit(torch.jit.script(model), autograd="autodiff")
    for _ in range(3):
        x = torch.randn(shape).contiguous(memory_format=torch.channels_last)
        x, x_ref = x.clone().requires_grad_(), x.clone().requires_grad_()
        out, ref = fused(x), reference(x_ref)
        torch.testing.assert_close(out, ref)
        torch.testing.assert_close(torch.autograd.grad(out.sum(), x),
                                   torch.autograd.grad(ref.sum(), x_ref))
        torch.testing.assert_close(list(model.buffers()), list(reference.buffers()))
    assert "aten::_batch_norm_impl_index" in _kinds(fused, df=False)


class Layers(torch.nn.Module):
    """Layers alike but for their weights, and one of another width."""

    def __init__(self, widths):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(a, b) for a, b in zip(widths, widths[1:]))

    def forward(self, x):
        for layer in self.layers:
            x = torch.nn.functional.gelu(layer(x) * 2.0) + 1.0
            x = x.flip(0).flip(0)  # (no autodiff formula between: a graph per layer)
        return x


def test_layers_alike_share_their_programs():
    """Differentiable graphs of the same text share their f and df programs (profiled and
    optimized once); each layer's gradients are still its own, eager's."""
    torch.manual_seed(0)
    model = Layers([6, 6, 6, 6, 4])
    reference = copy.deepcopy(model)
    fused = nncfuse.jit(torch.jit.script(model), autograd="autodiff")
    for _ in range(4):
        assert_step_as_eager(fused, model, reference, torch.randn(3, 6))
    entries = _plan(fused).outers()[0].entries
    assert len(entries) == 4
    fs = [e.f for e in entries]
    assert fs[0] is fs[1] and fs[1] is fs[2] and fs[3] is not fs[0]
    dfs = [next(iter(e._dfs.values())) for e in entries]
    assert dfs[1] is dfs[2] and dfs[3] is not dfs[1]


def plus_a_sum(x, p):
    return (x * 2.0).sin() + p.sum()  # (add's other operand 0-dim: its size is [])


def test_a_zero_dim_operand_in_a_graph():
    """df's captured sizes become constants; a 0-dim tensor's is the empty list, which
    `insertConstant` cannot type (the backward raised); eager's gradients."""
    args = [torch.randn(3, 6, requires_grad=True), torch.randn(2, requires_grad=True)]
    fused = nncfuse.jit(plus_a_sum, autograd="autodiff")
    for _ in range(4):
        torch.testing.assert_close(torch.autograd.grad(fused(*args).sum(), args),
                                   torch.autograd.grad(plus_a_sum(*args).sum(), args))
    forward, backward = _groups(fused)
    assert forward >= 1 and backward >= 1
