"""The fuser: fusion groups formed in a typed TorchScript graph (`tensorexpr_fuser`, with the
group surgery of `subgraph` and the rules of `supported`, `sizes`, `inplace`), guarded by
`prim::TypeCheck` and a fallback (`guard`), and run as `torch.library` ops (`runtime`).
"""
