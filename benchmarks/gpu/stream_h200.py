"""The streamed two-pass forward (``stream_passes``) and the shifted nudge (``shift_nudge``) on
the H200: correctness first, then forward medians beside the previous defaults and fla's fused
recurrent DPLR kernel, B = 1, H = 16, bf16.

    python benchmarks/gpu/stream_h200.py --commit SHA --out $OUT     # writes stream.json

1. Correctness, before any time is taken (the JSON is rewritten after every step, so a run
   cut short keeps what it measured):
   - the streamed forward against the two kernels (``stream_passes=False``): outputs, final
     state and, through a training forward, every gradient, within 1e-2 of each tensor's
     largest entry (a race detector: bitwise in the interpreter, not on the GPU, where the
     kernels are compiled apart);
   - ``validate`` (spec §4 budgets) with ``shift_nudge=True`` at every width up to dk = 128, in
     float32 and bfloat16, for the paper preset and a nudge at every step;
   - T = 65536, D = 128 (shifted nudge, streamed) finite.
2. Forward medians (``do_bench``): per D and T the backend defaults, the previous defaults
   (``stream_passes=False``, no shift), and the variants in between; fwd+bwd at T = 2048.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def log(msg: str) -> None:
    print(msg, flush=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--commit", default="")
    p.add_argument("--out", default=".")
    p.add_argument("--skip-validate", action="store_true")
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
        (out / "stream.json").write_text(json.dumps(result, indent=1))

    ok = True
    # -- 1a. streamed == two kernels, bit for bit -------------------------------------------
    for D in (64, 128):
        x = _inputs(1, 1024, 16, D, torch.bfloat16, "cuda")
        xs = [x[n].detach().clone().requires_grad_() for n in ("q", "k", "v", "u")]
        runs = []
        for stream in (False, True):
            t0 = time.time()
            o, st = tf.fused_recurrent_vla(*xs, stream_passes=stream)
            grads = torch.autograd.grad((o.float() * x["do"].float()).sum() + st[0].sum(), xs)
            torch.cuda.synchronize()
            runs.append([o, *st, *grads])
            log(f"D={D} stream={stream}: {time.time() - t0:.1f} s")
        same = all(torch.equal(a, b) for a, b in zip(*runs, strict=True))
        # Not bitwise on the GPU: the two kernels and the streamed one are compiled apart (and
        # without streaming, D = 64 runs 8 overlapped segments), so sums may round in another
        # order.  A race (a gate read before it is written) would show as garbage, not as
        # rounding: each difference, relative to the tensor's largest entry, must stay below
        # 1e-2 (validate, below, is the precision gate).
        rel = [float((a.float() - b.float()).abs().max() / b.float().abs().max().clamp_min(1e-30))
               for a, b in zip(*runs, strict=True)]  # fmt: skip
        result["correctness"][f"stream_vs_two_kernels_rel_diff_D{D}"] = rel
        close = all(r < 1e-2 for r in rel)
        shift_diff = None
        if D == 128:
            o_ns = tf.fused_recurrent_vla(*xs, shift_nudge=False)[0].detach()
            shift_diff = float((o_ns.float() - runs[1][0].float()).abs().max())
        result["correctness"][f"stream_same_bits_D{D}"] = same
        result["correctness"][f"shift_vs_select_max_abs_o_D{D}"] = shift_diff
        ok &= close
        log(
            f"D={D}: streamed == two kernels (fwd, grads): bits {same}, rel. diff {rel}; "
            f"shift vs select {shift_diff}"
        )
        save()
    # -- 1b. validate with the shifted nudge at every width ----------------------------------
    if not args.skip_validate:
        wide = ShapeBounds(max_B=1, max_H=2, max_T=64, max_dk=128, max_dv=128)
        for dtype in ("float32", "bfloat16"):
            for cname, config in (
                ("paper", VLAConfig()),
                ("nudge_every_step", VLAConfig(nudge_period=1, nudge_eta=0.05)),
            ):
                for bname, bounds, n in (("default", ShapeBounds(), 25), ("wide", wide, 8)):
                    be = backends.get("triton_fused", shift_nudge=True)
                    t0 = time.time()
                    rep = validate(be, config=config, array="torch", dtype=dtype, device="cuda",
                                   max_examples=n, seed=7, bounds=bounds)  # fmt: skip
                    key = f"validate_shift_{dtype}_{cname}_{bname}"
                    result["correctness"][key] = bool(rep.passed)
                    ok &= bool(rep.passed)
                    log(f"{key}: {rep.passed} ({time.time() - t0:.0f} s)")
                    if not rep.passed:
                        log(rep.summary())
                    save()
    x = _inputs(1, 65536, 16, 128, torch.bfloat16, "cuda")
    o = tf.fused_recurrent_vla(x["q"], x["k"], x["v"], x["u"])[0]
    finite = bool(torch.isfinite(o).all())
    result["correctness"]["finite_T65536_D128"] = finite
    ok &= finite
    log(f"T=65536 D=128 finite: {finite}")
    result["correctness"]["all"] = ok
    save()
    if not ok:
        log("a correctness gate is red: no timing")
        return 1
    # -- 2. forward medians --------------------------------------------------------------------
    prev = {"stream_passes": False, "shift_nudge": False}
    variants = {
        64: {"defaults": {}, "previous_defaults": prev, "stream_block32": {"_block": 32}},
        128: {"defaults": {}, "previous_defaults": prev,
              "stream_no_shift": {"shift_nudge": False},
              "two_kernels_shift": {"stream_passes": False}},
    }  # fmt: skip
    for D, Ts in ((64, (1024, 2048, 4096, 16384)), (128, (1024, 4096, 16384))):
        for T in Ts:
            x = _inputs(1, T, 16, D, torch.bfloat16, "cuda")
            q, k, v, u = x["q"], x["k"], x["v"], x["u"]
            fns = {}
            for name, opts in variants[D].items():
                opts = dict(opts)
                block = opts.pop("_block", None)

                def fn(opts=opts, block=block, xs=(q, k, v, u)):  # type: ignore[no-untyped-def]
                    saved = tf._STREAM_BLOCK
                    if block is not None:
                        tf._STREAM_BLOCK = block
                    try:
                        return tf.fused_recurrent_vla(*xs, **opts)
                    finally:
                        tf._STREAM_BLOCK = saved

                fns[name] = fn
            anchors = make_ops(x)
            if ("fla_fused_recurrent_dplr", "fwd") in anchors:
                fns["fla_fused_recurrent_dplr"] = anchors["fla_fused_recurrent_dplr", "fwd"]
            for fn in fns.values():
                fn()
            torch.cuda.synchronize()
            for name, fn in fns.items():
                ms = time_ms(fn)
                result["rows"].append({"D": D, "T": T, "mode": "fwd", "variant": name,
                                       "median_ms": ms})  # fmt: skip
                log(f"fwd D={D} T={T} {name}: {ms:.3f} ms")
            save()
    for D in (64, 128):
        T = 2048
        x = _inputs(1, T, 16, D, torch.bfloat16, "cuda")
        xs = [x[n].detach().clone().requires_grad_() for n in ("q", "k", "v", "u")]
        fns = {}
        for name, opts in (("defaults", {}), ("previous_defaults", prev)):

            def fb(opts=opts, xs=xs, do=x["do"]):  # type: ignore[no-untyped-def]
                o = tf.fused_recurrent_vla(*xs, **opts)[0]
                return torch.autograd.grad(o, xs, do)

            fns[name] = fb
        anchors = make_ops(x)
        if ("fla_fused_recurrent_delta", "fwdbwd") in anchors:
            fns["fla_fused_recurrent_delta"] = anchors["fla_fused_recurrent_delta", "fwdbwd"]
        for fn in fns.values():
            fn()
        torch.cuda.synchronize()
        for name, fn in fns.items():
            ms = time_ms(fn)
            result["rows"].append({"D": D, "T": T, "mode": "fwdbwd", "variant": name,
                                   "median_ms": ms})  # fmt: skip
            log(f"fwdbwd D={D} T={T} {name}: {ms:.3f} ms")
        save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
