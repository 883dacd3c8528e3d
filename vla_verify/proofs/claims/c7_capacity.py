"""C7 — capacity (spec §3 C7): how many associations one pass stores and recalls.

The paper: per head, up to dk associations are recalled exactly; beyond dk, VLA degrades more
gracefully than linear attention.  Measured: n associations ``(k_i, v_i)``, n = 1 … 2·dk, with
random unit keys and random unit values (``dv = dk``), penalties ``u = normalize(W_u k)/sqrt(dk)``
(spec §2.5), written by one pass of the recurrence; then each key is read back, ``S_n k̂_i``.
An association is *recalled* when the nearest stored value (largest cosine) is ``v_i``; the
mean relative error ``||S_n k̂_i − v_i||`` is reported beside it.  Variants ``vla``, ``delta``,
``linear`` (paper preset) and ``rls`` (exact preset).

Sub-claims: ``C7.exact`` (the subject recalls every association for every n ≤ dk) and
``C7.graceful`` (for dk < n ≤ 2·dk its mean recall is at least linear attention's).
"""

from __future__ import annotations

import numpy as np

from ...oracle import recurrence
from ...spec import VLAConfig
from ..ledger import Claim, ClaimResult, Context, Verdict
from . import unit

__all__ = ["CLAIM", "VARIANTS", "recall_curves", "run"]

VARIANTS = ("vla", "delta", "linear", "rls")


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


def recall_curves(
    dk: int, trials: int, *, seed: int = 0, keys: str = "random"
) -> dict[str, dict[str, list[float]]]:
    """Per variant: ``recall[n-1]`` and ``error[n-1]`` for n = 1 … 2·dk, averaged over trials."""
    rng = np.random.default_rng(seed)
    out: dict[str, dict[str, list[float]]] = {}
    for variant in VARIANTS:
        config = VLAConfig.exact() if variant == "rls" else VLAConfig()
        recall, error = [], []
        for n in range(1, 2 * dk + 1):
            k = _keys(rng, keys, trials, n, dk)
            v = unit(rng.standard_normal((trials, n, 1, dk)))
            W_u = rng.standard_normal((dk, dk)) / np.sqrt(dk)
            u = unit(k @ W_u.T) / np.sqrt(dk)
            S = recurrence(k, k, v, u, config=config, variant=variant).state[0][:, 0]
            read = np.einsum("bij,bnj->bni", S, k[:, :, 0])
            cos = np.einsum("bni,bmi->bnm", unit(read), v[:, :, 0])
            recall.append(float((cos.argmax(-1) == np.arange(n)).mean()))
            error.append(float(np.linalg.norm(read - v[:, :, 0], axis=-1).mean()))
        out[variant] = {"recall": recall, "error": error}
    return out


def run(ctx: Context, *, subject: str = "vla", keys: str = "random") -> list[ClaimResult]:
    """``subject`` is the variant the claim is about (``vla``; others for the meta-tests)."""
    p = ctx.profile
    dk = p.capacity_dk
    curves = recall_curves(dk, p.capacity_trials, seed=ctx.seed, keys=keys)
    mine = curves[subject]["recall"]
    below = mine[:dk]
    first_miss = next((n for n, r in enumerate(below, 1) if r < 1.0), None)
    beyond = {v: float(np.mean(c["recall"][dk:])) for v, c in curves.items()}
    method = (
        f"one pass over n = 1…{2 * dk} associations, dk = dv = {dk}, {keys} unit keys, random unit "
        f"values, {p.capacity_trials} trials per n; recalled = nearest stored value by cosine"
    )
    figures_common = {
        "dk": dk,
        "recall_at_dk": {v: c["recall"][dk - 1] for v, c in curves.items()},
        "error_at_dk": {v: c["error"][dk - 1] for v, c in curves.items()},
    }
    exact = ClaimResult(
        id="C7.exact",
        title="Capacity: up to dk recalled exactly",
        statement="Per head, up to dk associations are recalled exactly.",
        formalisation=f"{subject}: every association recalled for every n ≤ dk",
        method=method,
        verdict=Verdict.from_measurement(first_miss is None),
        figures={
            **figures_common,
            "min_recall_n_le_dk": float(min(below)),
            "first_n_with_a_miss": first_miss,
        },
        key_figure="min_recall_n_le_dk",
        evidence=[
            f"{subject}: min recall over n ≤ {dk} = {min(below):.2f}"
            + (f"; first miss at n = {first_miss}" if first_miss else "")
            + f"; relative error at n = dk: {curves[subject]['error'][dk - 1]:.3f}"
        ],
        series={"capacity": curves},
    )
    graceful = ClaimResult(
        id="C7.graceful",
        title="Capacity: graceful beyond dk",
        statement="Beyond dk, VLA degrades more gracefully than linear attention.",
        formalisation=(f"mean recall of {subject} over dk < n ≤ 2·dk ≥ that of linear attention"),
        method=method,
        verdict=Verdict.from_measurement(beyond[subject] >= beyond["linear"]),
        figures={
            "mean_recall_beyond_dk": beyond,
            f"{subject}_mean_recall_beyond_dk": beyond[subject],
            "linear_mean_recall_beyond_dk": beyond["linear"],
        },
        key_figure=f"{subject}_mean_recall_beyond_dk",
        evidence=[
            "mean recall over dk < n ≤ 2dk: " + ", ".join(f"{v} {r:.2f}" for v, r in beyond.items())
        ],
    )
    return [exact, graceful]


CLAIM = Claim("C7", "Capacity", run)
