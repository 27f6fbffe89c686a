"""Errors as eager's: what eager (or TorchScript) raises, nncfuse raises, of the same type."""

import pytest
import torch

import nncfuse

SAVED = "modified by an inplace operation"


def saved_then_written(x):
    y = x * 2
    y.sigmoid_()  # saves its result for backward
    y += 1  # ... which this writes
    return (y * x).sum()


def written_not_saved(x):
    y = x * 2
    y.add_(1)  # mul(x, 2) saved no tensor
    return y.sin()


# -- 1. a write to a tensor autograd saved: backward() raises -----------------------------------
@pytest.mark.filterwarnings("ignore:Error detected in")  # AOTAutograd's anomaly mode, tracing
@pytest.mark.parametrize("autograd", ["autodiff", "aot"])
def test_write_to_saved_tensor_raises_at_backward(autograd):
    x = torch.randn(5, requires_grad=True)
    with pytest.raises(RuntimeError, match=SAVED):
        saved_then_written(x).backward()
    f = nncfuse.jit(saved_then_written, autograd=autograd)
    for _ in range(3):  # the profiling run and the plan's runs alike
        out = f(x)  # the forward does not raise, as eager's does not
        with pytest.raises(RuntimeError, match=SAVED):
            out.backward()


@pytest.mark.parametrize("autograd", ["autodiff", "aot"])
def test_write_to_unsaved_tensor_still_fuses(autograd):
    f = nncfuse.jit(written_not_saved, autograd=autograd)
    for _ in range(3):
        x = torch.randn(6, requires_grad=True)
        f(x).sum().backward()
        x0 = x.detach().clone().requires_grad_()
        written_not_saved(x0).sum().backward()
        torch.testing.assert_close(x.grad, x0.grad)
    assert nncfuse.fusion_groups(f.graph_for(x))


@pytest.mark.filterwarnings("ignore:Error detected in")
def test_write_to_saved_tensor_under_torch_compile():
    """Inductor raises BackendCompilerFailed at the first call (AOTAutograd's trace runs the
    backward); "nncfuse" runs that graph unfused, so the forward works and backward() raises
    as eager's does."""
    torch._dynamo.reset()
    f = torch.compile(saved_then_written, backend="nncfuse")
    x = torch.randn(5, requires_grad=True)
    out = f(x)
    torch.testing.assert_close(out, saved_then_written(x))
    with pytest.raises(RuntimeError, match=SAVED):
        out.backward()


# -- 3, 6. a function TorchScript cannot compile --------------------------------------------------
class Unscriptable(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.Sequential(*(torch.nn.Linear(4, 4) for _ in range(6)))

    def forward(self, x):
        dir(x)  # no TorchScript builtin
        return self.layers(x) * 2


def unscriptable(x):
    dir(x)
    return x * 2


def test_graph_for_unscriptable_is_none_and_has_no_groups():
    f = nncfuse.jit(unscriptable)
    x = torch.randn(3)
    with pytest.warns(UserWarning, match="cannot script"):
        assert f.graph_for(x) is None
    assert nncfuse.fusion_groups(f.graph_for(x)) == []
    torch.testing.assert_close(f(x), x * 2)


def test_unscriptable_module_warns_one_line_with_torchscripts_reason():
    module = Unscriptable()
    f = nncfuse.jit(module)
    x = torch.randn(2, 4)
    with pytest.warns(UserWarning, match="cannot script") as record:
        torch.testing.assert_close(f(x), module(x))
    message = str(record[0].message)
    assert "\n" not in message and len(message) < 300, message
    assert message.startswith("nncfuse: cannot script Unscriptable (TorchScript: Python builtin "
                              "<built-in function dir> is currently not supported"), message
    assert message.endswith("), running it unfused")
    assert "Linear" not in message  # not the module's repr


def test_unscriptable_function_named_by_its_qualified_name():
    f = nncfuse.jit(unscriptable)
    with pytest.warns(UserWarning, match=r"cannot script unscriptable \(TorchScript: "):
        f(torch.randn(3))


# -- 4. exception types: eager's ------------------------------------------------------------------
def amax_plus(x):
    return (x * 2).amax(1) + 1


def max_plus(x):
    return (x * 2).max(1)[0] + 1


def min_plus(x):
    return (x * 2).min(1).values + 1


def argmax_plus(x):
    return (x * 2).argmax(1) + 1


@pytest.mark.parametrize("fn", [amax_plus, max_plus, min_plus, argmax_plus])
def test_reduction_over_zero_size_dim_raises_eagers_index_error(fn):
    empty = torch.randn(3, 0)
    with pytest.raises(IndexError) as eager:
        fn(empty)
    f = nncfuse.jit(fn)
    for n in (4, 5, 6, 0, 0):  # the first call, and after plans (dynamic ones) exist
        x = torch.randn(3, n)
        if n:
            torch.testing.assert_close(f(x), fn(x))
            continue
        with pytest.raises(IndexError) as got:
            f(x)
        assert str(got.value) == str(eager.value)


def test_scripted_function_keeps_torchscripts_error():
    """A ScriptFunction's reference is TorchScript, which raises RuntimeError here."""
    script = torch.jit.script(amax_plus)
    f = nncfuse.jit(script)
    with pytest.raises(RuntimeError, match="non-zero size"):
        script(torch.randn(3, 0))
    with pytest.raises(RuntimeError, match="non-zero size"):
        f(torch.randn(3, 0))


# -- 5. Python ints beyond int64 ------------------------------------------------------------------
def times(x, n: int):
    return x * n


@pytest.mark.parametrize("first", [None, 3])  # no plan yet; a plan for small ints exists
def test_int_beyond_int64_runs_as_eager(first):
    f = nncfuse.jit(times)
    x = torch.randn(4)
    if first is not None:
        for _ in range(3):
            torch.testing.assert_close(f(x, first), times(x, first))
    torch.testing.assert_close(f(x, 2**63), times(x, 2**63))  # eager takes it (as uint64)
    with pytest.raises(OverflowError) as eager:
        times(x, -(2**63) - 1)
    with pytest.raises(OverflowError) as got:
        f(x, -(2**63) - 1)
    assert str(got.value) == str(eager.value)
    torch.testing.assert_close(f(x, 2**63 - 1), times(x, 2**63 - 1))


def test_int_beyond_int64_to_a_script_raises_as_torchscript():
    script = torch.jit.script(times)
    f = nncfuse.jit(script)
    x = torch.randn(4)
    for _ in range(3):
        f(x, 2)
    for n in (2**63, -(2**63) - 1):
        with pytest.raises(RuntimeError, match="Expected a value of type 'int'"):
            script(x, n)
        with pytest.raises(RuntimeError, match="Expected a value of type 'int'"):
            f(x, n)


def test_a_failed_call_that_wrote_in_place_is_not_run_again():
    """Eager's exception type comes from running the call again in eager, which a program that
    writes in place must not do: its writes before the failure would be made twice."""

    def f(x, t):
        x.add_(1)
        return t.amax(1) + 1

    fused = nncfuse.jit(f)
    x, good, empty = torch.zeros(3), torch.randn(3, 2), torch.randn(3, 0)
    fused(x, good)
    fused(x, good)
    assert torch.equal(x, torch.full((3,), 2.0))
    with pytest.raises((IndexError, RuntimeError)):
        fused(x, empty)
    assert torch.equal(x, torch.full((3,), 3.0))  # written once, as eager writes it
