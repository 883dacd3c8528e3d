"""The float64 penalty kernels reading bf16 keys and penalties as they are, against float32
copies of them, side by side on a GPU (design doc ``docs/design/triton_chunked.md``, "What
runs"; :func:`vla_verify.backends.triton_chunked._penalty_operand`).

The kernels read bf16 as the int32 words that hold it and widen it through its bits
(``kernels.load_rows_float32``), so both variants compute on the same float32 values and must
give the same output bit for bit: that is checked first, forward and gradients.  Then, per
size (B = 1, H = 16, bf16, paper preset): the forward's median and the forward + backward's
(``triton.testing.do_bench``, the two variants alternated twice, the lower median of each
kept), and the device time of the penalty kernels and of the copies (torch.profiler, mean of
five calls).  ``copies`` stands the host's float32 copies back in for the comparison.

    python benchmarks/gpu/penalty_operands.py OUT [--sizes 64x4096 64x16384 128x16384]

writes ``OUT/penalty_operands.json``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

KERNELS = ("penalty_chain_kernel", "penalty_block_matrix_kernel")


def _device_ms(fn: Any, calls: int = 5) -> dict[str, float]:
    """Device time per call of ``fn`` by kernel name (torch.profiler): the penalty kernels,
    the float32 copies (PyTorch's casting copy), and the total."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    rows: dict[str, float] = {name: 0.0 for name in (*KERNELS, "float32_copies", "total")}
    for e in prof.key_averages():
        us = e.device_time_total / calls / 1000
        if e.device_time_total <= 0:
            continue
        rows["total"] += us
        if e.key in KERNELS:
            rows[e.key] += us
        elif "direct_copy" in e.key and "LoadWithCast" in e.key:
            rows["float32_copies"] += us
    return rows


def _row(D: int, T: int) -> dict[str, Any]:
    """One size: the equality check, the medians, the device times."""
    import torch

    from vla_verify import VLAConfig
    from vla_verify.backends import triton_chunked as tc
    from vla_verify.bench import _grad_op, _inputs, time_ms

    cfg = VLAConfig()
    words = tc._penalty_operand
    variants = {"words": words, "copies": lambda x: x.float()}
    x = _inputs(1, T, 16, D, torch.bfloat16, "cuda")
    args = [x[n] for n in "qkvu"]

    def leaves() -> list[Any]:
        return [x[n].detach().clone().requires_grad_(True) for n in "qkvu"]

    def fwd() -> Any:
        return tc.chunked_vla(*args, config=cfg)[0]

    def forward(q: Any, k: Any, v: Any, u: Any) -> Any:
        return tc.chunked_vla(q, k, v, u, config=cfg)[0]

    fwdbwd = _grad_op(forward, leaves(), x["do"])
    row: dict[str, Any] = {"D": D, "T": T}
    outputs: dict[str, list[Any]] = {}
    try:
        for name, operand in variants.items():
            tc._penalty_operand = operand
            lv = leaves()
            o = forward(*lv)
            outputs[name] = [o.detach(), *torch.autograd.grad(o, lv, x["do"])]
        pairs = zip(outputs["words"], outputs["copies"], strict=True)
        row["identical"] = all(torch.equal(a, b) for a, b in pairs)
        for mode, fn in (("fwd", fwd), ("fwdbwd", fwdbwd)):
            for name in (*variants, *variants):
                tc._penalty_operand = variants[name]
                ms = time_ms(fn)
                key = f"{mode}_{name}_ms"
                row[key] = min(row.get(key, ms), ms)
        for name, operand in variants.items():
            tc._penalty_operand = operand
            row[f"fwd_{name}_device_ms"] = _device_ms(fwd)
    finally:
        tc._penalty_operand = words
    return row


def main() -> None:
    from vla_verify.bench import machine_info

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--sizes", nargs="+", default=["64x4096", "64x16384", "128x16384"])
    a = ap.parse_args()
    res: dict[str, Any] = {"machine": machine_info(), "rows": []}
    t0 = time.perf_counter()
    for size in a.sizes:
        D, T = (int(s) for s in size.split("x"))
        row = _row(D, T)
        res["rows"].append(row)
        print(json.dumps(row), flush=True)
    res["seconds"] = time.perf_counter() - t0
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "penalty_operands.json").write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
