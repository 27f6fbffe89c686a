"""The fuzzer's op table: every elementwise op nncfuse fuses, as eager PyTorch spells it.

Each `OpSpec` is one way to call an op in TorchScript source (which is also
Python source, so the same text runs eagerly). Its template names operands
`{0}`, `{1}`, ... and one letter per operand says what may go there:

    t  a tensor        n  a tensor or a Python number
    s  a Python number m  a bool tensor (a mask or a `where` condition)

`dtypes` is the class of dtypes the op's tensor operands are drawn from; the
generator still runs every call eagerly before accepting it, so the class
only has to make most draws well typed, not all. `approx` marks ops whose
eager result is not correctly rounded (libm/SLEEF calls, fused multiply-adds,
multi-step formulas): their results may differ from nncfuse's in the last
ulp, and the checker perturbs them by a few ulps to tell noise from bugs.
`divides` marks the one division where eager itself dies of SIGFPE on
INT_MIN / -1 (rounding_mode="trunc"), so the generator keeps that pair away;
elsewhere eager handles it, and nncfuse must too. `finite_quotient` marks
fmod and remainder, whose float results eager computes two ways that
disagree once `a / b` overflows (its vector loop returns NaN, its scalar
tail the exact remainder, so the answer depends on the element's position):
the generator keeps such operands away, as there is no one answer to match.
`overflow_band` marks sinh and cosh, which eager's vector loop (SLEEF) takes
to infinity once |x| exceeds log(max float) while its scalar tail (libm)
stays finite up to log(2 max float): operands in between are kept away too.
`zero_sign` marks min/max-like ops, whose zero's sign also depends on the
loop (max(0.0, -0.0) is 0.0 in eager's scalar loop, -0.0 in its vector
loop): the checker flips the sign of their zeros when it looks for noise.
`magnitude` (sums and means) is the scale of that noise when it is not the
result's own: a float sum's rounding depends on the order of its additions,
and is bounded by the sum of the magnitudes of its terms, not by its result
(`max + -max + 0.5` is 0.5 in one order and 0 in another).

Spellings that TorchScript compiles differently from eager (`2.0 - x` is
`neg` then `add`, wrong for uint8; `2.0 / x` is `reciprocal` then `mul`)
are left out: they would test TorchScript, not nncfuse.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch

F = "torch.nn.functional."

#: dtype classes an op's tensor operands are drawn from.
FLOATS = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
INTEGERS = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)
DTYPE_CLASSES: dict[str, tuple[torch.dtype, ...]] = {
    "any": (*FLOATS, *INTEGERS, torch.bool),
    "nobool": (*FLOATS, *INTEGERS),
    "float": FLOATS,
    "int": (*INTEGERS, torch.bool),
    "intnb": INTEGERS,
}

#: Every op name the fuzzer must cover (the brief's list, in its spelling).
OP_NAMES = (
    "add sub rsub mul div true_divide floor_divide neg abs reciprocal sqrt rsqrt square exp "
    "expm1 log log2 log10 log1p sin cos tan asin acos atan sinh cosh tanh sigmoid erf erfc "
    "lgamma floor ceil round trunc frac sign relu relu6 leaky_relu elu gelu silu mish softplus "
    "hardtanh hardsigmoid hardswish hardshrink threshold pow atan2 fmod remainder maximum "
    "minimum max min clamp clamp_min clamp_max where masked_fill lerp addcmul eq ne lt le gt "
    "ge isnan logical_not bitwise_and bitwise_or bitwise_xor bitwise_not bitwise_left_shift "
    "bitwise_right_shift type_as to"
).split()


@dataclass(frozen=True)
class OpSpec:
    """One spelling of one op: `template.format(*operands, **extras)` is the call."""

    name: str
    template: str
    operands: str = "t"
    dtypes: str = "any"
    extras: Mapping[str, Sequence[str]] = field(default_factory=dict)
    approx: bool = False
    divides: bool = False
    finite_quotient: bool = False
    overflow_band: bool = False
    zero_sign: bool = False
    magnitude: str = ""  # a template like `template`: the noise's scale (see above)
    weight: float = 1.0

    def __post_init__(self) -> None:
        assert set(self.operands) <= set("tnsm"), self.operands
        assert self.dtypes in DTYPE_CLASSES, self.dtypes


def _spellings(
    name: str, templates: Sequence[str], operands: str, weight: float = 1.0, **kw: object
) -> list[OpSpec]:
    """The same op under several templates; the op's weight is shared among them."""
    share = weight / len(templates)
    return [OpSpec(name, t, operands, weight=share, **kw) for t in templates]  # type: ignore


def _binary(name: str, operator: str | None = None, operands: str = "tn", **kw: object):
    templates = [f"torch.{name}({{0}}, {{1}})"]
    if operator:
        templates.append(f"{{0}} {operator} {{1}}")
    return _spellings(name, templates, operands, **kw)


def _unary(names: str, approx: bool, dtypes: str = "any", prefix: str = "torch.") -> list:
    return [OpSpec(n, f"{prefix}{n}({{0}})", dtypes=dtypes, approx=approx) for n in names.split()]


_ALPHA = {"alpha": ["2", "-1", "0.5"]}

ARITHMETIC = [
    *_binary("add", "+"),
    OpSpec("add", "torch.add({0}, {1}, alpha={alpha})", "tn", extras=_ALPHA, approx=True),
    OpSpec("add", "{0} + {1}", "st", weight=0.3),
    *_binary("sub", "-", dtypes="nobool"),
    OpSpec("sub", "torch.sub({0}, {1}, alpha={alpha})", "tn", "nobool", _ALPHA, approx=True),
    OpSpec("rsub", "torch.rsub({0}, {1})", "tn", "nobool"),
    OpSpec("rsub", "torch.rsub({0}, {1}, alpha={alpha})", "tn", "nobool", _ALPHA, approx=True),
    *_binary("mul", "*"),
    OpSpec("mul", "{0} * {1}", "st", weight=0.3),
    *_binary("div", "/"),
    OpSpec("div", 'torch.div({0}, {1}, rounding_mode="trunc")', "tn", approx=True, divides=True),
    OpSpec("div", 'torch.div({0}, {1}, rounding_mode="floor")', "tn", approx=True),
    *_binary("true_divide"),
    *_binary("floor_divide", "//", dtypes="nobool", approx=True),
    *_binary("pow", "**", approx=True),
    OpSpec("pow", "torch.pow({0}, {1})", "st", approx=True, weight=0.4),
    *_binary("atan2", operands="tt", dtypes="nobool", approx=True),
    *_binary("fmod", dtypes="nobool", approx=True, finite_quotient=True),
    *_binary("remainder", "%", dtypes="nobool", approx=True, finite_quotient=True),
    OpSpec("remainder", "torch.remainder({0}, {1})", "st", "nobool", weight=0.3, approx=True,
           finite_quotient=True),
    OpSpec("lerp", "torch.lerp({0}, {1}, {2})", "ttn", "float", approx=True),
    OpSpec("addcmul", "torch.addcmul({0}, {1}, {2})", "ttt", "nobool", approx=True),
    OpSpec("addcmul", "torch.addcmul({0}, {1}, {2}, value={v})", "ttt", "nobool",
           {"v": ["2", "-0.5"]}, approx=True),
]

UNARY = [
    *_unary("exp expm1 log log2 log10 log1p sin cos tan asin acos atan tanh", True),
    *(OpSpec(n, f"torch.{n}({{0}})", approx=True, overflow_band=True) for n in ("sinh", "cosh")),
    # Eager's float32 sqrt is not correctly rounded on every machine (one ulp off for 17% of
    # the integers below 10**5 on an AMD EPYC): seed 400238, exp(exp(sqrt(19))).
    *_unary("sigmoid erf erfc lgamma rsqrt sqrt", True),
    *_unary("reciprocal square floor ceil trunc sign", False),
    *_unary("neg abs", False, dtypes="nobool"),
    *_unary("frac", False, dtypes="float"),
    OpSpec("round", "torch.round({0})"),
    OpSpec("round", "torch.round({0}, decimals={d})", dtypes="float",
           extras={"d": ["1", "2", "-1"]}, approx=True, weight=0.5),
]

ACTIVATIONS = [
    *_spellings("relu", ["torch.relu({0})", F + "relu({0})"], "t", dtypes="nobool",
                zero_sign=True),
    OpSpec("relu6", F + "relu6({0})", dtypes="nobool", zero_sign=True),
    OpSpec("leaky_relu", F + "leaky_relu({0}, {slope})", dtypes="float",
           extras={"slope": ["0.01", "0.2", "-1.5"]}),
    OpSpec("elu", F + "elu({0}, {alpha})", dtypes="float", extras={"alpha": ["1.0", "0.5"]},
           approx=True),
    OpSpec("gelu", F + "gelu({0}{approximate})", dtypes="float",
           extras={"approximate": ["", ', approximate="none"', ', approximate="tanh"']},
           approx=True),
    *_unary("silu mish hardsigmoid hardswish", True, dtypes="float", prefix=F),
    OpSpec("softplus", F + "softplus({0}, {beta}, {threshold})", dtypes="float",
           extras={"beta": ["1.0", "2.0", "0.5"], "threshold": ["20.0", "1.0"]}, approx=True),
    OpSpec("hardtanh", F + "hardtanh({0}, {lo}, {hi})", dtypes="nobool",
           extras={"lo": ["-1.0", "-0.5", "0.0"], "hi": ["1.0", "2.5"]}, zero_sign=True),
    OpSpec("hardshrink", F + "hardshrink({0}, {lambd})", dtypes="float",
           extras={"lambd": ["0.5", "1.0", "0.0"]}),
    OpSpec("threshold", F + "threshold({0}, {th}, {value})", dtypes="nobool",
           extras={"th": ["0.5", "0.0", "-1.0"], "value": ["2.0", "-3.0", "0.0"]}),
]

_MINMAX = [
    *_binary("maximum", operands="tt", zero_sign=True),
    *_binary("minimum", operands="tt", zero_sign=True),
    OpSpec("max", "torch.max({0}, {1})", "tt", zero_sign=True),
    OpSpec("min", "torch.min({0}, {1})", "tt", zero_sign=True),
]
_CLAMP_SPELLINGS = [
    ("torch.clamp({0}, {1}, {2})", "tss"),
    ("torch.clamp({0}, {1}, {2})", "ttt"),
    ("torch.clamp({0}, min={1})", "ts"),
    ("torch.clamp({0}, max={1})", "ts"),
    ("torch.clamp({0}, min={1})", "tt"),
    ("torch.clamp({0}, max={1})", "tt"),
]
MINMAX = [
    *_MINMAX,
    *(OpSpec("clamp", t, o, "nobool", weight=1.5 / len(_CLAMP_SPELLINGS), zero_sign=True)
      for t, o in _CLAMP_SPELLINGS),
    *_binary("clamp_min", dtypes="nobool", zero_sign=True),
    *_binary("clamp_max", dtypes="nobool", zero_sign=True),
]

SELECT = [
    OpSpec("where", "torch.where({0}, {1}, {2})", "mnn", weight=1.5),
    *_spellings("masked_fill", ["{0}.masked_fill({1}, {2})", "torch.masked_fill({0}, {1}, {2})"],
                "tms"),
]

_COMPARE_OPERATORS = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}
COMPARE = [
    *(spec for name, op in _COMPARE_OPERATORS.items() for spec in _binary(name, op)),
    OpSpec("isnan", "torch.isnan({0})"),
    OpSpec("logical_not", "torch.logical_not({0})"),
]

BITWISE = [
    *_binary("bitwise_and", "&", dtypes="int"),
    *_binary("bitwise_or", "|", dtypes="int"),
    *_binary("bitwise_xor", "^", dtypes="int"),
    *_spellings("bitwise_not", ["torch.bitwise_not({0})", "~{0}"], "t", dtypes="int"),
    *_binary("bitwise_left_shift", "<<", dtypes="intnb"),
    *_binary("bitwise_right_shift", ">>", dtypes="intnb"),
]

_DTYPE_NAMES = [
    "float32", "float64", "float16", "bfloat16", "int8", "int16", "int32", "int64", "uint8",
    "bool",
]
CASTS = [
    OpSpec("type_as", "{0}.type_as({1})", "tt"),
    OpSpec("to", "{0}.to(torch.{dtype})", extras={"dtype": _DTYPE_NAMES}, weight=1.5),
]

#: The whole table.
OPS: list[OpSpec] = [*ARITHMETIC, *UNARY, *ACTIVATIONS, *MINMAX, *SELECT, *COMPARE, *BITWISE,
                     *CASTS]

#: Number literals the generator puts into programs (printed as TorchScript accepts them).
FLOAT_LITERALS = ["0.5", "-1.5", "2.0", "3.0", "-2.0", "0.25", "0.0", "1e-3", "100.0", "-7.75",
                  'float("inf")', 'float("-inf")', 'float("nan")']
FLOAT_LITERAL_WEIGHTS = [4, 3, 4, 2, 2, 2, 1, 1, 1, 1, 0.3, 0.3, 0.3]
INT_LITERALS = ["1", "2", "3", "-1", "-2", "5", "0", "7", "100"]
INT_LITERAL_WEIGHTS = [4, 4, 3, 3, 2, 1, 0.4, 1, 0.5]


# -- reductions (issue #10) ----------------------------------------------------------------------
# Drawn by their own step of the generator (`program.py`, its reductions section), not from
# `OPS`. Dims that do not fit the operand's rank make eager raise, and the draw is redone.
# Float sums round in another order than eager's cascade (`approx`); max-like reductions
# compare zeros of either sign equal (`zero_sign`).

_DIM = {"dim": ["-1", "0", "1", "(0, -1)", "[-1]"], "keep": ["", ", keepdim=True"]}
_ONE_DIM = {"dim": ["-1", "0", "1"], "keep": ["", ", keepdim=True"]}
_CORRECTION = {"dim": ["-1", "0", "(0, -1)"], "c": ["0", "1", "2"], "k": ["False", "True"]}

REDUCTIONS = [
    OpSpec("sum", "{0}.sum({dim}{keep})", dtypes="nobool", extras=_DIM, approx=True,
           magnitude="{0}.double().abs().sum({dim}{keep})"),
    OpSpec("sum", "torch.sum({0})", approx=True, weight=0.5, magnitude="{0}.double().abs().sum()"),
    OpSpec("mean", "{0}.mean({dim}{keep})", dtypes="float", extras=_DIM, approx=True,
           magnitude="{0}.double().abs().mean({dim}{keep})"),
    OpSpec("prod", "{0}.prod({dim}{keep})", dtypes="nobool", extras=_ONE_DIM, approx=True,
           weight=0.5),
    OpSpec("amax", "{0}.amax({dim}{keep})", extras=_DIM, zero_sign=True),
    OpSpec("amin", "{0}.amin({dim}{keep})", extras=_DIM, zero_sign=True),
    OpSpec("max", "torch.max({0}, {dim}{keep})[{k}]", extras={**_ONE_DIM, "k": ["0", "1"]},
           zero_sign=True),
    OpSpec("min", "torch.min({0}, {dim}{keep})[{k}]", extras={**_ONE_DIM, "k": ["0", "1"]},
           zero_sign=True),
    OpSpec("max", "torch.max({0})", zero_sign=True, weight=0.3),
    OpSpec("argmax", "{0}.argmax({dim}{keep})", dtypes="nobool", extras=_ONE_DIM),
    OpSpec("argmin", "{0}.argmin({dim}{keep})", dtypes="nobool", extras=_ONE_DIM),
    OpSpec("any", "{0}.any({dim}{keep})", extras=_ONE_DIM, weight=0.5),
    OpSpec("all", "{0}.all({dim}{keep})", extras=_ONE_DIM, weight=0.5),
    OpSpec("var", "torch.var({0}, {dim}, correction={c}, keepdim={k})", dtypes="float",
           extras=_CORRECTION, approx=True),
    OpSpec("std", "torch.std({0}, {dim}, correction={c}, keepdim={k})", dtypes="float",
           extras=_CORRECTION, approx=True, weight=0.5),
    OpSpec("var_mean", "torch.var_mean({0}, {dim}, correction={c}, keepdim={k})[{i}]",
           dtypes="float", extras={**_CORRECTION, "i": ["0", "1"]}, approx=True),
    OpSpec("logsumexp", "torch.logsumexp({0}, {dim}{keep})", dtypes="float", extras=_DIM,
           approx=True),
    OpSpec("softmax", "torch.softmax({0}, {dim})", dtypes="float", extras=_ONE_DIM, approx=True),
    OpSpec("log_softmax", "torch.log_softmax({0}, {dim})", dtypes="float", extras=_ONE_DIM,
           approx=True),
    OpSpec("vector_norm", "torch.linalg.vector_norm({0}, {p}, {dim})", dtypes="float",
           extras={"p": ["2", "1", 'float("inf")'], "dim": ["-1", "0"]}, approx=True),
    OpSpec("dropout", F + "dropout({0}, 0.5, False)", dtypes="float", weight=0.5),
]


# -- data movement (issue 11): views, slices, cats, chunks, writes through views -----------------
#
# Not `OpSpec`s: their operands come from the operand's shape. In each template `{x}` is the
# operand and the other fields are drawn from its shape (`program._movement_fields`): `d`,
# `e` dims (`d1` up to one past the last, for a new dim), `i` an index and `lo`, `hi` a range
# along `d`, `step` a slice step, `perm` a permutation, `split` two sizes that add up to `d`'s,
# `flat` the product of the sizes, `reps` a repeat per dim, `factor` 1 or 2, `n` a
# length, `keep` a -1 per dim. Draws that eager rejects (a view
# of a non-contiguous tensor, `t()` of a 3-d one) are redrawn, as for ops.

#: Views, slices and reshapes; their results are views of `{x}` in eager.
VIEWS = (
    "{x}.t()", "{x}.transpose({d}, {e})", "{x}.permute({perm})", "{x}.movedim({d}, {e})",
    "{x}.unsqueeze({d1})", "{x}.squeeze()", "{x}.flatten()", "{x}.reshape(-1)",
    "{x}.view(-1)", "{x}.view({flat})", "{x}.unflatten({d}, ({factor}, -1))",
    "{x}[{lo}:{hi}]", "{x}[..., {lo}::{step}]", "{x}.narrow({d}, {lo}, {n})",
    "{x}.select({d}, {i})", "{x}[{i}]", "{x}.unsqueeze(0).expand(2, {keep})",
)
#: Ops that move data into a fresh tensor, still as index arithmetic.
MOVES = (
    "{x}.flip({d})", "{x}.roll({step}, {d})", "{x}.repeat({reps})", "{x}.tril()",
    "{x}.triu(1)", "torch.nn.functional.pad({x}, (1, 2))", "{x}.contiguous()",
)
#: Two operands `{x}`, `{y}`.
JOINS = ("torch.cat([{x}, {y}], {d})", "torch.cat([{x}, {y} * 2], {d})",
         "torch.stack([{x}, {y}], {d1})")
#: Several results, unpacked into as many values (`a, b = x.chunk(2, 1)`).
SPLITS = ("{x}.chunk(2, {d})", "{x}.split([{split_a}, {split_b}], {d})", "{x}.unbind({d})")
#: Views that an in-place write goes through (`{view}.add_(v)`, `{view}.relu_()`, ...).
WRITE_VIEWS = ("{x}.t()", "{x}.transpose(0, {d})", "{x}[{i}]", "{x}.view(-1)",
               "{x}.permute({perm})", "{x}[..., ::2]", "{x}.unsqueeze(0)", "{x}.select({d}, {i})")
