"""Summarise an Nsight Compute run of ``ncu_gate_h200.py`` into a small JSON (the ``.ncu-rep``
itself is megabytes): per kernel, registers, instructions, warp cycles per issued instruction,
and for each loop body (instructions executed equally often, more than 100 of them) its length
and where its stall samples fall, by opcode.

    ncu --import $OUT/gate.ncu-rep --page details --csv > details.csv
    ncu --import $OUT/gate.ncu-rep --page source --csv --print-source sass > sass.csv
    python benchmarks/gpu/ncu_summary.py details.csv sass.csv --labels a,b,... > summary.json

``--labels`` names the profiled launches in order (the ops of ``ncu_gate_h200.py``; a two-kernel
op launches two kernels).
"""

from __future__ import annotations

import argparse
import collections
import csv
import json
import re
import sys

_METRICS = {
    "Registers Per Thread": "registers",
    "Executed Instructions": "instructions",
    "Warp Cycles Per Issued Instruction": "cycles_per_issue",
    "Issued Warp Per Scheduler": "issue_per_scheduler",
    "Grid Size": "grid",
    "Block Size": "block",
}


def _number(text: str) -> float:
    return float(text.replace(",", "")) if text.strip() not in ("", "-") else 0.0


def details(path: str) -> list[dict]:
    """One dict per profiled launch, in order, with the metrics of ``_METRICS``."""
    out: dict[str, dict] = {}
    with open(path) as f:
        for row in csv.DictReader(f):
            k = out.setdefault(row["ID"], {"kernel": row["Kernel Name"]})
            if row["Metric Name"] in _METRICS:
                k[_METRICS[row["Metric Name"]]] = _number(row["Metric Value"])
    return [out[i] for i in sorted(out, key=int)]


def source(path: str) -> list[list[dict]]:
    """Per profiled launch, its SASS rows (address, text, samples, executions)."""
    kernels: list[list[dict]] = []
    header: list[str] = []
    with open(path) as f:
        for row in csv.reader(f):
            if row and row[0] == "Kernel Name":
                kernels.append([])
            elif row and row[0] == "Address":
                header = row
            elif row and kernels:
                kernels[-1].append(dict(zip(header, row, strict=False)))  # trailing empty cell
    return kernels


def loops(rows: list[dict]) -> list[dict]:
    """The loop bodies: groups of more than 100 instructions executed equally often (a token
    loop's body; in the streamed kernel the gate programs' and the state programs' loops), with
    their stall samples per opcode; the most sampled first."""
    groups: dict[int, list[dict]] = collections.defaultdict(list)
    for r in rows:
        n = int(_number(r["Instructions Executed"]))
        if n:
            groups[n].append(r)
    out = []
    for count, body in groups.items():
        if len(body) <= 100 or count < 1000:
            continue
        samples: collections.Counter = collections.Counter()
        opcodes: collections.Counter = collections.Counter()
        for r in body:
            m = re.match(r"\s*(@!?U?P\w+\s+)?([A-Z0-9_]+)", r["Source"])
            op = m.group(2) if m else "?"
            opcodes[op] += 1
            samples[op] += int(_number(r["Warp Stall Sampling (All Samples)"]))
        total = sum(samples.values()) or 1
        out.append({
            "executions_per_instruction": count,
            "instructions": len(body),
            "stall_samples": total,
            "by_opcode": {
                op: {"count": opcodes[op], "sample_share": round(samples[op] / total, 4)}
                for op, _ in samples.most_common(12)
            },
        })  # fmt: skip
    return sorted(out, key=lambda x: -x["stall_samples"])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("details")
    p.add_argument("sass")
    p.add_argument("--labels", default="")
    args = p.parse_args()
    launches = details(args.details)
    for k, rows in zip(launches, source(args.sass), strict=True):
        k["loops"] = loops(rows)
    labels = [x for x in args.labels.split(",") if x]
    for k, label in zip(launches, labels, strict=False):
        k["label"] = label
    json.dump(launches, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
