"""The public API: nncfuse.jit on functions, ScriptFunctions, traced functions and modules."""

import warnings

import pytest
import torch

import nncfuse
from nncfuse.jit.specialize.plans import KernelPlan


def chain(a, b):
    return torch.sigmoid(a * b) + torch.tanh(b)


def fused_kinds(fused, *args):
    return [g.kind() for g in nncfuse.fusion_groups(fused.graph_for(*args))]


def test_plain_function_matches_eager_and_fuses():
    f = nncfuse.jit(chain)
    a, b = torch.randn(33, 17), torch.randn(33, 17)
    for _ in range(3):
        torch.testing.assert_close(f(a, b), chain(a, b))
    assert len(fused_kinds(f, a, b)) == 1
    assert f.__name__ == "chain"


def test_decorator_with_options():
    @nncfuse.jit(min_group_size=5)
    def g(a):
        return torch.exp(a) * 2.0

    a = torch.randn(10)
    torch.testing.assert_close(g(a), torch.exp(a) * 2.0)
    assert fused_kinds(g, a) == []


def test_scripted_traced_and_module():
    a, b = torch.randn(8, 8), torch.randn(8, 8)
    scripted = nncfuse.jit(torch.jit.script(chain))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        traced = nncfuse.jit(torch.jit.trace(chain, (a, b)))
    for f in (scripted, traced):
        for _ in range(2):
            torch.testing.assert_close(f(a, b), chain(a, b))
        assert len(fused_kinds(f, a, b)) == 1

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.scale = torch.nn.Parameter(torch.randn(8), requires_grad=False)

        def forward(self, x):
            return torch.relu(x * self.scale) + self.scale

    m = M()
    for fm in (nncfuse.jit(m), nncfuse.jit(torch.jit.script(m))):
        for _ in range(2):
            torch.testing.assert_close(fm(a), m(a))
        assert len(fused_kinds(fm, a)) == 1


def test_kwargs_and_defaults():
    def f(a, scale: float = 2.0, shift: float = 1.0):
        return torch.exp(a) * scale + shift

    g = nncfuse.jit(f)
    a = torch.randn(5)
    for _ in range(2):
        torch.testing.assert_close(g(a), f(a))
        torch.testing.assert_close(g(a, shift=3.0), f(a, shift=3.0))
        torch.testing.assert_close(g(a, 0.5, 0.25), f(a, 0.5, 0.25))
    assert len(g._plans) == 1  # one signature, however the arguments are passed
    with pytest.raises(TypeError):
        g(a, 2.0, scale=3.0)  # as eager Python: scale given twice


def test_parameters_are_typed_by_their_values_as_in_eager_python():
    def f(x, s, flag, y=None):  # no annotations: TorchScript alone takes them all for tensors
        if y is not None:
            x = x + y
        if flag:
            x = x * 2
        return torch.sigmoid(x * s) + s

    g = nncfuse.jit(f)
    x, i = torch.randn(20), torch.arange(20, dtype=torch.int32)
    calls = [(x, 2.5, True), (x, 3, False), (i, 3, True), (x, 0.5, True, x), (x, 0.5, False, None)]
    for args in calls:
        for _ in range(2):
            torch.testing.assert_close(g(*args), f(*args))  # dtypes included
        assert len(nncfuse.fusion_groups(g.graph_for(*args))) == 1
    plans = len(g._plans)
    for s in (-1.5, 7.25, float("nan")):  # a new number is a kernel argument, not a recompile
        torch.testing.assert_close(g(x, s, True), f(x, s, True), equal_nan=True)
    assert len(g._plans) == plans


def test_an_int_for_a_float_annotation_computes_as_eager_python_does():
    def f(x, s: float):
        return x * s + 1

    g = nncfuse.jit(f)
    i = torch.arange(6)
    for s in (2, 2.0):
        torch.testing.assert_close(g(i, s), f(i, s))  # int64 for 2, float32 for 2.0


def test_dtype_and_device_parameters():
    def f(x, dt, device):
        return (x * 2).to(device=device, dtype=dt) + 1

    g = nncfuse.jit(f)
    x = torch.randn(9)
    for dt in (torch.float64, torch.int32, torch.float64):
        torch.testing.assert_close(g(x, dt, torch.device("cpu")), f(x, dt, torch.device("cpu")))


def test_lists_and_tuples_of_tensors_and_numbers():
    def f(xs, ks):
        return torch.exp(xs[0] * ks[0]) + xs[1] * ks[1]

    g = nncfuse.jit(f)
    x, y = torch.randn(9), torch.randn(9)
    for ks in ([2, 3], [0.5, 1.5], (2, 0.5), [2, 0.5]):  # the last has no TorchScript type
        for _ in range(2):
            torch.testing.assert_close(g([x, y], ks), f([x, y], ks))
    assert len(nncfuse.fusion_groups(g.graph_for([x, y], (2, 0.5)))) == 1


def test_what_torchscript_cannot_take_runs_eagerly():
    six = torch.full((5,), 6.0)

    def closes_over_a_tensor(x):
        return torch.minimum(torch.relu(x), six) * 2

    def takes_a_dict(x, d):
        return x * d["k"] + 1  # scripted with d: Dict[str, float]; Dict[str, str] runs eagerly

    x = torch.randn(5)
    g = nncfuse.jit(closes_over_a_tensor)
    with pytest.warns(UserWarning, match="cannot script"):
        torch.testing.assert_close(g(x), closes_over_a_tensor(x))
    torch.testing.assert_close(g(x), closes_over_a_tensor(x))
    h = nncfuse.jit(takes_a_dict)
    for _ in range(2):
        torch.testing.assert_close(h(x, {"k": 3.0}), takes_a_dict(x, {"k": 3.0}))
    with pytest.raises(TypeError):
        h(x, {"k": "text"})  # as eager Python: a tensor times a string
    with pytest.raises(TypeError):
        h(x)  # as eager Python: a missing argument


def test_a_script_given_none_for_a_tensor_raises_as_the_script_does():
    def k(x, y=None):  # scripted, y is a Tensor that defaults to None
        if y is None:
            return x.exp() + 1
        return (x + y).exp() * 2

    script = torch.jit.script(k)
    x = torch.randn(5)
    for fn in (script, nncfuse.jit(script)):
        with pytest.raises(RuntimeError, match="Expected a proper Tensor but got None"):
            fn(x)
    torch.testing.assert_close(nncfuse.jit(script)(x, x), k(x, x))


def test_new_shapes_get_their_own_kernel_up_to_the_limit():
    f = nncfuse.jit(chain, max_specializations=2)
    shapes = [(4, 4), (16,), (3, 5), (4, 4)]
    for shape in shapes:
        a, b = torch.randn(shape), torch.randn(shape)
        for _ in range(2):
            torch.testing.assert_close(f(a, b), chain(a, b))
    assert len(fused_kinds(f, torch.randn(4, 4), torch.randn(4, 4))) == 1
    assert len(fused_kinds(f, torch.randn(16), torch.randn(16))) == 1
    beyond = f.graph_for(torch.randn(3, 5), torch.randn(3, 5))  # beyond the limit: unfused
    assert beyond is not None and nncfuse.fusion_groups(beyond) == []


def test_whole_function_kernel_skips_the_interpreter():
    f = nncfuse.jit(chain)
    a, b = torch.randn(64), torch.randn(64)
    f(a, b)
    f(a, b)
    (plan,) = f._plans.values()
    assert isinstance(plan, KernelPlan)
    torch.testing.assert_close(f(a, b), chain(a, b))


def test_inputs_are_not_modified_and_outputs_are_fresh():
    f = nncfuse.jit(chain)
    a, b = torch.randn(10), torch.randn(10)
    a0, b0 = a.clone(), b.clone()
    outs = [f(a, b) for _ in range(3)]
    assert torch.equal(a, a0) and torch.equal(b, b0)
    assert outs[1].data_ptr() != outs[2].data_ptr()


def test_guard_failure_inside_a_graph_takes_the_fallback():
    def f(a, n: int):
        x = a.view(n, -1)  # the shape of x depends on the number n, not on a's type
        return torch.exp(x) * x

    g = nncfuse.jit(f)
    a = torch.randn(12)
    g(a, 3)
    g(a, 3)
    torch.testing.assert_close(g(a, 4), f(a, 4))  # same signature, TypeCheck fails


def test_disable_and_unscriptable(monkeypatch):
    monkeypatch.setenv("NNCFUSE_DISABLE", "1")
    f = nncfuse.jit(chain)
    a = torch.randn(3)
    torch.testing.assert_close(f(a, a), chain(a, a))
    assert f.graph_for(a, a) is None
    monkeypatch.delenv("NNCFUSE_DISABLE")

    def weird(a, *rest):  # TorchScript cannot script varargs
        return a * 2

    g = nncfuse.jit(weird)
    with pytest.warns(UserWarning, match="cannot script"):
        torch.testing.assert_close(g(a), a * 2)


def test_interpreter_backend(monkeypatch):
    monkeypatch.setenv("NNCFUSE_DONT_USE_LLVM", "1")
    f = nncfuse.jit(chain)
    a, b = torch.randn(6, 5), torch.randn(6, 5)
    for _ in range(2):
        torch.testing.assert_close(f(a, b), chain(a, b))
    (group,) = nncfuse.fusion_groups(f.graph_for(a, b))
    from nncfuse.jit.fuser.runtime import kernel_of

    assert kernel_of(group).jit is None


def test_bad_options_raise():
    with pytest.raises(TypeError):
        nncfuse.jit(chain, min_group_sise=2)
    with pytest.raises(ValueError):
        nncfuse.jit(chain, profiling_runs=0)
