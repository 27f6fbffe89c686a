"""LLVM through llvmlite: the host target machine, the O3 pipeline, and JIT engines.

The target machine is built from the host CPU's name and features (as numba
does), so the code uses AVX-512 where the machine has it, narrowed to the
instruction set of the kernels eager runs (`capability`: ATEN_CPU_CAPABILITY
=avx2 drops AVX-512, =default everything from AVX and FMA up). Each compiled
module gets its own MCJIT engine, which takes ownership of a fresh target
machine; the engine lives as long as the `JitFunction` that holds it. Optimizing and
emitting use one target machine per thread.
External symbols resolve against the process, `libtorch_cpu.so`, whose
SLEEF vector math the codegen calls, and torch's `libgomp.so.1`, whose
GOMP_parallel runs parallel loops on the threads torch uses.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import threading
from collections import OrderedDict
from typing import Any

import llvmlite
import llvmlite.binding as llvm
import torch

from ... import log
from ...config import VERSION
from .. import capability
from . import object_cache

_log = log.get_logger(__file__)
CACHE_ENV = object_cache.CACHE_ENV


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


#: Features beyond AVX2, and beyond the x86-64 baseline's SSE (AVX-encoded or FMA).
_BEYOND_AVX2 = ("avx512", "avx10", "amx", "evex512")
_BEYOND_DEFAULT = (*_BEYOND_AVX2, "avx", "fma", "xop", "f16c", "vaes", "vpclmulqdq", "sha512",
                   "sm3", "sm4")


def narrowed(features: str, aten_capability: str) -> str:
    """LLVM's feature string `features` without what eager's `aten_capability` kernels lack."""
    beyond = {capability.AVX2: _BEYOND_AVX2, capability.DEFAULT: _BEYOND_DEFAULT}
    drop = beyond.get(aten_capability, ())
    return ",".join(f"-{f[1:]}" if f[1:].startswith(drop) else f for f in features.split(","))


@functools.cache
def host_cpu() -> tuple[str, str]:
    """The host CPU's LLVM name and feature string, narrowed to eager's capability."""
    _initialize()
    features = llvm.get_host_cpu_features().flatten()
    return llvm.get_host_cpu_name(), narrowed(features, capability.aten_capability())


def host_features() -> set[str]:
    return {f[1:] for f in host_cpu()[1].split(",") if f.startswith("+")}


@functools.cache
def vector_bits() -> int:
    """Width in bits of the widest SIMD registers the (narrowed) target has."""
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


_local = threading.local()


def shared_target_machine() -> llvm.TargetMachine:
    """This thread's target machine, for optimizing and emitting (not for an engine, which
    takes ownership of its own): making one costs ~0.25 ms, three a kernel before."""
    tm = getattr(_local, "target_machine", None)
    if tm is None:
        tm = _local.target_machine = target_machine()
    return tm


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


class JitFunction:
    """A function compiled to machine code, callable through ctypes as `cfunc`."""

    def __init__(self, name: str, address: int, cfunc: Any, engine: Any, ir_text: str,
                 module: Any = None):
        self.name, self.address, self.cfunc = name, address, cfunc
        self.engine = engine  # owns the machine code: keep it alive as long as `cfunc`
        self.ir_text = ir_text
        self._module = module
        self._assembly = ""

    def _optimized_module(self) -> Any:
        if self._module is None:  # loaded from the cache: optimize again, for display only
            self._module = _optimized(self.ir_text)
        return self._module

    @property
    def optimized_ir(self) -> str:
        return str(self._optimized_module())

    @property
    def assembly(self) -> str:
        if not self._assembly:
            self._assembly = shared_target_machine().emit_assembly(self._optimized_module())
        return self._assembly


def _optimized(ir_text: str) -> llvm.ModuleRef:
    module = llvm.parse_assembly(ir_text)
    module.verify()
    tm = shared_target_machine()
    module.triple = tm.triple
    module.data_layout = str(tm.target_data)
    optimize(module, tm)
    return module


def _identity(ir_text: str) -> str:
    """What object code compiled from `ir_text` on this host depends on: the disk cache's
    key, also kept in each entry's header, so that a load checks it before LLVM reads it."""
    cpu, features = host_cpu()
    fields = {
        "llvm": ".".join(map(str, llvm.llvm_version_info)),
        "llvmlite": llvmlite.__version__,
        "nncfuse": VERSION,
        "cpu": cpu,
        "features": features,
        "ir": hashlib.sha256(ir_text.encode()).hexdigest(),
    }
    return "".join(f"{name}={value}\n" for name, value in fields.items())


class _ObjectCodeCache:
    """Object code by digest, the most recently used first out of `capacity` bytes: a
    dict's `get`, item assignment and `clear`, with a bound (a process that keeps compiling
    new kernels would otherwise keep every one's code)."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self._codes: OrderedDict[bytes, bytes] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, digest: bytes) -> bytes | None:
        with self._lock:
            code = self._codes.get(digest)
            if code is not None:
                self._codes.move_to_end(digest)
            return code

    def __setitem__(self, digest: bytes, code: bytes) -> None:
        with self._lock:
            old = self._codes.pop(digest, None)
            self._bytes += len(code) - (len(old) if old is not None else 0)
            self._codes[digest] = code
            while self._bytes > self.capacity and self._codes:
                self._bytes -= len(self._codes.popitem(last=False)[1])

    def __len__(self) -> int:
        return len(self._codes)

    def clear(self) -> None:
        with self._lock:
            self._codes.clear()
            self._bytes = 0


#: Object code by the digest of the IR text it was compiled from, for this process: groups
#: whose graphs differ (so the guard's kernel cache tells them apart) can lower to the very
#: same IR (GPT-2's training step: 2 of its 20 kernels, BERT's 1 of 16), which LLVM would
#: optimize and compile again, and a kernel freed with its last function and met again (a
#: function wrapped per request) skips LLVM. The text and the host decide the code, so it is
#: reused. Bounded: 16 MB is thousands of kernels (a small one is ~1 KB).
_compiled = _ObjectCodeCache(16 << 20)


def clear_compiled() -> None:
    """Forget the object code compiled in this process (`_compiled`)."""
    _compiled.clear()


def _object_code(ir_text: str) -> tuple[bytes, Any]:
    """Object code for `ir_text`: compiled earlier in this process, from the on-disk cache,
    or compiled (and cached)."""
    digest = hashlib.sha256(ir_text.encode()).digest()
    code = _compiled.get(digest)
    if code is not None:
        _log.update("Object code of an identical module compiled before")
        return code, None  # the optimized module: made again if shown
    identity = _identity(ir_text) if object_cache.directory() else ""
    if identity:
        code = object_cache.load(identity)  # checked whole: LLVM trusts what it is given
        if code is not None:
            _log.update("Object code from the cache: ", object_cache.entry_path(identity))
            _compiled[digest] = code
            return code, None
    module = _optimized(ir_text)
    code = _compiled[digest] = shared_target_machine().emit_object(module)
    if identity:
        path = object_cache.store(identity, code)
        if path is not None:
            _log.update("Object code cached: ", path)
    return code, module


def compile_ir(
    ir_text: str,
    name: str,
    restype: Any,
    argtypes: list[Any],
    release_gil: bool = True,
) -> JitFunction:
    """Parse, verify, optimize and JIT `ir_text`; return its function `name`.

    With NNCFUSE_CACHE_DIR set, object code is kept on disk (`object_cache`),
    keyed by the IR, the host CPU and the LLVM, llvmlite and nncfuse versions,
    so a later process loads it instead of compiling. The ctypes wrapper
    releases the GIL during calls unless `release_gil` is False.
    """
    _initialize()
    code, module = _object_code(ir_text)
    engine = llvm.create_mcjit_compiler(llvm.parse_assembly(""), target_machine())
    engine.add_object_file(llvm.ObjectFileRef.from_data(code))
    engine.finalize_object()
    address = engine.get_function_address(name)
    prototype = ctypes.CFUNCTYPE if release_gil else ctypes.PYFUNCTYPE
    cfunc = prototype(restype, *argtypes)(address)
    return JitFunction(name, address, cfunc, engine, ir_text, module)
