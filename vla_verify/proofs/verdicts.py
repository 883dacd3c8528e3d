"""The verdict rules of the claims ledger, in one place (docs/verdicts.md states them in words).

A claim module measures; the functions here turn the measurement into a verdict, so that each
rule is written once and tested on both sides (tests/meta/test_verdict_rules.py: a planted
setting where the claim provably holds gets HOLDS, one where it provably fails gets FAILS).

- :func:`growth_verdict` — "bounded independently of T" (C5): FAILS when the worst value found
  grows with T over the searched lengths (fitted exponent ≥ ``GROWTH_EXPONENT`` over the whole
  range *and* over its last decade); HOLDS only with a proof, or when a *calibrated* search
  (tests/meta/test_adversary_calibration.py) finds no growth over at least ``MIN_DECADES``
  decades of T; otherwise NOT_MEASURED (the evidence cannot decide).
- :func:`ceiling_verdict` — "never exceeds a ceiling" (C4.product: no explosion): FAILS when the
  search found a value above the ceiling that interval arithmetic certifies; HOLDS with a proof,
  or when a calibrated search found none; NOT_MEASURED otherwise.
- :func:`accuracy_verdict` — "exact in precision p" (C1 per precision): FAILS when the measured
  relative error exceeds its error-model budget or ``ACCURACY_LIMIT`` (1%) at some length, or when
  the high-precision reference disagrees with the direct solve beyond its own budget; HOLDS
  otherwise.
- :func:`figure_verdict` — a measured figure against the paper's (C6, C7): REPRODUCED when the
  measurement lies within the stated tolerance, NOT_REPRODUCED otherwise.
- :func:`cells_verdict` — a paper's figures checked cell by cell on trained models, each cell a
  mean over seeds (spec §3 C7, C10: ``C7.mqar.*``, ``C10.length``): NOT_REPRODUCED as soon as
  one cell measured on enough seeds disagrees; otherwise NOT_MEASURED while some cell lacks
  seeds (the verdict names them); REPRODUCED when every cell is measured and agrees.
  :func:`clearly_greater` is its test of "A is above B" between two such cells: the difference
  of the means beyond ``SEPARATION`` standard errors.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import VLAInputError
from .ledger import Verdict

__all__ = [
    "ACCURACY_LIMIT",
    "GROWTH_EXPONENT",
    "MIN_DECADES",
    "SEPARATION",
    "AccuracyAssessment",
    "CellsAssessment",
    "Comparison",
    "GrowthAssessment",
    "accuracy_verdict",
    "ceiling_verdict",
    "cells_verdict",
    "clearly_greater",
    "figure_verdict",
    "growth_verdict",
]

#: Growth exponent from which a quantity counts as growing with T (log-log slope).
GROWTH_EXPONENT = 0.1
#: Decades of T a search must span before "no growth found" may read HOLDS.
MIN_DECADES = 2.0
#: Relative error beyond which a low-precision inverse no longer counts as the inverse.
ACCURACY_LIMIT = 0.01
#: Standard errors of their difference by which one mean over seeds must exceed another to count
#: as greater (:func:`clearly_greater`): about a 2.5% one-sided chance under equal means.
SEPARATION = 2.0


def _fit(x: np.ndarray, y: np.ndarray) -> float:
    return float(np.polyfit(x, y, 1)[0])


@dataclass(frozen=True)
class GrowthAssessment:
    """What :func:`growth_verdict` decided and why."""

    verdict: Verdict
    exponent: float  # log-log least-squares slope over all lengths
    last_decade_exponent: float  # the same over the lengths in the last decade
    decades: float
    reason: str


def growth_verdict(
    lengths: Sequence[float],
    values: Sequence[float],
    *,
    calibrated: bool,
    proof: bool = False,
) -> GrowthAssessment:
    """Bounded-in-T rule (module docstring).  ``lengths``: increasing T; ``values``: the worst
    value found at each (e.g. ``sup_{t≤T} ||S_t||_F``); ``calibrated``: the search passed its
    calibration meta-tests; ``proof``: a proof of boundedness is established."""
    T = np.asarray(lengths, dtype=np.float64)
    y = np.asarray(values, dtype=np.float64)
    if T.ndim != 1 or T.size < 3 or T.shape != y.shape:
        raise VLAInputError("lengths", "expected ≥ 3 lengths with one value each")
    if np.any(np.diff(T) <= 0) or T[0] <= 0:
        raise VLAInputError("lengths", f"expected increasing positive lengths, got {T.tolist()}")
    if not np.all(np.isfinite(y)):
        return GrowthAssessment(
            Verdict.FAILS, math.inf, math.inf, 0.0, "the searched quantity became non-finite"
        )
    x, ly = np.log(T), np.log(np.maximum(y, 1e-300))
    decades = float(math.log10(T[-1] / T[0]))
    exponent = _fit(x, ly)
    last = T >= T[-1] / 10.0
    if last.sum() < 2:
        last[-2:] = True
    last_exp = _fit(x[last], ly[last])
    if exponent >= GROWTH_EXPONENT and last_exp >= GROWTH_EXPONENT:
        return GrowthAssessment(
            Verdict.FAILS,
            exponent,
            last_exp,
            decades,
            f"grows like T^{exponent:.2f} over {decades:.1f} decades (T^{last_exp:.2f} over the "
            f"last decade)",
        )
    if proof:
        return GrowthAssessment(Verdict.HOLDS, exponent, last_exp, decades, "proved bounded")
    if calibrated and decades >= MIN_DECADES:
        return GrowthAssessment(
            Verdict.HOLDS,
            exponent,
            last_exp,
            decades,
            f"calibrated search: no growth over {decades:.1f} decades (exponent {exponent:.2f}, "
            f"last decade {last_exp:.2f})",
        )
    why = "search not calibrated" if not calibrated else f"only {decades:.1f} decades searched"
    return GrowthAssessment(
        Verdict.NOT_MEASURED, exponent, last_exp, decades, f"no growth found, but {why}"
    )


def ceiling_verdict(
    worst: float, ceiling: float, *, certified: bool | None, calibrated: bool, proof: bool = False
) -> tuple[Verdict, str]:
    """Never-above-a-ceiling rule: ``worst`` is the largest value the search found."""
    if worst > ceiling:
        if certified:
            return Verdict.FAILS, f"found {worst:.3g} > {ceiling:g} (interval-certified)"
        return (
            Verdict.NOT_MEASURED,
            f"found {worst:.3g} > {ceiling:g}, but interval arithmetic did not certify it",
        )
    if proof:
        return Verdict.HOLDS, "proved"
    if calibrated:
        return Verdict.HOLDS, f"calibrated search: largest {worst:.3g} ≤ {ceiling:g}"
    return Verdict.NOT_MEASURED, "search not calibrated"


@dataclass(frozen=True)
class AccuracyAssessment:
    """What :func:`accuracy_verdict` decided: the verdict, the first length whose relative error
    passes ``ACCURACY_LIMIT`` (None if none did) and why."""

    verdict: Verdict
    passes_limit_at: int | None
    reason: str


def accuracy_verdict(
    lengths: Sequence[float],
    errors: Sequence[float],
    budgets: Sequence[float],
    *,
    reference_error: float,
    reference_budget: float,
) -> AccuracyAssessment:
    """Exact-in-a-precision rule.  ``errors[i]``: relative error of the recurrence at
    ``lengths[i]`` against the reference; ``budgets[i]``: its error-model bound;
    ``reference_error`` / ``reference_budget``: how far the high-precision reference is from an
    independent computation, and what its precision allows."""
    if not (len(lengths) == len(errors) == len(budgets)) or not lengths:
        raise VLAInputError("errors", "expected one error and one budget per length")
    if not (math.isfinite(reference_error) and reference_error <= reference_budget):
        return AccuracyAssessment(
            Verdict.FAILS,
            None,
            f"the high-precision reference is off by {reference_error:.3g} (budget "
            f"{reference_budget:.3g}): the evidence does not vouch for exactness",
        )
    first = next(
        (int(T) for T, e in zip(lengths, errors, strict=True) if not e <= ACCURACY_LIMIT), None
    )
    over = [(int(T), e, b) for T, e, b in zip(lengths, errors, budgets, strict=True) if not e <= b]
    if first is not None:
        return AccuracyAssessment(
            Verdict.FAILS,
            first,
            f"relative error passes {ACCURACY_LIMIT:.0%} at T = {first}",
        )
    if over:
        T, e, b = over[0]
        return AccuracyAssessment(
            Verdict.FAILS, None, f"relative error {e:.3g} exceeds its budget {b:.3g} at T = {T}"
        )
    return AccuracyAssessment(
        Verdict.HOLDS,
        None,
        f"relative error ≤ {max(errors):.3g}, within its budget and below {ACCURACY_LIMIT:.0%} "
        f"up to T = {int(lengths[-1])}",
    )


def figure_verdict(measured: float, paper: float, *, factor: float) -> Verdict:
    """REPRODUCED when ``paper/factor ≤ measured ≤ paper·factor`` (``factor`` ≥ 1)."""
    if factor < 1:
        raise VLAInputError("factor", f"expected >= 1, got {factor}")
    if not math.isfinite(measured):
        return Verdict.NOT_REPRODUCED
    return Verdict.from_measurement(paper / factor <= measured <= paper * factor)


@dataclass(frozen=True)
class Comparison:
    """One point at which a figure on trained models is checked against the paper: ``agrees``
    is whether it agrees there, None when it is not judged because a cell it needs is measured
    on fewer seeds than required; ``lacking`` names those cells (with their seed counts)."""

    name: str
    agrees: bool | None
    lacking: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        # A point is judged exactly when every cell it reads has its seeds.
        if (self.agrees is None) != bool(self.lacking):
            raise VLAInputError(
                "lacking",
                f"{self.name}: a point is unjudged (agrees=None) exactly when cells lack seeds",
            )


@dataclass(frozen=True)
class CellsAssessment:
    """What :func:`cells_verdict` decided: the points that disagree, the cells lacking seeds."""

    verdict: Verdict
    disagreeing: list[str]
    lacking: list[str]
    reason: str


def cells_verdict(comparisons: Sequence[Comparison]) -> CellsAssessment:
    """Cell-by-cell rule (module docstring; docs/verdicts.md): one disagreeing point measured on
    enough seeds decides NOT_REPRODUCED whatever the other points hold, since more seeds
    elsewhere cannot undo it; otherwise a point without its seeds leaves the verdict open."""
    disagreeing = [c.name for c in comparisons if c.agrees is False]
    lacking = [cell for c in comparisons if c.agrees is None for cell in c.lacking]
    if disagreeing:
        return CellsAssessment(
            Verdict.from_measurement(False),
            disagreeing,
            lacking,
            f"disagrees with the paper at {', '.join(disagreeing)}",
        )
    if lacking or not comparisons:
        return CellsAssessment(
            Verdict.from_measurement(None),
            disagreeing,
            lacking,
            "not measured: " + (", ".join(lacking) if lacking else "no cell to compare"),
        )
    return CellsAssessment(
        Verdict.from_measurement(True),
        disagreeing,
        lacking,
        f"agrees with the paper at all {len(comparisons)} points",
    )


def clearly_greater(
    mean_a: float,
    std_a: float,
    seeds_a: int,
    mean_b: float,
    std_b: float,
    seeds_b: int,
    *,
    separation: float = SEPARATION,
) -> bool:
    """Whether mean A exceeds mean B by more than ``separation·sqrt(se_a² + se_b²)``, with
    ``se = std/√seeds`` (a non-finite figure is never greater)."""
    if min(seeds_a, seeds_b) < 1:
        raise VLAInputError("seeds", f"expected at least one seed each, got {seeds_a}, {seeds_b}")
    se = math.hypot(std_a / math.sqrt(seeds_a), std_b / math.sqrt(seeds_b))
    difference = mean_a - mean_b
    return bool(math.isfinite(difference) and math.isfinite(se) and difference > separation * se)
