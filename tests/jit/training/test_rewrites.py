"""The training rewrites: one ordered, named list (`rewrites.rewrites`), each logged by the
driver under `>>rewrites`."""

import torch

from nncfuse.jit.training import rewrites

ORDER = ["autocast_casts", "explicit_promotions", "fold_sizes", "drop_identities", "fold_tuples",
         "flat_linears", "fold_conv_pads", "plain_dropouts", "hide_eager_gradients",
         "differentiable_graphs", "restore_eager_gradients", "absorb_views"]


def test_the_list_is_ordered_and_the_sized_rules_need_fixed_shapes():
    assert [name for name, _ in rewrites.rewrites(True)] == ORDER
    assert [name for name, _ in rewrites.rewrites(False)] == ORDER[:2] + ORDER[4:]


def _graph() -> torch._C.Graph:
    return torch._C.parse_ir("""
        graph(%a : Tensor, %b : Tensor):
          %t : (Tensor, Tensor) = prim::TupleConstruct(%a, %b)
          %x : Tensor, %y : Tensor = prim::TupleUnpack(%t)
          %z : Tensor = aten::mul(%x, %y)
          %w : Tensor = aten::sin(%z)
          return (%w)""")


def test_the_driver_logs_each_rewrite(monkeypatch, capsys):
    monkeypatch.setenv("NNCFUSE_LOG_LEVEL", ">>rewrites")
    graph = _graph()
    rewrites.run(graph, shapes_fixed=False)
    err = capsys.readouterr().err
    positions = [err.index(f"After {name}") for name in ORDER[:2] + ORDER[4:]]
    assert positions == sorted(positions)
    assert "After flat_linears (unchanged)" in err
    assert "prim::TupleUnpack" not in str(graph)
