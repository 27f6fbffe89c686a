"""Every fusible op over OpInfo's samples and reference (extremal) inputs, against eager.

The default run takes the first few samples of each op and dtype; the slow
sweep (`-m slow`) takes them all, or NNCFUSE_SLOW_SAMPLE per op and dtype.
"""

import pytest

from nncfuse import testing
from tests.conftest import slow_sample

pytest.importorskip("expecttest")
OPS = {testing.op_id(op): op for op in testing.opinfos()}
FAST_SAMPLES = 3


def check(op_ids, limit):
    results = testing.sweep([OPS[k] for k in op_ids], limit=limit)
    failures = [f for t in results.values() for f in t.failures]
    assert not failures, "\n".join(failures[:20])
    return results


@pytest.mark.parametrize("op_id", list(OPS))
def test_op_matches_eager(op_id):
    check([op_id], FAST_SAMPLES)


def test_most_samples_run_fused():
    results = check(list(OPS), 1)
    total = sum(t.fusible for t in results.values())
    fused = sum(t.fused for t in results.values())
    unfused = sorted(f"{op}[{dt}]" for (op, dt), t in results.items() if t.fused < t.fusible)
    assert fused >= 0.95 * total, f"{fused}/{total} fused; not fused: {unfused}"


@pytest.mark.slow
@pytest.mark.parametrize("op_id", list(OPS))
def test_op_all_reference_inputs(op_id):
    results = check([op_id], slow_sample(10**6))
    total = sum(t.fusible for t in results.values())
    fused = sum(t.fused for t in results.values())
    assert fused >= 0.95 * total, f"{fused}/{total} fused"


def test_coverage_cells():
    from nncfuse.coverage import cell

    assert cell(None) == "-"
    assert cell(testing.Tally(total=3, matched=3, fused=3)) == "fused"
    assert cell(testing.Tally(total=3, matched=3, fused=0)) == "fallback"
    assert cell(testing.Tally(total=3, matched=3, fused=1)) == "partial"
    assert cell(testing.Tally(total=3, matched=2, fused=3)) == "MISMATCH"
