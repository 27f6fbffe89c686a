"""meta's list accessors of TorchScript values and blocks (tensorexpr/meta.py): the same, in the
same order, as the pybind iterators they replace, for nodes, graphs and blocks."""

import torch

from nncfuse.tensorexpr.meta import blocks_of, inputs_of, outputs_of

_IR = """
graph(%x : Float(4, 4, strides=[4, 1], requires_grad=0, device=cpu), %flag : bool):
  %c : int = prim::Constant[value=2]()
  %y : Float(4, 4, strides=[4, 1], requires_grad=0, device=cpu) = aten::mul(%x, %c)
  %z : Tensor = prim::If(%flag)
    block0():
      %s : Tensor = aten::sin(%y)
      -> (%s)
    block1():
      -> (%x)
  %n : int = prim::Constant[value=0]()
  %chunks : Tensor[] = aten::chunk(%z, %c, %n)
  %a : Tensor, %b : Tensor = prim::ListUnpack(%chunks)
  return (%a, %b, %y)
"""


def _ids(values):
    return [v.unique() for v in values]


def test_the_accessors_give_what_the_iterators_give():
    graph = torch._C.parse_ir(_IR)
    owners = [graph, graph.block()]
    for node in graph.nodes():
        owners.append(node)
        owners += list(node.blocks())
    assert any(isinstance(o, torch._C.Block) for o in owners[2:])  # the If's blocks
    for owner in owners:
        assert isinstance(inputs_of(owner), list) and isinstance(outputs_of(owner), list)
        assert _ids(inputs_of(owner)) == _ids(owner.inputs())
        assert _ids(outputs_of(owner)) == _ids(owner.outputs())
    unpack = graph.findNode("prim::ListUnpack")
    assert len(outputs_of(unpack)) == 2 and len(inputs_of(graph)) == 2
    constant = graph.findNode("prim::Constant")
    assert _ids(outputs_of(constant)) == [constant.output().unique()]


def test_blocks_are_a_control_flow_nodes_own():
    graph = torch._C.parse_ir(_IR)
    for node in graph.nodes():
        mine = blocks_of(node)
        assert isinstance(mine, list) and len(mine) == len(list(node.blocks()))
        assert all(b.owningNode() == node for b in mine)
    (branch,) = graph.findAllNodes("prim::If")
    assert len(blocks_of(branch)) == 2
    assert [n.kind() for n in blocks_of(branch)[0].nodes()] == ["aten::sin"]
