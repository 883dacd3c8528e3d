"""C10 — recall experiments (spec §3 C10), read from the trained models of ``experiments/results``.

The paper: MQAR (2-layer backbone, n = 24 pairs, dk = 32): VLA 1.000, DeltaNet 0.010, linear
attention 0.074, softmax 0.26 exact-match; fixed n = 8 with T up to 512: VLA 1.000, DeltaNet
≈ 0.01; 62 % at n = dk.

The figures come from the grids of :mod:`vla_verify.experiments` (``python -m
vla_verify.experiments run --grid mqar`` and ``--grid mqar_length``): seven cells of
:data:`vla_verify.experiments.results.C10_FIGURES`, each the mean test accuracy over seeds at
the learning rate chosen on the validation set.  The input is either a results directory (the
job files are aggregated here) or a ``summary.json`` written by ``python -m
vla_verify.experiments report``.

Verdict rule.  A figure agrees with the paper's when ``|measured mean − paper| ≤ 0.05 + 2·s/√n``
(0.05 absolute accuracy, widened by twice the standard error over the n seeds, s their standard
deviation).  REPRODUCED needs all seven to agree, NOT_REPRODUCED follows from any one that does
not, and no verdict is given unless every figure is measured on at least
:data:`~vla_verify.experiments.results.MIN_SEEDS` seeds: a partial input given explicitly raises
:class:`~vla_verify.errors.VLAInputError` naming what is missing; the committed default results,
when partial, give NOT_MEASURED with the same list (so that the ledger still runs while a grid
fills).  No result for any of the seven cells: NOT_MEASURED.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from ...errors import VLAInputError
from ...experiments.results import MIN_SEEDS, PAPER_FIGURES, c10_figures, load_results
from ..ledger import Claim, ClaimResult, Context, Verdict

__all__ = ["CLAIM", "PAPER", "RESULTS", "TOLERANCE", "agrees", "load_figures", "run"]

RESULTS = Path("experiments") / "results"
PAPER: dict[str, float] = dict(PAPER_FIGURES)
TOLERANCE = 0.05

_TITLE = "Recall experiments (MQAR)"
_STATEMENT = (
    "MQAR (n = 24, dk = 32): VLA 1.000, DeltaNet 0.010, linear 0.074, softmax 0.26; "
    "n = 8, T ≤ 512: VLA 1.000, DeltaNet ≈ 0.01; 62% at n = dk."
)


def load_figures(path: Path) -> dict[str, dict[str, Any] | None] | None:
    """The seven figures from a results directory or a ``summary.json``; None when ``path``
    holds no results at all."""
    path = Path(path)
    if path.is_dir():
        results = load_results(path)
        return dict(c10_figures(results)) if results else None
    if path.is_file():
        data = json.loads(path.read_text())
        figures = data.get("figures") if isinstance(data, dict) else None
        if not isinstance(figures, dict):
            raise VLAInputError("path", f"{path}: expected a summary with a 'figures' mapping")
        return {name: figures.get(name) for name in PAPER}
    return None


def _missing(figures: dict[str, dict[str, Any] | None]) -> list[str]:
    out = []
    for name in PAPER:
        cell = figures.get(name)
        values = (cell or {}).get("values") or []
        if len(values) < MIN_SEEDS:
            out.append(f"{name} ({len(values)} of {MIN_SEEDS} seeds)")
    return out


def agrees(measured: float, std: float, seeds: int, paper: float) -> bool:
    """The module's rule: ``|measured − paper| ≤ TOLERANCE + 2·std/√seeds``."""
    return abs(measured - paper) <= TOLERANCE + 2 * std / math.sqrt(seeds)


def _default_sources() -> list[Path]:
    """The repository's results folder beside the package (never the working directory: the
    verdict must not depend on where the ledger runs)."""
    here = Path(__file__).resolve().parents[3]
    return [here / RESULTS]


def _result(
    verdict: Verdict,
    method: str,
    evidence: list[str],
    figures: dict[str, Any],
    worst: float | None = None,
) -> ClaimResult:
    return ClaimResult(
        id="C10",
        title=_TITLE,
        statement=_STATEMENT,
        formalisation=(
            f"each of the seven test accuracies (mean over >= {MIN_SEEDS} seeds) within "
            f"{TOLERANCE} + 2 standard errors of the paper's"
        ),
        method=method,
        verdict=verdict,
        figures={"worst_deviation": worst, **figures} if worst is not None else figures,
        key_figure="worst_deviation" if worst is not None else None,
        evidence=evidence,
    )


def run(ctx: Context, *, path: Path | None = None) -> list[ClaimResult]:
    explicit = path is not None
    sources = [Path(path)] if path is not None else _default_sources()
    figures, source = None, sources[0]
    for candidate in sources:
        figures = load_figures(candidate)
        if figures is not None and any(figures.values()):  # some C10 cell has results
            source = candidate
            break
        figures = None
    # The report names the repository's folder as the repository does, not by this machine's
    # absolute path.
    shown = source if explicit else RESULTS
    if figures is None:
        reason = (
            f"not yet measured: no C10 results in {source if explicit else RESULTS} "
            "(python -m vla_verify.experiments run "
            "--grid mqar, then --grid mqar_length)"
        )
        return [_result(Verdict.NOT_MEASURED, reason, [reason], {})]
    missing = _missing(figures)
    if missing:
        message = f"{shown}: incomplete results for C10, no verdict: missing {', '.join(missing)}"
        if explicit:
            raise VLAInputError("results", message)
        measured = {n: c["mean"] for n, c in figures.items() if c}
        return [
            _result(
                Verdict.NOT_MEASURED,
                f"read {shown}",
                [message],
                {"measured": measured, "missing": missing},
            )
        ]
    table: dict[str, dict[str, Any]] = {}
    for name, paper in PAPER.items():
        cell = figures[name]
        assert cell is not None  # _missing checked every figure
        mean, std, n = float(cell["mean"]), float(cell["std"]), len(cell["values"])
        table[name] = {
            "paper": paper,
            "measured": mean,
            "std": std,
            "seeds": n,
            "deviation": mean - paper,
            "agrees": agrees(mean, std, n, paper),
        }
    worst = max((row["deviation"] for row in table.values()), key=abs)
    evidence = [
        f"{name}: measured {row['measured']:.3f} ± {row['std']:.3f} over {row['seeds']} seeds, "
        f"paper {row['paper']:.3f} -> {'agrees' if row['agrees'] else 'differs'}"
        for name, row in table.items()
    ]
    verdict = Verdict.from_measurement(all(row["agrees"] for row in table.values()))
    return [_result(verdict, f"read {shown}", evidence, {"table": table}, worst)]


CLAIM = Claim("C10", "Recall experiments", run)
