"""Meta-tests of claims C1–C3 (spec §3): each verdict changes where the mathematics differs."""

from __future__ import annotations

import json

from claims_support import NudgingOracle, SignFlippedDowndate, tiny_context

from vla_verify.proofs.claims import c1_sherman_morrison, c2_selectivity, c3_closed_form
from vla_verify.proofs.ledger import Verdict
from vla_verify.spec import VLAConfig


def test_c1_holds_for_the_oracle_and_fails_for_a_planted_nudge(tmp_path):
    (ok,) = c1_sherman_morrison.run(tiny_context(tmp_path))
    assert ok.verdict is Verdict.HOLDS
    assert ok.figures["max_rel_error_float64"] < 1e-10
    assert ok.figures["max_rel_error_mpmath"] < 1e-14
    drift = ok.figures["drift"]
    assert drift["float32"][-1] > drift["float64"][-1]
    assert drift["bfloat16"][-1] > drift["float32"][-1]

    (bad,) = c1_sherman_morrison.run(tiny_context(tmp_path), backend=NudgingOracle())
    assert bad.verdict is Verdict.FAILS
    assert bad.figures["violations"] > 0
    assert any("minimal counterexample" in e for e in bad.evidence)


def test_c1_drift_is_rounding_sized():
    d = c1_sherman_morrison.drift((10, 100), 4, dtypes=("float64", "float32"))
    assert max(d["float64"]) < 1e-13
    assert 1e-9 < max(d["float32"]) < 1e-4


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
    json.dumps(vla.to_dict())
    if vla.counterexample:
        assert (tmp_path / "counterexamples").is_dir()
