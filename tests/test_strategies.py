"""The Hypothesis strategies reach the corners they promise (issue 3), quickly, and stay
compatible with ``validate`` (spec §1 layouts, float64, finite)."""

from __future__ import annotations

import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from vla_verify import VLAConfig
from vla_verify.properties import strategies as S
from vla_verify.properties.strategies import Case, ShapeBounds

PRESET = VLAConfig()
_HC = [HealthCheck.too_slow, HealthCheck.data_too_large]


def _check_layout(case: Case) -> None:
    B, T, H, dk, dv = case.shapes
    assert case.k.shape == case.u.shape == case.q.shape == (B, T, H, dk)
    assert case.v.shape == (B, T, H, dv)
    for x in case.arrays().values():
        assert x.dtype == np.float64 and np.all(np.isfinite(x))
    if T >= 2:
        assert 1 <= case.split < T
    if case.initial_state is not None:
        S0, A0, z0 = case.initial_state
        assert S0.shape == (B, H, dv, dk) and A0.shape == (B, H, dk, dk) and z0.shape == (B, H, dk)


@settings(max_examples=60, suppress_health_check=_HC)
@given(case=S.hard_cases(PRESET))
def test_hard_cases_are_well_formed(case: Case) -> None:
    _check_layout(case)


@settings(max_examples=30, suppress_health_check=_HC)
@given(case=S.bounded_cases(PRESET))
def test_bounded_cases_meet_the_c5_hypotheses(case: Case) -> None:
    _check_layout(case)
    assert np.allclose(np.linalg.norm(case.k, axis=-1), 1.0)
    assert np.all(np.linalg.norm(case.v, axis=-1) <= 1.0 + 1e-12)
    assert case.initial_state is None


@pytest.mark.parametrize("claim", ["C1", "C2", "C3", "C4", "C5", "C9"])
def test_claim_cases_respect_hypotheses(claim: str) -> None:
    @settings(max_examples=15, suppress_health_check=_HC)
    @given(case=S.claim_cases(claim, PRESET))
    def check(case: Case) -> None:
        _check_layout(case)
        if claim in ("C1", "C2"):
            assert case.regimes["initial_state"] in ("none", "spd")
        if claim in ("C3", "C5"):
            assert case.initial_state is None

    check()


@pytest.mark.parametrize("log10_cond", [0.0, 4.0, 8.0])
def test_ill_conditioned_penalties_reach_the_asked_condition(log10_cond: float) -> None:
    rng = np.random.default_rng(0)
    u = S.ill_conditioned_penalties(rng, (2, 40, 2, 6), log10_cond=log10_cond)
    M = 0.1 * np.eye(6) + np.einsum("bthi,bthj->bhij", u, u)
    w = np.linalg.eigvalsh(M)
    cond = w[..., -1] / w[..., 0]
    # The total weight gives κ = cond exactly when every token hits one direction; spread over
    # two directions, within a factor 2 either way.
    assert np.all(np.log10(cond) <= log10_cond + 1e-9)
    assert np.all(np.log10(cond) >= log10_cond - np.log10(2.0) - 1e-9)


@pytest.mark.parametrize("log10_angle", [-3.0, -2.0, -1.0])
def test_near_parallel_keys_angles(log10_angle: float) -> None:
    rng = np.random.default_rng(1)
    k = S.near_parallel_keys(rng, (2, 30, 2, 5), log10_angle=log10_angle)
    kh = k / np.linalg.norm(k, axis=-1, keepdims=True)
    cos = np.clip(np.einsum("bthi,bshi->btsh", kh, kh), -1, 1)
    angle = np.arccos(cos)
    assert np.max(angle) <= 2 * 10**log10_angle + 1e-9  # both within 10^a of the base
    assert np.max(angle) >= 0.1 * 10**log10_angle


def test_cancelling_queries_put_the_readout_on_its_floor() -> None:
    rng = np.random.default_rng(2)
    k = rng.standard_normal((2, 20, 2, 4))
    z0 = rng.random((2, 2, 4))
    q = S.cancelling_queries(rng, k, z0, out_eps=1e-4)
    z = z0[:, None] + np.cumsum(k, axis=1)
    assert np.all(np.abs(np.sum(z * q, axis=-1)) <= 1e-4 * (1 + 1e-6))


def test_long_cases_are_long_and_fast() -> None:
    lengths = []

    @settings(max_examples=10, suppress_health_check=_HC)
    @given(case=S.long_cases(PRESET, min_T=500, max_T=1000))
    def check(case: Case) -> None:
        lengths.append(case.shapes[1])

    start = time.perf_counter()
    check()
    assert min(lengths) >= 500 and max(lengths) <= 1000
    assert time.perf_counter() - start < 10.0


def test_generation_is_fast() -> None:
    count = []

    @settings(max_examples=100, database=None, suppress_health_check=_HC)
    @given(case=S.hard_cases(PRESET))
    def check(case: Case) -> None:
        count.append(case)

    start = time.perf_counter()
    check()
    assert time.perf_counter() - start < 10.0 and len(count) >= 50


def test_default_cases_unchanged_for_validate() -> None:
    assert S.KEY_REGIMES == ("gaussian", "positive", "near_parallel", "repeated", "scaled")
    assert S.PENALTY_REGIMES == ("layer", "gaussian", "concentrated", "tiny", "zero")
    assert set(S.ALL_PENALTY_REGIMES) > set(S.PENALTY_REGIMES)


@settings(max_examples=10, suppress_health_check=_HC)
@given(case=S.cases(PRESET, ShapeBounds(max_T=5)))
def test_safe_target_accepts_anything(case: Case) -> None:
    assert S.safe_target(float(np.max(np.abs(case.v))), "max |v|") >= 0
    assert S.safe_target(float("inf"), "inf") == S.TARGET_CAP
    assert np.isnan(S.safe_target(float("nan"), "nan"))
    assert S.safe_target(0.0, "log", log10=True) == -400.0
