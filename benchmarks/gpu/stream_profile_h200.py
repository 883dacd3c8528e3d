"""Where the streamed forward's time goes: forward medians (``do_bench``) and per-kernel times
(torch.profiler) of the streamed kernel and of the two kernels it replaces, with and without
``key_ahead``, beside fla's fused recurrent DPLR kernel, B = 1, H = 16, bf16.  (Earlier
commits of this script compared the shifted nudge and ``block_v`` (579b46f) and the nudge added
after the products (cba4a0a): ``results/h200/stream/profile_*``.)

    python benchmarks/gpu/stream_profile_h200.py --commit SHA --out $OUT   # stream_profile.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--commit", default="")
    p.add_argument("--out", default=".")
    args = p.parse_args()
    import torch
    from triton_h200 import _kernel_times

    from vla_verify.backends import triton_fused as tf
    from vla_verify.bench import _inputs, machine_info, make_ops, time_ms

    two = {"stream_passes": False, "overlap_passes": False}
    variants = {
        "two_kernels": {**two, "key_ahead": False},
        "two_kernels_key_ahead": two,
        "stream": {"key_ahead": False},
        "stream_key_ahead": {},
    }
    plans = {(D, T): variants for D in (64, 128) for T in (1024, 4096)}
    result: dict = {"machine": {**machine_info(), "commit": args.commit}, "rows": []}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for (D, T), variants in plans.items():
        x = _inputs(1, T, 16, D, torch.bfloat16, "cuda")
        xs = (x["q"], x["k"], x["v"], x["u"])
        anchors = make_ops(x)
        fla = anchors.get(("fla_fused_recurrent_dplr", "fwd"))
        if fla is not None:
            fla()
            torch.cuda.synchronize()
            ms = time_ms(fla)
            result["rows"].append({"D": D, "T": T, "variant": "fla_fused_recurrent_dplr",
                                   "median_ms": ms})  # fmt: skip
            print(f"D={D} T={T} fla_fused_recurrent_dplr: {ms:.3f} ms", flush=True)
        for name, opts in variants.items():
            opts = dict(opts)
            block = opts.pop("_block", 8)

            def fn(opts=opts, block=block, xs=xs):  # type: ignore[no-untyped-def]
                saved, tf._STREAM_BLOCK = tf._STREAM_BLOCK, block
                try:
                    return tf.fused_recurrent_vla(*xs, **opts)
                finally:
                    tf._STREAM_BLOCK = saved

            fn()
            torch.cuda.synchronize()
            ms = time_ms(fn)
            kernels = {k: v for k, v in _kernel_times(fn, "cuda").items() if k.startswith("vla")}
            result["rows"].append({"D": D, "T": T, "variant": name, "median_ms": ms,
                                   "kernels_ms": kernels})  # fmt: skip
            print(f"D={D} T={T} {name}: {ms:.3f} ms {kernels}", flush=True)
            (out / "stream_profile.json").write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
