"""One module per claim of spec §3, and the search helpers they share.

Each module defines ``CLAIM`` (a :class:`~vla_verify.proofs.ledger.Claim`) whose ``run(ctx)``
returns the :class:`~vla_verify.proofs.ledger.ClaimResult` of the claim and of its sub-claims.
The helpers here wrap Hypothesis for the two kinds of search the claims use:

- :func:`find_minimal` — the smallest input (Hypothesis shrinks dk and T first: they are drawn
  first) on which a predicate holds: a *minimal counterexample*;
- :func:`search_max` — adversarial maximisation of an objective with ``hypothesis.target``.

and the one way a claim takes the recurrence of spec §2.3 as the truth it judges by
(:func:`trusted_recurrence`, :func:`trusted_history`): the float64 run where its own accuracy
estimate (``recurrence(..., diagnose=True)``) is within the accuracy the judgement needs, the
escalated reference (:func:`vla_verify.oracle.reference`) elsewhere, and ``None`` where that
reference cannot vouch either — counted in a :class:`ReferenceTally` whose line goes into the
claim's evidence, never judged.  Places whose subject *is* the float64 or low-precision
recurrence keep the raw run on purpose: C1's drift of the Sherman–Morrison chain in
float32/bfloat16 (its truth is the direct inverse, not the recurrence) and C9's timings.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
from hypothesis import HealthCheck, Phase, find, given, settings, target
from hypothesis import seed as hypothesis_seed
from hypothesis.errors import NoSuchExample, Unsatisfiable
from hypothesis.strategies import SearchStrategy

from ...errors import IllConditionedError
from ...oracle import reference, reference_history
from ...properties.strategies import Case
from ...spec import VLAConfig
from ..ledger import Claim, Context

__all__ = [
    "CLAIMS",
    "ReferenceTally",
    "find_minimal",
    "layer_penalties",
    "run_proof",
    "search_max",
    "trusted_history",
    "trusted_recurrence",
    "unit",
]

X = TypeVar("X")

_SETTINGS: dict[str, Any] = dict(
    database=None,
    deadline=None,
    print_blob=False,
    suppress_health_check=list(HealthCheck),
)


def find_minimal(
    strategy: SearchStrategy[X],
    predicate: Callable[[X], bool],
    *,
    examples: int,
    seed: int,
) -> X | None:
    """The shrunk (minimal) example of ``strategy`` satisfying ``predicate``, or None when
    ``examples`` draws found none."""
    try:
        return find(
            strategy,
            predicate,
            settings=settings(max_examples=examples, **_SETTINGS),
            random=random.Random(seed),
        )
    except (NoSuchExample, Unsatisfiable):
        return None


def search_max(
    strategy: SearchStrategy[X],
    objective: Callable[[X], float],
    *,
    examples: int,
    seed: int,
    label: str = "objective",
    on_example: Callable[[X, float], None] | None = None,
    progress: Callable[[int], None] | None = None,
) -> tuple[float, X | None, int]:
    """Maximise ``objective`` over ``strategy`` with Hypothesis' targeted search.

    Returns ``(best value, best example, examples evaluated)``.  Non-finite values count as
    ``+inf`` (a state that overflowed is as large as it gets).
    """
    best: list[Any] = [-np.inf, None]
    count = [0]

    @hypothesis_seed(seed)
    @settings(
        max_examples=examples,
        phases=(Phase.generate, Phase.target),
        **_SETTINGS,
    )
    @given(strategy)
    def run(x: Any) -> None:
        value = float(objective(x))
        if not np.isfinite(value):
            value = np.inf
        count[0] += 1
        if progress is not None:
            progress(count[0])
        if on_example is not None:
            on_example(x, value)
        target(min(value, 1e300), label=label)
        if value > best[0]:
            best[0], best[1] = value, x

    run()
    return float(best[0]), best[1], count[0]


def unit(x: np.ndarray) -> np.ndarray:
    """``x / ||x||`` along the last axis."""
    return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-300)


def layer_penalties(rng: np.random.Generator, k_raw: np.ndarray) -> np.ndarray:
    """``u = normalize(W_u k_raw)/sqrt(dk)`` with a random bias-free ``W_u`` (spec §2.5)."""
    dk = k_raw.shape[-1]
    W_u = rng.standard_normal((dk, dk)) / np.sqrt(dk)
    return unit(k_raw @ W_u.T) / np.sqrt(dk)


@dataclass
class ReferenceTally:
    """How a claim's reference runs went: ``float64`` (its own estimate within the accuracy
    needed), ``escalated`` (mpmath, :func:`vla_verify.oracle.reference`), ``beyond`` (the
    reference cannot vouch: the example or measurement is not judged)."""

    float64: int = 0
    escalated: int = 0
    beyond: int = 0

    def evidence(self) -> str:
        """The line for the claim's evidence."""
        return (
            f"reference: {self.float64} float64 run(s) within the accuracy needed by their own "
            f"estimate, {self.escalated} escalated to mpmath, {self.beyond} beyond the "
            "reference's reach (not judged)"
        )


def _count(tally: ReferenceTally, method: str) -> None:
    if method == "float64":
        tally.float64 += 1
    else:
        tally.escalated += 1


def trusted_recurrence(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    u: np.ndarray,
    *,
    config: VLAConfig,
    rtol: float,
    tally: ReferenceTally,
    variant: str = "vla",
    initial_state: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None,
) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray, np.ndarray]] | None:
    """``(o, (S, A, z))`` of spec §2.3 (float64 arrays, the layouts of spec §1) accurate to
    ``rtol`` (relative, per (b, h) slice; at most 1/2), or None where the reference cannot
    vouch for it.

    :func:`vla_verify.oracle.reference` at ``target_rtol = rtol``: the float64 run where
    ``ESTIMATE_SAFETY`` times its own estimate is at most ``rtol``, else mpmath; where it raises
    :class:`~vla_verify.errors.IllConditionedError` the run counts as beyond reach.  ``tally``
    records which.
    """
    try:
        ref = reference(
            q,
            k,
            v,
            u,
            config=config,
            variant=variant,
            initial_state=initial_state,
            target_rtol=min(float(rtol), 0.5),
        )
    except IllConditionedError:
        tally.beyond += 1
        return None
    _count(tally, ref.method)
    return ref.o, ref.state


def trusted_history(
    case: Case,
    config: VLAConfig,
    *,
    rtol: float,
    tally: ReferenceTally,
    variant: str = "vla",
) -> dict[str, np.ndarray] | None:
    """Every intermediate state of spec §2.3 on ``case`` (its initial state included):
    ``S [B,T,H,dv,dk]``, ``A [B,T,H,dk,dk]``, ``z [B,T,H,dk]``, ``o [B,T,H,dv]`` (float64),
    accurate to ``rtol`` as :func:`trusted_recurrence`, or None where beyond reach:
    :func:`vla_verify.oracle.reference_history` (the float64 history where its estimate vouches
    for it, else the reference of every prefix, on the rare ill-conditioned case only).
    """
    try:
        h = reference_history(
            case.q,
            case.k,
            case.v,
            case.u,
            config=config,
            variant=variant,
            initial_state=case.initial_state,
            target_rtol=min(float(rtol), 0.5),
        )
    except IllConditionedError:
        tally.beyond += 1
        return None
    _count(tally, h.method)
    return {"S": h.S, "A": h.A, "z": h.z, "o": h.o}


def certify(
    ctx: Context,
    claim_id: str,
    case: Case,
    config: VLAConfig,
    quantity: str,
    where: tuple[int, int, int],
    *,
    variant: str = "vla",
    statement: str = "",
    claimed: float | None = None,
    bound: float | None = None,
    note: str = "",
    check_interval: bool = True,
) -> tuple[str | None, bool | None, str]:
    """Save a counterexample as ``ctx.outdir/counterexamples/<claim_id>.json`` and re-check it in
    interval arithmetic (:mod:`vla_verify.proofs.certificates`: ``from_case``, ``save``,
    ``recheck_interval``).

    ``quantity`` is one of ``certificates.QUANTITIES``; ``where`` the violating ``(b, t, h)``.
    ``check_interval=False`` saves without the interval re-check (``certified`` None), for a
    file whose check takes minutes (``vla-verify claims --replay`` runs it).
    Returns ``(path, certified, text for the evidence)``.
    """
    from .. import certificates

    cx = certificates.from_case(
        claim_id,
        quantity,
        case,
        config,
        where,
        variant=variant,
        statement=statement,
        claimed=claimed,
        bound=bound,
        note=note,
    )
    path = certificates.save(cx, ctx.counterexample_dir / f"{claim_id}.json")
    if not check_interval:
        return (
            str(path),
            None,
            f"counterexample {path}: {cx.describe()}; interval re-check left to "
            f"`vla-verify claims --replay {path}`",
        )
    try:
        verdict = certificates.recheck_interval(cx)
    except (ValueError, NotImplementedError) as exc:
        return (
            str(path),
            None,
            f"counterexample {path}: {cx.describe()}; no interval re-check: {exc}",
        )
    text = (
        f"counterexample {path}: {cx.describe()}; interval re-check: {verdict.detail}"
        f" => {'CERTIFIED' if verdict.certified else 'not certified'}"
    )
    return str(path), bool(verdict.certified), text


def run_proof(name: str) -> dict[str, Any] | None:
    """Run ``vla_verify.proofs.symbolic.<name>()`` and return the proof as a dict
    (``name, statement, established, derivation``), or None when it is not available."""
    try:
        from .. import symbolic
    except ImportError:
        return None
    fn = getattr(symbolic, name, None)
    if fn is None:
        return None
    proof = fn()
    return {
        "name": getattr(proof, "name", name),
        "statement": str(getattr(proof, "statement", "")),
        "established": bool(getattr(proof, "established", False)),
        "derivation": str(getattr(proof, "derivation", "") or ""),
        "steps": [list(map(str, step)) for step in getattr(proof, "steps", ()) or ()],
    }


# The claim modules import the helpers above, so they are imported last.
from . import (  # noqa: E402
    c1_sherman_morrison,
    c2_selectivity,
    c3_closed_form,
    c4_jacobian,
    c5_bounded_state,
    c6_state_norm_figure,
    c7_capacity,
    c8_cost,
    c9_kernel_speed,
    c10_recall,
)

#: The claims of spec §3, in order.
CLAIMS: list[Claim] = [
    m.CLAIM
    for m in (
        c1_sherman_morrison,
        c2_selectivity,
        c3_closed_form,
        c4_jacobian,
        c5_bounded_state,
        c6_state_norm_figure,
        c7_capacity,
        c8_cost,
        c9_kernel_speed,
        c10_recall,
    )
]
