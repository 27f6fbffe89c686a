"""Specialization: which signature gets which plan. Profiling and meta-typing observe input
types, the policy maps signatures (static, size classes, dynamic) to plans within a bound, and
`fxgraph` brings FX graphs (the torch.compile backend, AOTAutograd) to the same policy.
"""
