"""nncfuse.jit under autograd: fused forward and backward graphs with eager's gradients and
grad_fn semantics, through both mechanisms: TorchScript's autodiff (jit/training/autodiff.py, the
default) and AOTAutograd (jit/training/autograd.py). Tests of one mechanism's internals name it."""

import copy
import functools
import warnings

import pytest
import torch

import nncfuse
from nncfuse.jit.training.autodiff import AutodiffPlan
from nncfuse.jit.training.autograd import AutogradPlan

#: the autograd nodes of fused programs (the AOT path's, the autodiff path's)
FUSED_NODES = ("_FusedBackward", "_DifferentiableBackward")


@pytest.fixture(params=["autodiff", "aot"])
def autograd(request):
    """Each mechanism in turn (`nncfuse.jit(fn, autograd=...)`)."""
    return request.param


def _plans(fused):
    return [p for p in fused.policy.plans.values() if isinstance(p, (AutogradPlan, AutodiffPlan))]


def _plan(fused):
    plans = _plans(fused)
    assert len(plans) == 1
    return plans[0]


def _built(plan):
    """The variants traced (AOT) or built (autodiff, and its AOT fallback's) so far."""
    if isinstance(plan, AutodiffPlan):
        return [*plan.outers(), *plan.aot.joints()]
    return plan.joints()


def _warmed(fused, *args):
    """`fused` after two forward and backward calls on `args`: the autodiff path's first call
    of a signature profiles (eager's result and graph), so a gradcheck, which takes one
    output's backward, then checks the fused forward and backward."""
    for _ in range(2):
        out = fused(*args)
        outs = out if isinstance(out, tuple) else (out,)
        torch.autograd.grad(sum(o.sum() for o in outs), [a for a in args if a.requires_grad])
    return fused


def _groups(fused):
    """(fusion groups in the forward graphs, in the backward graphs) of the autograd plan."""
    forward, backward = _plan(fused).fused_graphs()
    assert forward or backward, "nothing was built"
    count = lambda graphs: sum(len(nncfuse.fusion_groups(g)) for g in graphs)  # noqa: E731
    return count(forward), count(backward)


def elementwise(x, y):
    return (x * y + x / (y.abs() + 1.0)) - 2.0 * y


def activation(x, y):
    return torch.nn.functional.gelu(x) * torch.sigmoid(y) + torch.tanh(x) * torch.relu(y) \
        + torch.nn.functional.silu(x * y)


def reduction(x, y):
    return (x * y).sum(1), torch.softmax(x + y, -1) * 3.0, (x.exp() * y).mean(0, keepdim=True)


def views(x, y):
    return (x.t() * y.t()).reshape(-1).sin() + x.transpose(0, 1).expand(2, 6, 4).sum(0).view(-1)


def cat(x, y):
    return torch.cat([x.sin() * y, y.cos(), x + 1.0], 1) * 2.0


FAMILIES = [elementwise, activation, reduction, views, cat]


@pytest.mark.parametrize("fn", FAMILIES, ids=lambda f: f.__name__)
def test_gradcheck_float64(fn, autograd):
    fused = nncfuse.jit(fn, autograd=autograd)
    x = torch.randn(4, 6, dtype=torch.float64, requires_grad=True)
    y = torch.randn(4, 6, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(_warmed(fused, x, y), (x, y))
    forward, backward = _groups(fused)
    assert forward >= 1 and backward >= 1


@pytest.mark.parametrize("fn", FAMILIES, ids=lambda f: f.__name__)
def test_float32_grads_match_eager(fn, autograd):
    fused = nncfuse.jit(fn, autograd=autograd)
    for _ in range(3):  # profiling and compiled calls alike
        x = torch.randn(4, 6, requires_grad=True)
        y = torch.randn(4, 6, requires_grad=True)
        out, ref = fused(x, y), fn(x, y)
        outs, refs = (out, ref) if isinstance(ref, tuple) else ((out,), (ref,))
        torch.testing.assert_close(outs, refs)
        assert all(o.grad_fn is not None for o in outs)
        seeds = [torch.randn_like(r) for r in refs]
        got = torch.autograd.grad(outs, (x, y), seeds)
        want = torch.autograd.grad(refs, (x, y), seeds)
        torch.testing.assert_close(got, want)


def test_backward_accumulates_and_retain_graph(autograd):
    fused = nncfuse.jit(activation, autograd=autograd)
    x = torch.randn(5, 3, requires_grad=True)
    y = torch.randn(5, 3, requires_grad=True)
    fused(x, y)
    out = fused(x, y).sum()
    out.backward(retain_graph=True)
    out.backward()
    x2, y2 = x.detach().requires_grad_(), y.detach().requires_grad_()
    ref = activation(x2, y2).sum()
    ref.backward(retain_graph=True)
    ref.backward()
    torch.testing.assert_close((x.grad, y.grad), (x2.grad, y2.grad))
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        out.backward()


@pytest.mark.parametrize("fn", FAMILIES, ids=lambda f: f.__name__)
def test_higher_order_grad_is_eagers(fn, autograd):
    # (create_graph=True: the program again, unfused, under eager autograd)
    fused = nncfuse.jit(fn, autograd=autograd)
    x = torch.randn(4, 6, dtype=torch.float64, requires_grad=True)
    y = torch.randn(4, 6, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradgradcheck(_warmed(fused, x, y), (x, y))


def test_a_second_derivative_of_inputs_computed_from_one_another(autograd):
    # The gradient of x is the program's own, not also through y = f(x) (the program again
    # took x's gradient through both: twice the path through y).
    fused = nncfuse.jit(activation, autograd=autograd)
    for _ in range(3):
        x = torch.randn(4, 6, dtype=torch.float64, requires_grad=True)
        (g,) = torch.autograd.grad(fused(x, x.sin() * 2.0).sum(), x, create_graph=True)
        (w,) = torch.autograd.grad(activation(x, x.sin() * 2.0).sum(), x, create_graph=True)
        torch.testing.assert_close(g, w)
        torch.testing.assert_close(torch.autograd.grad(g.square().sum(), x),
                                   torch.autograd.grad(w.square().sum(), x))


def test_inputs_that_do_not_require_grad_and_no_grad_mode(autograd):
    fused = nncfuse.jit(elementwise, autograd=autograd)
    x = torch.randn(4, 4, requires_grad=True)
    y = torch.randn(4, 4)
    for _ in range(2):
        (gx,) = torch.autograd.grad(fused(x, y).sum(), x)
    torch.testing.assert_close(gx, torch.autograd.grad(elementwise(x, y).sum(), x)[0])
    with torch.no_grad():
        out = fused(x, y)
    assert not out.requires_grad
    torch.testing.assert_close(out, elementwise(x, y).detach())


def test_number_arguments_are_traced_per_value(autograd):
    @functools.partial(nncfuse.jit, autograd=autograd)
    def scaled(x, alpha: float):
        return torch.sigmoid(x * alpha)

    x = torch.randn(6, requires_grad=True)
    for alpha in (0.5, 2.0, 0.5):
        (got,) = torch.autograd.grad(scaled(x, alpha).sum(), x)
        (want,) = torch.autograd.grad(torch.sigmoid(x * alpha).sum(), x)
        torch.testing.assert_close(got, want)
    assert len(_built(_plan(scaled))) == 2


def test_module_parameters_get_gradients(autograd):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4),
                                torch.nn.Tanh())
    reference = [p.detach().clone().requires_grad_() for p in model.parameters()]
    fused = nncfuse.jit(model, autograd=autograd)
    x = torch.randn(5, 8)
    for _ in range(2):
        model.zero_grad()
        fused(x).square().sum().backward()
    grads = [p.grad for p in model.parameters()]
    w1, b1, w2, b2 = reference
    h = torch.nn.functional.gelu(x @ w1.t() + b1)
    torch.tanh(h @ w2.t() + b2).square().sum().backward()
    torch.testing.assert_close(grads, [p.grad for p in reference])
    forward, backward = _groups(fused)
    assert forward >= 1 and backward >= 1


def test_untraceable_programs_run_unfused(autograd):
    @functools.partial(nncfuse.jit, autograd=autograd)
    def returns_view(x):
        return x.view(-1)

    @functools.partial(nncfuse.jit, autograd=autograd)
    def branches(x):
        if bool(x.sum() > 0):
            return x.sin()
        return x.cos()

    x = torch.randn(3, 2, requires_grad=True)
    for _ in range(2):
        out = returns_view(x)
        assert out._base is x
        (g,) = torch.autograd.grad(out.sum(), x)
        torch.testing.assert_close(g, torch.ones_like(x))
        for sign in (1.0, -1.0):
            xs = (x.abs() * sign).detach().requires_grad_()
            (g,) = torch.autograd.grad(branches(xs).sum(), xs)
            torch.testing.assert_close(g, xs.cos() if sign > 0 else -xs.sin())
    assert _built(_plan(returns_view)) == [] and _built(_plan(branches)) == []


def test_saved_input_modified_in_place_raises_as_eager(autograd):
    @functools.partial(nncfuse.jit, autograd=autograd)
    def fused(x, y):
        return x * y

    x = torch.randn(4, requires_grad=True)
    y = torch.randn(4)
    fused(x, y)
    out = fused(x, y)
    y.add_(1.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.sum().backward()


def _steps_as_eager(fused, model, reference, make_input):
    """Three steps of `fused` (running `model`) and of `reference`: the same outputs,
    parameters' gradients and buffers."""
    for _ in range(3):
        x = make_input()
        for m in (model, reference):
            m.zero_grad()
        got, want = fused(x), reference(x)
        torch.testing.assert_close(got, want)
        got.square().sum().backward()
        want.square().sum().backward()
        for p, q in zip(model.parameters(), reference.parameters()):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(list(model.buffers()), list(reference.buffers()))


class Norms(torch.nn.Module):
    def __init__(self, batch_norm):
        super().__init__()
        self.norm = torch.nn.LayerNorm(12)
        self.fc = torch.nn.Linear(12, 12)
        self.bn = torch.nn.BatchNorm1d(12) if batch_norm else torch.nn.Identity()

    def forward(self, x):
        h = torch.softmax(self.fc(self.norm(x)), -1) * x
        return torch.nn.functional.gelu(self.bn(h)) + x


@pytest.mark.parametrize("batch_norm", [False, True])
def test_a_block_with_norms_trains_as_eager(batch_norm, autograd):
    """Layer norm and softmax decompose and fuse; batch norm in training writes its running
    statistics (inputs written in place): traced on copies whose new values are written back,
    so the buffers step as eager's."""
    model = Norms(batch_norm).train()
    reference = Norms(batch_norm).train()
    reference.load_state_dict(model.state_dict())
    fused = nncfuse.jit(model, autograd=autograd)
    _steps_as_eager(fused, model, reference, lambda: torch.randn(5, 12))
    forward, backward = _groups(fused)
    assert forward >= 1 and backward >= 1
    if batch_norm and autograd == "aot":
        assert all(j.written for j in _plan(fused).joints())


def test_an_output_the_loss_does_not_use_gives_no_gradient(autograd):
    @functools.partial(nncfuse.jit, autograd=autograd)
    def two(x, y, z):
        return (x * y).sigmoid(), (y * z).tanh()

    x, y, z = (torch.randn(4, requires_grad=True) for _ in range(3))
    for _ in range(2):
        for t in (x, y, z):
            t.grad = None
        first, _ = two(x, y, z)
        first.sum().backward()
        assert z.grad is None and x.grad is not None and y.grad is not None
    (want,) = torch.autograd.grad((x * y).sigmoid().sum(), y)
    torch.testing.assert_close(y.grad, want)


class TracedConstants(torch.nn.Module):
    """What traced transformers hold: Python numbers and sizes as tensors (wrapped-number
    constants, `prim::NumToTensor`), a `torch.tensor(1.0)` constant, and a last `view` of an
    intermediate as the output."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x, mask):
        h = self.fc(x)
        h = 0.5 * h * (1.0 + torch.tanh(0.7978845608 * (h + 0.044715 * torch.pow(h, 3.0))))
        inverted = torch.tensor(1.0) - mask
        h = h.masked_fill(inverted.to(torch.bool), -3.0) * (x.size(-1) ** -0.5)
        start = 0
        h = h + torch.arange(start, start + x.size(0))[:, None].float()  # a size, a number
        return h.view(-1, 2, 4)


def test_traced_constants_and_a_returned_view_fuse_with_eagers_grads(autograd):
    torch.manual_seed(0)
    model = TracedConstants()
    reference = TracedConstants()
    reference.load_state_dict(model.state_dict())
    x, mask = torch.randn(6, 8), (torch.rand(6, 8) > 0.3).float()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the tracer's note on torch.tensor
        traced = torch.jit.trace(model, (x, mask))
    constants = [n for n in traced.graph.findAllNodes("prim::Constant")
                 if isinstance(n.output().type(), torch._C.TensorType)]
    assert len(constants) >= 3  # the test still holds what it is about
    fused = nncfuse.jit(traced, autograd=autograd)
    for _ in range(2):
        model.zero_grad()
        reference.zero_grad()
        x = torch.randn(6, 8)
        got, want = fused(x, mask), reference(x, mask)
        torch.testing.assert_close(got, want)
        got.square().sum().backward()
        want.square().sum().backward()
        for p, q in zip(model.parameters(), reference.parameters()):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5)
    forward, backward = _groups(fused)
    assert forward >= 1 and backward >= 1


def test_a_traced_function_with_constants_fuses(autograd):
    def fn(x):
        return (x * 0.25 + torch.tensor(2.0)).sigmoid()

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fused = nncfuse.jit(torch.jit.trace(fn, (torch.randn(5),)), autograd=autograd)
    x = torch.randn(5, dtype=torch.float64, requires_grad=True)
    x32 = torch.randn(5, requires_grad=True)
    for _ in range(2):
        (g,) = torch.autograd.grad(fused(x32).sum(), x32)
        (want,) = torch.autograd.grad(fn(x32).sum(), x32)
        torch.testing.assert_close(g, want)
    assert torch.autograd.gradcheck(_warmed(fused, x), (x,))
    plans = _plans(fused)
    assert len(plans) == 2 and all(_built(p) for p in plans)  # float32 and float64


def test_signatures_under_autograd_are_bounded(autograd):
    """Each new size traces and compiles anew under autograd: at most max_specializations
    plans are made; later sizes run unfused, with eager's gradients still."""
    def f(x, w):
        return (torch.tanh(x * w) + x).sum()

    g = nncfuse.jit(f, max_specializations=3, autograd=autograd)
    w = torch.randn(8, requires_grad=True)
    for n in range(1, 7):
        x = torch.randn(n, 8, requires_grad=True)
        got = torch.autograd.grad(g(x, w), (x, w))
        want = torch.autograd.grad(f(x, w), (x, w))
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b)
    assert len(_plans(g)) == 3


class ConvBn(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, bias=False)  # a bias before batch norm: no grad
        self.bn = torch.nn.BatchNorm2d(4)

    def forward(self, x):
        return torch.nn.functional.hardtanh(self.bn(self.conv(x)), 0.0, 6.0)


def test_a_traced_batch_norm_keeps_its_fused_forward():
    """A traced BatchNorm writes `num_batches_tracked.add_(1)`, the 1 a wrapped-number
    constant: rewritten to add_.Scalar (not lifted to an input, which the interpreter would
    hand the kernels as a Python int: the program failed at its second call and the forward
    ran as the FX graph from then on)."""
    torch.manual_seed(0)
    model, reference = ConvBn().train(), ConvBn().train()
    x = torch.randn(2, 3, 8, 8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fused = nncfuse.jit(torch.jit.trace(model, (x,)), autograd="aot")
    reference.load_state_dict(model.state_dict())  # the trace's call stepped the buffers
    _steps_as_eager(fused, model, reference, lambda: torch.randn(2, 3, 8, 8))
    (joint,) = _plan(fused).joints()
    assert joint.written
    assert joint.forward.program is not None, joint.forward.reason
    assert joint.backward.program is not None, joint.backward.reason


class ConvBnFlat(ConvBn):
    def forward(self, x):
        y = torch.nn.functional.hardtanh(self.bn(self.conv(x)), 0.0, 6.0)
        return y.view(2, -1)  # a view of an intermediate, as MobileNetV2's last


def _counted_traces(monkeypatch):
    """A list that gets an entry for each AOTAutograd trace made from now on."""
    import torch._functorch.aot_autograd as aot

    traces = []
    export = aot.aot_export_joint_simple

    def counted(*args, **kwargs):
        traces.append(1)
        return export(*args, **kwargs)

    monkeypatch.setattr(aot, "aot_export_joint_simple", counted)
    return traces


def test_buffers_written_and_a_view_returned_trace_once(monkeypatch):
    """The view of an intermediate is copied from the first trace on, and so is every input
    that does not require grad; the copies of those the program does not write (the image)
    are dropped, the written buffers' kept. Before, the input mutations error told the
    written ones after a full trace, and a second trace took them (2.6 s of MobileNetV2's
    first step)."""
    traces = _counted_traces(monkeypatch)
    torch.manual_seed(0)
    model, reference = ConvBnFlat().train(), ConvBnFlat().train()
    reference.load_state_dict(model.state_dict())
    fused = nncfuse.jit(model, autograd="aot")
    _steps_as_eager(fused, model, reference, lambda: torch.randn(2, 3, 8, 8))
    (joint,) = _plan(fused).joints()
    assert len(joint.written) == len(list(model.buffers()))  # running mean, var, count
    assert len(traces) == 1
    graph = joint.forward.gm.graph
    placeholders = graph.find_nodes(op="placeholder")
    copied = {n.args[0] for n in graph.find_nodes(op="call_function",
                                                  target=torch.ops.aten.clone.default)}
    assert copied & set(placeholders) == {placeholders[k] for k in joint.written}


def test_a_returned_view_of_an_intermediate_is_traced_once(monkeypatch):
    """AOTAutograd refuses an output that views an intermediate only after a full trace
    (GPT-2's last `view`): the first trace already returns it as a copy. A view of an
    input is still refused (unfused), as the copy would be told apart."""
    traces = _counted_traces(monkeypatch)

    @functools.partial(nncfuse.jit, autograd="aot")
    def flat(x, w):
        return torch.tanh(x * w).view(-1)

    x, w = torch.randn(4, 5, dtype=torch.float64), torch.randn(5, dtype=torch.float64,
                                                              requires_grad=True)
    out = flat(x, w)
    out.sum().backward()
    assert len(traces) == 1 and len(_plan(flat).joints()) == 1
    assert torch.autograd.gradcheck(flat, (x, w))


@pytest.mark.parametrize("dim", [None, 1, [0, 1]])
@pytest.mark.parametrize("keepdim", [False, True])
def test_var_mean_decomposition_keeps_eagers_shapes(dim, keepdim):
    from nncfuse.jit.specialize.decompose import _var_mean

    x = torch.randn(3, 4)
    got = _var_mean(x, dim, correction=1, keepdim=keepdim)
    want = torch.var_mean(x, dim, correction=1, keepdim=keepdim)
    for g, w in zip(got, want):
        assert g.shape == w.shape
        torch.testing.assert_close(g, w)


def _top_level_kinds(graphs):
    """The kinds of the ops of `graphs` outside fusion groups (top level: the groups' fallback
    branches do not run)."""
    return {n.kind() for g in graphs for n in g.nodes()}


def test_a_relus_backward_mask_fuses():
    """The backward of a ReLU here is `(out > 0)` cast to float (`_to_copy` with dtype, layout
    and device): the cast takes its dtype alone (`fxgraph._dtype_only`), which fuses, not two
    ops left outside the backward's groups; the gradients are eager's."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(inplace=True),
                                torch.nn.Linear(16, 4))
    reference = [p.detach().clone().requires_grad_() for p in model.parameters()]
    fused = nncfuse.jit(torch.jit.script(model), autograd="aot")
    x = torch.randn(5, 8)
    for _ in range(3):
        model.zero_grad()
        fused(x).square().sum().backward()
    w1, b1, w2, b2 = reference
    (torch.relu(x @ w1.t() + b1) @ w2.t() + b2).square().sum().backward()
    torch.testing.assert_close([p.grad for p in model.parameters()],
                               [p.grad for p in reference])
    joint = _plan(fused).joints()[0]
    casts = joint.backward.gm.graph.find_nodes(op="call_function",
                                               target=torch.ops.aten._to_copy.default)
    assert casts and all("layout" in c.kwargs for c in casts)  # the test's premise
    outside = _top_level_kinds(joint.backward.graphs())
    assert not outside & {"aten::gt", "aten::_to_copy", "aten::to"}, outside


class Dropouts(torch.nn.Module):
    """A traced model in training mode with dropout 0, as training.py's transformers are: its
    graph holds `aten::dropout(x, 0., True)` (and one with train=False), which eager returns
    as its input itself; the last writes into what the dropout returned, so into `h`."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)
        self.drop = torch.nn.Dropout(0.0)

    def forward(self, x):
        h = torch.nn.functional.gelu(self.fc(x))
        y = self.drop(h) * 2.0 + torch.nn.functional.dropout(h, 0.3, training=False)
        z = torch.nn.functional.dropout(h * 3.0, 0.0, training=True)
        z.add_(1.0)
        return y * z


def test_dropout_masks_are_eagers_after_a_dropout_of_zero():
    """A module's Dropout(0.0) in training mode draws no numbers in eager, so the masks of
    the dropouts after it are the ones eager draws under the same seed. Its p is a module
    attribute, an input of the variant: a p of 0 is a constant there and the dropout goes
    (`dropouts.py`); autodiff's formula drew a number per element for it. (Under
    autograd="aot" the masks are AOTAutograd's, as torch.compile's: not eager's.)"""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.LayerNorm(8),
                                torch.nn.Dropout(0.0), torch.nn.Dropout(0.5)).train()
    eager = copy.deepcopy(model)
    fused = nncfuse.jit(model)  # (autograd="autodiff")
    x = torch.randn(4, 8)
    for step in range(5):
        torch.manual_seed(step)
        got = fused(x)
        torch.manual_seed(step)
        want = eager(x)
        torch.testing.assert_close(got, want)
        got.sum().backward()
        want.sum().backward()
    for p, q in zip(model.parameters(), eager.parameters()):
        torch.testing.assert_close(p.grad, q.grad)


def _kinds(gm):
    return {str(n.target) for n in gm.graph.nodes if n.op == "call_function"}


def test_dropouts_that_return_their_input_leave_no_mask():
    from nncfuse.jit.training.dropouts import plain_dropouts

    torch.manual_seed(0)
    model = Dropouts().train()
    reference = Dropouts().train()
    reference.load_state_dict(model.state_dict())
    x = torch.randn(6, 8)
    traced = torch.jit.trace(model, (x,))
    graph = traced.inlined_graph
    assert len(graph.findAllNodes("aten::dropout")) == 3  # the test's premise
    assert plain_dropouts(graph) == 3 and not graph.findAllNodes("aten::dropout")
    fused = nncfuse.jit(traced, autograd="aot")
    for _ in range(3):
        model.zero_grad()
        reference.zero_grad()
        x = torch.randn(6, 8)
        x[0, :3] = torch.tensor([float("nan"), -0.0, float("inf")])
        got, want = fused(x), reference(x)
        torch.testing.assert_close(got, want, equal_nan=True)
        (got.nan_to_num() * torch.randn(6, 8, generator=torch.Generator().manual_seed(1))
         ).sum().backward()
        (want.nan_to_num() * torch.randn(6, 8, generator=torch.Generator().manual_seed(1))
         ).sum().backward()
        for p, q in zip(model.parameters(), reference.parameters()):
            torch.testing.assert_close(p.grad, q.grad, equal_nan=True)
    joint = _plan(fused).joints()[0]
    kinds = _kinds(joint.forward.gm) | _kinds(joint.backward.gm)
    assert not {k for k in kinds if "dropout" in k or "ones_like" in k}, kinds


def test_a_dropout_that_may_drop_is_kept():
    from nncfuse.jit.training.dropouts import plain_dropouts

    def fn(x):
        return torch.nn.functional.dropout(x, 0.5, training=True) + 1.0

    graph = torch.jit.trace(fn, (torch.randn(4),), check_trace=False).graph.copy()
    assert plain_dropouts(graph) == 0 and len(graph.findAllNodes("aten::dropout")) == 1


def test_a_dropout_fuses_and_its_second_derivative_raises(autograd):
    # The first-order gradient uses the forward's mask; a second derivative would run the
    # program again (eager autograd), drawing another mask: it raises instead, as
    # torch.compile raises for double backward (a wrong gradient before).
    def fn(x, w):
        return torch.nn.functional.dropout((x * w).sin(), 0.5, training=True)

    fused = nncfuse.jit(fn, autograd=autograd)
    x = torch.randn(256, dtype=torch.float64)
    w = torch.randn(256, dtype=torch.float64, requires_grad=True)
    for _ in range(3):
        y = fused(x, w)
        kept = (y != 0).to(y.dtype)
        assert 0 < kept.mean() < 1
        (g,) = torch.autograd.grad(y.sum(), w, retain_graph=True)
        torch.testing.assert_close(g, kept * 2.0 * x * torch.cos(x * w))
    assert type(y.grad_fn).__name__ in FUSED_NODES
    with pytest.raises(RuntimeError, match="second derivative"):
        torch.autograd.grad(y.sum(), w, create_graph=True)


def test_a_second_derivative_through_buffers_written_in_place(autograd):
    # Batch norm's running statistics, which the program writes and no output reads: the
    # second derivative runs the program again (on copies of them), as eager's; an input that
    # is written and then read gets its fused forward no more (the program again would read
    # what it wrote): it runs unfused.
    torch.manual_seed(0)
    model = Norms(True).double().train()
    reference = Norms(True).double().train()
    reference.load_state_dict(model.state_dict())
    fused = nncfuse.jit(model, autograd=autograd)
    for _ in range(3):
        x = torch.randn(5, 12, dtype=torch.float64, requires_grad=True)
        y = x.detach().clone().requires_grad_()
        got, want = fused(y), reference(x)
        if autograd == "aot":  # (the autodiff path ends in the interpreter's `add`)
            assert type(got.grad_fn).__name__ == "_FusedBackward"
        (g,) = torch.autograd.grad(got.sin().sum(), y, create_graph=True)
        (w,) = torch.autograd.grad(want.sin().sum(), x, create_graph=True)
        torch.testing.assert_close(g, w)
        gg = torch.autograd.grad(g.square().sum(), [y, *model.parameters()])
        ww = torch.autograd.grad(w.square().sum(), [x, *reference.parameters()])
        torch.testing.assert_close(gg, ww)
        torch.testing.assert_close(list(model.buffers()), list(reference.buffers()))

    def reads_what_it_writes(x, w):
        x.add_(1.0)
        return (x * w).sin()

    fused = nncfuse.jit(reads_what_it_writes, autograd=autograd)
    for _ in range(3):
        x = torch.randn(4, dtype=torch.float64)
        before = x.clone()
        w = torch.randn(4, dtype=torch.float64, requires_grad=True)
        (g,) = torch.autograd.grad(fused(x, w).sum(), w, create_graph=True)
        torch.testing.assert_close(x, before + 1.0)
        torch.testing.assert_close(g, x * torch.cos(x * w))
        torch.testing.assert_close(torch.autograd.grad(g.sum(), w)[0], -x * x * torch.sin(x * w))


def test_the_trace_generates_python_code_only_for_the_conversion(monkeypatch):
    """AOTAutograd's and the partitioner's graphs are lazy graph modules (`traced_joint`):
    Python code is generated for the two copies converted to TorchScript, and for the
    backward twice inside the partitioner (which reorders it into a plain GraphModule),
    never for the forward nor again for the backward; the FX fallback still runs them
    (compiling their code on its first call)."""
    import torch.fx._lazy_graph_module as lazy

    made = []
    python_code = torch.fx.Graph.python_code

    def counted(self, *args, **kwargs):
        made.append(self)
        return python_code(self, *args, **kwargs)

    monkeypatch.setattr(torch.fx.Graph, "python_code", counted)
    fused = nncfuse.jit(activation, autograd="aot")
    x, y = torch.randn(4, 6, requires_grad=True), torch.randn(4, 6, requires_grad=True)
    out = fused(x, y)
    (joint,) = _plan(fused).joints()
    assert isinstance(joint.forward.gm, lazy._LazyGraphModule)
    assert isinstance(joint.backward.gm, lazy._LazyGraphModule)
    assert not lazy._use_lazy_graph_module_flag  # the mode ends with the trace
    assert all(g is not joint.forward.gm.graph for g in made)
    assert sum(g is joint.backward.gm.graph for g in made) <= 2
    assert len(made) <= 4
    monkeypatch.undo()
    results = joint.forward.gm(x.detach(), y.detach())  # the FX fallback: code made now
    torch.testing.assert_close(results[0], out)
    torch.testing.assert_close(out, activation(x, y))


def _through_a_view(x, w, n):
    n[1:].mul_(2.0)
    return (x * w).tanh()


def _in_shape(x, w, n):
    n.unsqueeze_(0)
    return (x * w).tanh()


def _twice(x, w, n):
    n.add_(1.0)
    y = (x * w).sin()
    n.mul_(3.0)
    return y


@pytest.mark.parametrize("program", [_through_a_view, _in_shape, _twice])
def test_inputs_written_through_a_view_in_shape_or_twice_are_as_eagers(program):
    """Inputs that do not require grad are traced on copies, those not written dropped
    (`_unwritten`): a count written through a view of it, or twice, is written back whole;
    one whose shape is written runs unfused."""
    fused = nncfuse.jit(program, autograd="aot")
    for _ in range(3):
        x, n = torch.randn(3, 4, dtype=torch.float64), torch.randn(3, dtype=torch.float64)
        w = torch.randn(4, dtype=torch.float64, requires_grad=True)
        n2, w2 = n.clone(), w.detach().clone().requires_grad_()
        got, want = fused(x, w, n), program(x, w2, n2)
        torch.testing.assert_close(got, want)
        assert n.shape == n2.shape and n.stride() == n2.stride()
        torch.testing.assert_close(n, n2)
        torch.testing.assert_close(torch.autograd.grad(got.sum(), w),
                                   torch.autograd.grad(want.sum(), w2))
    written = [joint.written for joint in _plan(fused).joints()]
    assert written == ([] if program is _in_shape else [(2,)])


def _counts_into(w, n, m):
    n.add_(1.0)
    return (w * 2.0).sin() * m.sum()


@pytest.mark.parametrize("aliased_first", [True, False])
def test_a_written_input_that_another_input_shares_is_as_eagers(aliased_first, autograd):
    """`f(w, n, n)` writing n reads the write through m, as eager does. The AOT plan traces
    written inputs on copies: where one shares memory with another input, at the trace or
    at a later call, the program runs unfused (`_shares_written`); before, the trace's
    copies hid it from AOTAutograd's check, and a trace of apart inputs was reused."""
    fused = nncfuse.jit(_counts_into, autograd=autograd)
    for k in range(4):
        aliased = (k < 2) == aliased_first
        w = torch.randn(4, dtype=torch.float64, requires_grad=True)
        n, n2 = torch.zeros(4, dtype=torch.float64), torch.zeros(4, dtype=torch.float64)
        m, m2 = (n, n2) if aliased else (torch.ones(4, dtype=torch.float64),) * 2
        w2 = w.detach().clone().requires_grad_()
        got, want = fused(w, n, m), _counts_into(w2, n2, m2)
        torch.testing.assert_close(got, want)
        torch.testing.assert_close(n, n2)
        torch.testing.assert_close(torch.autograd.grad(got.sum(), w),
                                   torch.autograd.grad(want.sum(), w2))
