"""The oracle's public API: the reference, the float64 recurrence and the closed forms.

Kernel authors import this module to check their own implementations::

    from vla_verify import oracle
    ref = oracle.reference(q, k, v, u, config=VLAConfig())   # o, state, error_estimate, method
    o, (S, A, z), _ = oracle.recurrence(q, k, v, u, config=VLAConfig())

- :func:`reference` — THE reference: the float64 recurrence with its own a-posteriori error
  estimate, escalated to mpmath at a precision chosen from the estimate where float64 is not
  enough, or :class:`~vla_verify.errors.IllConditionedError` where the case is too large to
  escalate (``docs/reference.md`` states the guarantee);

- :func:`reference_history` — every intermediate state of the reference, under the same rule
  (the float64 history, or the reference of every prefix);
- :func:`recurrence` — spec §2.3–§2.4 token by token (float64, or the same algorithm in float32,
  float16 or bfloat16 as the same-precision baseline of spec §4);
- :func:`recurrence_mp`, :func:`penalty_inverse_mp`, :func:`argmin_state_mp`,
  :func:`jacobian_spectral_norm_mp` — the same at ``dps`` digits (mpmath);
- :func:`penalty_inverse` — ``M_t^{-1}`` by Cholesky solves (claim C1);
- :func:`argmin_state` — the minimiser of spec §3 C3 by Cholesky solves;
- :func:`step_jacobian`, :func:`jacobian_spectral_norm` — the Jacobian of one state update
  (claim C4).
"""

from __future__ import annotations

import math
import numbers
from typing import Any, NamedTuple

import numpy as np

from .arrays import to_numpy
from .backends.mpmath_backend import (
    argmin_state_mp,
    jacobian_spectral_norm_mp,
    penalty_inverse_mp,
    recurrence_mp,
)
from .backends.numpy_oracle import (
    Diagnostics,
    OracleResult,
    StateHistory,
    recurrence,
    round_to_dtype,
)
from .closed_forms import (
    argmin_state,
    jacobian_spectral_norm,
    penalty_inverse,
    penalty_matrix,
    step_jacobian,
    unit_normalize,
)
from .errors import ConfigError, IllConditionedError
from .spec import check_config, check_inputs, check_start, check_variant

__all__ = [
    "DEFAULT_TARGET_RTOL",
    "ESTIMATE_SAFETY",
    "MAX_ESCALATION_WORK",
    "Diagnostics",
    "OracleResult",
    "ReferenceHistory",
    "ReferenceResult",
    "StateHistory",
    "argmin_state",
    "argmin_state_mp",
    "jacobian_spectral_norm",
    "jacobian_spectral_norm_mp",
    "penalty_inverse",
    "penalty_inverse_mp",
    "penalty_matrix",
    "recurrence",
    "recurrence_mp",
    "reference",
    "reference_history",
    "round_to_dtype",
    "step_jacobian",
    "unit_normalize",
]


#: Default accuracy the reference must reach (relative, per (b, h) slice, for ``o`` and for the
#: state): far below the float32 budgets and near the float64 floor ``(dk + 2)·eps`` times a
#: condition factor, so that a float64 kernel is never judged against a wrong reference.
DEFAULT_TARGET_RTOL = 1e-10
#: Largest ``B·H·T·dk·(dk + dv)`` escalated to mpmath (as the mpmath backend's ``max_work``).
MAX_ESCALATION_WORK = 200_000
#: Digits beyond what the estimate asks for, and the most the escalation tries.
_MARGIN_DIGITS = 10
_MAX_DIGITS = 1600
#: The factor by which the estimate may fall short of the true error on the cases the meta-test
#: measures (tests/meta/test_oracle_accuracy_estimate.py): float64 is accepted only where
#: ``_SAFETY · estimate <= target_rtol``.
_SAFETY = 20.0
#: The same factor, for callers that act on ``recurrence(..., diagnose=True)`` themselves.
ESTIMATE_SAFETY = _SAFETY


class ReferenceResult(NamedTuple):
    """What :func:`reference` returns: float64 ``o`` ``[B, T, H, dv]``, ``state = (S, A, z)``,
    ``error_estimate`` (relative, the larger of ``o``'s and the state's, per slice) and
    ``method``: ``"float64"`` or ``"mpmath(N digits)"``; ``diagnostics``: what the float64 run
    tracked (:class:`~vla_verify.backends.oracle_accuracy.Diagnostics`)."""

    o: np.ndarray
    state: tuple[np.ndarray, np.ndarray, np.ndarray]
    error_estimate: float
    method: str
    diagnostics: Diagnostics | None


def _relative(got: np.ndarray, ref: np.ndarray, axes: tuple[int, ...]) -> float:
    """``max over slices of ||got − ref|| / ||ref||`` (norms over ``axes``)."""
    with np.errstate(all="ignore"):
        err = np.sqrt(np.sum((got - ref) ** 2, axis=axes))
        size = np.sqrt(np.sum(ref**2, axis=axes))
        rel = np.where(size > 0, err / size, err)
    rel = np.where(np.isnan(rel), np.inf, rel)
    return float(np.max(rel)) if rel.size else 0.0


def _disagreement(a: tuple[Any, ...], b: tuple[Any, ...]) -> float:
    """Relative difference of two ``(o, (S, A, z))`` results, slice by slice (spec §1 layouts:
    ``o`` per (b, h) over time and value; each state part per (b, h))."""
    (o1, st1), (o2, st2) = a, b
    rel = [_relative(o1, o2, (1, 3))]
    rel += [_relative(x, y, tuple(range(2, x.ndim))) for x, y in zip(st1, st2, strict=True)]
    return max(rel)


def _check_target(target_rtol: Any) -> float:
    if isinstance(target_rtol, bool) or not isinstance(target_rtol, numbers.Real):
        raise ConfigError("target_rtol", f"expected a real number in (0, 1), got {target_rtol!r}")
    if not (0 < float(target_rtol) < 1):
        raise ConfigError("target_rtol", f"expected a real number in (0, 1), got {target_rtol!r}")
    return float(target_rtol)


def reference(
    q: Any,
    k: Any,
    v: Any,
    u: Any,
    *,
    config: Any = None,
    variant: str = "vla",
    initial_state: tuple[Any, Any, Any] | None = None,
    start: int = 0,
    target_rtol: float = DEFAULT_TARGET_RTOL,
    max_work: int = MAX_ESCALATION_WORK,
) -> ReferenceResult:
    """The reference result of spec §2.3–§2.4, accurate to ``target_rtol`` or an error.

    Inputs as :func:`recurrence` (``q, k, u`` ``[B, T, H, dk]``, ``v`` ``[B, T, H, dv]``, any
    float dtype, NumPy or torch; they are taken as float64 values).  Runs the float64 recurrence
    with its accuracy tracker (:mod:`vla_verify.backends.oracle_accuracy`).  If 20 times the
    estimate (its stated factor) is at most ``target_rtol`` the float64 result is returned
    (``method="float64"``).  Otherwise,
    when ``B·H·T·dk·(dk + dv) <= max_work``, the mpmath recurrence runs at
    ``N ≈ 16 + log10(estimate/target_rtol) + 10`` digits and again at more digits; the two must
    agree to ``target_rtol``, and no Sherman–Morrison subtraction of the first may have
    cancelled more than ``N − 10 − log10(1/target_rtol)`` digits (else ``N`` grows, up to 1600
    digits); the more precise is
    returned (``method="mpmath(N digits)"``, ``error_estimate`` their disagreement).  Else it
    raises :class:`~vla_verify.errors.IllConditionedError` naming the step and the figure:
    never a result it cannot vouch for.
    """
    target = _check_target(target_rtol)
    if isinstance(max_work, bool) or not isinstance(max_work, numbers.Integral) or max_work < 0:
        raise ConfigError("max_work", f"expected an integer >= 0, got {max_work!r}")
    config = check_config(config)
    check_variant(variant)
    start = check_start(start)
    B, T, H, dk, dv = check_inputs(q, k, v, u, initial_state)
    q, k, v, u = (to_numpy(x) for x in (q, k, v, u))
    if initial_state is not None:
        initial_state = tuple(to_numpy(x) for x in initial_state)  # type: ignore[assignment]
    kwargs: dict[str, Any] = dict(
        config=config, variant=variant, initial_state=initial_state, start=start
    )
    run = recurrence(q, k, v, u, dtype="float64", diagnose=True, **kwargs)
    diag = run.diagnostics
    assert diag is not None
    estimate = diag.estimate
    if _SAFETY * estimate <= target:
        return ReferenceResult(run.o, run.state, estimate, "float64", diag)
    work = B * H * T * dk * (dk + dv)
    where = f"{diag.worst}" + ("" if diag.step is None else f" at step {diag.step}")
    if work > max_work:
        raise IllConditionedError(
            f"the float64 reference's error estimate {estimate:.3g} exceeds target_rtol="
            f"{target:g} ({where}), and the case is too large to escalate to mpmath "
            f"(B·H·T·dk·(dk+dv) = {work} > max_work={max_work})",
            step=diag.step,
            figure=diag.worst,
            estimate=estimate,
        )
    if math.isfinite(estimate):
        digits = 16 + math.ceil(math.log10(estimate) - math.log10(target)) + _MARGIN_DIGITS
    else:
        digits = 16 + math.ceil(-math.log10(target)) + 4 * _MARGIN_DIGITS
    digits = min(max(digits, 30), _MAX_DIGITS)
    needed = _MARGIN_DIGITS - math.log10(target)  # digits to keep beyond any cancellation
    finite = True
    while digits <= _MAX_DIGITS:
        more = digits + max(2 * _MARGIN_DIGITS, digits // 2)
        *low, lost = recurrence_mp(q, k, v, u, dps=digits, return_lost_digits=True, **kwargs)
        if not lost + needed <= digits:
            # The run cancelled more digits than it can spare: agreement with a second run
            # would prove nothing (both may cancel to the same wrong value).
            digits = (
                max(2 * digits, math.ceil(lost + needed)) if math.isfinite(lost) else 2 * digits
            )
            continue
        high = recurrence_mp(q, k, v, u, dps=more, **kwargs)
        disagreement = _disagreement(tuple(low), high)
        finite = all(np.all(np.isfinite(x)) for x in (high[0], *high[1]))
        if finite and disagreement <= target:
            o, state = high
            return ReferenceResult(o, state, disagreement, f"mpmath({more} digits)", diag)
        digits *= 2
    overflow = not finite
    raise IllConditionedError(
        f"the float64 reference's error estimate {estimate:.3g} exceeds target_rtol={target:g} "
        f"({where}), and mpmath runs up to {_MAX_DIGITS} digits do not agree to it"
        + (" (their results overflow float64)" if overflow else ""),
        step=diag.step,
        figure="overflow" if overflow else diag.worst,
        estimate=estimate,
    )


class ReferenceHistory(NamedTuple):
    """What :func:`reference_history` returns, float64, sequence-first (spec §1 layouts with a
    time axis): ``o`` ``[B, T, H, dv]``, ``S`` ``[B, T, H, dv, dk]``, ``A`` ``[B, T, H, dk, dk]``,
    ``z`` ``[B, T, H, dk]`` (the state after each step), and ``method``: ``"float64"`` or
    ``"reference of every prefix"``."""

    o: np.ndarray
    S: np.ndarray
    A: np.ndarray
    z: np.ndarray
    method: str


def reference_history(
    q: Any,
    k: Any,
    v: Any,
    u: Any,
    *,
    config: Any = None,
    variant: str = "vla",
    initial_state: tuple[Any, Any, Any] | None = None,
    start: int = 0,
    target_rtol: float = DEFAULT_TARGET_RTOL,
    max_work: int = MAX_ESCALATION_WORK,
) -> ReferenceHistory:
    """Every intermediate state of spec §2.3–§2.4, each accurate to ``target_rtol``, or an error.

    Inputs as :func:`reference`.  The float64 history where ``20 × estimate <= target_rtol``
    (the estimate of the whole run: ``error_o`` is a maximum over the steps, the state's is the
    end of the perturbation the tracker carries through every step); else the state after step
    ``t`` is :func:`reference` of the prefix ``[:, :t]`` (the same ``initial_state`` and
    ``start``), for every ``t`` — allowed while the prefixes' total work
    ``B·H·dk·(dk + dv)·T(T + 1)/2`` is at most ``max_work``; else, or where a prefix's reference
    raises, :class:`~vla_verify.errors.IllConditionedError`.
    """
    target = _check_target(target_rtol)
    if isinstance(max_work, bool) or not isinstance(max_work, numbers.Integral) or max_work < 0:
        raise ConfigError("max_work", f"expected an integer >= 0, got {max_work!r}")
    config = check_config(config)
    check_variant(variant)
    start = check_start(start)
    B, T, H, dk, dv = check_inputs(q, k, v, u, initial_state)
    q, k, v, u = (to_numpy(x) for x in (q, k, v, u))
    if initial_state is not None:
        initial_state = tuple(to_numpy(x) for x in initial_state)  # type: ignore[assignment]
    kwargs: dict[str, Any] = dict(
        config=config, variant=variant, initial_state=initial_state, start=start
    )
    run = recurrence(q, k, v, u, dtype="float64", diagnose=True, return_states=True, **kwargs)
    diag, h = run.diagnostics, run.history
    assert diag is not None and h is not None
    if _SAFETY * diag.estimate <= target:
        return ReferenceHistory(run.o, h.S, h.A, h.z, "float64")
    work = B * H * dk * (dk + dv) * T * (T + 1) // 2
    if work > max_work:
        where = f"{diag.worst}" + ("" if diag.step is None else f" at step {diag.step}")
        raise IllConditionedError(
            f"the float64 reference's error estimate {diag.estimate:.3g} exceeds target_rtol="
            f"{target:g} ({where}), and its history is too large to escalate prefix by prefix "
            f"(B·H·dk·(dk+dv)·T(T+1)/2 = {work} > max_work={max_work})",
            step=diag.step,
            figure=diag.worst,
            estimate=diag.estimate,
        )
    o, S, A, z = (np.empty_like(x) for x in (run.o, h.S, h.A, h.z))
    for t in range(1, T + 1):
        ref = reference(
            *(x[:, :t] for x in (q, k, v, u)), target_rtol=target, max_work=max_work, **kwargs
        )
        o[:, t - 1] = ref.o[:, t - 1]
        S[:, t - 1], A[:, t - 1], z[:, t - 1] = ref.state
    return ReferenceHistory(o, S, A, z, "reference of every prefix")
