"""The schedule as a pipeline to watch and trust: each pass logged with its time, passes
that change nothing marked, and (NNCFUSE_VERIFY, on in the tests) the IR verified after
each, naming the pass that broke it."""

import re

import pytest
import torch

import nncfuse
from nncfuse.config import Options
from nncfuse.jit.fuser.guard import clear_kernel_cache
from nncfuse.tensorexpr import kernel as kernel_module
from nncfuse.tensorexpr import stmt as S
from nncfuse.tensorexpr.ir_verifier import IRError

GRAPH = """
graph(%a : Float(4, 8, strides=[8, 1], requires_grad=0, device=cpu),
      %b : Float(4, 8, strides=[8, 1], requires_grad=0, device=cpu)):
  %x : Tensor = aten::mul(%a, %b)
  %y : Tensor = aten::sin(%x)
  return (%y)
"""


def _drop_loops(stmt):
    """A broken pass: the loops go, their bodies stay, using variables nothing binds."""
    return S.Block(tuple(s.body if isinstance(s, S.For) else s for s in stmt.stmts))


def _with_pass(monkeypatch, name, fn, after="inline_intermediates"):
    """Put `fn` into the schedule as pass `name`, right after the pass `after`."""
    schedule = kernel_module.schedule

    def patched(lowered, vector_width):
        passes = schedule(lowered, vector_width)
        k = [n for n, _ in passes].index(after) + 1
        return [*passes[:k], (name, fn), *passes[k:]]

    monkeypatch.setattr(kernel_module, "schedule", patched)


def test_the_tests_verify_after_every_pass():
    assert Options.from_env().verify
    assert not Options.from_env(verify=False).verify


def test_a_broken_pass_is_named(monkeypatch):
    _with_pass(monkeypatch, "drop_loops", _drop_loops)
    graph = torch._C.parse_ir(GRAPH)
    with pytest.raises(IRError, match=r"malformed after drop_loops: variable \w+ used out of"):
        nncfuse.TensorExprKernel(graph)
    # Without the option the final check still catches it, without knowing which pass.
    with pytest.raises(IRError, match="malformed after the schedule"):
        nncfuse.TensorExprKernel(graph, Options(verify=False))


def test_a_broken_pass_leaves_the_group_unfused(monkeypatch):
    _with_pass(monkeypatch, "drop_loops", _drop_loops)
    clear_kernel_cache()

    def fn(a, b):
        return torch.sin(a * b) * b

    f = nncfuse.jit(fn)
    a, b = torch.randn(4, 8), torch.randn(4, 8)
    for _ in range(3):
        torch.testing.assert_close(f(a, b), fn(a, b))
    assert nncfuse.fusion_groups(f.graph_for(a, b)) == []
    (failure,) = f.compile_failures
    assert isinstance(failure.error, IRError) and "drop_loops" in str(failure.error)
    clear_kernel_cache()


def test_log_times_each_pass_and_marks_unchanged_ones(monkeypatch, capsys):
    _with_pass(monkeypatch, "do_nothing", lambda stmt: stmt)
    monkeypatch.setenv("NNCFUSE_LOG_LEVEL", ">>kernel")
    nncfuse.TensorExprKernel(torch._C.parse_ir(GRAPH))
    err = capsys.readouterr().err
    lines = [re.sub(r"^\[DEBUG kernel.py:\d+\] ", "", line) for line in err.splitlines()]
    for header in ["TensorExprKernel graph:", "Original Stmt:", "Final Stmt:"]:
        assert header in lines
    passes = [(k, line) for k, line in enumerate(lines) if line.startswith("After ")]
    [(k, noop)] = [(k, line) for k, line in passes if line.startswith("After do_nothing")]
    assert re.fullmatch(r"After do_nothing \(unchanged, \d+\.\d\d ms\)", noop)
    assert lines[k + 1].startswith("After ")  # an unchanged pass prints no statement
    inline = [line for _, line in passes if line.startswith("After inline_intermediates")]
    assert len(inline) == 1 and re.fullmatch(r"After inline_intermediates \(\d+\.\d\d ms\):",
                                             inline[0])
    assert lines[lines.index(inline[0]) + 1] == "{"  # a changed one prints its result
