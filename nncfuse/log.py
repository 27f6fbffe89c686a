"""Stage dumps selected by NNCFUSE_LOG_LEVEL, in the format of PYTORCH_JIT_LOG_LEVEL.

NNCFUSE_LOG_LEVEL is a `:`-separated list of module basenames (`.py`
optional). A bare name enables that module's GRAPH_DUMP messages, `>name`
adds GRAPH_UPDATE, `>>name` adds GRAPH_DEBUG:

    NNCFUSE_LOG_LEVEL="tensorexpr_fuser:>>kernel:>>llvm_codegen"

Each line of a message goes to stderr prefixed like
`[DUMP tensorexpr_fuser.py:123] `. Message parts are only turned into text
when their level is enabled, so pass graphs and statements, not strings.
A name that is no module's warns once (a typo would otherwise log nothing).
"""

from __future__ import annotations

import functools
import os
import sys
import warnings
from pathlib import Path
from typing import Any

DUMP, UPDATE, DEBUG = 1, 2, 3
_NAMES = {DUMP: "DUMP", UPDATE: "UPDATE", DEBUG: "DEBUG"}
ENV = "NNCFUSE_LOG_LEVEL"
_warned: set[str] = set()  # unknown names warned about, once per process each


@functools.cache
def module_names() -> frozenset[str]:
    """The basenames of nncfuse's modules: the names NNCFUSE_LOG_LEVEL selects."""
    root = Path(__file__).resolve().parent
    return frozenset(p.stem for p in root.rglob("*.py") if not p.stem.startswith("__"))


@functools.lru_cache(maxsize=8)
def _parse(spec: str) -> dict[str, int]:
    levels: dict[str, int] = {}
    for item in spec.split(":"):
        item = item.strip()
        depth = len(item) - len(item.lstrip(">"))
        name = item.lstrip(">").strip()
        if name.endswith(".py"):
            name = name[:-3]
        if name:
            levels[name] = max(levels.get(name, 0), DUMP + min(depth, 2))
    for name in sorted(set(levels) - module_names() - _warned):
        _warned.add(name)
        warnings.warn(f"{ENV}: no nncfuse module is named {name!r}; the names are: "
                      f"{', '.join(sorted(module_names()))}", stacklevel=2)
    return levels


class Logger:
    """The log of one module, named by its file's basename."""

    def __init__(self, path: str):
        base = os.path.basename(path)
        self.module = base[:-3] if base.endswith(".py") else base
        self.file = self.module + ".py"

    def enabled(self, level: int) -> bool:
        spec = os.environ.get(ENV)
        return bool(spec) and _parse(spec).get(self.module, 0) >= level

    def _emit(self, level: int, parts: tuple[Any, ...]) -> None:
        if not self.enabled(level):
            return
        line = sys._getframe(2).f_lineno
        prefix = f"[{_NAMES[level]} {self.file}:{line}] "
        text = "".join(str(p) for p in parts)
        out = "\n".join(prefix + row for row in text.rstrip("\n").split("\n"))
        print(out, file=sys.stderr, flush=True)

    def dump(self, *parts: Any) -> None:
        self._emit(DUMP, parts)

    def update(self, *parts: Any) -> None:
        self._emit(UPDATE, parts)

    def debug(self, *parts: Any) -> None:
        self._emit(DEBUG, parts)


def get_logger(path: str) -> Logger:
    """The logger for the module at `path` (pass `__file__`)."""
    return Logger(path)
