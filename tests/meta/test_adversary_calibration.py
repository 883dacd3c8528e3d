"""Calibration of the adversary engine (vla_verify.properties.adversary) on problems whose worst
case is known in closed form: a search that cannot reach these cannot vouch for a bound.

- delta rule: ||S_T||_F ≤ √T, tight (spec §2.4; adversary.known_worst_state_norm);
- linear attention: ||S_T||_F ≤ T, tight;
- max ||I − a bᵀ||₂ over unit a, b is 2 (at b = −a; the C4 step matrix).

Each search must reach ≥ 0.95 of the worst case, must not exceed it (a search that breaks the
constraint set would), and a crippled search must fall short (the threshold discriminates).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

# The adversary engine differentiates through the recurrence with PyTorch.
pytest.importorskip("torch")

from vla_verify.properties import adversary
from vla_verify.spec import VLAConfig

REACH = 0.95


def _inside_constraints(run: adversary.AdversaryRun) -> None:
    dk = run.k.shape[1]
    assert np.allclose(np.linalg.norm(run.k, axis=1), 1.0)
    assert np.all(np.linalg.norm(run.v, axis=1) <= 1.0 + 1e-12)
    assert np.allclose(np.sum(run.u**2, axis=1), 1.0 / dk)


@pytest.mark.parametrize("variant,T,dk", [("delta", 300, 2), ("delta", 100, 8), ("linear", 300, 2)])
def test_greedy_reaches_the_known_worst_state_norm(variant, T, dk):
    run = adversary.greedy_state_norm(VLAConfig(), variant, T, dk, candidates=16)
    _inside_constraints(run)
    worst = adversary.known_worst_state_norm(variant, T)
    assert REACH * worst <= run.value <= worst * (1 + 1e-9)


@pytest.mark.parametrize("variant", ["delta", "linear"])
def test_gradient_search_reaches_the_known_worst_state_norm(variant):
    T = 16
    run = adversary.gradient_search_state_norm(
        VLAConfig(), variant, T, 2, restarts=4, steps=120, seed=0
    )
    _inside_constraints(run)
    worst = adversary.known_worst_state_norm(variant, T)
    assert REACH * worst <= run.value <= worst * (1 + 1e-9)


def test_rank_one_deviation_reaches_two():
    found = adversary.max_rank_one_deviation(6, restarts=4, steps=150)
    assert REACH * 2.0 <= found <= 2.0 + 1e-9


def test_product_search_finds_the_single_step_maximum():
    """One step, no penalty effect on a unit gate at λ0 = 1 with A_0 = I: the product is the
    step matrix itself, whose norm is at most the golden ratio (c = α̂ᵀk̂ > 0 for SPD A)."""
    run = adversary.gradient_search_product(VLAConfig(lambda0=1.0), 1, 4, restarts=4, steps=40)
    assert run.value <= (1 + math.sqrt(5)) / 2 + 1e-9


def test_a_crippled_search_falls_short():
    """One candidate, no refinement: the delta rule's √T is out of reach, so the 0.95 threshold
    rejects a weak search."""
    T = 300
    weak = adversary.greedy_state_norm(VLAConfig(), "delta", T, 2, candidates=1, refinements=0)
    assert weak.value < REACH * adversary.known_worst_state_norm("delta", T)


def test_known_worst_case_is_tight_by_construction():
    """The rank-one construction of the docstring: k̂_t ⊥ b, v_t = a keeps S = a bᵀ with
    ||S_t||² = t exactly; and the bound ||S_t||² ≤ ||S_{t-1}||² + 1 holds on random inputs."""
    rng = np.random.default_rng(0)
    S = np.zeros((1, 2))
    for t in range(1, 50):
        b = S[0] / np.linalg.norm(S[0]) if t > 1 else np.array([1.0, 0.0])
        k = np.array([-b[1], b[0]])
        S = S + np.outer(np.ones(1) - S @ k, k)
        assert np.linalg.norm(S) ** 2 == pytest.approx(t)
    S = np.zeros((3, 4))
    for _ in range(200):
        k = rng.standard_normal(4)
        k /= np.linalg.norm(k)
        v = rng.standard_normal(3)
        v /= max(1.0, np.linalg.norm(v))
        before = np.linalg.norm(S) ** 2
        S = S + np.outer(v - S @ k, k)
        assert np.linalg.norm(S) ** 2 <= before + 1 + 1e-9


def test_fit_exponent_and_rule_from_search():
    T = np.array([100, 1000, 10000])
    assert adversary.fit_exponent(T, 3 * T**0.5)[0] == pytest.approx(0.5)
    run = adversary.AdversaryRun(
        np.tile([1.0, 0.0], (5, 1)),
        np.ones((5, 1)),
        np.tile([0.0, -1 / math.sqrt(2)], (5, 1)),
        np.arange(1.0, 6.0),
        "planted",
    )
    rule, fraction = adversary.rule_from_search(run)
    assert fraction == pytest.approx(1.0)
    assert abs(rule.at(3) @ np.array([0.0, 1.0])) == pytest.approx(1 / math.sqrt(2))


# -- the subspace-lifted product search -------------------------------------------------------

LIFT_T = 50


def _product_class_ok(run: adversary.AdversaryRun, u_sq: float) -> None:
    assert np.allclose(np.linalg.norm(run.k, axis=1), 1.0, atol=1e-12)
    assert np.allclose(np.sum(run.u**2, axis=1), u_sq, rtol=1e-12)


@pytest.mark.parametrize("variant", ["vla", "rls"])
def test_embedding_a_subspace_run_is_exact(variant):
    """Inputs in an r-dimensional subspace act as the identity on its complement, so the product
    at the full width is max(the subspace's product, 1) at every t, and the class is kept."""
    rng = np.random.default_rng(3)
    config = VLAConfig(lambda0=0.1) if variant == "vla" else VLAConfig.exact()
    T, r, dk = 30, 3, 64
    k = rng.standard_normal((T, r))
    k /= np.linalg.norm(k, axis=1, keepdims=True)
    u = rng.standard_normal((T, r))
    u /= np.linalg.norm(u, axis=1, keepdims=True) * math.sqrt(dk)  # the full width's class
    sub = adversary.AdversaryRun(
        k, np.ones((T, 1)), u, adversary.product_norms(k, u, config, variant), "planted"
    )
    lifted = adversary.embed(sub, adversary.subspace_basis(dk, r, rng), config, variant)
    _product_class_ok(lifted, 1.0 / dk)
    np.testing.assert_allclose(lifted.values, np.maximum(sub.values, 1.0), rtol=1e-10)


@pytest.mark.parametrize("u_norm", [None, 1.0])
def test_lifted_search_stays_in_the_class(u_norm):
    """Unit keys and ||u_t|| = 1/√dk at the full width (or the given norm), every step; its
    figures are the numpy re-measure of its inputs; and it stays below the proven bound."""
    from vla_verify.proofs.claims.c4_jacobian import product_bound

    config, dk, T = VLAConfig(lambda0=0.1), 64, 20
    run = adversary.lifted_search_product(
        config, T, dk, dims=(2, 4), u_norm=u_norm, restarts=2, steps=15, refine_steps=5
    )
    u_sq = 1.0 / dk if u_norm is None else u_norm**2
    assert run.k.shape == run.u.shape == (T, dk)
    _product_class_ok(run, u_sq)
    np.testing.assert_allclose(
        run.values, adversary.product_norms(run.k, run.u, config, "vla"), rtol=1e-10
    )
    assert run.value <= product_bound(config, dk, T, u_sq=u_sq)[-1]
    assert set(run.info["by_dim"]) == {2, 4}


def test_lifted_search_reaches_the_embedded_greedy_and_a_crippled_one_does_not():
    """Known answer: the dk = 2 greedy adversary run with the dk = 64 penalty scale
    (||u||² = 1/64) reaches a product that embeds exactly into dk = 64.  The lifted gradient
    search (without the greedy) must reach ≥ 0.95 of it; one Adam step in one subspace and no
    refinement must not."""
    config, dk = VLAConfig(lambda0=0.1), 64
    greedy = adversary.greedy_product_norm(config, LIFT_T, 2, u_norm=1 / math.sqrt(dk))
    embedded = adversary.embed(
        greedy, adversary.subspace_basis(dk, 2, np.random.default_rng(0)), config
    )
    known = embedded.value
    assert known == pytest.approx(greedy.value, rel=1e-10) and known > 1.0
    strong = adversary.lifted_search_product(
        config, LIFT_T, dk, dims=(2, 4), greedy=False, restarts=4, steps=60, refine_steps=10
    )
    assert strong.value >= REACH * known
    weak = adversary.lifted_search_product(
        config, LIFT_T, dk, dims=(2,), greedy=False, restarts=1, steps=1, refine_steps=0
    )
    assert weak.value < REACH * known


def test_restarts_confined_to_a_subspace_are_searches_there():
    """restart_dims: a restart confined to the first r coordinates leaves the others zero, and
    its product is the r-dimensional one."""
    config = VLAConfig(lambda0=0.1)
    run = adversary.gradient_search_product(
        config, 12, 6, restarts=3, steps=5, u_norm=0.125, restart_dims=(2, 2, 2)
    )
    assert np.all(run.k[:, 2:] == 0) and np.all(run.u[:, 2:] == 0)
    _product_class_ok(run, 0.125**2)
    small = adversary.product_norms(run.k[:, :2], run.u[:, :2], config, "vla")
    np.testing.assert_allclose(run.values, np.maximum(small, 1.0), rtol=1e-10)
    with pytest.raises(ValueError, match="restart_dims"):
        adversary.gradient_search_product(config, 4, 6, restarts=2, restart_dims=(7, 2))
