"""The chunked gate pass (``gate="chunked"``, spec §5 Woodbury/LDLᵀ in float64) on the H200.

    python benchmarks/gpu/chunk_gate_h200.py --commit SHA --out $OUT   # writes chunk_gate.json

Correctness first (a speed is never reported on a red gate):
  - ``validate`` (spec §4 budgets) in float32 and bfloat16, dk up to 128, with the chunked gate
    at chunk sizes 16 and 32, paper preset and a nudge every 3 steps without gate normalisation;
  - the chunked and recurrent forwards at the timing shapes (paper preset, bf16): relative
    difference of ``o`` and of the final ``A`` (both against the recurrent gate, for the record);
  - gradients through the chunked forward (whose checkpoints the recurrent backward reruns
    from) against those of the recurrent forward, relative difference;
  - T = 65536 finite at D = 64 and 128.
Then medians (``triton.testing.do_bench``) side by side in one process: the forward with the
recurrent gate (backend defaults, and ``split_after_load`` at D = 64), the chunked gate over
chunk sizes and warps, overlap on and off, fla's ``fused_recurrent_dplr_delta_rule``; forward +
backward at T = 2048 against fla's ``fused_recurrent_delta_rule``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root


def log(msg: str) -> None:
    print(msg, flush=True)


def checks(device: str, smoke: bool) -> dict:
    import torch

    from vla_verify import VLAConfig, validate
    from vla_verify.backends.triton_fused import fused_recurrent_vla
    from vla_verify.bench import _inputs
    from vla_verify.properties.strategies import ShapeBounds

    out: dict = {}

    def kernel(**options):  # type: ignore[no-untyped-def]
        def fn(q, k, v, u, *, config, initial_state=None):  # type: ignore[no-untyped-def]
            o, st = fused_recurrent_vla(
                q, k, v, u, config=config, initial_state=initial_state, **options
            )
            return o, tuple(x.to(q.dtype) for x in st)

        return fn

    wide = ShapeBounds(max_B=1, max_H=2, max_T=16 if smoke else 96, max_dk=128, max_dv=128)
    plans = [
        ("float32", VLAConfig(), ShapeBounds(), 30, 32),
        ("float32", VLAConfig(nudge_period=3, normalize_gate=False), ShapeBounds(), 20, 16),
        ("float32", VLAConfig(), wide, 6, 32),
        ("bfloat16", VLAConfig(), wide, 6, 16),
    ]
    for i, (dtype, config, bounds, n, chunk) in enumerate(plans):
        fn = kernel(schedule="two_pass", gate="chunked", gate_chunk=chunk)
        r = validate(
            fn, config=config, array="torch", dtype=dtype, device=device,
            max_examples=2 if smoke else n, seed=100 + i, bounds=bounds,
        )  # fmt: skip
        out[f"validate_{dtype}_{i}_C{chunk}"] = {"passed": r.passed, "summary": r.summary()[:3000]}
        log(f"[check] validate {dtype} C={chunk} {config}: {r.passed}")
    Ts = (64,) if smoke else (4096,)
    for D in (16,) if smoke else (64, 128):
        for T in Ts:
            x = _inputs(1, T, 2 if smoke else 16, D, torch.bfloat16, device)
            q, k, v, u = x["q"], x["k"], x["v"], x["u"]
            o_r, st_r = fused_recurrent_vla(q, k, v, u, schedule="two_pass")
            o_c, st_c = fused_recurrent_vla(q, k, v, u, schedule="two_pass", gate="chunked")
            rel_o = ((o_c.float() - o_r.float()).norm() / o_r.float().norm()).item()
            rel_a = ((st_c[1] - st_r[1]).norm() / st_r[1].norm()).item()
            leaves = [t.detach().clone().requires_grad_() for t in (q, k, v, u)]
            grads = []
            for gate in ("recurrent", "chunked"):
                o = fused_recurrent_vla(*leaves, schedule="two_pass", gate=gate)[0]
                grads.append(torch.autograd.grad(o, leaves, x["do"]))
            rel_g = [
                ((a.float() - b.float()).norm() / b.float().norm()).item()
                for a, b in zip(grads[1], grads[0], strict=True)
            ]
            finite = all(bool(torch.isfinite(t.float()).all()) for t in (o_c, *grads[1]))
            # bf16 outputs: the two forwards differ by output roundings (2**-8 relative per
            # element); the final A is float32 in both, the chains agree to float32 roundings.
            ok = finite and rel_o < 2**-7 and rel_a < 1e-4 and max(rel_g) < 2**-6
            out[f"chunked_vs_recurrent_D{D}_T{T}"] = {
                "passed": ok, "rel_o": rel_o, "rel_A": rel_a, "rel_grad_qkvu": rel_g,
            }  # fmt: skip
            log(f"[check] D={D} T={T} rel o {rel_o:.2e} A {rel_a:.2e} grads {rel_g}: {ok}")
    if not smoke:
        for D in (64, 128):
            x = _inputs(1, 65536, 16, D, torch.bfloat16, device)
            o, st = fused_recurrent_vla(x["q"], x["k"], x["v"], x["u"], gate="chunked")
            ok = bool(torch.isfinite(o.float()).all()) and all(
                bool(torch.isfinite(s).all()) for s in st
            )
            out[f"finite_T65536_D{D}"] = {"passed": ok}
            log(f"[check] T=65536 D={D} finite: {ok}")
            del x, o, st
            torch.cuda.empty_cache()
    return out


def timings(device: str, smoke: bool) -> list[dict]:
    import torch

    from vla_verify.bench import _inputs, make_ops, time_ms

    rows: list[dict] = []
    H = 2 if smoke else 16
    shapes = [(16, 64)] if smoke else [(64, 4096), (128, 4096), (64, 16384), (128, 16384)]
    for D, T in shapes:
        x = _inputs(1, T, H, D, torch.bfloat16, device)
        variants: list[dict] = [{}]
        if D == 64:
            variants.append({"split_after_load": True})
        for chunk in (16, 32):
            for warps in (4, 8):
                variants.append({"gate": "chunked", "gate_chunk": chunk, "gate_num_warps": warps})
        variants.append({"gate": "chunked", "overlap_passes": False})
        if T > 4096:  # the long shape: only the defaults and the chunked defaults
            variants = [{}, {"gate": "chunked"}, {"gate": "chunked", "overlap_passes": False}]
        fns = {}
        for opts in variants:
            ops = make_ops(x, smoke=True, triton_options=opts)
            fns[json.dumps(opts)] = ops["vla_triton_fused", "fwd"]
        if not smoke:
            anchors = make_ops(x, smoke=False)
            for key in (("fla_fused_recurrent_dplr", "fwd"), ("sdpa", "fwd")):
                if key in anchors:
                    fns[key[0]] = anchors[key]
        for name, fn in list(fns.items()):
            try:
                fn()
            except Exception as exc:
                log(f"  {name} D={D} T={T}: FAILED {type(exc).__name__}: {exc}")
                del fns[name]
        if not smoke:
            torch.cuda.synchronize()
        for name, fn in fns.items():
            ms = time_ms(fn, smoke=smoke)
            rows.append({"D": D, "T": T, "mode": "fwd", "variant": name, "median_ms": ms})
            log(f"  fwd D={D} T={T} {name}: {ms:.3f} ms")
        del x, fns
    for D in (16,) if smoke else (64, 128):
        T = 64 if smoke else 2048
        x = _inputs(1, T, H, D, torch.bfloat16, device)
        fns = {}
        for opts in ({}, {"gate": "chunked"}, {"gate": "chunked", "overlap_passes": False}):
            fns[json.dumps(opts)] = make_ops(x, smoke=True, triton_options=opts)[
                "vla_triton_fused", "fwdbwd"
            ]
        if not smoke:
            anchors = make_ops(x, smoke=False)
            if ("fla_fused_recurrent_delta", "fwdbwd") in anchors:
                fns["fla_fused_recurrent_delta"] = anchors["fla_fused_recurrent_delta", "fwdbwd"]
        for fn in fns.values():
            fn()
        for name, fn in fns.items():
            ms = time_ms(fn, smoke=smoke)
            rows.append({"D": D, "T": T, "mode": "fwdbwd", "variant": name, "median_ms": ms})
            log(f"  fwdbwd D={D} T={T} {name}: {ms:.3f} ms")
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--smoke", action="store_true", help="CPU + TRITON_INTERPRET=1, tiny shapes")
    p.add_argument("--commit", default="")
    p.add_argument("--out", default=".")
    p.add_argument("--skip-checks", action="store_true")
    args = p.parse_args()
    import os

    if args.smoke:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    from vla_verify.bench import machine_info

    device = "cpu" if args.smoke else "cuda"
    t0 = time.perf_counter()
    result: dict = {"machine": {**machine_info(), "commit": args.commit}, "correctness": {}}
    if not args.skip_checks:
        try:
            result["correctness"] = checks(device, args.smoke)
        except Exception:
            result["correctness"]["error"] = {"passed": False, "error": traceback.format_exc()}
            log(traceback.format_exc())
    green = all(v.get("passed") for v in result["correctness"].values())
    log(f"[check] gates {'GREEN' if green else 'RED'} ({time.perf_counter() - t0:.0f} s)")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if green:
        result["rows"] = timings(device, args.smoke)
    (out / "chunk_gate.json").write_text(json.dumps(result, indent=1, default=str))
    log(f"total {time.perf_counter() - t0:.0f} s")
    return 0 if green else 1


if __name__ == "__main__":
    sys.exit(main())
