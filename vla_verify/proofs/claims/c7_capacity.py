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
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ...spec import VLAConfig
from ..ledger import Claim, ClaimResult, Context, Verdict
from . import ReferenceTally, trusted_recurrence, unit

__all__ = ["CLAIM", "CRITERIA", "PAPER_READING", "VARIANTS", "recall_curves", "run"]

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


def run(ctx: Context, *, subject: str = "vla", keys: str = "random") -> list[ClaimResult]:
    """``subject`` is the variant the claim is about (``vla``; others for the meta-tests)."""
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


CLAIM = Claim("C7", "Capacity", run)
