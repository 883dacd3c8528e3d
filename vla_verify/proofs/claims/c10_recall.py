"""C10 — recall experiments (spec §3 C10), read from trained-model results of a later issue.

The paper: MQAR (2-layer backbone, n = 24 pairs, dk = 32): VLA 1.000, DeltaNet 0.010, linear
attention 0.074, softmax 0.26 exact-match; fixed n = 8 with T up to 512: VLA 1.000, DeltaNet
≈ 0.01; 62 % at n = dk.

Nothing here is trained: the ledger reads ``benchmarks/results/recall/mqar.json`` when training
runs have written it, and otherwise says plainly that the claim is not yet measured.  Expected
schema::

    {"mqar_n24": {"vla": 1.0, "delta": 0.01, "linear": 0.074, "softmax": 0.26},
     "fixed_n8": {"vla": 1.0, "delta": 0.01}, "n_eq_dk": {"vla": 0.62}}

A figure is reproduced when it is within 0.05 (absolute exact-match accuracy) of the paper's.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..ledger import Claim, ClaimResult, Context, Verdict

__all__ = ["CLAIM", "PAPER", "RESULTS", "run"]

RESULTS = Path("benchmarks") / "results" / "recall" / "mqar.json"
PAPER: dict[str, dict[str, float]] = {
    "mqar_n24": {"vla": 1.0, "delta": 0.010, "linear": 0.074, "softmax": 0.26},
    "fixed_n8": {"vla": 1.0, "delta": 0.01},
    "n_eq_dk": {"vla": 0.62},
}
TOLERANCE = 0.05


def _load(path: Path | None) -> tuple[dict[str, Any] | None, str]:
    here = Path(__file__).resolve().parents[3]
    for p in [path] if path is not None else [Path.cwd() / RESULTS, here / RESULTS]:
        if p.is_file():
            return json.loads(p.read_text()), str(p)
    return None, (
        f"no trained models yet: the MQAR experiments of spec §3 C10 need trained 2-layer "
        f"models, which a later issue produces ({RESULTS} does not exist)"
    )


def run(ctx: Context, *, path: Path | None = None) -> list[ClaimResult]:
    data, source = _load(path)
    deviations: dict[str, float] = {}
    missing: list[str] = []
    for experiment, figures in PAPER.items():
        for model, claimed in figures.items():
            got = (data or {}).get(experiment, {}).get(model)
            if got is None:
                missing.append(f"{experiment}.{model}")
            else:
                deviations[f"{experiment}.{model}"] = float(got) - claimed
    agrees = (
        None
        if data is None or not deviations
        else all(abs(d) <= TOLERANCE for d in deviations.values())
    )
    worst = max(deviations.values(), key=abs) if deviations else None
    evidence = (
        ["not yet measured: " + source]
        if data is None
        else [f"read {source}; deviations from the paper: {deviations}"]
        + ([f"missing figures: {missing}"] if missing else [])
    )
    return [
        ClaimResult(
            id="C10",
            title="Recall experiments (MQAR)",
            statement=(
                "MQAR (n = 24, dk = 32): VLA 1.000, DeltaNet 0.010, linear 0.074, softmax 0.26; "
                "n = 8, T ≤ 512: VLA 1.000, DeltaNet ≈ 0.01; 62% at n = dk."
            ),
            formalisation=f"every reported exact-match accuracy within {TOLERANCE} of the paper's",
            method=f"read {source}" if data is not None else source,
            verdict=Verdict.from_measurement(agrees),
            figures={"worst_deviation": worst, "deviations": deviations},
            key_figure="worst_deviation" if worst is not None else None,
            evidence=evidence,
        )
    ]


CLAIM = Claim("C10", "Recall experiments", run)
