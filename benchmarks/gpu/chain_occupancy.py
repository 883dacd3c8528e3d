"""The penalty chain's programs per SM against its block count, side by side on one GPU.

The penalty kernel holds 255 registers per thread in every build, so an sm_90 SM runs
``65536 / (256·32·warps)`` of its programs at once: two at 4 warps, four at 2, eight at 1.
Each program walks one block of tokens chunk after chunk, and its steps are short dependent
reductions, so a program is bound by latency rather than issue; more programs per SM with
fewer warps each, in more, shorter blocks, may shorten the chain's walk where the same count of
blocks at fewer warps did not (``docs/design/triton_chunked.md``, "What runs", step 1).

For each size (B = 1, H = 16, bf16, paper preset) and each (warps, blocks) pair: ``o`` against
the default plan's (relative max difference: blocks of other lengths change the float64 chain's
rounding only), then the forward's median (``triton.testing.do_bench``, the variants
alternated twice, the lower kept), the forward + backward's, and the penalty kernel's and the
whole forward's device time (torch.profiler, mean of five calls)::

    python benchmarks/gpu/chain_occupancy.py OUT.json [--sizes 64x16384 ...]

A variant is ``warps:blocks``; ``default`` is the shipped plan; ``--variants`` runs a subset.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

#: Variants per key width: (warps, blocks per head), ``None`` for the default plan.
VARIANTS: dict[int, tuple[tuple[int, int] | None, ...]] = {
    64: (None, (2, 16), (2, 32), (1, 32), (1, 64)),
    128: (None, (8, 16), (4, 16), (4, 8)),
}


def _device_ms(fn: Any) -> dict[str, float]:
    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            fn()
        torch.cuda.synchronize()
    return {e.key: e.device_time_total / 5 / 1000 for e in prof.key_averages()
            if e.device_time_total > 0}  # fmt: skip


def main() -> None:
    import torch

    from vla_verify import VLAConfig
    from vla_verify.backends import triton_chunked as tc
    from vla_verify.bench import _grad_op, _inputs, machine_info, time_ms

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--sizes", nargs="+", default=["64x4096", "64x16384", "64x65536",
                                                   "128x16384"])  # fmt: skip
    ap.add_argument("--no-backward", action="store_true")
    ap.add_argument(
        "--variants",
        nargs="+",
        default=None,
        metavar="WARPS:BLOCKS",
        help="the variants to run, 'default' among them (default: VARIANTS)",
    )
    a = ap.parse_args()
    cfg = VLAConfig()
    res: dict[str, Any] = {"machine": machine_info(), "rows": []}
    default_warps = dict(tc.PENALTY_CHAIN_WARPS)
    for size in a.sizes:
        D, T = (int(s) for s in size.split("x"))
        x = _inputs(1, T, 16, D, torch.bfloat16, "cuda")
        args = [x[n] for n in "qkvu"]
        leaves = [x[n].detach().clone().requires_grad_(True) for n in "qkvu"]
        BK = max(32, 1 << (D - 1).bit_length())
        rows: list[dict[str, Any]] = []
        fns: list[tuple[dict[str, Any], Any, Any, dict[int, int]]] = []
        base = None
        chosen = VARIANTS[D] if a.variants is None else tuple(
            None if v == "default" else tuple(int(n) for n in v.split(":"))
            for v in a.variants)  # fmt: skip
        for variant in chosen:
            warps = default_warps if variant is None else {**default_warps, BK: variant[0]}
            block = None if variant is None else -(-T // variant[1] // 16) * 16

            def fwd(args: list[Any] = args, block: int | None = block) -> Any:
                return tc.chunked_vla(*args, config=cfg, penalty_block=block)[0]

            def forward(q: Any, k: Any, v: Any, u: Any, block: int | None = block) -> Any:
                return tc.chunked_vla(q, k, v, u, config=cfg, penalty_block=block)[0]

            row: dict[str, Any] = {"D": D, "T": T, "variant": "default" if variant is None
                                   else f"{variant[0]}:{variant[1]}"}  # fmt: skip
            tc.PENALTY_CHAIN_WARPS = warps
            try:
                o = fwd().float()
                if base is None:
                    base = o
                row["rel_diff"] = float((o - base).abs().max() / base.abs().max())
                row["block_tokens"] = tc.penalty_block_length(
                    T, 16, block, dk=D, heads=16, device="cuda", chain_dtype="float32"
                )  # the bf16 inference forward's chain
                fb = None if a.no_backward else _grad_op(forward, leaves, x["do"])
                fns.append((row, fwd, fb, warps))
            except Exception as exc:  # a variant that does not build is recorded, not fatal
                row["error"] = repr(exc)[:400]
            finally:
                tc.PENALTY_CHAIN_WARPS = default_warps
            rows.append(row)
        for _ in range(2):
            for row, fwd, fb, warps in fns:
                tc.PENALTY_CHAIN_WARPS = warps
                try:
                    for mode, fn in (("fwd", fwd), ("fwdbwd", fb)):
                        if fn is not None:
                            ms = time_ms(fn)
                            row[f"{mode}_ms"] = min(row.get(f"{mode}_ms", ms), ms)
                finally:
                    tc.PENALTY_CHAIN_WARPS = default_warps
        for row, fwd, _, warps in fns:
            tc.PENALTY_CHAIN_WARPS = warps
            try:
                kernels = _device_ms(fwd)
            finally:
                tc.PENALTY_CHAIN_WARPS = default_warps
            row["fwd_device_ms"] = sum(kernels.values())
            row["penalty_chain_kernel_ms"] = kernels.get("penalty_chain_kernel")
            row["fwd_kernels_ms"] = dict(sorted(kernels.items(), key=lambda kv: -kv[1])[:10])
        for row in rows:
            print(json.dumps({k: v for k, v in row.items() if k != "fwd_kernels_ms"}), flush=True)
        res["rows"].extend(rows)
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(res, indent=1))
        del x, args, leaves, fns, base
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
