"""When does the overlapped two-pass forward pay?  Forward medians with ``overlap_passes`` on and
off (backend defaults otherwise) beside fla's fused recurrent DPLR kernel, B = 1, H = 16, bf16.

    python benchmarks/gpu/overlap_h200.py --commit SHA --out $OUT     # writes overlap.json

Correctness: each variant's output is compared bitwise with the one-stream forward first (the
overlap must not change the result)."""

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

    from vla_verify.backends.triton_fused import fused_recurrent_vla
    from vla_verify.bench import _inputs, machine_info, make_ops, time_ms

    rows = []
    ok = True
    for D, Ts in ((64, (1024, 2048, 4096)), (128, (1024, 4096))):
        for T in Ts:
            x = _inputs(1, T, 16, D, torch.bfloat16, "cuda")
            q, k, v, u = x["q"], x["k"], x["v"], x["u"]
            ref = fused_recurrent_vla(q, k, v, u, overlap_passes=False)[0]
            fns = {}
            for overlap in (False, True):
                o = fused_recurrent_vla(q, k, v, u, overlap_passes=overlap)[0]
                same = bool(torch.equal(o, ref))
                ok &= same
                fns[f"overlap={overlap}"] = lambda ov=overlap, xs=(q, k, v, u): fused_recurrent_vla(
                    *xs, overlap_passes=ov
                )
                rows.append({"D": D, "T": T, "variant": f"overlap={overlap}", "same_bits": same})
            anchors = make_ops(x)
            if ("fla_fused_recurrent_dplr", "fwd") in anchors:
                fns["fla_fused_recurrent_dplr"] = anchors["fla_fused_recurrent_dplr", "fwd"]
            for fn in fns.values():
                fn()
            torch.cuda.synchronize()
            for name, fn in fns.items():
                ms = time_ms(fn)
                rows.append({"D": D, "T": T, "variant": name, "median_ms": ms})
                print(f"D={D} T={T} {name}: {ms:.3f} ms", flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result = {"machine": {**machine_info(), "commit": args.commit}, "same_bits": ok, "rows": rows}
    (out / "overlap.json").write_text(json.dumps(result, indent=1))
    print("same bits:", ok)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
