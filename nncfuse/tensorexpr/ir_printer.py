"""C-like text for IR trees, in the format of NNC's dumps.

    {
      for (int64_t i = 0; i < 1024; i++) {
        float<16> v = t0[Ramp(16 * i, 1, 16)];
        aten_mul[Ramp(16 * i, 1, 16)] = sin(v * v) * sin(v * v);
      }
    }

Variables and buffers are named by their `name`; distinct objects with the
same name are told apart by a suffix (`i`, `i_1`, ...) in order of appearance.
Operators print as their `ops` row spells them, with the fewest parentheses
C precedence allows.
"""

from __future__ import annotations

import math
import re
from typing import Any

import numpy as np

from . import expr as E
from . import ops
from . import stmt as S
from .buffer import Buf
from .ir_visitor import Visitor

_NUMPY_FLOATS = ("float16", "float32")
_ATOM = ops.CALL


class _Names:
    """Assigns each Var/Buf object a unique printable name."""

    def __init__(self) -> None:
        self.names: dict[int, str] = {}
        self.used: set[str] = set()
        self.keep: list[object] = []  # keeps ids valid while printing

    def get(self, obj: E.Var | Buf) -> str:
        key = id(obj.root if isinstance(obj, Buf) else obj)
        name = self.names.get(key)
        if name is None:
            base = re.sub(r"\W", "_", obj.name) or "v"
            name, n = base, 0
            while name in self.used:
                n += 1
                name = f"{base}_{n}"
            self.names[key] = name
            self.used.add(name)
            self.keep.append(obj)
        return name


def _imm(e: E.Imm) -> str:
    v, dt = e.value, e.dtype
    if dt.is_bool:
        return "true" if v else "false"
    if dt.is_int:
        return str(v) if dt.name == "int64" else f"{dt.c_name()}({v})"
    assert isinstance(v, float)
    if math.isnan(v):
        text = "NAN"
    elif math.isinf(v):
        text = "INFINITY" if v > 0 else "-INFINITY"
    else:
        # Shortest text that reads back to the same value of this dtype.
        text = str(np.dtype(dt.name).type(v)) if dt.name in _NUMPY_FLOATS else repr(v)
        if text.endswith(".0"):
            text = text[:-1]
    if dt.name == "float32":
        return text + "f" if text[-1].isdigit() or text.endswith(".") else text
    return text if dt.name == "float64" else f"{dt.c_name()}({text})"


class IRPrinter(Visitor):
    """Prints expressions and statements; one instance names things consistently.

    Visiting an expression gives its text and C precedence, a statement its lines.
    """

    def __init__(self) -> None:
        self.names = _Names()
        self.indent = 0

    def generic_visit(self, node: E.Expr | S.Stmt) -> Any:
        raise TypeError(f"cannot print {type(node).__name__}")

    # -- expressions --------------------------------------------------------
    def expr(self, e: E.Expr, parent_precedence: int = 0) -> str:
        text, precedence = self.visit(e)
        return f"({text})" if precedence < parent_precedence else text

    def _operator(self, row: ops.Op, args: tuple[E.Expr, ...]) -> tuple[str, int]:
        if row.infix:
            # Left-associative: an equal-precedence right operand needs parentheses.
            p = row.precedence
            a, b = args
            return f"{self.expr(a, p)} {row.symbol} {self.expr(b, p + 1)}", p
        return f"{row.symbol}({', '.join(self.expr(a) for a in args)})", _ATOM

    def visit_BinaryOp(self, e: E.BinaryOp) -> tuple[str, int]:
        return self._operator(e.row, (e.a, e.b))

    def visit_Cmp(self, e: E.Cmp) -> tuple[str, int]:
        return self._operator(e.row, (e.a, e.b))

    def visit_Call(self, e: E.Call) -> tuple[str, int]:
        return self._operator(e.row, e.args)

    def visit_Select(self, e: E.Select) -> tuple[str, int]:
        return (
            f"{self.expr(e.cond, 2)} ? {self.expr(e.true_value, 2)} : "
            f"{self.expr(e.false_value, 1)}",
            1,
        )

    def visit_Imm(self, e: E.Imm) -> tuple[str, int]:
        return _imm(e), _ATOM

    def visit_Var(self, e: E.Var) -> tuple[str, int]:
        return self.names.get(e), _ATOM

    def visit_Cast(self, e: E.Cast) -> tuple[str, int]:
        return f"{e.dtype.c_name()}({self.expr(e.value)})", _ATOM

    def visit_Bitcast(self, e: E.Bitcast) -> tuple[str, int]:
        return f"bitcast<{e.dtype.c_name()}>({self.expr(e.value)})", _ATOM

    def visit_Ramp(self, e: E.Ramp) -> tuple[str, int]:
        return f"Ramp({self.expr(e.base)}, {self.expr(e.stride)}, {e.lanes})", _ATOM

    def visit_Broadcast(self, e: E.Broadcast) -> tuple[str, int]:
        return f"Broadcast({self.expr(e.value)}, {e.lanes})", _ATOM

    def visit_Reduce(self, e: E.Reduce) -> tuple[str, int]:
        # reduce_add(0.f, t0[8 * i + r] for r < 8, k < 4): the init, then the body over the box.
        axes = ", ".join(f"{self.names.get(v)} < {self.expr(s)}" for v, s in zip(e.vars, e.stops))
        name = f"reduce_{e.op.lower()}"
        return f"{name}({self.expr(e.init)}, {self.expr(e.body)} for {axes})", _ATOM

    def visit_LaneReduce(self, e: E.LaneReduce) -> tuple[str, int]:
        return f"lanes_{e.op.lower()}({self.expr(e.value)})", _ATOM

    def visit_Load(self, e: E.Load) -> tuple[str, int]:
        return f"{self.names.get(e.buf)}[{self._indices(e.indices)}]", _ATOM

    def _indices(self, indices: tuple[E.Expr, ...]) -> str:
        return ", ".join(self.expr(i) for i in indices)

    # -- statements ---------------------------------------------------------
    def stmt(self, s: S.Stmt, indent: int = 0) -> list[str]:
        outer, self.indent = self.indent, indent
        try:
            return self.visit(s)
        finally:
            self.indent = outer

    def _body(self, stmts: tuple[S.Stmt, ...]) -> list[str]:
        lines: list[str] = []
        for child in stmts:
            lines += self.stmt(child, self.indent + 1)
        return lines

    def visit_Block(self, s: S.Block) -> list[str]:
        pad = "  " * self.indent
        return [pad + "{", *self._body(s.stmts), pad + "}"]

    def visit_For(self, s: S.For) -> list[str]:
        pad = "  " * self.indent
        v = self.names.get(s.var)
        note = " /* parallel */" if s.parallel else ""
        if s.parallel and s.parallel_if is not None:
            note = f" /* parallel if {self.expr(s.parallel_if)} */"
        head = (
            f"{pad}for ({s.var.dtype.c_name()} {v} = {self.expr(s.start)}; "
            f"{v} < {self.expr(s.stop)}; {v}++){note} {{"
        )
        body = s.body.stmts if isinstance(s.body, S.Block) else (s.body,)
        return [head, *self._body(body), pad + "}"]

    def visit_Store(self, s: S.Store) -> list[str]:
        target = f"{self.names.get(s.buf)}[{self._indices(s.indices)}]"
        return [f"{'  ' * self.indent}{target} = {self.expr(s.value)};"]

    def visit_Let(self, s: S.Let) -> list[str]:
        pad = "  " * self.indent
        return [f"{pad}{s.var.dtype.c_name()} {self.names.get(s.var)} = {self.expr(s.value)};"]

    def visit_Allocate(self, s: S.Allocate) -> list[str]:
        dims = ", ".join(self.expr(d) for d in s.buf.dims)
        pad = "  " * self.indent
        return [f"{pad}Allocate({self.names.get(s.buf)}, {s.buf.dtype.c_name()}, {{{dims}}});"]

    def visit_Free(self, s: S.Free) -> list[str]:
        return [f"{'  ' * self.indent}Free({self.names.get(s.buf)});"]

    def visit_ExternalCall(self, s: S.ExternalCall) -> list[str]:
        bufs = ", ".join(self.names.get(b) for b in s.bufs)
        consts = ", ".join(map(repr, s.consts))
        name = self.names.get(s.buf)
        return [f'{"  " * self.indent}ExternalCall({name}, "{s.fn}", {{{bufs}}}, {{{consts}}});']


def print_expr(e: E.Expr) -> str:
    return IRPrinter().expr(e)


def print_stmt(s: S.Stmt) -> str:
    return "\n".join(IRPrinter().stmt(s))


E.PRINTERS.update(expr=print_expr, stmt=print_stmt)
