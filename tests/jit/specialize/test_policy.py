"""The policy alone: a TorchScript graph and example inputs, no Python function to script (what
a torch.compile backend hands over)."""

import torch

from nncfuse import Options
from nncfuse.jit.specialize.plans import GraphPlan, KernelPlan, UnfusedPlan
from nncfuse.jit.specialize.policy import Policy, program, signature


def chain(a, b):
    return torch.sigmoid(a * b) + torch.tanh(b)


def _program(fn):
    graph = torch.jit.script(fn).graph
    return program(graph, torch._C._create_function_from_graph("unfused", graph))


def test_a_graph_without_a_function_gets_a_kernel_per_signature():
    prog = _program(chain)
    policy = Policy(Options.from_env(max_specializations=2))
    shapes = [(4, 4), (16,), (3, 5)]
    for shape in shapes:
        args = (torch.randn(shape), torch.randn(shape))
        for _ in range(2):
            torch.testing.assert_close(policy.call(prog, signature(args), args), chain(*args))
    kinds = [type(plan) for plan in policy.plans.values()]
    assert kinds == [KernelPlan, KernelPlan, UnfusedPlan]  # the third is past the bound
    assert policy.compile_failures == []


def test_a_graph_with_control_flow_runs_in_the_interpreter():
    def f(x, flag: bool):
        if flag:
            x = x * 2.0
        return torch.sigmoid(x) + 1.0

    prog = _program(f)
    assert not prog.elementwise_only
    policy = Policy(Options.from_env())
    args = (torch.randn(8), True)
    for _ in range(2):
        torch.testing.assert_close(policy.call(prog, signature(args), args), f(*args))
    (plan,) = policy.plans.values()
    assert isinstance(plan, GraphPlan)


def test_signatures_key_metadata_and_types_not_numbers():
    a = torch.randn(3, 4)
    assert signature((a, 2.0)) == signature((torch.randn(3, 4), -1.5))
    assert signature((a, 2.0)) != signature((a, 2))
    assert signature((a,)) != signature((a.t(),))
    assert signature((a,)) != signature((a.double(),))
    with torch.no_grad():  # grad mode is part of it
        without_grad = signature((a,))
    assert signature((a,)) != without_grad
