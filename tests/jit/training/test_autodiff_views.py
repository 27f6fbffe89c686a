"""autodiff_views.py: the views between differentiable graphs move into them and the graphs
they separated join (one autograd node for a transformer's attention); eager's gradients,
float64's by gradcheck."""

import pytest
import torch

import nncfuse
from nncfuse.jit.training.autodiff import AutodiffPlan


def _entries(fused):
    plans = [p for p in fused.policy.plans.values() if isinstance(p, AutodiffPlan)]
    assert len(plans) == 1
    outers = plans[0].outers()
    assert len(outers) == 1
    return outers[0]


def heads(x, w, p):
    """Attention as the training benchmark's block has it: chunk, reshapes and transposes
    between the projections and the attention, the residual read by the last graph."""
    b, s, d = x.shape
    q, k, v = torch.nn.functional.linear(x, w).chunk(3, dim=-1)
    q = q.reshape(b, s, 2, d // 2).transpose(1, 2)
    k = k.reshape(b, s, 2, d // 2).transpose(1, 2)
    v = v.reshape(b, s, 2, d // 2).transpose(1, 2)
    a = torch.matmul(torch.softmax(torch.matmul(q, k.transpose(-1, -2)) * 0.5, -1), v)
    return x + torch.nn.functional.linear(a.transpose(1, 2).reshape(b, s, d), p)


def half_used(x, w, p):
    """A chunk whose second part nothing reads: its gradient is undefined in df."""
    a, _b = (x * 2.0).chunk(2, dim=-1)
    return (a.transpose(0, 1) * w[:3]).sin() + p.sum()


def view_returned(x, w, p):
    """A view read by the graph after it and returned too: it stays outside."""
    t = (x * w).transpose(0, 1)
    return (t.exp() + p.sum()) * 2.0, t


def _args(fn, dtype=torch.float32):
    torch.manual_seed(0)
    shapes = {heads: [(2, 3, 4), (12, 4), (4, 4)], half_used: [(3, 6), (6,), (2,)],
              view_returned: [(3, 4), (4,), (2,)]}[fn]
    return [torch.randn(*s, dtype=dtype, requires_grad=True) for s in shapes]


@pytest.mark.parametrize("fn", [heads, half_used, view_returned], ids=lambda f: f.__name__)
def test_grads_match_eager_and_gradcheck(fn):
    fused = nncfuse.jit(fn, autograd="autodiff")
    args = _args(fn)
    for _ in range(4):  # profiling and compiled calls alike
        out, ref = fused(*args), fn(*args)
        torch.testing.assert_close(out, ref)
        outs, refs = (out, ref) if isinstance(out, tuple) else ((out,), (ref,))
        seeds = [torch.randn_like(r) for r in refs]
        torch.testing.assert_close(torch.autograd.grad(outs, args, seeds),
                                   torch.autograd.grad(refs, args, seeds))
    fused = nncfuse.jit(fn, autograd="autodiff")
    args = _args(fn, torch.float64)
    for _ in range(3):  # to the compiled f and df
        out = fused(*args)
        outs = out if isinstance(out, tuple) else (out,)
        torch.autograd.grad(sum(o.sum() for o in outs), args)
    assert torch.autograd.gradcheck(fused, args)


def test_attention_is_one_differentiable_graph():
    """The views of `heads` move into the graphs and the three graphs join: nothing but
    the one autograd node runs outside (no chunk's cat, no reshape's copy of a gradient)."""
    fused = nncfuse.jit(heads, autograd="autodiff")
    args = _args(heads)
    for _ in range(3):
        torch.autograd.grad(fused(*args).sum(), args)
    outer = _entries(fused)
    assert len(outer.entries) == 1
    kinds = {n.kind() for n in outer.graph.nodes()} - {"prim::Constant"}
    assert kinds == {outer.entries[0].kind}


def test_a_returned_view_stays_outside():
    fused = nncfuse.jit(view_returned, autograd="autodiff")
    args = _args(view_returned)
    for _ in range(3):
        out, t = fused(*args)
        torch.autograd.grad(out.sum(), args)
    assert _entries(fused).graph.findAllNodes("aten::transpose")
    assert t._base is not None  # a view, as eager's
