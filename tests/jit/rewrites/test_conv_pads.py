"""conv_pads: zero pads before convolutions folded (MobileNetV2's TensorFlow padding),
through nncfuse.jit under autograd: eager's results and gradients, the pads gone only
where no reader can tell."""

import copy

import pytest
import torch
import torch.nn.functional as F

import nncfuse
from nncfuse.jit.rewrites.conv_pads import fold_conv_pads
from nncfuse.jit.training.autodiff import AutodiffPlan
from tests.fused import assert_step_as_eager


class Padded(torch.nn.Module):
    """A pad of nothing (1x1), one alike on every side (3x3, stride 1), one that differs by
    side (stride 2), as MobileNetV2 pads."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Conv2d(3, 4, 1)
        self.b = torch.nn.Conv2d(4, 4, 3, groups=4)
        self.c = torch.nn.Conv2d(4, 4, 3, stride=2)

    def forward(self, x):
        x = F.relu6(self.a(F.pad(x, [0, 0, 0, 0], "constant", 0.0)) * 1.5)
        y = F.relu6(self.b(F.pad(x, [1, 1, 1, 1], "constant", 0.0)) + x)
        return self.c(F.pad(y * 2.0, [0, 1, 0, 1], "constant", 0.0)).tanh()


def _outer(fused):
    plans = [p for p in fused.policy.plans.values() if isinstance(p, AutodiffPlan)]
    return plans[0].outers()[0].graph


@pytest.mark.parametrize("how", ["trace", "script"])
def test_pads_fold_into_convolutions_with_eagers_gradients(how):
    torch.manual_seed(0)
    model = Padded()
    reference = copy.deepcopy(model)
    example = torch.randn(2, 3, 8, 8)
    program = torch.jit.trace(model, (example,)) if how == "trace" else torch.jit.script(model)
    fused = nncfuse.jit(program, autograd="autodiff")
    for _ in range(4):
        assert_step_as_eager(fused, model, reference, torch.randn(2, 3, 8, 8))
    outer = _outer(fused)
    pads = [n for n in outer.nodes() if n.kind() in ("aten::pad", "aten::constant_pad_nd")]
    assert len(pads) == 1  # (stride 2's, [0, 1, 0, 1])
    paddings = [n.inputsAt(4).toIValue() for n in outer.nodes() if "conv" in n.kind()]
    assert sorted(paddings) == [[0, 0], [0, 0], [1, 1]]


def _graph(source):
    graph = torch._C.parse_ir(source)
    torch._C._jit_pass_constant_propagation(graph)
    return graph


_SOURCE = """
graph(%x : Float(1, 2, 5, 5), %w : Float(2, 2, 3, 3)):
  %none : NoneType = prim::Constant()
  %pads : int[] = prim::Constant[value=[1, 1, 1, 1]]()
  %value : float = prim::Constant[value={value}]()
  %ones : int[] = prim::Constant[value=[1, 1]]()
  %zeros : int[] = prim::Constant[value=[0, 0]]()
  %transposed : bool = prim::Constant[value={transposed}]()
  %false : bool = prim::Constant[value=0]()
  %groups : int = prim::Constant[value=1]()
  %p : Float(1, 2, 7, 7) = aten::constant_pad_nd(%x, %pads, %value)
  {write}
  %y : Tensor = aten::_convolution(%p, %w, %none, %ones, %zeros, %ones, %transposed, %zeros,
                                   %groups, %false, %false, %false, %false)
  return (%y)
"""


@pytest.mark.parametrize("case, folded", [
    (dict(value=0.0, transposed=0, write=""), 1),
    (dict(value=1.0, transposed=0, write=""), 0),  # a pad of ones
    (dict(value=-0.0, transposed=0, write=""), 0),  # of negative zeros
    (dict(value=0.0, transposed=1, write=""), 0),  # a transposed convolution's padding crops
    (dict(value=0.0, transposed=0, write="%r : Tensor = aten::relu_(%x)"), 0),  # x written
    (dict(value=0.0, transposed=0, write="%r : Tensor = aten::relu_(%p)"), 0),  # the pad written
])
def test_a_pad_folds_only_where_no_reader_can_tell(case, folded):
    graph = _graph(_SOURCE.format(**case))
    assert fold_conv_pads(graph) == folded
    assert len(graph.findAllNodes("aten::constant_pad_nd")) == 1 - folded


def test_a_pad_adds_to_a_convolutions_own_padding():
    source = """
graph(%x : Float(1, 2, 5, 6), %w : Float(2, 2, 3, 3)):
  %none : NoneType = prim::Constant()
  %pads : int[] = prim::Constant[value=[2, 2, 1, 1]]()
  %value : float = prim::Constant[value=0.0]()
  %ones : int[] = prim::Constant[value=[1, 1]]()
  %padding : int[] = prim::Constant[value=[1, 0]]()
  %groups : int = prim::Constant[value=1]()
  %p : Float(1, 2, 7, 10) = aten::constant_pad_nd(%x, %pads, %value)
  %y : Tensor = aten::conv2d(%p, %w, %none, %ones, %padding, %ones, %groups)
  return (%y)
"""
    x, w = torch.randn(1, 2, 5, 6), torch.randn(2, 2, 3, 3)
    graph = _graph(source)
    assert fold_conv_pads(graph) == 1
    (conv,) = graph.findAllNodes("aten::conv2d")
    assert conv.inputsAt(4).toIValue() == [2, 2]  # (height, width): its own plus the pad's
    run = torch._C._create_function_from_graph("folded", graph)
    torch.testing.assert_close(run(x, w), F.conv2d(F.pad(x, [2, 2, 1, 1]), w, padding=[1, 0]))
