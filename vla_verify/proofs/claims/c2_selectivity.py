"""C2 — directional selectivity (spec §3 C2).

Claim: penalising ``u`` shrinks ``A`` along ``u`` (``u_tᵀA_t u_t < u_tᵀA_{t-1}u_t``) and leaves
untouched the directions orthogonal, in the M-metric, to the penalised one.

Method: a Hypothesis search over :func:`~vla_verify.properties.strategies.cases` judged by the
invariant :func:`~vla_verify.properties.invariants.directional_selectivity` (both statements,
within rounding), for the configuration under test (default: the paper preset, whose nudge
``A += η·I`` acts on every direction).  When violations appear, the search is repeated on the
same examples leaving out the steps where a nudge fires: if that removes every violation, the
verdict is HOLDS_ONLY_IF with that condition; otherwise FAILS.  The exact preset (no nudges) is
searched too and reported beside it.

``backend`` exists for the meta-tests (a planted backend whose downdate has the wrong sign).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ...properties import invariants
from ...properties.strategies import Case, ShapeBounds, cases
from ...spec import VLAConfig
from ..ledger import Claim, ClaimResult, Context, Verdict
from . import certify, find_minimal, search_max

__all__ = ["CLAIM", "run"]

STATEMENT = (
    "Penalising u shrinks A along u: uᵀA_t u < uᵀA_{t-1}u, and directions orthogonal (in the "
    "M-metric) to all penalised directions are untouched."
)
CONDITION = "no nudge fires at step t (t not a multiple of nudge_period, or nudge_period=None)"


def _worst_increase(case: Case, config: VLAConfig) -> tuple[int, int, int]:
    """``(b, t, h)`` of the largest increase of ``u_tᵀA u_t`` over one oracle step."""
    h = invariants.oracle_history(case, config)
    B, _T, H, dk, _ = case.shapes
    A0 = (
        np.broadcast_to(np.eye(dk) / config.lambda0, (B, H, dk, dk))
        if case.initial_state is None
        else case.initial_state[1]
    )
    A_prev = np.concatenate([np.asarray(A0)[:, None], h.A[:, :-1]], axis=1)
    g = np.einsum("bthi,bthij,bthj->bth", case.u, h.A - A_prev, case.u)
    b, t, hh = np.unravel_index(int(np.argmax(g)), g.shape)
    return int(b), int(t), int(hh)


def _search(
    ctx: Context, config: VLAConfig, backend: Any, label: str
) -> tuple[list[Case], int, str]:
    p = ctx.profile
    bounds = ShapeBounds(
        max_B=1,
        max_H=2,
        max_T=max(p.max_T, 2 * (config.nudge_period or 1) + 2),
        max_dk=p.max_dk,
        max_dv=2,
    )
    strategy = cases(config, bounds, state_regimes=("none", "spd"))
    violations: list[Case] = []
    worst = {"ratio": -1.0, "detail": ""}

    def objective(case: Case) -> float:
        r = invariants.directional_selectivity(case, config, backend=backend)
        if not r.holds:
            violations.append(case)
        ratio = r.value / r.bound if r.bound > 0 else 0.0
        if ratio > worst["ratio"]:
            worst.update(ratio=ratio, detail=r.detail)
        return ratio

    bar = ctx.bar(f"C2 search ({label})", p.examples)
    _, _, n = search_max(strategy, objective, examples=p.examples, seed=ctx.seed, progress=bar)
    bar.close()
    return violations, n, str(worst["detail"])


def run(
    ctx: Context, *, config: VLAConfig | None = None, backend: Any = "numpy"
) -> list[ClaimResult]:
    config = VLAConfig() if config is None else config
    violations, n, worst = _search(ctx, config, backend, "paper preset")
    exact_violations, n_exact, _ = _search(ctx, VLAConfig.exact(), backend, "exact")

    # Does "no nudge at this step" separate the violations?
    separated = bool(violations) and config.nudge_period is not None and not exact_violations
    for case in violations:
        r = invariants.directional_selectivity(case, config, backend=backend, skip_nudge_steps=True)
        separated = separated and r.holds
    verdict = Verdict.from_search(len(violations), condition_separates=separated)

    evidence = [
        f"{n} Hypothesis examples under {config}: {len(violations)} violation(s); worst: {worst}",
        f"exact preset (no nudges): {n_exact} examples, {len(exact_violations)} violation(s)",
    ]
    counterexample = certified = None
    if violations:
        p = ctx.profile
        period = config.nudge_period or 1
        bounds = ShapeBounds(
            max_B=1, max_H=1, max_T=max(p.max_T, 2 * period + 2), max_dk=p.max_dk, max_dv=1
        )
        minimal = find_minimal(
            cases(config, bounds, state_regimes=("none", "spd")),
            lambda c: not invariants.directional_selectivity(c, config, backend=backend).holds,
            examples=p.examples,
            seed=ctx.seed,
        )
        minimal = minimal if minimal is not None else violations[0]
        counterexample, certified, note = certify(
            ctx,
            "C2",
            minimal,
            config,
            "selectivity_increase",
            _worst_increase(minimal, config),
            statement=STATEMENT,
            note=f"found with backend {getattr(backend, 'name', backend)}; re-measured with "
            "the oracle",
        )
        evidence.append(
            f"minimal counterexample: {minimal.describe()} — "
            + invariants.directional_selectivity(minimal, config, backend=backend).detail
        )
        evidence.append(note)
        if separated:
            evidence.append(
                "every violation is at a nudge step: with those steps left out, all hold"
            )
    return [
        ClaimResult(
            id="C2",
            title="Directional selectivity",
            statement=STATEMENT,
            formalisation=(
                "per step with u_t ≠ 0: (a) u_tᵀA_t u_t − u_tᵀA_{t-1}u_t ≤ rounding, and (b) "
                "A_t x = A_{t-1}x for every x with xᵀA_{t-1}u_t = 0 (within rounding)"
            ),
            method="Hypothesis search (target: violation/rounding ratio), invariant "
            "directional_selectivity; paper preset and exact preset",
            verdict=verdict,
            condition=CONDITION if verdict is Verdict.HOLDS_ONLY_IF else None,
            figures={
                "examples": n,
                "violations": len(violations),
                "exact_examples": n_exact,
                "exact_violations": len(exact_violations),
            },
            key_figure="violations",
            evidence=evidence,
            counterexample=counterexample,
            certified=certified,
        )
    ]


CLAIM = Claim("C2", "Directional selectivity", run)
