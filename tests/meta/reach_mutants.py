"""Planted bugs that live in a kernel's structure: chunk boundaries, tiling widths, the launch grid
and the configuration it reads.

``make(None)`` is a correct spec §2.3 implementation of ``vla``, vectorised over ``(B, H)`` and
written apart from the oracle (spec §4 independence); ``make(name)`` plants one bug that shows
only beyond the sizes a checker of small examples draws:

- ``loses_A_after_64``: at the start of its second chunk of 64 tokens the kernel reloads
  ``A = I/λ0`` (the penalty state is not carried across chunks);
- ``drops_S_after_128``: at token 128 the kernel restarts ``S`` from zero;
- ``gate_norm_first_16`` / ``gate_norm_first_32``: the gate's norm reduces over the first 16
  (32) key lanes only, one tile of a tiled reduction;
- ``clamps_batch`` / ``clamps_heads``: batch elements (heads) past the second read the second's
  inputs (a grid or pointer offset clamped at 2);
- ``masks_with_other_width``: key lanes are masked with the value width and value lanes with
  the key width (right only when ``dk == dv``);
- ``ignores_nudge_eta`` / ``ignores_sm_floor``: the field of ``VLAConfig`` is read as the
  paper preset's value (only a configuration sweep tells).
"""

from __future__ import annotations

from typing import Any

import numpy as np

STRUCTURE_MUTANTS = (
    "loses_A_after_64",
    "drops_S_after_128",
    "gate_norm_first_16",
    "gate_norm_first_32",
    "clamps_batch",
    "clamps_heads",
    "masks_with_other_width",
)
CONFIG_MUTANTS = ("ignores_nudge_eta", "ignores_sm_floor")


def make(mutant: str | None) -> Any:
    """The implementation with ``mutant`` planted (``None``: correct).  It takes ``start``."""
    if mutant is not None and mutant not in (*STRUCTURE_MUTANTS, *CONFIG_MUTANTS):
        raise ValueError(mutant)

    def fn(q, k, v, u, *, config, initial_state=None, start=0):
        dtype = q.dtype
        B, T, H, dk = q.shape
        dv = v.shape[-1]
        state = initial_state
        if mutant in ("clamps_batch", "clamps_heads"):
            axis = 0 if mutant == "clamps_batch" else 2
            n = (B, T, H)[axis]
            pick = np.minimum(np.arange(n), 1)
            q, k, v, u = (np.take(x, pick, axis=axis) for x in (q, k, v, u))
            if state is not None:
                state = tuple(np.take(x, pick, axis=axis // 2) for x in state)
        if mutant == "masks_with_other_width":
            key_lanes = (np.arange(dk) < dv).astype(dtype)
            value_lanes = (np.arange(dv) < dk).astype(dtype)
            q, k, u = q * key_lanes, k * key_lanes, u * key_lanes
            v = v * value_lanes
        lam = config.lambda0
        eta = 1e-3 if mutant == "ignores_nudge_eta" else config.nudge_eta
        floor = 1e-4 if mutant == "ignores_sm_floor" else config.sm_floor
        eye = np.eye(dk, dtype=dtype)
        if state is None:
            S = np.zeros((B, H, dv, dk), dtype)
            A = np.broadcast_to(eye / lam, (B, H, dk, dk)).astype(dtype)
            z = np.zeros((B, H, dk), dtype)
        else:
            S, A, z = (np.array(x, dtype=dtype) for x in state)
        out = np.empty((B, T, H, dv), dtype)
        for t in range(T):
            if mutant == "loses_A_after_64" and t == 64:
                A = np.broadcast_to(eye / lam, (B, H, dk, dk)).astype(dtype)
            if mutant == "drops_S_after_128" and t == 128:
                S = np.zeros_like(S)
            qt, kt, vt, ut = q[:, t], k[:, t], v[:, t], u[:, t]  # [B, H, d]
            s = np.einsum("bhij,bhj->bhi", A, ut)
            d = np.maximum(1.0 + np.einsum("bhi,bhi->bh", ut, s), floor)
            A = A - s[..., :, None] * s[..., None, :] / d[..., None, None]
            if config.nudge_period is not None and (start + t + 1) % config.nudge_period == 0:
                A = A + eta * eye
            kh = kt / np.maximum(np.linalg.norm(kt, axis=-1, keepdims=True), config.norm_eps)
            a = np.einsum("bhij,bhj->bhi", A, kh)
            if config.normalize_gate:
                lanes = {"gate_norm_first_16": 16, "gate_norm_first_32": 32}.get(mutant, dk)
                norm = np.linalg.norm(a[..., :lanes], axis=-1, keepdims=True)
                a = a / np.maximum(norm, config.norm_eps)
            residual = vt - np.einsum("bhij,bhj->bhi", S, kh)
            S = S + residual[..., :, None] * a[..., None, :]
            z = z + kt
            read = np.einsum("bhij,bhj->bhi", S, qt)
            if config.normalize_output:
                den = np.maximum(np.einsum("bhi,bhi->bh", z, qt), config.out_eps)
                read = read / den[..., None]
            out[:, t] = read
        return out, (S.astype(dtype), A.astype(dtype), z.astype(dtype))

    fn.__qualname__ = f"reach_mutant[{mutant}]" if mutant else "reach_reference"
    return fn
