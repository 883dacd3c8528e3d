"""C6 — the state-norm figure (spec §3 C6), measured with the layer of spec §2.5.

The paper: at T = 1000 linear attention reaches ``||S_T||_F ≈ 1600`` while VLA stays below 15
(a 109× reduction).  Measured: the layer of :mod:`vla_verify.layer` (d_model 128, 4 heads of 32,
PyTorch-default random weights, uniformly random tokens of a 128-token vocabulary), paper preset,
``||S_T||_F`` per head averaged over heads and seeds.

Sub-verdicts under that input model: ``C6.absolute`` (linear attention within a factor
``LINEAR_FACTOR`` of 1600 *and* VLA below 15) and ``C6.ratio`` (the reduction within a factor
``RATIO_FACTOR`` of 109×).  Beside them, the ratio on zero-mean inputs (the recurrence alone,
i.i.d. normal values): a state that sums zero-mean values grows like √T instead of T, so the
ratio depends on the input model.  ``value_scale`` (a multiplier on ``W_v``) exists for the
meta-test: both norms are linear in the values, so halving ``W_v`` moves the measurement across
the paper's threshold.

Every ``||S_T||_F`` comes from :func:`~vla_verify.proofs.claims.trusted_recurrence` at
``NORM_RTOL``: the float64 run where its own estimate vouches for that accuracy, else the
escalated reference, else the measurement is beyond the reference's reach, left out and counted
in the evidence (a figure with no measurement left is ``NOT_MEASURED``).

On trained models: ``C6.trained.absolute`` and ``C6.trained.ratio`` apply the same rules and
constants to the probe of the trained MQAR models (n = 24, the setting their cell selects on
validation): ``||S_t||_F`` in layer 1 at t = 1000, mean over heads, then over seeds
(:func:`vla_verify.experiments.results.c6_figures`), read from the repository's results folder
like C10 (never the working directory) or from an explicit ``path``.  Without at least
``MIN_SEEDS`` probe values for linear attention and for VLA they are ``NOT_MEASURED``, naming
what is missing; DeltaNet's figure is reported beside.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from ...experiments.results import MIN_SEEDS, c6_figures, load_results
from ...layer import init_layer, layer_inputs
from ...spec import VLAConfig
from ..ledger import Claim, ClaimResult, Context, Verdict
from ..verdicts import figure_verdict
from . import ReferenceTally, c10_recall, layer_penalties, trusted_recurrence

__all__ = [
    "CLAIM",
    "LINEAR_FACTOR",
    "PAPER_LINEAR",
    "PAPER_VLA_BOUND",
    "RATIO_FACTOR",
    "measure",
    "measure_zero_mean",
    "run",
    "trained_figures",
    "trained_results",
]

PAPER_LINEAR = 1600.0
PAPER_VLA_BOUND = 15.0
PAPER_REDUCTION = 109.0
#: How far (as a factor) linear attention's norm may be from the paper's 1600 to count as "≈".
LINEAR_FACTOR = 2.0
#: How far (as a factor) the measured reduction may be from the paper's 109×.
RATIO_FACTOR = 2.0
#: The accuracy a norm needs (relative): far below the factors of 2 it is judged within.
NORM_RTOL = 1e-3

STATEMENT = (
    "At T = 1000 linear attention reaches ||S_T||_F ≈ 1600 while VLA stays below 15 "
    "(a 109× reduction)."
)


def _mean(values: list[float]) -> float:
    """The mean, NaN where every measurement was beyond the reference's reach."""
    return float(np.mean(values)) if values else float("nan")


def measure(
    T: int = 1000,
    seeds: int = 1,
    *,
    value_scale: float = 1.0,
    base_seed: int = 0,
    tally: ReferenceTally | None = None,
) -> dict[str, float]:
    """``||S_T||_F`` (head mean, averaged over ``seeds`` random layers) for linear, delta, vla:
    the recurrence on the mixer inputs of the layer (:func:`vla_verify.layer.layer_inputs`, as
    :func:`~vla_verify.layer.layer_forward` runs it), through the trusted reference."""
    tally = ReferenceTally() if tally is None else tally
    norms: dict[str, list[float]] = {"linear": [], "delta": [], "vla": []}
    for s in range(seeds):
        w = init_layer(seed=base_seed + s)
        w = type(w)(**{**w.__dict__, "W_v": w.W_v * value_scale})
        tokens = np.random.default_rng(base_seed + 1000 + s).integers(0, w.vocab, size=T)
        q, k, v, u = layer_inputs(w, tokens)
        for mixer in norms:
            run = trusted_recurrence(
                q, k, v, u, config=VLAConfig(), variant=mixer, rtol=NORM_RTOL, tally=tally
            )
            if run is not None:
                S = run[1][0]  # [B, H, dv, dk]
                norms[mixer].append(float(np.linalg.norm(S[0], axis=(-2, -1)).mean()))
    return {m: _mean(v) for m, v in norms.items()}


def measure_zero_mean(
    T: int = 1000,
    dk: int = 32,
    seeds: int = 1,
    base_seed: int = 0,
    tally: ReferenceTally | None = None,
) -> dict:
    """``||S_T||_F`` of the recurrence itself (no layer) on zero-mean inputs: values i.i.d.
    standard normal, keys φ(g) = ELU(g) + 1 of standard normal g, layer penalties (spec §2.5);
    paper preset (rls: exact), averaged over ``seeds``, through the trusted reference."""
    tally = ReferenceTally() if tally is None else tally
    norms: dict[str, list[float]] = {"linear": [], "delta": [], "vla": []}
    for s in range(seeds):
        rng = np.random.default_rng(base_seed + 2000 + s)
        g = rng.standard_normal((1, T, 1, dk))
        k = np.where(g > 0, g + 1.0, np.exp(np.minimum(g, 0.0)))
        v = rng.standard_normal((1, T, 1, dk))
        u = layer_penalties(rng, g)
        for variant in norms:
            run = trusted_recurrence(
                k, k, v, u, config=VLAConfig(), variant=variant, rtol=NORM_RTOL, tally=tally
            )
            if run is not None:
                norms[variant].append(float(np.linalg.norm(run[1][0][0, 0])))
    return {m: _mean(v) for m, v in norms.items()}


def run(ctx: Context, *, value_scale: float = 1.0, path: Path | None = None) -> list[ClaimResult]:
    """``C6.absolute`` and ``C6.ratio`` on the random layer, then ``C6.trained.*`` from the
    training results at ``path`` (default: the repository's results folder)."""
    return [*_random_layer(ctx, value_scale), *trained_results(path)]


def _random_layer(ctx: Context, value_scale: float) -> list[ClaimResult]:
    p = ctx.profile
    tally = ReferenceTally()
    m = measure(p.layer_T, p.layer_seeds, value_scale=value_scale, base_seed=ctx.seed, tally=tally)
    z = measure_zero_mean(p.layer_T, seeds=p.layer_seeds, base_seed=ctx.seed, tally=tally)
    measured = all(np.isfinite(m[x]) for x in ("linear", "vla"))
    linear_v = figure_verdict(m["linear"], PAPER_LINEAR, factor=LINEAR_FACTOR)
    vla_ok = m["vla"] < PAPER_VLA_BOUND
    absolute = Verdict.from_measurement(
        (linear_v is Verdict.REPRODUCED and vla_ok) if measured else None
    )
    reduction = m["linear"] / m["vla"]
    ratio_v = (
        figure_verdict(reduction, PAPER_REDUCTION, factor=RATIO_FACTOR)
        if measured
        else Verdict.NOT_MEASURED
    )
    zero_mean_ratio = z["linear"] / z["vla"]
    model = (
        f"input model: the spec §2.5 layer (d_model 128, 4 heads × 32, PyTorch-default random "
        f"weights, W_v × {value_scale:g}) on uniformly random tokens of a 128-token vocabulary, "
        f"T = {p.layer_T}, paper preset, ||S_T||_F per head averaged over heads and "
        f"{p.layer_seeds} seed(s)"
    )
    figures = {
        "linear_norm": m["linear"],
        "vla_norm": m["vla"],
        "delta_norm": m["delta"],
        "reduction": reduction,
        "zero_mean_linear_norm": z["linear"],
        "zero_mean_vla_norm": z["vla"],
        "zero_mean_reduction": zero_mean_ratio,
        "paper_linear": PAPER_LINEAR,
        "paper_vla_bound": PAPER_VLA_BOUND,
        "paper_reduction": PAPER_REDUCTION,
        "T": p.layer_T,
        "beyond_reference_reach": tally.beyond,
    }
    zero_mean_text = (
        f"zero-mean inputs (the recurrence alone, dk = 32: values i.i.d. N(0, 1), keys "
        f"ELU(g)+1, layer penalties): linear {z['linear']:.1f}, vla {z['vla']:.2f}, delta "
        f"{z['delta']:.2f}, ratio {zero_mean_ratio:.1f}× — with zero-mean values linear "
        "attention's state is a random walk (it grows like √T, not T)"
    )
    return [
        ClaimResult(
            id="C6.absolute",
            title="State-norm figure: absolute values",
            statement=STATEMENT,
            formalisation=(
                f"{model}: linear within a factor {LINEAR_FACTOR:g} of {PAPER_LINEAR:g}, and vla "
                f"< {PAPER_VLA_BOUND:g}"
            ),
            method="layer forward (vla_verify.layer) for linear, delta, vla",
            verdict=absolute,
            figures=figures,
            key_figure="vla_norm",
            evidence=[
                f"linear {m['linear']:.1f} (paper ≈ {PAPER_LINEAR:g}: "
                f"{'within' if linear_v is Verdict.REPRODUCED else 'outside'} "
                f"×{LINEAR_FACTOR:g}); vla {m['vla']:.2f} ({'<' if vla_ok else '≥'} "
                f"{PAPER_VLA_BOUND:g}); delta {m['delta']:.2f}",
                zero_mean_text,
                tally.evidence(),
            ],
        ),
        ClaimResult(
            id="C6.ratio",
            title="State-norm figure: the 109× reduction",
            statement=STATEMENT,
            formalisation=(
                f"{model}: ||S_T||_F(linear) / ||S_T||_F(vla) within a factor {RATIO_FACTOR:g} "
                f"of {PAPER_REDUCTION:g}; the zero-mean ratio reported beside it"
            ),
            method="layer forward (vla_verify.layer); the recurrence on zero-mean inputs",
            verdict=ratio_v,
            figures=figures,
            key_figure="reduction",
            evidence=[
                f"reduction {reduction:.1f}× (paper {PAPER_REDUCTION:g}×, "
                f"{'within' if ratio_v is Verdict.REPRODUCED else 'outside'} ×{RATIO_FACTOR:g})",
                zero_mean_text,
                tally.evidence(),
            ],
        ),
    ]


#: Where the trained figure is probed (the paper's T = 1000).
TRAINED_T = 1000
#: The mixers whose trained figure the verdicts need, and the one reported beside them.
TRAINED_JUDGED = ("linear", "vla")
TRAINED_BESIDE = "deltanet"


def trained_figures(source: Path) -> dict[str, dict[str, Any]]:
    """``{mixer: {"mean", "std", "values"}}`` of the trained probe at t = ``TRAINED_T``: from a
    results directory (:func:`~vla_verify.experiments.results.c6_figures`) or from
    ``state_norm_t1000`` of a ``summary.json``; empty when ``source`` holds no results."""
    source = Path(source)
    if source.is_dir():
        results = load_results(source)
        return dict(c6_figures(results, TRAINED_T)["trained"]) if results else {}
    if source.is_file():
        data = json.loads(source.read_text())
        figures = data.get("state_norm_t1000") if isinstance(data, dict) else None
        trained = figures.get("trained") if isinstance(figures, dict) else None
        return dict(trained) if isinstance(trained, dict) else {}
    return {}


def _probe_text(figure: dict[str, Any] | None) -> str:
    if not figure:
        return "no probe"
    n = len(figure.get("values") or [])
    return f"{figure['mean']:.4g} ± {figure['std']:.3g} ({n} seeds)"


def trained_results(path: Path | None = None) -> list[ClaimResult]:
    """``C6.trained.absolute`` and ``C6.trained.ratio`` (spec §3 C6 on the trained models of
    spec §3 C10; module docstring): the rules of ``C6.absolute`` and ``C6.ratio`` applied to the
    trained probe's means over seeds."""
    source, shown = c10_recall.results_location(path)
    figures = trained_figures(source)
    shown_mixers = (*TRAINED_JUDGED, TRAINED_BESIDE)
    seeds = {m: len((figures.get(m) or {}).get("values") or []) for m in shown_mixers}
    lacking = [
        f"{m} ({seeds[m]} of {MIN_SEEDS} probe values)"
        for m in TRAINED_JUDGED
        if seeds[m] < MIN_SEEDS
    ]
    mean = {m: float(f["mean"]) for m, f in figures.items() if f}
    measured = not lacking
    reduction = mean["linear"] / mean["vla"] if measured else None
    if reduction is not None:
        linear_v = figure_verdict(mean["linear"], PAPER_LINEAR, factor=LINEAR_FACTOR)
        vla_ok = mean["vla"] < PAPER_VLA_BOUND
        absolute = Verdict.from_measurement(linear_v is Verdict.REPRODUCED and vla_ok)
        ratio_v = figure_verdict(reduction, PAPER_REDUCTION, factor=RATIO_FACTOR)
        absolute_text = (
            f"linear {mean['linear']:.1f} (paper ≈ {PAPER_LINEAR:g}: "
            f"{'within' if linear_v is Verdict.REPRODUCED else 'outside'} ×{LINEAR_FACTOR:g}); "
            f"vla {mean['vla']:.2f} ({'<' if vla_ok else '≥'} {PAPER_VLA_BOUND:g})"
        )
        ratio_text = (
            f"reduction {reduction:.1f}× (paper {PAPER_REDUCTION:g}×, "
            f"{'within' if ratio_v is Verdict.REPRODUCED else 'outside'} ×{RATIO_FACTOR:g})"
        )
    else:
        absolute = ratio_v = Verdict.from_measurement(None)
        absolute_text = ratio_text = f"not measured in {shown}: missing {', '.join(lacking)}"
    model = (
        f"trained models: the 2-layer backbone of spec §2.5 trained on MQAR at n = 24, T = 256, "
        f"in the training setting its cell selects on validation; probe: ||S_t||_F of layer 1 "
        f"at t = {TRAINED_T} on uniformly random tokens, mean over heads, then the mean over "
        f">= {MIN_SEEDS} seeds"
    )
    probes = ", ".join(f"{m} {_probe_text(figures.get(m))}" for m in shown_mixers)
    figure_values: dict[str, Any] = {
        **{f"{m}_norm": mean.get(m) for m in shown_mixers},
        **{f"{m}_seeds": seeds[m] for m in shown_mixers},
        "trained": figures,
        "reduction": reduction,
        "paper_linear": PAPER_LINEAR,
        "paper_vla_bound": PAPER_VLA_BOUND,
        "paper_reduction": PAPER_REDUCTION,
        "t": TRAINED_T,
        "missing": lacking,
    }
    return [
        ClaimResult(
            id="C6.trained.absolute",
            title="State-norm figure on trained models: absolute values",
            statement=STATEMENT,
            formalisation=(
                f"{model}: linear within a factor {LINEAR_FACTOR:g} of {PAPER_LINEAR:g}, and vla "
                f"< {PAPER_VLA_BOUND:g}; deltanet reported beside"
            ),
            method=f"read {shown}",
            verdict=absolute,
            figures=figure_values,
            key_figure="vla_norm" if measured else None,
            evidence=[absolute_text, f"probes at t = {TRAINED_T}: {probes}"],
        ),
        ClaimResult(
            id="C6.trained.ratio",
            title="State-norm figure on trained models: the 109× reduction",
            statement=STATEMENT,
            formalisation=(
                f"{model}: mean linear / mean vla within a factor {RATIO_FACTOR:g} of "
                f"{PAPER_REDUCTION:g}; deltanet reported beside"
            ),
            method=f"read {shown}",
            verdict=ratio_v,
            figures=figure_values,
            key_figure="reduction" if measured else None,
            evidence=[ratio_text, f"probes at t = {TRAINED_T}: {probes}"],
        ),
    ]


CLAIM = Claim("C6", "State-norm figure", run)
