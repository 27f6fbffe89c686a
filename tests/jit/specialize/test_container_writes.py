"""A list or dict the caller holds is changed as eager changes it (TorchScript would copy it)."""

import pytest
import torch

import nncfuse
from nncfuse.jit.specialize.container_writes import caller_container_written


def _graph(fn):
    graph = torch.jit.script(fn).graph.copy()
    torch._C._jit_pass_inline(graph)
    return graph


def _append(x: torch.Tensor, seen: list[int]) -> torch.Tensor:
    seen.append(x.size(0))
    return x.sin() + 1


def _nested(x: torch.Tensor, pairs: list[list[int]]) -> torch.Tensor:
    pairs[0].append(1)
    return x.cos() * 2


def _in_tuple(x: torch.Tensor, held: tuple[list[int], int]) -> torch.Tensor:
    held[0].append(2)
    return x.exp() - 1


def _dict(x: torch.Tensor, d: dict[str, torch.Tensor]) -> torch.Tensor:
    d["y"] = x.sin() * 3
    return x + 1


def _own_list(x: torch.Tensor, seen: list[int]) -> torch.Tensor:
    mine = list(seen)
    mine.append(3)
    out: list[int] = []
    out.append(len(mine))
    return x.sin() * float(out[0])


@pytest.mark.parametrize("fn, what", [
    (_append, "aten::append writes the list argument seen"),
    (_nested, "aten::append writes the list argument pairs"),
    (_in_tuple, "aten::append writes the list argument held"),
    (_dict, "aten::_set_item writes the dict argument d"),
])
def test_writes_to_the_callers_containers_are_found(fn, what):
    assert caller_container_written(_graph(fn)) == what


def test_copies_and_new_containers_may_be_written():
    assert caller_container_written(_graph(_own_list)) is None


def test_appends_reach_the_callers_list_on_every_call():
    fused = nncfuse.jit(_append)
    seen, expect = [], []
    x = torch.randn(5)
    for _ in range(4):
        torch.testing.assert_close(fused(x, seen), _append(x, expect))
    assert seen == expect == [5] * 4


def test_items_written_into_the_callers_dict():
    fused = nncfuse.jit(_dict)
    x = torch.randn(4)
    for _ in range(3):
        d = {"x": x}
        fused(x, d)
        torch.testing.assert_close(d["y"], x.sin() * 3)


def test_functions_that_write_their_own_lists_still_fuse():
    fused = nncfuse.jit(_own_list)
    x = torch.randn(64)
    for _ in range(3):
        torch.testing.assert_close(fused(x, [1, 2]), _own_list(x, [1, 2]))
    assert nncfuse.fusion_groups(fused.graph_for(x, [1, 2]))


def test_a_modules_list_attribute_is_appended_to():
    class Recorder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.sizes = [0]

        def forward(self, x):
            self.sizes.append(x.size(0))
            return torch.relu(x) * 2

    m = Recorder()
    fused = nncfuse.jit(m)
    x = torch.randn(7)
    for _ in range(3):
        torch.testing.assert_close(fused(x), torch.relu(x) * 2)
    assert m.sizes == [0, 7, 7, 7]


def test_a_scripted_function_keeps_torchscripts_copy():
    """A ScriptFunction's caller gets TorchScript's semantics (the copy), fused or not."""
    script = torch.jit.script(_append)
    fused = nncfuse.jit(torch.jit.script(_append))
    a, b = [], []
    x = torch.randn(3)
    for _ in range(3):
        script(x, a)
        fused(x, b)
    assert a == b


def test_a_failed_call_that_printed_is_not_run_again(capfd):
    def f(x):
        print("once")
        return x.sin()[10]

    fused = nncfuse.jit(f)
    with pytest.raises((IndexError, RuntimeError)):
        fused(torch.randn(3))
    assert capfd.readouterr().out.count("once") == 1
