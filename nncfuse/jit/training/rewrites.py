"""rewrites: the graph rewrites that turn a profiled training program into autodiff's
differentiable graphs, as one ordered, named list run by one driver.

`rewrites(shapes_fixed)` is the list, as `kernel.schedule` is for loop passes; `run` applies
it to a typed, specialized graph in place and logs the graph after each rewrite under
`>>rewrites` (a rewrite that changed nothing is marked so). Each rule is stated for the
pattern it rewrites:

    autocast_casts         under autocast, the casts eager's autocast makes as autocast's
                           cast ops (differentiated: the gradient cast back), so
                           `f` and `df` mean the same under autocast and outside
    explicit_promotions    an op's promotion of floating operands as casts before it (their
                           gradients then come back in the operands' dtypes, as eager's)
    fold_sizes             sizes the signature fixes as constants (peephole, constant
                           propagation): a layer norm's normalized shape, a view's sizes
    drop_identities        a cast to a value's own type, a slice of all of it: the value
    fold_tuples            a tuple unpacked where it is packed: the values packed
    flat_linears           addmm between a flattening view and its inverse: one linear
    fold_conv_pads         a zero pad before convolutions: their own padding
    plain_dropouts         a dropout of probability 0 or not training: its input (no draw)
    hide_eager_gradients   ops whose TorchScript gradient is not eager's (max of a tie,
                           clamp's tensor bounds) hidden from autodiff: eager's autograd
                           runs them
    differentiable_graphs  differentiable nodes gathered into prim::DifferentiableGraphs
                           (graphs of one node too: views may join them)
    restore_eager_gradients  the hidden ops themselves again, outside those graphs
    absorb_views           views between graphs moved in, the graphs they split joined;
                           graphs still below the threshold taken apart

The first two need every shape fixed by the signature (`shapes_fixed`): with a shape made
from values, a profiled size is one call's, not the variant's.

    graph(%x, %w):                                  graph(%x, %w):
      %v = aten::view(%x, [-1, 256])                  %y = prim::DifferentiableGraph_0(%x, %w)
      %m = aten::addmm(%b, %v, %w, 1, 1)     ==>
      %y = aten::view(%m, [1, 128, 768])
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch

from ... import log
from ..fuser.autocast_casts import make_autocast_casts_explicit
from ..rewrites.conv_pads import fold_conv_pads
from ..rewrites.fold_tuples import fold_tuples
from .autodiff_views import absorb_views
from .dropouts import plain_dropouts
from .eager_gradients import hide, restore
from .flat_linear import flat_linears
from .identities import drop_identities
from .promotions import explicit_promotions

_log = log.get_logger(__file__)
Rewrite = Callable[[torch._C.Graph], object]
#: nodes in a differentiable graph, as the profiling executor's default: smaller ones are
#: taken apart (their kernel would be one op, their autograd node pure overhead)
THRESHOLD = 2


def autocast_casts(graph: torch._C.Graph) -> None:
    """Under the live CPU autocast, its casts written out as eager makes them, weights' too,
    as autocast's own cast ops (which autodiff differentiates; `backward_ops` makes them
    `aten::to` in f):

        %y : BFloat16 = aten::linear(%x, %w, %b)
                     ==>
        %x.1 = aten::_autocast_to_reduced_precision(%x, False, True, 5, 15)   (w, b: alike)
        %y = aten::linear(%x.1, %w.1, %b.1)
    """
    make_autocast_casts_explicit(graph, training=True)


def fold_sizes(graph: torch._C.Graph) -> None:
    """Sizes read from the profiled types (the variant's key fixes them) as constants, and
    what they decide folded."""
    torch._C._jit_pass_peephole(graph, False)
    torch._C._jit_pass_constant_propagation(graph)


def differentiable_graphs(graph: torch._C.Graph) -> None:
    """TorchScript's own gathering of differentiable nodes, into graphs of any size."""
    torch._C._jit_pass_create_autodiff_subgraphs(graph, 1)


def rewrites(shapes_fixed: bool) -> list[tuple[str, Rewrite]]:
    """The ordered, named rewrites for a graph whose shapes the signature fixes or not."""
    sized: list[tuple[str, Rewrite]] = [
        ("fold_sizes", fold_sizes),
        ("drop_identities", drop_identities),
    ]
    return [
        ("autocast_casts", autocast_casts),
        ("explicit_promotions", explicit_promotions),
        *(sized if shapes_fixed else []),
        ("fold_tuples", fold_tuples),
        ("flat_linears", flat_linears),
        ("fold_conv_pads", fold_conv_pads),
        ("plain_dropouts", plain_dropouts),
        ("hide_eager_gradients", hide),
        ("differentiable_graphs", differentiable_graphs),
        ("restore_eager_gradients", restore),
        ("absorb_views", partial(absorb_views, threshold=THRESHOLD)),
    ]


def run(graph: torch._C.Graph, shapes_fixed: bool) -> None:
    """Apply `rewrites(shapes_fixed)` to `graph` in place, logging each."""
    _log.debug("Before the training rewrites:\n", graph)
    for name, rewrite in rewrites(shapes_fixed):
        if _log.enabled(log.DEBUG):
            before = str(graph)
            rewrite(graph)
            after = str(graph)
            _log.debug(f"After {name}", " (unchanged)" if after == before else f":\n{after}")
        else:
            rewrite(graph)
