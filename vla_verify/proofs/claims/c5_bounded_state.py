"""C5 — bounded state (spec §3 C5, the paper's Proposition 1).

Claim: under bounded inputs (``||v_t|| ≤ 1``, unit keys) ``sup_t ||S_t||_F`` is bounded
independently of T, whereas linear attention grows as O(T).

Why it can fail: ``S_t = S_{t-1}(I − k̂_t α̂_tᵀ) + v_t α̂_tᵀ`` with a non-normal transition.  When
``A_t`` is ill-conditioned, ``α̂_t = A_t k̂_t/||A_t k̂_t||`` can be nearly orthogonal to ``k̂_t``
(``c_t = α̂_tᵀk̂_t`` small): the step then *shears* — the row component along ``k̂_t`` is moved
into ``α̂_t`` instead of being erased — and ``||S||`` builds up like ``1/c_t``.  Penalising one
direction every step makes ``κ(A_t)`` grow like t, so ``c_t`` can fall like ``t^{-1/2}``.

The *shear family* (:func:`shear_case`) is that construction, with free parameters that a
Hypothesis search tunes (``target`` = ``sup_t ||S_t||_F``): width dk, the key tilt exponent
``power`` (``k̂_t ∝ e_2 + t_eff^{-power} e_1``), the penalty direction's mix and the value
pattern.  Every member has ``||v_t|| = 1``, unit keys and ``||u_t||² = 1/dk`` (spec §2.5).

Method:

1. Random inputs (layer-like, and :func:`~vla_verify.properties.strategies.cases` with values
   clipped to norm ≤ 1): ``sup_t ||S_t||_F`` for linear, delta, vla, rls (the plots).
2. Adversarial: a Hypothesis search over the shear family at T = ``growth_T[1]``, then the best
   member at every T of ``growth_T``.  Growth is *unbounded* when the fitted exponent
   ``p = Δlog sup / Δlog T`` over the last two lengths is ≥ 0.1 and not decelerating (≥ 0.75× the
   exponent of the previous pair); otherwise it is saturating within the tested T.
3. Verdict per configuration: the paper preset (nudges on) and the exact preset (no nudges).
   FAILS when the paper preset grows without bound; HOLDS_ONLY_IF nudges when only the exact
   preset does; HOLDS when neither.  The counterexample is the family member at the longest T,
   certified as ``||S_T||_F > sup_t≤T0 ||S_t||_F`` of the shortest length: certified growth.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import strategies as st

from ...properties import invariants
from ...properties.strategies import Case
from ...spec import VLAConfig
from ..ledger import Claim, ClaimResult, Context, Verdict
from . import certify, layer_penalties, search_max, unit

__all__ = ["CLAIM", "growth", "random_norms", "run", "shear_case"]

STATEMENT = (
    "Under bounded inputs (||v_t|| ≤ 1, unit keys), sup_t ||S_t||_F is bounded independently of "
    "T, whereas linear attention grows as O(T)."
)


def shear_case(
    T: int,
    dk: int = 2,
    *,
    power: float = 0.5,
    mix: float = 0.0,
    flip_values: bool = False,
    lambda0: float = 0.1,
) -> Case:
    """The adversarial family (module docstring): ``B = H = 1``, float64, ``||v_t|| = 1``."""
    if dk < 2:
        raise ValueError(f"dk: expected >= 2, got {dk}")
    t = np.arange(1, T + 1)
    e1, e2 = np.eye(dk)[0], np.eye(dk)[1]
    tail = np.zeros(dk)
    if dk > 2:
        tail[2:] = 1.0 / np.sqrt(dk - 2)
    penal = unit(e2 + mix * tail)
    u = np.broadcast_to(penal / np.sqrt(dk), (T, dk))
    tilt = (1.0 / (lambda0 + t / dk)) ** power
    k = e2[None] + tilt[:, None] * e1[None]
    sign = np.where((t % 2 == 0) & flip_values, -1.0, 1.0)
    v = sign[:, None] * e1[None]
    q = np.abs(k) + 0.1
    return Case(
        *(x[None, :, None, :].astype(np.float64) for x in (q, k, v, u)),
        None,
        1,
        {"family": f"shear(power={power:.3g}, mix={mix:.3g}, flip={flip_values})"},
    )


def _sup(case: Case, config: VLAConfig, variant: str = "vla") -> float:
    norms = invariants.state_norms(case, config, variant=variant)
    return float(np.max(np.where(np.isfinite(norms), norms, np.inf)))


def growth(sups: list[float], lengths: list[int]) -> tuple[float, bool]:
    """``(last exponent, unbounded?)`` from ``sup`` at increasing ``lengths`` (module docstring)."""
    logs = np.log(np.maximum(sups, 1e-300))
    exps = np.diff(logs) / np.diff(np.log(lengths))
    last = float(exps[-1])
    previous = float(exps[-2]) if len(exps) >= 2 else last
    return last, bool(last >= 0.1 and last >= 0.75 * previous)


def random_norms(T: int, dk: int, seed: int) -> dict[str, list[float]]:
    """``||S_t||_F`` for every t on random layer-like inputs, per variant (for the plot)."""
    rng = np.random.default_rng(seed)
    k_raw = rng.standard_normal((1, T, 1, dk))
    k = np.where(k_raw > 0, k_raw + 1, np.exp(np.minimum(k_raw, 0)))
    v = unit(rng.standard_normal((1, T, 1, dk)))
    case = Case(k, k, v, layer_penalties(rng, k_raw), None, 1)
    out = {}
    for variant in ("linear", "delta", "vla", "rls"):
        config = VLAConfig.exact() if variant == "rls" else VLAConfig()
        out[variant] = invariants.state_norms(case, config, variant=variant)[0, :, 0].tolist()
    return out


def run(ctx: Context, *, variant: str = "vla") -> list[ClaimResult]:
    """``variant`` is the recurrence the claim is about (``linear`` etc. for the meta-tests)."""
    p = ctx.profile
    lengths = list(p.growth_T)
    T_search = lengths[1]
    dk_max = max(2, min(p.max_dk, 8))

    params = st.fixed_dictionaries(
        {
            "dk": st.integers(2, dk_max),
            "power": st.floats(0.0, 1.0),
            "mix": st.floats(0.0, 1.0),
            "flip_values": st.booleans(),
        }
    )
    exact = VLAConfig.exact()

    def config_for(base: VLAConfig) -> VLAConfig:
        return VLAConfig.exact() if variant == "rls" else base

    bar = ctx.bar(f"C5 adversarial search ({variant})", p.examples // 2)
    best_sup, best, n = search_max(
        params,
        lambda kw: _sup(shear_case(T_search, **kw), config_for(exact), variant),
        examples=max(10, p.examples // 2),
        seed=ctx.seed,
        label="sup ||S_t||_F",
        progress=bar,
    )
    bar.close()
    # The analytic construction (tilt ~ κ^{-1/2}: power 1/2) seeds the search.
    seed_member = {"dk": 2, "power": 0.5, "mix": 0.0, "flip_values": False}
    # The growth test decides, so keep whichever candidate grows faster (exact preset) between
    # the last two lengths: the search's best (largest state at T_search) or the construction.
    candidates = [seed_member] + ([best] if best is not None else [])

    def late_growth(kw: dict[str, Any]) -> float:
        sups = [_sup(shear_case(T, **kw), config_for(exact), variant) for T in lengths[-2:]]
        return float(np.log(sups[1] / sups[0]))

    best = max(candidates, key=late_growth)
    best_sup = _sup(shear_case(T_search, **best), config_for(exact), variant)
    results: dict[str, dict[str, Any]] = {}
    series: dict[str, Any] = {}
    for name, config in (("paper", VLAConfig()), ("exact", exact)):
        config = config_for(config)
        sups = [_sup(shear_case(T, **best), config, variant) for T in lengths]
        exponent, unbounded = growth(sups, lengths)
        results[name] = {"sup": sups, "exponent": exponent, "unbounded": unbounded}
    longest = lengths[-1]
    for name, config in (("paper", VLAConfig()), ("exact", exact)):
        case = shear_case(longest, **best)
        series[f"adversarial {name}"] = invariants.state_norms(
            case, config_for(config), variant=variant
        )[0, :, 0].tolist()
    lin_case = shear_case(longest, **best)
    series["adversarial linear"] = invariants.state_norms(lin_case, VLAConfig(), variant="linear")[
        0, :, 0
    ].tolist()
    rnd = random_norms(lengths[1], 16, ctx.seed)
    # Linear attention's own growth on the same family (the paper's O(T) baseline).
    lin_sups = [_sup(shear_case(T, **best), VLAConfig(), "linear") for T in lengths]
    lin_exponent, _ = growth(lin_sups, lengths)

    paper_unbounded = results["paper"]["unbounded"]
    exact_unbounded = results["exact"]["unbounded"]
    failing = int(paper_unbounded) + int(exact_unbounded)
    verdict = Verdict.from_search(
        failing, condition_separates=exact_unbounded and not paper_unbounded
    )
    evidence = [
        f"adversarial search: {n} members of the shear family at T = {T_search}; best "
        f"sup ||S_t||_F = {best_sup:.3g} with {best}",
        *(
            f"{name} preset, best member: sup ||S_t||_F at T = {lengths} → "
            f"{[round(s, 2) for s in r['sup']]}; exponent {r['exponent']:.3f} → "
            f"{'unbounded (not decelerating)' if r['unbounded'] else 'saturating'}"
            for name, r in results.items()
        ),
        f"linear attention on the same inputs: sup {[round(s, 1) for s in lin_sups]}, "
        f"exponent {lin_exponent:.2f}",
        f"random layer-like inputs (dk 16, T {lengths[1]}): final ||S_T||_F "
        + ", ".join(f"{v} {norms[-1]:.3g}" for v, norms in rnd.items()),
    ]
    counterexample = certified = None
    if failing:
        which = "paper" if paper_unbounded else "exact"
        config = config_for(VLAConfig() if which == "paper" else exact)
        sups = results[which]["sup"]
        threshold = sups[0]
        # The shortest tested length whose sup clearly exceeds the first one's.
        i = next((i for i in range(1, len(sups)) if sups[i] > 1.5 * threshold), len(sups) - 1)
        case = shear_case(lengths[i], **best)
        norms = invariants.state_norms(case, config, variant=variant)
        where = (0, int(np.argmax(norms[0, :, 0])), 0)
        counterexample, certified, note = certify(
            ctx,
            "C5",
            case,
            config,
            "state_norm",
            where,
            variant=variant,
            claimed=threshold,
            statement=f"||S_t||_F ≤ sup_{{t ≤ {lengths[0]}}} ||S_t||_F = {threshold:.6g} "
            f"(the state at T = {lengths[i]} exceeds the largest state of the first "
            f"{lengths[0]} tokens: growth with T)",
        )
        evidence.append(
            f"counterexample ({which} preset): {case.describe()}; ||S_t||_F reaches "
            f"{sups[i]:.3g} at T = {lengths[i]} > {threshold:.3g} = sup at T = {lengths[0]}"
        )
        evidence.append(note)
    condition = (
        "nudges on (nudge_period finite, nudge_eta > 0), which keep λ_min(A_t) away from 0; "
        f"without them sup_t ||S_t||_F grows like T^{results['exact']['exponent']:.2f}"
    )
    return [
        ClaimResult(
            id="C5",
            title="Bounded state",
            statement=STATEMENT,
            formalisation=(
                "sup_{t≤T} ||S_t||_F does not grow with T for ||v_t|| = 1, unit keys, "
                "||u_t||² = 1/dk: growth exponent over the last two of T ∈ "
                f"{lengths} < 0.1 or decelerating"
            ),
            method="Hypothesis search (target: sup ||S_t||_F) over the adversarial shear family; "
            "growth test at increasing T; paper and exact presets; random layer-like inputs",
            verdict=verdict,
            condition=condition if verdict is Verdict.HOLDS_ONLY_IF else None,
            figures={
                "sup_paper": results["paper"]["sup"],
                "sup_exact": results["exact"]["sup"],
                "exponent_paper": results["paper"]["exponent"],
                "exponent_exact": results["exact"]["exponent"],
                "exponent_linear": lin_exponent,
                "T": lengths,
                "best_member": best,
            },
            key_figure="exponent_exact",
            evidence=evidence,
            counterexample=counterexample,
            certified=certified,
            series={"state_norms_random": rnd, "state_norms_adversarial": series},
        )
    ]


CLAIM = Claim("C5", "Bounded state", run)
