"""``period_loop`` on the H200: a short ``validate`` gate (float32 and bfloat16, dk up to 128)
and a race check first, then forward medians beside the defaults and fla's fused recurrent DPLR
kernel, B = 1, H = 16, bf16.

    python benchmarks/gpu/period_loop_h200.py --commit SHA --out $OUT   # period_loop.json
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

    from vla_verify import VLAConfig, backends, validate
    from vla_verify.backends import triton_fused as tf
    from vla_verify.bench import _inputs, machine_info, make_ops, time_ms
    from vla_verify.properties.strategies import ShapeBounds

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result: dict = {"machine": {**machine_info(), "commit": args.commit}, "correctness": {},
                    "rows": []}  # fmt: skip

    def save() -> None:
        (out / "period_loop.json").write_text(json.dumps(result, indent=1))

    ok = True
    wide = ShapeBounds(max_B=1, max_H=2, max_T=64, max_dk=128, max_dv=128)
    for dtype in ("float32", "bfloat16"):
        be = backends.get("triton_fused", period_loop=True)
        rep = validate(be, config=VLAConfig(nudge_period=3), array="torch", dtype=dtype,
                       device="cuda", max_examples=6, seed=3, bounds=wide)  # fmt: skip
        result["correctness"][f"validate_{dtype}"] = bool(rep.passed)
        ok &= bool(rep.passed)
        print(f"validate {dtype}: {rep.passed}", flush=True)
    for D in (64, 128):
        x = _inputs(1, 1024, 16, D, torch.bfloat16, "cuda")
        xs = (x["q"], x["k"], x["v"], x["u"])
        a = tf.fused_recurrent_vla(*xs)[0].float()
        b = tf.fused_recurrent_vla(*xs, period_loop=True)[0].float()
        rel = float((a - b).abs().max() / a.abs().max())
        result["correctness"][f"rel_diff_o_D{D}"] = rel
        ok &= rel < 1e-2
        print(f"D={D} period_loop vs select, rel. diff o: {rel:.3e}", flush=True)
    result["correctness"]["all"] = ok
    save()
    if not ok:
        return 1
    for D in (128, 64):
        for T in (1024, 4096):
            x = _inputs(1, T, 16, D, torch.bfloat16, "cuda")
            xs = (x["q"], x["k"], x["v"], x["u"])
            fns = {
                "defaults": lambda xs=xs: tf.fused_recurrent_vla(*xs),
                "period_loop": lambda xs=xs: tf.fused_recurrent_vla(*xs, period_loop=True),
            }
            anchors = make_ops(x)
            if ("fla_fused_recurrent_dplr", "fwd") in anchors:
                fns["fla_fused_recurrent_dplr"] = anchors["fla_fused_recurrent_dplr", "fwd"]
            for fn in fns.values():
                fn()
            torch.cuda.synchronize()
            for name, fn in fns.items():
                ms = time_ms(fn)
                result["rows"].append({"D": D, "T": T, "variant": name, "median_ms": ms})
                print(f"fwd D={D} T={T} {name}: {ms:.3f} ms", flush=True)
            save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
