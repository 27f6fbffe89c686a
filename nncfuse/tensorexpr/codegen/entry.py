"""Entry points: a small Python function per kernel call site, generated as source.

Calling a kernel means: pick its inputs out of the caller's arguments, run
the run-time checks, allocate the outputs (shapes, strides and dtypes are
fixed per kernel), pass pointers and numbers to the machine code, and return
the outputs the way the caller wants them. Spelled out as straight-line code
with everything constant baked in, that costs a microsecond or two, a fraction
of eager PyTorch's dispatch per op:

    def entry(args):
        a0 = args[0]
        o0 = empty_strided((16,), (1,), float32)
        cfunc(a0.data_ptr(), o0.data_ptr())
        return o0

The kernel side says how it is called (`KernelInterface`: its parameters,
outputs and checks); the caller says where the inputs come from (`Source`s)
and what to return (`Returns`). Each is a small frozen dataclass, matched by
type when the code is generated.
"""

from __future__ import annotations

import ctypes
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from .. import expr as E
from ..meta import TensorMeta

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


# -- where the kernel's inputs come from ------------------------------------------


@dataclass(frozen=True)
class ArgSource:
    """The kernel input is the caller's argument `index`."""

    index: int


@dataclass(frozen=True, eq=False)
class ConstSource:
    """The kernel input is `value`, fixed when the entry is made (a graph constant)."""

    value: Any


Source = ArgSource | ConstSource


# -- the kernel's parameters, in the order the machine code takes them --------------


@dataclass(frozen=True)
class TensorParam:
    """Kernel input `position`, a tensor: passed as its data pointer."""

    position: int


@dataclass(frozen=True)
class NumberParam:
    """Kernel input `position`, a Python number: passed as itself."""

    position: int


@dataclass(frozen=True, eq=False)
class ConstParam:
    """A tensor constant the graph captured: passed as its data pointer."""

    tensor: torch.Tensor


@dataclass(frozen=True)
class OutputParam:
    """An output buffer, allocated fresh on every call with this metadata; in a dynamic
    kernel with sizes `dims`, expressions of the size symbols (row-major)."""

    meta: TensorMeta
    dims: tuple[E.Expr, ...] | None = None
    strides: tuple[E.Expr, ...] | None = None  # where not row-major


#: a size of a dynamic kernel: an int, or an expression of its size symbols
Size = int | E.Expr


@dataclass(frozen=True)
class SizeSymbol:
    """Size symbol `var`: dim `dim` of kernel input `position`, read when the kernel runs
    (made by `size_symbols`)."""

    var: E.Var
    position: int
    dim: int
    #: the least size the kernel is valid for (a cat's part along a dim of symbolic lengths
    #: is read at an index clamped into it: 1; `x[..., -2:]` is 2 long from 2): below, the
    #: fallback runs, even where the guard is the caller's (a size class has no such bound)
    minimum: int = 0


@dataclass(frozen=True)
class InputGuard:
    """What a dynamic kernel relies on about tensor input `position`: per dim, its size (1
    or a symbol) and its stride (an expression of the symbols; checked where the size is
    above 1)."""

    position: int
    sizes: tuple[Size, ...]
    strides: tuple[Size, ...]
    dtype: torch.dtype
    requires_grad: bool


@dataclass(frozen=True)
class SizeParam:
    """A size symbol of a dynamic kernel (`size_symbols`): passed as the int it is bound to."""

    name: str


Param = TensorParam | NumberParam | ConstParam | OutputParam | SizeParam


# -- what the kernel returns, and what the entry returns ----------------------------


@dataclass(frozen=True)
class BufOutput:
    """A kernel output written to output buffer `number` (the n-th `OutputParam`)."""

    number: int


@dataclass(frozen=True)
class InputOutput:
    """A kernel output that is kernel input `index` itself (the graph returns an input)."""

    index: int


KernelOutput = BufOutput | InputOutput


@dataclass(frozen=True)
class ReturnList:
    """The entry returns all kernel outputs, as a list."""


@dataclass(frozen=True)
class ReturnOne:
    """The entry returns kernel output `index` alone."""

    index: int


@dataclass(frozen=True)
class ReturnTuple:
    """The entry returns a tuple of the kernel outputs at `indices`, in that order."""

    indices: tuple[int, ...]


Returns = ReturnList | ReturnOne | ReturnTuple


@dataclass(frozen=True)
class ArgCheck:
    """Before the call: raise `RuntimeError(message)` unless `holds(input)` for kernel
    input `position`."""

    position: int
    holds: Callable[[Any], bool]
    message: str


@dataclass(frozen=True, eq=False)
class ExternalStep:
    """Before the call: kernel input `position` is `fn(*args)`, a library routine (GEMM,
    convolution) on earlier kernel inputs (`ArgSource`) and constants (`ConstSource`)."""

    position: int
    fn: Callable[..., Any]
    args: tuple[Source, ...]


@dataclass(frozen=True)
class KernelInterface:
    """How a compiled kernel is called, whoever calls it.

    params:  the kernel's parameters in order;
    outputs: per kernel output, where it is;
    checks:  what is checked on the inputs before the call;
    written: the inputs the kernel stores into: when one of them overlaps another tensor
             input in memory, the entry calls `fallback` (the unfused graph) instead;
    externals: library calls made before the kernel's, whose results it reads;
    cfunc:   the machine code, called with pointers and numbers; or `run`, the
             interpreter, called with the list of tensors and numbers.
    """

    params: tuple[Param, ...]
    outputs: tuple[KernelOutput, ...]
    checks: tuple[ArgCheck, ...] = ()
    cfunc: Callable[..., Any] | None = None
    run: Callable[[list[Any]], None] | None = None
    written: tuple[int, ...] = ()  # kernel inputs the kernel stores into (`written`)
    #: the unfused graph: when a written input overlaps another, or the guard refuses
    fallback: Callable[[list[Any]], list[Any]] | None = None
    externals: tuple[ExternalStep, ...] = ()
    symbols: tuple[SizeSymbol, ...] = ()  # a dynamic kernel's sizes, read from its inputs
    guards: tuple[InputGuard, ...] = ()  # checked first; `fallback` runs otherwise
    #: sizes a dynamic kernel takes as equal (a cat's length, a symbol): else `fallback`
    equal: tuple[tuple[E.Expr, E.Expr], ...] = ()
    #: a dynamic kernel's `cfunc` that keeps the GIL (cheaper to call), and when to call
    #: `cfunc` instead: a bool of the size symbols (much work, or parallel loops)
    quick: tuple[Callable[..., Any], E.Expr] | None = None


def _empty_strided() -> Callable[..., torch.Tensor]:
    """`empty_strided(sizes, strides, dtype)` of a CPU tensor: the allocator called at once,
    as Inductor's CPU code allocates (0.44 us, against 0.89 through the dispatcher; a
    tensor made under inference mode is an inference tensor all the same), or
    `torch.empty_strided` where this torch has no such function."""
    try:
        from torch._C._dynamo.guards import _empty_strided_cpu

        return _empty_strided_cpu
    except ImportError:
        return lambda sizes, strides, dtype: torch.empty_strided(sizes, strides, dtype=dtype)


EMPTY_STRIDED = _empty_strided()  # looked up once, not per generated entry


class _Code:
    """The lines of the generated function, and the objects its names refer to."""

    def __init__(self) -> None:
        self.lines = ["def entry(args):"]
        self.env: dict[str, Any] = {
            "empty_strided": EMPTY_STRIDED, "empty": torch.empty, "Tensor": torch.Tensor}

    def line(self, text: str) -> None:
        self.lines.append("    " + text)

    def bind(self, name: str, value: Any) -> str:
        self.env[name] = value
        return name


def make_entry(
    kernel: KernelInterface, sources: Sequence[Source], returns: Returns,
    overlap_guarded: bool = False, size_guarded: bool = False,
) -> Callable[[Sequence[Any]], Any]:
    """Generate `entry(args)` for one way of calling `kernel`: its k-th input comes from
    `sources[k]`, and it returns `returns`. `overlap_guarded`: the caller already sends
    calls whose written inputs overlap another elsewhere (the plan's guard), so the entry
    does not check again. `size_guarded`: likewise for a dynamic kernel's guard (the
    caller's signatures imply it), so the entry only binds the size symbols."""
    code = _Code()
    _bind_inputs(code, sources)
    _bind_symbols(code, kernel, len(sources), returns, size_guarded)
    _argument_checks(code, kernel.checks)
    if not overlap_guarded:
        _overlap_check(code, kernel, len(sources), returns)
    _externals(code, kernel.externals)
    arguments = _arguments(code, kernel.params)
    _call(code, kernel, arguments)
    _return(code, _results(kernel.outputs), returns)
    source = "\n".join(code.lines) + "\n"
    exec(compile(source, "<nncfuse entry>", "exec"), code.env)  # noqa: S102 - generated above
    entry = code.env["entry"]
    entry.source = source
    return entry


def _bind_inputs(code: _Code, sources: Sequence[Source]) -> None:
    """`a<k>` is kernel input k: an argument of the caller, or a constant."""
    for k, source in enumerate(sources):
        match source:
            case ArgSource(index):
                code.line(f"a{k} = args[{index}]")
            case ConstSource(value):
                code.line(f"a{k} = {code.bind(f'c{k}', value)}")


def _argument_checks(code: _Code, checks: Sequence[ArgCheck]) -> None:
    """Raise as eager would on inputs the kernel must not see (e.g. a zero divisor)."""
    for j, check in enumerate(checks):
        code.bind(f"h{j}", check.holds)
        code.bind(f"m{j}", check.message)
        code.line(f"if not h{j}(a{check.position}):")
        code.line(f"    raise RuntimeError(m{j})")


def _externals(code: _Code, steps: Sequence[ExternalStep]) -> None:
    """`a<position> = x<j>(...)`: each library call, on kernel inputs and constants."""
    for j, step in enumerate(steps):
        args = []
        for i, arg in enumerate(step.args):
            match arg:
                case ArgSource(index):
                    args.append(f"a{index}")
                case ConstSource(value):
                    args.append(code.bind(f"x{j}_{i}", value))
        code.line(f"a{step.position} = {code.bind(f'x{j}', step.fn)}({', '.join(args)})")


def _arguments(code: _Code, params: Sequence[Param]) -> list[str]:
    """The name of each parameter's value; output buffers `o<n>` are allocated here."""
    names: list[str] = []
    n_out = 0
    for j, param in enumerate(params):
        match param:
            case TensorParam(position) | NumberParam(position):
                names.append(f"a{position}")
            case ConstParam(tensor):
                names.append(code.bind(f"t{j}", tensor))
            case OutputParam(meta, dims, strides):
                names.append(_allocate(code, n_out, meta, dims, strides))
                n_out += 1
            case SizeParam(name):
                names.append(name)
    return names


def _allocate(
    code: _Code, n: int, meta: TensorMeta, dims: tuple[E.Expr, ...] | None,
    strides: tuple[E.Expr, ...] | None,
) -> str:
    """Allocate output buffer `o<n>`, in huge pages when it is large; return its name."""
    name = f"o{n}"
    dtype = code.bind(f"dt{n}", meta.dtype)
    if dims is not None:  # symbolic, laid out as eager lays out outputs of that layout class
        sizes = "".join(f"{python(d)}, " for d in dims)
        if strides is None:  # row-major as torch computes it: empty dims count as 1
            steps, acc = [], "1"
            for d in reversed(dims):
                steps.append(acc)
                factor = str(max(d.value, 1)) if isinstance(d, E.Imm) else f"max({python(d)}, 1)"
                acc = factor if acc == "1" else f"{acc} * {factor}"
            shown = "".join(f"{s}, " for s in reversed(steps))  # (`()`: a 0-dim output)
            code.line(f"{name} = empty_strided(({sizes}), ({shown}), {dtype})")
        else:
            steps = "".join(f"{python(s)}, " for s in strides)
            code.line(f"{name} = empty_strided(({sizes}), ({steps}), {dtype})")
        code.bind("huge_pages", huge_pages)
        nbytes = " * ".join([str(meta.dtype.itemsize), *(python(d) for d in dims)])
        code.line(f"if {nbytes} >= {HUGE_PAGE_BYTES}:")
        code.line(f"    huge_pages({name}.data_ptr(), {nbytes})")
        return name
    code.line(f"{name} = empty_strided({meta.sizes}, {meta.strides}, {dtype})")
    if meta.nbytes >= HUGE_PAGE_BYTES:
        code.bind("huge_pages", huge_pages)
        code.line(f"huge_pages({name}.data_ptr(), {meta.nbytes})")
    return name


def _call(code: _Code, kernel: KernelInterface, arguments: Sequence[str]) -> None:
    """Call the machine code with pointers and numbers, or the interpreter with values."""
    if kernel.cfunc is not None:
        pointers = [
            name if isinstance(param, (NumberParam, SizeParam)) else f"{name}.data_ptr()"
            for param, name in zip(kernel.params, arguments)
        ]
        call = f"{code.bind('cfunc', kernel.cfunc)}({', '.join(pointers)})"
        if kernel.quick is None:
            code.line(call)
        else:
            quick, slow_if = kernel.quick
            code.line(f"if {python(slow_if)}:")
            code.line(f"    {call}")
            code.line("else:")
            code.line(f"    {code.bind('quick', quick)}({', '.join(pointers)})")
    elif kernel.run is not None:
        code.line(f"{code.bind('run', kernel.run)}([{', '.join(arguments)}])")


_PY_OPS = {E.Add: "+", E.Sub: "-", E.Mul: "*", E.Div: "//"}


def python(e: E.Expr | int) -> str:
    """A size expression (ints, symbols, + - * //, comparisons) as Python source."""
    if isinstance(e, int):
        return str(e)
    if isinstance(e, E.Imm):
        return str(e.value)
    if isinstance(e, E.Var):
        return e.name
    if isinstance(e, E.Cmp):
        return f"({python(e.a)} {e.op} {python(e.b)})"
    op = _PY_OPS.get(type(e))
    if op is None:
        raise TypeError(f"size expression {e} has no Python form")
    return f"({python(e.a)} {op} {python(e.b)})"  # type: ignore[attr-defined]


def _bind_symbols(
    code: _Code, kernel: KernelInterface, n_inputs: int, returns: Returns, guarded: bool
) -> None:
    """A dynamic kernel's guard (unless `guarded`), then its size symbols: `s<k> =
    a<p>.shape[d]`. Inputs that fail the guard (rank, dims of 1, sizes that must be equal,
    strides) run the fallback."""
    if not kernel.guards:
        return
    empty = [f"{sym.var.name} < {sym.minimum}" for sym in kernel.symbols if sym.minimum > 0]
    empty += [f"{python(a)} != {python(b)}" for a, b in kernel.equal]
    if guarded:
        for sym in kernel.symbols:
            code.line(f"{sym.var.name} = a{sym.position}.shape[{sym.dim}]")
        if empty:  # (a size class does not bound the sizes)
            code.bind("fallback", kernel.fallback)
            code.line(f"if {' or '.join(empty)}:")
            code.line(f"    r = fallback([{', '.join(f'a{k}' for k in range(n_inputs))}])")
            _return(code, [f"r[{j}]" for j in range(len(kernel.outputs))], returns, "    ")
        return
    rank = []
    code.bind("grad_enabled", torch.is_grad_enabled)
    for g in kernel.guards:
        a = f"a{g.position}"
        dtype = code.bind(f"gd{g.position}", g.dtype)
        rank.append(f"not isinstance({a}, Tensor) or {a}.dtype is not {dtype}"
                    f" or not {a}.is_cpu or {a}.dim() != {len(g.sizes)}")
        if not g.requires_grad:
            rank.append(f"({a}.requires_grad and grad_enabled())")
    conds = []
    for g in kernel.guards:
        layout = []  # stride checks: where the size is above 1, of a tensor with elements
        for d, (size, stride) in enumerate(zip(g.sizes, g.strides)):
            here = f"sh{g.position}[{d}]"
            if isinstance(size, int):
                conds.append(f"{here} != {size}")
                if size > 1:
                    layout.append(f"st{g.position}[{d}] != {python(stride)}")
            else:
                conds.append(f"{here} == 1")
                first = next(s for s in kernel.symbols if s.var is size)
                if (first.position, first.dim) != (g.position, d):
                    conds.append(f"{here} != {python(size)}")
                layout.append(f"st{g.position}[{d}] != {python(stride)}")  # not 0, not 1 here
        if layout:
            conds.append(f"(a{g.position}.numel() and ({' or '.join(layout)}))")
    conds += empty
    code.bind("fallback", kernel.fallback)
    names = [f"a{k}" for k in range(n_inputs)]
    for test in (rank, conds):
        if test is conds:
            for g in kernel.guards:
                code.line(f"sh{g.position} = a{g.position}.shape")
                code.line(f"st{g.position} = a{g.position}.stride()")
            for sym in kernel.symbols:
                code.line(f"{sym.var.name} = sh{sym.position}[{sym.dim}]")
        code.line(f"if {' or '.join(test) or 'False'}:")
        code.line(f"    r = fallback([{', '.join(names)}])")
        _return(code, [f"r[{j}]" for j in range(len(kernel.outputs))], returns, "    ")


def _results(outputs: Sequence[KernelOutput]) -> list[str]:
    """The name of each kernel output after the call."""
    results = []
    for output in outputs:
        match output:
            case BufOutput(number):
                results.append(f"o{number}")
            case InputOutput(index):
                results.append(f"a{index}")
    return results


def _return(code: _Code, results: Sequence[str], returns: Returns, indent: str = "") -> None:
    """Return the outputs (`results`, expressions) as the caller wants them."""
    match returns:
        case ReturnList():
            code.line(f"{indent}return [{', '.join(results)}]")
        case ReturnOne(index):
            code.line(f"{indent}return {results[index]}")
        case ReturnTuple(indices):
            code.line(f"{indent}return ({''.join(results[k] + ', ' for k in indices)})")


def _span(t: torch.Tensor) -> tuple[int, int]:
    """The bytes [start, end) that tensor `t`'s elements occupy (empty: (0, 0))."""
    if t.numel() == 0:
        return 0, 0
    low = high = 0
    for size, stride in zip(t.shape, t.stride()):
        if stride < 0:
            low += (size - 1) * stride
        else:
            high += (size - 1) * stride
    start, item = t.data_ptr(), t.element_size()
    return start + low * item, start + (high + 1) * item


def overlaps(written: torch.Tensor, others: Sequence[Any]) -> bool:
    """Whether `written`'s memory range meets that of any tensor among `others`."""
    start, end = _span(written)
    for other in others:
        if isinstance(other, torch.Tensor):
            low, high = _span(other)
            if low < end and start < high:
                return True
    return False


def _overlap_check(code: _Code, kernel: KernelInterface, n_inputs: int, returns: Returns) -> None:
    """When an input the kernel writes overlaps another input, run the fallback instead (the
    kernel's parameters are `noalias`, and its loads and stores meet element for element)."""
    if not kernel.written:
        return
    code.bind("overlaps", overlaps)
    code.bind("fallback", kernel.fallback)
    names = [f"a{k}" for k in range(n_inputs)]
    for k in kernel.written:
        others = ", ".join(n for j, n in enumerate(names) if j != k)
        code.line(f"if overlaps(a{k}, ({others}{',' if others else ''})):")
        code.line(f"    r = fallback([{', '.join(names)}])")
        _return(code, [f"r[{j}]" for j in range(len(kernel.outputs))], returns, "    ")
