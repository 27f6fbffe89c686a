"""explain: what fused, what did not and why; strict fusion.

`nncfuse.explain(fn, *args)` is the counterpart of `torch._dynamo.explain`:
it runs `fn` as `nncfuse.jit` would for these arguments (profiling, fusing,
compiling) and reads the optimized graph back:

    def f(a, b):
        x = torch.sigmoid(a) * b
        c = torch.cumsum(x, 0)
        return torch.tanh(torch.mm(c, b)) + 1.0 - torch.relu(c)

    >>> print(nncfuse.explain(f, torch.randn(8, 8), torch.randn(8, 8)))
    nncfuse.explain: 2 group(s); 7 of 8 compute nodes fused (87.5%); 0 external
    groups:
      kernel                  ops                   inputs -> outputs
      fused_sigmoid_mul       sigmoid mul           [8, 8], [8, 8] -> [8, 8]
      fused_mm_tanh_add_relu  mm tanh add relu sub  [8, 8], [8, 8] -> [8, 8]
    left outside (1):
      node                 category     reason
      %c.1 = aten::cumsum  no lowering  no lowering for aten::cumsum
    top reasons: no lowering: aten::cumsum x1

Nodes are counted by what they do. *Bookkeeping* nodes (constants, list and
tuple plumbing, attribute reads, sizes, scalar arithmetic: any node without a
tensor output; and size arithmetic that tracing records on 0-dim tensors, from
`aten::size` through `prim::NumToTensor`) are not counted. *External* nodes
are the GEMM, convolution, attention and embedding ops that run in a library
(ATen, oneDNN) whether or not they sit in a kernel: they are counted apart.
Every other node with a tensor output is a *compute* node, and `coverage` is
the share of compute nodes inside fusion groups. Guards are skipped: a guard's fallback branch
holds copies of the group's nodes, not nodes left outside.

Each compute node left outside gets a category (`CATEGORIES`) and the
fuser's reason. Nodes the fuser would have taken, yet outside a group, are
either in a group that failed to compile (`FusedFunction.compile_failures`;
matched by op, module scope and source line) or in one smaller than
`min_group_size`.

Strict fusion (`nncfuse.jit(fn, strict=True)` or `NNCFUSE_STRICT=1`), as
`torch.jit.strict_fusion` was for NNC: a call that would run an optimized
graph leaving a *fusible-looking* node outside every group raises
`StrictFusionError` listing those nodes (the report's `unfused` rows).
Fusible-looking means: a compute node, as defined above, that is not
external. Ops without a lowering count too, as NNC's strict fusion
required every node of the region to fuse; GEMMs and convolutions do not,
as they run in the same library either way. A GEMM or convolution inside a
group (an external call whose epilogue the group fuses) counts as fused;
`external` counts the ones left outside. Profiling calls run unfused and
do not raise; every call after them with that signature does.

The jit, a layer below, calls this module only through the hooks it
registers with when imported (`jit/specialize/hooks.py`): `STRICT_CHECKS`
(the strict check of each new plan) and `GRAPH_REPORTS` (this report in
the `>backend` log).
"""

from __future__ import annotations

import collections
import dataclasses
import re
from typing import Any

import torch

from .config import Options
from .jit.frontend.freezing import FrozenFunction
from .jit.frontend.function import FusedFunction
from .jit.fuser.guard import CompileFailure, is_fused_op
from .jit.fuser.inplace import in_place
from .jit.fuser.subgraph import is_group
from .jit.fuser.tensorexpr_fuser import why_not_fused
from .jit.specialize import hooks

__all__ = ["explain", "Report", "Group", "Unfused", "StrictFusionError", "CATEGORIES",
           "EXTERNAL_KINDS", "is_compute", "is_external"]

#: Ops that run in a library routine (GEMM, convolution, attention, embedding lookups).
EXTERNAL_KINDS = frozenset(f"aten::{name}" for name in (
    "linear", "matmul", "mm", "bmm", "addmm", "addmv", "addbmm", "baddbmm", "mv", "dot", "einsum",
    "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d",
    "_convolution", "convolution", "mkldnn_convolution", "scaled_dot_product_attention",
    "_scaled_dot_product_attention_math", "_native_multi_head_attention", "embedding",
    "embedding_bag", "lstm", "gru", "rnn_tanh", "rnn_relu", "bilinear", "tensordot",
))

#: Nodes that move values around rather than compute tensors.
_BOOKKEEPING = frozenset({
    "prim::Constant", "prim::ListConstruct", "prim::ListUnpack", "prim::TupleConstruct",
    "prim::TupleUnpack", "prim::TupleIndex", "prim::DictConstruct", "prim::GetAttr",
    "prim::TypeCheck", "prim::NumToTensor", "prim::unchecked_cast", "prim::Uninitialized",
    "prim::RaiseException", "prim::device", "prim::dtype", "aten::size", "aten::dim",
    "aten::Int", "aten::Float", "aten::ScalarImplicit", "aten::__getitem__", "aten::len",
    "prim::If", "prim::Loop",
    # a weight's reduced-precision or channels-last copy, made once per version of the weight
    # (`jit/fuser/cast_cache.py`): a cache, not work of every call
    "nncfuse::autocast_weight", "nncfuse::autocast_weights", "nncfuse::channels_last_weight",
})

#: Why a compute node stayed outside, as the report groups them.
CATEGORIES = (
    "no lowering",        # no lowering for the op, or not this overload
    "alias or mutation",  # an in-place op, or a node reading a value something writes to
    "dtype",              # a dtype the loop IR has no type for
    "requires grad",      # kernels record no autograd
    "not on the CPU",
    "incomplete type",    # profiling saw no single dtype/shape/strides (or never ran it)
    "not one tensor",     # several outputs, or a non-tensor one
    "non-constant input",  # a list or object input that is not a constant
    "compile failure",    # its group failed to lower or compile, and runs unfused
    "below min_group_size",  # it would fuse, but its group had too few nodes
    "not optimized",      # the function runs unfused for these arguments
)

_RULES: tuple[tuple[str, str], ...] = (
    (r"^no lowering|has no matching schema|is not supported$", "no lowering"),
    (r"written to by another node", "alias or mutation"),
    (r"unsupported dtype", "dtype"),
    (r"requires grad", "requires grad"),
    (r"\bis on \w", "not on the CPU"),
    (r"no complete profiled type", "incomplete type"),
    (r"exactly one tensor", "not one tensor"),
    (r"is not a constant", "non-constant input"),
)


def categorize(reason: str) -> str:
    """The category (`CATEGORIES`) of one of the fuser's reasons."""
    for pattern, category in _RULES:
        if re.search(pattern, reason):
            return category
    return "no lowering"


def _has_tensor_output(node: Any) -> bool:
    return any(isinstance(v.type(), torch._C.TensorType) for v in node.outputs())


def is_compute(node: Any) -> bool:
    """Whether `node` computes a tensor (so explain counts it), external ops included."""
    return node.kind() not in _BOOKKEEPING and _has_tensor_output(node)


def is_external(node: Any) -> bool:
    """Whether `node` is a GEMM, convolution, attention or embedding op (counted apart)."""
    return node.kind() in EXTERNAL_KINDS


def _shape(value: Any) -> list[int] | None:
    ty = value.type()
    return ty.sizes() if isinstance(ty, torch._C.TensorType) else None


def _short(node: Any) -> str:
    outs = ", ".join(f"%{v.debugName()}" for v in node.outputs())
    return f"{outs} = {node.kind()}" if outs else node.kind()


@dataclasses.dataclass(frozen=True)
class Group:
    """One fusion group: its kernel, ops (compute nodes, in order), input and output shapes."""

    kernel: str
    ops: tuple[str, ...]
    inputs: tuple[list[int] | None, ...]
    outputs: tuple[list[int] | None, ...]
    compiled: bool = True


@dataclasses.dataclass(frozen=True)
class Unfused:
    """A compute node left outside every group: its kind, category, the fuser's reason."""

    kind: str
    category: str
    reason: str
    node: str  # `%out = aten::kind`
    output: list[int] | None  # the first output's shape, if profiled

    def __str__(self) -> str:
        return f"{self.node}: {self.category} ({self.reason})"


@dataclasses.dataclass
class Report:
    """What `explain` found in an optimized graph. `str()` prints it as tables."""

    groups: list[Group]
    unfused: list[Unfused]
    external: collections.Counter  # kind -> count of external ops outside groups
    fused_nodes: int  # compute nodes inside groups, external calls included
    compile_failures: list[CompileFailure]
    graph: torch._C.Graph | None
    note: str = ""  # why nothing was analyzed, when nothing was

    @property
    def unfused_nodes(self) -> int:
        return len(self.unfused)

    @property
    def external_nodes(self) -> int:
        return sum(self.external.values())

    @property
    def compute_nodes(self) -> int:
        """Non-external compute nodes, fused or not."""
        return self.fused_nodes + self.unfused_nodes

    @property
    def coverage(self) -> float:
        """Fused over non-external compute nodes (1.0 when there are none)."""
        return self.fused_nodes / self.compute_nodes if self.compute_nodes else 1.0

    def reasons(self) -> collections.Counter:
        """Category -> how many nodes stayed outside for it, most common first."""
        return collections.Counter(u.category for u in self.unfused)

    def top_reasons(self, n: int = 5) -> list[tuple[str, str, int]]:
        """The `n` most common (category, op kind, count) among nodes left outside."""
        counts = collections.Counter((u.category, u.kind) for u in self.unfused)
        return [(c, k, m) for (c, k), m in counts.most_common(n)]

    def __str__(self) -> str:
        ext = ", ".join(f"{k} x{m}" for k, m in self.external.most_common())
        fused = (f"{self.fused_nodes} of {self.compute_nodes} compute nodes fused "
                 f"({100 * self.coverage:.1f}%)" if self.compute_nodes
                 else "no compute nodes: nothing to fuse")
        lines = [f"nncfuse.explain: {len(self.groups)} group(s); {fused}; "
                 f"{self.external_nodes} external" + (f" ({ext})" if ext else "")]
        if self.note:
            lines.append(f"  note: {self.note}")
        if self.groups:
            rows = [(g.kernel.split("::")[-1], _clip(" ".join(o.split("::")[-1] for o in g.ops),
                                                    60),
                     ", ".join(map(str, g.inputs)) + " -> " + ", ".join(map(str, g.outputs)))
                    for g in self.groups]
            lines += ["groups:", *_table(("kernel", "ops", "inputs -> outputs"), rows)]
        if self.unfused:
            rows = [(_clip(u.node, 40), u.category, u.reason) for u in self.unfused]
            lines += [f"left outside ({self.unfused_nodes}):",
                      *_table(("node", "category", "reason"), rows)]
            lines.append("top reasons: " + "; ".join(
                f"{c}: {k} x{m}" for c, k, m in self.top_reasons()))
        for f in self.compile_failures:
            lines.append(f"compile failure: {' '.join(f.ops)}: {f}")
        return "\n".join(lines)


def _table(head: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    """Rows under `head`, every column but the last padded to its widest cell."""
    widths = [max(len(r[k]) for r in [head, *rows]) for k in range(len(head) - 1)]
    return ["  " + "  ".join([*(c.ljust(w) for c, w in zip(r, widths)), r[-1]]).rstrip()
            for r in [head, *rows]]


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


class StrictFusionError(RuntimeError):
    """Raised under strict fusion when fusible-looking nodes stayed outside every group.

    `report` is the explain report of the optimized graph, `nodes` its `unfused` rows.
    """

    def __init__(self, report: Report):
        self.report = report
        self.nodes = list(report.unfused)
        rows = "\n".join(f"  {u}" for u in self.nodes)
        super().__init__(f"strict fusion: {len(self.nodes)} compute node(s) outside fusion "
                         f"groups:\n{rows}")


# -- reading an optimized graph ---------------------------------------------------------------
def _guard_blocks(node: Any) -> tuple[Any, Any] | None:
    """(fused block, fallback block) if `node` is a guard's prim::If, else None."""
    if node.kind() != "prim::If" or node.input().node().kind() != "prim::TypeCheck":
        return None
    blocks = list(node.blocks())
    if len(blocks) != 2 or not any(is_fused_op(n) for n in blocks[0].nodes()):
        return None
    return blocks[0], blocks[1]


def _failure_marks(failures: list[CompileFailure]) -> dict[tuple[str, str], CompileFailure]:
    return {(n.kind(), _position(n)): f for f in failures for n in f.subgraph.nodes()}


def _position(node: Any) -> str:
    """Where `node` came from (unmerged copies keep it): its module scope (traced graphs)
    and source line, else its named outputs."""
    try:
        where = f"{node.scopeName()} {node.sourceRange()}".strip()
    except RuntimeError:
        where = ""
    names = [v.debugName() for v in node.outputs() if not v.debugName().isdigit()]
    return where or ",".join(names)


def report_for(graph: torch._C.Graph | None, options: Options,
               failures: list[CompileFailure] = (), note: str = "",
               optimized: bool = True) -> Report:
    """The explain report of an optimized `graph` (None: a function that runs unfused;
    `optimized=False`: a graph that runs unfused, for the reason `note`)."""
    if graph is None:
        return Report([], [], collections.Counter(), 0, list(failures), None,
                      note or "no optimized graph: the function runs unfused")
    why_not = why_not_fused(graph, options)
    marks = _failure_marks(list(failures))
    sizes = _size_arithmetic(graph)
    report = Report([], [], collections.Counter(), 0, list(failures), graph, note)

    def group_of(node: Any) -> None:
        sub = node.g("Subgraph")
        ops = [n for n in sub.nodes() if is_compute(n)]
        report.groups.append(Group(node.kind(), tuple(n.kind() for n in ops),
                                   tuple(_shape(v) for v in sub.inputs()),
                                   tuple(_shape(v) for v in sub.outputs()),
                                   compiled=not is_group(node)))
        report.fused_nodes += len(ops)  # a GEMM or convolution inside runs as an external call

    def outside(node: Any) -> None:
        if is_external(node):
            report.external[node.kind()] += 1
            return
        reason = why_not(node)
        if reason is not None:
            category = "alias or mutation" if in_place(node.kind()) else categorize(reason)
        elif (node.kind(), _position(node)) in marks:
            failure = marks[(node.kind(), _position(node))]
            category, reason = "compile failure", f"its group failed to compile: {failure}"
        else:
            category = "below min_group_size"
            reason = f"its group would have fewer than {options.min_group_size} nodes"
        report.unfused.append(Unfused(node.kind(), category, reason, _short(node),
                                      _shape(node.outputsAt(0)) if node.outputsSize() else None))

    def visit(block: Any) -> None:
        for node in block.nodes():
            guarded = _guard_blocks(node)
            if guarded is not None:
                visit(guarded[0])  # the fallback holds copies of the group's nodes
            elif is_group(node) or is_fused_op(node):
                group_of(node)
            elif node.hasAttribute("Subgraph"):  # a program of its own (autodiff's f)
                inner = report_for(node.g("Subgraph"), options)
                report.groups += inner.groups
                report.unfused += inner.unfused
                report.external += inner.external
                report.fused_nodes += inner.fused_nodes
            elif list(node.blocks()):
                for sub in node.blocks():
                    visit(sub)
            elif is_compute(node) and not all(v.unique() in sizes for v in node.outputs()):
                outside(node)

    visit(graph.block())
    if not optimized:
        report.unfused = [dataclasses.replace(u, category="not optimized", reason=note)
                          for u in report.unfused]
    return report


def _size_arithmetic(graph: torch._C.Graph) -> set[int]:
    """Values that hold sizes only: a traced `x.shape[-1] // 2` is `aten::size`,
    `prim::NumToTensor`, then `aten::floor_divide` on a 0-dim tensor."""
    derived: set[int] = set()

    def visit(block: Any) -> None:
        for node in block.nodes():
            for sub in node.blocks():
                visit(sub)
            tensors = [v for v in node.inputs() if isinstance(v.type(), torch._C.TensorType)]
            if node.kind() == "prim::NumToTensor":
                derived.update(v.unique() for v in node.outputs())
            elif any(v.unique() in derived for v in tensors) and all(
                    v.unique() in derived or v.node().kind() == "prim::Constant"
                    for v in tensors):
                derived.update(v.unique() for v in node.outputs())

    visit(graph.block())
    return derived


# -- the public entry points ------------------------------------------------------------------
def explain(fn: Any, *args: Any, **kwargs: Any) -> Report:
    """Run `fn(*args, **kwargs)` as `nncfuse.jit` would and report what fused and why not.

    `fn` is anything `nncfuse.jit` takes (a function, ScriptFunction, traced
    function or module, ScriptModule) or a FusedFunction, which is then used
    (and optimized for these arguments) as it is; anything else gets a fresh
    FusedFunction with the environment's options, strict fusion off. A frozen module
    (`nncfuse.jit(m, freeze=True)`) reports the plans its next call in this grad mode runs.
    """
    if isinstance(fn, FrozenFunction):
        fn = fn.current()
    fused = fn if isinstance(fn, FusedFunction) else FusedFunction(
        fn, Options.from_env(strict=False))
    try:
        graph = fused.graph_for(*args, **kwargs)
    except StrictFusionError as e:  # the signature is optimized; its plan raises
        graph = e.report.graph
    note = ""
    if graph is None:
        note = ("nncfuse is disabled" if fused.options.disable
                else "the function runs unfused for these arguments (not scripted)")
    optimized = graph is not None and _is_profiled(graph)
    if graph is not None and not optimized:
        note = "these arguments run unfused, unprofiled (e.g. past max_specializations)"
    return report_for(graph, fused.options, fused.compile_failures, note, optimized)


def _is_profiled(graph: torch._C.Graph) -> bool:
    """Whether profiling typed `graph`: some tensor has sizes, or no node makes a tensor."""
    tensors = [v.type() for n in graph.nodes() for v in n.outputs()
               if isinstance(v.type(), torch._C.TensorType)]
    return not tensors or any(t.sizes() is not None for t in tensors)


class _StrictPlan:
    """A plan that raises StrictFusionError instead of running its graph."""

    def __init__(self, report: Report):
        self.graph = report.graph
        self.report = report

    def run(self, args: tuple[Any, ...]) -> Any:
        raise StrictFusionError(self.report)


def _strict_check(plan: Any, failures: list[CompileFailure], options: Options) -> Any:
    """`plan`, or under strict fusion one that raises when fusible-looking nodes stayed out."""
    report = report_for(plan.graph, options, failures)
    return _StrictPlan(report) if report.unfused else plan


hooks.STRICT_CHECKS.register(_strict_check)  # the jit layer calls up through these hooks
hooks.GRAPH_REPORTS.register(report_for)  # what fused, in the `>backend` and autograd logs
