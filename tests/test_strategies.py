"""The Hypothesis strategies reach the corners they promise, quickly, and stay
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


# -- the conformance checker's sizes --------------------------------------------------------------


def _conformance_draws(sizes: S.ConformanceSizes, n: int = 200) -> list[Case]:
    drawn: list[Case] = []

    @settings(
        max_examples=n, database=None, derandomize=True, suppress_health_check=list(HealthCheck)
    )
    @given(case=S.conformance_cases(PRESET, sizes))
    def collect(case: Case) -> None:
        _check_layout(case)
        drawn.append(case)

    collect()
    return drawn


def test_conformance_cases_reach_the_kernels_structure() -> None:
    """Widths past one tile, lengths past two chunks, B > 2 and H > 2, dk != dv: each in a
    sizeable share of the draws, while most draws stay small."""
    drawn = _conformance_draws(S.ConformanceSizes())
    shapes = np.array([c.shapes for c in drawn])
    B, T, H, dk, dv = shapes.T
    assert np.mean(dk > 32) > 0.15 and np.mean(dk >= 16) > 0.3 and 128 in dk
    assert np.mean(T > 128) > 0.15 and T.max() > 4 * 128
    assert np.mean(B > 2) > 0.1 and np.mean(H > 2) > 0.1 and np.all(B * H <= 6)
    assert np.mean(dk != dv) > 0.5
    assert np.median(T) < 64 and np.mean(B * H == 1) > 0.3  # still mostly small
    assert {17, 48, 96, 100, 127} & set(dk.tolist())  # ragged widths beside the tiles


def test_conformance_cases_aim_lengths_and_cuts_at_the_declared_chunk() -> None:
    C = 48
    drawn = _conformance_draws(S.ConformanceSizes(chunk_size=C, max_T=300))
    T = np.array([c.shapes[1] for c in drawn])
    splits = np.array([c.split for c in drawn if c.shapes[1] > C + 1])
    beside = np.isin(T % C, (0, 1, C - 1)) & (T >= C - 1)
    assert np.mean(beside) > 0.15  # about 3 in 10 draws aim at a boundary, 3 in 4 of those at C
    assert np.mean(np.isin(splits % C, (0, 1, C - 1))) > 0.3
    undeclared = np.array([c.shapes[1] for c in _conformance_draws(S.ConformanceSizes(max_T=300))])
    assert np.mean(beside) > 2 * np.mean(
        np.isin(undeclared % C, (0, 1, C - 1)) & (undeclared >= C - 1)
    )
    # The cost cap keeps two chunks and a token at the widest heads.
    wide = [c for c in drawn if c.shapes[3] == 128 and c.shapes[0] * c.shapes[2] == 6]
    assert all(c.shapes[1] <= 300 for c in wide)


def test_swept_configs_reach_every_field() -> None:
    seen: dict[str, set] = {}

    @settings(max_examples=200, database=None, derandomize=True)
    @given(cfg=S.swept_configs(PRESET))
    def collect(cfg: VLAConfig) -> None:
        for name in ("lambda0", "nudge_period", "nudge_eta", "sm_floor", "out_eps"):
            seen.setdefault(name, set()).add(getattr(cfg, name))
        seen.setdefault("gates", set()).add((cfg.normalize_gate, cfg.normalize_output))

    collect()
    assert {1, 3, 48, None} <= seen["nudge_period"]  # 48 does not divide a chunk of 64
    assert min(seen["lambda0"]) <= 1e-3 and max(seen["lambda0"]) >= 100
    assert min(seen["sm_floor"]) <= 1e-12 and max(seen["sm_floor"]) > 1
    assert len(seen["gates"]) == 4 and len(seen["nudge_eta"]) >= 3
