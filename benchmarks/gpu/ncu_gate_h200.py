"""The forwards to profile with Nsight Compute on the H200 (B = 1, H = 16, bf16): every op runs
once outside and once inside the NVTX range ``profile`` (compile and fla's autotune happen
outside it), so that ``ncu --nvtx --nvtx-include "profile/"`` sees one launch of each kernel.

    ncu --clock-control none --nvtx --nvtx-include "profile/" --section WarpStateStats \\
        --section SourceCounters -o $OUT/gate python3 benchmarks/gpu/ncu_gate_h200.py --D 128
    ncu --import $OUT/gate.ncu-rep --page source --csv --print-source sass > $OUT/gate_sass.csv

Ops (``--ops``, comma-separated): ``stream`` (the default forward, one launch),
``two_kernels`` (the gate kernel and the state kernel), ``period_loop`` (two kernels, the
gate's period loop), ``nudge_scalar`` (streamed, the nudge as a scalar shift),
``nudge_scalar_two_kernels``, ``fla_dplr`` (fla's fused recurrent DPLR kernel, when fla imports).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

OPTIONS = {
    "stream": {},
    "two_kernels": {"stream_passes": False},
    "period_loop": {"stream_passes": False, "period_loop": True},
    "nudge_scalar": {"nudge_scalar": True},
    "nudge_scalar_two_kernels": {"nudge_scalar": True, "stream_passes": False},
}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--D", type=int, default=128)
    p.add_argument("--T", type=int, default=1024)
    p.add_argument("--ops", default="stream,two_kernels,fla_dplr")
    args = p.parse_args()
    import torch

    from vla_verify.backends.triton_fused import fused_recurrent_vla
    from vla_verify.bench import _inputs, make_ops

    x = _inputs(1, args.T, 16, args.D, torch.bfloat16, "cuda")
    xs = (x["q"], x["k"], x["v"], x["u"])
    calls = {}
    for name in args.ops.split(","):
        if name in OPTIONS:
            calls[name] = lambda kw=OPTIONS[name]: fused_recurrent_vla(*xs, **kw)
        elif name == "fla_dplr":
            fla = make_ops(x).get(("fla_fused_recurrent_dplr", "fwd"))
            if fla is None:
                print("fla is not importable: fla_dplr left out", flush=True)
                continue
            calls[name] = fla
        else:
            raise SystemExit(f"--ops: unknown op {name!r}; expected {sorted(OPTIONS)} or fla_dplr")
    for fn in calls.values():  # compile, autotune
        fn()
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_push("profile")
    for name, fn in calls.items():
        torch.cuda.nvtx.range_push(name)
        fn()
        torch.cuda.synchronize()
        torch.cuda.nvtx.range_pop()
    torch.cuda.nvtx.range_pop()
    print("profiled:", ", ".join(calls), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
