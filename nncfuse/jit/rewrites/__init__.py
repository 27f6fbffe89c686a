"""Graph rewrites on TorchScript graphs that more than one front of the jit runs, below
them all: zero pads folded into convolutions (`conv_pads`: training's autodiff graphs
and frozen inference).
"""
