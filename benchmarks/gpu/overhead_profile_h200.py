"""The fixed cost of the streamed forward at D = 128 (H200): the CUDA kernels one call launches
and their device times (torch.profiler), ours and fla's fused recurrent DPLR, B = 1, H = 16,
bf16, T = 1024 and 4096; then ``do_bench`` medians of the same calls.

    python benchmarks/gpu/overhead_profile_h200.py --commit SHA --out $OUT   # overhead.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--commit", default="")
    p.add_argument("--out", default=".")
    args = p.parse_args()
    import torch
    from torch.profiler import ProfilerActivity, profile

    from vla_verify.backends import triton_fused as tf
    from vla_verify.bench import _inputs, machine_info, make_ops, time_ms

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result: dict = {"machine": {**machine_info(), "commit": args.commit}, "rows": []}
    for D in (128, 64):
        for T in (1024, 4096):
            x = _inputs(1, T, 16, D, torch.bfloat16, "cuda")
            xs = (x["q"], x["k"], x["v"], x["u"])
            fns = {
                "vla": lambda xs=xs: tf.fused_recurrent_vla(*xs),
                "vla_split8": lambda xs=xs: tf.fused_recurrent_vla(*xs, split_sums=8),
            }
            anchors = make_ops(x)
            if ("fla_fused_recurrent_dplr", "fwd") in anchors:
                fns["fla_dplr"] = anchors["fla_fused_recurrent_dplr", "fwd"]
            for name, fn in fns.items():
                for _ in range(3):
                    fn()
                torch.cuda.synchronize()
                with profile(activities=[ProfilerActivity.CUDA]) as prof:
                    for _ in range(10):
                        fn()
                    torch.cuda.synchronize()
                kernels = []
                for e in prof.key_averages():
                    us = getattr(e, "device_time", None) or getattr(e, "cuda_time", 0.0)
                    if e.count:
                        kernels.append({"name": e.key[:80], "calls": e.count, "avg_us": us})
                ms = time_ms(fn)
                row = {"D": D, "T": T, "op": name, "median_ms": ms, "kernels": kernels}
                result["rows"].append(row)
                print(f"D={D} T={T} {name}: {ms:.4f} ms", flush=True)
                for kern in kernels:
                    print(f"    {kern['calls']:4d} x {kern['avg_us']:9.1f} us  {kern['name']}")
            (out / "overhead.json").write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
