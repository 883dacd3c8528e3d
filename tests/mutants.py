"""Planted bugs for the meta-tests: a compact, independent VLA implementation with switches.

Each switch plants one bug of a kind that real kernels have had.  ``make(None)`` is the correct
implementation; ``make(name)`` the mutant.  Written separately from the oracle on purpose (spec
§4 independence): a meta-test is only meaningful if the mutant is not the oracle with a flag.
"""

from __future__ import annotations

import numpy as np

MUTANTS = (
    "gate_from_previous_A",  # α_t = A_{t-1} k̂_t instead of the updated A_t
    "gate_not_normalized",  # α̂_t = α_t although normalize_gate is True
    "update_from_left",  # S_t = (I − α̂ k̂ᵀ) S ... : multiplied from the wrong side
    "nudge_one_step_late",  # nudge after step t with (t − 1) % period == 0
    "z_from_unit_keys",  # z_t = z_{t-1} + k̂_t instead of the raw features
    "readout_before_write",  # o_t = S_{t-1} q_t / ...
    "ignores_initial_state",  # starts from (0, I/lambda0, 0) whatever it is given
    "returns_S_transposed",  # returns Sᵀ: [B, H, dk, dv]
    "sm_sign_flipped",  # A_t = A_{t-1} + s sᵀ/δ
    "floor_ignored",  # read-out denominator without max(·, out_eps)
)


def make(mutant: str | None):
    """A spec §4 NumPy implementation of ``vla`` with ``mutant`` planted (or none)."""
    if mutant is not None and mutant not in MUTANTS:
        raise ValueError(mutant)

    def fn(q, k, v, u, *, config, initial_state=None):
        B, T, H, dk = q.shape
        dv = v.shape[-1]
        out = np.zeros((B, T, H, dv), dtype=q.dtype)
        S_end = np.zeros((B, H, dv, dk), dtype=q.dtype)
        A_end = np.zeros((B, H, dk, dk), dtype=q.dtype)
        z_end = np.zeros((B, H, dk), dtype=q.dtype)
        for b in range(B):
            for h in range(H):
                if initial_state is None or mutant == "ignores_initial_state":
                    S = np.zeros((dv, dk), q.dtype)
                    A = np.eye(dk, dtype=q.dtype) / config.lambda0
                    z = np.zeros(dk, q.dtype)
                else:
                    S, A, z = (np.array(x[b, h]) for x in initial_state)
                for t in range(T):
                    qt, kt, vt, ut = q[b, t, h], k[b, t, h], v[b, t, h], u[b, t, h]
                    A_prev = A
                    s = A @ ut
                    d = max(1 + ut @ s, config.sm_floor)
                    A = (
                        A + np.outer(s, s) / d
                        if mutant == "sm_sign_flipped"
                        else A - np.outer(s, s) / d
                    )
                    step = t + 1 if mutant != "nudge_one_step_late" else t
                    if config.nudge_period and step > 0 and step % config.nudge_period == 0:
                        A = A + config.nudge_eta * np.eye(dk)
                    kh = kt / max(np.sqrt(kt @ kt), config.norm_eps)
                    a = (A_prev if mutant == "gate_from_previous_A" else A) @ kh
                    if config.normalize_gate and mutant != "gate_not_normalized":
                        a = a / max(np.sqrt(a @ a), config.norm_eps)
                    S_old = S
                    if mutant == "update_from_left" and dv == dk:
                        S = (np.eye(dk) - np.outer(a, kh)) @ S + np.outer(vt, a)
                    else:
                        S = S + np.outer(vt - S @ kh, a)
                    z = z + (kh if mutant == "z_from_unit_keys" else kt)
                    read = (S_old if mutant == "readout_before_write" else S) @ qt
                    if config.normalize_output:
                        den = z @ qt if mutant == "floor_ignored" else max(z @ qt, config.out_eps)
                        read = read / den
                    out[b, t, h] = read
                S_end[b, h], A_end[b, h], z_end[b, h] = S, A, z
        if mutant == "returns_S_transposed":
            S_end = np.swapaxes(S_end, -1, -2)
        return out, (S_end, A_end, z_end)

    fn.__qualname__ = f"mutant[{mutant}]" if mutant else "reference_implementation"
    return fn
