"""Shrinking a failing fuzz case to a small repro, and printing it as a standalone script.

`minimize_case` tries simpler variants of a case and keeps any that still
fails the same way (same backend, same kind of failure), until none does.
The variants, biggest step first:

- set B := set A (one input set);
- drop a returned value (and whatever only fed it);
- cut a statement: its eagerly computed value becomes a new input, so the
  ops before it go away while every later op still sees the same operand;
- replace an `if` by the branch set A takes;
- make a tensor input contiguous (same values).

Cutting keeps the program well typed by construction, so no variant is
wasted on programs eager rejects.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import torch

from .inputs import TensorSpec
from .oracle import Failure, check_case
from .program import Assign, Case, Param, Program


def _values(case: Case, k: int) -> dict[str, Any]:
    """Every value of input set `k`, computed eagerly (none after a statement that raises)."""
    env = {p.name: v for p, v in zip(case.program.params, case.inputs[k])}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for s in case.program.stmts:
            call = s.call if s.orelse is None or env[s.flag] else s.orelse  # type: ignore[index]
            try:
                value = eval(call.text, {"torch": torch}, env)  # noqa: S307
                env.update(zip(s.targets, value) if len(s.targets) > 1 else [(s.target, value)])
            except Exception:  # noqa: BLE001 - later values do not exist
                break
    return env


def _prune(case: Case, program: Program) -> Case:
    """`program` without statements nothing returns or reads, and without unread inputs."""
    needed = set(program.outputs)
    kept: list[Assign] = []
    for s in reversed(program.stmts):
        if needed & set(s.targets):
            kept.append(s)
            needed |= set(s.uses)
    keep = [k for k, p in enumerate(program.params) if p.name in needed]
    params = tuple(program.params[k] for k in keep)
    inputs = tuple(tuple(inputs[k] for k in keep) for inputs in case.inputs)
    return replace(case, program=replace(program, params=params, stmts=tuple(reversed(kept))),
                   inputs=inputs)


def _same_inputs(a: tuple[Any, ...], b: tuple[Any, ...]) -> bool:
    for x, y in zip(a, b):
        if isinstance(x, torch.Tensor):
            if x.stride() != y.stride() or not torch.equal(x.nan_to_num(0), y.nan_to_num(0)):
                return False
        elif x != y and not (x != x and y != y):  # NaN numbers are the same input
            return False
    return True


def _cut(case: Case, index: int) -> Case | None:
    """`case` with statement `index` replaced by an input holding its eager value."""
    stmt = case.program.stmts[index]
    if len(stmt.targets) > 1:
        return None  # a split's parts: several values
    values = [_values(case, k).get(stmt.target) for k in range(len(case.inputs))]
    if values[0] is None:
        return None
    values = [v if v is not None else values[0] for v in values]
    param = Param(stmt.target, "Tensor", TensorSpec(values[0].dtype, tuple(values[0].shape)))
    stmts = case.program.stmts[:index] + case.program.stmts[index + 1 :]
    program = replace(case.program, params=(*case.program.params, param), stmts=stmts)
    inputs = tuple((*inputs, v.clone()) for inputs, v in zip(case.inputs, values))
    return _prune(replace(case, inputs=inputs), program)


def _variants(case: Case) -> Iterator[Case]:
    program = case.program
    if len(case.inputs) > 1 and not _same_inputs(case.inputs[0], case.inputs[1]):
        yield replace(case, inputs=(case.inputs[0], case.inputs[0]))
    if len(program.outputs) > 1:
        for name in program.outputs:
            outputs = tuple(o for o in program.outputs if o != name)
            yield _prune(case, replace(program, outputs=outputs))
    for index in range(len(program.stmts)):
        cut = _cut(case, index)
        if cut is not None:
            yield cut
    flags = {p.name: v for p, v in zip(program.params, case.inputs[0])}
    for index, s in enumerate(program.stmts):
        if s.orelse is not None:
            taken = s.call if flags[s.flag] else s.orelse  # type: ignore[index]
            stmts = list(program.stmts)
            stmts[index] = Assign(s.target, taken)
            yield _prune(case, replace(program, stmts=tuple(stmts)))
    for index, (p, x) in enumerate(zip(program.params, case.inputs[0])):
        if isinstance(x, torch.Tensor) and not x.is_contiguous():
            params = list(program.params)
            params[index] = replace(p, spec=replace(p.spec, layout="contiguous", detail=()))
            inputs = tuple(
                tuple(v.contiguous() if j == index else v for j, v in enumerate(inputs))
                for inputs in case.inputs
            )
            yield replace(case, program=replace(program, params=tuple(params)), inputs=inputs)


def minimize_case(case: Case, failure: Failure, budget: int = 300) -> Case:
    """The smallest variant of `case` found that still fails like `failure` (at most `budget`
    checks)."""

    def fails(candidate: Case) -> bool:
        outcome = check_case(candidate, [failure.backend])
        return any(f.kind == failure.kind and f.backend == failure.backend
                   for f in outcome.failures)

    checks = 0
    improved = True
    while improved and checks < budget:
        improved = False
        for candidate in _variants(case):
            if not candidate.program.stmts:  # no op left: nothing to repro
                continue
            checks += 1
            if fails(candidate):
                case, improved = candidate, True
                break
            if checks >= budget:
                break
    return case


def repro_script(case: Case, backend: str) -> str:
    """A standalone script that replays `case` on `backend` and asserts it matches eager."""
    sets = case.inputs
    one_set = len(sets) == 1 or _same_inputs(sets[0], sets[1])
    rows = [
        "import torch",
        "",
        "import nncfuse",
        "",
        'nan, inf = float("nan"), float("inf")',
        f'SOURCE = """\n{case.program.source()}"""',
        'scope = {"torch": torch}',
        "exec(SOURCE, scope)",
        f"eager = scope[{case.program.name!r}]",
        f"script = getattr(torch.jit.CompilationUnit(SOURCE), {case.program.name!r})",
        f"fused = nncfuse.jit(script, use_llvm={backend == 'llvm'}, "
        f"min_group_size={case.min_group_size})",
    ]
    for k, name in enumerate("A" if one_set else "AB"):
        rows.append(f"{name} = (")
        rows += [f"    {text},  # {p.name}"
                 for p, text in zip(case.program.params, case.input_source(k))]
        rows.append(")")
    calls = "A, A" if one_set else "A, A, B"
    rows += [
        f"for args in ({calls}):",
        "    torch.testing.assert_close(fused(*args), eager(*args), equal_nan=True)",
    ]
    return "\n".join(rows) + "\n"
