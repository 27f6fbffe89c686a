"""A module's state changed after the first call is seen: training flags, reassigned
parameters, replaced submodules, changed attributes (nncfuse issue 36), as eager sees them."""

import copy

import pytest
import torch
from torch import nn

import nncfuse


def _dropout_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.Dropout(0.5), nn.Linear(16, 8))


def _assert_dropped(y, p=0.5):
    zeros = (y == 0).float().mean().item()
    assert abs(zeros - p) < 0.2, zeros


@pytest.mark.parametrize("grad", [False, True], ids=["no_grad", "grad"])
def test_dropout_train_to_eval_and_back(grad):
    m = nn.Sequential(nn.Dropout(0.5), nn.Linear(64, 64))
    j = nncfuse.jit(m)
    x = torch.ones(4, 64)
    with torch.set_grad_enabled(grad):
        for _ in range(3):
            j(x)
        m.eval()
        for _ in range(2):
            assert torch.equal(j(x), m(x))
        m.train()
        ys = [j(x) for _ in range(2)]
        assert not torch.equal(ys[0], m.eval()(x))
        m.train()
        inner = nn.Dropout(0.5)
        j2 = nncfuse.jit(inner)
        j2(x)
        _assert_dropped(j2(x))
        inner.eval()
        assert torch.equal(j2(x), x)
        inner.train()
        _assert_dropped(j2(x))


@pytest.mark.parametrize("grad", [False, True], ids=["no_grad", "grad"])
def test_dropout_matches_eager_under_the_same_seed(grad):
    m = _dropout_model()
    j = nncfuse.jit(m)
    x = torch.randn(4, 8)
    with torch.set_grad_enabled(grad):
        for mode in (False, True, False, True):
            m.train(mode)
            for _ in range(3):
                torch.manual_seed(1)
                got = j(x)
                torch.manual_seed(1)
                torch.testing.assert_close(got, m(x), rtol=1e-5, atol=1e-5)


def _bn_model():
    torch.manual_seed(0)
    m = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU())
    m[1].running_mean.uniform_(-1, 1)
    m[1].running_var.uniform_(0.5, 2)
    return m


@pytest.mark.parametrize("grad", [False, True], ids=["no_grad", "grad"])
def test_batch_norm_train_eval_train_as_eager(grad):
    m = _bn_model()
    eager = copy.deepcopy(m)
    j = nncfuse.jit(m)
    x = torch.randn(2, 3, 8, 8)
    with torch.set_grad_enabled(grad):
        for mode in (True, False, True, False):
            m.train(mode)
            eager.train(mode)
            for _ in range(3):
                torch.testing.assert_close(j(x), eager(x), rtol=1e-4, atol=1e-4)
            for name in ("running_mean", "running_var"):
                torch.testing.assert_close(getattr(m[1], name), getattr(eager[1], name))
            assert torch.equal(m[1].num_batches_tracked, eager[1].num_batches_tracked)
    assert eager[1].num_batches_tracked.item() == 6


def test_eval_first_then_train_counts_batches():
    m = _bn_model().eval()
    eager = copy.deepcopy(m)
    j = nncfuse.jit(m)
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        j(x)
        j(x)
        m.train()
        eager.train()
        torch.testing.assert_close(j(x), eager(x), rtol=1e-4, atol=1e-4)
    assert m[1].num_batches_tracked.item() == 1
    torch.testing.assert_close(m[1].running_mean, eager[1].running_mean)


def _linear_gelu():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 8), nn.GELU(), nn.LayerNorm(8))


def _calls(j, m, x, n=2):
    # (fused layer norms and GELUs round in their own order: close, not bit for bit)
    for _ in range(n):
        torch.testing.assert_close(j(x), m(x), rtol=1e-5, atol=1e-5)


@torch.no_grad()
def test_reassigned_parameter():
    m = _linear_gelu()
    j = nncfuse.jit(m)
    x = torch.randn(3, 8)
    _calls(j, m, x)
    m[0].weight = nn.Parameter(torch.randn(8, 8))
    _calls(j, m, x)
    m[2].bias = nn.Parameter(torch.randn(8))
    _calls(j, m, x)


@torch.no_grad()
def test_replaced_submodule():
    m = _linear_gelu()
    j = nncfuse.jit(m)
    x = torch.randn(3, 8)
    _calls(j, m, x)
    m[1] = nn.ReLU()
    _calls(j, m, x)
    m[0] = nn.Linear(8, 8)
    _calls(j, m, x)


@torch.no_grad()
def test_changed_attributes():
    m = _linear_gelu()
    j = nncfuse.jit(m)
    x = torch.randn(3, 8)
    _calls(j, m, x)
    m[1].approximate = "tanh"
    _calls(j, m, x)
    m[2].eps = 0.5
    _calls(j, m, x)
    m[1].approximate = "none"
    _calls(j, m, x)


def test_in_place_updates_are_seen_without_scripting_again():
    m = _linear_gelu()
    eager = copy.deepcopy(m)
    j = nncfuse.jit(m)
    x = torch.randn(3, 8)
    opt, opt_eager = torch.optim.SGD(m.parameters(), 0.1), torch.optim.SGD(eager.parameters(), 0.1)
    for _ in range(3):
        for model, o in ((j, opt), (eager, opt_eager)):
            o.zero_grad()
            model(x).square().sum().backward()
            o.step()
        with torch.no_grad():
            torch.testing.assert_close(j(x), eager(x))
    m.load_state_dict(_linear_gelu().state_dict())
    with torch.no_grad():
        _calls(j, m, x)
    assert j.states == 1


@torch.no_grad()
def test_double_after_the_first_call():
    m = _linear_gelu()
    j = nncfuse.jit(m)
    _calls(j, m, torch.randn(3, 8))
    m.double()
    x = torch.randn(3, 8, dtype=torch.float64)
    _calls(j, m, x)
    assert j(x).dtype == torch.float64


@pytest.mark.parametrize("grad", [False, True], ids=["no_grad", "grad"])
def test_a_user_script_modules_eval_and_train(grad):
    m = _bn_model()
    eager = copy.deepcopy(m)
    sm = torch.jit.script(m)
    j = nncfuse.jit(sm)
    x = torch.randn(2, 3, 8, 8)
    with torch.set_grad_enabled(grad):
        for mode in (True, False, True):
            sm.train(mode)
            eager.train(mode)
            for _ in range(3):
                torch.testing.assert_close(j(x), eager(x), rtol=1e-4, atol=1e-4)
            torch.testing.assert_close(sm[1].running_mean, eager[1].running_mean)
            assert torch.equal(sm[1].num_batches_tracked, eager[1].num_batches_tracked)


def test_frozen_module_flipped_to_train_and_back():
    m = _bn_model().eval()
    eager = copy.deepcopy(m)
    j = nncfuse.jit(m, freeze=True)
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        for mode in (False, True, False):
            m.train(mode)
            eager.train(mode)
            for _ in range(2):
                torch.testing.assert_close(j(x), eager(x), rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(m[1].running_mean, eager[1].running_mean)
    assert j.freezes == 2  # the statistics changed in training: frozen again


def test_frozen_dropout_flipping_keeps_its_frozen_module():
    m = _dropout_model().eval()
    j = nncfuse.jit(m, freeze=True)
    x = torch.randn(4, 8)
    with torch.no_grad():
        for _ in range(5):
            m.eval()
            _calls(j, m, x)
            reference = m(x)
            m.train()
            assert not torch.allclose(j(x), reference)  # dropped out
    assert j.freezes == 1


def test_flipping_many_times_compiles_a_bounded_number_of_plans():
    m = _dropout_model()
    j = nncfuse.jit(m)
    x = torch.randn(4, 8)
    with torch.no_grad():
        for _ in range(10):
            m.train()
            j(x)
            j(x)
            m.eval()
            _calls(j, m, x)
    assert j.states == 2
    assert j.policy.budget.optimized == 2


def test_many_states_stay_within_the_bound_and_right():
    m = _linear_gelu()
    j = nncfuse.jit(m, max_specializations=3)
    x = torch.randn(3, 8)
    with torch.no_grad():
        for _ in range(6):
            m[0].weight = nn.Parameter(torch.randn(8, 8))
            _calls(j, m, x)
    assert j.states <= 3
    assert j.policy.budget.optimized <= 3


def test_a_traced_module_keeps_the_mode_it_was_traced_in():
    m = _dropout_model().eval()
    x = torch.randn(4, 8)
    traced = torch.jit.trace(m, (x,))
    j = nncfuse.jit(traced)
    with torch.no_grad():
        j(x)
        traced.train()  # TorchScript: the trace recorded eval's ops
        assert torch.equal(j(x), traced(x))
        assert torch.equal(j(x), m(x))


def test_the_check_reads_only_what_the_compiled_code_names():
    """Constants no compiled method names (Linear's `in_features`, LayerNorm's
    `elementwise_affine`) are baked into no code: the per-call check skips them, and a
    changed `eps` (which LayerNorm's forward reads) is still seen."""
    from nncfuse.jit.specialize.module_state import module_state

    model = nn.Sequential(nn.Linear(8, 8), nn.LayerNorm(8))
    state = module_state(model, torch.jit.script(model))
    names = set(state.keys)
    assert {"weight", "bias", "eps", "normalized_shape"} <= names
    assert not names & {"in_features", "out_features", "elementwise_affine"}
    fused = nncfuse.jit(model)
    x = torch.randn(4, 8)
    with torch.no_grad():
        for _ in range(2):
            torch.testing.assert_close(fused(x), model(x))
        model[1].eps = 10.0
        torch.testing.assert_close(fused(x), model(x))
