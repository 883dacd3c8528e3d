"""The verdict rules (vla_verify.proofs.verdicts, docs/verdicts.md), each tested on both sides: a
setting where the claim provably holds gets HOLDS, one where it provably fails gets FAILS."""

from __future__ import annotations

import numpy as np
import pytest

from vla_verify.errors import VLAInputError
from vla_verify.oracle import recurrence
from vla_verify.proofs import verdicts
from vla_verify.proofs.ledger import Verdict
from vla_verify.properties import adversary
from vla_verify.spec import VLAConfig

GRID = [100, 178, 316, 562, 1000, 1778, 3162, 5623, 10000]


def _unit(x):
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def test_growth_rule_fails_where_growth_is_proved():
    """Linear attention under its worst case grows like T (provably): FAILS, exponent 1."""
    run = adversary.greedy_state_norm(VLAConfig(), "linear", GRID[-1], 2, candidates=8)
    sup = adversary.running_sup(run.values)
    a = verdicts.growth_verdict(GRID, [sup[T - 1] for T in GRID], calibrated=True)
    assert a.verdict is Verdict.FAILS
    assert a.exponent == pytest.approx(1.0, abs=1e-6)


def test_growth_rule_holds_where_boundedness_is_proved():
    """At dk = 1 the gate is ±k̂ itself, so S_t = v_t α̂_t and ||S_t|| ≤ 1 for every input:
    random unit inputs over two decades must read HOLDS (when the search is calibrated)."""
    rng = np.random.default_rng(0)
    T = GRID[-1]
    k = rng.standard_normal((1, T, 1, 1))
    v = _unit(rng.standard_normal((1, T, 1, 3)))
    u = np.ones((1, T, 1, 1))
    h = recurrence(k, k, v, u, config=VLAConfig(), return_states=True).history
    sup = np.maximum.accumulate(np.linalg.norm(h.S[0, :, 0], axis=(-2, -1)))
    values = [sup[T - 1] for T in GRID]
    assert verdicts.growth_verdict(GRID, values, calibrated=True).verdict is Verdict.HOLDS
    uncalibrated = verdicts.growth_verdict(GRID, values, calibrated=False)
    assert uncalibrated.verdict is Verdict.NOT_MEASURED
    short = verdicts.growth_verdict(GRID[:5], values[:5], calibrated=True)
    assert short.verdict is Verdict.NOT_MEASURED  # two decades are needed, not one
    assert verdicts.growth_verdict(GRID[:5], values[:5], calibrated=True, proof=True).verdict is (
        Verdict.HOLDS
    )


@pytest.mark.parametrize(
    "series,verdict",
    [
        (lambda T: np.log(T), Verdict.FAILS),  # unbounded, however slowly
        (lambda T: 10 * (1 - np.exp(-T / 50)), Verdict.HOLDS),  # saturates
        (lambda T: 7.7 * (T / 250) ** 0.4, Verdict.FAILS),  # the old "saturating" 7.7 → 13.4 → 19
        (lambda T: 5 + 0 * T, Verdict.HOLDS),
    ],
)
def test_growth_rule_on_closed_form_series(series, verdict):
    T = np.array(GRID, dtype=float)
    assert verdicts.growth_verdict(GRID, series(T), calibrated=True).verdict is verdict


def test_growth_rule_rejects_bad_lengths():
    with pytest.raises(VLAInputError, match="lengths"):
        verdicts.growth_verdict([10, 5, 100], [1, 2, 3], calibrated=True)


def test_ceiling_rule_both_sides():
    """The delta rule's steps are projections (norm ≤ 1), so no product exceeds 1 — HOLDS for a
    calibrated search; a certified value above the ceiling FAILS, an uncertified one cannot."""
    pytest.importorskip("torch")  # the gradient search differentiates with PyTorch
    run = adversary.gradient_search_product(VLAConfig(), 8, 4, variant="delta", steps=30)
    assert run.value <= 1 + 1e-9
    v, _ = verdicts.ceiling_verdict(run.value, 10.0, certified=None, calibrated=True)
    assert v is Verdict.HOLDS
    assert verdicts.ceiling_verdict(run.value, 10.0, certified=None, calibrated=False)[0] is (
        Verdict.NOT_MEASURED
    )
    assert verdicts.ceiling_verdict(172.0, 10.0, certified=True, calibrated=True)[0] is (
        Verdict.FAILS
    )
    assert verdicts.ceiling_verdict(172.0, 10.0, certified=False, calibrated=True)[0] is (
        Verdict.NOT_MEASURED
    )


def test_accuracy_rule_both_sides():
    T = [10, 100, 1000]
    ok = verdicts.accuracy_verdict(
        T, [1e-15, 1e-14, 1e-13], [1e-12] * 3, reference_error=0.0, reference_budget=1e-40
    )
    assert ok.verdict is Verdict.HOLDS and ok.passes_limit_at is None
    drift = verdicts.accuracy_verdict(
        T, [1e-3, 2e-2, 1e-1], [1.0] * 3, reference_error=0.0, reference_budget=1e-40
    )
    assert drift.verdict is Verdict.FAILS and drift.passes_limit_at == 100
    over = verdicts.accuracy_verdict(
        T, [1e-15, 1e-10, 1e-9], [1e-12] * 3, reference_error=0.0, reference_budget=1e-40
    )
    assert over.verdict is Verdict.FAILS and "budget" in over.reason
    off_by_one = verdicts.accuracy_verdict(
        T, [1e-15, 1e-14, 1e-13], [1e-12] * 3, reference_error=1.0, reference_budget=1e-40
    )
    assert off_by_one.verdict is Verdict.FAILS


def test_figure_rule_both_sides():
    assert verdicts.figure_verdict(1500.0, 1600.0, factor=2.0) is Verdict.REPRODUCED
    assert verdicts.figure_verdict(400.0, 1600.0, factor=2.0) is Verdict.NOT_REPRODUCED
    assert verdicts.figure_verdict(float("nan"), 1600.0, factor=2.0) is Verdict.NOT_REPRODUCED
    with pytest.raises(VLAInputError, match="factor"):
        verdicts.figure_verdict(1.0, 1.0, factor=0.5)


def test_cells_rule_every_way():
    """Cell by cell (C7.mqar, C10.length): all agree -> REPRODUCED; one judged cell off ->
    NOT_REPRODUCED even beside unjudged cells; otherwise a cell short of seeds -> NOT_MEASURED,
    naming it; nothing to compare -> NOT_MEASURED."""
    agree = [verdicts.Comparison("T = 64", True), verdicts.Comparison("T = 128", True)]
    short = verdicts.Comparison("T = 256", None, ("T = 256 vla (2 of 3 seeds)",))
    off = verdicts.Comparison("T = 512", False)
    assert verdicts.cells_verdict(agree).verdict is Verdict.REPRODUCED
    a = verdicts.cells_verdict([*agree, short])
    assert a.verdict is Verdict.NOT_MEASURED and a.lacking == ["T = 256 vla (2 of 3 seeds)"]
    a = verdicts.cells_verdict([*agree, short, off])
    assert a.verdict is Verdict.NOT_REPRODUCED and a.disagreeing == ["T = 512"]
    assert verdicts.cells_verdict([]).verdict is Verdict.NOT_MEASURED
    with pytest.raises(VLAInputError, match="lacking"):
        verdicts.Comparison("T = 64", None)  # unjudged without naming what is missing
    with pytest.raises(VLAInputError, match="lacking"):
        verdicts.Comparison("T = 64", True, ("T = 64 vla (1 of 3 seeds)",))


def test_clearly_greater_rule_both_sides():
    """A above B only beyond two standard errors of the difference (se = std/√seeds)."""
    assert verdicts.clearly_greater(0.8, 0.05, 3, 0.1, 0.02, 3)
    # 0.667 ± 0.577 (3) against 0.12 ± 0.02 (3): difference 0.547 < 2·0.334
    assert not verdicts.clearly_greater(2 / 3, 0.57735, 3, 0.12, 0.02, 3)
    assert not verdicts.clearly_greater(0.5, 0.0, 3, 0.5, 0.0, 3)  # equal is not greater
    assert not verdicts.clearly_greater(float("nan"), 0.0, 3, 0.1, 0.0, 3)
    with pytest.raises(VLAInputError, match="seeds"):
        verdicts.clearly_greater(1.0, 0.0, 0, 0.1, 0.0, 3)
