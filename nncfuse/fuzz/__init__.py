"""The differential fuzzer (tooling, not product): `python -m nncfuse.fuzz -n N`.

`program` generates random elementwise programs over `op_specs` and `inputs`;
`oracle` checks one against eager PyTorch; `minimize` shrinks a failing one;
`cli` runs many in worker processes.
"""
