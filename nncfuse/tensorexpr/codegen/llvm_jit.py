"""LLVM through llvmlite: the host target machine, the O3 pipeline, and JIT engines.

The target machine is built from the host CPU's name and features (as numba
does), so the code uses AVX-512 where the machine has it. Each compiled
module gets its own MCJIT engine, which takes ownership of a fresh target
machine; the engine lives as long as the `JitFunction` that holds it.
External symbols resolve against the process, `libtorch_cpu.so`, whose
SLEEF vector math the codegen calls, and torch's `libgomp.so.1`, whose
GOMP_parallel runs parallel loops on the threads torch uses.
"""

from __future__ import annotations

import ctypes
import functools
import os
from dataclasses import dataclass, field
from typing import Any

import llvmlite.binding as llvm
import torch


@functools.cache
def _initialize() -> None:
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    for name in ("libtorch_cpu.so", "libgomp.so.1"):
        path = torch_library(name)
        if os.path.exists(path):
            llvm.load_library_permanently(path)


def torch_library(name: str = "libtorch_cpu.so") -> str:
    """Path of a library torch ships: libtorch_cpu.so exports SLEEF, libgomp.so.1 OpenMP."""
    return os.path.join(os.path.dirname(torch.__file__), "lib", name)


@functools.cache
def host_cpu() -> tuple[str, str]:
    """The host CPU's LLVM name and feature string."""
    _initialize()
    return llvm.get_host_cpu_name(), llvm.get_host_cpu_features().flatten()


def host_features() -> set[str]:
    return {f[1:] for f in host_cpu()[1].split(",") if f.startswith("+")}


@functools.cache
def vector_bits() -> int:
    """Width in bits of the host's widest SIMD registers that LLVM will use."""
    features = host_features()
    if "avx512f" in features:
        return 512
    if "avx" in features:
        return 256
    return 128


def target_machine() -> llvm.TargetMachine:
    """A new target machine for the host, optimizing at -O3."""
    _initialize()
    cpu, features = host_cpu()
    target = llvm.Target.from_default_triple()
    return target.create_target_machine(
        cpu=cpu, features=features, opt=3, reloc="default", codemodel="jitdefault", jit=True
    )


@functools.cache
def has_symbol(name: str) -> bool:
    """Whether the process or libtorch_cpu.so exports `name`."""
    _initialize()
    return bool(llvm.address_of_symbol(name))


def optimize(module: llvm.ModuleRef, tm: llvm.TargetMachine) -> None:
    """Run LLVM's O3 module pipeline on `module` in place."""
    pto = llvm.create_pipeline_tuning_options(speed_level=3)
    pb = llvm.create_pass_builder(tm, pto)
    pb.getModulePassManager().run(module, pb)


@dataclass
class JitFunction:
    """A function compiled to machine code, callable through ctypes."""

    name: str
    address: int
    cfunc: Any
    engine: Any = field(repr=False)
    optimized_ir: str = ""
    assembly: str = ""


def compile_ir(
    ir_text: str,
    name: str,
    restype: Any,
    argtypes: list[Any],
    want_assembly: bool = False,
    release_gil: bool = True,
) -> JitFunction:
    """Parse, verify, optimize and JIT `ir_text`; return its function `name`.

    The ctypes wrapper releases the GIL during calls unless `release_gil` is False.
    """
    _initialize()
    module = llvm.parse_assembly(ir_text)
    module.verify()
    tm = target_machine()
    module.triple = tm.triple
    module.data_layout = str(tm.target_data)
    optimize(module, tm)
    assembly = tm.emit_assembly(module) if want_assembly else ""
    optimized = str(module)
    engine = llvm.create_mcjit_compiler(module, tm)
    engine.finalize_object()
    address = engine.get_function_address(name)
    prototype = ctypes.CFUNCTYPE if release_gil else ctypes.PYFUNCTYPE
    cfunc = prototype(restype, *argtypes)(address)
    return JitFunction(name, address, cfunc, engine, optimized, assembly)
