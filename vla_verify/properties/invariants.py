"""Invariants of spec §3 (claims C1–C5), written once and run over any backend of the registry.

Each invariant takes a drawn :class:`~vla_verify.properties.strategies.Case` and a
:class:`~vla_verify.spec.VLAConfig`.  Where it runs an implementation, ``backend`` is a registry
name (``"numpy"``, ``"mpmath"``, ``"torch"``…) or a :class:`~vla_verify.backends.Backend`
object (a planted-bug backend in the meta-tests); the default is the float64 NumPy oracle.

An invariant either returns an :class:`InvariantResult` — the measured figure (``value``), the
limit it is judged against (``bound``) and ``holds``, *computed* as ``value <= bound`` over every
(batch, time, head) element — or, for the figures a claim only describes (C4 growth, C5 growth),
the raw array the ledger turns into a verdict.

Tolerances come from first-order error models, not from trial and error: the unit roundoff
``u`` of the precision, times the length ``t`` and a condition number (of ``M_t`` for C1, of the
Gram-plus-penalty matrix for C3), times a small polynomial in ``dk`` for the inner products
(``γ_n = n·u``, Higham, *Accuracy and Stability of Numerical Algorithms*, §3.1).  Each function
states its model.

Backends see only the spec §4 interface (final state of a run), so per-step quantities of a
backend (``A_t``, ``S_t`` for every ``t``) are read by running it on every prefix
``[:, :t]`` (cost O(T²) tokens; the oracle's own history is used for ``"numpy"``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..arrays import from_numpy, to_numpy
from ..backends import Backend, get
from ..backends.numpy_oracle import NumpyOracleBackend, StateHistory, recurrence
from ..closed_forms import argmin_state, penalty_matrix, unit_normalize
from ..errors import BackendUnavailableError, UnsupportedConfigurationError
from ..spec import Shapes, VLAConfig, unit_roundoff
from .strategies import Case

__all__ = [
    "ALL_INVARIANTS",
    "GOLDEN_RATIO",
    "InvariantInfo",
    "InvariantResult",
    "backend_history",
    "closed_form_equivalence",
    "directional_selectivity",
    "jacobian_norm_formula",
    "jacobian_product_norm",
    "jacobian_step_norms",
    "oracle_agreement",
    "oracle_history",
    "rank_one_sigma_max",
    "resolve_backend",
    "run_backend",
    "sherman_morrison_exactness",
    "state_carry",
    "state_norms",
    "unit_jacobian",
]

BackendLike = str | Backend

#: ``(1 + sqrt 5)/2``: the supremum of ``||I − k̂ α̂ᵀ||₂`` over unit ``k̂, α̂`` with ``α̂ᵀk̂ > 0``
#: (``vla`` with normalised gates and SPD ``A``; :func:`rank_one_sigma_max` at ``c → 0``).
GOLDEN_RATIO = (1.0 + 5.0**0.5) / 2.0

_U64 = unit_roundoff("float64")


@dataclass(frozen=True)
class InvariantResult:
    """The outcome of one invariant on one case.

    ``value`` is the measured figure and ``bound`` the limit it is judged against, both taken at
    the element (batch, time, head) where ``value / bound`` is largest; ``holds`` is computed
    from the measurements of every element (never typed in).  ``detail`` says what was measured,
    where, and under which error model.  ``where`` is that element as ``(b, t, h)`` (``t``
    0-based; ``-1`` when the figure is not per step).
    """

    name: str
    holds: bool
    value: float
    bound: float
    detail: str
    where: tuple[int, int, int] = (0, -1, 0)
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    def __bool__(self) -> bool:
        return self.holds


# -- running a backend -------------------------------------------------------------------------


def resolve_backend(backend: BackendLike, variant: str = "vla") -> Backend:
    """A registry name or a :class:`Backend` object, bound to ``variant``.

    Raises :class:`~vla_verify.errors.BackendUnavailableError` when the backend cannot run on
    this machine (missing packages or device), with the registry's reason.
    """
    if isinstance(backend, str):
        b = get(backend, variant=variant)
    elif isinstance(backend, Backend):
        b = backend if backend.variant == variant else backend.bind(variant=variant)
    else:
        raise TypeError(f"backend must be a registry name or a Backend, got {type(backend)!r}")
    reason = b.availability()
    if reason is not None:
        raise BackendUnavailableError(b.name, reason)
    return b


def _device(b: Backend) -> str:
    devices = b.capabilities.devices
    return "cpu" if "cpu" in devices else devices[0]


def _check(b: Backend, config: VLAConfig, shapes: Shapes, dtype: str) -> None:
    reason = b.check_support(config, shapes, dtype, _device(b))
    if reason is not None:
        raise UnsupportedConfigurationError(b.name, reason)


def run_backend(
    backend: Backend,
    inputs: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray],
    config: VLAConfig,
    *,
    dtype: str = "float64",
    initial_state: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None,
) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Run a bound backend on float64 NumPy ``(q, k, v, u)`` (spec §1 layouts), converted to its
    array library, ``dtype`` and device; returns ``(o, (S, A, z))`` as float64 NumPy arrays.

    Raises :class:`UnsupportedConfigurationError` (with the registry's reason) when the backend
    cannot run the request.
    """
    q = inputs[0]
    B, T, H, dk = q.shape
    dv = inputs[2].shape[-1]
    _check(backend, config, Shapes(B, T, H, dk, dv), dtype)
    array, device = backend.capabilities.array, _device(backend)

    def conv(x: np.ndarray) -> Any:
        return from_numpy(np.asarray(x, dtype=np.float64), array, dtype, device)

    state = None if initial_state is None else tuple(conv(x) for x in initial_state)
    o, (S, A, z) = backend(*(conv(x) for x in inputs), config=config, initial_state=state)
    return to_numpy(o), (to_numpy(S), to_numpy(A), to_numpy(z))


def _is_oracle(backend: BackendLike) -> bool:
    return backend == "numpy" or type(backend) is NumpyOracleBackend


def _rounded(x: np.ndarray, dtype: str) -> np.ndarray:
    """The float64 values of ``x`` rounded to ``dtype`` (what a backend in ``dtype`` sees)."""
    from ..backends.numpy_oracle import round_to_dtype

    return np.asarray(round_to_dtype(np.asarray(x), dtype), dtype=np.float64)


def backend_history(
    case: Case,
    config: VLAConfig,
    *,
    backend: BackendLike = "numpy",
    variant: str = "vla",
    dtype: str = "float64",
    use_initial_state: bool = True,
) -> dict[str, np.ndarray]:
    """Every intermediate state of a backend: ``S [B,T,H,dv,dk]``, ``A [B,T,H,dk,dk]``,
    ``z [B,T,H,dk]`` and the outputs ``o [B,T,H,dv]`` (float64).

    For the oracle (``"numpy"``) this is its recorded history (spec §2.3, run in ``dtype``); for
    any other backend, the final state of a run on each prefix ``[:, :t]`` — all prefixes in
    one call along the batch axis, completed by no-op tokens, when no nudge falls within the
    sequence; one call per prefix otherwise.
    """
    inputs = (case.q, case.k, case.v, case.u)
    state = case.initial_state if use_initial_state else None
    if _is_oracle(backend):
        if variant == "rls" and config.nudge_period is not None:
            raise UnsupportedConfigurationError(
                "numpy", "the rls variant is defined without nudges; use VLAConfig.exact()"
            )
        r = recurrence(
            *inputs,
            config=config,
            variant=variant,
            initial_state=state,
            dtype=dtype,
            return_states=True,
        )
        h = r.history
        assert h is not None
        return {
            "S": h.S.astype(np.float64),
            "A": h.A.astype(np.float64),
            "z": h.z.astype(np.float64),
            "o": r.o.astype(np.float64),
        }
    b = resolve_backend(backend, variant)
    B, T, H, dk, dv = case.shapes
    out = {
        "S": np.empty((B, T, H, dv, dk)),
        "A": np.empty((B, T, H, dk, dk)),
        "z": np.empty((B, T, H, dk)),
        "o": np.empty((B, T, H, dv)),
    }
    if config.nudge_period is None or config.nudge_period > T:
        # All prefixes in one call: prefix t is the sequence with tokens t+1..T replaced by
        # no-op tokens (k = 0, u = 0, v = 0: k̂ = 0 and α̂ = 0 leave S alone, u = 0 leaves A
        # alone — spec §2.3 with normalize(0) = 0 — and z += 0), stacked along the batch axis.
        mask = (np.arange(T)[None, :] < np.arange(1, T + 1)[:, None]).astype(np.float64)
        m = mask[:, None, :, None, None]  # [T (prefix), 1, T (token), 1, 1]
        stacked = []
        for name, x in zip("qkvu", inputs, strict=True):
            y = np.broadcast_to(x[None], (T, *x.shape))
            stacked.append((y if name == "q" else y * m).reshape(T * B, *x.shape[1:]))
        big_state = None
        if state is not None:
            big_state = tuple(
                np.broadcast_to(np.asarray(x)[None], (T, *np.shape(x))).reshape(
                    T * B, *np.shape(x)[1:]
                )
                for x in state
            )
        o, (S, A, z) = run_backend(b, tuple(stacked), config, dtype=dtype, initial_state=big_state)
        out["S"] = np.moveaxis(S.reshape(T, B, H, dv, dk), 0, 1)
        out["A"] = np.moveaxis(A.reshape(T, B, H, dk, dk), 0, 1)
        out["z"] = np.moveaxis(z.reshape(T, B, H, dk), 0, 1)
        o = o.reshape(T, B, T, H, dv)
        out["o"] = np.stack([o[t, :, t] for t in range(T)], axis=1)
        return out
    for t in range(1, T + 1):
        o, (S, A, z) = run_backend(
            b, tuple(x[:, :t] for x in inputs), config, dtype=dtype, initial_state=state
        )
        out["S"][:, t - 1], out["A"][:, t - 1], out["z"][:, t - 1] = S, A, z
        out["o"][:, t - 1] = o[:, t - 1]
    return out


def _worst(ratio: np.ndarray) -> tuple[int, ...]:
    """Index of the largest ratio, NaN counted as the worst."""
    r = np.where(np.isnan(ratio), np.inf, ratio)
    return tuple(int(i) for i in np.unravel_index(int(np.argmax(r)), r.shape))


def _result(
    name: str, value: np.ndarray, bound: np.ndarray, detail: str, **extra: Any
) -> InvariantResult:
    """``holds = all(value <= bound)`` (NaN fails), reported at the worst ``[B, T, H]`` element."""
    value = np.asarray(value, dtype=np.float64)
    bound = np.broadcast_to(np.asarray(bound, dtype=np.float64), value.shape)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(bound > 0, value / bound, np.where(value > 0, np.inf, 0.0))
    ratio = np.where(np.isfinite(value), ratio, np.inf)
    holds = bool(np.all(np.isfinite(value)) and np.all(value <= bound))
    idx = _worst(ratio)
    where = (idx[0], idx[1], idx[2]) if len(idx) == 3 else (idx[0], -1, idx[-1])
    return InvariantResult(name, holds, float(value[idx]), float(bound[idx]), detail, where, extra)


def _ratio(value: float, bound: float) -> float:
    if not np.isfinite(value):
        return np.inf
    if bound > 0:
        return value / bound
    return np.inf if value > 0 else 0.0


def _spectral_norm(X: np.ndarray) -> np.ndarray:
    """``||X||₂`` of a stack ``[..., m, n]``; NaN where ``X`` is not finite."""
    finite = np.all(np.isfinite(X), axis=(-2, -1))
    safe = np.where(finite[..., None, None], X, 0.0)
    return np.where(finite, np.linalg.norm(safe, ord=2, axis=(-2, -1)), np.nan)


def _spd_cond(M: np.ndarray) -> np.ndarray:
    """2-norm condition number of symmetric matrices ``[..., d, d]`` (inf if singular)."""
    w = np.abs(np.linalg.eigvalsh(0.5 * (M + np.swapaxes(M, -1, -2))))
    with np.errstate(divide="ignore"):
        return np.max(w, axis=-1) / np.min(w, axis=-1)


# -- C1 ----------------------------------------------------------------------------------------


def sherman_morrison_exactness(
    case: Case, config: VLAConfig, *, backend: BackendLike = "numpy", dtype: str = "float64"
) -> InvariantResult:
    """Claim C1 (spec §3, §2.3): without nudges ``A_t = (M_0 + Σ_{s≤t} u_s u_sᵀ)^{-1}``.

    ``M_0 = lambda0·I`` (or ``A_0^{-1}`` for a given initial state ``A_0``).  Measured: the
    relative error ``||A_t − M_t^{-1}||_F / ||M_t^{-1}||_F`` per ``(b, t, h)``, with ``A_t`` from
    ``backend`` run in ``dtype`` and ``M_t^{-1}`` by a float64 direct solve from the inputs
    rounded to ``dtype`` (so input rounding is not counted against the recurrence).

    Error model (first order): each downdate ``A_{t-1} − s sᵀ/δ`` commits rounding errors of
    size ``γ_{dk+2}·||A_{t-1}||`` (``γ_n = n·u``) — relative to ``||A_t||`` that is the
    cancellation factor ``||A_{t-1}||/||A_t||`` — and an inverse's forward error is its backward
    error times ``κ(M_t)``.  Both are bounded by ``χ_t = ||M_t||₂·||A_0||₂ >= κ(M_t)`` (``A``
    only shrinks without nudges), so after ``t`` steps the relative error is at most
    ``(dk + 2)·(t·u + u_64)·χ_t`` (the ``u_64`` term is the direct solve's own error).
    The claim is only exact when the Sherman–Morrison denominator floor is inactive; steps where
    ``1 + uᵀA_{t-1}u < sm_floor`` are counted in ``detail``.  ``config`` must have no nudges.
    """
    name = "sherman_morrison_exactness"
    if config.nudge_period is not None:
        raise UnsupportedConfigurationError(
            "invariant", "C1 is stated without nudges: use VLAConfig.exact()", "config"
        )
    hist = backend_history(case, config, backend=backend, dtype=dtype)
    A = hist["A"]
    B, T, H, dk, _ = case.shapes
    u = _rounded(case.u, dtype)
    if case.initial_state is None:
        M0 = np.broadcast_to(config.lambda0 * np.eye(dk), (B, H, dk, dk))
    else:
        M0 = np.linalg.inv(_rounded(case.initial_state[1], dtype))
    M = M0[:, None] + np.cumsum(u[..., :, None] * u[..., None, :], axis=1)  # [B, T, H, dk, dk]
    ref = np.linalg.inv(M)
    with np.errstate(invalid="ignore", divide="ignore"):
        err = np.linalg.norm(A - ref, axis=(-2, -1)) / np.linalg.norm(ref, axis=(-2, -1))
    t = np.arange(1, T + 1)[None, :, None]
    kappa = _spd_cond(M)
    norm_A0 = np.linalg.norm(np.linalg.inv(M0), ord=2, axis=(-2, -1))[:, None]  # [B, 1, H]
    chi = np.linalg.norm(M, ord=2, axis=(-2, -1)) * norm_A0
    bound = (dk + 2) * (t * unit_roundoff(dtype) + _U64) * chi
    # Where the floor would act (computed from the reference chain, in float64).
    A_prev = np.concatenate([np.linalg.inv(M0)[:, None], ref[:, :-1]], axis=1)
    denom = 1.0 + np.einsum("bthi,bthij,bthj->bth", u, A_prev, u)
    floored = int(np.sum(denom < config.sm_floor))
    r = _result(
        name,
        err,
        bound,
        "",
        floored_steps=floored,
        max_condition=float(np.max(kappa)),
    )
    b, tt, h = r.where
    detail = (
        f"C1: max relative error of A_t vs (M_0 + Σuuᵀ)^{{-1}} is {r.value:.3e} at (b={b}, "
        f"t={tt + 1}, h={h}) against the error-model bound (dk+2)(t·u+u64)·χ_t = "
        f"{r.bound:.3e} (χ_t = ||M_t||·||A_0|| = {chi[b, tt, h]:.3e}, κ(M_t) = "
        f"{kappa[b, tt, h]:.3e}, dtype {dtype}); largest κ(M_t) "
        f"{np.max(kappa):.3e}; Sherman–Morrison floor active at {floored} step(s)"
    )
    return InvariantResult(name, r.holds, r.value, r.bound, detail, r.where, r.extra)


# -- C2 ----------------------------------------------------------------------------------------


def directional_selectivity(
    case: Case,
    config: VLAConfig,
    *,
    backend: BackendLike = "numpy",
    skip_nudge_steps: bool = False,
) -> InvariantResult:
    """Claim C2 (spec §3): penalising ``u_t`` shrinks ``A`` along it and leaves alone the
    directions orthogonal to it in the metric of ``M_{t-1}^{-1} = A_{t-1}``.

    Two statements, per ``(b, t, h)`` with ``u_t ≠ 0``:

    (a) ``u_tᵀA_t u_t < u_tᵀA_{t-1}u_t``.  Exactly, the decrease is ``g²/δ`` with
        ``g = u_tᵀA_{t-1}u_t`` and ``δ = max(1 + g, sm_floor)``; measured is the *increase*
        ``u_tᵀA_t u_t − u_tᵀA_{t-1}u_t``, judged against the rounding bound
        ``τ_t·||u_t||²`` with ``τ_t = (dk + 2)·u·(t·χ_t + 1)·(||A_{t-1}||₂ + ||A_t||₂)`` — the
        error model of C1 (:func:`sherman_morrison_exactness`, ``χ_t = ||M_t||·||A_0||``) for
        each computed ``A``: a larger increase is a certain violation; a smaller one (possible
        only when the exact decrease is below rounding) is not.
    (b) for every ``x`` with ``xᵀA_{t-1}u_t = 0`` (``x ⟂ s_t = A_{t-1}u_t``), ``A_t x = A_{t-1}x``.
        Measured: ``||(A_t − A_{t-1}) P_t||₂`` with ``P_t = I − ŝŝᵀ``, against ``τ_t``.

    A nudge (``A += nudge_eta·I``, spec §2.3) touches every direction; ``skip_nudge_steps=True``
    leaves out the steps where it fires, otherwise they are judged like the others.
    ``A_t`` comes from ``backend`` (float64).
    """
    name = "directional_selectivity"
    hist = backend_history(case, config, backend=backend)
    A = hist["A"]
    B, T, H, dk, _ = case.shapes
    if case.initial_state is None:
        A0 = np.broadcast_to(np.eye(dk) / config.lambda0, (B, H, dk, dk))
    else:
        A0 = case.initial_state[1]
    A_prev = np.concatenate([np.asarray(A0, dtype=np.float64)[:, None], A[:, :-1]], axis=1)
    u = case.u
    uu = np.sum(u * u, axis=-1)
    g_prev = np.einsum("bthi,bthij,bthj->bth", u, A_prev, u)
    g_now = np.einsum("bthi,bthij,bthj->bth", u, A, u)
    scale = np.linalg.norm(A_prev, ord=2, axis=(-2, -1)) + np.linalg.norm(A, ord=2, axis=(-2, -1))
    # Each computed A_t is off by at most the C1 error model, (dk+2)·t·u·χ_t relative, whatever
    # the algorithm (a chunked backend does not compute A_t from A_{t-1}).
    M0 = np.linalg.inv(np.asarray(A0, dtype=np.float64))
    M = M0[:, None] + np.cumsum(u[..., :, None] * u[..., None, :], axis=1)
    chi = (
        np.linalg.norm(M, ord=2, axis=(-2, -1))
        * np.linalg.norm(np.asarray(A0, dtype=np.float64), ord=2, axis=(-2, -1))[:, None]
    )
    t_idx = np.arange(1, T + 1)[None, :, None]
    tol = (dk + 2) * _U64 * (t_idx * np.maximum(chi, 1.0) + 1.0) * scale
    increase = g_now - g_prev
    bound_a = tol * uu
    s = np.einsum("bthij,bthj->bthi", A_prev, u)
    s_norm = np.linalg.norm(s, axis=-1, keepdims=True)
    s_hat = np.where(s_norm > 0, s / np.where(s_norm > 0, s_norm, 1.0), 0.0)
    P = np.eye(dk) - s_hat[..., :, None] * s_hat[..., None, :]
    touched = np.linalg.norm((A - A_prev) @ P, ord=2, axis=(-2, -1))
    active = uu > 0
    if skip_nudge_steps:
        nudged = np.array([config.nudges_at(t + 1) for t in range(T)])[None, :, None]
        active = active & ~nudged
    # Inactive steps (u = 0, or skipped) are judged against an infinite bound.
    bound_a = np.where(active, bound_a, np.inf)
    bound_b = np.where(active, tol, np.inf)
    ra = _result(name, increase, bound_a, "")
    rb = _result(name, touched, bound_b, "")
    qa, qb = _ratio(ra.value, ra.bound), _ratio(rb.value, rb.bound)
    worst, which = (ra, "(a) increase of uᵀA u") if qa >= qb else (rb, "(b) change orthogonal to s")
    b, t, h = worst.where
    detail = (
        f"C2: (a) largest increase of u_tᵀA u_t over a step {ra.value:.3e} (rounding bound "
        f"{ra.bound:.3e}) at (b={ra.where[0]}, t={ra.where[1] + 1}, h={ra.where[2]}); "
        f"(b) largest ||(A_t − A_t-1)P_t||₂ {rb.value:.3e} (bound {rb.bound:.3e}) at "
        f"(b={rb.where[0]}, t={rb.where[1] + 1}, h={rb.where[2]}); reported: {which}; "
        f"{int(np.sum(active))} of {active.size} steps judged"
        + ("" if skip_nudge_steps else f", nudge_period={config.nudge_period}")
    )
    return InvariantResult(
        name,
        ra.holds and rb.holds,
        worst.value,
        worst.bound,
        detail,
        (b, t, h),
        {
            "a_holds": ra.holds,
            "b_holds": rb.holds,
            "a": (ra.value, ra.bound),
            "b": (rb.value, rb.bound),
        },
    )


# -- C3 ----------------------------------------------------------------------------------------


def closed_form_equivalence(
    case: Case,
    config: VLAConfig,
    *,
    variant: str = "vla",
    backend: BackendLike = "numpy",
    history: dict[str, np.ndarray] | None = None,
) -> InvariantResult:
    """Claim C3 (spec §3): ``S_t = argmin_S Σ_{s≤t} ||v_s − S k̂_s||² + tr(S M_t Sᵀ)`` for all t.

    The argmin is ``S*_t = C_t G_t^{-1}`` with ``C_t = Σ v_s k̂_sᵀ``, ``G_t = Σ k̂_s k̂_sᵀ + M_t``
    (:func:`~vla_verify.closed_forms.argmin_state`).  The recurrence runs from ``S_0 = 0``,
    ``A_0 = I/lambda0`` (a case's initial state is ignored: the objective has no prior term)
    and ``M_t = lambda0·I + Σ u uᵀ`` (nudges, if ``config`` has them, are not in ``M_t``).

    Measured: ``||S_t − S*_t||_F / max_{s≤t} ||C_s||_F·||G_s^{-1}||₂`` (the denominator bounds
    the largest ``||S*_s||_F`` so far and does not vanish with it).  Error model (first order):
    each step commits rounding of ``γ_{dk+dv+4}`` times the state's size, magnified by the
    cancellation in the downdates and by ``κ(G_t)``, both at most
    ``χ_t = ||G_t||₂·||G_0^{-1}||₂ = λ_max(G_t)/lambda0``: bound ``(dk + dv + 4)·t·u·χ_t``.
    ``rls`` should hold; ``vla`` is not the argmin of this objective (see
    :func:`vla_verify.proofs.symbolic.prove_vla_step_objective` for the one it minimises).

    ``history`` (``S [B,T,H,dv,dk]`` at least), when given, is the recurrence's history to judge
    instead of ``backend``'s: the claims ledger passes the escalated reference's where the
    float64 run cannot vouch for a violation (:func:`vla_verify.proofs.claims.trusted_history`).
    """
    name = "closed_form_equivalence"
    if history is None:
        plain = Case(case.q, case.k, case.v, case.u, None, case.split, case.regimes, case.seed)
        history = backend_history(plain, config, backend=backend, variant=variant)
    S = history["S"]
    T, dk, dv = case.shapes[1], case.shapes[3], case.shapes[4]
    ref = argmin_state(case.k, case.v, case.u, config.lambda0, norm_eps=config.norm_eps)
    k_hat = unit_normalize(case.k, config.norm_eps)
    C = np.cumsum(case.v[..., :, None] * k_hat[..., None, :], axis=1)
    G = np.cumsum(k_hat[..., :, None] * k_hat[..., None, :], axis=1) + penalty_matrix(
        case.u, config.lambda0
    )
    w = np.linalg.eigvalsh(G)
    # The largest size the state took so far, ||C_s||_F·||G_s^{-1}||₂ >= ||S*_s||_F, s <= t.
    scale = np.maximum.accumulate(np.linalg.norm(C, axis=(-2, -1)) / w[..., 0], axis=1)
    diff = np.linalg.norm(S - ref, axis=(-2, -1))
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = np.where(scale > 0, diff / np.where(scale > 0, scale, 1.0), diff)
    t = np.arange(1, T + 1)[None, :, None]
    chi = w[..., -1] / config.lambda0  # ||G_t||₂·||G_0^{-1}||₂ >= κ(G_t)
    bound = (dk + dv + 4) * t * _U64 * chi
    r = _result(name, rel, bound, "")
    b, tt, h = r.where
    first_bad = np.argwhere(rel > bound)
    first = int(first_bad[:, 1].min()) + 1 if len(first_bad) else None
    detail = (
        f"C3 ({variant}): max relative distance of S_t from the argmin {r.value:.3e} at (b={b}, "
        f"t={tt + 1}, h={h}) against the error-model bound (dk+dv+4)·t·u·χ_t = "
        f"{r.bound:.3e}; "
        + (f"first violated at t={first}" if first else "no step violates it")
        + ("" if case.initial_state is None else "; the case's initial state was ignored")
    )
    return InvariantResult(name, r.holds, r.value, r.bound, detail, r.where, {"first_t": first})


# -- C4 ----------------------------------------------------------------------------------------


def rank_one_sigma_max(c: np.ndarray | float) -> np.ndarray:
    """``||I − a bᵀ||₂`` for unit ``a, b`` with ``c = aᵀb`` (d >= 2): the larger root
    ``sqrt((3 − 2c + sqrt(5 − 4c))/2)`` (proved in
    :func:`vla_verify.proofs.symbolic.prove_rank_one_singular_values`)."""
    c = np.asarray(c, dtype=np.float64)
    return np.sqrt((3.0 - 2.0 * c + np.sqrt(np.maximum(5.0 - 4.0 * c, 0.0))) / 2.0)


def oracle_history(case: Case, config: VLAConfig, variant: str = "vla") -> StateHistory:
    """Every intermediate state of the float64 oracle on ``case`` (spec §2.3), ``[B, T, H, …]``."""
    h = recurrence(
        case.q,
        case.k,
        case.v,
        case.u,
        config=config,
        variant=variant,
        initial_state=case.initial_state,
        return_states=True,
    ).history
    assert h is not None
    return h


def _step_matrices_oracle(case: Case, config: VLAConfig, variant: str) -> np.ndarray:
    """The linear part ``X_t`` of each step, ``S_t = S_{t-1} X_t + …``: ``[B, T, H, dk, dk]``."""
    h = oracle_history(case, config, variant)
    dk = case.shapes[3]
    eye = np.eye(dk)
    if variant in ("vla", "delta"):
        return eye - h.k_hat[..., :, None] * h.gate[..., None, :]
    if variant == "linear":
        return np.broadcast_to(eye, (*h.k_hat.shape, dk)).copy()
    # rls: S_t = S_{t-1}(I − k̂ (P k̂)ᵀ − u (P u)ᵀ) + v (P k̂)ᵀ
    Pu = np.einsum("bthij,bthj->bthi", h.A, case.u)
    return (
        eye - h.k_hat[..., :, None] * h.gate[..., None, :] - case.u[..., :, None] * Pu[..., None, :]
    )


def _step_matrices_backend(
    case: Case, config: VLAConfig, backend: BackendLike, variant: str
) -> np.ndarray:
    """``X_t`` of a backend, read off by running one token from perturbed states.

    ``S_t`` is affine in ``S_{t-1}`` (spec §2.3), so ``X_t`` row by row is exact differences:
    the run from ``S_{t-1} + E_i`` (``E_i`` puts a unit row ``e_iᵀ`` in row 0 of ``S``) minus
    the run from ``S_{t-1}``.  The perturbed copies ride along the batch axis.
    """
    b = resolve_backend(backend, variant)
    hist = backend_history(case, config, backend=b, variant=variant)
    B, T, H, dk, dv = case.shapes
    X = np.empty((B, T, H, dk, dk))
    if case.initial_state is None:
        S0 = np.zeros((B, H, dv, dk))
        A0 = np.broadcast_to(np.eye(dk) / config.lambda0, (B, H, dk, dk))
        z0 = np.zeros((B, H, dk))
    else:
        S0, A0, z0 = case.initial_state
    reps = dk + 1
    S_prev = np.concatenate([np.asarray(S0, np.float64)[:, None], hist["S"][:, :-1]], axis=1)
    A_prev = np.concatenate(
        [np.broadcast_to(np.asarray(A0, np.float64), (B, H, dk, dk))[:, None], hist["A"][:, :-1]],
        axis=1,
    )
    z_prev = np.concatenate([np.asarray(z0, np.float64)[:, None], hist["z"][:, :-1]], axis=1)
    # The nudge clock restarts in a one-token run: run the steps where the global step nudges
    # with nudge_period=1 and the others without nudges — at most two calls, batched over
    # (perturbation, step, batch).
    nudged = np.array([config.nudges_at(t + 1) for t in range(T)])
    for flag in (False, True):
        steps = np.flatnonzero(nudged == flag)
        if steps.size == 0:
            continue
        n = steps.size
        S = S_prev[:, steps]  # [B, n, H, dv, dk]
        eps = np.maximum(1.0, np.max(np.abs(S), axis=(0, 2, 3, 4)))  # [n]
        Sr = np.repeat(S[None], reps, axis=0)  # [reps, B, n, H, dv, dk]
        Sr[1:, :, :, :, 0, :] += eps[None, None, :, None, None] * np.eye(dk)[:, None, None, None, :]
        flat = reps * B * n
        state = (
            Sr.reshape(flat, H, dv, dk),
            np.repeat(A_prev[:, steps][None], reps, 0).reshape(flat, H, dk, dk),
            np.repeat(z_prev[:, steps][None], reps, 0).reshape(flat, H, dk),
        )
        tok = [
            np.repeat(x[:, steps][None], reps, 0).reshape(flat, 1, H, -1)
            for x in (case.q, case.k, case.v, case.u)
        ]
        step_config = config.replace(nudge_period=1 if flag else None)
        _, (S1, _, _) = run_backend(b, tuple(tok), step_config, initial_state=state)
        S1 = S1.reshape(reps, B, n, H, dv, dk)
        rows = (S1[1:, ..., 0, :] - S1[0][None, ..., 0, :]) / eps[None, None, :, None, None]
        X[:, steps] = np.transpose(rows, (1, 2, 3, 0, 4))  # [B, n, H, dk(row), dk]
    return X


def _step_matrices(
    case: Case, config: VLAConfig, backend: BackendLike | None, variant: str
) -> np.ndarray:
    if backend is None or _is_oracle(backend):
        return _step_matrices_oracle(case, config, variant)
    return _step_matrices_backend(case, config, backend, variant)


def jacobian_step_norms(
    case: Case,
    config: VLAConfig,
    *,
    backend: BackendLike | None = None,
    variant: str = "vla",
) -> np.ndarray:
    """Claim C4 (spec §3): ``||J_t||₂`` per step, ``[B, T, H]`` float64.

    ``J_t = ∂S_t/∂S_{t-1}`` acts on ``S`` as ``S ↦ S X_t`` with ``X_t = I − k̂_t α̂_tᵀ`` (spec
    §2.3), i.e. ``I_dv ⊗ X_tᵀ`` on ``vec(S)``, so ``||J_t||₂ = ||X_t||₂`` whatever ``dv``.
    ``backend=None`` (default) builds ``X_t`` from the oracle's ``k̂_t`` and gate; a backend's
    ``X_t`` is read off by differences (:func:`_step_matrices_backend`).  Normalised or
    unnormalised gates follow ``config.normalize_gate``.
    """
    X = _step_matrices(case, config, backend, variant)
    return _spectral_norm(X)


def jacobian_product_norm(
    case: Case,
    config: VLAConfig,
    *,
    backend: BackendLike | None = None,
    variant: str = "vla",
    cumulative: bool = False,
) -> np.ndarray:
    """Claim C4 (spec §3): ``log10 ||J_T ⋯ J_1||₂`` per ``(b, h)`` — **log10**, ``[B, H]``
    (``cumulative=True``: ``log10 ||J_t ⋯ J_1||₂`` for every ``t``, ``[B, T, H]``).

    The product acts as ``S ↦ S X_1 X_2 ⋯ X_t``.  It is accumulated with a rescaling after each
    factor (``P ← P X_t / ||P X_t||_F``, the logs of the scales summed), so neither overflow
    (unnormalised gates, ~1e32 after 25 steps) nor underflow (products of projections) spoils it.
    A product that is exactly singular gives ``-inf``.
    """
    X = _step_matrices(case, config, backend, variant)
    B, T, H, dk, _ = X.shape
    P = np.broadcast_to(np.eye(dk), (B, H, dk, dk)).copy()
    log_scale = np.zeros((B, H))
    out = np.empty((B, T, H))
    with np.errstate(divide="ignore", invalid="ignore"):
        for t in range(T):
            P = P @ X[:, t]
            f = np.linalg.norm(P, axis=(-2, -1))
            ok = (f > 0) & np.isfinite(f)
            log_scale = np.where(ok, log_scale + np.log10(np.where(ok, f, 1.0)), -np.inf)
            P = np.where(ok[..., None, None], P / np.where(ok, f, 1.0)[..., None, None], 0.0)
            two = _spectral_norm(P)
            out[:, t] = np.where(ok, log_scale + np.log10(np.where(two > 0, two, 1.0)), -np.inf)
    return out if cumulative else out[:, -1]


def _unit_gate_steps(case: Case, config: VLAConfig) -> tuple[np.ndarray, np.ndarray]:
    """``c_t = α̂_tᵀk̂_t`` from the oracle ``[B, T, H]``, and where the hypotheses of C4 hold:
    the oracle is finite and ``k̂_t``, ``α̂_t`` are unit (a zero key or a zero gate ``A_t k̂_t = 0``
    — possible for an indefinite initial ``A`` — is left as the zero vector by ``normalize``)."""
    h = oracle_history(case, config)
    c = np.sum(h.k_hat * h.gate, axis=-1)
    nk = np.linalg.norm(h.k_hat, axis=-1)
    ng = np.linalg.norm(h.gate, axis=-1)
    unit = (np.abs(nk - 1.0) < 1e-12) & (np.abs(ng - 1.0) < 1e-12)
    return c, unit & np.isfinite(c)


def unit_jacobian(
    case: Case, config: VLAConfig, *, backend: BackendLike | None = None
) -> InvariantResult:
    """Claim C4 as stated (spec §3, Proposition 2): ``||J_t||₂ = 1`` for every t.

    Measured: ``| ||J_t||₂ − 1 |`` per step against the rounding of ``X_t`` and of its SVD,
    ``(dk + 2)·u·||X_t||_F``.  (For unit ``k̂, α̂`` the norm is 1 only when ``α̂ ∥ k̂``:
    :func:`rank_one_sigma_max`.)
    """
    X = _step_matrices(case, config, backend, "vla")
    norms = _spectral_norm(X)
    dk = case.shapes[3]
    _, judged = _unit_gate_steps(case, config)
    bound = np.where(judged, (dk + 2) * _U64 * np.linalg.norm(X, axis=(-2, -1)), np.inf)
    r = _result("unit_jacobian", np.where(judged, np.abs(norms - 1.0), 0.0), bound, "")
    b, t, h = r.where
    detail = (
        f"C4: largest | ||J_t||₂ − 1 | = {r.value:.3e} at (b={b}, t={t + 1}, h={h}) "
        f"(||J_t||₂ = {norms[b, t, h]:.17g}) against rounding {r.bound:.3e}; per-step norms "
        f"range over [{np.nanmin(norms):.6g}, {np.nanmax(norms):.6g}]; "
        f"{int(np.sum(judged))} of {judged.size} steps judged (unit k̂ and α̂, finite oracle)"
    )
    extra = {"max_norm": float(np.nanmax(norms)), "min_norm": float(np.nanmin(norms))}
    return InvariantResult(r.name, r.holds, r.value, r.bound, detail, r.where, extra)


def _differencing_error(case: Case, config: VLAConfig, dk: int) -> np.ndarray:
    """``[T]``: a bound on the error of a backend's ``||X_t||₂`` read off by differences
    (:func:`_step_matrices_backend`): each of the two one-token runs rounds at the scale of its
    ``S_t`` (``(dk + 2)·u`` per entry, as one step of spec §2.3), the difference is divided by the
    perturbation ``eps_t``, and ``dk`` entries per row bound the spectral norm of the error.
    Found missing by Hypothesis: large values (|v| ~ 200) made the differences' rounding 1.2x the
    bound without this term."""
    hist = oracle_history(case, config, "vla")
    B, _, H, dv, _ = hist.S.shape
    S0 = np.zeros((B, H, dv, dk)) if case.initial_state is None else case.initial_state[0]
    S_prev = np.concatenate([np.asarray(S0, np.float64)[:, None], hist.S[:, :-1]], axis=1)
    eps = np.maximum(1.0, np.max(np.abs(S_prev), axis=(0, 2, 3, 4)))  # as in the read-off
    S_t = np.max(np.abs(hist.S), axis=(0, 2, 3, 4))
    return 2.0 * (dk + 2) * _U64 * dk * (2.0 * S_t + GOLDEN_RATIO * eps) / eps


def jacobian_norm_formula(
    case: Case, config: VLAConfig, *, backend: BackendLike | None = None
) -> InvariantResult:
    """Claim C4, corrected (spec §3): ``||J_t||₂ = σ₊(c_t)`` with ``c_t = α̂_tᵀk̂_t`` and
    ``σ₊(c)² = (3 − 2c + sqrt(5 − 4c))/2`` (normalised gates; proved symbolically), hence
    ``1 <= ||J_t||₂ < φ = 1.618…`` whenever ``c_t > 0`` (SPD ``A_t``).

    ``c_t`` comes from the oracle; ``||J_t||₂`` from ``backend`` (by differences) or the oracle.
    Measured: ``| ||J_t||₂ − σ₊(c_t) |`` against ``(dk + 2)·u·(sqrt(dk) + 2)·(1 + t·χ_t)``:
    forming ``X_t`` and its SVD, plus the backend's own error in ``A_t`` (the C1 model,
    ``χ_t = ||M_t||·||A_0||``); ``σ₊`` is 1-Lipschitz in ``c`` on ``[−1, 1]``.
    """
    if not config.normalize_gate:
        raise UnsupportedConfigurationError(
            "invariant", "the formula is for unit gates (normalize_gate=True)", "config"
        )
    c, judged = _unit_gate_steps(case, config)
    X = _step_matrices(case, config, backend, "vla")
    norms = _spectral_norm(X)
    expected = rank_one_sigma_max(c)
    dk = case.shapes[3]
    if dk == 1:  # d = 1: X = 1 − c, a scalar
        expected = np.abs(1.0 - c)
    # The backend's A_t (hence α̂_t and X_t) is off by the C1 error model, (dk+2)·t·u·χ_t;
    # forming X_t = I − k̂α̂ᵀ and its SVD adds (dk+2)·u·(sqrt(dk) + 2); σ₊ is 1-Lipschitz in c.
    B, T, H = c.shape
    u_ = case.u
    if case.initial_state is None:
        A0 = np.broadcast_to(np.eye(dk) / config.lambda0, (B, H, dk, dk))
    else:
        A0 = np.asarray(case.initial_state[1], dtype=np.float64)
    with np.errstate(all="ignore"):
        M = np.linalg.pinv(A0)[:, None] + np.cumsum(u_[..., :, None] * u_[..., None, :], axis=1)
        chi = (
            np.linalg.norm(M, ord=2, axis=(-2, -1))
            * np.linalg.norm(A0, ord=2, axis=(-2, -1))[:, None]
        )
    t_idx = np.arange(1, T + 1)[None, :, None]
    bound = (dk + 2) * _U64 * (np.sqrt(dk) + 2.0) * (1.0 + t_idx * np.nan_to_num(chi, nan=1.0))
    if backend is not None and not _is_oracle(backend):
        bound = bound + _differencing_error(case, config, dk)[None, :, None]
    bound = np.where(judged, bound, np.inf)
    r = _result("jacobian_norm_formula", np.where(judged, np.abs(norms - expected), 0.0), bound, "")
    b, t, hh = r.where
    detail = (
        f"C4 corrected: largest | ||J_t||₂ − σ₊(c_t) | = {r.value:.3e} at (b={b}, t={t + 1}, "
        f"h={hh}) (c = {c[b, t, hh]:.6g}, measured {norms[b, t, hh]:.6g}) against {r.bound:.3e}; "
        f"max ||J_t||₂ = {np.nanmax(np.where(judged, norms, np.nan), initial=0.0):.6g} (golden "
        f"ratio {GOLDEN_RATIO:.6g}), min c = "
        f"{np.nanmin(np.where(judged, c, np.nan), initial=1):.3g}; {int(np.sum(judged))} of "
        f"{judged.size} steps judged (unit k̂ and α̂, finite oracle)"
    )
    judged_norms = np.where(judged, norms, np.nan)
    return InvariantResult(
        r.name,
        r.holds,
        r.value,
        r.bound,
        detail,
        r.where,
        {
            "max_norm": float(np.nanmax(judged_norms, initial=0.0)),
            "min_c": float(np.nanmin(np.where(judged, c, np.nan), initial=1.0)),
        },
    )


# -- C5 ----------------------------------------------------------------------------------------


def state_norms(
    case: Case,
    config: VLAConfig,
    *,
    variant: str = "vla",
    backend: BackendLike = "numpy",
    history: dict[str, np.ndarray] | None = None,
) -> np.ndarray:
    """Claim C5 (spec §3, Proposition 1): ``||S_t||_F`` for every t, ``[B, T, H]`` float64,
    from ``backend`` running ``variant`` (``linear`` is the O(T) baseline), or from ``history``
    (``S [B,T,H,dv,dk]``) when given: the claims ledger's trusted history
    (:func:`vla_verify.proofs.claims.trusted_history`)."""
    if history is None:
        history = backend_history(case, config, backend=backend, variant=variant)
    return np.linalg.norm(history["S"], axis=(-2, -1))


# -- agreement and carry -----------------------------------------------------------------------


def oracle_agreement(
    case: Case,
    config: VLAConfig,
    *,
    backend: BackendLike,
    dtype: str = "float64",
    variant: str = "vla",
) -> InvariantResult:
    """Spec §4: the backend's ``o`` and final ``(S, A, z)`` agree with the float64 oracle within
    the error budget of :mod:`vla_verify.error_model` (factor × the same-precision oracle's
    error + floor), per (batch, head) slice.

    ``value`` is the worst error/budget ratio, ``bound`` is 1.  A case outside the precision's
    envelope (the oracle itself not finite in ``dtype``) holds vacuously and says so.
    """
    from ..validation import evaluate_case

    b = resolve_backend(backend, variant)
    _check(b, config, Shapes(*case.shapes), dtype)
    outcome = evaluate_case(
        b,
        case,
        config=config,
        variant=variant,
        array=b.capabilities.array,
        dtype=dtype,
        device=_device(b),
        check_carry=False,
    )
    if outcome is None:
        return InvariantResult(
            "oracle_agreement",
            True,
            0.0,
            1.0,
            f"{b.name} ({dtype}): outside the precision's envelope (the oracle itself is not "
            "finite in this precision); nothing to judge",
        )
    failure, ratio = outcome
    detail = (
        f"{b.name} ({variant}, {dtype}): worst error/budget {ratio:.3g}"
        if failure is None
        else f"{b.name} ({variant}, {dtype}): {failure.describe()}"
    )
    return InvariantResult(
        "oracle_agreement", failure is None and ratio <= 1.0, float(ratio), 1.0, detail
    )


def state_carry(
    case: Case,
    config: VLAConfig,
    *,
    backend: BackendLike,
    cut: int | None = None,
    dtype: str = "float64",
    variant: str = "vla",
) -> InvariantResult:
    """Spec §4 state carry: the sequence run in two pieces — the second started from the state
    the backend returned for the first — equals the whole sequence, outputs and final state.

    Measured per (b, h): ``max |joined − whole|`` of ``o`` and of the final ``S, A, z``; each
    run may be off the float64 reference by its budget (:func:`vla_verify.error_model.compare`),
    so the two may differ by twice that: ``bound = 2 × budget``.  ``cut`` defaults to the case's
    ``split`` moved onto a multiple of ``nudge_period``.
    """
    from ..error_model import compare
    from ..validation import carry_cut, same_precision_runs

    name = "state_carry"
    b = resolve_backend(backend, variant)
    T = case.shapes[1]
    if cut is None:
        cut = carry_cut(case.split, T, config.nudge_period)
    if cut is None or not 1 <= cut < T:
        return InvariantResult(name, True, 0.0, 0.0, f"T={T}: no valid cut; nothing to judge")
    inputs = (case.q, case.k, case.v, case.u)
    seen = tuple(_rounded(x, dtype) for x in inputs)
    given = case.initial_state
    seen_state = None if given is None else tuple(_rounded(x, dtype) for x in given)
    ref = recurrence(*seen, config=config, variant=variant, initial_state=seen_state)
    bases = same_precision_runs(
        list(seen), seen_state, config=config, variant=variant, dtype=dtype, seed=case.seed
    )
    if not all(np.all(np.isfinite(x)) for r in [ref, *bases] for x in (r.o, *r.state)):
        return InvariantResult(
            name,
            True,
            0.0,
            0.0,
            f"{b.name} ({dtype}): outside the precision's envelope (the oracle itself is not "
            "finite); nothing to judge",
        )
    o, state = run_backend(b, seen, config, dtype=dtype, initial_state=seen_state)
    o1, state1 = run_backend(
        b, tuple(x[:, :cut] for x in seen), config, dtype=dtype, initial_state=seen_state
    )
    if not all(np.all(np.isfinite(x)) for x in state1):
        return InvariantResult(
            name,
            False,
            np.inf,
            0.0,
            f"{b.name} ({variant}, {dtype}): the state returned after token {cut} is not "
            "finite, although the oracle's is",
            (0, cut - 1, 0),
            {"cut": cut},
        )
    o2, state2 = run_backend(
        b, tuple(x[:, cut:] for x in seen), config, dtype=dtype, initial_state=state1
    )
    joined = np.concatenate([o1, o2], axis=1)
    pairs = {"o": (joined, o, ref.o, [r.o for r in bases])}
    for i, n in enumerate("SAz"):
        pairs[n] = (state2[i], state[i], ref.state[i], [r.state[i] for r in bases])
    values, bounds, names_ = [], [], []
    for n, (got, whole, reference, base) in pairs.items():
        budget = compare(n, whole, reference, base, dtype).budget  # [B, H]
        axes = (1, 3) if n == "o" else tuple(range(2, got.ndim))
        diff = np.abs(got - whole)
        diff = np.where(np.isnan(diff), np.inf, diff)
        values.append(np.max(diff, axis=axes))
        bounds.append(2.0 * budget)
        names_.append(n)
    value = np.stack(values, axis=-1)  # [B, H, 4]
    bound = np.stack(bounds, axis=-1)
    r = _result(name, value.transpose(0, 2, 1), bound.transpose(0, 2, 1), "")
    bb, which, h = r.where
    detail = (
        f"{b.name} ({variant}, {dtype}): cut after token {cut} of {T}; worst "
        f"|joined − whole| of {names_[which]} = {r.value:.3e} against 2×budget {r.bound:.3e} "
        f"in slice (b={bb}, h={h})"
    )
    return InvariantResult(name, r.holds, r.value, r.bound, detail, (bb, -1, h), {"cut": cut})


# -- the catalogue -----------------------------------------------------------------------------


@dataclass(frozen=True)
class InvariantInfo:
    """How an invariant is run: the claim it checks (spec §3/§4), the variants it applies to,
    whether it runs a backend, whether it needs an exact (nudge-free) configuration, and what it
    returns (``"result"``: an :class:`InvariantResult`; ``"array"``: a figure for the ledger)."""

    name: str
    claim: str
    fn: Callable[..., Any]
    variants: tuple[str, ...]
    runs_backend: bool
    exact_config: bool
    returns: str
    expected: str = ""  # what our own analysis predicts, for the reader (not used as a verdict)

    def applies(self, backend: BackendLike, variant: str, config: VLAConfig) -> str | None:
        """``None`` if the invariant can run ``backend`` on ``variant`` under ``config``, else
        the reason (the registry's, for an unavailable or unsupporting backend)."""
        if variant not in self.variants:
            return f"{self.name} applies to variants {self.variants}, not {variant!r}"
        if self.exact_config and config.nudge_period is not None:
            return f"{self.name} is stated without nudges (use VLAConfig.exact())"
        if not self.runs_backend:
            return None
        try:
            b = resolve_backend(backend, variant)
        except (BackendUnavailableError, UnsupportedConfigurationError) as exc:
            return str(exc)
        return b.check_support(config, Shapes(1, 1, 1, 1, 1), "float64", _device(b))


ALL_INVARIANTS: dict[str, InvariantInfo] = {
    info.name: info
    for info in (
        InvariantInfo(
            "sherman_morrison_exactness",
            "C1",
            sherman_morrison_exactness,
            ("vla",),
            True,
            True,
            "result",
            "holds",
        ),
        InvariantInfo(
            "directional_selectivity",
            "C2",
            directional_selectivity,
            ("vla",),
            True,
            False,
            "result",
            "holds without nudges; nudges break (b), can break (a)",
        ),
        InvariantInfo(
            "closed_form_equivalence",
            "C3",
            closed_form_equivalence,
            ("vla", "rls"),
            True,
            True,
            "result",
            "holds for rls, fails for vla",
        ),
        InvariantInfo(
            "jacobian_step_norms",
            "C4",
            jacobian_step_norms,
            ("vla", "rls", "delta", "linear"),
            True,
            False,
            "array",
        ),
        InvariantInfo(
            "jacobian_product_norm",
            "C4",
            jacobian_product_norm,
            ("vla", "rls", "delta", "linear"),
            True,
            False,
            "array",
        ),
        InvariantInfo(
            "unit_jacobian",
            "C4",
            unit_jacobian,
            ("vla",),
            True,
            False,
            "result",
            "fails unless every α̂_t ∥ k̂_t",
        ),
        InvariantInfo(
            "jacobian_norm_formula",
            "C4",
            jacobian_norm_formula,
            ("vla",),
            True,
            False,
            "result",
            "holds (normalised gates)",
        ),
        InvariantInfo(
            "state_norms",
            "C5",
            state_norms,
            ("vla", "rls", "delta", "linear"),
            True,
            False,
            "array",
        ),
        InvariantInfo(
            "oracle_agreement",
            "§4",
            oracle_agreement,
            ("vla", "rls", "delta", "linear"),
            True,
            False,
            "result",
            "holds",
        ),
        InvariantInfo(
            "state_carry",
            "§4",
            state_carry,
            ("vla", "rls", "delta", "linear"),
            True,
            False,
            "result",
            "holds",
        ),
    )
}
