"""hooks: the named points where a layer above the jit plugs in, without patching modules.

The jit sits below `nncfuse.explain`, which builds the fusion report from an
optimized graph; yet the jit needs that report at two points. Each point is a
`Hook`, a list of callbacks the jit calls there; the layer above registers
with it when imported (`nncfuse/__init__.py` imports `explain`):

    STRICT_CHECKS   policy, a new optimized plan under strict fusion:
                    `check(plan, failures, options) -> plan`, in order, each
                    given the previous one's plan (explain's returns the plan,
                    or one that raises StrictFusionError)
    GRAPH_REPORTS   fxgraph, a torch.compile graph's new signature in the
                    `>backend` log: `report(graph, options, failures)`, each
                    result printed

    from nncfuse.jit.specialize import hooks
    hooks.STRICT_CHECKS.register(my_check)      # idempotent; unregister() undoes it
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

Callback = Callable[..., Any]


class Hook:
    """A named point and the callbacks registered with it, in registration order."""

    def __init__(self, name: str, doc: str):
        self.name = name
        self.__doc__ = doc
        self._callbacks: tuple[Callback, ...] = ()
        self._lock = threading.Lock()

    def register(self, fn: Callback) -> Callback:
        """Add `fn` (once: registering it again changes nothing); returns it, as a decorator."""
        with self._lock:
            if fn not in self._callbacks:
                self._callbacks = (*self._callbacks, fn)
        return fn

    def unregister(self, fn: Callback) -> None:
        """Remove `fn`, if registered."""
        with self._lock:
            self._callbacks = tuple(c for c in self._callbacks if c is not fn)

    def __iter__(self) -> Iterator[Callback]:
        return iter(self._callbacks)  # a snapshot: registering while calling is safe

    def __bool__(self) -> bool:
        return bool(self._callbacks)

    def __repr__(self) -> str:
        return f"Hook({self.name!r}, {len(self._callbacks)} callback(s))"


STRICT_CHECKS = Hook("strict_checks", "policy: `check(plan, failures, options) -> plan` under "
                     "strict fusion, for each new optimized plan")
GRAPH_REPORTS = Hook("graph_reports", "fxgraph: `report(graph, options, failures)`, logged "
                     "for each new signature of a torch.compile graph")
