"""Generated entries: the straight-line code for each kind of source, parameter, output,
check and return, and what it does."""

import pytest
import torch

import nncfuse
from nncfuse.tensorexpr.codegen.entry import (
    ArgCheck,
    ArgSource,
    BufOutput,
    ConstParam,
    ConstSource,
    InputOutput,
    KernelInterface,
    NumberParam,
    OutputParam,
    ReturnList,
    ReturnOne,
    ReturnTuple,
    TensorParam,
    make_entry,
)
from nncfuse.tensorexpr.meta import TensorMeta

OUT = TensorMeta(torch.float32, (2, 3), (1, 2), torch.device("cpu"), False)


def scale_add(values):
    """The 'kernel', as the interpreter is called: out = a * s + c."""
    a, s, c, out = values
    out.copy_(a * s + c)


def interface(cfunc=None):
    const = torch.full((2, 3), 10.0)
    return KernelInterface(
        params=(TensorParam(0), NumberParam(1), ConstParam(const), OutputParam(OUT)),
        outputs=(BufOutput(0), InputOutput(0)),
        checks=(ArgCheck(1, lambda s: s != 0, "ZeroDivisionError"),),
        cfunc=cfunc,
        run=None if cfunc else scale_add,
    )


def test_every_kind_of_boundary_in_the_generated_source():
    entry = make_entry(interface(), [ArgSource(1), ConstSource(2.0)], ReturnTuple((1, 0)))
    assert entry.source == (
        "def entry(args):\n"
        "    a0 = args[1]\n"
        "    a1 = c1\n"
        "    if not h0(a1):\n"
        "        raise RuntimeError(m0)\n"
        "    o0 = empty_strided((2, 3), (1, 2), dt0)\n"
        "    run([a0, a1, t2, o0])\n"
        "    return (a0, o0, )\n"
    )
    a = torch.randn(2, 3)
    got, out = entry([None, a])
    assert got is a and out.stride() == (1, 2)
    torch.testing.assert_close(out, a * 2 + 10)


def test_machine_code_gets_pointers_and_numbers():
    calls = []
    entry = make_entry(interface(lambda *args: calls.append(args)), [ArgSource(0), ArgSource(1)],
                       ReturnOne(0))
    assert "    cfunc(a0.data_ptr(), a1, t2.data_ptr(), o0.data_ptr())\n" in entry.source
    a = torch.randn(2, 3)
    out = entry([a, 3.0])
    assert calls == [(a.data_ptr(), 3.0, calls[0][2], out.data_ptr())]


def test_checks_run_before_the_call():
    entry = make_entry(interface(), [ArgSource(0), ArgSource(1)], ReturnList())
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        entry([torch.randn(2, 3), 0.0])
    assert len(entry([torch.randn(2, 3), 1.0])) == 2


def test_run_checks_the_input_types():
    graph = torch._C.parse_ir("""
    graph(%a : Float(4, strides=[1], requires_grad=0, device=cpu), %s : float):
      %x : Tensor = aten::mul(%a, %s)
      %y : Tensor = aten::sin(%x)
      return (%y)
    """)
    kernel = nncfuse.TensorExprKernel(graph)
    a = torch.randn(4)
    torch.testing.assert_close(kernel.run([a, 2.0]), torch.sin(a * 2))
    kernel.run([a.clone().requires_grad_(), 2.0])  # requires_grad aside
    for bad, message in [
        ([a], "takes 2 inputs"),
        ([torch.randn(5), 2.0], "input 0 does not match"),
        ([a.double(), 2.0], "input 0 does not match"),
        ([torch.randn(8)[::2], 2.0], "input 0 does not match"),
        ([a, a], "input 1 must be a number"),
    ]:
        with pytest.raises(ValueError, match=message):
            kernel.run(bad)


def test_a_dynamic_kernel_allocates_a_0_dim_output():
    """A dynamic kernel's 0-dim output (a full reduction, the int4 product's check): strides
    `()` (the entry once spelled them `(,)`, a syntax error)."""
    graph = torch._C.parse_ir("""
    graph(%a : Float(4, 3, strides=[3, 1], requires_grad=0, device=cpu)):
      %none : NoneType = prim::Constant()
      %y : Float(requires_grad=0, device=cpu) = aten::sum(%a, %none)
      return (%y)
    """)
    kernel = nncfuse.TensorExprKernel(graph, dynamic=True)
    assert kernel.dynamic
    for shape in [(4, 3), (7, 5), (0, 2)]:
        a = torch.randn(shape)
        got = kernel.run([a])
        assert got.shape == () and got.stride() == ()
        torch.testing.assert_close(got, a.sum())
