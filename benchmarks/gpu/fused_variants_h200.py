"""A/B of the fused forward's layout and downdate on the H200 (issue 5): ``$OUT/variants.json``.

    python benchmarks/gpu/fused_variants_h200.py             # on the GPU, about 5 minutes
    TRITON_INTERPRET=1 python benchmarks/gpu/fused_variants_h200.py --smoke   # CPU, the script

Candidates (see ``benchmarks/NOTES_triton.md``, "Second design"):

- ``layout``: ``plain`` holds ``A`` and ``S`` as in spec §1 (``_vla_step``); ``transposed``
  holds ``Aᵀ`` and ``Sᵀ`` (``_vla_step_t``), so that every matrix-vector product is a sum down
  axis 0 — thread-local adds instead of per-row shuffle butterflies.
- ``downdate``: ``exact`` (``(s_i s_j)/δ`` correctly rounded) or ``fma`` (``A − h hᵀ``).

1. Correctness first: ``validate`` (spec §4) in float32 and bfloat16 for every candidate policy;
   a candidate that fails is not timed.
2. Timing: B = 1, H = 16, T = 4096, bf16, D ∈ {64, 128}, a grid of (num_warps, block_v) per
   candidate (``triton.testing.do_bench`` medians after warm-up), each output first compared
   with the plain/exact kernel's on the same input; fla's ``fused_recurrent_dplr_delta_rule``
   forward in the same run for the ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root

CANDIDATES = [("plain", "exact"), ("transposed", "exact"), ("transposed", "fma")]
GRID = {
    64: [(nw, bv) for nw in (1, 2, 4, 8) for bv in (16, 32, 64)],
    128: [(nw, bv) for nw in (4, 8, 16) for bv in (16, 32, 64)],
}

#: The plain layout is timed only at the configurations last session's sweep found fastest.
PLAIN = {64: [(4, 16), (8, 16)], 128: [(8, 16), (16, 16)], 16: [(4, 16)]}


def log(msg: str) -> None:
    print(msg, flush=True)


def set_layout(layout: str) -> None:
    from vla_verify.backends import triton_fused

    triton_fused._FORWARD_TRANSPOSED = 1 if layout == "transposed" else 0


def check(layout: str, downdate: str, smoke: bool, device: str) -> dict:
    from vla_verify import VLAConfig, backends, validate
    from vla_verify.properties.strategies import ShapeBounds

    set_layout(layout)
    be = backends.get("triton_fused").bind(downdate=downdate)
    WIDE = ShapeBounds(max_B=1, max_H=2, max_T=48, max_dk=128, max_dv=128)
    plans = [
        ("float32", VLAConfig(), ShapeBounds(), 40),
        ("float32", VLAConfig(nudge_period=3, normalize_gate=False), ShapeBounds(), 15),
        ("float32", VLAConfig(), WIDE, 6),
        ("bfloat16", VLAConfig(), ShapeBounds(), 40),
    ]
    out = {}
    for i, (dtype, config, bounds, n) in enumerate(plans):
        if smoke:
            n, bounds = 2, ShapeBounds(max_T=10)
        rep = validate(be, config=config, array="torch", dtype=dtype, device=device,
                       max_examples=n, seed=100 + i, bounds=bounds)  # fmt: skip
        out[f"{dtype}_{i}"] = {
            "passed": rep.passed,
            "examples": rep.examples,
            "worst_ratio": rep.worst_ratio,
            "elapsed_s": rep.elapsed_s,
        }
        log(f"[check] {layout}/{downdate} {dtype}_{i}: " + rep.summary()[:1500])
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--out", default=os.environ.get("OUT", "."))
    args = p.parse_args()
    import torch

    from vla_verify.backends.triton_fused import fused_recurrent_vla
    from vla_verify.bench import _inputs, machine_info, time_ms

    device = "cpu" if args.smoke else "cuda"
    t0 = time.perf_counter()
    result: dict = {"machine": machine_info(), "correctness": {}, "timings": [], "fla": []}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    def save() -> None:
        (out / "variants.json").write_text(json.dumps(result, indent=1, default=str))

    green = {}
    for layout, downdate in CANDIDATES:
        key = f"{layout}/{downdate}"
        try:
            res = check(layout, downdate, args.smoke, device)
            green[key] = all(r["passed"] for r in res.values())
        except Exception:
            res = {"error": traceback.format_exc()}
            green[key] = False
            log(res["error"])
        result["correctness"][key] = res
        save()
    log(f"[check] {green} ({time.perf_counter() - t0:.0f} s)")

    T = 64 if args.smoke else 4096
    grid = {16: [(4, 16)]} if args.smoke else GRID
    for D, cands in grid.items():
        x = _inputs(1, T, 2 if args.smoke else 16, D, torch.bfloat16, device)
        q, k, v, u = x["q"], x["k"], x["v"], x["u"]
        set_layout("plain")
        ref = fused_recurrent_vla(q, k, v, u)[0].float()
        for layout, downdate in CANDIDATES:
            if not green[f"{layout}/{downdate}"]:
                continue
            set_layout(layout)
            for nw, bv in cands:
                if bv > D or (layout == "plain" and (nw, bv) not in PLAIN[D]):
                    continue
                row = {"D": D, "T": T, "layout": layout, "downdate": downdate,
                       "num_warps": nw, "block_v": bv}  # fmt: skip
                opts = {"num_warps": nw, "block_v": bv, "downdate": downdate}
                try:
                    o = fused_recurrent_vla(q, k, v, u, **opts)[0].float()
                    rel = float((o - ref).abs().max() / ref.abs().max())
                    inputs = (q, k, v, u)

                    def fn(inputs=inputs, opts=opts):  # type: ignore[no-untyped-def]
                        return fused_recurrent_vla(*inputs, **opts)[0]

                    row["rel_diff_vs_plain_exact"] = rel
                    row["median_ms"] = time_ms(fn, smoke=args.smoke)
                except Exception as exc:
                    row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
                log(f"[time] {row}")
                result["timings"].append(row)
                save()
        try:
            from fla.ops.generalized_delta_rule import fused_recurrent_dplr_delta_rule

            qu, ku = x["q_unit"], x["k_unit"]
            gk = torch.zeros(qu.shape, device=qu.device, dtype=torch.float32)
            a, b = -ku, ku.clone()

            def dplr(qu=qu, ku=ku, v=v, a=a, b=b, gk=gk):
                return fused_recurrent_dplr_delta_rule(qu, ku, v, a, b, gk, scale=1.0)[0]

            dplr()
            ms = time_ms(dplr, smoke=args.smoke)
            rec = {"op": "fla_fused_recurrent_dplr", "D": D, "T": T, "median_ms": ms}
            result["fla"].append(rec)
            log(f"[time] fla dplr D={D} T={T}: {ms:.3f} ms")
        except Exception as exc:
            log(f"[time] fla dplr unavailable: {type(exc).__name__}: {exc}")
        save()
    set_layout("transposed")
    log(f"total {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
