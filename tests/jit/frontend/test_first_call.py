"""Graphs of elementwise ops are typed on meta tensors: the first call already runs fused."""

import subprocess
import sys

import torch

import nncfuse
from nncfuse.jit.specialize import policy, profiling


def gelu(x):
    return 0.5 * x * (1 + torch.tanh(0.7978845608 * (x + 0.044715 * x * x * x)))


def profiled_devices(monkeypatch, meta_is_cheap):
    """The devices of the tensors every profiling or meta-typing run gets, as a list that fills
    up."""
    monkeypatch.setattr(policy, "_meta_is_cheap", lambda: meta_is_cheap)
    runs = []
    real = profiling.Profiler.run

    def spy(self, fn, *args):
        flat = [x for a in args for x in (a if isinstance(a, tuple) else (a,))]
        runs.extend(x.device.type for x in flat if isinstance(x, torch.Tensor))
        return real(self, fn, *args)

    real_infer = policy.infer_types

    def spy_infer(graph, example):
        runs.extend(x.device.type for x in map(example, graph.inputs())
                    if isinstance(x, torch.Tensor))
        return real_infer(graph, example)

    monkeypatch.setattr(profiling.Profiler, "run", spy)
    monkeypatch.setattr(policy, "infer_types", spy_infer)
    return runs


def test_elementwise_graph_skips_the_profiling_run(monkeypatch):
    runs = profiled_devices(monkeypatch, meta_is_cheap=True)
    f = nncfuse.jit(gelu)
    x = torch.randn(7, 300)
    torch.testing.assert_close(f(x), gelu(x))
    assert runs == ["meta"]  # typed on meta tensors, never run at eager speed
    assert len(nncfuse.fusion_groups(f.graph_for(x))) == 1


def test_control_flow_and_other_ops_profile_by_running(monkeypatch):
    def f(x, flag: bool):
        if flag:
            x = x * 2.0
        return torch.sigmoid(x) + 1.0

    g = nncfuse.jit(f)
    x = torch.randn(8)
    for _ in range(2):
        torch.testing.assert_close(g(x, True), f(x, True))
    assert not g._last.program.elementwise_only

    def h(x):
        return torch.mm(x, x).sin() * 2.0

    assert nncfuse.jit(h).graph.findNode("aten::mm") is not None
    hh = nncfuse.jit(h)
    hh(torch.randn(4, 4))
    assert not hh._last.program.elementwise_only


def test_meta_inference_failure_falls_back_to_profiling():
    def f(x, y):
        return (x + y) * 2.0  # shapes that do not broadcast: eager raises

    g = nncfuse.jit(f)
    try:
        g(torch.randn(3), torch.randn(4))
    except RuntimeError as e:
        assert "size" in str(e)
    else:
        raise AssertionError("expected eager's error")


def test_strided_inputs_profile_by_running():
    def f(a, b):
        return torch.floor_divide(a, b) * 2.0

    g = nncfuse.jit(f)
    a = torch.randn(6, 5).t()
    b = torch.randn(5, 1).expand(5, 6)
    for _ in range(2):
        got = g(a, b)
    want = f(a, b)
    torch.testing.assert_close(got, want)
    assert got.stride() == want.stride()


def test_a_first_call_does_not_load_torchdynamo(tmp_path):
    """Meta kernels would import it (1.3 s): until it is loaded, the first call profiles."""
    script = tmp_path / "first.py"
    script.write_text(
        "import sys, torch, nncfuse\n"
        "def f(x):\n"
        "    return torch.sin(x * x) * 2.0\n"
        "g = nncfuse.jit(f)\n"
        "x = torch.randn(1000)\n"
        "for _ in range(3):\n"
        "    torch.testing.assert_close(g(x), f(x))\n"
        "assert len(nncfuse.fusion_groups(g.graph_for(x))) == 1\n"
        "assert 'torch._dynamo' not in sys.modules\n"
    )
    subprocess.run([sys.executable, str(script)], check=True)


def test_without_torchdynamo_loaded_the_first_call_profiles(monkeypatch):
    runs = profiled_devices(monkeypatch, meta_is_cheap=False)
    f = nncfuse.jit(gelu)
    x = torch.randn(7, 300)
    torch.testing.assert_close(f(x), gelu(x))
    assert runs == ["cpu"]
    torch.testing.assert_close(f(x), gelu(x))
    assert runs == ["cpu"] and len(nncfuse.fusion_groups(f.graph_for(x))) == 1
