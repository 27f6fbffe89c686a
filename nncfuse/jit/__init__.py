"""The TorchScript side, by role, top to bottom (imports only go down):

    frontend/    nncfuse.jit's FusedFunction and frozen inference
    training/    fused forward and backward (autodiff, AOTAutograd) and their graph rewrites
    specialize/  profiling, signatures -> plans, FX graphs to TorchScript
    fuser/       fusion groups, guards, the runtime's custom ops
"""
