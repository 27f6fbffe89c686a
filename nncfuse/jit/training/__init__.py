"""Fused training on TorchScript graphs: autodiff's differentiable graphs (`autodiff`), or
AOTAutograd's joint graphs (`autograd`), with the graph rewrites that make them fuse
(decompositions of ATen's backward ops, identities dropped, views moved in, pads folded).
Built on the specialization policy and the fuser below it.
"""
