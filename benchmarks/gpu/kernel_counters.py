"""Hardware counters of every kernel of one forward + backward of ``triton_chunked``, by Nsight
Compute (``ncu``): what bounds each kernel (its share of the SMs' and the memory's peak, the
tensor and float64 pipes, occupancy, spills to local memory, and why its warps stall), where a
timer alone says only how long it took (``chunk_h200.py --training-breakdown``).

The script runs itself under ``ncu`` once per size (``--child D T``: inputs as the grid's, B = 1,
H = 16, bf16, paper preset; one warm-up step that compiles every kernel, then one step inside
``cudaProfilerStart``/``Stop``, which ``--profile-from-start off`` confines the counters to).
``ncu`` replays each kernel once per group of counters, so a step takes minutes, not
milliseconds; the clocks are left alone (``--clock-control none``), as in the timed runs.
Writes, under ``--out``:

- ``ncu_D<D>_T<T>.csv``: ``ncu``'s own output (``--csv --page details``), kept whole;
- ``kernel_counters.json``: per kernel launch, its name, grid, block and the metrics read from
  that file (:func:`summarise`), with the machine and the command.

If ``ncu`` refuses the extra metrics (:data:`EXTRA_METRICS`: names not known to its version),
the size runs again with the sections alone.  Usage, on a GPU machine with ``ncu``::

    python benchmarks/gpu/kernel_counters.py --out "$OUT" --sizes 64x16384 128x16384
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

_ROOT = Path(__file__).resolve().parents[2]

#: Nsight Compute's sections: throughput against peak (SpeedOfLight), occupancy, the launch's
#: resources (registers, shared memory), the warps' states and the memory hierarchy.
SECTIONS = ("SpeedOfLight", "Occupancy", "LaunchStats", "WarpStateStats", "MemoryWorkloadAnalysis")
#: Counters beyond the sections: local-memory (spill) traffic, the tensor and float64 pipes'
#: activity, and the average stall of an issued instruction by reason.
EXTRA_METRICS = (
    "l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum",
    "l1tex__t_bytes_pipe_lsu_mem_local_op_st.sum",
    "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
    "sm__pipe_fp64_cycles_active.avg.pct_of_peak_sustained_active",
    *(
        f"smsp__average_warps_issue_stalled_{reason}_per_issue_active.ratio"
        for reason in (
            "barrier", "long_scoreboard", "short_scoreboard", "mio_throttle", "math_pipe_throttle",
            "wait", "lg_throttle", "not_selected", "membar", "dispatch_stall", "no_instruction",
        )
    ),
)  # fmt: skip


def child(D: int, T: int) -> None:
    """One warm-up step, then one step between ``cudaProfilerStart`` and ``Stop``."""
    import torch

    sys.path.insert(0, str(_ROOT))
    from vla_verify import VLAConfig
    from vla_verify.backends.triton_chunked import chunked_vla

    g = torch.Generator(device="cuda").manual_seed(0)
    x = [torch.randn(1, T, 16, D, device="cuda", generator=g) for _ in range(4)]
    x[0], x[1] = x[0].abs() + 0.1, x[1].abs() + 0.1
    x[3] = x[3] / (x[3].norm(dim=-1, keepdim=True) * D**0.5)
    leaves = [a.to(torch.bfloat16).requires_grad_(True) for a in x]
    cot = torch.randn(1, T, 16, D, device="cuda", generator=g).to(torch.bfloat16)

    def step() -> None:
        o, _ = chunked_vla(*leaves, config=VLAConfig())
        torch.autograd.grad(o, leaves, cot)

    step()
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    step()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()


def ncu_command(ncu: str, csv_path: Path, D: int, T: int, extra: bool) -> list[str]:
    cmd = [ncu, "--clock-control", "none", "--profile-from-start", "off", "--csv", "--page",
           "details", "--log-file", str(csv_path)]  # fmt: skip
    for section in SECTIONS:
        cmd += ["--section", section]
    if extra:
        cmd += ["--metrics", ",".join(EXTRA_METRICS)]
    return [*cmd, sys.executable, __file__, "--child", str(D), str(T)]


def _number(text: str) -> float | str:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return text


def summarise(csv_path: Path) -> list[dict[str, Any]]:
    """One record per kernel launch of ``ncu``'s details page: the launch's ``ID``, kernel name,
    grid and block, and ``{metric name (unit): value}``.  Lines that are not CSV rows (``ncu``'s
    own messages) are skipped."""
    rows = [line for line in csv_path.read_text().splitlines() if line.startswith('"')]
    launches: dict[str, dict[str, Any]] = {}
    for row in csv.DictReader(rows):
        key = row.get("ID", "")
        rec = launches.setdefault(key, {
            "id": key, "kernel": row.get("Kernel Name", ""), "grid": row.get("Grid Size", ""),
            "block": row.get("Block Size", ""), "metrics": {},
        })  # fmt: skip
        name = row.get("Metric Name", "")
        unit = row.get("Metric Unit", "")
        label = f"{name} ({unit})" if unit else name
        rec["metrics"][label] = _number(row.get("Metric Value", ""))
    return list(launches.values())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--sizes", nargs="+", default=["64x16384", "128x16384"], metavar="DxT")
    ap.add_argument("--commit", default=None)
    ap.add_argument("--child", nargs=2, type=int, default=None, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        child(*a.child)
        return 0
    ncu = shutil.which("ncu")
    if ncu is None:
        print("ncu is not on the PATH", file=sys.stderr)
        return 2
    sys.path.insert(0, str(_ROOT))
    from vla_verify.bench import machine_info

    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {"machine": machine_info(), "command": " ".join(sys.argv),
                              "sections": list(SECTIONS), "sizes": {}}  # fmt: skip
    if a.commit:
        result["machine"]["commit"] = a.commit
    for size in a.sizes:
        D, T = (int(n) for n in size.split("x"))
        csv_path = out / f"ncu_D{D}_T{T}.csv"
        for extra in (True, False):
            run = subprocess.run(ncu_command(ncu, csv_path, D, T, extra), capture_output=True,
                                 text=True)  # fmt: skip
            print(f"D={D} T={T} extra metrics={extra}: exit {run.returncode}", flush=True)
            if run.returncode == 0:
                break
            print(run.stdout[-2000:], run.stderr[-2000:], file=sys.stderr, flush=True)
        entry: dict[str, Any] = {"exit": run.returncode, "extra_metrics": extra}
        if csv_path.is_file():
            entry["launches"] = summarise(csv_path)
        result["sizes"][size] = entry
        (out / "kernel_counters.json").write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
