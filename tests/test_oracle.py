"""The float64 oracle (spec §2.3–§2.4) against closed forms computed without the recurrence."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from vla_verify import VLAConfig, oracle
from vla_verify.closed_forms import linear_attention_states, ut_state_chain
from vla_verify.spec import unit_roundoff

U64 = unit_roundoff("float64")


def _elu1(x: np.ndarray) -> np.ndarray:
    return np.where(x > 0, x + 1, np.exp(x))


def _random(B=2, T=25, H=3, dk=5, dv=4, seed=0, positive_q=True, positive_k=False):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((B, T, H, dk))
    q = _elu1(q) if positive_q else q
    k, u = rng.standard_normal((B, T, H, dk)), rng.standard_normal((B, T, H, dk)) / np.sqrt(dk)
    k = _elu1(k) if positive_k else k
    v = rng.standard_normal((B, T, H, dv))
    return q, k, v, u


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


def test_penalty_chain_equals_the_direct_inverse_without_nudges() -> None:
    """C1: A_t = (lambda0 I + Σ u uᵀ)^{-1}. Error model: the recurrence's rounding error is a few
    units of u_64 per step times cond(M_t), accumulated over T steps."""
    q, k, v, u = _random()
    config = VLAConfig.exact()
    hist = oracle.recurrence(q, k, v, u, config=config, return_states=True).history
    direct = oracle.penalty_inverse(u, config.lambda0)
    cond = np.linalg.cond(oracle.penalty_matrix(u, config.lambda0).reshape(-1, 5, 5)).max()
    T = q.shape[1]
    assert _rel(hist.A, direct) <= 4 * T * U64 * cond


def test_nudges_break_exactness_by_the_nudge() -> None:
    """With a nudge every 5 steps, A_t differs from M_t^{-1} (the claim's exactness needs
    VLAConfig.exact()); at step 5 the difference is exactly eta·I."""
    q, k, v, u = _random(T=6)
    config = VLAConfig(nudge_period=5)
    hist = oracle.recurrence(q, k, v, u, config=config, return_states=True).history
    direct = oracle.penalty_inverse(u, config.lambda0)
    assert np.allclose(hist.A[:, :4], direct[:, :4], rtol=0, atol=1e-13)
    np.testing.assert_allclose(
        hist.A[:, 4] - direct[:, 4],
        np.broadcast_to(config.nudge_eta * np.eye(5), direct[:, 4].shape),
        rtol=0,
        atol=1e-13,
    )


def test_rls_equals_the_argmin_closed_form() -> None:
    """The rls variant (spec §2.4) is the argmin of spec §3 C3 at every t."""
    q, k, v, u = _random()
    config = VLAConfig.exact()
    hist = oracle.recurrence(q, k, v, u, config=config, variant="rls", return_states=True).history
    closed = oracle.argmin_state(k, v, u, config.lambda0)
    assert _rel(hist.S, closed) <= 1e3 * q.shape[1] * U64


def test_linear_variant_is_a_prefix_sum() -> None:
    q, k, v, u = _random()
    config = VLAConfig()
    r = oracle.recurrence(q, k, v, u, config=config, variant="linear", return_states=True)
    S = linear_attention_states(k, v)
    assert _rel(r.history.S, S) <= 4 * q.shape[1] * U64
    raw = np.einsum("bthij,bthj->bthi", S, q)
    den = np.maximum(np.einsum("bthj,bthj->bth", np.cumsum(k, axis=1), q), config.out_eps)
    assert _rel(r.o, raw / den[..., None]) <= 8 * q.shape[1] * U64


@pytest.mark.parametrize("variant", ["delta", "vla"])
def test_state_chain_equals_the_ut_form(variant: str) -> None:
    """delta (gates k̂) and vla (gates α̂ from the oracle's history) against the UT form of
    spec §5, a single triangular solve, from a non-zero initial S."""
    q, k, v, u = _random(seed=3)
    B, T, H, dk = q.shape
    rng = np.random.default_rng(1)
    S0 = rng.standard_normal((B, H, v.shape[-1], dk))
    A0 = np.broadcast_to(np.eye(dk) / 0.1, (B, H, dk, dk)).copy()
    state = (S0, A0, np.zeros((B, H, dk)))
    config = VLAConfig(normalize_output=False)
    r = oracle.recurrence(
        q, k, v, u, config=config, variant=variant, initial_state=state, return_states=True
    )
    raw, S_T = ut_state_chain(r.history.k_hat, r.history.gate, v, q, S0)
    assert _rel(r.o, raw) <= 1e3 * T * U64
    assert _rel(r.state[0], S_T) <= 1e3 * T * U64
    if variant == "delta":
        np.testing.assert_array_equal(r.state[1], A0)  # delta carries A through unchanged


def test_delta_rule_writes_each_key_exactly() -> None:
    """β = 1 DeltaNet: after step t, S_t k̂_t = v_t."""
    q, k, v, u = _random()
    hist = oracle.recurrence(q, k, v, u, variant="delta", return_states=True).history
    recalled = np.einsum("bthij,bthj->bthi", hist.S, hist.k_hat)
    assert np.max(np.abs(recalled - v)) <= 64 * U64 * np.max(np.abs(v)) * q.shape[-1]


def test_readout_floor_and_switches() -> None:
    q, k, v, u = _random(positive_q=False)
    base = VLAConfig.exact()
    r = oracle.recurrence(q, k, v, u, config=base, return_states=True)
    raw = np.einsum("bthij,bthj->bthi", r.history.S, q)
    den = np.einsum("bthj,bthj->bth", r.history.z, q)
    assert (den < base.out_eps).any()  # the floor is exercised by signed queries
    np.testing.assert_allclose(r.o, raw / np.maximum(den, base.out_eps)[..., None], rtol=1e-13)
    r2 = oracle.recurrence(q, k, v, u, config=base.replace(normalize_output=False))
    np.testing.assert_allclose(r2.o, raw, rtol=1e-13, atol=1e-300)


def test_unnormalised_gate_is_A_k_hat() -> None:
    q, k, v, u = _random()
    config = VLAConfig.exact(normalize_gate=False)
    hist = oracle.recurrence(q, k, v, u, config=config, return_states=True).history
    expected = np.einsum("bthij,bthj->bthi", hist.A, hist.k_hat)
    np.testing.assert_allclose(hist.gate, expected, rtol=1e-12)
    np.testing.assert_allclose(np.linalg.norm(hist.k_hat, axis=-1), 1.0, rtol=1e-15)


def test_initial_state_continues_the_sequence() -> None:
    """Splitting at a multiple of the nudge period and carrying (S, A, z) equals the whole."""
    q, k, v, u = _random(T=40)
    config = VLAConfig(nudge_period=10)
    whole = oracle.recurrence(q, k, v, u, config=config)
    first = oracle.recurrence(q[:, :20], k[:, :20], v[:, :20], u[:, :20], config=config)
    second = oracle.recurrence(
        q[:, 20:], k[:, 20:], v[:, 20:], u[:, 20:], config=config, initial_state=first.state
    )
    np.testing.assert_array_equal(np.concatenate([first.o, second.o], axis=1), whole.o)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_low_precision_oracle_rounds_every_result(dtype: str) -> None:
    """The same-precision oracle (spec §4): its values are representable in the dtype, and its
    error against float64 is of the order of that dtype's unit roundoff.  Positive features
    (as the layer of spec §2.5 feeds) keep z·q away from the floor, where float16 overflows."""
    q, k, v, u = _random(T=10, positive_k=True)
    r64 = oracle.recurrence(q, k, v, u)
    r = oracle.recurrence(q, k, v, u, dtype=dtype)
    assert r.o.dtype == np.float32
    np.testing.assert_array_equal(oracle.round_to_dtype(r.o, dtype), r.o)
    err = _rel(r.o, r64.o)
    assert unit_roundoff(dtype) / 100 < err < 1e3 * unit_roundoff(dtype)


def test_round_to_bfloat16_ties_to_even() -> None:
    # 1 + 2^-8 lies halfway between bf16 neighbours 1 and 1 + 2^-7: ties to even -> 1.
    x = np.array([1 + 2.0**-8, 1 + 3 * 2.0**-8, 1 + 2.0**-9], dtype=np.float32)
    np.testing.assert_array_equal(
        oracle.round_to_dtype(x, "bfloat16"), np.array([1.0, 1 + 2.0**-6, 1.0], np.float32)
    )


def test_memory_is_independent_of_T_without_history() -> None:
    """O(B·H·d²) working memory beyond the inputs and the output."""

    def peak(T: int) -> int:
        q, k, v, u = _random(B=1, T=T, H=2, dk=16, dv=16)
        tracemalloc.start()
        oracle.recurrence(q, k, v, u)
        _, top = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        io = sum(x.nbytes for x in (q, k, v, u)) + v.nbytes  # input copies and the output
        return top - 2 * io

    assert peak(2048) < 64 * 1024  # the state and per-step temporaries, not O(T)


def test_jacobian_matches_finite_differences_and_svd() -> None:
    rng = np.random.default_rng(0)
    dk, dv = 4, 3
    k_hat = rng.standard_normal(dk)
    k_hat /= np.linalg.norm(k_hat)
    gate = rng.standard_normal(dk)
    gate /= np.linalg.norm(gate)
    J = oracle.step_jacobian(k_hat, gate, dv)
    S = rng.standard_normal((dv, dk))
    np.testing.assert_allclose(
        J @ S.ravel(), (S @ (np.eye(dk) - np.outer(k_hat, gate))).ravel(), rtol=1e-14
    )
    c = k_hat @ gate
    sigma_plus = np.sqrt((3 - 2 * c + np.sqrt(5 - 4 * c)) / 2)
    np.testing.assert_allclose(
        oracle.jacobian_spectral_norm(k_hat, gate, dv), sigma_plus, rtol=1e-13
    )
