"""Reading and aggregating the grids' result files (NumPy and JSON only: the claims ledger uses
this module without PyTorch).

A *cell* is one (grid, task size, mixer) point.  Its jobs differ by seed and by training setting
(learning rate, and any overrides of the model or training configuration); the setting whose
mean **validation** accuracy over seeds is highest is selected (among settings with at least
:data:`MIN_SEEDS` seeds, when one has them), and the cell reports the **test** accuracy of that
setting: mean, standard deviation (ddof = 1) and every seed's value.  Selection and report use
disjoint data (:mod:`.tasks`).

The paper's figures (spec §3 C10) map to cells as follows (``d_h`` = 32):

- ``mqar_n24.<mixer>`` — grid ``mqar``, n = 24 (T = 256), mixers vla, deltanet, linear, softmax;
- ``fixed_n8.<mixer>`` — grid ``mqar_length``, n = 8 at T = 512, the longest length of the
  paper's sweep, mixers vla and deltanet;
- ``n_eq_dk.vla`` — grid ``mqar``, n = d_h = 32.

The state-norm figure of spec §3 C6 is the probe's ``||S_t||_F`` at t = 1000 in the first layer,
averaged over heads, untrained (grid ``state_norm``) and trained (the ``mqar`` jobs at n = 24).
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "C10_FIGURES",
    "MIN_SEEDS",
    "PAPER_FIGURES",
    "Cell",
    "c6_figures",
    "c10_figures",
    "cells",
    "completion",
    "find_cell",
    "load_results",
    "state_norm_probes",
    "summary",
]

MIN_SEEDS = 3
D_HEAD = 32

#: figure name -> (grid, task parameters that select the cell, mixer)
C10_FIGURES: dict[str, tuple[str, dict[str, int], str]] = {
    "mqar_n24.vla": ("mqar", {"n_pairs": 24}, "vla"),
    "mqar_n24.deltanet": ("mqar", {"n_pairs": 24}, "deltanet"),
    "mqar_n24.linear": ("mqar", {"n_pairs": 24}, "linear"),
    "mqar_n24.softmax": ("mqar", {"n_pairs": 24}, "softmax"),
    "fixed_n8.vla": ("mqar_length", {"n_pairs": 8, "seq_len": 512}, "vla"),
    "fixed_n8.deltanet": ("mqar_length", {"n_pairs": 8, "seq_len": 512}, "deltanet"),
    "n_eq_dk.vla": ("mqar", {"n_pairs": D_HEAD}, "vla"),
}

#: The paper's figures (spec §3 C10),, by figure name of :data:`C10_FIGURES`.
PAPER_FIGURES: dict[str, float] = {
    "mqar_n24.vla": 1.0,
    "mqar_n24.deltanet": 0.010,
    "mqar_n24.linear": 0.074,
    "mqar_n24.softmax": 0.26,
    "fixed_n8.vla": 1.0,
    "fixed_n8.deltanet": 0.01,
    "n_eq_dk.vla": 0.62,
}


def load_results(results_dir: Path) -> list[dict[str, Any]]:
    """Every job result ``<results_dir>/<grid>/*.json`` (manifests and summaries excluded)."""
    out = []
    for path in sorted(Path(results_dir).glob("*/*.json")):
        if path.name in ("manifest.json", "summary.json"):
            continue
        data = json.loads(path.read_text())
        if isinstance(data, dict) and "job" in data:
            out.append(data)
    return out


class Cell(dict):  # a plain dict, so that it serialises as it is
    """``{"mean", "std", "seeds", "values", "lr", "setting", "settings"}`` of one cell."""


def _setting(job: dict[str, Any]) -> str:
    return json.dumps(
        {"lr": job["lr"], "model": job["model"], "train": job["train"]}, sort_keys=True
    )


def _finite(x: Any) -> float:
    x = float(x)
    return x if math.isfinite(x) else 0.0


def cells(results: Iterable[dict[str, Any]]) -> dict[tuple[str, str, str], Cell]:
    """``(grid, task parameters as JSON, mixer) -> Cell`` (module docstring)."""
    grouped: dict[tuple[str, str, str], dict[str, list[dict[str, Any]]]] = defaultdict(
        lambda: defaultdict(list)
    )
    for r in results:
        if "test_accuracy" not in r:
            continue  # a probe-only job
        job = r["job"]
        key = (job["grid"], json.dumps(job["task_params"], sort_keys=True), job["mixer"])
        grouped[key][_setting(job)].append(r)
    out: dict[tuple[str, str, str], Cell] = {}
    for key, by_setting in grouped.items():
        stats = {
            s: {
                "val": float(np.mean([_finite(r["val_accuracy"]) for r in rs])),
                "seeds": len({r["job"]["seed"] for r in rs}),
            }
            for s, rs in by_setting.items()
        }
        enough = [s for s in stats if stats[s]["seeds"] >= MIN_SEEDS] or list(stats)
        best = max(enough, key=lambda s: (stats[s]["val"], stats[s]["seeds"]))
        chosen = sorted(by_setting[best], key=lambda r: r["job"]["seed"])
        values = [_finite(r["test_accuracy"]) for r in chosen]
        out[key] = Cell(
            mean=float(np.mean(values)),
            std=float(np.std(values, ddof=1)) if len(values) > 1 else 0.0,
            seeds=[r["job"]["seed"] for r in chosen],
            values=values,
            lr=json.loads(best)["lr"],
            setting=json.loads(best),
            settings={s: stats[s] for s in stats},
        )
    return out


def find_cell(
    table: dict[tuple[str, str, str], Cell], grid: str, params: dict[str, int], mixer: str
) -> Cell | None:
    """The cell of ``table`` (:func:`cells`) in ``grid`` for ``mixer`` whose task parameters
    include ``params`` (a cell may hold more, e.g. the vocabulary of MQAR at n = 64); None when
    there is none."""
    for (g, p, m), cell in table.items():
        task = json.loads(p)
        if g == grid and m == mixer and all(task.get(k) == v for k, v in params.items()):
            return cell
    return None


def c10_figures(results: Iterable[dict[str, Any]]) -> dict[str, Cell | None]:
    """The seven C10 figures (:data:`C10_FIGURES`), None where the cell has no result."""
    table = cells(results)
    return {name: find_cell(table, *spec) for name, spec in C10_FIGURES.items()}


def _probe_at(probe: dict[str, Any], t: int, layer: int = 0) -> float | None:
    if t not in probe["t"]:
        return None
    return float(probe["layers"][layer]["mean"][probe["t"].index(t)])


def state_norm_probes(results: Iterable[dict[str, Any]]) -> list[tuple[str, str, dict[str, Any]]]:
    """``(mixer, "untrained" | "trained", probe)`` of the C6 figure: untrained, the
    ``state_norm`` grid's probes (the spec's backbone at initialisation); trained, the probes of
    the ``mqar`` jobs at n = 24 in the setting that their cell selects (so the figure is that of
    the models whose accuracy the tables report)."""
    results = list(results)
    table = cells(results)
    out = []
    for r in results:
        job = r["job"]
        if job["grid"] == "state_norm" and "probe_untrained" in r:
            out.append((job["mixer"], "untrained", r["probe_untrained"]))
        if job["grid"] == "mqar" and "probe_trained" in r:
            key = (job["grid"], json.dumps(job["task_params"], sort_keys=True), job["mixer"])
            cell = table.get(key)
            if cell is not None and _setting(job) == json.dumps(cell["setting"], sort_keys=True):
                out.append((job["mixer"], "trained", r["probe_trained"]))
    return out


def c6_figures(results: Iterable[dict[str, Any]], t: int = 1000) -> dict[str, Any]:
    """``||S_t||_F`` at ``t`` (layer 1, mean over heads), per mixer, untrained and trained, of
    :func:`state_norm_probes`: ``{"untrained": {mixer: {"mean", "std", "values"}}, "trained":
    {...}}``."""
    found: dict[str, dict[str, list[float]]] = {
        "untrained": defaultdict(list),
        "trained": defaultdict(list),
    }
    for mixer, state, probe in state_norm_probes(results):
        if (value := _probe_at(probe, t)) is not None:
            found[state][mixer].append(value)
    return {
        state: {
            m: {
                "mean": float(np.mean(v)),
                "std": float(np.std(v, ddof=1)) if len(v) > 1 else 0.0,
                "values": v,
            }
            for m, v in sorted(by_mixer.items())
        }
        for state, by_mixer in found.items()
    }


def completion(results_dir: Path) -> dict[str, dict[str, int]]:
    """Per grid, ``{"done", "total", "same_as"}`` against the job list of its
    ``manifest.json`` (written by the runner), or the results present when a grid has no
    manifest; ``same_as`` counts the results done taken from another grid's run of the same
    experiment (:func:`.runner.adopt_equivalents`)."""
    out: dict[str, dict[str, int]] = {}
    root = Path(results_dir)
    for grid_dir in sorted(p for p in root.glob("*") if p.is_dir()):
        present = {p.stem for p in grid_dir.glob("*.json")} - {"manifest", "summary"}
        manifest = grid_dir / "manifest.json"
        if manifest.is_file():
            keys = json.loads(manifest.read_text())["keys"]
            present &= set(keys)
            total = len(keys)
        else:
            total = len(present)
        same_as = sum(
            "same_as" in json.loads((grid_dir / f"{key}.json").read_text()) for key in present
        )
        out[grid_dir.name] = {"done": len(present), "total": total, "same_as": same_as}
    return out


def summary(results_dir: Path) -> dict[str, Any]:
    """What ``report`` writes to ``summary.json``: the C10 figures, the C6 figures, every cell
    and each grid's completion."""
    results = load_results(results_dir)
    table = cells(results)
    return {
        "figures": c10_figures(results),
        "state_norm_t1000": c6_figures(results),
        "cells": [
            {"grid": g, "task": json.loads(p), "mixer": m, **cell}
            for (g, p, m), cell in sorted(table.items())
        ],
        "completion": completion(results_dir),
        "min_seeds": MIN_SEEDS,
    }
