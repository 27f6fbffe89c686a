"""Statement nodes of the loop IR.

A kernel body is one `Stmt`: loop nests (`For`) over `Store`s of expressions
into buffers, `Let` bindings that name a value once per iteration,
`Allocate`/`Free` around temporaries, and `ExternalCall`s of library routines
(GEMM, convolution) into a buffer. Statements are immutable; passes build
new trees.
"""

from __future__ import annotations

from dataclasses import dataclass

from .buffer import Buf
from .dtype import INDEX
from .expr import PRINTERS, Expr, Var, _access_lanes, _check_access


class Stmt:
    """Base class of statements."""

    def __str__(self) -> str:
        return PRINTERS["stmt"](self)


@dataclass(frozen=True)
class Store(Stmt):
    """`buf[indices] = value`; vector indices store one element per lane."""

    buf: Buf
    indices: tuple[Expr, ...]
    value: Expr

    def __post_init__(self) -> None:
        _check_access(self.buf, self.indices)
        lanes = _access_lanes(self.indices)
        if self.value.dtype != self.buf.dtype.with_lanes(lanes):
            raise TypeError(
                f"storing {self.value.dtype} into {self.buf.name} of {self.buf.dtype} x {lanes}"
            )


@dataclass(frozen=True)
class Let(Stmt):
    """Binds `var` to `value` for the statements that follow it in the enclosing Block."""

    var: Var
    value: Expr

    def __post_init__(self) -> None:
        if self.var.dtype != self.value.dtype:
            raise TypeError(f"Let {self.var.name}: {self.var.dtype} bound to {self.value.dtype}")


@dataclass(frozen=True)
class Block(Stmt):
    """Statements run in order."""

    stmts: tuple[Stmt, ...]

    @staticmethod
    def make(*stmts: Stmt) -> Block:
        """A Block of `stmts`, splicing in the contents of nested Blocks that hold no Let."""
        out: list[Stmt] = []
        for s in stmts:
            if isinstance(s, Block) and not any(isinstance(c, Let) for c in s.stmts):
                out.extend(s.stmts)
            else:
                out.append(s)
        return Block(tuple(out))


@dataclass(frozen=True)
class For(Stmt):
    """`for (var = start; var < stop; var++) body`; `parallel` runs iterations on threads,
    only when `parallel_if` (a bool of size symbols, in a dynamic kernel) holds, if set."""

    var: Var
    start: Expr
    stop: Expr
    body: Stmt
    parallel: bool = False
    parallel_if: Expr | None = None

    def __post_init__(self) -> None:
        for e in (self.var, self.start, self.stop):
            if e.dtype != INDEX:
                raise TypeError(f"loop bounds and variables are {INDEX}, got {e.dtype}")


@dataclass(frozen=True)
class Allocate(Stmt):
    """Reserves memory for a temporary buffer until the matching `Free`."""

    buf: Buf


@dataclass(frozen=True)
class Free(Stmt):
    """Releases a buffer reserved by `Allocate`."""

    buf: Buf


@dataclass(frozen=True)
class ExternalCall(Stmt):
    """`buf = fn(*args)`: a library routine torch exports (`external.ROUTINES[fn]`) computes
    all of `buf`, a buffer the kernel owns. `args` are the routine's operands in order:
    buffers for tensors, Python constants (numbers, lists, strings, None) for the rest.
    Printed as NNC does: `ExternalCall(aten_linear, "nnc_aten_linear", {x, w, b}, {})`.
    """

    buf: Buf
    fn: str
    args: tuple[object, ...]

    @property
    def bufs(self) -> tuple[Buf, ...]:
        """The buffers the routine reads."""
        return tuple(a for a in self.args if isinstance(a, Buf))

    @property
    def consts(self) -> tuple[object, ...]:
        """The operands that are no buffers."""
        return tuple(a for a in self.args if not isinstance(a, Buf))
