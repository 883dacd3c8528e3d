"""Closed forms of spec §2–§3, each computed directly (Cholesky solves), never by the recurrence.

They are what the recurrence claims to track: the penalty inverse ``M_t^{-1}`` (claim C1), the
argmin state of the regularised least-squares objective (claim C3) and the Jacobian of one state
update (claim C4).  All arrays are float64 and sequence-first like the rest of the oracle.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import scipy.linalg

from .errors import ConfigError, ShapeError
from .spec import check_inputs

__all__ = [
    "argmin_state",
    "jacobian_spectral_norm",
    "linear_attention_states",
    "penalty_inverse",
    "penalty_matrix",
    "step_jacobian",
    "unit_normalize",
    "ut_state_chain",
]


def _as4(x: Any, name: str) -> np.ndarray:
    a = np.asarray(x, dtype=np.float64)
    if a.ndim != 4:
        raise ShapeError(name, f"expected rank 4 [B, T, H, D], got shape {a.shape}")
    return a


def _check_lambda0(lambda0: float) -> float:
    if not np.isfinite(lambda0) or lambda0 <= 0:
        raise ConfigError("lambda0", f"expected a finite number > 0, got {lambda0!r}")
    return float(lambda0)


def unit_normalize(x: Any, norm_eps: float = 1e-12) -> np.ndarray:
    """``x / max(||x||, norm_eps)`` along the last axis, in float64 (spec §2.2 ``norm_eps``)."""
    a = np.asarray(x, dtype=np.float64)
    return a / np.maximum(np.linalg.norm(a, axis=-1, keepdims=True), norm_eps)


def penalty_matrix(u: Any, lambda0: float) -> np.ndarray:
    """``M_t = lambda0·I + Σ_{s≤t} u_s u_sᵀ`` for every t: ``[B, T, H, dk, dk]`` (spec §2.3)."""
    u = _as4(u, "u")
    lambda0 = _check_lambda0(lambda0)
    dk = u.shape[-1]
    return lambda0 * np.eye(dk) + np.cumsum(u[..., :, None] * u[..., None, :], axis=1)


def _spd_inverse_times(M: np.ndarray, rhs: np.ndarray) -> np.ndarray:
    """``M^{-1} rhs`` for a stack of SPD matrices by Cholesky (``M = L Lᵀ``)."""
    L = np.linalg.cholesky(M)
    y = scipy.linalg.solve_triangular(L, rhs, lower=True)
    return scipy.linalg.solve_triangular(np.swapaxes(L, -1, -2), y, lower=False)


def penalty_inverse(u: Any, lambda0: float) -> np.ndarray:
    """``M_t^{-1}`` for every t by Cholesky solves of ``M_t`` — ``[B, T, H, dk, dk]`` (claim C1).

    Without nudges the recurrence's ``A_t`` must equal this (spec §2.3).
    """
    M = penalty_matrix(u, lambda0)
    eye = np.broadcast_to(np.eye(M.shape[-1]), M.shape)
    inv = _spd_inverse_times(M, eye)
    return 0.5 * (inv + np.swapaxes(inv, -1, -2))


def argmin_state(k: Any, v: Any, u: Any, lambda0: float, *, norm_eps: float = 1e-12) -> np.ndarray:
    """The minimiser of spec §3 C3 for every t: ``[B, T, H, dv, dk]``.

    ``S*_t = argmin_S Σ_{s≤t} ||v_s − S k̂_s||² + tr(S M_t Sᵀ)
           = (Σ_{s≤t} v_s k̂_sᵀ) (Σ_{s≤t} k̂_s k̂_sᵀ + M_t)^{-1}``,
    computed by a Cholesky solve of the symmetric positive definite Gram-plus-penalty matrix.
    """
    k, v, u = _as4(k, "k"), _as4(v, "v"), _as4(u, "u")
    check_inputs(k, k, v, u, check_finite=True)
    k_hat = unit_normalize(k, norm_eps)
    gram = np.cumsum(k_hat[..., :, None] * k_hat[..., None, :], axis=1)
    cross = np.cumsum(v[..., :, None] * k_hat[..., None, :], axis=1)  # Σ v k̂ᵀ  [.., dv, dk]
    system = gram + penalty_matrix(u, lambda0)
    # S* = C G^{-1}  <=>  G S*ᵀ = Cᵀ  (G symmetric).
    return np.swapaxes(_spd_inverse_times(system, np.swapaxes(cross, -1, -2)), -1, -2)


def step_jacobian(k_hat: Any, gate: Any, dv: int) -> np.ndarray:
    """The Jacobian ``J_t = ∂S_t/∂S_{t-1}`` of one state update as a matrix on ``vec(S)``.

    The update ``S_t = S_{t-1}(I − k̂_t α̂_tᵀ) + v_t α̂_tᵀ`` (spec §2.3) is affine in ``S_{t-1}``
    with linear part ``S ↦ S X``, ``X = I − k̂ α̂ᵀ``.  With row-major ``vec``,
    ``vec(S X) = (I_dv ⊗ Xᵀ) vec(S)``.  Inputs are single vectors ``[dk]`` (or stacks
    ``[..., dk]``); the result is ``[..., dv·dk, dv·dk]``.
    """
    k_hat = np.asarray(k_hat, dtype=np.float64)
    gate = np.asarray(gate, dtype=np.float64)
    if k_hat.shape != gate.shape:
        raise ShapeError("gate", f"expected the shape of k_hat {k_hat.shape}, got {gate.shape}")
    if int(dv) < 1:
        raise ShapeError("dv", f"expected a positive integer, got {dv!r}")
    dk = k_hat.shape[-1]
    X = np.eye(dk) - k_hat[..., :, None] * gate[..., None, :]
    Xt = np.swapaxes(X, -1, -2)
    eye_v = np.eye(int(dv))
    return np.einsum("ab,...ij->...aibj", eye_v, Xt).reshape(
        *X.shape[:-2], int(dv) * dk, int(dv) * dk
    )


def jacobian_spectral_norm(k_hat: Any, gate: Any, dv: int = 1) -> np.ndarray:
    """Spectral norm of :func:`step_jacobian` (largest singular value), by SVD.

    Works on stacks ``[..., dk]`` and returns ``[...]``.
    """
    J = step_jacobian(k_hat, gate, dv)
    return np.linalg.svd(J, compute_uv=False)[..., 0]


def linear_attention_states(k: Any, v: Any) -> np.ndarray:
    """``S_t = Σ_{s≤t} v_s k_sᵀ`` for every t (variant ``linear``, spec §2.4).

    Returns ``[B, T, H, dv, dk]``.

    A prefix sum, not a recurrence.
    """
    k, v = _as4(k, "k"), _as4(v, "v")
    return np.cumsum(v[..., :, None] * k[..., None, :], axis=1)


def ut_state_chain(
    k_hat: Any, gate: Any, v: Any, q: Any, S0: Any | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """The state chain of spec §5 in UT form, by one triangular solve per (b, h).

    For the update ``S_t = S_{t-1}(I − k̂_t g_tᵀ) + v_t g_tᵀ`` with given write directions
    ``g_t`` (``α̂_t`` for ``vla``, ``k̂_t`` for ``delta``): the residuals
    ``E = [e_1..e_T]``, ``e_t = v_t − S_{t-1}k̂_t``, solve ``E (I + N) = V − S_0 K̂`` with
    ``N_{it} = g_iᵀ k̂_t`` for ``i < t``; then ``S_T = S_0 + E Gᵀ`` and the raw read-outs
    (before the normaliser) are ``S_t q_t = S_0 q_t + Σ_{i≤t} e_i (g_iᵀ q_t)``.

    Shapes: ``k_hat, gate, q`` ``[B, T, H, dk]``, ``v`` ``[B, T, H, dv]``, ``S0``
    ``[B, H, dv, dk]`` (default 0).  Returns ``(raw_outputs [B, T, H, dv], S_T [B, H, dv, dk])``.
    """
    k_hat, gate, v, q = (
        _as4(x, n) for x, n in ((k_hat, "k_hat"), (gate, "gate"), (v, "v"), (q, "q"))
    )
    B, T, H, dk = k_hat.shape
    dv = v.shape[-1]
    S0 = np.zeros((B, H, dv, dk)) if S0 is None else np.asarray(S0, dtype=np.float64)
    # Heads next to batch: [B, H, T, D].
    K, G, V, Q = (np.moveaxis(x, 1, 2) for x in (k_hat, gate, v, q))
    N = np.triu(G @ np.swapaxes(K, -1, -2), k=1)  # N[i, t] = g_i·k̂_t for i < t
    rhs = V - K @ np.swapaxes(S0, -1, -2)  # rows: (v_t − S_0 k̂_t)ᵀ
    # E (I + N) = rhs_rowsᵀ  <=>  (I + N)ᵀ Eᵀ = rhs, a lower unit-triangular system.
    E_rows = scipy.linalg.solve_triangular(
        np.swapaxes(np.eye(T) + N, -1, -2), rhs, lower=True, unit_diagonal=True
    )
    raw = Q @ np.swapaxes(S0, -1, -2) + np.tril(Q @ np.swapaxes(G, -1, -2)) @ E_rows
    S_T = S0 + np.swapaxes(E_rows, -1, -2) @ G
    return np.moveaxis(raw, 2, 1), S_T
