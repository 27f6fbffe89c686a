"""module_attributes: a guarded module's optional tensor attributes and training flags as
what the module holds.

Where the module is a Python module whose state every call checks
(`specialize/module_state.py`: the check sees a bias replaced or set to None, and every
`training` flag the code reads; a change scripts the module again or picks the plans of
that state), what the module holds now is a fact of the plan:

- TorchScript types `nn.Conv2d`'s and `nn.Linear`'s `bias` (and any attribute declared
  `Optional[Tensor]`) as optional, so the convolution reads a value that is no tensor to the
  profiler and the fuser: it stays outside every group. The attribute becomes the constant
  None, or the tensor refined to `Tensor`.

      %b : Tensor? = prim::GetAttr[name="bias"](%conv)     %b : Tensor? = prim::GetAttr[...]
      %y = aten::conv2d(%x, %w, %b, ...)            ==>     %t : Tensor = prim::unchecked_cast(%b)
                                                            %y = aten::conv2d(%x, %w, %t, ...)
      (a bias of None: uses of %b use a constant None, and `if self.bias is not None` folds)

- A `training` flag that is False becomes a constant, so an eval batch norm's `training`
  operand is one (it lowers only then) and `if self.training:` folds (its statistics update
  goes). One that is True stays a read, as before: training plans are unchanged.

      %t : bool = prim::GetAttr[name="training"](%bn)       %t : bool = prim::Constant[value=0]()
      %y = aten::batch_norm(%x, ..., %t, ...)       ==>     %y = aten::batch_norm(%x, ..., %t, ...)
"""

from __future__ import annotations

from typing import Any

import torch

from ...tensorexpr.meta import all_nodes


def refine_module_attributes(graph: torch._C.Graph, module: torch.nn.Module) -> int:
    """Rewrite, in place, each optional tensor attribute and `training` flag of `module`'s tree
    that `graph` (its inlined forward, `self` its first input) reads; the count rewritten."""
    owners: dict[Any, Any] = {next(graph.inputs()): module}
    done = 0
    for node in all_nodes(graph.block()):
        if node.kind() != "prim::GetAttr" or node.input() not in owners:
            continue
        owner, out = owners[node.input()], node.output()
        value = getattr(owner, node.s("name"), None)
        if isinstance(out.type(), torch._C.ClassType) and isinstance(value, torch.nn.Module):
            owners[out] = value
        elif (node.s("name") == "training" and isinstance(owner, torch.nn.Module)
              and value is False and out.uses()):
            const = graph.insertConstant(value)
            const.node().moveAfter(node)
            out.replaceAllUsesWith(const)
            done += 1
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
