"""collector: Python's cyclic garbage collector paused while nncfuse traces and compiles.

Tracing (AOTAutograd) and compiling (the fuser, lowering, passes, llvmlite's IR) make and
drop millions of short-lived objects. Their allocations set off collections: young ones,
and, as survivors pile up in the old generation, full ones, each a walk over every object
of the process (a model's process: 150-300 ms each; MobileNetV2's first training step,
--quick, ran four, 1.2 s of its 13.8 s). Reference counting frees what compiling drops
(IR trees are acyclic); what forms cycles waits for the first collection after the pause.

    with collector.paused():       # nested and from several threads: the collector is
        ...                        # enabled again when the last one leaves, if it was

As PyTorch's `distributed.checkpoint` does around a state dict; a collector the program
disabled stays disabled.
"""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Iterator

__all__ = ["paused"]

_lock = threading.Lock()
_depth = 0  # callers inside `paused`, over all threads
_enable = False  # whether the last one to leave enables the collector again


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """No automatic garbage collection inside (`gc.collect()` still collects)."""
    global _depth, _enable
    with _lock:
        if _depth == 0:
            _enable = gc.isenabled()
            gc.disable()
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _enable:
                gc.enable()
