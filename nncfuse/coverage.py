"""The op x dtype coverage table: which ops fuse for which dtypes (needs the `test` extra).

    python -m nncfuse.coverage [--samples 3]

For every op of `nncfuse.testing.OPS` and every dtype, runs the first few
OpInfo samples through `nncfuse.jit(..., min_group_size=1)` and prints a
Markdown table: `fused` when all of them ran fused (and matched eager),
`fallback` when they ran unfused, `partial` for a mix, `MISMATCH` if any
differed from eager, and `-` where OpInfo (eager PyTorch) has no such dtype.
"""

from __future__ import annotations

import argparse

from . import testing

_SHORT = {
    "float32": "f32", "float64": "f64", "float16": "f16", "bfloat16": "bf16", "int8": "i8",
    "int16": "i16", "int32": "i32", "int64": "i64", "uint8": "u8", "bool": "bool",
}


def cell(tally: testing.Tally | None) -> str:
    if tally is None or tally.total == 0:
        return "-"
    if tally.matched < tally.total:
        return "MISMATCH"
    if tally.fused == tally.total:
        return "fused"
    return "fallback" if tally.fused == 0 else "partial"


def table(samples: int) -> str:
    results = testing.sweep(limit=samples)
    names = [str(d).replace("torch.", "") for d in testing.DTYPES]
    lines = [
        "| op | " + " | ".join(_SHORT[n] for n in names) + " |",
        "|---|" + "---|" * len(names),
    ]
    for op in testing.opinfos():
        row = [cell(results.get((testing.op_id(op), d))) for d in testing.DTYPES]
        lines.append(f"| {testing.op_id(op)} | " + " | ".join(row) + " |")
    fused = sum(t.fused for t in results.values())
    total = sum(t.total for t in results.values())
    lines.append("")
    lines.append(f"{fused} of {total} samples ran fused ({samples} per op and dtype).")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=3, help="OpInfo samples per op and dtype")
    print(table(parser.parse_args().samples))


if __name__ == "__main__":
    main()
