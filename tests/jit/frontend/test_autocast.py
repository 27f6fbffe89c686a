"""Calls under `torch.autocast("cpu")`: eager autocast's result dtypes and values, and a plan made
under autocast never serves a call outside it (or under another dtype), nor the reverse.

TorchScript preoptimizes each callee for the ambient autocast with its own casts (layer norm and
gelu in float32, where eager's CPU autocast keeps them in bfloat16); inlined into the graph that
nncfuse specializes, those casts gave float32 results under autocast and bfloat16-rounded ones
outside it. Ops that eager autocast casts (GEMMs, convolutions: they have an AutocastCPU kernel)
stay outside fusion groups under autocast, so that eager's autocast casts their operands."""

import copy

import pytest
import torch
from torch import nn

import nncfuse

DTYPES = [torch.bfloat16, torch.float16]


def _block() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 16), nn.LayerNorm(16))


def _close(result: torch.Tensor, expected: torch.Tensor, reduced: bool) -> None:
    assert result.dtype == expected.dtype
    tol = 2e-2 if reduced else 1e-5
    torch.testing.assert_close(result, expected, rtol=tol, atol=tol)


@pytest.mark.parametrize("script", [False, True], ids=["module", "script_module"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_module_under_autocast_then_outside(dtype, script):
    model = _block().eval()
    fused = nncfuse.jit(torch.jit.script(model) if script else model)
    x = torch.randn(4, 16)
    with torch.no_grad():
        for _ in range(3):  # (profile, optimize, run the plan) in and out of autocast, in turn
            with torch.autocast("cpu", dtype=dtype):
                _close(fused(x), model(x), reduced=True)
            _close(fused(x), model(x), reduced=False)


def test_a_function_first_called_under_autocast_returns_float32_outside():
    def f(a, b):
        return torch.mm(a, b).relu() + 1

    fused = nncfuse.jit(f)
    a, b = torch.randn(8, 8), torch.randn(8, 8)
    for _ in range(3):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            _close(fused(a, b), f(a, b), reduced=True)
    for _ in range(3):
        _close(fused(a, b), f(a, b), reduced=False)
    with torch.autocast("cpu", dtype=torch.float16):  # another dtype: another plan
        _close(fused(a, b), f(a, b), reduced=True)


def test_elementwise_work_still_fuses_under_autocast():
    def f(a, b):
        return torch.sigmoid(a * b) + torch.tanh(b) * 2.0

    fused = nncfuse.jit(f)
    a, b = torch.randn(64), torch.randn(64)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        for _ in range(2):
            _close(fused(a, b), f(a, b), reduced=False)  # (no op here that autocast casts)
        assert nncfuse.fusion_groups(fused.graph_for(a, b))


@pytest.mark.parametrize("autograd", ["autodiff", "aot"])
def test_training_under_autocast_gives_eagers_dtypes_and_gradients(autograd):
    model = _block()
    reference = copy.deepcopy(model)
    fused = nncfuse.jit(model, autograd=autograd)
    x = torch.randn(4, 16)
    for _ in range(3):
        for enabled in (True, False):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=enabled):
                result, expected = fused(x), reference(x)
            _close(result, expected, reduced=enabled)
            result.float().square().sum().backward()
            expected.float().square().sum().backward()
            # (Under autocast, fused: bfloat16 rounding, relative to the largest gradient;
            # tests/jit/training/test_autocast_training.py measures it against Inductor's.)
            scale = max(float(q.grad.abs().max()) for q in reference.parameters())
            rtol, atol = (1.6e-2, 1.6e-2 * scale) if enabled else (1e-4, 1e-5)
            for p, q in zip(model.parameters(), reference.parameters()):
                assert p.grad.dtype == q.grad.dtype == torch.float32
                torch.testing.assert_close(p.grad, q.grad, rtol=rtol, atol=atol)
            model.zero_grad()
            reference.zero_grad()


# GEMMs under autocast: the casts written out (`fuser/autocast_casts.py`), the GEMM fused with
# its epilogue, a weight's reduced-precision copy made once per version (`fuser/cast_cache.py`).
# Tolerances: 2e-2. On `benchmarks/autocast_mlp.py` (bfloat16) Inductor is 5e-7 off eager
# autocast and nncfuse 4e-3: oneDNN's gelu post-op acts on the GEMM's float32 accumulator,
# before eager's rounding of the GEMM's result to bfloat16 (about one bfloat16 ulp).


class _Mlp(nn.Module):
    def __init__(self, width: int = 16, hidden: int = 64):
        super().__init__()
        torch.manual_seed(0)
        self.fc1, self.fc2 = nn.Linear(width, hidden), nn.Linear(hidden, width)
        self.norm = nn.LayerNorm(width)

    def forward(self, x):
        return self.norm(self.fc2(nn.functional.gelu(self.fc1(x))) + x)


class _ConvBlock(nn.Module):
    """Convolutions called with their weights and biases (an `nn.Conv2d`'s `Optional` bias,
    read by `prim::GetAttr`, has no profiled type: its convolution runs outside groups)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.conv1 = nn.Conv2d(8, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 8, 1)

    def forward(self, x):
        return _conv_block(x, self.conv1.weight, self.conv1.bias, self.conv2.weight,
                           self.conv2.bias)


def _conv_block(x, w1, b1, w2, b2):
    y = torch.relu(nn.functional.conv2d(x, w1, b1, padding=1))
    return torch.relu(nn.functional.conv2d(y, w2, b2) + x)


def _subgraph_kinds(graph) -> list[set[str]]:
    return [{n.kind() for n in g.g("Subgraph").nodes()} for g in nncfuse.fusion_groups(graph)]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("make, x, gemm", [
    (_Mlp, (8, 16), "aten::linear"),
    (_ConvBlock, (2, 8, 6, 6), "aten::conv2d"),
], ids=["mlp", "conv"])
def test_gemm_fuses_with_its_epilogue_under_autocast(make, x, gemm, dtype):
    model = make().eval()
    if make is _ConvBlock:
        fused, args = nncfuse.jit(_conv_block), (torch.randn(*x), *model.parameters())
    else:
        fused, args = nncfuse.jit(model), (torch.randn(*x),)
    with torch.no_grad():
        for _ in range(3):  # in and out of autocast, in turn
            with torch.autocast("cpu", dtype=dtype):
                _close(fused(*args), model(args[0]), reduced=True)
            _close(fused(*args), model(args[0]), reduced=False)
        with torch.autocast("cpu", dtype=dtype):
            kinds = _subgraph_kinds(fused.graph_for(*args))
    assert any(gemm in k and len(k - {gemm, "prim::Constant"}) for k in kinds), kinds


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_an_in_place_weight_update_between_calls_is_seen(dtype):
    model = _Mlp().eval()
    fused = nncfuse.jit(model)
    x = torch.randn(8, 16)
    for _ in range(4):
        # (Outside the region: eager's autocast keeps its copies of weights until the region
        # ends, and would miss an update inside it.)
        with torch.no_grad(), torch.autocast("cpu", dtype=dtype):
            _close(fused(x), model(x), reduced=True)
        with torch.no_grad():
            model.fc1.weight.mul_(-1.5)  # (an optimizer's step: the version changes)
            model.fc2.bias.add_(0.25)
            model.norm.weight.add_(0.5)
    # ... and `load_state_dict` (copy_ into the parameters)
    state = {k: v * 0.5 for k, v in model.state_dict().items()}
    model.load_state_dict(state)
    with torch.no_grad(), torch.autocast("cpu", dtype=dtype):
        _close(fused(x), model(x), reduced=True)


def test_a_weights_copy_is_made_once_per_version():
    from nncfuse.jit.fuser import cast_cache

    weight = nn.Parameter(torch.randn(4, 4))
    with torch.no_grad():
        first = cast_cache.cached_cast(weight, torch.bfloat16, False)
        assert cast_cache.cached_cast(weight, torch.bfloat16, False) is first
        weight.add_(1)
        second = cast_cache.cached_cast(weight, torch.bfloat16, False)
        assert second is not first
        torch.testing.assert_close(second, weight.to(torch.bfloat16))
        activation = torch.randn(4, 4)  # (not a weight: cast every time)
        assert cast_cache.cached_cast(activation, torch.bfloat16, False) is not (
            cast_cache.cached_cast(activation, torch.bfloat16, False))


def test_nan_and_inf_through_a_fused_bfloat16_epilogue():
    model = _Mlp().eval()
    fused = nncfuse.jit(model)
    x = torch.randn(8, 16)
    x[0, 3], x[1, 5], x[2, 7] = float("nan"), float("inf"), -float("inf")
    x[3] = 3e38
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        for _ in range(3):
            result, expected = fused(x), model(x)
            assert result.dtype == expected.dtype
            torch.testing.assert_close(result, expected, rtol=2e-2, atol=2e-2, equal_nan=True)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_matmul_bmm_and_cat_take_autocasts_dtypes(dtype):
    def f(a, b, c, d):
        y = torch.bmm(a, b).relu() + torch.matmul(a, b) * 2.0
        return torch.cat([y, c], 1).sigmoid(), torch.cat([c, d], 1) * 2.0

    fused = nncfuse.jit(f)
    a, b = torch.randn(2, 4, 8), torch.randn(2, 8, 4)
    c, d = torch.randn(2, 3, 4).to(dtype), torch.randn(2, 3, 4)
    with torch.no_grad():
        for _ in range(3):
            with torch.autocast("cpu", dtype=dtype):
                for r, e in zip(fused(a, b, c, d), f(a, b, c, d)):
                    _close(r, e, reduced=True)
            for r, e in zip(fused(a, b, c, d), f(a, b, c, d)):
                _close(r, e, reduced=True)


def test_a_weight_the_function_writes_is_cast_after_the_write():
    def f(x, w, v):
        w.add_(1.0)
        return torch.nn.functional.linear(x, w).relu() + torch.nn.functional.linear(x, v)

    fused = nncfuse.jit(f)
    x, w, v = torch.randn(4, 8), torch.randn(8, 8), torch.randn(8, 8)
    ws = w.clone()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        for _ in range(3):
            _close(fused(x, w, v), f(x, ws, v), reduced=True)
            torch.testing.assert_close(w, ws)


def test_a_batch_of_weights_takes_its_copies_until_one_changes_or_goes():
    from nncfuse.jit.fuser import cast_cache

    weights = [nn.Parameter(torch.randn(4, 4)) for _ in range(3)]
    states = [True] * 3
    with torch.no_grad():
        first = cast_cache.cached_casts(weights, torch.bfloat16, states)
        again = cast_cache.cached_casts(weights, torch.bfloat16, states)
        assert all(a is b for a, b in zip(first, again))
        weights[1].mul_(2)  # (a new version: that copy is made anew, the others kept)
        second = cast_cache.cached_casts(weights, torch.bfloat16, states)
        assert second[0] is first[0] and second[1] is not first[1]
        torch.testing.assert_close(second[1], weights[1].to(torch.bfloat16), rtol=0, atol=0)
        weights[2] = nn.Parameter(torch.randn(4, 4))  # (another tensor: cast, not the old copy)
        third = cast_cache.cached_casts(weights, torch.bfloat16, states)
        torch.testing.assert_close(third[2], weights[2].to(torch.bfloat16), rtol=0, atol=0)
        inference = torch.randn(4, 4)  # (not a weight: cast every time)
        mixed = [weights[0], inference]
        assert cast_cache.cached_casts(mixed, torch.bfloat16, [True, False])[1] is not (
            cast_cache.cached_casts(mixed, torch.bfloat16, [True, False])[1])
