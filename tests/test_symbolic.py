"""The sympy proofs of :mod:`vla_verify.proofs.symbolic` run, establish their statements, and
agree with numbers (spec §3 C1, C3, C4); and the proof machinery can fail."""

from __future__ import annotations

import numpy as np
import pytest
import sympy as sp

from vla_verify.proofs import symbolic
from vla_verify.properties import invariants as inv


@pytest.fixture(scope="module")
def proofs() -> dict[str, symbolic.Proof]:
    return symbolic.run_all()


@pytest.mark.parametrize("name", list(symbolic.ALL_PROOFS))
def test_proof_is_established(proofs: dict[str, symbolic.Proof], name: str) -> None:
    p = proofs[name]
    assert p.established, p.derivation
    assert p.steps and all(ok for _, ok in p.steps)
    assert "NOT proved" not in p.derivation
    assert p.claim in {"C1", "C3", "C4"}


def test_a_false_identity_is_not_established() -> None:
    """The checker decides; it does not rubber-stamp: a wrong Sherman–Morrison sign fails."""
    A = symbolic._sym_matrix("a", 2)
    u = symbolic._vec("u", 2)
    s = A * u
    wrong = (A + s * s.T / (1 + (u.T * A * u)[0, 0])) * (sp.eye(2) + u * u.T * A) - A
    assert not symbolic._is_zero(wrong, simplify=True)
    steps = symbolic._Steps()
    steps.check("a false step", symbolic._is_zero(wrong))
    assert not steps.proof("x", "x", "C1", (2,)).established


def test_rank_one_formula_matches_svd() -> None:
    rng = np.random.default_rng(0)
    for d in (2, 3, 7):
        for _ in range(20):
            a, b = (x / np.linalg.norm(x) for x in rng.standard_normal((2, d)))
            X = np.eye(d) - np.outer(a, b)
            c = float(a @ b)
            sv = np.linalg.svd(X, compute_uv=False)
            assert sv[0] == pytest.approx(float(inv.rank_one_sigma_max(c)), rel=1e-12)
            lower = np.sqrt((3 - 2 * c - np.sqrt(5 - 4 * c)) / 2)
            assert sv[-1] == pytest.approx(lower, abs=1e-12)
            assert np.allclose(sv[1:-1], 1.0)
    assert float(inv.rank_one_sigma_max(0.0)) == pytest.approx(inv.GOLDEN_RATIO, rel=1e-15)


def test_vla_step_minimises_the_derived_objective_numerically() -> None:
    """S_t = argmin β||v − S k̂||² + tr((S − S_prev) M (S − S_prev)ᵀ), β = 1/(||Ak̂|| − k̂ᵀAk̂)."""
    rng = np.random.default_rng(1)
    dk, dv = 4, 3
    G = rng.standard_normal((dk, dk))
    M = 0.1 * np.eye(dk) + G @ G.T
    A = np.linalg.inv(M)
    k = rng.standard_normal(dk)
    k /= np.linalg.norm(k)
    v, S_prev = rng.standard_normal(dv), rng.standard_normal((dv, dk))
    alpha = A @ k
    step = S_prev + np.outer(v - S_prev @ k, alpha / np.linalg.norm(alpha))
    beta = 1.0 / (np.linalg.norm(alpha) - k @ alpha)
    assert beta > 0
    # Stationarity: (S − S_prev)(M + βkkᵀ) = β e kᵀ, solved directly.
    e = v - S_prev @ k
    D = np.linalg.solve((M + beta * np.outer(k, k)).T, (beta * np.outer(e, k)).T).T
    np.testing.assert_allclose(S_prev + D, step, rtol=1e-10, atol=1e-12)
