"""The float32 accuracy of the penalty adjoint in pieces against the per-token adjoint, on the
CPU under Triton's interpreter: the evidence for ``PIECES_MAX_DENOMINATOR`` in
``vla_verify/backends/triton_fused.py``.

From the zero state (``S_0 = 0``, ``A_0 = I/lambda0``, ``z_0 = 0``; paper preset, B = 1,
T = 64, H = 2, dk = 16, dv = 8, checkpoints every 32 tokens), penalties along two axes, either
of one magnitude ``m`` or of mixed magnitudes ``10^U(-1, top)``: the worst ratio of error to the
spec §4 budget over the seven gradients (:func:`vla_verify.gradient_check.check_gradients`) for
the per-token adjoint and for the pieces with the denominator limit lifted, beside the largest
``δ = 1 + uᵀA_0 u``; ``--groups m …`` adds the pieces with their scan in groups of ``m``
(``RecurrentPlan.penalty_scan_group``).  Usage::

    TRITON_INTERPRET=1 python benchmarks/pieces_accuracy.py \
        --json benchmarks/results/cpu/pieces_accuracy.json [--groups 2 4]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

B, T, H, DK, DV, CK = 1, 64, 2, 16, 8, 32


def example(kind: str, size: float, seed: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """``kind`` ``"fixed"`` (magnitude ``size``) or ``"mixed"`` (``10^U(-1, size)``)."""
    from vla_verify import VLAConfig

    rng = np.random.default_rng(seed)
    lam = VLAConfig().lambda0
    axes = rng.integers(0, 2, size=(B, T, H))
    if kind == "fixed":
        magnitude = np.full((B, T, H), size)
    else:
        magnitude = 10.0 ** rng.uniform(-1, size, size=(B, T, H))
    arrays = [
        np.abs(rng.standard_normal((B, T, H, DK))) + 0.1,
        np.exp(0.5 * rng.standard_normal((B, T, H, DK))),
        rng.standard_normal((B, T, H, DV)),
        np.eye(DK)[axes] * magnitude[..., None],
        np.zeros((B, H, DV, DK)),
        np.broadcast_to(np.eye(DK) / lam, (B, H, DK, DK)).copy(),
        np.zeros((B, H, DK)),
    ]
    cotangents = [rng.standard_normal(a.shape) for a in (arrays[2], *arrays[4:])]
    return arrays, cotangents


def worst(
    pieces: bool, arrays: list[np.ndarray], cotangents: list[np.ndarray], group: int = 1
) -> list[Any]:
    from vla_verify import VLAConfig, backends
    from vla_verify.backends import triton_fused as tf
    from vla_verify.gradient_check import check_gradients

    def kernel(q: Any, k: Any, v: Any, u: Any, **kw: Any) -> Any:
        base = tf.plan_for(B, H, T, DK, DV, q.dtype, q.device, True)
        plan = dataclasses.replace(base, chunked_penalty_adjoint=pieces, penalty_scan_group=group)
        return tf.fused_recurrent_vla(q, k, v, u, **kw, checkpoint_every=CK, plan=plan)

    limit = tf.PIECES_MAX_DENOMINATOR
    tf.PIECES_MAX_DENOMINATOR = float("inf")
    try:
        checks = check_gradients(kernel, backends.get("torch"), arrays, cotangents,
                                 config=VLAConfig(), dtype="float32")  # fmt: skip
    finally:
        tf.PIECES_MAX_DENOMINATOR = limit
    name, c = max(checks.items(), key=lambda x: x[1].ratio)
    return [name, round(c.ratio, 3)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--groups", nargs="*", type=int, default=[], metavar="M")
    a = ap.parse_args()
    # Before Triton is first imported (the kernels run on the CPU); not at import, so that a
    # test drawing this module's cases leaves the environment as it found it.
    os.environ.setdefault("TRITON_INTERPRET", "1")
    from vla_verify import VLAConfig

    lam = VLAConfig().lambda0
    cases = [("fixed", m, 0) for m in (0.3, 1.0, 3.0, 10.0, 30.0)]
    cases += [("mixed", top, s) for top in (0.5, 1.0, 1.5, 2.0) for s in range(3)]
    rows = []
    t0 = time.time()
    for kind, size, seed in cases:
        arrays, cot = example(kind, size, seed)
        delta = 1.0 + float((arrays[3] ** 2).sum(-1).max()) / lam
        row = {"kind": kind, "size": size, "seed": seed, "max_delta": round(delta, 1),
               "per_token": worst(False, arrays, cot),
               "pieces": worst(True, arrays, cot)}  # fmt: skip
        for m in a.groups:
            row[f"pieces_group{m}"] = worst(True, arrays, cot, m)
        rows.append(row)
        print(json.dumps(row), flush=True)
    if a.json:
        import triton

        command = "TRITON_INTERPRET=1 python benchmarks/pieces_accuracy.py"
        if a.groups:
            command += " --groups " + " ".join(map(str, a.groups))
        head = {"command": command,
                "triton": triton.__version__, "seconds": round(time.time() - t0, 1),
                "columns": "worst gradient, its error / spec §4 budget (<= 1 passes)"}  # fmt: skip
        a.json.write_text(json.dumps({**head, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
