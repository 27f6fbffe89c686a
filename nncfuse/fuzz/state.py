"""state: a random module whose state changes between calls, through nncfuse and eagerly.

`python -m nncfuse.fuzz --backend llvm,state` adds this check to each case
(`oracle.check_state`): from the case's seed, a small `nn.Sequential` of
Linear, Dropout, BatchNorm1d, LayerNorm and activations is built, with a
copy (`copy.deepcopy`) that runs eagerly; between calls, the same random
changes are made to both:

    train()/eval() of the model or of one submodule, grad mode on or off,
    a parameter updated in place (`add_`), a parameter reassigned (a new
    nn.Parameter), an attribute changed (GELU's approximate, LayerNorm's eps,
    Dropout's p)

`--backend state,autocast` also makes each call outside autocast or under bf16 or fp16
autocast (`torch.autocast("cpu", ...)`), compared with eager autocast within
`oracle.AUTOCAST_TOLERANCE` (reduced-precision GEMMs round where eager's kernels do not)
and with the dtypes equal.

and each call's output, and the batch norms' statistics after it, are compared
with eager's (`oracle.compare`), under the same `torch.manual_seed` (dropout's
masks are eager's). Where a call differs by more than `compare` (or, under autocast, its
tolerance) allows, the module as it was before the call runs again in float64, without
autocast (the same masks): the difference is
rounding, not an error, if each tensor is at most `MULTIPLIER` times as far from float64's
(root mean square) as eager's own, the rule PyTorch's benchmarks judge compilers by
(`torch._dynamo.utils.same(fp64_ref=...)`). A batch norm in training mode over a few rows
divides by a small variance and amplifies last-bit differences of what feeds it (under
bfloat16 autocast, a Linear's one-ulp differences become 0.06-0.19 after a batch norm over
2 or 5 rows: seeds 61591, 120325, each as close to float64's as eager autocast's):

    Linear -> LayerNorm -> Dropout -> GELU -> Tanh -> BatchNorm1d, 5 rows
    float32 nncfuse against float32 eager: 4e-5 apart; each as far from float64's

    step 0: call          step 1: eval(); 2.weight = Parameter(...); call   ...
"""

from __future__ import annotations

import copy
import random
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ..testing import rounding_explains

_FEATURES = (4, 8, 16)


def model(rng: random.Random) -> nn.Sequential:
    """A random stack of 2-6 layers over `features` features."""
    f = rng.choice(_FEATURES)
    makers: list[Callable[[], nn.Module]] = [
        lambda: nn.Linear(f, f),
        lambda: nn.Dropout(rng.choice((0.0, 0.25, 0.5))),
        lambda: nn.BatchNorm1d(f),
        lambda: nn.LayerNorm(f, eps=rng.choice((1e-5, 1e-3))),
        lambda: nn.GELU(approximate=rng.choice(("none", "tanh"))),
        lambda: rng.choice((nn.ReLU, nn.Tanh, nn.Sigmoid, nn.SiLU))(),
    ]
    layers = [nn.Linear(f, f)] + [rng.choice(makers)() for _ in range(rng.randint(1, 5))]
    return nn.Sequential(*layers)


def _change(rng: random.Random, pair: tuple[nn.Module, nn.Module]) -> str:
    """Make one random change to both modules of `pair` alike; what it was."""
    m, eager = pair
    names = [name for name, _ in m.named_modules() if name]
    kind = rng.choice(("mode", "submodule_mode", "in_place", "reassign", "attribute", "none"))
    if kind == "mode":
        mode = rng.random() < 0.5
        m.train(mode)
        eager.train(mode)
        return "train()" if mode else "eval()"
    if kind == "submodule_mode":
        name = rng.choice(names)
        mode = not m.get_submodule(name).training
        m.get_submodule(name).train(mode)
        eager.get_submodule(name).train(mode)
        return f"{name}.train({mode})"
    params = [name for name, _ in m.named_parameters()]
    if kind in ("in_place", "reassign") and params:
        name = rng.choice(params)
        owner, attr = name.rsplit(".", 1)
        delta = torch.randn(m.get_parameter(name).shape, generator=torch.Generator().manual_seed(
            rng.randrange(1 << 30)))
        for module in (m, eager):
            p = module.get_parameter(name)
            if kind == "in_place":
                with torch.no_grad():
                    p.add_(delta, alpha=0.1)
            else:
                setattr(module.get_submodule(owner), attr, nn.Parameter(p.detach() + delta))
        return f"{name} {'+= delta' if kind == 'in_place' else '= Parameter(...)'}"
    if kind == "attribute":
        for name in rng.sample(names, len(names)):
            sub = m.get_submodule(name)
            attr, value = (("approximate", rng.choice(("none", "tanh")))
                           if isinstance(sub, nn.GELU)
                           else ("eps", rng.choice((1e-5, 1e-2))) if isinstance(sub, nn.LayerNorm)
                           else ("p", rng.choice((0.0, 0.5))) if isinstance(sub, nn.Dropout)
                           else (None, None))
            if attr is not None:
                setattr(sub, attr, value)
                setattr(eager.get_submodule(name), attr, value)
                return f"{name}.{attr} = {value!r}"
    return "call"


def _float64(module: nn.Module, x: torch.Tensor, step: int, grad: bool) -> tuple[Any, ...]:
    """`module` (a copy of eager's before the call) called in float64 as the call was made:
    its output and buffers after it."""
    exact = copy.deepcopy(module).double()
    with torch.set_grad_enabled(grad):
        torch.manual_seed(step)
        out = exact(x.double())
    return (out, *(b for _, b in exact.named_buffers()))


#: what `check(autocast=True)` draws for each call: no autocast, or eager's CPU autocast
AUTOCAST = (None, torch.bfloat16, torch.float16)


def check(seed: int, jit: Callable[[nn.Module], Any],
          compare: Callable[[Any, Any], str], steps: int = 8,
          autocast: Callable[[Any, Any], str] | None = None) -> str | None:
    """Run the module of `seed` through `jit` and eagerly over `steps` random changes; the
    first difference, described, or None. With `autocast` (a comparison for reduced-precision
    results), each call runs outside autocast or inside `torch.autocast("cpu", dtype)` for a
    dtype of `AUTOCAST`, drawn from a generator of its own (the changes stay the seed's)."""
    amp = random.Random(seed ^ 0x5A5A)
    drifted = False
    rng = random.Random(seed)
    torch.manual_seed(seed)
    m = model(rng)
    eager = copy.deepcopy(m)
    fused = jit(m)
    x = torch.randn(rng.choice((2, 5)), m[0].in_features,
                    generator=torch.Generator().manual_seed(seed))
    done: list[str] = []
    for step in range(steps):
        if step:
            done.append(_change(rng, (m, eager)))
        grad = rng.random() < 0.3
        dtype = amp.choice(AUTOCAST) if autocast is not None else None
        before = copy.deepcopy(eager)
        with torch.set_grad_enabled(grad), torch.autocast("cpu", dtype=dtype or torch.bfloat16,
                                                          enabled=dtype is not None):
            torch.manual_seed(step)
            got = fused(x)
            torch.manual_seed(step)
            want = eager(x)
        states = [(n, b) for n, b in m.named_buffers()]
        # (Once a call ran under autocast, batch norms' statistics carry its rounding into
        # the calls after it: those are compared as autocast's too.)
        drifted = drifted or dtype is not None
        gots = (got, *(b for _, b in states))
        wants = (want, *(eager.get_buffer(n) for n, _ in states))
        message = (autocast if drifted else compare)(gots, wants)
        if message and isinstance(got, torch.Tensor) and rounding_explains(
                gots, wants, _float64(before, x, step, grad)):
            message = ""
        if message:
            under = f", autocast {dtype}" if dtype is not None else ""
            return f"{m}\nafter {'; '.join(done) or 'nothing'} (grad={grad}{under}): {message}"
    return None
