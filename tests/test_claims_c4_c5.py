"""Meta-tests of claims C4 and C5 (spec §3)."""

from __future__ import annotations

import numpy as np
import pytest
from claims_support import tiny_context

from vla_verify.proofs.claims import c4_jacobian, c5_bounded_state
from vla_verify.proofs.ledger import Verdict
from vla_verify.spec import VLAConfig


def test_c4_step_only_if_parallel_and_delta_holds(tmp_path):
    vla = c4_jacobian.run_step(tiny_context(tmp_path))
    assert vla.verdict is Verdict.HOLDS_ONLY_IF
    assert "∥" in vla.condition
    assert 1.0 < vla.figures["max_step_norm"] < (1 + 5**0.5) / 2
    delta = c4_jacobian.run_step(tiny_context(tmp_path), variant="delta")
    assert delta.verdict is Verdict.HOLDS


def test_c4_product_fails_for_vla_and_holds_for_linear(tmp_path):
    vla = c4_jacobian.run_product(tiny_context(tmp_path))
    assert vla.verdict is Verdict.FAILS
    if vla.counterexample is not None:  # when the short search finds one, it is certified
        from vla_verify.proofs import certificates

        assert vla.certified is True
        assert certificates.replay(vla.counterexample).ok
    linear = c4_jacobian.run_product(tiny_context(tmp_path), variant="linear")
    assert linear.verdict is Verdict.HOLDS


def test_c4_unnormalised_depends_on_lambda0(tmp_path):
    paper = c4_jacobian.run_unnormalised(tiny_context(tmp_path))
    assert paper.verdict is Verdict.NOT_REPRODUCED
    assert paper.figures["log10_product"] <= paper.figures["proven_bound_log10"]
    small = c4_jacobian.run_unnormalised(tiny_context(tmp_path), lambda0=0.03)
    assert small.verdict is Verdict.REPRODUCED


def test_c5_growth_classifier():
    assert c5_bounded_state.growth([1.0, 2.0, 4.0], [1, 4, 16])[1]  # T^0.5, steady
    assert not c5_bounded_state.growth([10.0, 16.0, 17.0], [1, 4, 16])[1]  # saturating
    assert not c5_bounded_state.growth([3.0, 3.0, 3.0], [1, 4, 16])[1]  # flat


def test_c5_shear_family_respects_the_input_bounds():
    case = c5_bounded_state.shear_case(50, 4, power=0.5, mix=0.5, flip_values=True)
    assert np.allclose(np.linalg.norm(case.v, axis=-1), 1.0)
    assert np.allclose(np.sum(case.u**2, axis=-1), 1 / 4)
    with pytest.raises(ValueError, match="dk"):
        c5_bounded_state.shear_case(5, 1)


def test_c5_vla_only_with_nudges_and_linear_unbounded(tmp_path):
    (vla,) = c5_bounded_state.run(tiny_context(tmp_path))
    assert vla.verdict is Verdict.HOLDS_ONLY_IF
    assert vla.figures["exponent_exact"] > 0.25
    (linear,) = c5_bounded_state.run(tiny_context(tmp_path), variant="linear")
    assert linear.verdict is Verdict.FAILS
    assert linear.figures["exponent_linear"] == pytest.approx(1.0, abs=0.05)
    assert set(vla.series["state_norms_random"]) == {"linear", "delta", "vla", "rls"}
    assert VLAConfig().nudge_period is not None


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
