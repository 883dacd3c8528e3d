"""Meta-tests of claims C1–C3 (spec §3): each verdict changes where the mathematics differs."""

from __future__ import annotations

import json

import pytest
from claims_support import (
    NudgingOracle,
    SignFlippedDowndate,
    mp_recurrence_off_by_one,
    tiny_context,
)

from vla_verify.proofs.claims import c1_sherman_morrison, c2_selectivity, c3_closed_form
from vla_verify.proofs.ledger import Verdict
from vla_verify.spec import VLAConfig


def test_c1_verdict_per_precision_follows_the_drift(tmp_path):
    results = {r.id: r for r in c1_sherman_morrison.run(tiny_context(tmp_path))}
    assert list(results) == [f"C1.{d}" for d in c1_sherman_morrison.PRECISIONS]
    f64 = results["C1.float64"]
    assert f64.verdict is Verdict.HOLDS
    assert f64.figures["max_rel_error"] <= min(f64.figures["budget"])  # rounding-sized
    assert f64.figures["max_rel_error_mpmath"] < 1e-14
    for r in results.values():
        errors, T = r.figures["rel_error"], r.figures["T"]
        first = r.figures["passes_1pct_at_T"]
        # The verdict moves with its evidence: FAILS exactly when some error passes 1% (or a
        # budget), and the reported length is the first that does.
        if first is None:
            assert r.verdict is Verdict.HOLDS and max(errors) <= 0.01
        else:
            assert r.verdict is Verdict.FAILS
            assert errors[T.index(first)] > 0.01 and all(
                e <= 0.01 for e in errors[: T.index(first)]
            )
    assert results["C1.bfloat16"].verdict is Verdict.FAILS  # u = 2^-8: past 1% within 10^3
    assert results["C1.float32"].figures["max_rel_error"] < 1e-4


def test_c1_fails_for_a_planted_nudge_and_an_mpmath_result_off_by_one(tmp_path):
    bad = c1_sherman_morrison.run(tiny_context(tmp_path), backend=NudgingOracle())[0]
    assert bad.id == "C1.float64" and bad.verdict is Verdict.FAILS
    assert bad.figures["violations"] > 0
    assert any("minimal counterexample" in e for e in bad.evidence)
    off = c1_sherman_morrison.run(tiny_context(tmp_path), mp_recurrence=mp_recurrence_off_by_one)[0]
    assert off.verdict is Verdict.FAILS
    assert off.figures["max_rel_error_mpmath"] > 0.1


def test_c1_drift_is_rounding_sized():
    d = c1_sherman_morrison.drift((10, 100), 4, dtypes=("float64", "float32"))
    assert max(d["float64"]["error"]) < 1e-13
    assert 1e-9 < max(d["float32"]["error"]) < 1e-4
    assert all(e <= b for e, b in zip(d["float32"]["error"], d["float32"]["budget"], strict=True))


def test_c1_reference_agrees_with_mpmath():
    u = c1_sherman_morrison._layer_penalties(200, 4, 0)[0, :, 0]
    err, bound = c1_sherman_morrison.reference_check(u, 0.1, 200)
    assert err <= bound


def test_c2_nudges_condition_exact_holds_sign_flip_fails(tmp_path):
    (paper,) = c2_selectivity.run(tiny_context(tmp_path))
    assert paper.verdict is Verdict.HOLDS_ONLY_IF
    assert "nudge" in paper.condition

    (exact,) = c2_selectivity.run(tiny_context(tmp_path), config=VLAConfig.exact())
    assert exact.verdict is Verdict.HOLDS

    (flipped,) = c2_selectivity.run(
        tiny_context(tmp_path), config=VLAConfig.exact(), backend=SignFlippedDowndate()
    )
    assert flipped.verdict is Verdict.FAILS


def test_c3_vla_fails_minimally_and_rls_holds(tmp_path):
    ctx = tiny_context(tmp_path)
    vla = c3_closed_form.run_variant(ctx, "vla")
    rls = c3_closed_form.run_variant(ctx, "rls")
    assert vla.verdict is Verdict.FAILS
    assert rls.verdict is Verdict.HOLDS
    assert "B=1 T=1 H=1 dk=1" in " ".join(vla.evidence)  # shrunk to the smallest dk and T
    assert "objective_minimised_by_step" in vla.figures
    # The interpretable figure: at t = 1 with u ⊥ k the distance from the argmin is λ0 exactly.
    assert vla.figures["rel_error_t1_u_perp_k"] == pytest.approx(vla.figures["lambda0"], rel=1e-12)
    assert rls.figures["rel_error_t1_u_perp_k"] < 1e-14
    json.dumps(vla.to_dict())
    if vla.counterexample:
        assert (tmp_path / "counterexamples").is_dir()
