"""The blocks' matrices kernel (``penalty_block_matrix_kernel``) in other launch shapes: columns
per program ``NC``, token rows per product ``CH`` and warps, side by side with the backend's
launch (``penalty_block_matrices``, its shape per key width and dtype from
``_block_matrix_launch``).
Correctness first: each variant's matrices against the backend's, to float64 rounding; then
each launch's median (``vla_verify.bench.time_ms``: ``do_bench`` after its warm-up)::

    python benchmarks/gpu/block_matrix_variants.py OUT.json [--sizes 64x16384 128x16384]
        [--dtype float64|float32]

B = 1, H = 16, the grid's bf16 penalties (``vla_verify.bench._inputs``), the paper preset's nudges,
the forward's block length and its ``last=False``. ``--dtype float64`` (default): the float64
chain's matrices, from the penalties' float32 copy as the forward reads them, agreeing to
``AGREE_RTOL``; ``float32``: the float32 chain's tf32x3 matrices, from the bf16 penalties as they
are, agreeing to ``FLOAT32_CHAIN_RTOL_PER_TOKEN`` per token of a block (the bound the kernel's own
test holds them to against the pieces' products: another order of the same float32 sums stays
within it). The candidates are the shapes that build for sm_90 with at most 48 bytes of stack per
thread (``benchmarks/results/sm90/preflight_block_matrix_variants.json``), then wider ones (64
columns or 64 rows) and fewer warps. ``--smoke`` runs toy sizes on the CPU under
``TRITON_INTERPRET=1`` (correctness only, no timing).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

#: (NC, CH, warps) for key tiles up to 64 wide and for 128: the float64 matrices' launch first,
#: the float32 ones' (64, 32, 4) and (64, 32, 8) among the rest.
CANDIDATES: dict[int, list[tuple[int, int, int]]] = {
    64: [(32, 32, 2), (32, 32, 4), (16, 16, 4), (16, 32, 4), (32, 16, 4), (32, 16, 8),
         (16, 16, 8), (64, 32, 4), (32, 64, 4), (64, 64, 4), (16, 32, 2)],
    128: [(32, 32, 4), (32, 32, 8), (16, 16, 8), (32, 16, 8), (32, 16, 4), (16, 32, 4),
          (32, 32, 2), (64, 32, 4), (32, 64, 4), (64, 32, 8), (16, 32, 2), (64, 64, 8)],
}  # fmt: skip
#: Largest relative difference (to the largest entry) that float64 rounding in another order
#: of the same products reaches: the pieces' matrices' modes spread the entries over many
#: orders of magnitude, so the bound is relative to the largest, with room over 2^-52 per
#: product for the few hundred products of a block.
AGREE_RTOL = 1e-11


def launch(u: Any, params: Any, out: Any, block: int, nc: int, ch: int, warps: int,
           bug: int = 0) -> None:  # fmt: skip
    """``penalty_block_matrix_kernel`` into ``out`` ``[BH, NB, 2dk, 2dk]`` (float64, or float32
    for the float32 chain's tf32x3 matrices) for every block but the last (the forward's
    ``last=False``), in the launch shape ``(nc, ch, warps)``; ``u`` ``[B, T, H, dk]`` float32
    (bf16 as the forward passes it, for float32 matrices), paper clock (``start = 0``, period
    20)."""
    from vla_verify.backends import triton_chunked as tc

    B, T, H, dk = u.shape
    NB = out.shape[1]
    BK = max(32, tc._pow2(dk))
    tc.kernels.penalty_block_matrix_kernel[(B * H, NB - 1, 2 * BK // nc)](
        u, out, params, T, H, 0, 20, block, NB, H * dk, dk, dk,
        BK=BK, NC=nc, CH=ch, PD=tc._tl_dtype(out.dtype), BUG=bug, num_warps=warps,
    )  # fmt: skip


def compare(D: int, T: int, device: str, timing: bool, bug: int = 0,
            dtype: str = "float64") -> list[dict[str, Any]]:  # fmt: skip
    """One size: every candidate's matrices (``dtype``) against the backend's, then
    (``timing``) medians.  ``bug`` plants a fault in the candidates' launches (not the
    reference's), for the check's own test."""
    import torch

    from vla_verify import VLAConfig
    from vla_verify.backends import triton_chunked as tc
    from vla_verify.bench import _inputs, time_ms

    H = 2 if device == "cpu" else 16
    u = _inputs(1, T, H, D, torch.bfloat16, device)["u"].contiguous()
    pd = getattr(torch, dtype)
    if pd == torch.float64:
        u = u.float()
    params = tc._params(VLAConfig(), torch.device(device))
    block = 64 if device == "cpu" else tc.penalty_block_length(
        T, 16, dk=D, heads=H, device=torch.device(device))  # fmt: skip
    ref = tc.penalty_block_matrices(u, params, start=0, nudge_period=20, block=block, last=False,
                                    dtype=pd)  # fmt: skip
    rtol = AGREE_RTOL if pd == torch.float64 else tc.FLOAT32_CHAIN_RTOL_PER_TOKEN * block
    BK = max(32, tc._pow2(D))
    rows = []
    for nc, ch, warps in CANDIDATES[64 if BK <= 64 else 128]:
        out = torch.zeros_like(ref)
        launch(u, params, out, block, nc, ch, warps, bug=bug)
        scale = ref[:, :-1].abs().amax().item()
        diff = (out[:, :-1] - ref[:, :-1]).abs().amax().item() / scale
        row: dict[str, Any] = {"D": D, "T": T, "H": H, "block": block, "dtype": dtype,
                               "NC": nc, "CH": ch, "warps": warps, "relative_difference": diff,
                               "tolerance": rtol, "agrees": diff <= rtol}  # fmt: skip
        if timing and row["agrees"]:
            row["median_ms"] = time_ms(
                lambda o=out, nc=nc, ch=ch, w=warps: launch(u, params, o, block, nc, ch, w)
            )
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--sizes", nargs="+", default=["64x16384", "128x16384"])
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--dtype", choices=["float64", "float32"], default="float64")
    a = ap.parse_args()
    sizes = ["40x192", "96x192"] if a.smoke else a.sizes
    device = "cpu" if a.smoke else "cuda"
    res: dict[str, Any] = {"rows": []}
    if not a.smoke:
        from vla_verify.bench import machine_info

        res["machine"] = machine_info()
    for size in sizes:
        D, T = (int(s) for s in size.split("x"))
        res["rows"] += compare(D, T, device, timing=not a.smoke, dtype=a.dtype)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
