"""symbolic_sizes: an FX graph's size arguments that follow from the input's sizes, as
the constants that say so.

Once Dynamo makes a length symbolic (a decode step's cache length, after automatic
dynamic shapes), the size lists of the views, expands and slices around it are
computed (`sym_size(x, 2) + 1`) rather than constants. A fusion group takes only
constant sizes, so each such op ran alone, op by op; a grouped-query attention's
`repeat_kv` (an expand, a copy and a view per key and value) then copied the whole
cache once more per layer and token, not inside the kernel that grows it. Where
Dynamo's shape environment proves the computed size equal to what the op takes from
its input, the entry becomes the constant that means that:

    expand(x : [1, 2, 1, s0 + 1, 64], [1, 2, 2, add, 64])   ==>   [1, 2, 2, -1, 64]
        (add : s0 + 1, the input's size at that dim)
    view(y : [1, 2, 2, s0 + 1, 64], [1, 4, add, 64])        ==>   [1, 4, -1, 64]
        (the one computed entry; the others positive constants; y not empty)
    slice(m : [1, 1, 1, s0 + 1], 3, 0, add)                 ==>   slice(m, 3, 0, INT64_MAX)
        (add >= the input's size at that dim: the slice is all of it)

Each holds for every input that passes Dynamo's guards: an expand's size equal to the
input's is what -1 keeps, a view's sizes multiply to the input's element count (its one
unknown is the quotient, what -1 infers), a slice's end is clamped to the size. The
proof is the shape environment's (`statically_known_true`: no guard is added); anything
it cannot prove stays.
"""

from __future__ import annotations

import sys
from typing import Any

import torch
from torch.fx.experimental.symbolic_shapes import statically_known_true

__all__ = ["sizes_from_inputs"]

aten = torch.ops.aten
_VIEWS = (aten.view.default, aten._unsafe_view.default, aten.reshape.default)


def sizes_from_inputs(graph: torch.fx.Graph) -> int:
    """Rewrite `graph`'s computed sizes that follow from their op's input (see the module);
    return how many entries were rewritten."""
    done = 0
    for node in graph.nodes:
        if node.op != "call_function" or node.kwargs:
            continue
        if node.target is aten.expand.default and len(node.args) == 2:
            sizes = _expand_sizes(_example(node.args[0]), node.args[1])
        elif node.target in _VIEWS and len(node.args) == 2:
            sizes = _view_sizes(_example(node.args[0]), node.args[1])
        elif node.target is aten.slice.Tensor and len(node.args) == 4:
            sizes = _slice_end(_example(node.args[0]), node.args[1], node.args[3])
        else:
            continue
        if sizes is not None:
            node.args = (node.args[0], sizes) if node.target is not aten.slice.Tensor else (
                *node.args[:3], sizes)
            done += 1
    return done


def _example(arg: Any) -> torch.Tensor | None:
    value = arg.meta.get("val") if isinstance(arg, torch.fx.Node) else None
    return value if isinstance(value, torch.Tensor) else None


def _number(arg: Any) -> Any:
    """An argument's value: an int, a SymInt (a node's example), or None."""
    if isinstance(arg, torch.fx.Node):
        value = arg.meta.get("val")
        return value if isinstance(value, (int, torch.SymInt)) else None
    return arg if type(arg) is int else None


def _expand_sizes(x: torch.Tensor | None, sizes: Any) -> list[Any] | None:
    """expand's sizes with each computed one that equals the input's size as -1."""
    if x is None or not isinstance(sizes, (list, tuple)) or len(sizes) < x.dim():
        return None
    lead = len(sizes) - x.dim()
    out, changed = list(sizes), False
    for d, size in enumerate(x.shape):
        entry = sizes[lead + d]
        if not isinstance(entry, torch.fx.Node):
            continue
        value = _number(entry)
        if value is not None and statically_known_true(size == value):
            out[lead + d], changed = -1, True
    return out if changed else None


def _view_sizes(x: torch.Tensor | None, sizes: Any) -> list[Any] | None:
    """A view's sizes with its one computed entry as -1, the others positive constants, of an
    input that is not empty (where -1 would be ambiguous)."""
    if x is None or not isinstance(sizes, (list, tuple)) or not statically_known_true(
            x.numel() > 0):
        return None
    computed = [k for k, s in enumerate(sizes) if isinstance(s, torch.fx.Node)]
    if len(computed) != 1 or _number(sizes[computed[0]]) is None or not all(
            type(s) is int and s > 0 for k, s in enumerate(sizes) if k != computed[0]):
        return None
    return [-1 if k == computed[0] else s for k, s in enumerate(sizes)]


def _slice_end(x: torch.Tensor | None, dim: Any, end: Any) -> int | None:
    """INT64_MAX for a computed slice end that is at least the input's size at `dim`."""
    if x is None or type(dim) is not int or not isinstance(end, torch.fx.Node):
        return None
    if not -max(x.dim(), 1) <= dim < max(x.dim(), 1):
        return None
    value = _number(end)
    if value is None or not statically_known_true(value >= x.shape[dim]):
        return None
    return sys.maxsize
