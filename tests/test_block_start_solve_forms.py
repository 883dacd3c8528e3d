"""``benchmarks/gpu/block_start_solve_forms.py`` and the precision study of
``benchmarks/prototypes/block_start_inverse_forms.py``: the block starts' solve in the
Cholesky form agrees with the backend's LU on a forward's ``(Π; Θ)`` under Triton's
interpreter, and each check rejects a planted fault (a Cholesky form of ``Πᵀ Π``; Newton–Schulz
cut short)."""

from __future__ import annotations

import sys
from pathlib import Path

from script_support import interpreted_chunked_marks, load_script

pytestmark = interpreted_chunked_marks()
forms = load_script("benchmarks/gpu/block_start_solve_forms.py")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks" / "prototypes"))
import block_start_inverse_forms as study  # noqa: E402
import numpy as np  # noqa: E402


def _wrong_cholesky(XX):  # type: ignore[no-untyped-def]
    """The Cholesky form with ``Θ`` read as ``Π`` (so ``S = Πᵀ Π`` in place of ``Θᵀ Π``)."""
    dk = XX.shape[-1]
    planted = XX.clone()
    planted[:, :, dk:] = XX[:, :, :dk]
    return forms.solve_cholesky(planted)


def _nudged_cholesky(XX):  # type: ignore[no-untyped-def]
    """The Cholesky starts moved by 1e-7 of their size: inside the starts' gate at these
    blocks, outside the float64 chain's block-end check, whose fallback must not count as
    agreement."""
    A = forms.solve_cholesky(XX)
    return A * (1 + 1e-7)


def test_the_cholesky_form_agrees_with_the_lu_and_a_wrong_one_does_not() -> None:
    candidates = {"cholesky": forms.solve_cholesky, "planted": _wrong_cholesky,
                  "nudged": _nudged_cholesky}  # fmt: skip
    row = forms.row(16, 96, "cpu", smoke=True, forms=candidates, examples=2)
    assert row["lu"]["agrees"] and row["cholesky"]["agrees"]
    assert row["cholesky"]["starts_relative_to_lu"] < 1e-13
    checked = row["cholesky"]["validate"]
    assert checked["passed"] and checked["solves"] > 0 and checked["fallbacks"] == 0
    assert not row["planted"]["agrees"] and "validate" not in row["planted"]
    assert row["planted"]["starts_relative_to_lu"] > 1e3 * row["agree_rtol"]
    nudged = row["nudged"]
    assert nudged["starts_relative_to_lu"] < row["agree_rtol"]
    assert nudged["block_start_fallbacks"] > 0 and not nudged["agrees"]


def test_every_form_reaches_the_recurrence_and_newton_schulz_cut_short_does_not(
    monkeypatch,  # type: ignore[no-untyped-def]
) -> None:
    row = study.study(512, 8, 64, "layer")
    for form in study.FORMS:
        assert row[f"{form}_float64"] < 1e-12, form
    assert row["newton_schulz_float64_steps"] > 4
    monkeypatch.setattr(study, "MAX_STEPS", 2)
    cut = study.study(512, 8, 64, "layer")
    assert cut["newton_schulz_float64"] > 1e-3
    assert np.isclose(cut["lu_float64"], row["lu_float64"])
