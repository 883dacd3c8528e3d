"""``validate`` judges against the escalated reference where float64 cannot vouch for itself.

The strongly penalised six-token case (``||u||`` ~ 1e4, the exact preset): the float64 oracle's
own estimate asks for escalation, so the values judged (``o``, the final state, the carry's
halves) come from mpmath while the floor's scales come from the float64 history
(:func:`vla_verify.validation._reference_with_scales`).  A correct kernel (the mpmath backend)
passes; a kernel off by a relative 1e-6 in ``o`` is rejected; the float64 oracle as a kernel is
judged against its measured error (spec §4: ``factor`` times the straightforward float64
recurrence).  Where the float64 history loses its order of magnitude (``||u||`` ~ 1e8) the
scales come from the escalated reference's history; only where the escalated reference cannot
vouch is the example beyond the reference's reach.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from vla_verify import VLAConfig, backends, oracle
from vla_verify.properties.strategies import Case
from vla_verify.validation import (
    REFERENCE_RTOL,
    REFERENCE_SAFETY,
    _BeyondReach,
    _reference_with_scales,
    evaluate_case,
)

EXACT = VLAConfig.exact()


def _strongly_penalised(scale: float) -> list[np.ndarray]:
    """Six tokens, dk = 3, dv = 2, penalties of norm ``scale`` (as in the reference's tests)."""
    rng = np.random.default_rng(0)
    q = np.exp(rng.standard_normal((1, 6, 1, 3)))
    k = np.exp(rng.standard_normal((1, 6, 1, 3)))
    v = rng.standard_normal((1, 6, 1, 2))
    u = rng.standard_normal((1, 6, 1, 3)) * scale
    return [q, k, v, u]


def _case(scale: float) -> Case:
    return Case(*_strongly_penalised(scale), None, split=3, regimes={}, seed=0)


def _rel(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.max(np.abs(got - want)) / np.max(np.abs(want)))


def test_the_case_needs_escalation_and_float64_is_off() -> None:
    """The premise: float64's estimate fails the reference's target, its ``o`` is off the
    500-digit answer by more than the target, and the reference validate uses is not."""
    inputs = _strongly_penalised(1e4)
    raw = oracle.recurrence(*inputs, config=EXACT, diagnose=True)
    assert raw.diagnostics is not None
    assert REFERENCE_SAFETY * raw.diagnostics.estimate > REFERENCE_RTOL
    o_mp, state_mp = oracle.recurrence_mp(*inputs, config=EXACT, dps=500)
    assert _rel(raw.o, o_mp) > 1e-9
    ref, scales, measured = _reference_with_scales(inputs, None, EXACT, "vla")
    assert measured is not None  # escalated: the float64 run comes back to be measured
    np.testing.assert_array_equal(measured.o, raw.o)
    assert _rel(ref.o, o_mp) <= REFERENCE_RTOL
    for got, want in zip(ref.state, state_mp, strict=True):
        assert _rel(got, want) <= REFERENCE_RTOL
    assert set(scales) == {"o", "S", "A", "z"} and all(np.all(x > 0) for x in scales.values())


def test_a_correct_kernel_passes_against_the_escalated_reference() -> None:
    judged = evaluate_case(backends.get("mpmath", dps=80), _case(1e4), config=EXACT)
    assert judged is not None, "judged, not beyond reach"
    failure, ratio = judged
    assert failure is None, failure and failure.describe()
    assert ratio <= 1.0


def _off_in_o(relative: float) -> Any:
    inner = backends.get("mpmath", dps=80)

    def kernel(q, k, v, u, *, config, initial_state=None, start=0):
        o, state = inner(q, k, v, u, config=config, initial_state=initial_state, start=start)
        return o * (1.0 + relative), state

    return kernel


def test_a_kernel_off_by_1e6_in_o_is_rejected() -> None:
    judged = evaluate_case(_off_in_o(1e-6), _case(1e4), config=EXACT)
    assert judged is not None
    failure, _ = judged
    assert failure is not None and failure.kind == "mismatch"
    assert [c.name for c in failure.comparisons if not c.passed] == ["o"]


def test_the_float64_oracle_is_judged_against_its_measured_error() -> None:
    """The float64 recurrence as a kernel: its own error against the escalated reference is the
    float64 baseline, so it passes at 1/(factor + 1) of the budget (the float32 model alone
    would put it ten times over: spec §4's model assumes a backward-stable recurrence)."""
    judged = evaluate_case(backends.get("numpy"), _case(1e4), config=EXACT)
    assert judged is not None
    failure, ratio = judged
    assert failure is None, failure and failure.describe()
    assert ratio <= 1.0 / 3.0 + 1e-6


def test_the_escalated_history_gives_the_scales_where_float64_loses_its_magnitude() -> None:
    """``||u||`` ~ 1e8: float64's largest ``|A_t|`` is 563 where the exact one is 9.75, so the
    floor's scales come from the escalated reference's history (every prefix), and the values
    judged are the 500-digit answer."""
    inputs = _strongly_penalised(1e8)
    raw = oracle.recurrence(*inputs, config=EXACT, return_states=True).history
    assert raw is not None and np.max(np.abs(raw.A)) > 100
    ref, scales, measured = _reference_with_scales(inputs, None, EXACT, "vla")
    assert measured is not None
    o_mp, state_mp = oracle.recurrence_mp(*inputs, config=EXACT, dps=500)
    assert _rel(ref.o, o_mp) <= REFERENCE_RTOL
    for got, want in zip(ref.state, state_mp, strict=True):
        assert _rel(got, want) <= REFERENCE_RTOL
    exact_A = max(
        np.max(
            np.abs(oracle.recurrence_mp(*(x[:, :t] for x in inputs), config=EXACT, dps=500)[1][1])
        )
        for t in range(1, 7)
    )
    assert scales["A"].max() == pytest.approx(max(exact_A, 1 / EXACT.lambda0), rel=1e-9)


def test_beyond_reach_where_the_escalated_reference_cannot_vouch() -> None:
    """The same case repeated along the batch until it is too large to escalate: not judged
    (``evaluate_case`` returns None), whatever the kernel."""
    inputs = [np.repeat(x, 3000, axis=0) for x in _strongly_penalised(1e8)]
    with pytest.raises(_BeyondReach, match="max_work"):
        _reference_with_scales(inputs, None, EXACT, "vla")
    case = Case(*inputs, None, split=3, regimes={}, seed=0)
    assert evaluate_case(_off_in_o(1.0), case, config=EXACT) is None


def test_compare_takes_the_measured_float64_error_where_it_exceeds_the_model() -> None:
    """``compare(..., measured=)``: the float64 baseline is the larger of the float32-based
    model and the measured float64 error; a non-finite measurement adds nothing (it must not
    make the budget infinite); other precisions ignore it."""
    from vla_verify.error_model import compare

    ref = np.ones((1, 4, 1, 2))
    base32 = ref + 1e-7  # model: 1e-7 · u64/u32 ≈ 1.9e-16
    measured = ref + 1e-9
    got = ref + 2e-9
    plain = compare("o", got, ref, [base32], "float64")
    assert not plain.passed  # 2e-9 is far beyond the model's budget
    judged = compare("o", got, ref, [base32], "float64", measured=measured)
    assert judged.passed and np.allclose(judged.baseline, 1e-9)
    worse = compare("o", ref + 4e-9, ref, [base32], "float64", measured=measured)
    assert not worse.passed  # 4e-9 > 3 × 1e-9 + floor
    nan = compare("o", got, ref, [base32], "float64", measured=ref * np.nan)
    assert not nan.passed and np.all(np.isfinite(nan.budget))
    f32 = compare("o", got, ref, [ref + 1e-9], "float32", measured=ref + 1.0)
    assert np.allclose(f32.baseline, 1e-9)
