"""fxgraph: an FX graph as nncfuse runs it; here, what `_scriptable` rewrites before the
conversion to TorchScript."""

import torch

from nncfuse.jit.specialize.fxgraph import _dtype_only


def test_a_cast_of_the_dtype_alone_is_told_from_one_that_moves_or_changes_layout():
    def f(x):
        a = torch.ops.aten._to_copy.default(x, dtype=torch.float64, layout=torch.strided,
                                            device=torch.device("cpu"))
        b = torch.ops.aten._to_copy.default(x, dtype=torch.float64, device=torch.device("meta"))
        c = torch.ops.aten._to_copy.default(x, dtype=torch.float64,
                                            memory_format=torch.channels_last)
        d = torch.ops.aten._to_copy.default(x, dtype=torch.float64, layout=torch.sparse_coo)
        e = torch.ops.aten._to_copy.default(x, device=torch.device("cpu"))
        return a, b, c, d, e

    gm = torch.fx.symbolic_trace(f)
    for node in gm.graph.find_nodes(op="placeholder"):
        node.meta["val"] = torch.randn(1, 2, 3, 4)
    casts = gm.graph.find_nodes(op="call_function", target=torch.ops.aten._to_copy.default)
    assert [_dtype_only(c) for c in casts] == [True, False, False, False, False]


def _attention(q, k, v):
    scores = torch.matmul(q, k.transpose(-1, -2))
    weights = torch.softmax(scores.float(), dim=-1).type_as(scores)
    return torch.matmul(weights, v)


def test_a_cast_of_the_dtype_alone_fuses_through_the_backend():
    """Under autocast, `type_as` (AOTAutograd's `_to_copy` with layout and device) joins the
    softmax's group instead of running alone; results are eager autocast's."""
    import nncfuse.backend

    torch._dynamo.reset()
    nncfuse.backend.clear_compiled_graphs()
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 16, 8) for _ in range(3))
    compiled = torch.compile(_attention, backend="nncfuse")
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        for _ in range(2):
            got = compiled(q, k, v)
        want = _attention(q, k, v)
    torch._dynamo.reset()
    assert got.dtype == want.dtype == torch.bfloat16
    torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)
    (graph,) = nncfuse.backend.compiled_graphs()
    outside = {n.kind() for g in graph.graphs() for n in g.nodes()}
    assert not outside & {"aten::_to_copy", "aten::to", "aten::softmax"}, outside
