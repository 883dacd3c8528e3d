"""The mpmath high-precision backend: spec §2.3–§2.4 at ``dps`` decimal digits (default 50).

Used to bound the float64 oracle's own error (``tests/test_oracle_vs_mpmath.py``) and to
certify counterexamples.  It is written independently of the NumPy oracle (plain Python lists of
``mpf``, one (batch, head) slice at a time), so that a bug in one does not agree with the other.
Inputs are converted exactly (``mpf(float)`` is exact) and results are rounded to the nearest
float64 once, at the end.  Small shapes only: the cost is ``O(B·H·T·dk·(dk + dv))`` mpmath
operations, and :meth:`MpmathBackend.check_support` refuses requests above ``max_work``.
"""

from __future__ import annotations

import math
from typing import Any

import mpmath
import numpy as np
from mpmath import mp

from ..errors import ConfigError, IllConditionedError
from ..spec import VLAConfig, check_config, check_inputs, check_start, check_variant
from .registry import Backend, Capabilities

__all__ = ["MpmathBackend", "penalty_inverse_mp", "recurrence_mp", "to_float64"]

Vec = list
Mat = list  # list of rows


def to_float64(x: Any) -> float:
    """Round an mpf to the nearest float64 (once; ``float(mpf)`` may not round to nearest)."""
    return mpmath.libmp.to_float(mpmath.mpf(x)._mpf_, rnd=mpmath.libmp.round_nearest)


def _dot(x: Vec, y: Vec) -> Any:
    return mpmath.fsum(a * b for a, b in zip(x, y, strict=True))


def _matvec(M: Mat, x: Vec) -> Vec:
    return [_dot(row, x) for row in M]


def _normalize(x: Vec, eps: Any) -> Vec:
    norm = mpmath.sqrt(_dot(x, x))
    d = max(norm, eps)
    return [a / d for a in x]


def _slice_recurrence(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    u: np.ndarray,
    state: tuple[np.ndarray, np.ndarray, np.ndarray] | None,
    config: VLAConfig,
    variant: str,
    start: int = 0,
) -> tuple[list[Vec], Mat, Mat, Vec, float]:
    """One (batch, head) slice: ``q, k, u`` ``[T, dk]``, ``v`` ``[T, dv]`` (float64).  Also
    returns the most decimal digits a Sherman–Morrison subtraction cancelled (``inf`` where it
    cancelled them all)."""
    T, dk = q.shape
    dv = v.shape[1]
    mpf = mp.mpf
    norm_eps, out_eps = mpf(config.norm_eps), mpf(config.out_eps)
    sm_floor, eta = mpf(config.sm_floor), mpf(config.nudge_eta)
    if state is None:
        S = [[mpf(0)] * dk for _ in range(dv)]
        A = [
            [(1 / mpf(config.lambda0)) if i == j else mpf(0) for j in range(dk)] for i in range(dk)
        ]
        z = [mpf(0)] * dk
    else:
        S = [[mpf(float(x)) for x in row] for row in state[0]]
        A = [[mpf(float(x)) for x in row] for row in state[1]]
        z = [mpf(float(x)) for x in state[2]]
    outputs = []
    lost = [0.0]

    def downdate(M: Mat, x: Vec, floor: Any | None) -> Mat:
        s = _matvec(M, x)
        denom = 1 + _dot(x, s)
        if floor is not None:
            denom = max(denom, floor)
        new = [[M[i][j] - s[i] * s[j] / denom for j in range(dk)] for i in range(dk)]
        # Digits the subtraction cancels: the size of what is subtracted over the result's.
        subtracted = max(abs(a) for a in s) ** 2 / abs(denom) if denom else mpf(0)
        result = max(abs(a) for row in new for a in row)
        if subtracted > 0:
            loss = float(mpmath.log10(subtracted / result)) if result > 0 else math.inf
            lost[0] = max(lost[0], loss)
        return new

    for t in range(T):
        q_t = [mpf(float(x)) for x in q[t]]
        k_t = [mpf(float(x)) for x in k[t]]
        v_t = [mpf(float(x)) for x in v[t]]
        u_t = [mpf(float(x)) for x in u[t]]
        k_hat = _normalize(k_t, norm_eps)
        if variant == "vla":
            A = downdate(A, u_t, sm_floor)
            if config.nudges_at(start + t + 1):
                A = [[A[i][j] + (eta if i == j else 0) for j in range(dk)] for i in range(dk)]
            alpha = _matvec(A, k_hat)
            gate = _normalize(alpha, norm_eps) if config.normalize_gate else alpha
            e = [v_t[i] - _dot(S[i], k_hat) for i in range(dv)]
            S = [[S[i][j] + e[i] * gate[j] for j in range(dk)] for i in range(dv)]
        elif variant == "rls":
            A = downdate(A, k_hat, None)
            A = downdate(A, u_t, sm_floor)
            pk, pu = _matvec(A, k_hat), _matvec(A, u_t)
            e = [v_t[i] - _dot(S[i], k_hat) for i in range(dv)]
            su = [_dot(S[i], u_t) for i in range(dv)]
            S = [[S[i][j] + e[i] * pk[j] - su[i] * pu[j] for j in range(dk)] for i in range(dv)]
        elif variant == "delta":
            e = [v_t[i] - _dot(S[i], k_hat) for i in range(dv)]
            S = [[S[i][j] + e[i] * k_hat[j] for j in range(dk)] for i in range(dv)]
        else:  # linear
            S = [[S[i][j] + v_t[i] * k_t[j] for j in range(dk)] for i in range(dv)]
        z = [a + b for a, b in zip(z, k_t, strict=True)]
        read = [_dot(row, q_t) for row in S]
        if config.normalize_output:
            den = max(_dot(z, q_t), out_eps)
            read = [x / den for x in read]
        outputs.append(read)
    return outputs, S, A, z, lost[0]


def recurrence_mp(
    q: Any,
    k: Any,
    v: Any,
    u: Any,
    *,
    config: VLAConfig | None = None,
    variant: str = "vla",
    initial_state: tuple[Any, Any, Any] | None = None,
    dps: int = 50,
    start: int = 0,
    return_lost_digits: bool = False,
) -> Any:
    """The recurrence at ``dps`` digits; returns float64 ``(o, (S, A, z))`` rounded once.
    ``start``: tokens consumed before this call (spec §2.3, the nudge clock).
    ``return_lost_digits``: return ``(o, (S, A, z), lost)`` where ``lost`` is the most decimal
    digits one Sherman–Morrison subtraction cancelled (``inf``: all of them); the result keeps
    about ``dps − lost`` digits."""
    config = check_config(config)
    if isinstance(dps, bool) or not isinstance(dps, int) or dps < 1:
        raise ConfigError("dps", f"expected an integer >= 1, got {dps!r}")
    check_variant(variant)
    start = check_start(start)
    B, T, H, dk, dv = check_inputs(q, k, v, u, initial_state)
    q, k, v, u = (np.asarray(x, dtype=np.float64) for x in (q, k, v, u))
    state = None if initial_state is None else [np.asarray(x, np.float64) for x in initial_state]
    o = np.empty((B, T, H, dv))
    S_out, A_out, z_out = np.empty((B, H, dv, dk)), np.empty((B, H, dk, dk)), np.empty((B, H, dk))
    most_lost = 0.0
    with mp.workdps(dps):
        for b in range(B):
            for h in range(H):
                st = None if state is None else (state[0][b, h], state[1][b, h], state[2][b, h])
                outs, S, A, z, lost = _slice_recurrence(
                    q[b, :, h], k[b, :, h], v[b, :, h], u[b, :, h], st, config, variant, start
                )
                most_lost = max(most_lost, lost)
                o[b, :, h] = [[to_float64(x) for x in row] for row in outs]
                S_out[b, h] = [[to_float64(x) for x in row] for row in S]
                A_out[b, h] = [[to_float64(x) for x in row] for row in A]
                z_out[b, h] = [to_float64(x) for x in z]
    if return_lost_digits:
        return o, (S_out, A_out, z_out), most_lost
    return o, (S_out, A_out, z_out)


def penalty_inverse_mp(u: Any, lambda0: float, *, dps: int = 50) -> np.ndarray:
    """``M_t^{-1}`` for every t by mpmath LU solves at ``dps`` digits: ``[B, T, H, dk, dk]``."""
    u = np.asarray(u, dtype=np.float64)
    B, T, H, dk = u.shape
    out = np.empty((B, T, H, dk, dk))
    with mp.workdps(dps):
        for b in range(B):
            for h in range(H):
                M = mp.eye(dk) * mp.mpf(lambda0)
                for t in range(T):
                    col = mp.matrix([mp.mpf(float(x)) for x in u[b, t, h]])
                    M = M + col * col.T
                    inv = mp.inverse(M)
                    out[b, t, h] = [[to_float64(inv[i, j]) for j in range(dk)] for i in range(dk)]
    return out


def argmin_state_mp(
    k: Any, v: Any, u: Any, lambda0: float, *, norm_eps: float = 1e-12, dps: int = 50
) -> np.ndarray:
    """The minimiser of spec §3 C3 for every t at ``dps`` digits: ``[B, T, H, dv, dk]``.

    ``S*_t = (Σ v_s k̂_sᵀ)(Σ k̂_s k̂_sᵀ + M_t)^{-1}`` by an mpmath LU solve.
    """
    k, v, u = (np.asarray(x, dtype=np.float64) for x in (k, v, u))
    B, T, H, dk = k.shape
    dv = v.shape[-1]
    out = np.empty((B, T, H, dv, dk))
    with mp.workdps(dps):
        eps = mp.mpf(norm_eps)
        for b in range(B):
            for h in range(H):
                system = mp.eye(dk) * mp.mpf(lambda0)
                cross = mp.zeros(dv, dk)
                for t in range(T):
                    kh = mp.matrix(_normalize([mp.mpf(float(x)) for x in k[b, t, h]], eps))
                    ut = mp.matrix([mp.mpf(float(x)) for x in u[b, t, h]])
                    vt = mp.matrix([mp.mpf(float(x)) for x in v[b, t, h]])
                    system = system + kh * kh.T + ut * ut.T
                    cross = cross + vt * kh.T
                    # S* = cross · system^{-1}: row i solves system · s_i = cross_i (symmetric)
                    for i in range(dv):
                        row = mp.lu_solve(system, cross[i, :].T)
                        out[b, t, h, i] = [to_float64(row[j]) for j in range(dk)]
    return out


def jacobian_spectral_norm_mp(k_hat: Any, gate: Any, *, dps: int = 50) -> float:
    """``||I − k̂ gᵀ||₂`` (the spectral norm of one step's Jacobian, claim C4) by an mpmath SVD.

    ``k_hat`` and ``gate`` are single vectors ``[dk]``; the norm of ``S ↦ S X`` on ``dv × dk``
    matrices equals ``||X||₂`` for every ``dv``.
    """
    k_hat = np.asarray(k_hat, dtype=np.float64)
    gate = np.asarray(gate, dtype=np.float64)
    dk = k_hat.shape[-1]
    with mp.workdps(dps):
        X = (
            mp.eye(dk)
            - mp.matrix([mp.mpf(float(x)) for x in k_hat])
            * mp.matrix([mp.mpf(float(x)) for x in gate]).T
        )
        return to_float64(max(mp.svd_r(X, compute_uv=False)))


class MpmathBackend(Backend):
    """Registry name ``mpmath``: the recurrence at ``dps`` digits (option ``dps``, default 50).

    Takes float64 NumPy inputs and returns float64 results rounded once.  Refuses requests whose
    cost ``B·H·T·dk·(dk + dv)`` exceeds the option ``max_work`` (default 2e5).
    """

    name = "mpmath"
    description = "mpmath high-precision recurrence"
    capabilities = Capabilities(
        array="numpy",
        devices=("cpu",),
        dtypes=("float64",),
        requires=("mpmath",),
        options={"dps": 50, "max_work": 200_000},
    )

    def _check_option(self, option: str, value: Any, default: Any) -> None:
        super()._check_option(option, value, default)
        if option == "dps" and value < 1:
            raise ConfigError("dps", f"backend 'mpmath': expected an integer >= 1, got {value!r}")

    def check_support(self, config, shapes, dtype, device="cpu", *, variant=None):  # type: ignore[no-untyped-def]
        reason = super().check_support(config, shapes, dtype, device, variant=variant)
        if reason is not None:
            return reason
        work = shapes.B * shapes.H * shapes.T * shapes.dk * (shapes.dk + shapes.dv)
        if work > self.options["max_work"]:
            return (
                f"too large for mpmath: B·H·T·dk·(dk+dv) = {work} exceeds max_work="
                f"{self.options['max_work']} (use small shapes, or bind a larger max_work)"
            )
        return None

    def _run(self, q, k, v, u, *, config, initial_state, start=0):  # type: ignore[no-untyped-def]
        dps = int(self.options["dps"])
        o, state, lost = recurrence_mp(
            q,
            k,
            v,
            u,
            config=config,
            variant=self.variant,
            initial_state=initial_state,
            dps=dps,
            start=start,
            return_lost_digits=True,
        )
        # A subtraction that cancels all but a few of the working digits leaves a result that
        # agrees with nothing: refuse it, saying how many digits it needs.
        if not lost <= dps - DIGITS_KEPT:
            need = "more" if math.isinf(lost) else f"at least {math.ceil(lost) + DIGITS_KEPT}"
            raise IllConditionedError(
                f"a Sherman–Morrison subtraction cancelled {lost:.0f} of mpmath's {dps} digits; "
                f"bind dps={need}, or use vla_verify.oracle.reference",
                figure="cancellation",
                estimate=lost,
            )
        return o, state


#: Digits a result must keep beyond the most that any subtraction cancelled.
DIGITS_KEPT = 20
