"""Shared helpers for IR-level tests: build small programs, run them in the interpreter."""

from __future__ import annotations

import expecttest
import torch

from nncfuse.tensorexpr import expr as E
from nncfuse.tensorexpr import stmt as S
from nncfuse.tensorexpr.buffer import Buf
from nncfuse.tensorexpr.dtype import FLOAT32
from nncfuse.tensorexpr.ir_eval import IREvaluator


def run(stmt: S.Stmt, params: list, args: list) -> list:
    """Run `stmt` over `args` (tensors for Bufs, numbers for Vars); return the tensors."""
    IREvaluator(stmt, params).run(args)
    return [a for a in args if isinstance(a, torch.Tensor)]


def same_results(before: S.Stmt, after: S.Stmt, params: list, make_args) -> None:
    """`before` and `after` compute identical outputs from the same random inputs."""
    first = make_args()
    second = [a.clone() if isinstance(a, torch.Tensor) else a for a in first]
    run(before, params, first)
    run(after, params, second)
    for x, y in zip(first, second):
        if isinstance(x, torch.Tensor):
            torch.testing.assert_close(x, y, rtol=0, atol=0, equal_nan=True)


def text(node) -> str:
    return str(node).strip()


class _Expect(expecttest.TestCase):
    def runTest(self) -> None:  # a TestCase needs a test method to be built
        pass


_EXPECT = _Expect()


def assert_expected_inline(actual: str, expect: str) -> None:
    """Golden text: `expect` is the string literal at the call site, which
    `EXPECTTEST_ACCEPT=1 python -m pytest ...` rewrites to `actual`."""
    _EXPECT.assertExpectedInline(actual, expect, skip=1)


def var(name: str = "i") -> E.Var:
    return E.Var(name)


def buf(name: str, dims, dtype=FLOAT32, strides=None) -> Buf:
    return Buf.make(name, dtype, dims, strides)
