"""TensorExprKernel on graphs: LLVM, the interpreter, the fallback and eager agree."""

import pytest
import torch

import nncfuse
from nncfuse.config import Options
from nncfuse.tensorexpr.lowerings import LoweringError

SEED_GRAPH = """
graph(%a : Float(1, 1, 8, 20, strides=[160, 160, 20, 1], requires_grad=0, device=cpu)):
  %x : Tensor = aten::mul(%a, %a)
  %y : Tensor = aten::sin(%x)
  %z : Tensor = aten::mul(%y, %y)
  return (%z)
"""


def kernels(graph_text):
    graph = torch._C.parse_ir(graph_text)
    return [
        nncfuse.TensorExprKernel(graph, Options.from_env(use_llvm=True)),
        nncfuse.TensorExprKernel(graph, Options.from_env(use_llvm=False)),
    ]


def check(graph_text, inputs, eager):
    want = eager(*inputs)
    for kernel in kernels(graph_text):
        got = kernel.run(inputs)
        torch.testing.assert_close(got, want, equal_nan=True)
        torch.testing.assert_close(kernel.fallback(inputs), want, equal_nan=True)
        if isinstance(want, torch.Tensor):
            assert got.stride() == want.stride() and got.dtype == want.dtype


def test_seed_graph_with_incomplete_intermediate_types():
    a = torch.randn(1, 1, 8, 20)
    check(SEED_GRAPH, [a], lambda a: torch.sin(a * a) * torch.sin(a * a))
    (llvm, interp) = kernels(SEED_GRAPH)
    assert "Sleef_sinf" in llvm.get_code_text("ir") or "sin" in llvm.get_code_text("ir")
    assert "Ramp" in str(llvm.stmt) and "Allocate" not in str(llvm.stmt)
    assert "call" in llvm.get_code_text() or "vmul" in llvm.get_code_text()


def test_scalar_inputs_and_constants_are_arguments():
    graph = """
    graph(%a : Float(5, 3, strides=[3, 1], requires_grad=0, device=cpu), %s : float, %n : int):
      %one : int = prim::Constant[value=1]()
      %x : Tensor = aten::mul(%a, %s)
      %y : Tensor = aten::add(%x, %n, %one)
      %z : Tensor = aten::div(%y, %s)
      return (%z)
    """
    a = torch.randn(5, 3)
    for s, n in [(0.5, 2), (-3.0, 7)]:
        check(graph, [a, s, n], lambda a, s, n: (a * s + n) / s)


def test_broadcast_transposed_and_multiple_outputs():
    graph = """
    graph(%a : Float(6, 4, strides=[1, 6], requires_grad=0, device=cpu),
          %b : Float(4, strides=[1], requires_grad=0, device=cpu)):
      %one : int = prim::Constant[value=1]()
      %x : Tensor = aten::add(%a, %b, %one)
      %y : Tensor = aten::relu(%x)
      %z : Tensor = aten::sigmoid(%y)
      return (%y, %z)
    """
    a = torch.randn(4, 6).t()
    b = torch.randn(4)
    check(graph, [a, b], lambda a, b: (torch.relu(a + b), torch.sigmoid(torch.relu(a + b))))


@pytest.mark.parametrize("shape", [(), (0, 3), (1,), (17,), (3, 1, 5)])
def test_degenerate_shapes(shape):
    dims = ", ".join(str(d) for d in shape)
    strides = ", ".join(str(s) for s in torch.empty(shape).stride())
    ty = f"Float({dims + ', ' if dims else ''}strides=[{strides}], requires_grad=0, device=cpu)"
    graph = f"""
    graph(%a : {ty}):
      %x : Tensor = aten::exp(%a)
      %y : Tensor = aten::neg(%x)
      return (%y)
    """
    a = torch.randn(shape)
    check(graph, [a], lambda a: -torch.exp(a))


def test_float64_and_extremal_values():
    graph = """
    graph(%a : Double(8, strides=[1], requires_grad=0, device=cpu)):
      %x : Tensor = aten::tanh(%a)
      %y : Tensor = aten::sqrt(%x)
      %z : Tensor = aten::relu(%y)
      return (%z)
    """
    a = torch.tensor(
        [0.0, -0.0, float("nan"), float("inf"), -float("inf"), 1e-300, 0.5, -2.0],
        dtype=torch.float64,
    )
    check(graph, [a], lambda a: torch.relu(torch.sqrt(torch.tanh(a))))


def test_run_checks_inputs_and_requires_complete_types():
    (kernel, _) = kernels(SEED_GRAPH)
    with pytest.raises(ValueError):
        kernel.run([torch.randn(1, 1, 8, 21)])
    with pytest.raises(ValueError):
        kernel.run([torch.randn(1, 1, 20, 8).transpose(2, 3)])
    with pytest.raises(LoweringError):
        nncfuse.TensorExprKernel(
            torch._C.parse_ir("""
        graph(%a : Tensor):
          %x : Tensor = aten::mul(%a, %a)
          return (%x)
        """)
        )


def test_unsupported_op_raises_lowering_error():
    with pytest.raises(LoweringError, match="no lowering"):
        nncfuse.TensorExprKernel(
            torch._C.parse_ir("""
        graph(%a : Float(4, 4, strides=[4, 1], requires_grad=0, device=cpu)):
          %x : Tensor = aten::inverse(%a)
          return (%x)
        """)
        )


def test_half_to_integer_conversion():
    from nncfuse.tensorexpr import expr as E
    from nncfuse.tensorexpr.buffer import Buf
    from nncfuse.tensorexpr.codegen.llvm_codegen import compile_stmt
    from nncfuse.tensorexpr.dtype import FLOAT16, INT32
    from nncfuse.tensorexpr.loopnest import compute

    a = Buf.make("a", FLOAT16, [8])
    out, nest = compute("out", INT32, [8], lambda i: E.Cast(INT32, E.Load(a, (i,))))
    jit = compile_stmt(nest, [a, out])
    x = torch.tensor([1.5, -2.5, 65504.0, -65504.0, 0.0, 7.0, float("inf"), float("nan")],
                     dtype=torch.float16)
    y = torch.empty(8, dtype=torch.int32)
    jit.cfunc(x.data_ptr(), y.data_ptr())
    assert y.tolist() == [1, -2, 65504, -65504, 0, 7, -(2**31), -(2**31)]
