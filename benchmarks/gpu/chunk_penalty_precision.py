"""The chunked kernel's penalty chain in float64 and float32, against the float64 oracle.

The precision of the Woodbury/LDLᵀ penalty chain of ``triton_chunked`` is a design decision to
measure (``docs/design/triton_chunked.md``, "Precision of the penalty chain"): for each penalty
regime of :mod:`vla_verify.properties.strategies`, the spec §4 ratio error / budget of ``o``,
``S`` and ``A`` (float32 inputs, chunked floor ``terms = dk + C``) with ``penalty_dtype``
float64 and float32.  Runs on a GPU, or on the CPU under ``TRITON_INTERPRET=1``.

Usage: ``TRITON_INTERPRET=1 python benchmarks/gpu/chunk_penalty_precision.py OUT.json``
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def main(path: str) -> None:
    import numpy as np
    import torch

    from vla_verify import VLAConfig
    from vla_verify.backends.numpy_oracle import recurrence
    from vla_verify.backends.triton_chunked import chunked_vla
    from vla_verify.bench import machine_info
    from vla_verify.error_model import compare
    from vla_verify.properties.strategies import make_penalties

    device = "cuda" if torch.cuda.is_available() else "cpu"
    B, T, H, dk, C = 1, 96, 4, 16, 32
    cfg = VLAConfig()
    out: dict = {"machine": machine_info(), "shape": [B, T, H, dk], "chunk_size": C, "ratios": {}}
    for regime in ("concentrated", "gaussian", "layer"):
        for seed in range(3):
            rng = np.random.default_rng(seed)
            k_raw = rng.standard_normal((B, T, H, dk))
            u = make_penalties(rng, regime, (B, T, H, dk), k_raw)
            q = np.exp(0.5 * rng.standard_normal((B, T, H, dk)))
            k = np.exp(0.5 * k_raw)
            v = rng.standard_normal((B, T, H, dk))
            t = [torch.tensor(a, dtype=torch.float32, device=device) for a in (q, k, v, u)]
            seen = [a.double().cpu().numpy() for a in t]
            ref = recurrence(*seen, config=cfg)
            base = recurrence(*seen, config=cfg, dtype="float32")
            for pd in ("float64", "float32"):
                o, st = chunked_vla(*t, config=cfg, penalty_dtype=pd, chunk_size=C)
                ratios = {}
                for key, got, r, b in (
                    ("o", o, ref.o, base.o),
                    ("S", st[0], ref.state[0], base.state[0]),
                    ("A", st[1], ref.state[1], base.state[1]),
                ):
                    scale = np.full((B, H), 1 / cfg.lambda0) if key == "A" else None
                    c = compare(
                        key, got.double().cpu().numpy(), r, b, "float32", terms=dk + C, scale=scale
                    )
                    ratios[key] = round(c.ratio, 4)
                out["ratios"][f"{regime}_seed{seed}_{pd}"] = ratios
                print(regime, seed, pd, ratios, flush=True)
    Path(path).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main(sys.argv[1])
