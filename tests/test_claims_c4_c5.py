"""Meta-tests of claims C4 and C5 (spec §3)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
from claims_support import TINY, tiny_context

from vla_verify.proofs.claims import c4_jacobian, c5_bounded_state
from vla_verify.proofs.ledger import Verdict
from vla_verify.properties import invariants
from vla_verify.properties.strategies import Case
from vla_verify.spec import VLAConfig


def test_c4_step_only_if_parallel_and_delta_holds(tmp_path):
    vla = c4_jacobian.run_step(tiny_context(tmp_path))
    assert vla.verdict is Verdict.HOLDS_ONLY_IF
    assert "∥" in vla.condition
    assert 1.0 < vla.figures["max_step_norm"] < (1 + 5**0.5) / 2
    delta = c4_jacobian.run_step(tiny_context(tmp_path), variant="delta")
    assert delta.verdict is Verdict.HOLDS


def test_c4_product_finds_a_certified_explosion(tmp_path):
    """The adversary finds a product above the ceiling 10 (certified, replays), below the proven
    bound; vanishing is reported beside it with the delta rule's."""
    from vla_verify.proofs import certificates

    ctx = tiny_context(tmp_path)
    ctx.profile = dataclasses.replace(
        ctx.profile, product_dk=(8,), product_T=48, adversary_steps=40
    )
    result = c4_jacobian.run_product(ctx)
    worst = result.figures["worst_product_norm"]
    assert result.verdict is Verdict.FAILS and worst > c4_jacobian.EXPLODE
    assert result.certified is True and certificates.replay(result.counterexample).ok
    row = result.figures["by_setting"]["dk=8 lambda0=0.1"]
    assert row["worst_product_norm"] <= row["proven_bound"]
    assert result.figures["min_product_norm_delta"] < c4_jacobian.VANISH
    assert result.figures["delta_vanishes_too"] is True


def test_c4_product_bound_holds_on_random_inputs():
    rng = np.random.default_rng(0)
    for dk, lam in ((2, 0.1), (8, 1.0)):
        config = VLAConfig(lambda0=lam)
        T = 40
        k = rng.standard_normal((1, T, 1, dk))
        u = rng.standard_normal((1, T, 1, dk))
        u = u / np.linalg.norm(u, axis=-1, keepdims=True) / np.sqrt(dk)
        case = Case(k, k, np.ones((1, T, 1, 1)), u, None, 1)
        logs = invariants.jacobian_product_norm(case, config, cumulative=True)[0, :, 0]
        assert np.all(10**logs <= c4_jacobian.product_bound(config, dk, T) * (1 + 1e-9))


def test_c4_unnormalised_depends_on_lambda0(tmp_path):
    paper = c4_jacobian.run_unnormalised(tiny_context(tmp_path))
    assert paper.verdict is Verdict.NOT_REPRODUCED
    assert paper.figures["log10_product"] <= paper.figures["proven_bound_log10"]
    small = c4_jacobian.run_unnormalised(tiny_context(tmp_path), lambda0=0.03)
    assert small.verdict is Verdict.REPRODUCED


@pytest.fixture(scope="module")
def c5_results(tmp_path_factory):
    ctx = tiny_context(tmp_path_factory.mktemp("c5"))
    return {r.id: r for r in c5_bounded_state.run(ctx)}


def test_c5_paper_preset_fails_by_search(c5_results):
    """Under the paper preset the adversary's state grows over two decades of T: FAILS, with the
    exponent fitted by least squares and the baselines' known growth reproduced beside it."""
    paper = c5_results["C5.paper"]
    assert paper.verdict is Verdict.FAILS
    exponents = paper.figures["exponent"]
    assert exponents["vla.paper dk=2"] > 0.3
    assert exponents["linear dk=2"] == pytest.approx(1.0, abs=0.01)  # O(T), tight
    assert exponents["delta dk=2"] == pytest.approx(0.5, abs=0.01)  # √T, tight
    ratio = paper.figures["ratio_to_delta_worst_case"]
    assert ratio[max(ratio)] > 5  # far beyond the delta rule's worst case
    assert paper.figures["calibration"]["delta"] >= 0.95
    assert "gradient search" in " ".join(paper.evidence)
    assert c5_results["C5.exact"].verdict is Verdict.FAILS
    assert set(paper.series["state_norms_random"]) == {"linear", "delta", "vla", "rls"}


def test_c5_counterexamples_replay(c5_results):
    """The longest counterexample reproduces in float64; its prefix is certified in intervals."""
    from vla_verify.proofs import certificates

    paper = c5_results["C5.paper"]
    cx = certificates.load(paper.counterexample)
    assert cx.arrays()["k"].shape[1] == TINY.growth_T[-1]  # the longest T
    assert certificates.measure(cx) == pytest.approx(cx.measured, rel=1e-12)
    assert cx.measured > cx.claimed
    prefix = Path(paper.counterexample).with_name(f"C5.paper.T{TINY.growth_T[-1] // 10}.json")
    assert certificates.replay(prefix).ok


def test_c4_product_certificate_on_a_known_vanishing_product():
    """With no penalty (u = 0) the gate is k̂ itself and each step is the projector I − k̂k̂ᵀ;
    alternating keys 60° apart give ||X_1 ⋯ X_t||₂ = cos(60°)^(t-1) = 2^-(t-1) exactly."""
    from vla_verify.proofs import certificates
    from vla_verify.properties.strategies import Case

    T = 6
    keys = np.array([[1.0, 0.0], [0.5, np.sqrt(3) / 2]])[np.arange(T) % 2]
    k = keys.reshape(1, T, 1, 2)
    case = Case(k + 1.0, k, np.ones((1, T, 1, 1)), np.zeros((1, T, 1, 2)), None, 1)
    config = VLAConfig.exact()
    cx = certificates.from_case(
        "C4.product", "jacobian_product_vanishing", case, config, (0, T - 1, 0)
    )
    assert cx.measured == pytest.approx(2.0 ** -(T - 1), rel=1e-12)
    assert certificates.recheck_interval(cx).certified  # 1/32 < 0.1, certainly
    early = certificates.from_case(
        "C4.product", "jacobian_product_vanishing", case, config, (0, 1, 0)
    )
    assert not certificates.recheck_interval(early).certified  # 1/2 is not below 0.1


@pytest.mark.slow
def test_c5_longest_counterexample_replays_through_the_cli(c5_results, capsys):
    """``vla-verify claims --replay`` certifies the longest file, raising the interval precision
    to what the length needs."""
    from vla_verify import cli

    assert cli.main(["claims", "--replay", c5_results["C5.paper"].counterexample]) == 0
    out = capsys.readouterr().out
    assert "still fails: yes" in out and "certified" in out
