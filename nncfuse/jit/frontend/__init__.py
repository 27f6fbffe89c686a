"""The front end: what `nncfuse.jit` returns and what it runs.

`function.FusedFunction` scripts (or takes) the user's function or module, binds each call's
arguments and hands them to the specialization policy; `freezing.FrozenFunction` does the same
for an eval-mode module frozen into constants (`freeze=True`). Nothing below imports these.
"""
