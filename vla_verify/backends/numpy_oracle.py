"""The float64 NumPy oracle: the step-by-step recurrence of spec §2.3 and the variants of §2.4.

This is the reference every other backend is judged against, so it is written to be read, not to
be fast: one Python loop over tokens, each step exactly the lines of spec §2.3 in that order,
vectorised over batch and heads.  It shares no numerical code with any kernel (spec §4, "the
oracle stays independent"): normalisation, the Sherman–Morrison downdate and the read-out are
written out here and nowhere else is imported from.

Precision.  ``dtype="float64"`` (default) and ``"float32"`` run natively.  ``"float16"`` and
``"bfloat16"`` emulate eager low-precision arithmetic: inputs are rounded to the dtype, every
operation computes in float32 (matrix products accumulate in float32) and its result is rounded
to the dtype, as PyTorch does in eager mode.  This is the *same-precision oracle* of spec §4, the
baseline that a low-precision kernel's error is measured against.

Memory is O(B·H·dk·(dk + dv)) unless ``return_states=True`` asks for every intermediate state.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from ..errors import ConfigError, IllConditionedError
from ..spec import (
    FLOAT_DTYPES,
    VLAConfig,
    check_config,
    check_inputs,
    check_start,
    check_variant,
    unit_roundoff,
)
from .oracle_accuracy import AccuracyTracker, Diagnostics
from .registry import Backend, Capabilities

__all__ = [
    "Diagnostics",
    "NumpyOracleBackend",
    "OracleResult",
    "StateHistory",
    "recurrence",
    "round_to_dtype",
]

Array = np.ndarray


class StateHistory(NamedTuple):
    """Every intermediate quantity, sequence-first (``[B, T, H, ...]``).

    ``S``: ``[B, T, H, dv, dk]``; ``A``: ``[B, T, H, dk, dk]`` (for ``rls``: ``P_t``);
    ``z``: ``[B, T, H, dk]``; ``k_hat``: normalised keys ``[B, T, H, dk]``; ``gate``: the write
    direction of the state update (``α̂_t`` for ``vla``, ``k̂_t`` for ``delta``, ``k_t`` for
    ``linear``, ``P_t k̂_t`` for ``rls``) ``[B, T, H, dk]``; ``sm_denominator``: ``δ_t``
    ``[B, T, H]`` (NaN for variants without a penalty chain).
    """

    S: Array
    A: Array
    z: Array
    k_hat: Array
    gate: Array
    sm_denominator: Array


class _OracleFields(NamedTuple):
    o: Array
    state: tuple[Array, Array, Array]
    history: StateHistory | None


class OracleResult(_OracleFields):
    """``o`` ``[B, T, H, dv]``, the final ``state = (S, A, z)``, and the optional history.

    It unpacks as the triple ``(o, state, history)``; ``diagnostics`` (an attribute, not a
    field) holds the oracle's own accuracy estimate
    (:class:`~vla_verify.backends.oracle_accuracy.Diagnostics`) when the call asked for it with
    ``diagnose=True``, else ``None``.
    """

    diagnostics: Diagnostics | None = None

    def with_diagnostics(self, diagnostics: Diagnostics | None) -> OracleResult:
        """This result with ``diagnostics`` attached."""
        result = OracleResult(self.o, self.state, self.history)
        result.diagnostics = diagnostics
        return result


def _round_bfloat16(x: Array) -> Array:
    """Round float32 values to the nearest bfloat16 (ties to even), kept in float32."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) & np.uint32(
        0xFFFF0000
    )
    return rounded.view(np.float32)


def round_to_dtype(x: Array, dtype: str) -> Array:
    """Round an array to ``dtype`` and return it in the dtype the oracle computes in.

    float64 → float64; float32 → float32; float16/bfloat16 → float32 holding values that are
    exactly representable in the low dtype.
    """
    if dtype == "float64":
        return np.asarray(x, dtype=np.float64)
    if dtype == "float32":
        return np.asarray(x, dtype=np.float32)
    if dtype == "float16":
        return np.asarray(x, dtype=np.float32).astype(np.float16).astype(np.float32)
    if dtype == "bfloat16":
        return _round_bfloat16(np.asarray(x, dtype=np.float32))
    raise ConfigError("dtype", f"expected one of {FLOAT_DTYPES}, got {dtype!r}")


def _rounding(dtype: str) -> tuple[type, Callable[[Array], Array]]:
    if dtype in ("float64", "float32"):
        return (np.float64 if dtype == "float64" else np.float32), (lambda x: x)
    return np.float32, (lambda x: round_to_dtype(x, dtype))


def recurrence(
    q: Any,
    k: Any,
    v: Any,
    u: Any,
    *,
    config: VLAConfig | None = None,
    variant: str = "vla",
    initial_state: tuple[Any, Any, Any] | None = None,
    dtype: str | None = None,
    return_states: bool = False,
    start: int = 0,
    diagnose: bool = False,
) -> OracleResult:
    """Run the recurrence of spec §2.3 (or a variant of §2.4) token by token.

    Parameters
    ----------
    q, k, u : array_like, ``[B, T, H, dk]``
    v : array_like, ``[B, T, H, dv]``
    config : VLAConfig, default the paper preset.
    variant : ``"vla"`` | ``"rls"`` | ``"delta"`` | ``"linear"``.
    initial_state : ``(S [B, H, dv, dk], A [B, H, dk, dk], z [B, H, dk])`` or None for
        ``S_0 = 0, A_0 = I/lambda0, z_0 = 0``.  For ``rls`` the ``A`` slot holds
        ``P = (Σ k̂k̂ᵀ + M)^{-1}``.  ``delta`` and ``linear`` carry ``A`` through unchanged.
    dtype : working precision (see the module docstring); default: the inputs' dtype.
    return_states : also return every intermediate state (memory O(T)).
    start : tokens consumed before this call (spec §2.3): the nudge fires after step ``t`` when
        ``(start + t) % nudge_period == 0``.
    diagnose : also track the oracle's own accuracy along the recurrence and attach the
        a-posteriori estimate as ``result.diagnostics`` (:mod:`.oracle_accuracy`; about twice
        the cost).  :func:`vla_verify.oracle.reference` acts on it.

    Returns
    -------
    OracleResult
        ``o`` ``[B, T, H, dv]``, ``state = (S, A, z)`` after the last token, and ``history``.
        Arrays are float64 for ``dtype="float64"`` and float32 otherwise.

    Notes
    -----
    ``rls`` (spec §2.4) is exact recursive least squares for the objective of spec §3 C3.  Its
    recursive form is a rank-2 update:  ``P_t^{-1} = P_{t-1}^{-1} + k̂_t k̂_tᵀ + u_t u_tᵀ`` (two
    Sherman–Morrison downdates) and
    ``S_t = S_{t-1} + (v_t − S_{t-1}k̂_t)(P_t k̂_t)ᵀ − (S_{t-1}u_t)(P_t u_t)ᵀ``.
    It is defined for the exact penalty only, so it refuses a configuration with nudges.
    """
    config = check_config(config)
    check_variant(variant)
    start = check_start(start)
    shapes = check_inputs(q, k, v, u, initial_state)
    B, T, H, dk, dv = shapes
    if dtype is None:
        dtype = str(np.asarray(q).dtype)
        dtype = dtype if dtype in FLOAT_DTYPES else "float64"
    if dtype not in FLOAT_DTYPES:
        raise ConfigError("dtype", f"expected one of {FLOAT_DTYPES}, got {dtype!r}")
    if variant == "rls" and config.nudge_period is not None:
        raise ConfigError(
            "config.nudge_period",
            "the rls variant is exact recursive least squares for the penalty M_t and is "
            "defined without nudges; use VLAConfig.exact() (nudge_period=None)",
        )
    work, r = _rounding(dtype)

    def cast(x: Any) -> Array:
        return round_to_dtype(np.asarray(x), dtype).astype(work, copy=False)

    # Heads next to batch: [B, H, T, D], so that each step reads a [B, H, D] slice.
    qs, ks, vs, us = (np.moveaxis(cast(x), 1, 2) for x in (q, k, v, u))
    eye = np.eye(dk, dtype=work)
    if initial_state is None:
        S = np.zeros((B, H, dv, dk), dtype=work)
        A = r(np.broadcast_to(eye / work(config.lambda0), (B, H, dk, dk)).copy())
        z = np.zeros((B, H, dk), dtype=work)
    else:
        S, A, z = (cast(x).copy() for x in initial_state)

    def matvec(M: Array, x: Array) -> Array:
        return r((M @ x[..., None])[..., 0])

    def dot(x: Array, y: Array) -> Array:
        return r((x[..., None, :] @ y[..., :, None])[..., 0, 0])

    def normalize(x: Array) -> Array:
        norm = r(np.sqrt(dot(x, x)))
        return r(x / np.maximum(norm, work(config.norm_eps))[..., None])

    def outer(x: Array, y: Array) -> Array:
        return r(x[..., :, None] * y[..., None, :])

    o = np.empty((B, H, T, dv), dtype=work)
    if return_states:
        hist = {
            "S": np.empty((B, H, T, dv, dk), dtype=work),
            "A": np.empty((B, H, T, dk, dk), dtype=work),
            "z": np.empty((B, H, T, dk), dtype=work),
            "k_hat": np.empty((B, H, T, dk), dtype=work),
            "gate": np.empty((B, H, T, dk), dtype=work),
            "sm_denominator": np.full((B, H, T), np.nan, dtype=work),
        }
    sm_floor = work(config.sm_floor)
    tracker = (
        AccuracyTracker(config, variant, (B, H, dk, dv), A, unit_roundoff=unit_roundoff(dtype))
        if diagnose
        else None
    )
    # Overflow is reported by the non-finite result, which callers check; no warnings per step.
    with np.errstate(over="ignore", invalid="ignore", divide="ignore", under="ignore"):
        for t in range(T):
            q_t, k_t, v_t, u_t = qs[:, :, t], ks[:, :, t], vs[:, :, t], us[:, :, t]
            delta = None
            if variant == "vla":
                s = matvec(A, u_t)
                delta_raw = r(1 + dot(u_t, s))
                delta = np.maximum(delta_raw, sm_floor)
                if tracker is not None:
                    tracker.downdate(u_t, s, delta_raw, config.sm_floor, A)
                A = r(A - r(outer(s, s) / delta[..., None, None]))
                if config.nudges_at(start + t + 1):
                    A = r(A + work(config.nudge_eta) * eye)
                    if tracker is not None:
                        tracker.nudge(config.nudge_eta)
                k_hat = normalize(k_t)
                alpha = matvec(A, k_hat)
                gate = normalize(alpha) if config.normalize_gate else alpha
                residual = r(v_t - matvec(S, k_hat))
                if tracker is not None:
                    tracker.gate(k_hat, alpha, config.normalize_gate, A)
                    tracker.memory(S, k_hat, gate, residual)
                S = r(S + outer(residual, gate))
            elif variant == "rls":
                k_hat = normalize(k_t)
                # Two Sherman–Morrison downdates: first the new key, then the new penalty direction.
                p = matvec(A, k_hat)
                key_denominator = r(1 + dot(k_hat, p))
                if tracker is not None:
                    tracker.downdate(k_hat, p, key_denominator, None, A)
                A = r(A - r(outer(p, p) / key_denominator[..., None, None]))
                s = matvec(A, u_t)
                delta_raw = r(1 + dot(u_t, s))
                delta = np.maximum(delta_raw, sm_floor)
                if tracker is not None:
                    tracker.downdate(u_t, s, delta_raw, config.sm_floor, A)
                A = r(A - r(outer(s, s) / delta[..., None, None]))
                gate = matvec(A, k_hat)
                residual = r(v_t - matvec(S, k_hat))
                w = matvec(A, u_t)
                if tracker is not None:
                    tracker.gate(k_hat, gate, False, A)
                    tracker.probe(u_t, w, A)
                    tracker.memory(S, k_hat, gate, residual, x=u_t, w=w)
                S = r(S + r(outer(residual, gate) - outer(matvec(S, u_t), w)))
            elif variant == "delta":
                k_hat = normalize(k_t)
                gate = k_hat
                residual = r(v_t - matvec(S, k_hat))
                if tracker is not None:
                    tracker.gate(k_hat, gate, False)
                    tracker.memory(S, k_hat, gate, residual)
                S = r(S + outer(residual, gate))
            else:  # linear
                k_hat = normalize(k_t)
                gate = k_t
                if tracker is not None:
                    tracker.gate(k_t, k_t, False)
                    tracker.memory(S, k_hat, k_t, v_t)
                S = r(S + outer(v_t, k_t))
            z = r(z + k_t)
            read = matvec(S, q_t)
            denominator = None
            if config.normalize_output:
                denominator = np.maximum(dot(z, q_t), work(config.out_eps))
                read = r(read / denominator[..., None])
            if tracker is not None:
                tracker.readout(S, q_t, read, denominator)
            o[:, :, t] = read
            if return_states:
                hist["S"][:, :, t] = S
                hist["A"][:, :, t] = A
                hist["z"][:, :, t] = z
                hist["k_hat"][:, :, t] = k_hat
                hist["gate"][:, :, t] = gate
                if delta is not None:
                    hist["sm_denominator"][:, :, t] = delta

    history = None
    if return_states:
        history = StateHistory(**{name: np.moveaxis(x, 2, 1) for name, x in hist.items()})
    result = OracleResult(np.moveaxis(o, 2, 1), (S, A, z), history)
    if tracker is not None:
        result = result.with_diagnostics(tracker.finish(S, A))
    return result


# -- the registry's view of the oracle ---------------------------------------------------------


class NumpyOracleBackend(Backend):
    """Registry name ``numpy``: :func:`recurrence` as a spec §4 callable (NumPy in, NumPy out).

    In float64 it tracks its own accuracy (``diagnose=True``) and raises
    :class:`~vla_verify.errors.IllConditionedError` where, on an SPD chain (no or an SPD initial
    ``A``), the estimate exceeds the option ``max_estimate`` (default 1e-2, relative): past it the
    float64 chain has lost the digits that any budget relies on, and
    :func:`vla_verify.oracle.reference` is the way to the answer.
    """

    name = "numpy"
    description = "float64 NumPy oracle, token by token (spec §2.3-§2.4)"
    capabilities = Capabilities(
        array="numpy",
        devices=("cpu",),
        dtypes=("float64", "float32", "float16"),
        differentiable=False,
        requires=("numpy",),
        options={"max_estimate": 1e-2},
    )

    def _run(self, q, k, v, u, *, config, initial_state, start=0):  # type: ignore[no-untyped-def]
        dtype = str(np.asarray(q).dtype)
        result = recurrence(
            q,
            k,
            v,
            u,
            config=config,
            variant=self.variant,
            initial_state=initial_state,
            dtype=dtype,
            start=start,
            diagnose=dtype == "float64",
        )
        diag = result.diagnostics
        limit = float(self.options["max_estimate"])
        # Outside the SPD cone (an indefinite initial A) the estimate is first order only, and
        # no refusal is based on it there.
        if diag is not None and diag.spd_chain and not diag.estimate <= limit:
            where = diag.worst + ("" if diag.step is None else f" at step {diag.step}")
            raise IllConditionedError(
                f"the float64 oracle's error estimate {diag.estimate:.3g} exceeds "
                f"max_estimate={limit:g} ({where}); use vla_verify.oracle.reference, which "
                "escalates to mpmath",
                step=diag.step,
                figure=diag.worst,
                estimate=diag.estimate,
            )
        cast = getattr(np, dtype)
        S, A, z = result.state
        return result.o.astype(cast), (S.astype(cast), A.astype(cast), z.astype(cast))
