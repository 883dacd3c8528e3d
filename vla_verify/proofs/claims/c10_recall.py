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

``C10.length`` checks the paper's length sweep cell by cell: grid ``mqar_length``, n = 8, T ∈
:data:`LENGTHS`, VLA against 1.000 and DeltaNet against 0.01, each cell under the same
:func:`agrees` rule.  Its verdict is :func:`~vla_verify.proofs.verdicts.cells_verdict`
(docs/verdicts.md): NOT_REPRODUCED as soon as one cell measured on at least ``MIN_SEEDS`` seeds
disagrees, else NOT_MEASURED naming the cells that lack seeds, else REPRODUCED.

The helpers that read the training results (:func:`results_location`, :func:`load_cells`,
:func:`compare_with_paper`) serve C6 and C7 as well, whose trained sub-verdicts read the same
folder.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from ...errors import VLAInputError
from ...experiments.results import (
    MIN_SEEDS,
    PAPER_FIGURES,
    Cell,
    c10_figures,
    cells,
    find_cell,
    load_results,
)
from ..ledger import Claim, ClaimResult, Context, Verdict
from ..verdicts import Comparison, cells_verdict

__all__ = [
    "CLAIM",
    "LENGTHS",
    "LENGTH_PAIRS",
    "LENGTH_PAPER",
    "PAPER",
    "RESULTS",
    "TOLERANCE",
    "agrees",
    "compare_with_paper",
    "describe",
    "lacking",
    "length_result",
    "load_cells",
    "load_figures",
    "results_location",
    "run",
    "seeds_of",
]

RESULTS = Path("experiments") / "results"
PAPER: dict[str, float] = dict(PAPER_FIGURES)
TOLERANCE = 0.05
#: The paper's length sweep (spec §3 C10): n = 8 pairs at every T up to 512.
LENGTHS: tuple[int, ...] = (64, 128, 256, 512)
LENGTH_PAIRS = 8
#: The paper's figure per mixer along the length sweep, the same as at T = 512.
LENGTH_PAPER: dict[str, float] = {
    "vla": PAPER_FIGURES["fixed_n8.vla"],
    "deltanet": PAPER_FIGURES["fixed_n8.deltanet"],
}

#: Cells as :func:`~vla_verify.experiments.results.cells` returns them.
CellTable = dict[tuple[str, str, str], Cell]

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


def results_location(path: Path | None) -> tuple[Path, Path]:
    """Where the training results are read and how the report names them: ``path`` as given,
    else the repository's results folder, named relative to the repository (the report does not
    depend on this machine's absolute path)."""
    if path is not None:
        return Path(path), Path(path)
    return _default_sources()[0], RESULTS


def load_cells(path: Path) -> CellTable:
    """Every cell of a results directory (:func:`~vla_verify.experiments.results.cells`) or of
    the ``cells`` list of a ``summary.json``; empty when ``path`` holds none."""
    path = Path(path)
    if path.is_dir():
        return cells(load_results(path))
    if not path.is_file():
        return {}
    data = json.loads(path.read_text())
    rows = data.get("cells") if isinstance(data, dict) else None
    table: CellTable = {}
    for row in rows if isinstance(rows, list) else []:
        key = (row["grid"], json.dumps(row["task"], sort_keys=True), row["mixer"])
        table[key] = Cell({k: v for k, v in row.items() if k not in ("grid", "task", "mixer")})
    return table


def seeds_of(cell: dict[str, Any] | None) -> int:
    """How many seeds a cell is measured on (0 without a cell)."""
    return len((cell or {}).get("values") or [])


def describe(cell: dict[str, Any] | None) -> str:
    """``mean ± std (seeds)`` of a cell, ``no result`` without one."""
    if not cell:
        return "no result"
    n = seeds_of(cell)
    return f"{cell['mean']:.3f} ± {cell['std']:.3f} ({n} seed{'' if n == 1 else 's'})"


def lacking(label: str, cell: dict[str, Any] | None) -> str | None:
    """``label (k of MIN_SEEDS seeds)`` when the cell has fewer than ``MIN_SEEDS`` seeds."""
    n = seeds_of(cell)
    return None if n >= MIN_SEEDS else f"{label} ({n} of {MIN_SEEDS} seeds)"


def compare_with_paper(label: str, cell: dict[str, Any] | None, paper: float) -> Comparison:
    """One cell against the paper's figure under :func:`agrees`; unjudged without its seeds."""
    missing = lacking(label, cell)
    if missing is not None or cell is None:
        return Comparison(label, None, (missing or label,))
    return Comparison(label, agrees(float(cell["mean"]), float(cell["std"]), seeds_of(cell), paper))


def _verdict_word(agreement: bool | None) -> str:
    return {True: "agrees", False: "differs", None: "not judged"}[agreement]


def length_result(table: CellTable, shown: Path) -> ClaimResult:
    """``C10.length`` (spec §3 C10, "with n = 8 fixed and T up to 512: VLA 1.000, DeltaNet about
    0.01"): every cell of the length sweep against the paper's figure (module docstring)."""
    rows: dict[str, dict[str, Any]] = {}
    comparisons = []
    for T in LENGTHS:
        for mixer, paper in LENGTH_PAPER.items():
            label = f"T = {T} {mixer}"
            params = {"n_pairs": LENGTH_PAIRS, "seq_len": T}
            cell = find_cell(table, "mqar_length", params, mixer)
            comparison = compare_with_paper(label, cell, paper)
            comparisons.append(comparison)
            rows[label] = {
                "T": T,
                "mixer": mixer,
                "paper": paper,
                "measured": float(cell["mean"]) if cell else None,
                "std": float(cell["std"]) if cell else None,
                "seeds": seeds_of(cell),
                "agrees": comparison.agrees,
                "text": describe(cell),
            }
    assessment = cells_verdict(comparisons)
    judged = [r for r in rows.values() if r["agrees"] is not None]
    worst = max((r["measured"] - r["paper"] for r in judged), key=abs, default=None)
    evidence = [f"rule: {assessment.reason}"] + [
        f"{label}: measured {row['text']}, paper {row['paper']:.3f} -> "
        + _verdict_word(row["agrees"])
        for label, row in rows.items()
    ]
    figures: dict[str, Any] = {"table": rows, "missing": assessment.lacking}
    if worst is not None:
        figures = {"worst_deviation": worst, **figures}
    return ClaimResult(
        id="C10.length",
        title="Recall experiments: n = 8 along T",
        statement="n = 8 fixed, T up to 512: VLA 1.000, DeltaNet ≈ 0.01.",
        formalisation=(
            f"grid mqar_length, n = {LENGTH_PAIRS}, T ∈ {{{', '.join(map(str, LENGTHS))}}}: each "
            f"VLA and DeltaNet test accuracy (mean over >= {MIN_SEEDS} seeds, the setting chosen "
            f"on validation) within {TOLERANCE} + 2 standard errors of the paper's (VLA "
            f"{LENGTH_PAPER['vla']:.3f}, DeltaNet {LENGTH_PAPER['deltanet']:.3f})"
        ),
        method=f"read {shown}",
        verdict=assessment.verdict,
        figures=figures,
        key_figure="worst_deviation" if worst is not None else None,
        evidence=evidence,
    )


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
    """``C10`` (the seven figures) and ``C10.length`` (the length sweep), from ``path`` or the
    repository's results folder."""
    source, shown = results_location(path)
    return [
        _seven_figures(source, shown, explicit=path is not None),
        length_result(load_cells(source), shown),
    ]


def _seven_figures(source: Path, shown: Path, *, explicit: bool) -> ClaimResult:
    figures = load_figures(source)
    if figures is None or not any(figures.values()):  # no C10 cell has results
        reason = (
            f"not yet measured: no C10 results in {shown} "
            "(python -m vla_verify.experiments run "
            "--grid mqar, then --grid mqar_length)"
        )
        return _result(Verdict.NOT_MEASURED, reason, [reason], {})
    missing = _missing(figures)
    if missing:
        message = f"{shown}: incomplete results for C10, no verdict: missing {', '.join(missing)}"
        if explicit:
            raise VLAInputError("results", message)
        measured = {n: c["mean"] for n, c in figures.items() if c}
        return _result(
            Verdict.NOT_MEASURED,
            f"read {shown}",
            [message],
            {"measured": measured, "missing": missing},
        )
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
    return _result(verdict, f"read {shown}", evidence, {"table": table}, worst)


CLAIM = Claim("C10", "Recall experiments", run)
