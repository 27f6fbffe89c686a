"""C-like text for IR trees, in the format of NNC's dumps.

    {
      for (int64_t i = 0; i < 1024; i++) {
        float<16> v = t0[Ramp(16 * i, 1, 16)];
        aten_mul[Ramp(16 * i, 1, 16)] = sin(v * v) * sin(v * v);
      }
    }

Variables and buffers are named by their `name`; distinct objects with the
same name are told apart by a suffix (`i`, `i_1`, ...) in order of appearance.
Operators print with the fewest parentheses C precedence allows.
"""

from __future__ import annotations

import math
import re

import numpy as np

from . import expr as E
from . import stmt as S
from .buffer import Buf

_BINARY = {
    E.Add: ("+", 8),
    E.Sub: ("-", 8),
    E.Mul: ("*", 9),
    E.Div: ("/", 9),
    E.Mod: ("%", 9),
    E.Shl: ("<<", 7),
    E.Shr: (">>", 7),
    E.And: ("&", 4),
    E.Xor: ("^", 3),
    E.Or: ("|", 2),
}
_NUMPY_FLOATS = ("float16", "float32")
_CMP_PRECEDENCE = {"==": 5, "!=": 5, "<": 6, "<=": 6, ">": 6, ">=": 6}
_ATOM = 10


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


class IRPrinter:
    """Prints expressions and statements; one instance names things consistently."""

    def __init__(self) -> None:
        self.names = _Names()

    # -- expressions --------------------------------------------------------
    def expr(self, e: E.Expr, parent_precedence: int = 0) -> str:
        text, precedence = self._expr(e)
        return f"({text})" if precedence < parent_precedence else text

    def _expr(self, e: E.Expr) -> tuple[str, int]:
        if isinstance(e, E.BinaryOp) and type(e) in _BINARY:
            op, p = _BINARY[type(e)]
            # Left-associative: an equal-precedence right operand needs parentheses.
            return f"{self.expr(e.a, p)} {op} {self.expr(e.b, p + 1)}", p
        if isinstance(e, E.Cmp):
            p = _CMP_PRECEDENCE[e.op]
            return f"{self.expr(e.a, p)} {e.op} {self.expr(e.b, p + 1)}", p
        if isinstance(e, E.Select):
            return (
                f"{self.expr(e.cond, 2)} ? {self.expr(e.true_value, 2)} : "
                f"{self.expr(e.false_value, 1)}",
                1,
            )
        return self._atom(e), _ATOM

    def _atom(self, e: E.Expr) -> str:
        if isinstance(e, E.Imm):
            return _imm(e)
        if isinstance(e, E.Var):
            return self.names.get(e)
        if isinstance(e, (E.Max, E.Min)):
            return f"{type(e).__name__.lower()}({self.expr(e.a)}, {self.expr(e.b)})"
        if isinstance(e, E.Cast):
            return f"{e.dtype.c_name()}({self.expr(e.value)})"
        if isinstance(e, E.Bitcast):
            return f"bitcast<{e.dtype.c_name()}>({self.expr(e.value)})"
        if isinstance(e, E.Call):
            return f"{e.name}({', '.join(self.expr(a) for a in e.args)})"
        if isinstance(e, E.Ramp):
            return f"Ramp({self.expr(e.base)}, {self.expr(e.stride)}, {e.lanes})"
        if isinstance(e, E.Broadcast):
            return f"Broadcast({self.expr(e.value)}, {e.lanes})"
        if isinstance(e, E.Load):
            return f"{self.names.get(e.buf)}[{self._indices(e.indices)}]"
        raise TypeError(f"cannot print {type(e).__name__}")

    def _indices(self, indices: tuple[E.Expr, ...]) -> str:
        return ", ".join(self.expr(i) for i in indices)

    # -- statements ---------------------------------------------------------
    def stmt(self, s: S.Stmt, indent: int = 0) -> list[str]:
        pad = "  " * indent
        if isinstance(s, S.Block):
            lines = [pad + "{"]
            for child in s.stmts:
                lines += self.stmt(child, indent + 1)
            return lines + [pad + "}"]
        if isinstance(s, S.For):
            v = self.names.get(s.var)
            note = " /* parallel */" if s.parallel else ""
            head = (
                f"{pad}for ({s.var.dtype.c_name()} {v} = {self.expr(s.start)}; "
                f"{v} < {self.expr(s.stop)}; {v}++){note} {{"
            )
            body = s.body.stmts if isinstance(s.body, S.Block) else (s.body,)
            lines = [head]
            for child in body:
                lines += self.stmt(child, indent + 1)
            return lines + [pad + "}"]
        if isinstance(s, S.Store):
            target = f"{self.names.get(s.buf)}[{self._indices(s.indices)}]"
            return [f"{pad}{target} = {self.expr(s.value)};"]
        if isinstance(s, S.Let):
            return [f"{pad}{s.var.dtype.c_name()} {self.names.get(s.var)} = {self.expr(s.value)};"]
        if isinstance(s, S.Allocate):
            dims = ", ".join(self.expr(d) for d in s.buf.dims)
            return [f"{pad}Allocate({self.names.get(s.buf)}, {s.buf.dtype.c_name()}, {{{dims}}});"]
        if isinstance(s, S.Free):
            return [f"{pad}Free({self.names.get(s.buf)});"]
        raise TypeError(f"cannot print {type(s).__name__}")


def print_expr(e: E.Expr) -> str:
    return IRPrinter().expr(e)


def print_stmt(s: S.Stmt) -> str:
    return "\n".join(IRPrinter().stmt(s))


E.PRINTERS.update(expr=print_expr, stmt=print_stmt)
