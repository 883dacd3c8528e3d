"""C7 — capacity (spec §3 C7): how many associations one pass stores and recalls.

The paper: per head, up to dk associations are recalled exactly; beyond dk, VLA degrades more
gracefully than linear attention.  Measured: n associations ``(k_i, v_i)``, n = 1 … 2·dk, with
random unit keys and random unit values (``dv = dk``), penalties ``u = normalize(W_u k)/sqrt(dk)``
(spec §2.5), written by one pass of the recurrence; then each key is read back, ``r_i = S_n k̂_i``.
Variants ``vla``, ``delta``, ``linear`` (paper preset) and ``rls`` (exact preset).

Recall criteria (each with its own verdict):

- ``tolerance`` — ``||r_i − v_i|| ≤ TOLERANCE`` (1e-6; ``v_i`` is unit): the value itself comes
  back.  This is what the paper's "recalled **exactly**" says, so ``C7.exact`` under it is the
  paper's reading.
- ``cosine`` — ``cos(r_i, v_i) > 0.9``: the direction comes back, the magnitude may not.
- ``nearest`` — the nearest stored value (largest cosine) is ``v_i``: a retrieval among the
  stored values, as an argmax read-out decodes it.  "Degrades gracefully" is a statement about
  partial recall beyond dk, which only a graded criterion can show; the paper's recall
  experiments (C10) score an argmax retrieval, so ``C7.graceful`` under ``nearest`` is the
  paper's reading.

Sub-claims, per criterion c: ``C7.exact.<c>`` (the subject recalls every association for every
n ≤ dk) and ``C7.graceful.<c>`` (for dk < n ≤ 2·dk its mean recall is greater than
linear attention's).

Each pass comes from :func:`~vla_verify.proofs.claims.trusted_recurrence` at ``STATE_RTOL``
(the float64 run where its own estimate vouches for it, else the escalated reference); a trial
beyond the reference's reach is left out of the recall it would count in, and counted in the
evidence.

On trained models: ``C7.mqar.exact`` and ``C7.mqar.graceful`` read the MQAR capacity grid
(``mqar``: T = 256, n ∈ :data:`MQAR_N`, d_h = 32) from the repository's results folder, like C10
(or from an explicit ``path``).  ``exact``: every VLA cell with n ≤ d_h agrees with 1.000 under
C10's rule (:func:`~vla_verify.proofs.claims.c10_recall.agrees`).  ``graceful``: at every n > d_h
VLA's mean test accuracy exceeds linear attention's by more than ``SEPARATION`` standard errors
of the difference (:func:`~vla_verify.proofs.verdicts.clearly_greater`); DeltaNet and softmax
are reported beside.  Both follow :func:`~vla_verify.proofs.verdicts.cells_verdict`: a cell
measured on at least ``MIN_SEEDS`` seeds that disagrees decides NOT_REPRODUCED, else a cell
lacking seeds leaves NOT_MEASURED (named in the evidence), else REPRODUCED.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from ...experiments.results import D_HEAD, MIN_SEEDS, find_cell
from ...spec import VLAConfig
from ..ledger import Claim, ClaimResult, Context, Verdict
from ..verdicts import SEPARATION, Comparison, cells_verdict, clearly_greater
from . import ReferenceTally, c10_recall, trusted_recurrence, unit

__all__ = [
    "CLAIM",
    "CRITERIA",
    "MQAR_MIXERS",
    "MQAR_N",
    "MQAR_T",
    "PAPER_READING",
    "VARIANTS",
    "mqar_results",
    "recall_curves",
    "run",
]

VARIANTS = ("vla", "delta", "linear", "rls")
CRITERIA = ("tolerance", "cosine", "nearest")
#: ``tolerance``: the largest ``||S k̂_i − v_i||`` that counts as exact recall (unit values).
TOLERANCE = 1e-6
#: ``cosine``: the smallest ``cos(S k̂_i, v_i)`` that counts as recall.
COSINE = 0.9
#: The accuracy a state needs (relative): far below ``TOLERANCE`` (unit keys and values, so
#: ``||S||`` is of order one), the finest threshold a read-out is judged by.
STATE_RTOL = TOLERANCE * 1e-2
#: The criterion the paper's words mean, per sub-claim (module docstring).
PAPER_READING = {"exact": "tolerance", "graceful": "nearest"}
#: The MQAR capacity grid of the trained models: its numbers of pairs, its length, its mixers.
MQAR_N: tuple[int, ...] = (4, 8, 16, 24, 32, 48, 64)
MQAR_T = 256
MQAR_MIXERS: tuple[str, ...] = ("vla", "deltanet", "linear", "softmax")
#: "Recalled exactly" on trained models: the exact-match accuracy the paper reports for VLA.
MQAR_EXACT = 1.0


def _keys(rng: np.random.Generator, regime: str, trials: int, n: int, dk: int) -> np.ndarray:
    if regime == "random":
        return unit(rng.standard_normal((trials, n, 1, dk)))
    if regime == "orthonormal":  # n ≤ dk orthonormal keys, then random ones
        out = unit(rng.standard_normal((trials, n, 1, dk)))
        for b in range(trials):
            q, _ = np.linalg.qr(rng.standard_normal((dk, dk)))
            m = min(n, dk)
            out[b, :m, 0] = q.T[:m]
        return out
    raise ValueError(f"keys: expected 'random' or 'orthonormal', got {regime!r}")


def _trusted_states(
    k: np.ndarray,
    v: np.ndarray,
    u: np.ndarray,
    config: VLAConfig,
    variant: str,
    tally: ReferenceTally,
) -> tuple[np.ndarray, np.ndarray]:
    """``S`` after each pass (trial) ``[passes, dv, dk]`` and which passes the reference vouches
    for: the whole batch at once, or pass by pass where the batch is not vouched for."""
    batch = ReferenceTally()  # counted only if it vouches: else its passes are counted one by one
    run = trusted_recurrence(
        k, k, v, u, config=config, variant=variant, rtol=STATE_RTOL, tally=batch
    )
    if run is not None:
        tally.float64 += batch.float64
        tally.escalated += batch.escalated
        return run[1][0][:, 0], np.ones(k.shape[0], dtype=bool)
    S = np.zeros((k.shape[0], v.shape[-1], k.shape[-1]))
    kept = np.zeros(k.shape[0], dtype=bool)
    for b in range(k.shape[0]):
        one = [x[b : b + 1] for x in (k, v, u)]
        single = trusted_recurrence(
            one[0], one[0], one[1], one[2], config=config, variant=variant, rtol=STATE_RTOL,
            tally=tally,
        )  # fmt: skip
        if single is not None:
            S[b], kept[b] = single[1][0][0, 0], True
    return S, kept


def recall_curves(
    dk: int,
    trials: int,
    *,
    seed: int = 0,
    keys: str = "random",
    tally: ReferenceTally | None = None,
) -> dict[str, dict[str, Any]]:
    """Per variant: ``recall[c][n-1]`` for each criterion c of :data:`CRITERIA` and
    ``error[n-1]`` (mean ``||S k̂_i − v_i||``) for n = 1 … 2·dk, averaged over the trials the
    reference vouches for (``tally`` counts the others)."""
    tally = ReferenceTally() if tally is None else tally
    rng = np.random.default_rng(seed)
    out: dict[str, dict[str, list[float]]] = {}
    for variant in VARIANTS:
        config = VLAConfig.exact() if variant == "rls" else VLAConfig()
        recall: dict[str, list[float]] = {c: [] for c in CRITERIA}
        error = []
        for n in range(1, 2 * dk + 1):
            k = _keys(rng, keys, trials, n, dk)
            v = unit(rng.standard_normal((trials, n, 1, dk)))
            W_u = rng.standard_normal((dk, dk)) / np.sqrt(dk)
            u = unit(k @ W_u.T) / np.sqrt(dk)
            S, kept = _trusted_states(k, v, u, config, variant, tally)
            S, k, v = S[kept], k[kept], v[kept]
            if not len(S):  # every trial beyond the reference's reach: no recall to count
                for c in CRITERIA:
                    recall[c].append(float("nan"))
                error.append(float("nan"))
                continue
            read = np.einsum("bij,bnj->bni", S, k[:, :, 0])
            cos = np.einsum("bni,bmi->bnm", unit(read), v[:, :, 0])
            dist = np.linalg.norm(read - v[:, :, 0], axis=-1)
            own = cos[:, np.arange(n), np.arange(n)]
            recall["tolerance"].append(float((dist <= TOLERANCE).mean()))
            recall["cosine"].append(float((own > COSINE).mean()))
            recall["nearest"].append(float((cos.argmax(-1) == np.arange(n)).mean()))
            error.append(float(dist.mean()))
        out[variant] = {"recall": recall, "error": error}  # type: ignore[dict-item]
    return out


def run(
    ctx: Context, *, subject: str = "vla", keys: str = "random", path: Path | None = None
) -> list[ClaimResult]:
    """``subject`` is the variant the claim is about (``vla``; others for the meta-tests);
    ``path`` holds the training results of ``C7.mqar.*`` (default: the repository's folder)."""
    return [*_one_pass(ctx, subject, keys), *mqar_results(path)]


def _one_pass(ctx: Context, subject: str, keys: str) -> list[ClaimResult]:
    p = ctx.profile
    dk = p.capacity_dk
    tally = ReferenceTally()
    curves = recall_curves(dk, p.capacity_trials, seed=ctx.seed, keys=keys, tally=tally)
    method = (
        f"one pass over n = 1…{2 * dk} associations, dk = dv = {dk}, {keys} unit keys, random unit "
        f"values, {p.capacity_trials} trials per n"
    )
    rules = {
        "tolerance": f"||S k̂_i − v_i|| ≤ {TOLERANCE:g}",
        "cosine": f"cos(S k̂_i, v_i) > {COSINE:g}",
        "nearest": "the nearest stored value (largest cosine) is v_i",
    }
    exact_results, graceful_results = [], []
    for criterion in CRITERIA:
        mine = curves[subject]["recall"][criterion]
        below = mine[:dk]
        first_miss = next((n for n, r in enumerate(below, 1) if r < 1.0), None)
        beyond = {v: float(np.mean(c["recall"][criterion][dk:])) for v, c in curves.items()}
        reading = " (the paper's reading)"
        exact_results.append(
            ClaimResult(
                id=f"C7.exact.{criterion}",
                title="Capacity: up to dk recalled exactly, "
                + criterion
                + (reading if PAPER_READING["exact"] == criterion else ""),
                statement="Per head, up to dk associations are recalled exactly.",
                formalisation=(
                    f"{subject}, paper preset: every association recalled for every n ≤ dk; "
                    f"recalled ⇔ {rules[criterion]}"
                ),
                method=method,
                verdict=Verdict.from_measurement(
                    None if np.isnan(below).any() else first_miss is None
                ),
                figures={
                    "criterion": criterion,
                    "dk": dk,
                    "min_recall_n_le_dk": float(min(below)),
                    "first_n_with_a_miss": first_miss,
                    "recall_at_dk": {v: c["recall"][criterion][dk - 1] for v, c in curves.items()},
                    "error_at_dk": {v: c["error"][dk - 1] for v, c in curves.items()},
                },
                key_figure="min_recall_n_le_dk",
                evidence=[
                    f"{subject} ({rules[criterion]}): min recall over n ≤ {dk} = "
                    f"{min(below):.2f}"
                    + (f"; first miss at n = {first_miss}" if first_miss else "")
                    + f"; mean ||S k̂_i − v_i|| at n = dk: {curves[subject]['error'][dk - 1]:.3g}",
                    tally.evidence(),
                ],
                series={"capacity": curves} if criterion == "nearest" else {},
            )
        )
        graceful_results.append(
            ClaimResult(
                id=f"C7.graceful.{criterion}",
                title="Capacity: graceful beyond dk, "
                + criterion
                + (reading if PAPER_READING["graceful"] == criterion else ""),
                statement="Beyond dk, VLA degrades more gracefully than linear attention.",
                formalisation=(
                    f"mean recall of {subject} over dk < n ≤ 2·dk > that of linear attention; "
                    f"recalled ⇔ {rules[criterion]}"
                ),
                method=method,
                verdict=Verdict.from_measurement(
                    None
                    if np.isnan([beyond[subject], beyond["linear"]]).any()
                    else beyond[subject] > beyond["linear"]
                ),
                figures={
                    "criterion": criterion,
                    "mean_recall_beyond_dk": beyond,
                    f"{subject}_mean_recall_beyond_dk": beyond[subject],
                    "linear_mean_recall_beyond_dk": beyond["linear"],
                },
                key_figure=f"{subject}_mean_recall_beyond_dk",
                evidence=[
                    f"mean recall over dk < n ≤ 2dk ({rules[criterion]}): "
                    + ", ".join(f"{v} {r:.2f}" for v, r in beyond.items()),
                    tally.evidence(),
                ],
            )
        )
    return exact_results + graceful_results


def _in_standard_errors(difference: float, se: float) -> float:
    """The difference in standard errors (±inf for a nonzero difference without spread)."""
    if se > 0:
        return difference / se
    return math.copysign(math.inf, difference) if difference else 0.0


def _beside(row: dict[str, Any], mixers: tuple[str, ...]) -> str:
    return ", ".join(f"{m} {c10_recall.describe(row[m])}" for m in mixers)


def mqar_results(path: Path | None = None) -> list[ClaimResult]:
    """``C7.mqar.exact`` and ``C7.mqar.graceful`` (spec §3 C7 on the trained models of spec §3
    C10; module docstring)."""
    source, shown = c10_recall.results_location(path)
    table = c10_recall.load_cells(source)
    curve: dict[int, dict[str, dict[str, Any] | None]] = {
        n: {m: find_cell(table, "mqar", {"n_pairs": n, "seq_len": MQAR_T}, m) for m in MQAR_MIXERS}
        for n in MQAR_N
    }
    grid = (
        f"grid mqar (T = {MQAR_T}, d_h = {D_HEAD}, n ∈ {{{', '.join(map(str, MQAR_N))}}}), test "
        f"exact-match accuracy, mean over >= {MIN_SEEDS} seeds in the setting chosen on validation"
    )
    figures: dict[str, Any] = {
        "curve": {
            n: {
                m: {"mean": c["mean"], "std": c["std"], "seeds": len(c["values"])} if c else None
                for m, c in row.items()
            }
            for n, row in curve.items()
        }
    }

    # exact: every VLA cell up to d_h against 1.000
    small = [n for n in MQAR_N if n <= D_HEAD]
    exact = [
        c10_recall.compare_with_paper(f"n = {n} vla", curve[n]["vla"], MQAR_EXACT) for n in small
    ]
    exact_a = cells_verdict(exact)
    judged_vla = [
        float((curve[n]["vla"] or {})["mean"])
        for n, comparison in zip(small, exact, strict=True)
        if comparison.agrees is not None
    ]
    others = tuple(m for m in MQAR_MIXERS if m != "vla")
    # The other mixers' cells do not bear on this verdict; those without their seeds are named
    # apart, so that the evidence shows what the grid still lacks.
    lacking_beside = [
        text
        for n in small
        for m in others
        if (text := c10_recall.lacking(f"n = {n} {m}", curve[n][m])) is not None
    ]
    exact_evidence = [f"rule: {exact_a.reason}"]
    exact_evidence += [
        f"n = {n}: vla {c10_recall.describe(curve[n]['vla'])}, paper {MQAR_EXACT:.3f} -> "
        + {True: "agrees", False: "differs", None: "not judged"}[comparison.agrees]
        + f"; beside: {_beside(curve[n], others)}"
        for n, comparison in zip(small, exact, strict=True)
    ]
    if lacking_beside:
        exact_evidence.append(f"reported beside, lacking seeds: {', '.join(lacking_beside)}")
    exact_figures = {
        **({"min_vla_accuracy_n_le_dk": min(judged_vla)} if judged_vla else {}),
        "missing": exact_a.lacking,
        "missing_beside": lacking_beside,
        **figures,
    }

    # graceful: VLA above linear attention at every n beyond d_h
    graceful, margins, graceful_evidence = [], {}, []
    for n in (n for n in MQAR_N if n > D_HEAD):
        vla, linear = curve[n]["vla"], curve[n]["linear"]
        missing = tuple(
            text
            for text in (
                c10_recall.lacking(f"n = {n} vla", vla),
                c10_recall.lacking(f"n = {n} linear", linear),
            )
            if text is not None
        )
        line = f"n = {n}: vla {c10_recall.describe(vla)}, linear {c10_recall.describe(linear)}"
        if missing or vla is None or linear is None:
            graceful.append(Comparison(f"n = {n}", None, missing or (f"n = {n}",)))
            line += " -> not judged"
        else:
            stats = [(float(c["mean"]), float(c["std"]), len(c["values"])) for c in (vla, linear)]
            greater = clearly_greater(*stats[0], *stats[1])
            difference = stats[0][0] - stats[1][0]
            se = float(np.hypot(*(std / np.sqrt(k) for _, std, k in stats)))
            margins[n] = {"difference": difference, "standard_error": se, "greater": greater}
            graceful.append(Comparison(f"n = {n}", greater))
            line += (
                f": difference {difference:.3f} vs {SEPARATION:g}·se = {SEPARATION * se:.3f} -> "
                + ("greater" if greater else "not clearly greater")
            )
        graceful_evidence.append(line + f"; beside: {_beside(curve[n], ('deltanet', 'softmax'))}")
    graceful_a = cells_verdict(graceful)
    separations = [
        _in_standard_errors(m["difference"], m["standard_error"]) for m in margins.values()
    ]
    graceful_figures = {
        **({"min_difference_in_se": min(separations)} if separations else {}),
        "margins": margins,
        "missing": graceful_a.lacking,
        **figures,
    }
    return [
        ClaimResult(
            id="C7.mqar.exact",
            title="Capacity on trained models: up to d_h recalled exactly (MQAR)",
            statement="Per head, up to dk associations are recalled exactly.",
            formalisation=(
                f"{grid}: every VLA cell with n ≤ d_h = {D_HEAD} within "
                f"{c10_recall.TOLERANCE} + 2 standard errors of {MQAR_EXACT:.3f} (C10's rule)"
            ),
            method=f"read {shown}",
            verdict=exact_a.verdict,
            figures=exact_figures,
            key_figure="min_vla_accuracy_n_le_dk" if judged_vla else None,
            evidence=exact_evidence,
        ),
        ClaimResult(
            id="C7.mqar.graceful",
            title="Capacity on trained models: graceful beyond d_h (MQAR)",
            statement="Beyond dk, VLA degrades more gracefully than linear attention.",
            formalisation=(
                f"{grid}: at every n > d_h = {D_HEAD}, VLA's mean exceeds linear attention's by "
                f"more than {SEPARATION:g}·sqrt(se_vla² + se_linear²), se = std/√seeds; deltanet "
                "and softmax reported beside"
            ),
            method=f"read {shown}",
            verdict=graceful_a.verdict,
            figures=graceful_figures,
            key_figure="min_difference_in_se" if separations else None,
            evidence=[f"rule: {graceful_a.reason}", *graceful_evidence],
        ),
    ]


CLAIM = Claim("C7", "Capacity", run)
