"""Markdown tables and PNG plots of the grids (matplotlib imported lazily).

Plots: the MQAR capacity curve (test accuracy vs n / d_h), accuracy vs sequence length at n = 8,
copy accuracy vs prefix length, and the state norm ``||S_t||_F`` vs t (layer 1, mean over
heads, untrained and trained).  Every point is the mean over seeds at the selected learning rate
(:mod:`.results`), with the standard deviation as an error bar.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from .results import D_HEAD, MIN_SEEDS, PAPER_FIGURES, load_results, state_norm_probes, summary

__all__ = ["markdown", "plots", "write_report"]


def _fmt(cell: dict[str, Any] | None) -> str:
    if not cell:
        return "—"
    setting = cell.get("setting", {})
    model, train = setting.get("model", {}), setting.get("train", {})
    notes = ["positions"] if model.get("positions") else []
    if model.get("short_conv"):
        notes.append(f"short conv {model['short_conv']}")
    if model.get("embedding_std") is not None:
        notes.append(f"embedding std {model['embedding_std']}")
    if "steps" in train:
        notes.append(f"{train['steps']} steps")
    if train.get("matmul_precision") == "high":
        notes.append("TF32 products")
    extra = f" [{', '.join(notes)}]" if notes else ""
    return f"{cell['mean']:.3f} ± {cell['std']:.3f} ({len(cell['values'])}){extra}"


def _size(task: dict[str, Any], grid: str) -> tuple[str, int]:
    """The axis of a grid's table and plot: (label, value)."""
    if "length" in task:
        return "prefix length", task["length"]
    if grid == "mqar_length":
        return "T", task["seq_len"]
    return "n", task["n_pairs"]


def markdown(data: dict[str, Any]) -> str:
    """The summary (:func:`.results.summary`) as Markdown."""
    lines = [
        "# Experiment results",
        "",
        "## Completion",
        "",
        "Done: the jobs with a result; of which, in the last column, the results of the same "
        "experiment (task, model, training, seed, learning rate) run for another grid.",
        "",
        "| grid | done | total | same experiment in another grid |",
        "|---|---|---|---|",
    ]
    for grid, c in data["completion"].items():
        lines.append(f"| {grid} | {c['done']} | {c['total']} | {c.get('same_as', 0)} |")
    lines += [
        "",
        "## The paper's recall figures (spec §3 C10)",
        "",
        f"Test exact-match accuracy, mean ± std (seeds); a figure needs {MIN_SEEDS} seeds. "
        "In brackets, what the setting chosen on validation sets apart from the spec's "
        "backbone (§2.5): learned position embeddings, the width of the short causal convolutions "
        "on q, k, v, the embeddings' initial standard deviation (PyTorch's N(0, 1) "
        "otherwise), the number of training steps.",
        "",
        "| figure | paper | measured | learning rate |",
        "|---|---|---|---|",
    ]
    for name, paper in PAPER_FIGURES.items():
        cell = data["figures"].get(name)
        lr = f"{cell['lr']:g}" if cell else "—"
        lines.append(f"| {name} | {paper:.3f} | {_fmt(cell)} | {lr} |")
    norms = data["state_norm_t1000"]
    lines += [
        "",
        "## State norm at t = 1000 (layer 1, mean over heads; spec §3 C6)",
        "",
        "| mixer | untrained | trained |",
        "|---|---|---|",
    ]
    for mixer in sorted(set(norms["untrained"]) | set(norms["trained"])):
        row = [
            f"{norms[s][mixer]['mean']:.3g} ± {norms[s][mixer]['std']:.2g} "
            f"({len(norms[s][mixer]['values'])})"
            if mixer in norms[s]
            else "—"
            for s in ("untrained", "trained")
        ]
        lines.append(f"| {mixer} | {row[0]} | {row[1]} |")
    by_table: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for cell in data["cells"]:
        by_table[(cell["grid"], _size(cell["task"], cell["grid"])[0])].append(cell)
    for (grid, label), rows in by_table.items():
        mixers = sorted({r["mixer"] for r in rows})
        sizes = sorted({_size(r["task"], grid)[1] for r in rows})
        lines += [
            "",
            f"## Grid {grid}: test accuracy by {label}",
            "",
            f"| {label} | " + " | ".join(mixers) + " |",
            "|---" * (len(mixers) + 1) + "|",
        ]
        for size in sizes:
            cells = {r["mixer"]: r for r in rows if _size(r["task"], grid)[1] == size}
            lines.append(f"| {size} | " + " | ".join(_fmt(cells.get(m)) for m in mixers) + " |")
    return "\n".join(lines) + "\n"


def _curve(ax: Any, rows: list[dict[str, Any]], grid: str, scale: float = 1.0) -> None:
    # Distinct markers and sizes: curves at accuracy 1 lie on one another.
    for i, mixer in enumerate(sorted({r["mixer"] for r in rows})):
        pts = sorted(
            (_size(r["task"], grid)[1], r["mean"], r["std"]) for r in rows if r["mixer"] == mixer
        )
        x, y, e = (np.array(v, dtype=float) for v in zip(*pts, strict=True))
        ax.errorbar(
            x / scale,
            y,
            yerr=e,
            marker="osD^v"[i % 5],
            markersize=9 - 1.5 * (i % 4),
            alpha=0.85,
            capsize=3,
            label=mixer,
        )
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend()


def plots(results_dir: Path, outdir: Path, data: dict[str, Any]) -> list[str]:
    """Write the PNG plots; return their paths (none when matplotlib is missing)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    written = []
    by_grid: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for cell in data["cells"]:
        by_grid[cell["grid"]].append(cell)
    specs = {
        "mqar": (
            "mqar_capacity.png",
            "MQAR capacity (T = 256)",
            f"pairs per head width, n / d_h (d_h = {D_HEAD})",
            D_HEAD,
            False,
        ),
        "mqar_length": (
            "mqar_length.png",
            "MQAR at n = 8 pairs",
            "sequence length T (tokens)",
            1.0,
            True,
        ),
        "copy": ("copy_length.png", "Copy", "prefix length (tokens)", 1.0, True),
    }
    for grid, (name, title, xlabel, scale, logx) in specs.items():
        if grid not in by_grid:
            continue
        fig, ax = plt.subplots(figsize=(6, 4))
        _curve(ax, by_grid[grid], grid, scale)
        if logx:
            ax.set_xscale("log", base=2)
        ax.set_title(title)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("test exact-match accuracy (fraction)")
        fig.tight_layout()
        path = Path(outdir) / name
        fig.savefig(path, dpi=120)
        plt.close(fig)
        written.append(str(path))
    probes = state_norm_probes(load_results(results_dir))
    if probes:
        fig, ax = plt.subplots(figsize=(6, 4))
        curves: dict[tuple[str, str], list[tuple[list[int], list[float]]]] = defaultdict(list)
        for mixer, state, probe in probes:
            curves[(mixer, state)].append((probe["t"], probe["layers"][0]["mean"]))
        colours = {m: f"C{i}" for i, m in enumerate(sorted({m for m, _ in curves}))}
        for (mixer, state), runs in sorted(curves.items()):
            t = runs[0][0]
            same = [y for tt, y in runs if tt == t]
            ax.plot(
                t,
                np.mean(same, axis=0),
                color=colours[mixer],  # one colour per mixer, dashed before training
                linestyle="-" if state == "trained" else "--",
                label=f"{mixer}, {state} ({len(same)} seeds)",
            )
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_title("State norm, layer 1 (mean over heads)")
        ax.set_xlabel("token position t")
        ax.set_ylabel("Frobenius norm of the state S_t")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        fig.tight_layout()
        path = Path(outdir) / "state_norm.png"
        fig.savefig(path, dpi=120)
        plt.close(fig)
        written.append(str(path))
    return written


def write_report(
    results_dir: Path, outdir: Path | None = None, *, with_plots: bool = True
) -> dict[str, Any]:
    """Write ``summary.json``, ``results.md`` and the plots under ``outdir`` (default
    ``results_dir``); return ``{"summary": ..., "files": [...]}``."""
    outdir = Path(results_dir) if outdir is None else Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    data = summary(Path(results_dir))
    (outdir / "summary.json").write_text(json.dumps(data, indent=1) + "\n")
    (outdir / "results.md").write_text(markdown(data))
    files = [str(outdir / "summary.json"), str(outdir / "results.md")]
    if with_plots:
        files += plots(Path(results_dir), outdir, data)
    return {"summary": data, "files": files}
