"""Shared fixtures of the claims tests: a tiny profile and planted backends (spec §3 meta-tests)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from vla_verify.backends.numpy_oracle import NumpyOracleBackend, recurrence
from vla_verify.proofs.ledger import Context, Profile

TINY = Profile(
    name="tiny",
    examples=8,
    max_T=8,
    max_dk=3,
    mp_examples=1,
    drift_T=(10, 50),
    drift_dk=4,
    growth_T=(30, 300, 3000),
    capacity_dk=6,
    capacity_trials=4,
    layer_T=1000,
    layer_seeds=1,
    jacobian_dk=(4,),
    adversary_T0=30,
    adversary_restarts=2,
    adversary_steps=30,
    joint_greedy_T=300,
    state_dk=(2,),
    product_dk=(2, 8),
    product_T=32,
    certify_long=False,
    c1_T=(10, 100, 1000),
    c1_float32_T=1000,
)


def tiny_context(tmp_path: Path, seed: int = 0) -> Context:
    return Context(profile=TINY, outdir=tmp_path, seed=seed)


class NudgingOracle(NumpyOracleBackend):
    """Planted: nudges every 3 steps although the configuration has no nudges (breaks C1)."""

    name = "planted_nudge"

    def _run(self, q, k, v, u, *, config, initial_state, start=0):  # type: ignore[no-untyped-def]
        # The raw recurrence: the planted nudges are the point, not a loss of accuracy for the
        # backend's own accuracy check to refuse.
        result = recurrence(
            q,
            k,
            v,
            u,
            config=config.replace(nudge_period=3),
            variant=self.variant,
            initial_state=initial_state,
            start=start,
        )
        return result.o, result.state


class SignFlippedDowndate(NumpyOracleBackend):
    """Planted: ``A_t = A_{t-1} + s sᵀ/δ`` (the downdate's sign flipped; breaks C2)."""

    name = "planted_sign_flip"

    def _run(self, q, k, v, u, *, config, initial_state, start=0):  # type: ignore[no-untyped-def]
        B, T, H, dk = q.shape
        if initial_state is None:
            A = np.broadcast_to(np.eye(dk) / config.lambda0, (B, H, dk, dk)).copy()
            S = np.zeros((B, H, v.shape[-1], dk))
            z = np.zeros((B, H, dk))
        else:
            S, A, z = (np.array(x, dtype=np.float64) for x in initial_state)
        for t in range(T):
            ut = u[:, t]
            s = np.einsum("bhij,bhj->bhi", A, ut)
            d = np.maximum(1 + np.einsum("bhi,bhi->bh", ut, s), config.sm_floor)
            A = A + s[..., :, None] * s[..., None, :] / d[..., None, None]
        o = np.zeros(v.shape)
        return o, (S, A, z)


def mp_recurrence_off_by_one(*args, **kwargs):  # type: ignore[no-untyped-def]
    """Planted: the mpmath recurrence with 1 added to every entry of A (breaks C1's reference)."""
    from vla_verify.oracle import recurrence_mp

    o, (S, A, z) = recurrence_mp(*args, **kwargs)
    return o, (S, A + 1.0, z)
