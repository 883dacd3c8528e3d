"""Forward-option sweep of the streamed kernel on the H200 beside fla's fused recurrent DPLR
kernel (B = 1, H = 16, bf16): every variant's output is first compared with the defaults' on
fresh inputs, then each is timed twice in alternating order (``do_bench`` medians; the lower of
the two is kept, the other reported).

    python benchmarks/gpu/gate_sweep_h200.py --commit SHA --out $OUT   # gate_sweep.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

#: (D, variant name, options of fused_recurrent_vla)
VARIANTS: list[tuple[int, str, dict]] = [
    (128, "defaults", {}),
    (128, "nudge_scalar", {"nudge_scalar": True}),
    (128, "nudge_scalar,split_sums=4", {"nudge_scalar": True, "split_sums": 4}),
    (128, "nudge_scalar,split_sums=16", {"nudge_scalar": True, "split_sums": 16}),
    (128, "nudge_scalar,two_kernels", {"nudge_scalar": True, "stream_passes": False}),
    (64, "defaults", {}),
    (64, "nudge_scalar", {"nudge_scalar": True, "period_loop": False}),
    (
        64,
        "nudge_scalar,split_sums=8",
        {"nudge_scalar": True, "period_loop": False, "split_sums": 8},
    ),
]


def run(xs: tuple, kw: dict):
    """The forward with options ``kw``; ``stream_block`` sets the module's ``_STREAM_BLOCK``."""
    from vla_verify.backends import triton_fused as tf

    kw = dict(kw)
    block = tf._STREAM_BLOCK
    tf._STREAM_BLOCK = kw.pop("stream_block", block)
    try:
        return tf.fused_recurrent_vla(*xs, **kw)
    finally:
        tf._STREAM_BLOCK = block


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--commit", default="")
    p.add_argument("--out", default=".")
    p.add_argument("--T", default="1024,4096")
    args = p.parse_args()
    import torch

    from vla_verify.backends import triton_fused as tf
    from vla_verify.bench import _inputs, machine_info, make_ops, time_ms

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result: dict = {"machine": {**machine_info(), "commit": args.commit}, "rows": []}
    ok = True
    for D in sorted({d for d, _, _ in VARIANTS}, reverse=True):
        x = _inputs(1, 512, 16, D, torch.bfloat16, "cuda", seed=11)
        xs = (x["q"], x["k"], x["v"], x["u"])
        ref = tf.fused_recurrent_vla(*xs)[0].float()
        for d, name, kw in VARIANTS:
            if d != D or not kw:
                continue
            o = run(xs, kw)[0].float()
            rel = float((o - ref).abs().max() / ref.abs().max())
            result["rows"].append({"D": D, "variant": name, "rel_diff_o": rel})
            print(f"D={D} {name}: rel. diff o {rel:.2e}", flush=True)
            ok &= rel < 1e-2
    (out / "gate_sweep.json").write_text(json.dumps(result, indent=1))
    if not ok:
        return 1
    for D in sorted({d for d, _, _ in VARIANTS}, reverse=True):
        for T in (int(t) for t in args.T.split(",")):
            x = _inputs(1, T, 16, D, torch.bfloat16, "cuda")
            xs = (x["q"], x["k"], x["v"], x["u"])
            fns = {n: (lambda kw=kw, xs=xs: run(xs, kw))
                   for d, n, kw in VARIANTS if d == D}  # fmt: skip
            anchors = make_ops(x)
            if ("fla_fused_recurrent_dplr", "fwd") in anchors:
                fns["fla_fused_recurrent_dplr"] = anchors["fla_fused_recurrent_dplr", "fwd"]
            for fn in fns.values():
                fn()
            torch.cuda.synchronize()
            times: dict[str, list[float]] = {n: [] for n in fns}
            for order in (list(fns), list(fns)[::-1]):
                for n in order:
                    times[n].append(time_ms(fns[n]))
            for n, ts in times.items():
                row = {"D": D, "T": T, "variant": n, "median_ms": min(ts), "other_ms": max(ts)}
                result["rows"].append(row)
                print(f"fwd D={D} T={T} {n}: {min(ts):.3f} ms ({max(ts):.3f})", flush=True)
            (out / "gate_sweep.json").write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
