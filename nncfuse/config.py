"""Options: environment variables with keyword overrides, in one dataclass."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

VERSION = "0.1.0"


def cpu_info(field: str) -> str | None:
    """The first `field` of /proc/cpuinfo ("vendor_id", "model name"), or None."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(field):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() not in ("", "0", "false", "no", "off")


@dataclass(frozen=True)
class Options:
    """How nncfuse fuses and runs a function.

    min_group_size:      fusion groups with fewer nodes stay unfused.
    profiling_runs:      calls profiled per input signature before optimizing.
    max_specializations: plans optimized per function (static or dynamic, see `dynamic`);
                         calls of further size classes run unfused. 12, as many as
                         PyTorch's profiling executor makes by default (2 static + 10
                         dynamic).
    use_llvm:            compile kernels with LLVM (else the IR interpreter runs them);
                         NNCFUSE_DONT_USE_LLVM=1 turns it off.
    disable:             run everything unfused (NNCFUSE_DISABLE=1).
    verify:              check the IR (`ir_verifier`) after every schedule pass, not only
                         at the end, naming the pass that broke it (NNCFUSE_VERIFY=1).
    strict:              raise StrictFusionError from calls whose optimized graph leaves a
                         fusible-looking node unfused (NNCFUSE_STRICT=1; see nncfuse.explain).
    freeze:              for an eval-mode nn.Module: run it frozen (`jit/frontend/freezing.py`), its
                         parameters constants, guarded by their identity and version (True),
                         and also their values ("checked": sees writes through `.data`).
    dynamic:             symbolic sizes, as torch.compile's option: None (default) compiles
                         a static kernel first and a dynamic one (sizes bound at run time)
                         when a signature differs only in its sizes; True dynamic kernels
                         from the first call; False static kernels only. NNC's fusion
                         strategy, e.g. `[("STATIC", 2), ("DYNAMIC", 10)]`, is accepted
                         too: that many static signatures, then that many dynamic kernels.
                         Either way at most `max_specializations` kernels per function.
    autograd:            how `nncfuse.jit` trains: "autodiff" (default) runs TorchScript's
                         autodiff as NNC did (`jit/training/autodiff.py`); "aot" traces with
                         AOTAutograd (`jit/training/autograd.py`; NNCFUSE_AUTOGRAD=aot). The
                         torch.compile backend trains through AOTAutograd unless this is
                         given as "autodiff" (`make_backend(autograd=...)`, the variable).
    """

    min_group_size: int = 2
    profiling_runs: int = 1
    max_specializations: int = 12
    use_llvm: bool = True
    disable: bool = False
    verify: bool = False
    strict: bool = False
    freeze: bool | str = False
    dynamic: bool | None | tuple[tuple[str, int], ...] = None
    autograd: str = "autodiff"

    def __post_init__(self) -> None:
        if isinstance(self.dynamic, list | tuple):  # a fusion strategy
            strategy = tuple((str(kind).upper(), int(n)) for kind, n in self.dynamic)
            if any(kind not in ("STATIC", "DYNAMIC") or n < 0 for kind, n in strategy):
                raise ValueError(f"fusion strategy {self.dynamic!r}: (STATIC|DYNAMIC, n>=0)")
            object.__setattr__(self, "dynamic", strategy)
        elif self.dynamic not in (None, True, False):
            raise ValueError("dynamic must be None, True, False or a fusion strategy")
        if self.min_group_size < 1:
            raise ValueError("min_group_size must be at least 1")
        if self.profiling_runs < 1:
            raise ValueError("profiling_runs must be at least 1")
        if self.max_specializations < 0:
            raise ValueError("max_specializations must be non-negative")
        if self.freeze not in (False, True, "checked"):
            raise ValueError("freeze must be False, True or 'checked'")
        if self.autograd not in ("aot", "autodiff"):
            raise ValueError("autograd must be 'aot' or 'autodiff'")

    @staticmethod
    def from_env(**overrides: object) -> Options:
        """Options from the environment, then `overrides` (unknown names raise TypeError)."""
        names = {f.name for f in dataclasses.fields(Options)}
        unknown = set(overrides) - names
        if unknown:
            raise TypeError(f"unknown nncfuse options: {sorted(unknown)}")
        env = {
            "use_llvm": not _env_flag("NNCFUSE_DONT_USE_LLVM"),
            "disable": _env_flag("NNCFUSE_DISABLE"),
            "verify": _env_flag("NNCFUSE_VERIFY"),
            "strict": _env_flag("NNCFUSE_STRICT"),
            "autograd": os.environ.get("NNCFUSE_AUTOGRAD", "").strip().lower() or "autodiff",
        }
        return Options(**{**env, **overrides})  # type: ignore[arg-type]
