"""The penalty chain's products-only block starts with the blocks' matrices in float32, for their
precision (not a backend; ``docs/design/triton_chunked.md``, "The floor", further way 6).

``triton_chunked`` starts each block of its penalty chain from ``A = Π Θ^{-1}``, where
``(Π; Θ)`` comes from applying the earlier blocks' ``2dk × 2dk`` matrices to ``(A_0; I)`` one
after the other (:func:`~vla_verify.backends.triton_chunked.penalty_block_starts` with
``normalise=False``), all in float64, and checks each start against the chain's block end to
``BLOCK_START_RTOL``.  For 16-bit inputs float32 matrices would run on tensor cores (tf32x3)
instead of the float64 ones, if the starts stayed accurate enough for the check to pass.  This
module measures that in NumPy: the blocks' matrices formed as the kernel forms them (a piece of
tokens between nudges ``Θ ← Θ + Uᵀ(U Π)``, a nudge ``Π ← Π + ηΘ``), applied block after block,
one solve per start, every operation in float64 or in float32; each start is compared with the
float64 recurrence of spec §2.3 run token by token (largest entry difference over the start's
largest entry, the check's measure).

Penalties: the layer's (``‖u‖² = 1/dk``) in random directions, in one direction and in four;
strong Gaussian ones; the strategies' concentrated ones (magnitudes to 10^2.5).  A planted
fault, the matrices without their nudges, must give starts far off.

``python benchmarks/prototypes/float32_block_starts.py OUT.json`` writes the table for the
forward's block lengths at D = 64 and 128, T = 4096 to 65536 (paper preset, one head, seed 0).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import block_start_spans as spans  # the layer's penalties, as the shipped constant's study

#: (T, dk, tokens per block): the forward's default blocks at B·H = 16.
SETTINGS = ((4096, 64, 256), (16384, 64, 512), (16384, 128, 2048), (65536, 64, 2048),
            (65536, 128, 8192))  # fmt: skip
PENALTIES = ("layer", "layer_one_direction", "layer_four_directions", "gaussian", "concentrated")


def penalties(kind: str, T: int, dk: int, rng: np.random.Generator) -> np.ndarray:
    """``u`` ``[T, dk]`` float64 of the named kind (module docstring)."""
    if kind == "layer":
        return spans.layer_penalties(T, dk, rng=rng)[0].numpy()
    if kind == "layer_one_direction":
        return np.tile(np.eye(dk)[0] / np.sqrt(dk), (T, 1))
    if kind == "layer_four_directions":
        return np.eye(dk)[rng.integers(0, 4, T)] / np.sqrt(dk)
    if kind == "gaussian":
        return rng.standard_normal((T, dk))
    if kind == "concentrated":
        magnitude = 10.0 ** rng.uniform(-1, 2.5, T)
        return np.eye(dk)[rng.integers(0, 2, T)] * magnitude[:, None]
    raise ValueError(f"unknown penalties {kind!r}")


def block_matrices(
    u: np.ndarray, *, period: int, eta: float, block: int, dtype: type, nudges: bool = True
) -> list[np.ndarray]:
    """Every block's matrix but the last's (no start follows it), ``[2dk, 2dk]`` in ``dtype``,
    walked as ``penalty_block_matrix_kernel`` walks it (clock at 0).  ``nudges=False`` plants
    the fault of leaving the nudges out."""
    T, dk = u.shape
    out = []
    for t0 in range(0, T - block, block):
        Pi = np.eye(dk, 2 * dk, dtype=dtype)
        Th = np.eye(dk, 2 * dk, k=dk, dtype=dtype)
        t, t_end = t0, min(T, t0 + block)
        while t < t_end:
            nudge_at = t + (period - t % period)  # a nudge follows token nudge_at - 1
            e = min(nudge_at, t_end)
            U = u[t:e].astype(dtype)
            Th = Th + U.T @ (U @ Pi)
            if e == nudge_at and nudges:
                Pi = Pi + dtype(eta) * Th
            t = e
        out.append(np.vstack([Pi, Th]))
    return out


def products_only_starts(matrices: list[np.ndarray], A0: np.ndarray, dtype: type) -> list:
    """``A`` at every block's start after the first: the matrices applied to ``(A_0; I)`` one
    after the other in ``dtype``, each ``Π Θ^{-1}`` by one solve in ``dtype``."""
    dk = A0.shape[0]
    x = np.vstack([A0, np.eye(dk)]).astype(dtype)
    starts = []
    for m in matrices:
        x = m @ x
        with np.errstate(all="ignore"):
            starts.append(np.linalg.solve(x[dk:].T, x[:dk].T).T.astype(np.float64))
    return starts


def recurrence_starts(u: np.ndarray, A0: np.ndarray, *, period: int, eta: float, block: int
                      ) -> list[np.ndarray]:  # fmt: skip
    """``A`` at every block's start after the first by spec §2.3's steps in float64."""
    A = A0.copy()
    starts = []
    for t in range(u.shape[0] - 1):
        s = A @ u[t]
        A = A - np.outer(s, s) / max(1.0 + u[t] @ s, 1e-4)
        if (t + 1) % period == 0:
            A = A + eta * np.eye(A.shape[0])
        if (t + 1) % block == 0:
            starts.append(A.copy())
    return starts


def start_error(got: list[np.ndarray], ref: list[np.ndarray]) -> float:
    """The largest ``max|got − ref| / max|ref|`` over the starts (inf where one is not finite)."""
    worst = 0.0
    for g, r in zip(got, ref, strict=True):
        if not np.isfinite(g).all():
            return float("inf")
        worst = max(worst, float(np.abs(g - r).max() / np.abs(r).max()))
    return worst


def study(T: int, dk: int, block: int, kind: str, seed: int = 0) -> dict[str, Any]:
    """One row: the starts' error with float64 and float32 matrices, and the planted fault's."""
    rng = np.random.default_rng(seed)
    u = penalties(kind, T, dk, rng)
    A0 = np.eye(dk) / 0.1
    walk = dict(period=20, eta=1e-3, block=block)
    ref = recurrence_starts(u, A0, **walk)
    row: dict[str, Any] = {"T": T, "dk": dk, "block": block, "penalties": kind}
    with np.errstate(all="ignore"):
        for name, dtype in (("float64", np.float64), ("float32", np.float32)):
            starts = products_only_starts(block_matrices(u, dtype=dtype, **walk), A0, dtype)
            row[name] = start_error(starts, ref)
        planted = block_matrices(u, dtype=np.float64, nudges=False, **walk)
        row["planted_no_nudges"] = start_error(products_only_starts(planted, A0, np.float64),
                                               ref)  # fmt: skip
    return row


def main(path: str) -> None:
    t0 = time.perf_counter()
    rows = []
    for T, dk, block in SETTINGS:
        for kind in PENALTIES:
            rows.append(study(T, dk, block, kind))
            print(json.dumps(rows[-1]), flush=True)
    out = {"command": "python benchmarks/prototypes/float32_block_starts.py OUT.json",
           "settings": {"preset": "paper", "heads": 1, "seed": 0}, "rows": rows,
           "seconds": round(time.perf_counter() - t0, 1)}  # fmt: skip
    with open(path, "w") as f:
        json.dump(out, f, indent=1, allow_nan=True)
        f.write("\n")


if __name__ == "__main__":
    main(sys.argv[1])
