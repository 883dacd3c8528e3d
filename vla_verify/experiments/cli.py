"""Command line of the experiments: ``python -m vla_verify.experiments {run,report,list}``.

``run --grid G [--device cuda] [--workers-per-device N] [--stack M] [--time-budget S] [--sizes ...]
[--mixers ...] [--lrs ...] [--seeds ...] [--model k=v ...] [--train k=v ...]`` fills the grid's
missing results under ``--results`` (default ``experiments/results``), records the requested
job list in ``<results>/<grid>/manifest.json`` (merged with earlier requests, so the report
shows how much of everything asked for is done) and prints the completion.  ``report`` writes
``summary.json``, ``results.md`` and the PNG plots.  ``list`` prints a grid's jobs and which are
done.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..errors import VLAInputError
from .grids import GRIDS, grid_jobs
from .runner import RESULTS_DIR, pending, result_path

__all__ = ["build_parser", "main"]


def _overrides(pairs: Sequence[str], argument: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for pair in pairs:
        if "=" not in pair:
            raise VLAInputError(argument, f"expected key=value, got {pair!r}")
        key, raw = pair.split("=", 1)
        try:
            out[key] = json.loads(raw)
        except json.JSONDecodeError:
            out[key] = raw
    return out


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m vla_verify.experiments")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("run", "list"):
        p = sub.add_parser(name)
        p.add_argument("--grid", choices=GRIDS, default=None, help="required unless --plan")
        p.add_argument("--results", default=str(RESULTS_DIR), metavar="DIR")
        _add_selection(p)
        p.add_argument(
            "--plan",
            default=None,
            metavar="FILE",
            help="several grid selections run as one: a file ('-': standard input) with one "
            "line of --grid G [--sizes …] [--mixers …] [--lrs …] [--seeds …] [--model …] "
            "[--train …] per selection; the options of the command line are every line's "
            "defaults (--model and --train merged key by key); the lines' stacks start in "
            "the lines' order, within a line the longest first",
        )
        if name == "run":
            p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
            p.add_argument(
                "--workers-per-device",
                type=int,
                default=None,
                help="processes per GPU (default 4) or on the CPU (default 1: this process)",
            )
            p.add_argument(
                "--stack",
                type=int,
                default=None,
                help="jobs that differ only in seed and learning rate train side by side in one "
                "process, at most this many (default 6 on CUDA, 1 on the CPU)",
            )
            p.add_argument("--time-budget", type=float, default=None, metavar="SECONDS")
            p.add_argument("--quiet", action="store_true")
    p = sub.add_parser("report")
    p.add_argument("--results", default=str(RESULTS_DIR), metavar="DIR")
    p.add_argument("--outdir", default=None, metavar="DIR")
    p.add_argument("--no-plots", action="store_true")
    return parser


def _add_selection(p: argparse.ArgumentParser) -> None:
    """The options that select a grid's jobs (the command line's, and each line of a plan)."""
    p.add_argument("--sizes", type=int, nargs="+", default=None)
    p.add_argument("--mixers", nargs="+", default=None)
    p.add_argument("--lrs", type=float, nargs="+", default=None)
    p.add_argument("--seeds", type=int, nargs="+", default=None)
    p.add_argument("--model", nargs="*", default=[], metavar="KEY=VALUE")
    p.add_argument("--train", nargs="*", default=[], metavar="KEY=VALUE")


def _selection(args: argparse.Namespace, grid: str) -> list[Any]:
    return grid_jobs(
        grid,
        mixers=tuple(args.mixers) if args.mixers else None,
        lrs=tuple(args.lrs) if args.lrs else None,
        seeds=tuple(args.seeds) if args.seeds else None,
        sizes=tuple(args.sizes) if args.sizes else None,
        model=_overrides(args.model, "--model"),
        train=_overrides(args.train, "--train"),
    )


def _plan_lines(plan: str) -> list[str]:
    text = sys.stdin.read() if plan == "-" else Path(plan).read_text()
    return [line for line in text.splitlines() if line.strip() and not line.startswith("#")]


def _jobs(args: argparse.Namespace) -> list[list[Any]]:
    """The jobs the command line selects, by priority: one grid's as one list, or the jobs of
    each line of ``--plan`` (a job of several lines at its first)."""
    if args.plan is None:
        if args.grid is None:
            raise VLAInputError("--grid", "expected a grid (or --plan FILE)")
        return [_selection(args, args.grid)]
    line_parser = argparse.ArgumentParser(prog="--plan line", add_help=False)
    line_parser.add_argument("--grid", choices=GRIDS, required=True)
    _add_selection(line_parser)
    lines: list[list[Any]] = []
    seen: set[str] = set()
    for line in _plan_lines(args.plan):
        try:
            own = line_parser.parse_args(shlex.split(line))
        except SystemExit:
            raise VLAInputError("--plan", f"cannot read the line {line!r}") from None
        for name in ("sizes", "mixers", "lrs", "seeds"):
            if getattr(own, name) is None:
                setattr(own, name, getattr(args, name))
        own.model = [*args.model, *own.model]  # the line's own keys come last and win
        own.train = [*args.train, *own.train]
        lines.append([job for job in _selection(own, own.grid) if job.key() not in seen])
        seen.update(job.key() for job in lines[-1])
    if not seen:
        raise VLAInputError("--plan", "expected at least one line of grid options")
    return lines


def _record_manifest(results: Path, grid: str, jobs: Sequence[Any]) -> None:
    path = results / grid / "manifest.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    keys = json.loads(path.read_text())["keys"] if path.is_file() else []
    keys += [j.key() for j in jobs if j.key() not in set(keys)]
    path.write_text(json.dumps({"grid": grid, "keys": keys}, indent=1) + "\n")


def main(argv: Sequence[str] | None = None) -> int:
    """Exit 0 when every job ran, 1 when a job failed, 2 on bad input."""
    args = build_parser().parse_args(argv)
    try:
        return _main(args)
    except VLAInputError as exc:
        print(f"python -m vla_verify.experiments: error: {exc}", file=sys.stderr)
        return 2


def _main(args: argparse.Namespace) -> int:
    if args.command == "report":
        from .report import write_report

        out = write_report(
            Path(args.results),
            Path(args.outdir) if args.outdir else None,
            with_plots=not args.no_plots,
        )
        for f in out["files"]:
            print(f"wrote {f}")
        for grid, c in out["summary"]["completion"].items():
            print(f"{grid}: {c['done']}/{c['total']} jobs done")
        return 0
    lines = _jobs(args)
    jobs = [job for line in lines for job in line]
    results = Path(args.results)
    if args.command == "list":
        for job in jobs:
            done = "done" if result_path(results, job).is_file() else "pending"
            print(f"{done:8s} {job.key()}")
        print(f"{len(jobs) - len(pending(jobs, results))}/{len(jobs)} done")
        return 0
    from .runner import run_grid

    line_of = {job.key(): i for i, line in enumerate(lines) for job in line}
    for grid in sorted({j.grid for j in jobs}):  # a c10 or plan's jobs span grids
        _record_manifest(results, grid, [j for j in jobs if j.grid == grid])
    outcome = run_grid(
        jobs,
        results,
        device=args.device,
        workers_per_device=args.workers_per_device or (4 if args.device == "cuda" else 1),
        stack=args.stack or (6 if args.device == "cuda" else 1),
        time_budget_s=args.time_budget,
        show_progress=not args.quiet,
        priority=lambda job: line_of.get(job.key(), 0),
    )
    done = outcome["total"] - outcome["pending"]
    print(
        f"{args.grid or 'plan'}: ran {outcome['ran']}, failed {outcome['failed']}, "
        f"taken from another grid {outcome['adopted']}, "
        f"paused {outcome.get('paused', 0)} (resumed by the next run), "
        f"{done}/{outcome['total']} done"
    )
    for key, error in outcome.get("errors", {}).items():
        print(f"failed {key}: {error}", file=sys.stderr)
    return 1 if outcome["failed"] else 0
