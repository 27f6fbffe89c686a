"""Scripting a Python function with its parameters typed by the values it is called with.

TorchScript types a parameter without an annotation as `Tensor`, so a plain
function called eagerly as `f(x, 2.0)` or `f(x, None)` cannot be scripted as
written: the call fails, or `y is None` is folded to False. Eager Python
ignores annotations; the values decide. So nncfuse scripts one variant of the
function per pattern of argument types, annotating each parameter with its
value's type (`float`, `int`, `bool`, `str`, `None`, `Tensor`, `torch.dtype`,
`torch.device`, and lists, tuples and dicts of those), and keeping the
declared annotation where a value has no TorchScript type it can name.

    def f(x, s, y=None):            f(x, 2.0)  ->  f(x: Tensor, s: float, y: None)
        ...                         f(x, 2, t) ->  f(x: Tensor, s: int, y: Tensor)

`pattern(values)` gives the annotations for one call; `script(fn, pattern)`
compiles that variant, as `torch.jit.script` compiles a function, from an
edited copy of its parsed source.
"""

from __future__ import annotations

import ast
import inspect
import itertools
import threading
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch._jit_internal import createResolutionCallbackFromClosure
from torch._sources import parse_def
from torch.jit._script import get_default_args
from torch.jit.annotations import get_type_line
from torch.jit.frontend import build_def

Pattern = tuple[str | None, ...]

_SCALARS = {bool: "bool", int: "int", float: "float", str: "str"}
_variant_ids = itertools.count()

#: Held while nncfuse scripts anything. TorchScript's compiler is not safe to enter from two
#: threads: it defines functions in one process-wide compilation unit, and calls back into
#: Python (name resolution), where the interpreter may switch threads.
compile_lock = threading.RLock()


def annotation(value: Any) -> str | None:
    """The TorchScript annotation naming `value`'s type, or None if there is none to name."""
    if isinstance(value, torch.Tensor):
        return "Tensor"
    if value is None:
        return "None"
    if type(value) in _SCALARS:
        return _SCALARS[type(value)]
    if isinstance(value, (torch.dtype, torch.device)):
        return f"torch.{type(value).__name__}"
    if type(value) in (list, tuple) and value:
        items = [annotation(v) for v in value]
        if None in items:
            return None
        if type(value) is tuple:
            return f"Tuple[{', '.join(items)}]"  # type: ignore[arg-type]
        return f"List[{items[0]}]" if len(set(items)) == 1 else None
    if type(value) is dict and value:
        keys = {annotation(k) for k in value}
        items = {annotation(v) for v in value.values()}
        if len(keys) == 1 == len(items) and None not in keys | items:
            return f"Dict[{keys.pop()}, {items.pop()}]"
    return None


def parameters(fn: Callable[..., Any]) -> list[inspect.Parameter] | None:
    """A Python function's parameters if all can be passed by position (what variants
    support), else None (methods, partials, callable objects, varargs, keyword-only)."""
    if not inspect.isfunction(fn):
        return None
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return None
    if any(p.kind is not inspect.Parameter.POSITIONAL_OR_KEYWORD for p in params):
        return None
    return params


def pattern(values: tuple[Any, ...]) -> Pattern:
    return tuple(annotation(v) for v in values)


#: Each function's variants scripted so far, by pattern, while the function lives. TorchScript
#: keeps every function it compiles in its process-wide compilation unit, forever (~10 KB
#: each): a function wrapped again (`nncfuse.jit(f)` per request) reuses its variants, as
#: `torch.jit.script` reuses its one script of a function. Under `compile_lock`.
_scripts: weakref.WeakKeyDictionary[Callable[..., Any], dict[Pattern, Any]] = (
    weakref.WeakKeyDictionary())


def script(fn: Callable[..., Any], types: Pattern) -> torch.jit.ScriptFunction:
    """`fn` scripted with parameter k annotated as `types[k]` (None: as declared); once per
    function and pattern. Under `compile_lock`."""
    variants = _scripts.setdefault(fn, {})
    scripted = variants.get(types)
    if scripted is None:
        scripted = variants[types] = _script(fn, types)
    return scripted


def _script(fn: Callable[..., Any], types: Pattern) -> torch.jit.ScriptFunction:
    parsed = parse_def(fn)
    fn_def = parsed.ast.body[0]
    for arg, text in zip(fn_def.args.args, types):
        if text is not None:
            arg.annotation = _located(ast.parse(text, mode="eval").body, arg)
    tree = build_def(parsed.ctx, fn_def, get_type_line(parsed.source), fn.__name__)
    # The last component of the name must be the def's; the prefix keeps variants apart.
    name = f"__nncfuse__.variant{next(_variant_ids)}.{fn.__name__}"
    return torch._C._jit_script_compile(
        name, tree, createResolutionCallbackFromClosure(fn), get_default_args(fn)
    )


def _located(expr: ast.expr, where: ast.arg) -> ast.expr:
    """`expr` with every node placed at `where` (TorchScript reports errors by position)."""
    for node in ast.walk(expr):
        for field in ("lineno", "col_offset", "end_lineno", "end_col_offset"):
            if field in node._attributes:
                setattr(node, field, getattr(where, field))
    return expr


def accepts(arguments: list[Any], values: tuple[Any, ...]) -> bool:
    """Whether `values` have the types of a schema's `arguments`, exactly (no conversions)."""
    for arg, value in zip(arguments, values):
        inferred = torch._C._jit_try_infer_type(value)
        if not inferred.success() or not inferred.type().isSubtypeOf(arg.type):
            return False
    return True
