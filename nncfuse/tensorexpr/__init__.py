"""The loop-nest compiler: IR, lowerings, passes, codegen and the kernel that runs them."""

from . import ir_printer  # noqa: F401 - installs str() for IR nodes (expr.PRINTERS)
