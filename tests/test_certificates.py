"""Certified counterexamples (:mod:`vla_verify.proofs.certificates`): minimal (shrunk by
Hypothesis), exact JSON, re-checked in ``mpmath.iv`` interval arithmetic, replayable; and a
rounding artefact is *not* certified."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import HealthCheck, find, settings

from vla_verify import VLAConfig
from vla_verify.proofs import certificates as cert
from vla_verify.properties import invariants as inv
from vla_verify.properties.strategies import Case, ShapeBounds, claim_cases

EXACT = VLAConfig.exact()
FIND = settings(
    max_examples=200, derandomize=True, database=None, suppress_health_check=list(HealthCheck)
)


def _case(T: int, dk: int, dv: int, seed: int = 0) -> Case:
    rng = np.random.default_rng(seed)
    shape = (1, T, 1, dk)
    return Case(
        rng.random(shape) + 0.1,
        rng.standard_normal(shape),
        rng.standard_normal((1, T, 1, dv)),
        0.5 * rng.standard_normal(shape),
        None,
        1,
        {},
        seed,
    )


def test_c3_vla_minimal_counterexample_is_certified_and_replays(tmp_path) -> None:  # type: ignore[no-untyped-def]
    bounds = ShapeBounds(max_B=2, max_H=2, max_T=4, max_dk=3, max_dv=3)
    minimal = find(
        claim_cases("C3", EXACT, bounds),
        lambda c: not inv.closed_form_equivalence(c, EXACT).holds,
        settings=FIND,
    )
    B, T, H, dk, dv = minimal.shapes
    assert (B, T, H, dk, dv) == (1, 1, 1, 1, 1)  # shrunk to the smallest dk and T
    r = inv.closed_form_equivalence(minimal, EXACT)
    cx = cert.from_case("C3", "argmin_residual", minimal, EXACT, r.where, statement=r.detail)
    path = cert.save(cx, tmp_path / "c3.json")
    data = json.loads(path.read_text())
    assert data["inputs"]["k"]["hex"][0] == float(minimal.k.ravel()[0]).hex()
    assert data["created"]["numpy"] == np.__version__
    result = cert.replay(path)
    assert result.reproduced and result.interval.certified and result.ok, result.summary()
    assert result.interval.lower > 0


def test_c4_counterexample_is_certified() -> None:
    case = _case(T=3, dk=3, dv=2)
    r = inv.unit_jacobian(case, EXACT)
    assert not r.holds
    cx = cert.from_case("C4", "jacobian_step_norm", case, EXACT, r.where)
    verdict = cert.recheck_interval(cx)
    assert verdict.certified and verdict.lower > 1.0, verdict.detail
    assert verdict.lower <= cx.measured <= verdict.upper


def test_c2_nudge_counterexample_is_certified() -> None:
    case = _case(T=1, dk=2, dv=1)
    case = Case(case.q, case.k, case.v, 1e-3 * case.u, None, 1, {}, 0)
    config = VLAConfig(nudge_period=1)
    assert not inv.directional_selectivity(case, config).holds
    cx = cert.from_case("C2", "selectivity_increase", case, config, (0, 0, 0))
    assert cert.replay(cx).ok


def test_rounding_artefact_is_not_certified() -> None:
    """rls is the argmin exactly; its float64 residual (~1e-16) is rounding, so the interval
    re-check must contain 0 and refuse to certify it."""
    cx = cert.from_case(
        "C3", "argmin_residual", _case(T=4, dk=2, dv=2), EXACT, (0, 3, 0), variant="rls"
    )
    assert cx.measured > 0
    verdict = cert.recheck_interval(cx)
    assert not verdict.certified and verdict.lower <= 0.0 <= verdict.upper
    assert not cert.replay(cx).ok


def test_sherman_morrison_is_exact_in_intervals() -> None:
    cx = cert.from_case("C1", "sm_residual", _case(T=3, dk=3, dv=1), EXACT, (0, 2, 0))
    assert not cert.recheck_interval(cx).certified


def test_state_norm_needs_a_bound_and_certifies_against_it() -> None:
    case = _case(T=5, dk=2, dv=2)
    with pytest.raises(ValueError):
        cert.from_case("C5", "state_norm", case, EXACT, (0, 4, 0))
    cx = cert.from_case("C5", "state_norm", case, EXACT, (0, 4, 0), claimed=0.5)
    assert cert.recheck_interval(cx).certified
    too_high = cert.from_case("C5", "state_norm", case, EXACT, (0, 4, 0), claimed=1e3)
    assert not cert.recheck_interval(too_high).certified


def test_roundtrip_is_exact_and_tampering_is_detected(tmp_path) -> None:  # type: ignore[no-untyped-def]
    case = _case(T=2, dk=2, dv=2, seed=3)
    cx = cert.from_case("C4", "jacobian_step_norm", case, EXACT, (0, 1, 0))
    path = cert.save(cx, tmp_path / "cx.json")
    back = cert.load(path)
    for name, x in cx.arrays().items():
        np.testing.assert_array_equal(back.arrays()[name], x)
    assert back == cx
    data = json.loads(path.read_text())
    last = 2  # k[0, 1, 0, 0]: the key of the step the figure is measured at
    data["inputs"]["k"]["hex"][last] = (float.fromhex(data["inputs"]["k"]["hex"][last]) + 0.5).hex()
    path.write_text(json.dumps(data))
    assert not cert.replay(path).reproduced
