"""The chunked forward's gates by the recurrent kernel's float32 gate pass from every penalty
block's start, against its float64 Woodbury chain (``docs/design/triton_chunked.md``, "The
floor", further way 5): correctness first, then the two kernels' device time side by side.

For each size (B = 1, H = 16, bf16, paper preset) and each block count: the block starts as the
chunked forward computes them (the blocks' matrices, their products block after block, one
batched solve; float64), rounded to float32, then ``vla_gate_kernel`` with the sequence folded
into the blocks (one program per block and head, each from its start, its nudge clock at the
block's first token), as the recurrent backward reruns its gates from every checkpoint.  Its
``α̂`` are compared with those of the chunked forward at the same block length (its float64
chain's, ``_forward(save_checkpoints=True)``), and each block's end with the next block's
start; then the device time of ``vla_gate_kernel`` and
of the chunked forward's ``penalty_chain_kernel`` (torch.profiler, mean of five calls) and the
medians of the two launches (``triton.testing.do_bench``)::

    python benchmarks/gpu/gate_chain_blocks.py OUT.json [--sizes 64x16384 128x16384]
        [--blocks 16 32 64]

``--smoke`` runs toy sizes on the CPU under ``TRITON_INTERPRET=1`` (float32, no timing).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any


def block_gates(q: Any, k: Any, u: Any, config: Any, block: int, ends: bool = False) -> Any:
    """``α̂`` ``[B·H, T, BK]`` (float32, ``BK = next_power_of_2(dk)``) by ``vla_gate_kernel`` from
    every block's start; ``T`` a multiple of ``block``.  With ``ends``, also the largest
    relative difference between each block's end (the float32 chain's ``A``) and the next
    block's start (float64): what a block-end check on this chain would see."""
    import torch

    from vla_verify.backends import triton_chunked as tc
    from vla_verify.backends import triton_fused as tf

    B, T, H, dk = q.shape
    NB = T // block
    dev = q.device
    A0 = tc._identity(dk, dev).div(config.lambda0).expand(B * H, dk, dk)
    assert config.nudge_period is not None, "the paper preset's nudges: the blocks' matrices"
    period = int(config.nudge_period)
    if NB == 1:
        starts = A0[:, None]
    else:
        matrices = tc.penalty_block_matrices(
            u.float(), tc._params(config, dev), start=0, nudge_period=period, block=block,
            bug=tc.kernels.BUG_NONE, last=False,
        )  # fmt: skip
        starts = tc.penalty_block_starts(
            None, A0, start=0, nudge_period=config.nudge_period, nudge_eta=config.nudge_eta,
            block=block, normalise=False, matrices=matrices,
        )  # fmt: skip
    # Batch element j of the fold holds block j: a0 is Aᵀ [NB·B, H, dk, dk] in that order.
    a0 = starts.mT.reshape(B, H, NB, dk, dk).transpose(1, 2).reshape(B * NB, H, dk, dk)
    a0 = a0.to(torch.float32).contiguous()
    z0 = torch.zeros(B * NB, H, dk, dtype=torch.float32, device=dev)
    fold = [x.reshape(B * NB, block, H, dk) for x in (q, k, u)]
    bk = tf._pow2(dk)
    plan = tf.plan_for(B * NB, H, block, dk, dk, q.dtype, dev, True)
    out = [torch.empty(B * NB * H, block, w, dtype=torch.float32, device=dev)
           for w in (bk, bk, 2, bk, 4)]  # fmt: skip
    last = (torch.empty(B * NB, H, dk, dk, dtype=torch.float32, device=dev),
            torch.empty(B * NB, H, dk, dtype=torch.float32, device=dev))  # fmt: skip
    tf.kernels.vla_gate_kernel[(B * NB * H,)](
        q_ptr=fold[0], k_ptr=fold[1], u_ptr=fold[2], kh_ptr=out[0], ah_ptr=out[1],
        sc_ptr=out[2], sv_ptr=out[3], cs_ptr=out[4], a0_ptr=a0, z0_ptr=z0, aT_ptr=last[0],
        zT_ptr=last[1], p_ptr=tf._params(config, torch.float32, dev), T=block, H=H, DK=dk,
        nudge_period=period, start=0, t_begin=0, n_steps=block, a_stride=dk, fold_m=NB,
        fold_len=block, BK=bk, NORM_GATE=config.normalize_gate, ACC=tf.tl.float32,
        DOWNDATE=int(tf.DOWNDATES["fma"]), SPLIT=tf._split(plan, bk, loads_tile=True),
        NUDGE=int(tf._nudge(plan, forward=False)), LOAD_PLAIN=plan.load_plain,
        PERIOD_LOOP=plan.period_loop, num_warps=plan.gate_warps,
    )  # fmt: skip
    # [NB·B·H, block, bk] in fold order (b₀·NB + j, h) -> [B·H, T, bk]
    ah = out[1].reshape(B, NB, H, block, bk).transpose(1, 2).reshape(B * H, T, bk)
    if not ends:
        return ah
    if NB == 1:
        return ah, 0.0
    end = last[0].reshape(B, NB, H, dk, dk)[:, :-1].double()
    nxt = a0.reshape(B, NB, H, dk, dk)[:, 1:].double()
    scale = nxt.abs().amax(dim=(-2, -1), keepdim=True)
    return ah, float(((end - nxt).abs() / scale).max())


def chunked_gates(q: Any, k: Any, v: Any, u: Any, config: Any, block: int) -> Any:
    """``α̂`` ``[B·H, T, BKS]`` float32 of the chunked forward's float64 chain at ``block``."""
    from vla_verify.backends import triton_chunked as tc

    _, _, saved = tc._forward(q, k, v, u, config, None, 0, 64, tc.DEFAULT_PENALTY_CHUNK, block,
                              "ieee", "float64", 0, save_checkpoints=True)  # fmt: skip
    assert saved is not None
    return saved[1][1]


def _device_ms(fn: Any, kernel: str) -> float:
    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            fn()
        torch.cuda.synchronize()
    return sum(e.device_time_total for e in prof.key_averages() if e.key == kernel) / 5 / 1000


def main() -> None:
    import torch

    from vla_verify import VLAConfig
    from vla_verify.backends import triton_chunked as tc
    from vla_verify.bench import _inputs, machine_info, time_ms

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--sizes", nargs="+", default=["64x16384", "128x16384"])
    ap.add_argument("--blocks", nargs="+", type=int, default=[16, 32, 64])
    ap.add_argument("--smoke", action="store_true")
    a = ap.parse_args()
    cfg = VLAConfig()
    dev, dt, H = ("cpu", torch.float32, 2) if a.smoke else ("cuda", torch.bfloat16, 16)
    sizes = ["16x96"] if a.smoke else a.sizes
    blocks = [1, 3] if a.smoke else a.blocks
    res: dict[str, Any] = {"machine": machine_info(), "rows": []}
    for size in sizes:
        D, T = (int(s) for s in size.split("x"))
        x = _inputs(1, T, H, D, dt, dev)
        qkvu = tuple(x[n] for n in "qkvu")
        q, k, v, u = qkvu
        for nb in blocks:
            block = T // nb
            if block % tc.DEFAULT_PENALTY_CHUNK or block * nb != T:
                continue
            row: dict[str, Any] = {"D": D, "T": T, "blocks": nb, "block_tokens": block}
            ref = chunked_gates(q, k, v, u, cfg, block)
            got, row["block_end_relative_difference"] = block_gates(q, k, u, cfg, block, True)
            w = min(ref.shape[-1], got.shape[-1])
            diff = (got[..., :w] - ref[..., :w]).abs().max() / ref[..., :w].abs().max()
            row["gates_relative_difference"] = float(diff)
            if not a.smoke:

                def gates(block: int = block, x: tuple[Any, ...] = qkvu) -> Any:
                    return block_gates(x[0], x[1], x[3], cfg, block)

                def chain(block: int = block, x: tuple[Any, ...] = qkvu) -> Any:
                    return tc.chunked_vla(*x, config=cfg, penalty_block=block)[0]

                row["gate_kernel_ms"] = _device_ms(gates, "vla_gate_kernel")
                row["penalty_chain_kernel_ms"] = _device_ms(chain, "penalty_chain_kernel")
                row["block_gates_median_ms"] = time_ms(gates)
                row["chunked_forward_median_ms"] = time_ms(chain)
            res["rows"].append(row)
            print(json.dumps(row), flush=True)
            a.out.parent.mkdir(parents=True, exist_ok=True)
            a.out.write_text(json.dumps(res, indent=1))
        del x, qkvu, q, k, v, u
        if not a.smoke:
            torch.cuda.empty_cache()
    assert all(math.isfinite(r["gates_relative_difference"]) for r in res["rows"])


if __name__ == "__main__":
    main()
