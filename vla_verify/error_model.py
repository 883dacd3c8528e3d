"""The error budget of spec §4: how far an implementation may be from the float64 oracle.

Errors are measured per batch element and head (one *slice* per ``(b, h)``) as the largest
absolute difference, so that one wrong head cannot hide behind the scale of another.

For an implementation that computes in precision ``p``, the budget of a slice is

    budget = factor · err_p + floor,     floor = 2·eps_p · max|ref|  (see below for fp32/fp64)

where ``err_p`` is the error of the oracle itself run in precision ``p`` on the same (rounded)
inputs (the largest over a few runs that round differently, since one run can be lucky) —
FlashAttention's criterion: a kernel may be at most ``factor`` (default 2) times worse
than a straightforward implementation in its own precision — and the floor is the
representability error of the reference in ``p`` (FlashAttention's ``out + 0.3 − 0.3``).

For ``p = float64`` the oracle *is* the reference, so its own error cannot be measured against
itself.  We use the first-order error model of a backward-stable recurrence: forward error is
proportional to the unit roundoff times a condition factor that does not depend on the
precision, so ``err_64 ≈ (u_64/u_32) · err_32``.  The float32 run measures the condition
factor of each example.  Since the reference then carries an error of the same size as the
implementation's, the float64 budget is ``(factor + 1) · err_64 + floor`` (triangle
inequality).  ``tests/test_oracle_vs_mpmath.py`` checks this model against the mpmath solver.
The model assumes a backward-stable recurrence; where the float64 oracle is not (its own
accuracy estimate fails, spec §2.3's Sherman–Morrison chain cancelling) the reference is the
escalated mpmath result (:func:`vla_verify.oracle.reference`), more precise than float64, and the
float64 oracle's error is then *measured* against it: ``err_64`` is the larger of the model and
that measurement (``measured``), spec §4's criterion applied literally — a float64
implementation may be ``factor`` times worse than the straightforward float64 recurrence.

The floor.  For float32 and float64 it also allows for a correct implementation that merely
rounds in another order: ``floor = (dk + 2)·eps_p · max|ref|``, the a priori bound of one step's
longest inner product (``dk`` terms, plus the division and the update), scaled by the largest
magnitude involved.  The measured term ``err_p`` is a sample of one evaluation order (the
largest of a few); on a tiny example (T = 1, dk = 2) another order can land above twice that
sample by rounding luck alone — seen on the H200 with FMA contraction — while no bug hides
under ``(dk + 2)`` units of roundoff (a wrong formula is off by far more).  For bfloat16 and
float16 the baseline already rounds every operation to the low precision, which dwarfs this
allowance, so the floor there is the representability error ``2·eps_p · max|ref|`` alone.

A chunked implementation (spec §5) forms longer sums: inside a chunk of ``C`` tokens the read-out
``o_t = S_0 q_t + Σ_{i≤t} e_i (α̂_iᵀ q_t)`` and the Woodbury gate ``α_t = A_0 k̂_t − Σ_{j≤t} …``
run over up to ``C`` more terms, so its a priori bound is ``(dk + C + 2)·eps_p``:
:func:`vla_verify.validate` passes ``terms = dk + chunk_size`` when the implementation declares
its chunk size.  Only the floor grows; the measured factor stays spec §4's.

The floor's scale is the largest magnitude the quantity took during the run (``scale``), not
only its final value: ``A_t = A_{t-1} − s sᵀ/δ`` subtracts numbers of size ``1/lambda0`` to make
numbers of size ``1/(lambda0 + ||u||²)``, and the rounding error of that cancellation is
``u · 1/lambda0``, not ``u · |A_t|``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .spec import unit_roundoff

__all__ = ["DEFAULT_FACTOR", "REDUCE_AXES", "SliceComparison", "compare", "slice_max_abs"]

DEFAULT_FACTOR = 2.0

#: Axes reduced to form one (b, h) slice, per output name (layouts of spec §1).
REDUCE_AXES: dict[str, tuple[int, ...]] = {
    "o": (1, 3),  # [B, T, H, dv]
    "S": (2, 3),  # [B, H, dv, dk]
    "A": (2, 3),  # [B, H, dk, dk]
    "z": (2,),  # [B, H, dk]
}


def slice_max_abs(x: np.ndarray, name: str) -> np.ndarray:
    """``max |x|`` over each (b, h) slice: ``[B, H]``."""
    return np.max(np.abs(x), axis=REDUCE_AXES[name])


@dataclass(frozen=True)
class SliceComparison:
    """One output compared slice by slice against the reference."""

    name: str
    error: np.ndarray  # [B, H] max |got − ref|
    budget: np.ndarray  # [B, H]
    worst_index: tuple[int, ...]  # index into the full array of the worst element
    got_at_worst: float
    ref_at_worst: float
    #: The budget's terms per slice: ``budget = multiplier · baseline + floor`` (``multiplier``
    #: is ``factor``, or ``factor + 1`` in float64; ``baseline`` is ``err_p``).
    baseline: np.ndarray | None = None
    floor: np.ndarray | None = None
    multiplier: float = DEFAULT_FACTOR

    @property
    def passed(self) -> bool:
        return bool(np.all(np.isfinite(self.error)) and np.all(self.error <= self.budget))

    @property
    def ratio(self) -> float:
        """Worst error/budget over slices (> 1 fails; inf for non-finite output, 0 where a
        zero error meets a zero budget: an output exact where even the same-precision oracle
        is, as a query that underflows to zero makes it)."""
        with np.errstate(divide="ignore", invalid="ignore"):
            r = np.where(
                self.budget > 0, self.error / self.budget, np.where(self.error > 0, np.inf, 0.0)
            )
        r = np.where(np.isfinite(self.error), r, np.inf)
        return float(np.max(r)) if r.size else 0.0


def compare(
    name: str,
    got: np.ndarray,
    ref: np.ndarray,
    baseline: np.ndarray | Sequence[np.ndarray],
    dtype: str,
    *,
    factor: float = DEFAULT_FACTOR,
    scale: np.ndarray | None = None,
    terms: int = 1,
    measured: np.ndarray | None = None,
) -> SliceComparison:
    """Compare ``got`` with the float64 ``ref`` under the budget of the module docstring.

    ``baseline`` is the same-precision oracle's output, or several runs of it with different
    rounding (the largest error is used); for ``dtype="float64"`` the float32 oracle's output,
    rescaled by the model ``u_64/u_32``.  ``scale`` ``[B, H]`` is the largest
    magnitude the quantity took during the run (default: that of ``ref``).  ``terms`` is the
    length of one step's longest inner product (``dk``), for the float32/float64 floor.
    ``measured`` (float64 only) is the float64 oracle's own result where ``ref`` is more precise
    than float64 (the escalated reference of :func:`vla_verify.oracle.reference`): its error
    is then measured, not modelled, and ``err_64`` is the larger of the two.
    """
    diff = np.abs(got - ref)
    diff = np.where(np.isnan(diff), np.inf, diff)
    error = np.max(diff, axis=REDUCE_AXES[name])
    runs = [baseline] if isinstance(baseline, np.ndarray) else list(baseline)
    axes = REDUCE_AXES[name]
    base = np.max([np.max(np.abs(b - ref), axis=axes) for b in runs], axis=0)
    magnitude = slice_max_abs(ref, name)
    if scale is not None:
        magnitude = np.maximum(magnitude, scale)
    eps = 2.0 * unit_roundoff(dtype)
    if dtype in ("float32", "float64"):
        floor = max(terms + 2, 2) * eps * magnitude
    else:
        floor = 2.0 * eps * magnitude
    multiplier = factor + 1.0 if dtype == "float64" else factor
    if dtype == "float64":
        base = base * (unit_roundoff("float64") / unit_roundoff("float32"))
        if measured is not None:
            # A non-finite float64 run measures nothing (and must not make the budget infinite).
            own = np.abs(measured - ref)
            base = np.maximum(base, np.max(np.where(np.isfinite(own), own, 0.0), axis=axes))
    budget = multiplier * base + floor
    flat = int(np.argmax(diff))
    worst = tuple(int(i) for i in np.unravel_index(flat, diff.shape))
    return SliceComparison(
        name,
        error,
        budget,
        worst,
        float(got[worst]),
        float(ref[worst]),
        baseline=base,
        floor=np.broadcast_to(floor, budget.shape),
        multiplier=multiplier,
    )
