"""Instructions per chunk of the penalty chain's kernel, built for the H200 (sm_90) on a machine
without a GPU: a proxy for its time, compared between trees before any device time is spent.

The chain's programs walk their block chunk after chunk, and what a chunk costs is the latency
of its instructions, not arithmetic throughput (Nsight Compute on an H100,
``benchmarks/results/h100/kernel_counters_753ac4b.json``: 7.35 cycles a warp per issued
instruction at two warps a scheduler, the tensor and float64 pipes 0 and 12 % busy), so fewer
instructions on a chunk's path are a shorter walk.  For each launch of ``penalty_chain_kernel``
that the forward makes at the requested sizes (recorded as ``preflight_sm90.py`` records them),
the SASS of the build (``nvdisasm``) is read for its chunk loop (the longest backward branch):
its instructions once, those of the loops inside it (the elimination's, the factorisation's and
the inverse's) as many times as they run (``CP``, or ``CP − 1`` for
:func:`~vla_verify.backends.triton_chunked_kernels.unit_lower_inverse`).  Conditional parts of the
chunk (the checkpoints of training) count as executed: it is a count of the code on a chunk's
path, per thread, not a trace.

Triton's version decides the code: run it with the version the GPU has first on ``PYTHONPATH``,
as for ``preflight_sm90.py``, from each tree to compare::

    python benchmarks/chain_instruction_counts.py --sizes 64x16384 128x16384 --json OUT.json
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import preflight_sm90

_KERNELS = Path(__file__).resolve().parents[1] / "vla_verify" / "backends"


def _inner_trips(function: str, cp: int) -> int:
    """How many times a loop inside the chunk loop runs, from the kernel function it is in."""
    if function == "unit_lower_inverse":
        return cp - 1
    if function in ("_ldl_solve_clamped", "_ldl_clamped"):
        return cp
    raise ValueError(f"a loop in {function!r} inside the chunk loop: its trip count is not known")


def sass_loops(sass: str) -> tuple[list[tuple[int | None, str]], list[tuple[int, int]]]:
    """The instructions of ``nvdisasm -c`` output ``sass`` in order, each with the line of
    ``triton_chunked_kernels.py`` it comes from (``-g`` output; ``None`` without), and its loops
    as ``(first, last)`` indices: each backward branch and its target."""
    labels: dict[str, int] = {}
    seq: list[tuple[int | None, str]] = []
    line: int | None = None
    for text in sass.split("\n"):
        m = re.search(r'//## File "([^"]+)", line (\d+)', text)
        if m:
            line = int(m.group(2)) if Path(m.group(1)).name == "triton_chunked_kernels.py" else line
            continue
        m = re.match(r"\s*(\.L_x_\d+):", text)
        if m:
            labels[m.group(1)] = len(seq)
            continue
        m = re.match(r"\s+/\*[0-9a-f]{4,}\*/\s+(.*?);", text)
        if m:
            seq.append((line, m.group(1)))
    loops = []
    for i, (_, ins) in enumerate(seq):
        m = re.search(r"BRA[^;]*?(\.L_x_\d+)", ins)
        if m and labels.get(m.group(1), len(seq)) <= i:
            loops.append((labels[m.group(1)], i))
    return seq, loops


def per_chunk(sass: str, source: list[str], cp: int) -> dict[str, Any]:
    """The dynamic instruction count of one chunk from ``nvdisasm -g -c`` output ``sass``
    (``source``: the kernels' module, as lines, to name the function of each inner loop)."""
    seq, loops = sass_loops(sass)
    if not loops:
        raise ValueError("no loop in the build")
    outer = max(loops, key=lambda r: r[1] - r[0])
    weight = [1] * len(seq)
    inner = []
    for lo, hi in loops:
        if (lo, hi) == outer or not (outer[0] <= lo and hi <= outer[1]) or hi - lo < 4:
            continue  # the chunk loop itself, or a spin of a few instructions
        # The function most of the loop's instructions come from (its first ones may carry
        # the line before the loop).
        where = collections.Counter(
            next(s[4:].split("(")[0] for s in reversed(source[:ln]) if s.startswith("def "))
            for ln, _ in seq[lo : hi + 1]
            if ln is not None
        )
        function = where.most_common(1)[0][0]
        trips = _inner_trips(function, cp)
        body = [seq[k][1] for k in range(lo, hi + 1)]
        # Barriers and shuffles on each trip: the exchanges between warps and inside a warp.
        inner.append({"function": function, "instructions": hi - lo + 1, "trips": trips,
                      "bar": sum(" BAR" in f" {ins}" for ins in body),
                      "shfl": sum("SHFL" in ins for ins in body)})  # fmt: skip
        for k in range(lo, hi + 1):
            weight[k] = trips
    ops: collections.Counter[str] = collections.Counter()
    for k in range(outer[0], outer[1] + 1):
        ins = seq[k][1]
        op = ins.split()[1] if ins.startswith("@") else ins.split()[0]
        ops[op.split(".")[0]] += weight[k]
    return {
        "per_chunk": sum(ops.values()),
        "inner_loops": inner,
        "by_opcode": dict(ops.most_common()),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", nargs="+", default=["64x16384", "128x16384"], metavar="DxT")
    ap.add_argument("--json", type=Path, default=None, help="write the rows here")
    ap.add_argument(
        "--launches",
        type=Path,
        default=None,
        help="launches recorded by preflight_sm90.py --record-to, instead of recording",
    )
    a = ap.parse_args()

    import triton
    from triton.backends.compiler import GPUTarget

    from vla_verify.backends import triton_chunked_kernels

    with tempfile.TemporaryDirectory() as tmp:
        path = a.launches or Path(tmp) / "launches.json"
        if a.launches is None:
            env = {**os.environ, "TRITON_INTERPRET": "1"}
            cmd = [sys.executable, preflight_sm90.__file__, "--sizes", *a.sizes,
                   "--record-to", str(path)]  # fmt: skip
            subprocess.run(cmd, env=env, check=True, cwd=_KERNELS.parents[1])
        launches = [
            r for r in json.loads(path.read_text()) if r["kernel"] == "penalty_chain_kernel"
        ]
    tools = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
    lines = (_KERNELS / "triton_chunked_kernels.py").read_text().split("\n")
    fn = triton_chunked_kernels.penalty_chain_kernel
    rows, seen = [], set()
    for rec in launches:
        source, constexprs, options = preflight_sm90.launch_source(fn, rec)
        shown = {k: str(v) for k, v in constexprs.items()}
        key = json.dumps([shown, source.signature, options], sort_keys=True)
        if key in seen:
            continue
        seen.add(key)
        compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options)
        with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
            f.write(compiled.asm["cubin"])
            f.flush()
            sass = subprocess.run([str(tools / "nvdisasm"), "-g", "-c", f.name],
                                  capture_output=True, text=True, check=True).stdout  # fmt: skip
            usage = subprocess.run([str(tools / "cuobjdump"), "-res-usage", f.name],
                                   capture_output=True, text=True).stdout  # fmt: skip
        row: dict[str, Any] = {
            "DK": rec["kwargs"]["DK"]["int"],
            "BK": shown["BK"], "PD": shown["PD"],
            "CHAIN_PREC": shown["CHAIN_PREC"], "SAVE_CHAIN": shown["SAVE_CHAIN"],
            "COND": shown["COND"], "options": options,
        }  # fmt: skip
        for field in ("REG", "STACK"):
            m = re.search(rf"{field}:(\d+)", usage)
            row[field.lower()] = int(m.group(1)) if m else None
        row |= per_chunk(sass, lines, int(shown["CP"]))
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "by_opcode"}), flush=True)
    if a.json:
        sizes = a.sizes if a.launches is None else f"as recorded in {a.launches.name}"
        head = {"triton": triton.__version__, "target": "cuda sm_90", "sizes": sizes}
        a.json.write_text(json.dumps({**head, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
