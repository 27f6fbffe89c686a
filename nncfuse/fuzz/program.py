"""Random TorchScript programs of elementwise ops, for the differential fuzzer.

`generate(seed)` builds a `Case`: a `Program` (parameters, statements, the
returned values) and two sets of inputs with the same types and layouts but
different values. Everything comes from the seed, so a seed is a full repro.

The generator builds the program one statement at a time and runs each new
statement eagerly on both input sets before accepting it: an op that eager
rejects for these dtypes (`neg` of a bool, `lerp` of mixed floats, ...) is
redrawn, so almost every program is well typed. Statements pick operands
among all values so far, preferring ones not yet used, which gives DAGs
(values reused) rather than chains. Some statements are not elementwise
(`torch.mm`, a `sum`) or are an `if` on a bool input, so fusion groups are
split and put in blocks. Every value that nothing uses is returned: no dead
code, so eager and TorchScript raise in the same places.

When a statement raises only on the second input set (an integer division
by zero, say), it is kept now and then: that set then checks that nncfuse
raises where eager does.
"""

from __future__ import annotations

import math
import random
import warnings
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch

from .inputs import TensorSpec, base_shape, clone_input, make_tensor, random_spec, tensor_source
from .op_specs import (
    DTYPE_CLASSES,
    FLOAT_LITERAL_WEIGHTS,
    FLOAT_LITERALS,
    INT_LITERAL_WEIGHTS,
    INT_LITERALS,
    JOINS,
    MOVES,
    OPS,
    REDUCTIONS,
    SPLITS,
    VIEWS,
    WRITE_VIEWS,
    OpSpec,
)

_OP_WEIGHTS = [op.weight for op in OPS]
_REDUCTION_WEIGHTS = [op.weight for op in REDUCTIONS]  # the reductions section (issue #10)
#: In-place writes (`add_inplace`): `dest` is an input or a slice of one, `v` a tensor value.
_INPLACE = (
    "{dest}.add_({v})", "{dest}.mul_({v})", "{dest}.sub_({v}, alpha=2)", "{dest}.relu_()",
    "{dest}.sigmoid_()", "{dest}.tanh_()", "{dest}.clamp_(-0.5, 0.5)", "{dest}.neg_()",
    "{dest}.masked_fill_({v} > 0, 0.25)", "{dest}.copy_({v})", "{dest}.div_(2.0)",
)
FLOATS_AND_INTS = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32,
                   torch.int64)
MAX_TENSOR_PARAMS = 6
MAX_SCALAR_PARAMS = 2


@dataclass(frozen=True)
class Param:
    """A parameter of the program: a tensor (with its spec) or a float/int/bool number."""

    name: str
    kind: str  # "Tensor", "float", "int", "bool"
    spec: TensorSpec | None = None


@dataclass(frozen=True)
class OpCall:
    """One op call: its table name, its source text, and the values it reads."""

    op: str
    text: str
    uses: tuple[str, ...]
    approx: bool = False
    zero_sign: bool = False
    magnitude: str = ""  # the noise's scale, if not the result's (`OpSpec.magnitude`)


@dataclass(frozen=True)
class Assign:
    """`target = call`, or `if flag: target = call else: target = orelse`."""

    target: str
    call: OpCall
    orelse: OpCall | None = None
    flag: str | None = None

    @property
    def uses(self) -> tuple[str, ...]:
        extra = (*self.orelse.uses, self.flag) if self.orelse else ()
        return (*self.call.uses, *extra)

    @property
    def targets(self) -> tuple[str, ...]:
        """The names assigned: one, or several for a split (`a, b = x.chunk(2, 1)`)."""
        return tuple(self.target.split(", "))

    @property
    def calls(self) -> tuple[OpCall, ...]:
        return (self.call, self.orelse) if self.orelse else (self.call,)


@dataclass(frozen=True)
class Program:
    params: tuple[Param, ...]
    stmts: tuple[Assign, ...]
    outputs: tuple[str, ...]
    name: str = "fuzzed"

    def source(self, nudge: bool = False) -> str:
        """The program as TorchScript (and Python) source; `nudge` wraps the calls whose
        results eager may give otherwise (`OpSpec.approx`, `OpSpec.zero_sign`) in `_nudge`."""

        def line(call: OpCall) -> str:
            text = call.text
            if nudge and call.zero_sign:
                text = f"_nudge.zeros({text})"
            if nudge and call.approx:
                text = f"_nudge({text}, {call.magnitude})" if call.magnitude else f"_nudge({text})"
            return text

        args = ", ".join(f"{p.name}: {'torch.Tensor' if p.kind == 'Tensor' else p.kind}"
                         for p in self.params)
        rows = [f"def {self.name}({args}):"]
        for s in self.stmts:
            if s.orelse is None:
                rows.append(f"    {s.target} = {line(s.call)}")
            else:
                rows += [f"    if {s.flag}:", f"        {s.target} = {line(s.call)}",
                         "    else:", f"        {s.target} = {line(s.orelse)}"]
        rows.append(f"    return {', '.join(self.outputs)}")
        return "\n".join(rows) + "\n"

    def eager(self, nudge: Callable[[Any], Any] | None = None) -> Callable[..., Any]:
        """The program as a Python function (eager PyTorch); `nudge` perturbs approximate ops."""
        scope: dict[str, Any] = {"torch": torch, "_nudge": nudge}
        exec(compile(self.source(nudge is not None), "<fuzz>", "exec"), scope)  # noqa: S102
        return scope[self.name]

    def script(self) -> torch.jit.ScriptFunction:
        """The program compiled by TorchScript."""
        return getattr(torch.jit.CompilationUnit(self.source()), self.name)

    @property
    def ops(self) -> list[str]:
        """The table names of all calls, `if` branches included."""
        return [c.op for s in self.stmts for c in s.calls]


@dataclass
class Case:
    """A program, two input sets (same types, other values), and fuser options."""

    program: Program
    inputs: tuple[tuple[Any, ...], ...]
    min_group_size: int = 1
    seed: int | None = None

    def input_source(self, k: int) -> list[str]:
        """Python text rebuilding input set `k`."""
        return [tensor_source(v) if isinstance(v, torch.Tensor) else repr(v)
                for v in self.inputs[k]]


# -- generation ----------------------------------------------------------------------------

_RAISED = object()  # an input set on which eager raised


@dataclass
class _Value:
    name: str
    data: list[Any]  # per input set; None once that set has raised
    is_param: bool
    used: bool = False

    @property
    def is_tensor(self) -> bool:
        return isinstance(self.data[0], torch.Tensor)


def _out_of_bounds(spec: OpSpec, operands: list[list[Any]], k: int) -> bool:
    """Whether input set `k` gives `spec` operands eager has no single answer for (or dies on):
    see `OpSpec.divides`, `OpSpec.finite_quotient` and `OpSpec.overflow_band`."""
    if spec.overflow_band:
        x = torch.as_tensor(operands[0][k])
        if not x.is_floating_point():
            return False
        wide = torch.float64 if x.dtype == torch.float64 else torch.float32
        big = math.log(torch.finfo(wide).max)
        magnitude = x.to(wide).abs()
        return bool(((magnitude > big) & (magnitude < big + math.log(2.0))).any())
    if not (spec.divides or spec.finite_quotient):
        return False
    a, b = (torch.as_tensor(x[k]) for x in operands[:2])
    if spec.divides and a.dtype in (torch.int32, torch.int64) and not b.is_floating_point():
        return bool((a == torch.iinfo(a.dtype).min).any() and (b == -1).any())
    promoted = torch.result_type(operands[0][k], operands[1][k])
    if spec.finite_quotient and promoted.is_floating_point:
        # eager divides in the promoted type, float16/bfloat16 in float32
        wide = torch.float64 if promoted == torch.float64 else torch.float32
        a, b = a.to(wide), b.to(wide)
        try:
            return bool((a.isfinite() & b.isfinite() & (b != 0) & (a / b).isinf()).any())
        except RuntimeError:  # shapes that do not broadcast: eager will reject the call
            return False
    return False


class _Builder:
    """Grows a program statement by statement, running each one eagerly as it goes."""

    def __init__(self, seed: int):
        self.rng = random.Random(seed)
        self.gen = torch.Generator().manual_seed(seed)
        self.base = base_shape(self.rng)
        self.params: list[Param] = []
        self.values: dict[str, _Value] = {}
        self.scalars: list[_Value] = []
        self.stmts: list[Assign] = []
        self.alive = [True, True]  # whether eager has not yet raised on input set k

    # -- parameters -------------------------------------------------------------------------
    def _add_param(self, param: Param, data: list[Any]) -> _Value:
        self.params.append(param)
        value = _Value(param.name, data, is_param=True)
        self.values[param.name] = value
        return value

    def new_tensor(self, spec: TensorSpec) -> _Value:
        name = f"x{sum(p.kind == 'Tensor' for p in self.params)}"
        data = [make_tensor(self.rng, self.gen, spec) for _ in range(2)]
        return self._add_param(Param(name, "Tensor", spec), data)

    def new_scalar(self, kind: str) -> _Value:
        if kind == "bool":
            name, data = "flag", [self.rng.random() < 0.5 for _ in range(2)]
        elif kind == "float":
            pool = [0.5, -1.5, 2.0, 0.0, 3.25, 1e-3, -7.0, 100.0, float("inf"), float("nan")]
            name = f"s{len(self.scalars)}"
            data = self.rng.choices(pool, [4, 3, 3, 1, 2, 1, 1, 1, 0.3, 0.3], k=2)
        else:
            name = f"s{len(self.scalars)}"
            data = self.rng.choices([-3, -1, 0, 1, 2, 3, 5], [1, 2, 0.5, 2, 3, 2, 1], k=2)
        value = self._add_param(Param(name, kind), data)
        if kind != "bool":
            self.scalars.append(value)
        return value

    # -- operands -------------------------------------------------------------------------
    def tensor(self, allowed: tuple[torch.dtype, ...], dtype_class: str) -> _Value:
        """A tensor operand of an `allowed` dtype: an existing value, or a new input."""
        pool = [v for v in self.values.values() if v.is_tensor and v.data[0].dtype in allowed]
        n_tensors = sum(p.kind == "Tensor" for p in self.params)
        if not pool or (n_tensors < MAX_TENSOR_PARAMS and self.rng.random() < 0.12):
            spec = random_spec(self.rng, self.base, dtype_class)
            if spec.dtype not in allowed:  # a mask
                spec = replace(spec, dtype=allowed[0])
            return self.new_tensor(spec)
        unused = [v for v in pool if not v.used and not v.is_param]
        if unused and self.rng.random() < 0.6:
            return self.rng.choice(unused)
        return self.rng.choice(pool)

    def number(self, dtype_class: str) -> tuple[str, list[Any], str | None]:
        """A number operand: (text, value per input set, parameter name or None)."""
        kind = {"float": "float", "int": "int", "intnb": "int"}.get(dtype_class)
        kind = kind or self.rng.choice(["float", "int"])
        if self.rng.random() < 0.25:
            have = [v for v in self.scalars if type(v.data[0]).__name__ == kind]
            if have or len(self.scalars) < MAX_SCALAR_PARAMS:
                v = self.rng.choice(have) if have else self.new_scalar(kind)
                return v.name, v.data, v.name
        if kind == "float":
            text = self.rng.choices(FLOAT_LITERALS, FLOAT_LITERAL_WEIGHTS)[0]
        else:
            text = self.rng.choices(INT_LITERALS, INT_LITERAL_WEIGHTS)[0]
        value = eval(text)  # noqa: S307 - a literal from our own table
        return text, [value, value], None

    def draw_call(self, spec: OpSpec) -> tuple[OpCall, list[list[Any]]]:
        """Operands and extras for `spec`: the call, and each operand's value per input set."""
        texts: list[str] = []
        uses: list[str] = []
        data: list[list[Any]] = []
        for letter in spec.operands:
            if letter == "s" or (letter == "n" and self.rng.random() < 0.3):
                text, values, name = self.number(spec.dtypes)
            else:
                if letter == "m":
                    v = self.tensor((torch.bool,), "any")
                else:
                    v = self.tensor(DTYPE_CLASSES[spec.dtypes], spec.dtypes)
                text, values, name = v.name, v.data, v.name
            texts.append(text)
            data.append(values)
            if name:
                uses.append(name)
        extras = {k: self.rng.choice(choices) for k, choices in spec.extras.items()}
        text = spec.template.format(*texts, **extras)
        magnitude = spec.magnitude.format(*texts, **extras)
        call = OpCall(spec.name, text, tuple(dict.fromkeys(uses)), spec.approx, spec.zero_sign,
                      magnitude)
        return call, data

    # -- statements -------------------------------------------------------------------------
    def evaluate(self, call: OpCall, refuse: Callable[[int], bool] | None = None) -> list | None:
        """The call's eager result per input set (`_RAISED` where it raised), or None to redraw.

        Raising on the first input set, or now and then on the second, means redraw.
        """
        results: list[Any] = []
        for k in range(2):
            if not self.alive[k]:
                results.append(None)
                continue
            if refuse is not None and refuse(k):
                return None
            scope = {name: self.values[name].data[k] for name in call.uses}
            if call.op.startswith("inplace"):  # write into copies: the inputs stay as drawn
                scope = {n: clone_input(v) if isinstance(v, torch.Tensor) else v
                         for n, v in scope.items()}
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    out = eval(call.text, {"torch": torch}, scope)  # noqa: S307
            except Exception:  # noqa: BLE001 - eager rejects the call
                if k == 0 or self.rng.random() < 0.5:
                    return None
                out = _RAISED
            if call.op.startswith("split_") and isinstance(out, tuple) and 1 < len(out) < 5:
                out = list(out)  # a split's parts, one value each (`commit`)
            elif out is not _RAISED and not isinstance(out, torch.Tensor):
                return None
            results.append(out)
        return results

    def commit(self, stmt: Assign, results: list[Any]) -> None:
        target = stmt.target
        for name in stmt.uses:
            self.values[name].used = True
        for k, out in enumerate(results):
            if out is _RAISED:
                self.alive[k] = False
                results[k] = None
        if len(stmt.targets) == 1:
            self.values[target] = _Value(target, results, is_param=False)
        for j, name in enumerate(stmt.targets if len(stmt.targets) > 1 else ()):
            self.values[name] = _Value(name, [r[j] if r is not None else None for r in results],
                                       is_param=False)
        self.stmts.append(stmt)

    def rollback(self, n_params: int) -> None:
        """Forget the inputs a rejected draw created."""
        for param in self.params[n_params:]:
            value = self.values.pop(param.name)
            if value in self.scalars:
                self.scalars.remove(value)
        del self.params[n_params:]

    def add_op(self, attempts: int = 30, specs: list[OpSpec] = OPS,
               weights: list[float] = _OP_WEIGHTS) -> bool:
        """Append one op of `specs` (elementwise ones unless told); False if no draw was well
        typed."""
        for _ in range(attempts):
            n_params = len(self.params)
            spec = self.rng.choices(specs, weights)[0]
            call, data = self.draw_call(spec)
            results = self.evaluate(call, lambda k: _out_of_bounds(spec, data, k))
            if results is not None:
                self.commit(Assign(self.fresh_name(), call), results)
                return True
            self.rollback(n_params)
        return False

    def add_if(self, attempts: int = 30) -> bool:
        """Append `if flag: v = op1 else: v = op2`, both branches of one type."""
        before_flag = len(self.params)
        flag = self.values.get("flag") or self.new_scalar("bool")
        for _ in range(attempts):
            n_params = len(self.params)
            specs = self.rng.choices(OPS, _OP_WEIGHTS, k=2)
            drawn = [self.draw_call(spec) for spec in specs]
            calls = [call for call, _ in drawn]
            branches = [self.evaluate(call, lambda k, s=spec, d=data: _out_of_bounds(s, d, k))
                        for spec, (call, data) in zip(specs, drawn)]
            typed = not any(b is None or _RAISED in b for b in branches)
            if typed and all(
                x is None or (x.dtype, x.shape) == (y.dtype, y.shape) for x, y in zip(*branches)
            ):
                a, b = branches
                picked = [a[k] if flag.data[k] else b[k] for k in range(2)]
                self.commit(Assign(self.fresh_name(), *calls, flag=flag.name), picked)
                return True
            self.rollback(n_params)
        self.rollback(before_flag)  # drops the flag if this call created it
        return False

    def add_breaker(self) -> bool:
        """Append a `torch.mm` or a `sum` over the last dimension (once ops nncfuse left out)."""
        tensors = [v for v in self.values.values() if v.is_tensor]
        matrices = [v for v in tensors if v.data[0].dim() == 2
                    and v.data[0].dtype in (torch.float32, torch.float64)]
        if matrices and self.rng.random() < 0.5:
            v = self.rng.choice(matrices)
            k = v.data[0].shape[1]
            w = self.new_tensor(TensorSpec(v.data[0].dtype, (k, k)))
            call = OpCall("mm", f"torch.mm({v.name}, {w.name})", (v.name, w.name), True,
                          magnitude=f"torch.mm({v.name}.double().abs(), {w.name}.double().abs())")
        else:
            ranked = [v for v in tensors if v.data[0].dim() >= 1]
            if not ranked:
                return False
            v = self.rng.choice(ranked)
            call = OpCall("sum", f"{v.name}.sum(-1, keepdim=True)", (v.name,), True,
                          magnitude=f"{v.name}.double().abs().sum(-1, keepdim=True)")
        results = self.evaluate(call)
        if results is None or _RAISED in results:
            return False
        self.commit(Assign(self.fresh_name(), call), results)
        return True

    def add_inplace(self, attempts: int = 10) -> bool:
        """Append an in-place write into a tensor input or a view of one (`x.add_(v)`,
        `x[..., :n].copy_(v)`, ...); False if no draw was well typed."""
        targets = [v for v in self.values.values() if v.is_param and v.is_tensor
                   and v.data[0].dtype.is_floating_point and 0 not in v.data[0].stride()]
        if not targets:
            return False
        for _ in range(attempts):
            x = self.rng.choice(targets)
            ndim = x.data[0].dim()
            size = x.data[0].shape[-1] if ndim else 1
            dest = x.name
            if ndim and size > 1 and self.rng.random() < 0.35:
                lo = self.rng.randrange(size - 1)
                dest = f"{x.name}[..., {lo}:{self.rng.randrange(lo + 1, size + 1)}]"
            elif ndim and self.rng.random() < 0.5:
                dest = self.movement_text(self.rng.choice(WRITE_VIEWS), x)
            operand = self.tensor(FLOATS_AND_INTS, "any")
            template = self.rng.choice(_INPLACE)
            text = template.format(dest=dest, v=operand.name)
            uses = tuple(dict.fromkeys((x.name, operand.name) if "{v}" in template
                                       else (x.name,)))
            call = OpCall("inplace_" + template.split("(")[0].split(".")[-1], text, uses)
            results = self.evaluate(call)
            if results is not None and _RAISED not in results:
                self.commit(Assign(self.fresh_name(), call), results)
                return True
        return False

    # -- data movement (issue 11): views, slices, cats, chunks ------------------------------
    def movement_text(self, template: str, x: _Value, y: _Value | None = None) -> str:
        """`template` (`op_specs.VIEWS` and its neighbours) filled in for `x`'s shape."""
        rng, shape = self.rng, tuple(x.data[0].shape)
        ndim = max(len(shape), 1)
        d, e = rng.randrange(ndim), rng.randrange(ndim)
        size = shape[d] if shape else 1
        lo = rng.randrange(size) if size else 0
        a = rng.randint(0, size) if size else 0
        perm = list(range(len(shape)))
        rng.shuffle(perm)
        return template.format(
            x=x.name, y=y.name if y else "", d=d - ndim if rng.random() < 0.3 else d, e=e,
            d1=rng.randrange(ndim + 1), i=rng.randrange(size) - (size if rng.random() < 0.3
                                                               else 0) if size else 0,
            lo=lo, hi=rng.randint(lo, size), step=rng.choice([1, 2, 3]), n=size - lo,
            perm=", ".join(map(str, perm)), split_a=a, split_b=size - a,
            flat=math.prod(shape), factor=rng.choice([1, 2]), keep=", ".join(["-1"] * len(shape)),
            reps=", ".join(str(rng.choice([1, 1, 2, 3])) for _ in range(len(shape) or 1)),
        )

    def add_movement(self, attempts: int = 10) -> bool:
        """Append a view, slice, data move, cat/stack or split (several values) of a tensor
        value; False if no draw was well typed."""
        for _ in range(attempts):
            n_params = len(self.params)
            x = self.tensor(DTYPE_CLASSES["any"], "any")
            kind = self.rng.choices(["view", "move", "join", "split"], [5, 2, 2, 2])[0]
            y = None
            if kind == "join":
                same = [v for v in self.values.values() if v.is_tensor
                        and v.data[0].dim() == x.data[0].dim()]
                y = self.rng.choice(same)
            table = {"view": VIEWS, "move": MOVES, "join": JOINS, "split": SPLITS}[kind]
            template = self.rng.choice(table)
            text = self.movement_text(template, x, y)
            uses = tuple(dict.fromkeys((x.name, y.name) if y else (x.name,)))
            op = kind + "_" + template.split("(")[0].split(".")[-1].strip("{}x[")
            results = self.evaluate(OpCall(op, text, uses))
            if results is not None and _RAISED not in results:
                target = self.fresh_name()
                if kind == "split":
                    target = ", ".join(f"{target}_{j}" for j in range(len(results[0])))
                self.commit(Assign(target, OpCall(op, text, uses)), results)
                return True
            self.rollback(n_params)
        return False

    def fresh_name(self) -> str:
        return f"v{len(self.stmts)}"

    def outputs(self) -> tuple[str, ...]:
        """Every computed value nothing reads, in program order."""
        read = {name for s in self.stmts for name in s.uses}
        return tuple(t for s in self.stmts for t in s.targets if t not in read)


def generate(seed: int) -> Case:
    """The random case of `seed`: 1-12 elementwise ops, maybe a non-fusible op or an `if`."""
    builder = _Builder(seed)
    rng = builder.rng
    n_ops = rng.randint(1, 12)
    while sum(s.call.op not in ("mm", "sum") for s in builder.stmts) < n_ops:
        roll = rng.random()
        if roll < 0.05 and builder.stmts:
            builder.add_breaker()
        elif roll < 0.15 and builder.add_inplace():
            continue
        elif roll < 0.12 and builder.add_if():
            continue
        elif roll < 0.22 and add_reduction(builder):
            continue
        elif roll < 0.36 and builder.add_movement():
            continue
        elif not builder.add_op():
            break
    if not builder.stmts:  # nothing was well typed (very rare): one op that always is
        builder.values.clear()
        builder.params.clear()
        x = builder.new_tensor(TensorSpec(torch.float32, builder.base))
        builder.commit(Assign("v0", OpCall("mul", f"torch.mul({x.name}, 2.0)", (x.name,))),
                       [x.data[0] * 2.0, x.data[1] * 2.0])
    program = Program(tuple(builder.params), tuple(builder.stmts), builder.outputs())
    inputs = tuple(tuple(builder.values[p.name].data[k] for p in builder.params) for k in range(2))
    return Case(program, inputs, min_group_size=rng.choice([1, 1, 2]), seed=seed)


# -- reductions (issue #10) -------------------------------------------------------------------


def add_reduction(builder: _Builder) -> bool:
    """Append one reduction (`op_specs.REDUCTIONS`) over a value or a new input."""
    return builder.add_op(attempts=10, specs=REDUCTIONS, weights=_REDUCTION_WEIGHTS)
