"""Where the forward + backward's time goes on the H200 (B = 1, H = 16, bf16): the CUDA kernels
of one training step (forward with checkpoints, then the backward) and their device times
(torch.profiler), for the backend defaults and option variants, beside fla's
``fused_recurrent_delta_rule``; then ``do_bench`` medians, each variant twice in alternating
order.  Gradients of every variant are first compared with the defaults' on fresh inputs.

    python benchmarks/gpu/backward_profile_h200.py --commit SHA --out $OUT   # backward.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

#: (variant name, options of fused_recurrent_vla)
VARIANTS: list[tuple[str, dict]] = [
    ("defaults", {}),
    # the rerun and the gate backward's walk with the scalar shift (NUDGE_SCALAR_WALK): compare
    # vla_gate_bwd_kernel's device time with the defaults'
    ("nudge_scalar", {"nudge_scalar": True}),
]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--commit", default="")
    p.add_argument("--out", default=".")
    p.add_argument("--T", default="1024,4096")
    p.add_argument("--D", default="128,64")
    args = p.parse_args()
    import torch
    from torch.profiler import ProfilerActivity, profile

    from vla_verify.backends import triton_fused as tf
    from vla_verify.bench import _inputs, machine_info, make_ops, time_ms

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result: dict = {"machine": {**machine_info(), "commit": args.commit}, "rows": []}

    def step(x: dict, kw: dict):  # type: ignore[no-untyped-def]
        leaves = [x[n].detach().clone().requires_grad_() for n in ("q", "k", "v", "u")]

        def fn():  # type: ignore[no-untyped-def]
            o = tf.fused_recurrent_vla(*leaves, **kw)[0]
            return torch.autograd.grad(o, leaves, x["do"])

        return fn

    ok = True
    for D in (int(d) for d in args.D.split(",")):
        x = _inputs(1, 512, 16, D, torch.bfloat16, "cuda", seed=11)
        ref = [g.float() for g in step(x, {})()]
        for name, kw in VARIANTS[1:]:
            got = [g.float() for g in step(x, kw)()]
            rel = max(
                float((a - b).abs().max() / b.abs().max()) for a, b in zip(got, ref, strict=True)
            )
            print(f"D={D} {name}: rel. diff of the gradients {rel:.2e}", flush=True)
            result["rows"].append({"D": D, "variant": name, "rel_diff_grads": rel})
            ok &= rel < 5e-2
    if not ok:
        (out / "backward.json").write_text(json.dumps(result, indent=1))
        return 1
    for D in (int(d) for d in args.D.split(",")):
        for T in (int(t) for t in args.T.split(",")):
            x = _inputs(1, T, 16, D, torch.bfloat16, "cuda")
            fns = {name: step(x, kw) for name, kw in VARIANTS}
            anchors = make_ops(x)
            if ("fla_fused_recurrent_delta", "fwdbwd") in anchors:
                fns["fla_delta"] = anchors["fla_fused_recurrent_delta", "fwdbwd"]
            kernels: dict[str, list] = {}
            for name, fn in fns.items():
                for _ in range(2):
                    fn()
                torch.cuda.synchronize()
                with profile(activities=[ProfilerActivity.CUDA]) as prof:
                    for _ in range(3):
                        fn()
                    torch.cuda.synchronize()
                kernels[name] = sorted(
                    (
                        {
                            "name": e.key[:80],
                            "calls_per_step": e.count / 3,
                            "us_per_step": (
                                getattr(e, "device_time_total", None)
                                or getattr(e, "cuda_time_total", 0.0)
                            )
                            / 3,
                        }
                        for e in prof.key_averages()
                        if e.count
                    ),
                    key=lambda r: -r["us_per_step"],
                )
            times: dict[str, list[float]] = {n: [] for n in fns}
            for order in (list(fns), list(fns)[::-1]):
                for n in order:
                    times[n].append(time_ms(fns[n]))
            for n, ts in times.items():
                row = {"D": D, "T": T, "variant": n, "median_ms": min(ts), "other_ms": max(ts),
                       "kernels": kernels[n]}  # fmt: skip
                result["rows"].append(row)
                print(f"fwdbwd D={D} T={T} {n}: {min(ts):.3f} ms ({max(ts):.3f})", flush=True)
                for kern in kernels[n][:8]:
                    print(f"    {kern['calls_per_step']:6.1f} x  {kern['us_per_step']:10.1f} us"
                          f"  {kern['name']}")  # fmt: skip
            (out / "backward.json").write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
