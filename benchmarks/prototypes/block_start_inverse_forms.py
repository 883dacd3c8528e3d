"""The block starts ``A = Π Θ^{-1}`` of the penalty chain by forms without pivoting, for their
precision (not a backend; ``docs/design/triton_chunked.md``, "The floor").

``triton_chunked`` solves the float64 chain's block starts by cuBLAS's batched LU with
partial pivoting and two triangular solves
(:func:`~vla_verify.backends.triton_chunked._solve_block_starts`), and the float32 chain's by
the Cholesky form below.  The LU for both took 0.27 ms of the bf16 forward's 1.63 ms of device
time at D = 64, T = 16384 and 0.65 of 4.57 at D = 128 on an H100
(``benchmarks/results/h100/chunk_09c787e.json``'s breakdown).  Two forms need no pivot search,
if ``Θ`` allows them:

- **Cholesky.** ``A`` is symmetric, so ``Πᵀ Θ = Θᵀ Π`` and ``S = Θᵀ Π = Θᵀ A Θ`` is symmetric
  positive definite, and ``A = Π S^{-1} Πᵀ``: with ``S = L Lᵀ`` and ``W = Π L^{-T}`` (one
  triangular solve), ``A = W Wᵀ``, symmetric by construction.  Forming ``S`` squares ``Θ``'s
  condition number in its rounding.
- **Newton–Schulz.** ``X ← X + X (I − Θ X)`` from ``X_0 = Θᵀ / (‖Θ‖₁ ‖Θ‖_∞)`` converges to
  ``Θ^{-1}`` quadratically once ``‖I − Θ X‖ < 1``, after about ``log₂(κ(Θ)²)`` steps of two
  matrix products each: tensor-core work with no dependent reductions, where an elimination
  takes ``dk`` dependent pivots, but ``2dk³`` multiply-adds a step where LU takes ``dk³/3``
  in all.  Its step count is read here until ``max|I − Θ X| ≤ 1e-8`` (``1e-4`` in float32),
  then one step more (quadratic convergence takes that to rounding).

Each start is compared with spec §2.3's recurrence run token by token in float64 (largest entry
difference over the start's largest entry, the block-end check's measure), with ``(Π; Θ)``
applied as the backend applies it: in spans of ``512·dk`` tokens
(``PRODUCTS_ONLY_SPAN_PER_KEY``), each from its first start solved by the same form.  Also
recorded: ``κ₂(Θ)`` at the starts (largest), and the forms in float32 (for the float32 chain
of the bf16 inference forward, whose check allows ``block · 2^-24``).

``python benchmarks/prototypes/block_start_inverse_forms.py OUT.json`` writes the table for the
forward's block lengths at D = 64 and 128 (paper preset, one head, seed 0) on the penalties of
``float32_block_starts.py``.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import float32_block_starts as f32  # the penalties, the blocks' matrices, the recurrence

#: (T, dk, tokens per block): the bf16 forward's blocks on an H100 at B·H = 16.
SETTINGS = ((4096, 64, 256), (16384, 64, 512), (65536, 64, 2048), (16384, 128, 1024),
            (65536, 128, 4096))  # fmt: skip
#: Tokens per unit of key width in one span of products (the backend's constant).
SPAN_PER_KEY = 512
#: Newton–Schulz stops once ``max|I − Θ X| ≤`` this (per dtype), after one more step; or after
#: :data:`MAX_STEPS` steps.
NEWTON_SCHULZ_RESIDUAL = {np.dtype(np.float64): 1e-8, np.dtype(np.float32): 1e-4}
MAX_STEPS = 64


def solve_lu(Pi: np.ndarray, Th: np.ndarray) -> tuple[np.ndarray, int]:
    """``Π Θ^{-1}`` by LU with partial pivoting (the backend's form), symmetrised."""
    A = np.linalg.solve(Th.T, Pi.T).T
    return 0.5 * (A + A.T), 0


def solve_cholesky(Pi: np.ndarray, Th: np.ndarray) -> tuple[np.ndarray, int]:
    """``Π (Θᵀ Π)^{-1} Πᵀ`` by a Cholesky factor of ``S = Θᵀ Π`` and one triangular solve."""
    S = Th.T @ Pi
    L = np.linalg.cholesky(0.5 * (S + S.T))
    W = np.linalg.solve(L, Pi.T).T  # Π L^{-T}
    return W @ W.T, 0


def solve_newton_schulz(Pi: np.ndarray, Th: np.ndarray) -> tuple[np.ndarray, int]:
    """``Π X``, ``X → Θ^{-1}`` by Newton–Schulz steps (module docstring); the steps taken."""
    dk = Th.shape[0]
    eye = np.eye(dk, dtype=Th.dtype)
    X = Th.T / (np.abs(Th).sum(axis=0).max() * np.abs(Th).sum(axis=1).max())
    steps, converged = 0, False
    while steps < MAX_STEPS:
        R = eye - Th @ X
        steps += 1
        X = X + X @ R
        if converged:
            break
        converged = bool(np.abs(R).max() <= NEWTON_SCHULZ_RESIDUAL[Th.dtype])
    A = Pi @ X
    return 0.5 * (A + A.T), steps


FORMS: dict[str, Callable[[np.ndarray, np.ndarray], tuple[np.ndarray, int]]] = {
    "lu": solve_lu,
    "cholesky": solve_cholesky,
    "newton_schulz": solve_newton_schulz,
}


def starts_by(form: str, matrices: list[np.ndarray], A0: np.ndarray, dk: int, block: int,
              dtype: type) -> tuple[list[np.ndarray], int, float]:  # fmt: skip
    """Every block start after the first, the blocks' matrices applied in spans of
    ``SPAN_PER_KEY · dk`` tokens as the backend applies them, each start solved by ``form`` in
    ``dtype``; the largest step count and the largest ``κ₂(Θ)``."""
    solve = FORMS[form]
    per_span = max(1, SPAN_PER_KEY * dk // block)
    x = np.vstack([A0, np.eye(dk)]).astype(dtype)
    starts, most_steps, worst_cond = [], 0, 1.0
    for b, m in enumerate(matrices):
        if b > 0 and b % per_span == 0:  # a new span from its first start, solved
            x = np.vstack([starts[-1], np.eye(dk)]).astype(dtype)
        x = m.astype(dtype) @ x
        with np.errstate(all="ignore"):
            A, steps = solve(x[:dk], x[dk:])
        starts.append(A.astype(np.float64))
        most_steps = max(most_steps, steps)
        theta = x[dk:].astype(np.float64)
        cond = float(np.linalg.cond(theta)) if np.isfinite(theta).all() else float("inf")
        worst_cond = max(worst_cond, cond)
    return starts, most_steps, worst_cond


def study(T: int, dk: int, block: int, kind: str, seed: int = 0) -> dict[str, Any]:
    """One row: each form's error against the recurrence, in float64 and float32, with the
    Newton–Schulz steps, the largest ``κ₂(Θ)`` and the float32 chain's tolerance."""
    rng = np.random.default_rng(seed)
    u = f32.penalties(kind, T, dk, rng)
    A0 = np.eye(dk) / 0.1
    walk = dict(period=20, eta=1e-3, block=block)
    ref = f32.recurrence_starts(u, A0, **walk)
    matrices = f32.block_matrices(u, dtype=np.float64, **walk)
    row: dict[str, Any] = {"T": T, "dk": dk, "block": block, "penalties": kind,
                           "float32_chain_tolerance": block * 2.0**-24}  # fmt: skip
    for form in FORMS:
        for name, dtype in (("float64", np.float64), ("float32", np.float32)):
            try:
                starts, steps, cond = starts_by(form, matrices, A0, dk, block, dtype)
                row[f"{form}_{name}"] = f32.start_error(starts, ref)
            except np.linalg.LinAlgError as exc:  # a Cholesky factor that does not exist
                row[f"{form}_{name}"] = f"fails: {exc}"
                continue
            if form == "newton_schulz":
                row[f"newton_schulz_{name}_steps"] = steps
            if form == "lu" and name == "float64":
                row["theta_condition"] = cond
    return row


def main(path: str) -> None:
    t0 = time.perf_counter()
    rows = []
    for T, dk, block in SETTINGS:
        for kind in f32.PENALTIES:
            rows.append(study(T, dk, block, kind))
            print(json.dumps(rows[-1]), flush=True)
    out = {"command": "python benchmarks/prototypes/block_start_inverse_forms.py OUT.json",
           "settings": {"preset": "paper", "heads": 1, "seed": 0,
                        "newton_schulz_residual": {str(k): v for k, v in
                                                   NEWTON_SCHULZ_RESIDUAL.items()}},
           "rows": rows, "seconds": round(time.perf_counter() - t0, 1)}  # fmt: skip
    with open(path, "w") as f:
        json.dump(out, f, indent=1, allow_nan=True)
        f.write("\n")


if __name__ == "__main__":
    main(sys.argv[1])
