"""dropouts: a dropout that eager returns its input from, as its input.

ATen's `_dropout_impl` returns its input itself where the probability is 0 or `train` is
False, and draws no random numbers. A traced model in training mode with dropout 0 has
such dropouts; under AOTAutograd's tracing each became `native_dropout` (a bool mask of ones
saved by the forward, and in the backward its cast, a multiply by the scale and a copy of
the gradient), and TorchScript's autodiff differentiates each as `bernoulli_(1 - p)` times
its input, which draws a number per element: every later dropout's mask was then not
eager's. Where both are constants that say so, the dropout goes:

    %y = aten::dropout(%x, 0., True)            ==>   (uses of %y use %x)
    %y = aten::dropout(%x, 0.5, False)          ==>   (uses of %y use %x)
"""

from __future__ import annotations

import torch

__all__ = ["DROPOUTS", "plain_dropouts"]

#: dropouts that return their input itself at p == 0 or train=False (ATen's `_dropout_impl`)
DROPOUTS = ("aten::dropout", "aten::feature_dropout", "aten::alpha_dropout",
            "aten::feature_alpha_dropout")


def plain_dropouts(graph: torch._C.Graph) -> int:
    """Replace, in place, the dropouts of `graph` whose probability is a constant 0 or whose
    `train` is a constant False by their input; the count replaced."""
    done = 0
    for node in [n for kind in DROPOUTS for n in graph.findAllNodes(kind)]:
        x, p, train = node.inputs()
        if p.node().kind() != "prim::Constant" or train.node().kind() != "prim::Constant":
            continue
        if p.toIValue() != 0 and train.toIValue() is not False:
            continue
        node.output().replaceAllUsesWith(x)
        node.destroy()
        done += 1
    return done
