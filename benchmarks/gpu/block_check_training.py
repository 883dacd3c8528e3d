"""Why the chunked forward's block-start check fails in training on the H200.

In ``chunk_d128.json`` (D = 128, bf16, T = 4096 to 65536) every forward + backward call of
``triton_chunked`` counted a block-start fallback (the penalty chain again in one block), and no
forward-only call did; under Triton's interpreter neither does (D = 16 to 128, T to 4096). The
training forward differs from the inference one only in what it stores for the backward
(``save_checkpoints``: the penalty kernel's ``SAVE_CKPT``/``SAVE_CHAIN``, the read-out's
``SAVE_CHAIN``). This script runs ``_forward`` both ways, with each of the penalty chain's
factorisations (``PENALTY_FACTORISATIONS``), and reports per case the fallbacks, and with the check
switched off the final ``A`` of the blocked chain against the one-block chain's and training's
against inference's: a training chain whose blocked end departs from the one-block end while
inference's does not puts the fault in the stores of the training kernels. Then
(``kernel_variants``) the training forward's penalty kernel again with each combination of its
stores and factorisation, from the same block starts: which one changes the block ends. Usage::

    python benchmarks/gpu/block_check_training.py --out DIR [--D 64 128] [--T 4096] [--block N]
        [--commit SHA]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--D", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--T", type=int, default=4096)
    ap.add_argument("--H", type=int, default=16)
    ap.add_argument("--block", type=int, default=None, help="penalty_block (default: the plan's)")
    ap.add_argument("--commit", default=None, help="the commit measured (a copy without git)")
    a = ap.parse_args()
    import torch

    from vla_verify import VLAConfig
    from vla_verify.backends import triton_chunked as tc
    from vla_verify.bench import machine_info

    gpu = torch.cuda.is_available()
    dev, dt = ("cuda", torch.bfloat16) if gpu else ("cpu", torch.float32)
    cfg = VLAConfig()
    rows: list[dict[str, Any]] = []
    rtol, factorisation = tc.BLOCK_START_RTOL, tc.PENALTY_FACTORISATION

    def forward(x: list[Any], save: bool, block: int | None = a.block) -> tuple[Any, Any]:
        o, (_, A, _), _ = tc._forward(*x, cfg, None, 0, 64, 16, block, "ieee", "float64", 0,
                                      save_checkpoints=save)  # fmt: skip
        return o.float(), A.double()

    def rel(a: Any, b: Any) -> float:
        return float((a - b).abs().max() / b.abs().max())

    for D in a.D:
        x = grid_inputs(a.T, a.H, D, dev, dt)
        one = forward(x, False, 16 * -(-a.T // 16))[1]
        for factorisation_case in tc.PENALTY_FACTORISATIONS:
            tc.PENALTY_FACTORISATION = factorisation_case
            got = {}
            for save in (False, True):
                before = tc.BLOCK_START_FALLBACKS[0]
                forward(x, save)
                fallbacks = tc.BLOCK_START_FALLBACKS[0] - before
                tc.BLOCK_START_RTOL = float("inf")  # the first pass's result, unchecked
                try:
                    got[save] = forward(x, save)
                finally:
                    tc.BLOCK_START_RTOL = rtol
                blocks = -(
                    -a.T // tc.penalty_block_length(a.T, 16, a.block, dk=D, heads=a.H, device=dev)
                )
                row = {"D": D, "T": a.T, "factorisation": factorisation_case,
                       "save_checkpoints": save,
                       "blocks": blocks, "fallbacks": fallbacks,
                       "A_unchecked_vs_one_block": rel(got[save][1], one)}  # fmt: skip
                rows.append(row)
                print(row, flush=True)
            row = {"D": D, "T": a.T, "factorisation": factorisation_case,
                   "training_vs_inference_A": rel(got[True][1], got[False][1]),
                   "training_vs_inference_o": rel(got[True][0], got[False][0])}  # fmt: skip
            rows.append(row)
            print(row, flush=True)
        tc.PENALTY_FACTORISATION = factorisation
    rows += kernel_variants(a, dev, dt)
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "block_check_training.json").write_text(
        json.dumps({"machine": {**machine_info(), "commit": a.commit}, "rows": rows}, indent=1)
    )


def grid_inputs(T: int, H: int, D: int, dev: str, dt: Any) -> list[Any]:
    """``q, k, v, u`` as the grid of ``chunk_h200.py`` draws them (``vla_verify.bench._inputs``,
    seed 0), where the failing calls ran."""
    from vla_verify.bench import _inputs

    x = _inputs(1, T, H, D, dt, dev)
    return [x[n] for n in "qkvu"]


def kernel_variants(a: Any, dev: str, dt: Any) -> list[dict[str, Any]]:
    """The first pass's penalty kernel of one training forward, launched again from the same
    block starts with each combination of its stores (``SAVE_CKPT``, ``SAVE_CHAIN``) and
    elimination: each variant's block ends ``X`` against the variant with no stores and the
    same elimination (the stores write other buffers only, so any difference is a fault), and
    against a second launch of the same variant (a race inside a program differs between
    launches)."""

    from vla_verify import VLAConfig
    from vla_verify.backends import triton_chunked as tc

    real = tc.kernels.penalty_chain_kernel
    rows: list[dict[str, Any]] = []

    class Variants:
        def __getitem__(self, grid: Any) -> Any:
            def launch(*args: Any, **kwargs: Any) -> None:
                if kwargs.get("COND") or not kwargs.get("SAVE_CHAIN"):
                    real[grid](*args, **kwargs)
                    return
                x_in = args[2].clone()
                ends: dict[tuple[bool, bool, bool], list[Any]] = {}
                for elim in range(len(tc.PENALTY_FACTORISATIONS)):
                    for ckpt in (False, True):
                        for chain in (False, True):
                            # Twice: a race inside a program shows as two different ends.
                            for _ in range(2):
                                x = x_in.clone()
                                real[grid](*args[:2], x, *args[3:], **{**kwargs,
                                           "SAVE_CKPT": ckpt, "SAVE_CHAIN": chain,
                                           "ELIMINATE": elim})  # fmt: skip
                                ends.setdefault((elim, ckpt, chain), []).append(x)
                for (elim, ckpt, chain), (x, again) in ends.items():
                    ref = ends[(elim, False, False)][0]
                    scale = ref.abs().max()
                    rows.append({"D": kwargs["DK"],
                                 "factorisation": tc.PENALTY_FACTORISATIONS[elim],
                                 "SAVE_CKPT": ckpt, "SAVE_CHAIN": chain,
                                 "X_vs_no_stores": float((x - ref).abs().max() / scale),
                                 "X_run_vs_rerun": float((x - again).abs().max() / scale),
                                 "X_finite": bool(x.isfinite().all())})  # fmt: skip
                    print(rows[-1], flush=True)
                real[grid](*args, **kwargs)

            return launch

    tc.kernels.penalty_chain_kernel = Variants()
    try:
        for D in a.D:
            x = grid_inputs(a.T, a.H, D, dev, dt)
            tc._forward(*x, VLAConfig(), None, 0, 64, 16, a.block, "ieee", "float64", 0,
                        save_checkpoints=True)  # fmt: skip
    finally:
        tc.kernels.penalty_chain_kernel = real
    return rows


if __name__ == "__main__":
    main()
