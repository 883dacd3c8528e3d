"""The float32 penalty chain's block-end check (the bf16 inference forward's chain), on the CPU
under Triton's interpreter or on a GPU: how far each block's end, run by the float32 chain
from its float64 products-only start, is from the next block's start, against
``FLOAT32_CHAIN_RTOL_PER_TOKEN · L`` for blocks of ``L`` tokens, and how far it is from wrong
starts, which the check must reject (planted: every block from
``A_0``, or starts from blocks' matrices without their nudges).

bf16 inputs (the chain's use: 16-bit inputs, whose budget the float32 chain keeps,
``docs/design/triton_chunked.md``, "Precision of the penalty chain"), one head, paper preset,
the layer's penalties (``benchmarks/block_start_spans.py``), positive queries and keys.  Per
case: the largest relative gap over the block boundaries (``max|end − start| / max|start|``),
its ratio to the tolerance, and the forward's fallbacks.
Usage::

    TRITON_INTERPRET=1 python benchmarks/gpu/float32_chain_checks.py \
        --json OUT.json [--cases DKxTxBLOCK ...] [--device cuda] [--validate N]

On a GPU (``--device cuda``, no interpreter) the products are the tensor cores' tf32x3, which
the interpreter computes as float32 products.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from block_start_spans import layer_penalties

from vla_verify import VLAConfig
from vla_verify.backends import triton_chunked as tc

CASES = ("16x1024x256", "16x4096x1024", "64x2048x512", "64x4096x1024", "16x8192x2048")


class GapRecorder:
    """Stands in for ``block_end_check_kernel``: records every boundary's relative gap, then
    launches the kernel."""

    def __init__(self, kernel: Any) -> None:
        self.kernel, self.gaps = kernel, []

    def __getitem__(self, grid: Any) -> Any:
        def launch(X: torch.Tensor, starts: torch.Tensor, flag: torch.Tensor, NB: int, *args: Any,
                   **kw: Any) -> Any:  # fmt: skip
            dk = starts.shape[-1]
            ends = X[:, : NB - 1, :dk, :dk].mT.double()
            nxt = starts[:, 1:NB].double()
            gap = (ends - nxt).abs().amax(dim=(-2, -1)) / nxt.abs().amax(dim=(-2, -1))
            self.gaps.append(float(gap.max()))
            return self.kernel[grid](X, starts, flag, NB, *args, **kw)

        return launch


def run(dk: int, T: int, block: int, planted: str, device: str = "cpu") -> dict[str, Any]:
    rng = np.random.default_rng(1)
    u = layer_penalties(T, dk)[:, :, None].to(device, torch.bfloat16)
    q, k = (torch.tensor(np.exp(0.5 * rng.standard_normal((1, T, 1, dk))), dtype=torch.bfloat16,
                         device=device) for _ in range(2))  # fmt: skip
    v = torch.tensor(rng.standard_normal((1, T, 1, dk)), dtype=torch.bfloat16, device=device)
    real_kernel, real_starts = tc.kernels.block_end_check_kernel, tc.penalty_block_starts
    recorder = GapRecorder(real_kernel)
    tc.kernels.block_end_check_kernel = recorder
    if planted == "from_A0":
        tc.penalty_block_starts = (
            lambda *a, **kw: (  # type: ignore[assignment]
                real_starts(*a, **kw)[:, :1].expand(-1, T // block, -1, -1)
            )
        )
    before, t0 = tc.BLOCK_START_FALLBACKS[0], time.perf_counter()
    try:
        bug = "block_starts_without_nudges" if planted == "without_nudges" else None
        tc.chunked_vla(q, k, v, u, config=VLAConfig(), penalty_dtype="float32",
                       penalty_block=block, planted_bug=bug)  # fmt: skip
    finally:
        tc.kernels.block_end_check_kernel, tc.penalty_block_starts = real_kernel, real_starts
    tol = tc.FLOAT32_CHAIN_RTOL_PER_TOKEN * block
    return {"dk": dk, "T": T, "block": block, "planted": planted, "gap": recorder.gaps[0],
            "gap_over_tolerance": recorder.gaps[0] / tol,
            "fallbacks": tc.BLOCK_START_FALLBACKS[0] - before,
            "seconds": round(time.perf_counter() - t0, 1)}  # fmt: skip


def validate_rows(examples: int, device: str) -> list[dict[str, Any]]:
    """:func:`vla_verify.validate` in bf16 of the registry backend with the float32 chain in
    blocks of 32 tokens (chunks of 16), so that drawn lengths past 32 run the check: the paper
    and exact presets, ``examples`` each (keys up to 32 wide, up to 320 tokens)."""
    from vla_verify import backends, validate
    from vla_verify.runtime import round_interpreter_bf16_to_nearest

    round_interpreter_bf16_to_nearest()
    fn = backends.get("triton_chunked", chunk_size=16, penalty_dtype="float32", penalty_block=32)
    rows = []
    for name, config in (("paper", VLAConfig()), ("exact", VLAConfig.exact())):
        before = tc.BLOCK_START_FALLBACKS[0]
        r = validate(fn, config=config, dtype="bfloat16", device=device, max_examples=examples,
                     seed=0, max_dk=32, max_T=320)  # fmt: skip
        rows.append({"config": name, "passed": r.passed, "examples": r.examples,
                     "worst_ratio": r.worst_ratio, "beyond_reach": r.beyond_reach,
                     "fallbacks": tc.BLOCK_START_FALLBACKS[0] - before})  # fmt: skip
        print(json.dumps(rows[-1]), flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", type=Path, required=True)
    ap.add_argument("--cases", nargs="*", default=list(CASES))
    ap.add_argument("--device", default="cpu", help="cuda: the GPU's tf32x3 products")
    ap.add_argument(
        "--validate",
        type=int,
        default=0,
        metavar="N",
        help="also validate the float32 chain in bf16, N examples per preset",
    )
    a = ap.parse_args()
    from vla_verify.bench import machine_info

    head: dict[str, Any] = {
        "machine": machine_info(),
        "rtol_per_token": tc.FLOAT32_CHAIN_RTOL_PER_TOKEN,
    }
    rows: list[dict[str, Any]] = []
    a.json.parent.mkdir(parents=True, exist_ok=True)
    if a.validate:
        head["validate"] = validate_rows(a.validate, a.device)
        a.json.write_text(json.dumps({**head, "rows": rows}, indent=1) + "\n")
    for c in a.cases:
        dk, T, block = (int(x) for x in c.split("x"))
        for planted in ("none", "from_A0", "without_nudges"):
            rows.append(run(dk, T, block, planted, a.device))
            print(json.dumps(rows[-1]), flush=True)
            a.json.write_text(json.dumps({**head, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
