"""Graph rewrites on TorchScript graphs that more than one part of the jit runs, below them
all: zero pads folded into convolutions (`conv_pads`: training's autodiff graphs and frozen
inference), a guarded module's optional tensor attributes as what it holds
(`module_attributes`: the programs the policy specializes), a tuple unpacked where it is
packed as its values (`fold_tuples`: training's graphs and every program the policy
specializes), `type_as` as the `to` it is, with the alias its schema does not say
(`type_as`: every program the policy specializes).
"""
