"""Entry points: a small Python function per kernel call site, generated as source.

Calling a kernel means: pick its inputs out of the caller's arguments, run
the run-time checks, allocate the outputs (shapes, strides and dtypes are
fixed per kernel), pass pointers and numbers to the machine code, and return
the outputs the way the caller wants them. Spelled out as straight-line code
with everything constant baked in, that costs a microsecond or two, a fraction
of eager PyTorch's dispatch per op:

    def entry(args):
        a0 = args[0]
        o0 = empty_strided((16,), (1,), dtype=float32)
        cfunc(a0.data_ptr(), o0.data_ptr())
        return o0
"""

from __future__ import annotations

import ctypes
import sys
from collections.abc import Callable, Sequence
from typing import Any

import torch

#: Outputs of at least this many bytes ask the kernel for transparent huge pages.
#: A fresh 64 MB output costs 16,384 page faults when first written (about 25 ms
#: here, more than the computation); in 2 MB pages, a third of that.
HUGE_PAGE_BYTES = 4 << 20
_HUGE = 1 << 21
_MADV_HUGEPAGE = 14


def _madvise() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    return fn


_madvise_fn = _madvise()


def huge_pages(address: int, nbytes: int) -> None:
    """Advise transparent huge pages for the whole 2 MB pages inside [address, +nbytes)."""
    start = (address + _HUGE - 1) & ~(_HUGE - 1)
    length = (address + nbytes - start) & ~(_HUGE - 1)
    if _madvise_fn is not None and length > 0:
        _madvise_fn(start, length, _MADV_HUGEPAGE)  # advice only: failure is harmless

Source = tuple[str, Any]  # ("arg", position) or ("const", value)


def make_entry(
    params: Sequence[tuple[str, Any]],
    outputs: Sequence[tuple[str, int]],
    checks: Sequence[tuple[int, Callable[[Any], bool], str]],
    sources: Sequence[Source],
    returns: Any,
    cfunc: Callable[..., Any] | None,
    run: Callable[[list[Any]], None] | None = None,
) -> Callable[[Sequence[Any]], Any]:
    """Generate `entry(args)` for one way of calling a kernel.

    params:  the kernel's parameters in order: ("tensor", k) / ("number", k) for
             its k-th input, ("const", tensor) for a captured tensor constant,
             ("output", meta) for an output buffer (a TensorMeta);
    outputs: per kernel output: ("buf", n) for the n-th output buffer, or
             ("input", k) when the graph returns its k-th input itself;
    checks:  (input k, holds, message): raise RuntimeError(message) unless holds(input k);
    sources: where the kernel's k-th input comes from in `args`;
    returns: "list" (all outputs), an output index, or a tuple of indices;
    cfunc:   the machine code, called with pointers and numbers; or `run`, the
             interpreter, called with the list of tensors and numbers.
    """
    env: dict[str, Any] = {"empty_strided": torch.empty_strided, "Tensor": torch.Tensor}
    lines = ["def entry(args):"]
    for k, (kind, value) in enumerate(sources):
        if kind == "arg":
            lines.append(f"    a{k} = args[{value}]")
        else:
            env[f"c{k}"] = value
            lines.append(f"    a{k} = c{k}")
    for j, (k, holds, message) in enumerate(checks):
        env[f"h{j}"], env[f"m{j}"] = holds, message
        lines.append(f"    if not h{j}(a{k}):")
        lines.append(f"        raise RuntimeError(m{j})")
    tensors: list[str] = []  # what the interpreter gets
    pointers: list[str] = []  # what the machine code gets
    n_out = 0
    for j, (kind, value) in enumerate(params):
        if kind in ("tensor", "number"):
            name = f"a{value}"
        elif kind == "const":
            name = f"t{j}"
            env[name] = value
        else:
            name = f"o{n_out}"
            env[f"dt{n_out}"] = value.dtype
            lines.append(
                f"    {name} = empty_strided({tuple(value.sizes)}, {tuple(value.strides)}, "
                f"dtype=dt{n_out})"
            )
            if value.nbytes >= HUGE_PAGE_BYTES:
                env["huge_pages"] = huge_pages
                lines.append(f"    huge_pages({name}.data_ptr(), {value.nbytes})")
            n_out += 1
        tensors.append(name)
        pointers.append(name if kind == "number" else f"{name}.data_ptr()")
    if cfunc is not None:
        env["cfunc"] = cfunc
        lines.append(f"    cfunc({', '.join(pointers)})")
    else:
        env["run"] = run
        lines.append(f"    run([{', '.join(tensors)}])")
    results = [f"o{v}" if kind == "buf" else f"a{v}" for kind, v in outputs]
    if returns == "list":
        lines.append(f"    return [{', '.join(results)}]")
    elif isinstance(returns, tuple):
        lines.append(f"    return ({''.join(results[k] + ', ' for k in returns)})")
    else:
        lines.append(f"    return {results[returns]}")
    source = "\n".join(lines) + "\n"
    exec(compile(source, "<nncfuse entry>", "exec"), env)  # noqa: S102 - generated above
    entry = env["entry"]
    entry.source = source
    return entry
