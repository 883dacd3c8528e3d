"""The claims ledger's reference (:mod:`vla_verify.proofs.claims`: ``trusted_recurrence``,
``trusted_history``): float64 where its own estimate vouches for the accuracy a judgement needs,
the escalated reference where it does not (checked against 500-digit mpmath), and "beyond
reach" — counted, never returned — where that reference cannot vouch either."""

from __future__ import annotations

import numpy as np

from vla_verify import VLAConfig, oracle
from vla_verify.proofs.claims import ReferenceTally, trusted_history, trusted_recurrence
from vla_verify.properties.strategies import Case

EXACT = VLAConfig.exact()


def _strongly_penalised(scale: float, B: int = 1) -> list[np.ndarray]:
    """Six tokens, dk = 3, dv = 2, penalties of norm ``scale`` (the reference's known case),
    repeated ``B`` times along the batch."""
    rng = np.random.default_rng(0)
    q = np.exp(rng.standard_normal((1, 6, 1, 3)))
    k = np.exp(rng.standard_normal((1, 6, 1, 3)))
    v = rng.standard_normal((1, 6, 1, 2))
    u = rng.standard_normal((1, 6, 1, 3)) * scale
    return [np.repeat(x, B, axis=0) for x in (q, k, v, u)]


def _rel(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.max(np.abs(got - want)) / np.max(np.abs(want)))


def test_an_ill_conditioned_input_escalates_to_the_right_answer() -> None:
    inputs = _strongly_penalised(1e8)
    o_mp, state_mp = oracle.recurrence_mp(*inputs, config=EXACT, dps=500)
    raw = oracle.recurrence(*inputs, config=EXACT)
    assert _rel(raw.o, o_mp) > 1e-2  # what a raw float64 truth would have judged against
    tally = ReferenceTally()
    got = trusted_recurrence(*inputs, config=EXACT, rtol=1e-10, tally=tally)
    assert got is not None
    assert (tally.float64, tally.escalated, tally.beyond) == (0, 1, 0)
    assert _rel(got[0], o_mp) <= 1e-10
    for x, want in zip(got[1], state_mp, strict=True):
        assert _rel(x, want) <= 1e-10


def test_an_input_the_reference_cannot_vouch_for_is_beyond_reach() -> None:
    """The same case repeated along the batch until it is too large to escalate."""
    inputs = _strongly_penalised(1e8, B=3000)  # B·T·dk·(dk + dv) = 270 000 > 200 000
    tally = ReferenceTally()
    assert trusted_recurrence(*inputs, config=EXACT, rtol=1e-10, tally=tally) is None
    assert (tally.float64, tally.escalated, tally.beyond) == (0, 0, 1)
    assert "1 beyond the reference's reach (not judged)" in tally.evidence()


def test_a_well_conditioned_input_keeps_float64() -> None:
    """The other side of the threshold: no escalation where float64 vouches for itself."""
    rng = np.random.default_rng(3)
    q, k = (np.exp(rng.standard_normal((2, 12, 2, 3))) for _ in range(2))
    v = rng.standard_normal((2, 12, 2, 2))
    u = rng.standard_normal((2, 12, 2, 3)) / np.sqrt(3)
    tally = ReferenceTally()
    got = trusted_recurrence(q, k, v, u, config=VLAConfig(), rtol=1e-10, tally=tally)
    assert got is not None and (tally.float64, tally.escalated, tally.beyond) == (1, 0, 0)
    np.testing.assert_array_equal(got[0], oracle.recurrence(q, k, v, u, config=VLAConfig()).o)


def test_the_history_escalates_prefix_by_prefix() -> None:
    inputs = _strongly_penalised(1e8)
    case = Case(*inputs, None, split=3, regimes={}, seed=0)
    tally = ReferenceTally()
    history = trusted_history(case, EXACT, rtol=1e-10, tally=tally)
    assert history is not None and tally.escalated == 1
    raw = oracle.recurrence(*inputs, config=EXACT, return_states=True).history
    assert raw is not None
    for t in (1, 3, 6):
        o_mp, (S_mp, A_mp, _) = oracle.recurrence_mp(
            *(x[:, :t] for x in inputs), config=EXACT, dps=500
        )
        assert _rel(history["S"][:, t - 1], S_mp) <= 1e-10
        assert _rel(history["A"][:, t - 1], A_mp) <= 1e-10
        assert _rel(history["o"][:, t - 1], o_mp[:, t - 1]) <= 1e-10
    assert _rel(raw.A[:, 5], history["A"][:, 5]) > 1e-2  # float64's A_T is far off


def test_c7_redoes_a_batch_pass_by_pass_and_leaves_out_what_is_beyond_reach() -> None:
    """C7's passes: a batch the reference cannot vouch for (one strongly penalised pass, too
    large to escalate: T·dk·(dk + dv) = 204 800 > 200 000) is redone pass by pass; the
    ordinary passes keep float64, the penalised one is left out and counted."""
    from vla_verify.proofs.claims.c7_capacity import _trusted_states

    rng = np.random.default_rng(0)
    T, dk = 400, 16
    k = np.exp(rng.standard_normal((3, T, 1, dk)))
    v = rng.standard_normal((3, T, 1, dk))
    u = rng.standard_normal((3, T, 1, dk)) / dk
    u[0] *= 1e9
    tally = ReferenceTally()
    S, kept = _trusted_states(k, v, u, VLAConfig(), "vla", tally)
    assert kept.tolist() == [False, True, True]
    assert (tally.float64, tally.escalated, tally.beyond) == (2, 0, 1)
    plain = oracle.recurrence(k[1:], k[1:], v[1:], u[1:], config=VLAConfig()).state[0][:, 0]
    np.testing.assert_allclose(S[1:], plain, rtol=1e-12, atol=0)


def _marginal_on_float64(monkeypatch):
    """Plant a float64 run that cannot vouch for its verdict: judged on the float64 history,
    every example "violates" the bound by a relative 1e-13 of it (far below the float64 run's
    own error); judged on a given history, the invariant is the real one."""
    from vla_verify.properties import invariants

    real = invariants.closed_form_equivalence

    def planted(case, config, *, variant="vla", backend="numpy", history=None):
        r = real(case, config, variant=variant, backend=backend, history=history)
        if history is not None:
            return r
        return invariants.InvariantResult(
            r.name, False, r.bound * (1 + 1e-13), r.bound, r.detail, r.where, r.extra
        )

    monkeypatch.setattr(invariants, "closed_form_equivalence", planted)
    from vla_verify.proofs.claims import c3_closed_form

    monkeypatch.setattr(c3_closed_form, "run_proof", lambda name: None)  # sympy: not the point


def test_c3_rejudges_a_violation_float64_cannot_vouch_for(monkeypatch, tmp_path) -> None:
    """C3.rls with the planted float64 verdicts: every violation is re-judged on the escalated
    reference's history, where it holds: HOLDS, with the escalations in the evidence."""
    from claims_support import tiny_context

    from vla_verify.proofs.claims import c3_closed_form
    from vla_verify.proofs.ledger import Verdict

    _marginal_on_float64(monkeypatch)
    result = c3_closed_form.run_variant(tiny_context(tmp_path), "rls")
    assert result.verdict is Verdict.HOLDS
    assert result.figures["violations"] == 0 and result.figures["beyond_reference_reach"] == 0
    text = " ".join(result.evidence)
    n = result.figures["examples"]
    assert (
        f"0 float64 run(s) within the accuracy needed by their own estimate, {n} escalated" in text
    )


def test_c3_counts_what_the_reference_cannot_vouch_for(monkeypatch, tmp_path) -> None:
    """The same, with a reference that cannot vouch: no violation is counted, the examples are
    beyond reach, and the claim is NOT_MEASURED rather than HOLDS."""
    from claims_support import tiny_context

    from vla_verify import proofs
    from vla_verify.errors import IllConditionedError
    from vla_verify.proofs.claims import c3_closed_form
    from vla_verify.proofs.ledger import Verdict

    def refuses(*args, **kwargs):
        raise IllConditionedError("planted", step=1, figure="gate", estimate=1.0)

    _marginal_on_float64(monkeypatch)
    monkeypatch.setattr(proofs.claims, "reference_history", refuses)
    result = c3_closed_form.run_variant(tiny_context(tmp_path), "rls")
    assert result.verdict is Verdict.NOT_MEASURED
    assert result.figures["violations"] == 0
    assert result.figures["beyond_reference_reach"] == result.figures["examples"] > 0
