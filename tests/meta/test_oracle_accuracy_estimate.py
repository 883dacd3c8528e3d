"""Meta-tests of the oracle's a-posteriori error estimate (vla_verify/backends/oracle_accuracy.py).

On cases where the truth is known (mpmath at 80 digits, far more than the inputs need), the
estimate must bound the true relative error within its stated factor (the facade's ``_SAFETY``)
and must not be absurdly pessimistic (at most ``PESSIMISM`` times the true error, or than the
float64 floor).  A planted estimator that ignores the Sherman–Morrison cancellation must fail
the same check.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from vla_verify import VLAConfig, oracle
from vla_verify.backends import oracle_accuracy
from vla_verify.oracle import _SAFETY, _disagreement
from vla_verify.properties.strategies import Case, ShapeBounds, cases

#: The estimate may exceed the true error by at most this factor (or the floor below).
PESSIMISM = 1e5
FLOOR = 1e-14
BOUNDS = ShapeBounds(max_B=1, max_H=2, max_T=16, max_dk=4, max_dv=3)
CONFIGS = {"vla": VLAConfig(nudge_period=5), "rls": VLAConfig.exact(), "delta": VLAConfig()}


def _penalised(scale: float, seed: int = 0, T: int = 6, dk: int = 3, dv: int = 2) -> tuple:
    rng = np.random.default_rng(seed)
    q = np.exp(rng.standard_normal((1, T, 1, dk)))
    k = np.exp(rng.standard_normal((1, T, 1, dk)))
    v = rng.standard_normal((1, T, 1, dv))
    u = rng.standard_normal((1, T, 1, dk)) * scale
    return q, k, v, u


def estimate_and_truth(args: tuple, config: VLAConfig, variant: str, state: Any) -> tuple:
    """(the oracle's estimate, the true relative error against mpmath at 80 digits)."""
    r = oracle.recurrence(*args, config=config, variant=variant, initial_state=state, diagnose=True)
    truth = oracle.recurrence_mp(*args, config=config, variant=variant, initial_state=state, dps=80)
    assert r.diagnostics is not None
    return r.diagnostics.estimate, _disagreement((r.o, r.state), truth)


def check_estimate(estimate: float, true: float) -> None:
    """The meta-test's verdict: bounds within ``_SAFETY``, not pessimistic beyond ``PESSIMISM``."""
    if not np.isfinite(true):
        assert not np.isfinite(estimate), f"true error {true} but estimate {estimate:.3g}"
        return
    assert _SAFETY * estimate >= true, f"estimate {estimate:.3g} < true error {true:.3g}/{_SAFETY}"
    if np.isfinite(estimate):
        assert estimate <= PESSIMISM * max(true, FLOOR), (
            f"estimate {estimate:.3g} is absurdly pessimistic (true error {true:.3g})"
        )


@pytest.mark.parametrize("variant", sorted(CONFIGS))
def test_estimate_bounds_the_true_error_on_drawn_cases(variant: str) -> None:
    config = CONFIGS[variant]

    @settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
    @given(case=cases(config, BOUNDS, state_regimes=("none", "spd")))
    def run(case: Case) -> None:
        est, true = estimate_and_truth(
            (case.q, case.k, case.v, case.u), config, variant, case.initial_state
        )
        check_estimate(est, true)

    run()


@pytest.mark.parametrize("scale", [1e3, 1e5, 1e6])
def test_estimate_tracks_the_cancellation(scale: float) -> None:
    """Strong penalties: the float64 error grows like u·||u||², and so must the estimate."""
    est, true = estimate_and_truth(_penalised(scale), VLAConfig.exact(), "vla", None)
    assert true > 1e-12  # the case does lose digits
    check_estimate(est, true)


def _ignoring_cancellation(monkeypatch: pytest.MonkeyPatch) -> None:
    """Plant: the tracker treats the penalty chain as exact (no residuals of ``A``)."""
    original: Callable[..., None] = oracle_accuracy.AccuracyTracker.__init__

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        self.tracks_penalty = False

    monkeypatch.setattr(oracle_accuracy.AccuracyTracker, "__init__", init)


def test_planted_estimate_that_ignores_the_cancellation_is_caught(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _ignoring_cancellation(monkeypatch)
    est, true = estimate_and_truth(_penalised(1e5), VLAConfig.exact(), "vla", None)
    with pytest.raises(AssertionError, match="estimate"):
        check_estimate(est, true)


def test_planted_pessimist_is_caught() -> None:
    """The other side of the check: an estimate of 1 on an accurate result fails it."""
    _, true = estimate_and_truth(_penalised(0.5), VLAConfig.exact(), "vla", None)
    with pytest.raises(AssertionError, match="pessimistic"):
        check_estimate(1.0, true)


@pytest.mark.parametrize("variant", ["vla", "rls"])
def test_a_zero_key_is_no_error(variant: str) -> None:
    """A zero key gives the gate α = A·0 = 0 exactly: the estimate stays far below the
    reference's escalation threshold (0/0 read as an infinite residual would send every such
    input to mpmath) and still bounds the true error."""
    q, k, v, u = _penalised(1.0)
    k[0, 2] = 0.0
    estimate, truth = estimate_and_truth((q, k, v, u), CONFIGS[variant], variant, None)
    assert _SAFETY * estimate <= oracle.DEFAULT_TARGET_RTOL
    check_estimate(estimate, truth)
