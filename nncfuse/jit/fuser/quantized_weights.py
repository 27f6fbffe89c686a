"""quantized_weights: matrix products of few rows over int8 or packed int4 weights, as reductions
that read the quantized weight.

Weight-only quantization (torchao's `Int8WeightOnlyConfig`, under AOTAutograd) keeps a
linear's weight as int8 rows `w` (N, K) and a scale per row, and its graphs cast the whole
weight to the activations' dtype before a GEMM:

    %wt : Char(1024, 2816, strides=[1, 1024]) = aten::t(%w)
    %wf : Float(1024, 2816, strides=[1, 1024]) = aten::to(%wt, 6, False, False, None)
    %y : Float(1, 2816) = aten::mm(%x, %wf)
    %z : Float(1, 2816) = aten::mul(%y, %scale)

The cast writes a float copy of the weight (four times its bytes) at every call, and the
GEMM reads it back. For few rows of `x` (decoding: one token), a matrix product is a dot
product per output, so it is written as one, with the cast inside:

    %xu : Float(1, 1, 1024) = aten::unsqueeze(%x, 1)
    %w32 : Float(2816, 1024) = aten::to(%w, 6, False, False, None)
    %p : Float(1, 2816, 1024) = aten::mul(%xu, %w32)
    %y : Float(1, 2816) = aten::sum(%p, [-1], False, None)
    %z : Float(1, 2816) = aten::mul(%y, %scale)

The fuser then makes one kernel of it (the cast and the product inlined into the
reduction, vectorized along the weight's contiguous rows, the scale as its epilogue): it
reads each int8 weight once and converts it in registers. Exact up to the order of the
additions (ATen's GEMM sums in blocks too): an int8 weight is exact in every float type,
and reduced-precision operands are computed in float32 and rounded once, as eager's GEMM
accumulates (bfloat16 and half products are exact in float32):

    %y : BFloat16(1, N) = aten::mm(%x, %wf)      (x: BFloat16)
    ->  ... aten::sum(aten::mul(unsqueeze(x.to(float32), 1), w.to(float32)), [-1]).to(bfloat16)

int4 weights (torchao's `Int4OpaqueTensor`) reach the graph as ATen's
`_weight_int4pack_mm_for_cpu(x, packed, group, scale_and_zero)`, whose float32 kernel is
scalar (its vector kernels are for bfloat16 and half): 5 ms for a 2816 x 1024 weight, 14x
a float32 GEMM. ATen's vector kernels pack rows in blocks of B (64 for AVX-512, 32 for
AVX2): byte `d` of row-block `nb` at `k` holds row `nb*B + d` in its low nibble and row
`nb*B + d + B/2` in its high one, and a weight is `(q - 8) * scale + zero` with the scale
and zero point of its group of `k`. Written out, as the reference kernel computes it:

    %y = aten::_weight_int4pack_mm_for_cpu(%x, %p, 128, %sz)      (x: Float(1, K))
    ->  %p4 = aten::view(%p, [N/B, K/128, 128, B/2])
        %w_lo = ((%p4 & 15).to(float32) - 8) * scale[..., :B/2] + zero[..., :B/2]
        %w_hi = ((%p4 >> 4).to(float32) - 8) * scale[..., B/2:] + zero[..., B/2:]
        %y = cat([sum(x.view(1, 1, K/128, 128, 1) * %w_lo, [2, 3]), sum(... %w_hi ...)], -1)
             .view(1, N)

Of at most `MAX_ROWS` rows, the sums are written with the zero point factored out of each
group (`sum_k x_k * ((q_k - 8) * s + z) = s * (sum_k x_k * q_k - 8 * sum_k x_k) + z *
sum_k x_k`): a weight's product needs no scale and no zero point, only its conversion:

    ->  %xs = sum(x.view(1, 1, K/128, 128), [-1], keepdim)
        %q = (%p4.view(N/B, K/128, 128, 1, B/2).to(int32) & [[15], [240]]).view(.., B)
        %gs = sum(x.view(1, 1, K/128, 128, 1) * %q.to(float32), [3])
        %y = sum((%gs * [1, .., 1/16, ..] - 8 * %xs) * s + %xs * z, [2]).view(1, N)
        %y = %y if all(%y * 0 == 0) else aten::_weight_int4pack_mm_for_cpu(...)   (prim::If)

and the fuser makes it one kernel that reads the packed bytes once, in place, and each
scale and zero point once. A high nibble is not shifted down: each column masks its
nibble in place, which converts to float exactly as `q` or `16 * q`, and the sums of the
high nibbles (16 times theirs, exactly: a product by a power of two) are scaled back. The
low and high nibbles of a row block are one sum over its B columns, each byte zero-extended
once for both of its columns (one vector load and a shuffle: `llvm_codegen`'s window
loads), the products chained in fused multiply-adds (`vectorize_reductions.row_steps`):
0.13 ms for that weight on one core, against 0.14-0.15 ms for the int8 reduction (the
nibbles as two sums, each reading the bytes: 0.155 ms; as first written, with a copy of
the packed bytes per call and each weight dequantized: 0.29 ms). The inner loop is bound
by vector instructions, not bytes (the AMD EPYC issues two 512-bit ones a cycle): per 16
weights a mask, a conversion and a fused multiply-add, and half a zero extension. (The
masks are tensor constants: a dynamic kernel takes them along its static dims.) Factored,
an infinite x (or an overflow) gives NaN where eager's products give an infinity of the
weight's sign, so where the result is not finite, eager's kernel computes it again (a
`prim::If`; its check is part of the kernel). Of more rows, the weights are dequantized as
the reference kernel does, per half of the blocks and transposed to (K, N/2), and
multiplied by a GEMM (which reuses each weight across rows from the caches; the sums read
them once per row): 32 rows, 2.8 ms against 4.5 ms as sums (the int8
product: 2.9 ms).

Left alone: a weight whose K axis is not contiguous (the reduction would not vectorize), an
int8 product with more than `MAX_ROWS` rows or rows of unknown count (an int8 prefill:
there a GEMM reuses each weight from the caches across rows, the reduction does not), int4
products of rows of unknown count, int4 weights of a partial row block or packed by the
default capability (another layout), int4 products of bfloat16 or half activations (ATen's
kernel is vectorized for them), and types the profile does not state. A rewrite that fails
(an op without the overload it needs) leaves the product as it was.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from ... import log
from ...tensorexpr.capability import AVX2, AVX512, aten_capability
from ...tensorexpr.meta import TensorMeta, constant

_log = log.get_logger(__file__)

#: the most rows of `x` written as dot products. Measured on one core (a 2816 x 1024 int8
#: weight, against `torch.mm(x, w.t().float()) * s` in one process): 5x faster than the
#: float copy and the GEMM at 1 row, 2.9x at 4, 1.7x at 8, 1.2x at 16, slower at 32 (the
#: reduction reads the int8 weight once per row). The unfused fallback of the reduction
#: would hold `rows` float copies of the weight.
MAX_ROWS = 8
_WEIGHT_DTYPES = (torch.int8, torch.uint8)
_FLOATS = (torch.float32, torch.bfloat16, torch.float16)
#: ScalarType codes of the float dtypes, as TorchScript graphs spell a `to`'s dtype
_CODES = {torch.float16: 5, torch.float32: 6, torch.bfloat16: 15}


def _meta(value: Any) -> TensorMeta | None:
    return TensorMeta.from_type(value.type())


def _int8_weight(value: Any, dtype: torch.dtype) -> Any | None:
    """The int8 (N, K) weight `w`, rows contiguous, that `value` is `w.t()` cast to `dtype`
    (`to(t(w))` or `t(to(w))`), else None."""
    node = value.node()
    for first, second in (("aten::to", "aten::t"), ("aten::t", "aten::to")):
        inner = node.inputsAt(0).node() if node.kind() == first else None
        if inner is None or inner.kind() != second:
            continue
        cast = node if first == "aten::to" else inner
        if not _plain_cast(cast, dtype):
            return None
        w = inner.inputsAt(0)
        meta = _meta(w)
        if meta and meta.dtype in _WEIGHT_DTYPES and len(meta.sizes) == 2 and (
                meta.strides[1] == 1 or meta.sizes[1] == 1):
            return w
    return None


def _plain_cast(node: Any, dtype: torch.dtype) -> bool:
    """Whether `node` is `aten::to(v, dtype, non_blocking, copy, memory_format)`: a cast to
    `dtype` (a constant, or the dtype of a value the profile types) and nothing else."""
    if node.inputsSize() != 5 or "ScalarType dtype" not in node.schema():
        return False
    code, source = constant(node.inputsAt(1)), node.inputsAt(1).node()
    if source.kind() == "prim::dtype":  # `w.to(x.dtype)`: the profiled dtype of x
        meta = _meta(source.inputsAt(0))
        code = meta and _CODES.get(meta.dtype)
    return code == _CODES[dtype] and constant(node.inputsAt(4)) is None


class _Emitter:
    """New nodes before `before`, each typed by running its op on meta tensors: `op("aten::
    mul", a, b)` takes graph values (with their meta examples) and Python constants."""

    def __init__(self, graph: Any, before: Any):
        self.graph, self.before = graph, before
        self.examples: dict[Any, torch.Tensor] = {}

    def value(self, v: Any) -> Any:
        """A graph value as an operand: known to the emitter, its meta example taken from its
        type."""
        if v not in self.examples:
            self.examples[v] = _meta(v).empty("meta")
        return v

    def _operand(self, v: Any) -> tuple[Any, Any]:
        if isinstance(v, torch._C.Value):
            return self.value(v), self.examples[v]
        with self.graph.insert_point_guard(self.before):
            constant = self.graph.insertConstant(v)
        if isinstance(v, torch.Tensor):  # a tensor constant: typed, its example on meta
            constant.setType(TensorMeta.of(v).to_type())
            v = v.to("meta")
        return constant, v

    def op(self, kind: str, *operands: Any) -> Any:
        values, examples = zip(*(self._operand(v) for v in operands))
        node = self.graph.create(kind, list(values), 1)
        node.insertBefore(self.before)
        schema = torch._C.parse_schema(node.schema())  # (raises where no overload matches)
        positional = [x for x, a in zip(examples, schema.arguments) if not a.kwarg_only]
        keywords = {a.name: x for x, a in zip(examples, schema.arguments) if a.kwarg_only}
        example = getattr(torch.ops.aten, kind[len("aten::"):])(*positional, **keywords)
        out = node.output()
        out.setType(replace(TensorMeta.of(example), device=torch.device("cpu")).to_type())
        self.examples[out] = example
        return out

    def tensors(self, values: list[Any]) -> Any:
        """A `prim::ListConstruct` of tensors."""
        node = self.graph.create("prim::ListConstruct", values, 1)
        node.insertBefore(self.before)
        node.output().setType(torch._C.ListType.ofTensors())
        self.examples[node.output()] = [self.examples[v] for v in values]
        return node.output()

    def to(self, v: Any, dtype: torch.dtype) -> Any:
        """`v.to(dtype)`."""
        return v if self.examples[v].dtype == dtype else self.op(
            "aten::to", v, dtype, False, False, None)

    def unless(self, condition: Any, value: Any, node: Any) -> Any:
        """`value if bool(condition) else <node's op, as it was>` (a `prim::If`)."""
        check = self.graph.create("aten::Bool", [condition], 1)
        check.insertBefore(self.before)
        check.output().setType(torch._C.BoolType.get())
        branch = self.graph.create("prim::If", [check.output()], 1)
        branch.insertBefore(self.before)
        branch.output().setType(value.type())
        branch.addBlock().registerOutput(value)
        otherwise = branch.addBlock()
        again = self.graph.create(node.kind(), list(node.inputs()), 1)
        again.insertBefore(otherwise.returnNode())
        again.output().setType(node.output().type())
        otherwise.registerOutput(again.output())
        return branch.output()

    def replace(self, node: Any, value: Any) -> None:
        """`node`'s output replaced by `value` (typed as the output was), `node` destroyed."""
        value.setType(node.output().type())
        node.output().replaceAllUsesWith(value)
        node.destroy()


def _rewrite_int8(graph: Any, mm: Any) -> bool:
    x, weight = mm.inputsAt(0), mm.inputsAt(1)
    x_meta, out_meta = _meta(x), _meta(mm.output())
    if x_meta is None or out_meta is None or x_meta.dtype not in _FLOATS:
        return False
    if len(x_meta.sizes) != 2 or x_meta.sizes[0] > MAX_ROWS or out_meta.dtype != x_meta.dtype:
        return False
    w = _int8_weight(weight, x_meta.dtype)
    if w is None:
        return False
    e = _Emitter(graph, mm)
    x32, w32 = e.to(e.value(x), torch.float32), e.to(e.value(w), torch.float32)
    y = e.op("aten::sum", e.op("aten::mul", e.op("aten::unsqueeze", x32, 1), w32), [-1], False,
             None)
    e.replace(mm, e.to(y, x_meta.dtype))
    return True


def _int4_layout(x: Any, packed: Any, group: Any, sz: Any) -> tuple[int, int, int, int] | None:
    """(rows, N, K, the block of rows N is packed in) where `_weight_int4pack_mm_for_cpu(x,
    packed, group, sz)` is one this module rewrites: float32 `x` of a known count of rows,
    whole blocks packed as ATen's vector kernels pack them, dense operands."""
    metas = [_meta(v) for v in (x, packed, sz)]
    block = {AVX512: 64, AVX2: 32}.get(aten_capability())
    g = constant(group)
    if None in metas or block is None or not isinstance(g, int) or g <= 0:
        return None
    xm, pm, sm = metas
    if xm.dtype != torch.float32 or sm.dtype != torch.float32 or pm.dtype != torch.uint8:
        return None
    if len(xm.sizes) != 2 or len(pm.sizes) != 2 or not isinstance(xm.sizes[0], int):
        return None
    (m, k), n = xm.sizes, pm.sizes[0]
    dense = all(meta.strides == _dense(meta.sizes) for meta in (pm, sm))
    if not dense or n % block or k % g or pm.sizes[1] * 2 != k or sm.sizes != (k // g, n, 2):
        return None
    return m, n, k, block


def _dense(sizes: tuple[int, ...]) -> tuple[int, ...]:
    strides, step = [], 1
    for size in reversed(sizes):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))


def _rewrite_int4(graph: Any, node: Any) -> bool:
    """`_weight_int4pack_mm_for_cpu` as sums over the packed weight (at most `MAX_ROWS` rows),
    or as a GEMM of the weight dequantized as the reference kernel does (see the module's
    docstring)."""
    x, packed, group, sz = (node.inputsAt(k) for k in range(4))
    layout = _int4_layout(x, packed, group, sz)
    if layout is None:
        return False
    m, n, k, block = layout
    g, half = constant(group), block // 2
    e = _Emitter(graph, node)
    sz = e.value(sz)
    if m <= MAX_ROWS:
        y = _int4_sums(e, e.value(x), e.value(packed), sz, (m, n, k, block), g)
        # finite only where no x is infinite or NaN and nothing overflowed: the product
        finite = e.op("aten::all", e.op("aten::eq", e.op("aten::mul", y, 0), 0))
        e.replace(node, e.unless(finite, y, node))
        return True
    p4 = e.op("aten::view", e.value(packed), [n // block, k // g, g, half])

    def whole(j: int) -> Any:
        """The scales (`j` 0) or zero points (1), (N/B, K/group, 1, B)."""
        v = e.op("aten::view", e.op("aten::select", sz, 2, j), [k // g, n // block, 1, block])
        return e.op("aten::permute", v, [1, 0, 2, 3])

    # the dequantization reads a scale per weight: from a copy without the zero points in
    # between (made once, for both halves), in whole vectors
    shared = [whole(0), whole(1)]

    def part(j: int, lo: int) -> Any:
        """The scales (`j` 0) or zero points (1) of the half of the blocks from `lo`."""
        return e.op("aten::slice", shared[j], -1, lo, lo + half, 1)

    # per half of the block: the nibbles, their scales and zero points
    halves = [(q, part(0, lo), part(1, lo))
              for q, lo in ((e.op("aten::bitwise_and", p4, 15), 0),
                            (e.op("aten::bitwise_right_shift", p4, 4), half))]
    e.replace(node, _int4_gemm(e, e.value(x), halves, (m, n, k, block)))
    return True


def _int4_sums(e: _Emitter, x: Any, packed: Any, sz: Any,
               sizes: tuple[int, int, int, int], g: int) -> Any:
    """The product as sums per group with the zero point factored out: `sum_k x_k * ((q_k -
    8) * s + z) = s * (sum_k x_k * q_k - 8 * sum_k x_k) + z * sum_k x_k`, fewer operations
    per weight than its dequantization (a weight's products need no scale, no zero point).

    A high nibble is not shifted down: each column masks its nibble in place (`b & 15`, `b &
    240`), which converts to float exactly as `q` or `16 * q`, so the sums of the high
    nibbles are 16 times theirs (exactly: a product by a power of two), scaled back per
    column. The columns of a row block are one sum, `b` read once for its two columns: per
    weight a mask, a conversion and a fused multiply-add."""
    m, n, k, block = sizes
    half = block // 2
    p4 = e.op("aten::view", packed, [n // block, k // g, g, 1, half])
    masks = torch.tensor([[15], [240]], dtype=torch.int32)
    nibbles = e.op("aten::view", e.op("aten::bitwise_and", e.to(p4, torch.int32), masks),
                   [n // block, k // g, g, block])
    xv = e.op("aten::view", x, [m, 1, k // g, g, 1])
    xs = e.op("aten::sum", e.op("aten::view", x, [m, 1, k // g, g]), [-1], True, None)
    groups = e.op("aten::sum", e.op("aten::mul", xv, e.to(nibbles, torch.float32)), [3], False,
                  None)
    scale_back = torch.tensor([[1.0], [1 / 16]]).expand(2, half).reshape(block).contiguous()
    s, z = (e.op("aten::permute", e.op("aten::view", e.op("aten::select", sz, 2, j),
                                         [k // g, n // block, block]), [1, 0, 2]) for j in (0, 1))
    # s * (sum x*q - 8 * sum x) + z * sum x: each scale and zero point read once
    centred = e.op("aten::sub", e.op("aten::mul", groups, scale_back), e.op("aten::mul", xs, 8),
                   1)
    y = e.op("aten::sum", e.op("aten::add", e.op("aten::mul", centred, s),
                               e.op("aten::mul", xs, z), 1), [2], False, None)
    return e.op("aten::view", y, [m, n])


def _int4_gemm(e: _Emitter, x: Any, halves: list[tuple[Any, Any, Any]],
               sizes: tuple[int, int, int, int]) -> Any:
    """The product as a GEMM per half of the blocks, of the weights dequantized as the
    reference kernel dequantizes them, transposed to (K, N / 2): a GEMM reuses each weight
    across rows from the caches, the sums read the weights once per row."""
    m, n, k, block = sizes
    products = []
    for q, s, z in halves:
        w = e.op("aten::add", e.op("aten::mul", e.op("aten::sub", e.to(q, torch.float32), 8, 1),
                                   s), z, 1)
        wt = e.op("aten::reshape", e.op("aten::permute", w, [1, 2, 0, 3]), [k, n // 2])
        products.append(e.op("aten::view", e.op("aten::mm", x, wt),
                             [m, n // block, 1, block // 2]))
    return e.op("aten::view", e.op("aten::cat", e.tensors(products), 2), [m, n])


def fold_quantized_weights(graph: torch._C.Graph) -> int:
    """Write each matrix product of at most `MAX_ROWS` rows over a quantized weight as a
    reduction that reads the quantized weight (see the module's docstring), in place, in the
    graph's top-level block: `mm(x, w.t().to(x.dtype))` of an int8 `w`, and float32
    `_weight_int4pack_mm_for_cpu` (as a GEMM of its dequantized weight beyond `MAX_ROWS`
    rows). Returns the count of products rewritten."""
    count = 0
    rewrites = {"aten::mm": _rewrite_int8, "aten::_weight_int4pack_mm_for_cpu": _rewrite_int4}
    for node in list(graph.nodes()):
        rewrite = rewrites.get(node.kind())
        try:
            count += rewrite is not None and rewrite(graph, node)
        except Exception as e:  # noqa: BLE001 - the product stays (what was made is dead code)
            _log.dump(f"{node.kind()} left alone: {type(e).__name__}: {e}")
    if count:
        torch._C._jit_pass_dce(graph)
        _log.dump(f"{count} matrix products of quantized weights as reductions:\n", graph)
    return count
