"""The chunked kernel's penalty chain in float64 and float32, against the float64 oracle.

The precision of the Woodbury/LDLᵀ penalty chain of ``triton_chunked`` is a design decision to
measure (``docs/design/triton_chunked.md``, "Precision of the penalty chain"): for each penalty
regime of :mod:`vla_verify.properties.strategies`, the spec §4 ratio error / budget of ``o``,
``S`` (and ``A`` for float32 inputs) with ``penalty_dtype`` float64 and float32.  The budget is
that of the inputs' precision: for float32 inputs the float32 oracle's error (chunked floor
``terms = dk + C``), for bf16 inputs the bf16 oracle's (three runs that round differently, as
:func:`vla_verify.validate` takes them), where the state side keeps bf16 intermediates.  A
ratio of ``inf`` is an example without a budget (the oracle run in bf16 is not finite there).
Runs on a GPU, or on the CPU under ``TRITON_INTERPRET=1`` (bf16 conversions rounded to nearest,
as the GPU rounds them).

Usage::

    TRITON_INTERPRET=1 python benchmarks/gpu/chunk_penalty_precision.py OUT.json
        [--dtype float32|bfloat16] [--T 96] [--penalty-block N]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def main() -> None:
    import numpy as np
    import torch

    from vla_verify import VLAConfig
    from vla_verify.backends.numpy_oracle import recurrence
    from vla_verify.backends.triton_chunked import chunked_vla
    from vla_verify.bench import machine_info
    from vla_verify.error_model import compare
    from vla_verify.properties.strategies import make_penalties
    from vla_verify.runtime import round_interpreter_bf16_to_nearest
    from vla_verify.validation import same_precision_runs

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    ap.add_argument("--T", type=int, default=96)
    ap.add_argument(
        "--penalty-block",
        type=int,
        default=None,
        help="tokens per block of the penalty chain (default: the backend's)",
    )
    a = ap.parse_args()
    round_interpreter_bf16_to_nearest()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    B, T, H, dk, C = 1, a.T, 4, 16, 32
    cfg = VLAConfig()
    out: dict = {"machine": machine_info(), "shape": [B, T, H, dk], "chunk_size": C,
                 "dtype": a.dtype, "penalty_block": a.penalty_block, "ratios": {}}  # fmt: skip
    for regime in ("concentrated", "gaussian", "layer"):
        for seed in range(3):
            rng = np.random.default_rng(seed)
            k_raw = rng.standard_normal((B, T, H, dk))
            u = make_penalties(rng, regime, (B, T, H, dk), k_raw)
            q = np.exp(0.5 * rng.standard_normal((B, T, H, dk)))
            k = np.exp(0.5 * k_raw)
            v = rng.standard_normal((B, T, H, dk))
            dt = getattr(torch, a.dtype)
            t = [torch.tensor(x, dtype=dt, device=device) for x in (q, k, v, u)]
            seen = [x.double().cpu().numpy() for x in t]
            ref = recurrence(*seen, config=cfg)
            if a.dtype == "float32":
                base = [recurrence(*seen, config=cfg, dtype="float32")]
                keys = ("o", "S", "A")
            else:
                base = same_precision_runs(seen, None, config=cfg, variant="vla",
                                           dtype=a.dtype, samples=3)  # fmt: skip
                keys = ("o", "S")
            for pd in ("float64", "float32"):
                o, st = chunked_vla(*t, config=cfg, penalty_dtype=pd, chunk_size=C,
                                    penalty_block=a.penalty_block)  # fmt: skip
                got = {"o": o, "S": st[0], "A": st[1]}
                want = {"o": ref.o, "S": ref.state[0], "A": ref.state[1]}
                ratios = {}
                for key in keys:
                    bb = [r.o if key == "o" else r.state["SA".index(key)] for r in base]
                    scale = np.full((B, H), 1 / cfg.lambda0) if key == "A" else None
                    c = compare(key, got[key].double().cpu().numpy(), want[key], bb, a.dtype,
                                terms=dk + C, scale=scale)  # fmt: skip
                    ratios[key] = round(float(c.ratio), 4)
                out["ratios"][f"{regime}_seed{seed}_{pd}"] = ratios
                print(regime, seed, pd, ratios, flush=True)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
