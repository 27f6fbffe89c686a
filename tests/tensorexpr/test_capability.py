"""ATEN_CPU_CAPABILITY narrows nncfuse's LLVM target and vector math as it narrows eager's."""

import os
import subprocess
import sys

import pytest

from nncfuse.tensorexpr import capability
from nncfuse.tensorexpr.codegen.llvm_jit import narrowed

FEATURES = "+64bit,+amx-tile,+avx,+avx10.1,+avx2,+avx512f,+avx512fp16,+avxvnni,+f16c,+fma,+sse4.2"


def test_narrowed_feature_strings():
    assert narrowed(FEATURES, capability.AVX512) == FEATURES
    assert narrowed(FEATURES, capability.AVX2) == (
        "+64bit,-amx-tile,+avx,-avx10.1,+avx2,-avx512f,-avx512fp16,+avxvnni,+f16c,+fma,+sse4.2"
    )
    assert narrowed(FEATURES, capability.DEFAULT) == (
        "+64bit,-amx-tile,-avx,-avx10.1,-avx2,-avx512f,-avx512fp16,-avxvnni,-f16c,-fma,+sse4.2"
    )


PROGRAM = """
import torch
from nncfuse.tensorexpr import capability
from nncfuse.tensorexpr.codegen.llvm_jit import host_features, vector_bits
import nncfuse
from nncfuse.jit.fuser.runtime import kernel_of
def f(a, b, c):
    return torch.exp(torch.addcmul(a, b, c)) + torch.sin(a)
g = nncfuse.jit(f)
a, b, c = (torch.randn(1003) for _ in range(3))
g(a, b, c)
torch.testing.assert_close(g(a, b, c), f(a, b, c))
(group,) = nncfuse.fusion_groups(g.graph_for(a, b, c))
ir = kernel_of(group).jit.ir_text
print(capability.aten_capability(), vector_bits(), "avx512f" in host_features(),
      "fma" in host_features(), "Sleef_" in ir, "llvm.fma" in ir)
"""


def run(aten_capability, tmp_path):
    env = {**os.environ, "ATEN_CPU_CAPABILITY": aten_capability}
    script = tmp_path / "program.py"  # a file: TorchScript reads the function's source
    script.write_text(PROGRAM)
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


@pytest.mark.parametrize("aten_capability", ["avx2", "default"])
def test_narrowed_capability_narrows_the_target(aten_capability, tmp_path):
    got = run(aten_capability, tmp_path)
    if got[0] != aten_capability:  # the CPU has less than asked for: nothing to narrow
        pytest.skip(f"eager runs {got[0]} kernels here")
    if aten_capability == "avx2":
        assert got[1:] == ["256", "False", "True", "True", "True"]
    else:  # libm lane by lane, multiply-adds rounded twice, SSE registers
        assert got[1:] == ["128", "False", "False", "False", "False"]
