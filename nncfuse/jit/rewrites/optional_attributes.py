"""optional_attributes: a module attribute typed `Optional[Tensor]` as what the module holds.

TorchScript types `nn.Conv2d`'s and `nn.Linear`'s `bias` (and any attribute declared
`Optional[Tensor]`) as optional, so the convolution reads a value that is no tensor to the
profiler and the fuser: it stays outside every group. Where the module is a Python module
whose state every call checks (`specialize/module_state.py`: the check sees a bias replaced
or set to None, and the module is scripted again), the attribute is what the module holds
now: the constant None, or the tensor refined to `Tensor`.

    %b : Tensor? = prim::GetAttr[name="bias"](%conv)        %b : Tensor? = prim::GetAttr[...]
    %y = aten::conv2d(%x, %w, %b, ...)               ==>     %t : Tensor = prim::unchecked_cast(%b)
                                                             %y = aten::conv2d(%x, %w, %t, ...)
    (a bias of None: uses of %b use a constant None, and `if self.bias is not None` folds)
"""

from __future__ import annotations

from typing import Any

import torch

from ...tensorexpr.meta import blocks_of


def refine_optional_attributes(graph: torch._C.Graph, module: torch.nn.Module) -> int:
    """Rewrite, in place, each optional tensor attribute of `module`'s tree that `graph`
    (its inlined forward, `self` its first input) reads; the count rewritten."""
    owners: dict[Any, Any] = {next(graph.inputs()): module}
    done = 0
    for node in _nodes(graph.block()):
        if node.kind() != "prim::GetAttr" or node.input() not in owners:
            continue
        owner, out = owners[node.input()], node.output()
        value = getattr(owner, node.s("name"), None)
        if isinstance(out.type(), torch._C.ClassType) and isinstance(value, torch.nn.Module):
            owners[out] = value
        elif _optional_tensor(out.type()) and out.uses():
            if value is None:
                const = graph.insertConstant(None)
                const.node().moveAfter(node)
                out.replaceAllUsesWith(const)
            elif isinstance(value, torch.Tensor):
                cast = graph.create("prim::unchecked_cast", [out])
                cast.output().setType(torch._C.TensorType.get())
                cast.insertAfter(node)
                out.replaceAllUsesWith(cast.output())
                cast.replaceInput(0, out)
            else:
                continue
            done += 1
    return done


def _optional_tensor(t: Any) -> bool:
    return isinstance(t, torch._C.OptionalType) and isinstance(
        t.getElementType(), torch._C.TensorType)


def _nodes(block: Any) -> Any:
    for node in list(block.nodes()):
        yield node
        for inner in blocks_of(node):
            yield from _nodes(inner)
