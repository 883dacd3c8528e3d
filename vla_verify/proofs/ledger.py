"""The claims ledger: every claim of spec §3 with a computed verdict and its evidence.

``vla-verify claims`` (and the second half of ``vla-verify run``) runs one small module per claim
(:mod:`vla_verify.proofs.claims`).  Each module states the paper's claim, its formalisation and
the method, and *computes* a verdict from evidence: a Hypothesis search for violations (with a
minimal, interval-certified counterexample when it finds one), a sympy proof, or a measurement
compared with the paper's figure.  No verdict is a constant: :class:`Verdict` is only ever built
by :meth:`Verdict.from_search`, :meth:`Verdict.from_measurement` or :meth:`Verdict.from_results`.

Verdicts (spec §3): ``HOLDS``; ``FAILS`` (with a counterexample file); ``HOLDS_ONLY_IF`` (with the
condition the search found); ``REPRODUCED`` / ``NOT_REPRODUCED`` for measured figures;
``NOT_MEASURED`` where the data a claim needs does not exist yet (C9, C10).

The JSON written by ``--json PATH`` is ``{"claims": [{"id", "verdict", "condition", "figures",
"counterexample", ...}, ...]}``, one entry per claim and sub-claim (``C3.vla``, ``C4.step``…).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

from ..errors import VLAInputError
from ..progress import ProgressBar

__all__ = [
    "PROFILES",
    "Claim",
    "ClaimResult",
    "Context",
    "LedgerReport",
    "Profile",
    "Verdict",
    "add_arguments",
    "all_claims",
    "main",
    "run_claims",
    "run_from_cli",
]


class Verdict(str, Enum):
    """A claim's verdict.  Build it from evidence with the ``from_*`` constructors."""

    HOLDS = "HOLDS"
    FAILS = "FAILS"
    HOLDS_ONLY_IF = "HOLDS_ONLY_IF"
    REPRODUCED = "REPRODUCED"
    NOT_REPRODUCED = "NOT_REPRODUCED"
    NOT_MEASURED = "NOT_MEASURED"

    @classmethod
    def from_search(cls, violations: int, *, condition_separates: bool = False) -> Verdict:
        """The verdict of a search for violations of a universal statement.

        ``violations``: how many searched examples violated it.  ``condition_separates``: True
        when a condition was identified under which the search found no violation *and* every
        violation lies outside it (the claim then holds only under that condition).
        """
        if violations < 0:
            raise VLAInputError("violations", f"expected a count >= 0, got {violations}")
        if violations == 0:
            return cls.HOLDS
        return cls.HOLDS_ONLY_IF if condition_separates else cls.FAILS

    @classmethod
    def from_measurement(cls, agrees: bool | None) -> Verdict:
        """``REPRODUCED`` / ``NOT_REPRODUCED`` by whether a measured figure agrees with the
        paper's; ``NOT_MEASURED`` when there is no measurement (``agrees is None``)."""
        if agrees is None:
            return cls.NOT_MEASURED
        return cls.REPRODUCED if agrees else cls.NOT_REPRODUCED

    @classmethod
    def from_results(cls, verdicts: Iterable[Verdict]) -> Verdict:
        """The conjunction of sub-verdicts of a universal claim: FAILS beats HOLDS_ONLY_IF beats
        HOLDS (a claim that must hold in every setting fails if it fails in one)."""
        seen = set(verdicts)
        for v in (cls.FAILS, cls.NOT_REPRODUCED, cls.HOLDS_ONLY_IF, cls.NOT_MEASURED):
            if v in seen:
                return v
        if cls.REPRODUCED in seen:
            return cls.REPRODUCED
        if not seen:
            return cls.NOT_MEASURED
        return cls.HOLDS


@dataclass(frozen=True)
class Profile:
    """Search effort.  ``quick``: the whole ledger in a couple of minutes on two cores;
    ``thorough``: more examples, longer T, larger dk (≤ 60 minutes)."""

    name: str
    examples: int  # Hypothesis examples per search
    max_T: int  # longest sequence a search draws
    max_dk: int  # widest head a search draws
    mp_examples: int  # examples checked in mpmath (slow)
    drift_T: tuple[int, ...]  # C1: lengths for the float32 / bfloat16 drift
    drift_dk: int
    growth_T: tuple[int, ...]  # C4.product / C5: lengths for the growth test
    capacity_dk: int  # C7
    capacity_trials: int
    layer_T: int  # C6 (spec: T = 1000)
    layer_seeds: int
    jacobian_dk: tuple[int, ...]  # C4: widths of the random-input Jacobian survey
    # The adversary (vla_verify.properties.adversary), C4.product and C5:
    adversary_T0: int = 100  # length of the whole-sequence gradient search
    adversary_restarts: int = 4  # restarts of a gradient search (one batch)
    adversary_steps: int = 60  # Adam steps of a gradient search
    joint_greedy_T: int = 1000  # longest run of the greedy that also chooses u_t
    state_dk: tuple[int, ...] = (2,)  # C5: head widths searched
    product_dk: tuple[int, ...] = (2, 8, 64)  # C4.product: head widths searched
    product_T: int = 50  # C4.product: longest product searched (≤ 64)
    certify_long: bool = False  # interval re-check of the longest C5 counterexample in-run
    c1_T: tuple[int, ...] = (10, 100, 1000, 10000)  # C1: drift lengths per precision
    c1_float32_T: int = 10000  # C1: longest float32 drift


PROFILES: dict[str, Profile] = {
    "quick": Profile(
        name="quick",
        examples=40,
        max_T=24,
        max_dk=6,
        mp_examples=3,
        drift_T=(10, 100, 1000),
        drift_dk=16,
        growth_T=(100, 1000, 10000),
        capacity_dk=16,
        capacity_trials=3,
        layer_T=1000,
        layer_seeds=1,
        jacobian_dk=(4, 16, 32),
    ),
    "thorough": Profile(
        name="thorough",
        examples=400,
        max_T=64,
        max_dk=16,
        mp_examples=12,
        drift_T=(10, 100, 1000, 4000, 10000),
        drift_dk=32,
        growth_T=(100, 1000, 10000, 100000),
        capacity_dk=32,
        capacity_trials=10,
        layer_T=1000,
        layer_seeds=5,
        jacobian_dk=(2, 4, 16, 32, 64, 96),
        adversary_restarts=16,
        adversary_steps=300,
        joint_greedy_T=10000,
        state_dk=(2, 4),
        product_T=64,
        certify_long=True,
        c1_T=(10, 100, 1000, 10000, 100000),
        c1_float32_T=1000000,
    ),
}


@dataclass
class Context:
    """What a claim's ``run`` receives: the profile, where to write, the seed, progress."""

    profile: Profile
    outdir: Path
    seed: int = 0
    show_progress: bool = False

    def bar(self, label: str, total: int) -> ProgressBar:
        return ProgressBar(label, total, enabled=self.show_progress)

    @property
    def counterexample_dir(self) -> Path:
        path = self.outdir / "counterexamples"
        path.mkdir(parents=True, exist_ok=True)
        return path


@dataclass
class ClaimResult:
    """The verdict of one claim or sub-claim with its evidence (spec §3)."""

    id: str
    title: str
    statement: str  # the paper's words
    formalisation: str
    method: str
    verdict: Verdict
    condition: str | None = None
    figures: dict[str, Any] = field(default_factory=dict)
    key_figure: str | None = None  # the name of the figure shown in the terminal table
    evidence: list[str] = field(default_factory=list)
    counterexample: str | None = None  # path of the certified counterexample JSON
    certified: bool | None = None  # interval arithmetic confirmed the counterexample
    proofs: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0
    series: dict[str, Any] = field(default_factory=dict)  # data for the plots (not in JSON)

    def __post_init__(self) -> None:
        if not isinstance(self.verdict, Verdict):
            raise VLAInputError("verdict", f"expected a Verdict, got {self.verdict!r}")
        if self.verdict is Verdict.HOLDS_ONLY_IF and not self.condition:
            raise VLAInputError("condition", f"{self.id}: HOLDS_ONLY_IF must name its condition")

    def key(self) -> str:
        """The key figure as ``name = value`` for the table."""
        if self.key_figure is None or self.key_figure not in self.figures:
            return ""
        return f"{self.key_figure} = {format_figure(self.figures[self.key_figure])}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "title": self.title,
            "verdict": self.verdict.value,
            "condition": self.condition,
            "figures": _jsonable(self.figures),
            "key_figure": self.key_figure,
            "counterexample": self.counterexample,
            "certified": self.certified,
            "statement": self.statement,
            "formalisation": self.formalisation,
            "method": self.method,
            "evidence": list(self.evidence),
            "proofs": _jsonable(self.proofs),
            "seconds": round(self.seconds, 3),
        }


def format_figure(value: Any) -> str:
    """A figure for humans: 3 significant digits for floats, as-is otherwise."""
    if isinstance(value, bool) or value is None:
        return str(value)
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            return str(value)
        return f"{value:.3g}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(format_figure(v) for v in value) + "]"
    return str(value)


def _jsonable(x: Any) -> Any:
    """Plain JSON values: NumPy scalars and arrays converted, non-finite floats as strings."""
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if hasattr(x, "tolist"):
        return _jsonable(x.tolist())
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    if isinstance(x, (str, int, float, bool)) or x is None:
        return x
    return str(x)


RunFn = Callable[[Context], list[ClaimResult]]


@dataclass(frozen=True)
class Claim:
    """One claim of spec §3: its id (``C1``…``C10``), title and how to compute its results."""

    id: str
    title: str
    run: RunFn


@dataclass
class LedgerReport:
    """All results of one ledger run, with where its files went."""

    profile: str
    seed: int
    results: list[ClaimResult]
    seconds: float
    outdir: str
    files: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "profile": self.profile,
            "seed": self.seed,
            "seconds": round(self.seconds, 2),
            "outdir": self.outdir,
            "files": dict(self.files),
            "notes": list(self.notes),
            "claims": [r.to_dict() for r in self.results],
        }


def all_claims() -> list[Claim]:
    """The registry: C1–C10 in order (imported lazily, so that ``import vla_verify`` is light)."""
    from .claims import CLAIMS

    return list(CLAIMS)


def _select(claims: Sequence[Claim], only: Sequence[str] | None) -> list[Claim]:
    if not only:
        return list(claims)
    wanted = {o.strip().upper().split(".")[0] for o in only if o.strip()}
    known = {c.id for c in claims}
    unknown = sorted(wanted - known)
    if unknown:
        raise VLAInputError("--only", f"unknown claim(s) {unknown}; known: {sorted(known)}")
    return [c for c in claims if c.id in wanted]


def _check_arguments(outdir: Any, progress: Any, only: Any, seed: Any, plots: Any) -> None:
    """The argument checks of :func:`run_claims`, before any work (each names its argument)."""
    if not isinstance(outdir, (str, Path)) or not str(outdir):
        raise VLAInputError("outdir", f"expected a folder path, got {outdir!r}")
    if Path(outdir).exists() and not Path(outdir).is_dir():
        raise VLAInputError("outdir", f"expected a folder, got the file {str(outdir)!r}")
    for name, value in (("progress", progress), ("plots", plots)):
        if not isinstance(value, bool):
            raise VLAInputError(name, f"expected True or False, got {value!r}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise VLAInputError("seed", f"expected an integer, got {seed!r}")
    if only is not None and (isinstance(only, str) or not all(isinstance(o, str) for o in only)):
        raise VLAInputError(
            "only", f"expected a list of claim ids such as ['C1', 'C4'], got {only!r}"
        )


def _check_output_file(path: Any, argument: str) -> None:
    if path is None:
        return
    p = Path(path)
    if p.is_dir() or not p.resolve().parent.is_dir():
        raise VLAInputError(argument, f"expected a file path in an existing folder, got {path!r}")


def run_claims(
    profile: str | Profile = "quick",
    outdir: str | Path = "vla-verify-report",
    progress: bool = True,
    *,
    only: Sequence[str] | None = None,
    seed: int = 0,
    plots: bool = True,
) -> LedgerReport:
    """Compute the verdict of every claim (or those in ``only``) and write the reports.

    Writes ``claims.json``, ``claims.md`` and (when matplotlib is installed and ``plots``) PNG
    plots under ``outdir``; counterexamples go to ``outdir/counterexamples/``.
    """
    if isinstance(profile, str):
        if profile not in PROFILES:
            raise VLAInputError("profile", f"expected one of {sorted(PROFILES)}, got {profile!r}")
        profile = PROFILES[profile]
    elif not isinstance(profile, Profile):
        raise VLAInputError(
            "profile", f"expected a profile name {sorted(PROFILES)} or a Profile, got {profile!r}"
        )
    _check_arguments(outdir, progress, only, seed, plots)
    out = Path(outdir)
    out.mkdir(parents=True, exist_ok=True)
    ctx = Context(profile=profile, outdir=out, seed=int(seed), show_progress=progress)
    claims = _select(all_claims(), only)
    start = time.perf_counter()
    results: list[ClaimResult] = []
    bar = ProgressBar(f"claims ({profile.name})", len(claims), enabled=progress)
    for i, claim in enumerate(claims):
        bar(i)
        t0 = time.perf_counter()
        try:
            claim_results = claim.run(ctx)
        except ModuleNotFoundError as exc:
            if exc.name not in _OPTIONAL_PACKAGES:
                raise
            claim_results = [_not_measured_without(claim, exc.name)]
        for r in claim_results:
            if r.seconds == 0.0:
                r.seconds = time.perf_counter() - t0
            results.append(r)
    bar(len(claims))
    bar.close()
    report = LedgerReport(profile.name, ctx.seed, results, time.perf_counter() - start, str(out))
    from .. import reports

    report.files.update(reports.write_all(report, out, plots=plots))
    return report


#: Optional packages (extras) that some claims need; without them those claims are not measured.
_OPTIONAL_PACKAGES = {"torch": "torch", "triton": "triton", "matplotlib": "plots", "fla": "fla"}


def _not_measured_without(claim: Claim, package: str) -> ClaimResult:
    """The result of a claim whose computation needs an optional package that is absent (the
    adversary engine of C4 and C5 differentiates through the recurrence with PyTorch)."""
    extra = _OPTIONAL_PACKAGES[package]
    return ClaimResult(
        id=claim.id,
        title=claim.title,
        statement="",
        formalisation="",
        method="",
        verdict=Verdict.NOT_MEASURED,
        evidence=[
            f"not measured: its computation needs the package {package}, which is not "
            f"installed (pip install 'vla-verify[{extra}]')"
        ],
    )


# -- command line --------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``vla-verify claims``."""
    parser.add_argument("--profile", choices=sorted(PROFILES), default="quick")
    parser.add_argument("--json", default=None, metavar="PATH", help="write the ledger as JSON")
    parser.add_argument(
        "--markdown", default=None, metavar="PATH", help="write the ledger as Markdown"
    )
    parser.add_argument(
        "--outdir", default="vla-verify-report", metavar="DIR", help="reports, plots, certificates"
    )
    parser.add_argument(
        "--only", default=None, metavar="C1,C4,...", help="run only these claims (comma-separated)"
    )
    parser.add_argument(
        "--replay",
        default=None,
        metavar="FILE",
        help="re-run a saved counterexample and re-check it in interval arithmetic (float64 "
        "only where the interval check would cost more than 1e6 multiply-adds)",
    )
    parser.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.add_argument("--seed", type=int, default=0)


#: Interval multiply-adds ``--replay`` spends at most on a re-check (seconds in mpmath.iv);
#: a costlier file is re-measured in float64 only.
REPLAY_INTERVAL_BUDGET = 1_000_000


def _interval_cost(cx: Any) -> int:
    """Interval multiply-adds of ``cx``'s re-check: ``T·dk³`` for a Jacobian product (a matrix
    product per step), ``T·dk²`` otherwise (the recurrence)."""
    T, dk = cx.t + 1, int(cx.inputs["k"]["shape"][-1])
    return T * dk**3 if cx.quantity.startswith("jacobian_product") else T * dk**2


def _violates(cx: Any) -> bool:
    """Whether the recorded float64 figure lies on the violating side of the claim (a file may
    also record the worst found inside the claim)."""
    m, c = cx.measured, cx.claimed
    return {"==": m != c, "<": m >= c, "<=": m > c, ">=": m < c}[cx.relation]


def replay_file(path: str | Path) -> tuple[int, str]:
    """Re-run a saved counterexample (:func:`vla_verify.proofs.certificates.replay`):
    ``(exit code, text)``.  0: it still fails and the interval check certifies it — or, where
    the check would cost more than :data:`REPLAY_INTERVAL_BUDGET`, the float64 re-measure
    reproduces it — or the file records a worst case inside the claim and the re-measure
    reproduces it; 1: it no longer reproduces or is not certified; 2: the file is missing or
    unreadable."""
    from . import certificates

    p = Path(path)
    if not p.is_file():
        return 2, f"vla-verify: error: --replay: no such file {str(p)!r}"
    try:
        cx = certificates.load(p)
        affordable = _interval_cost(cx) <= REPLAY_INTERVAL_BUDGET
        outcome = certificates.replay(cx) if affordable else None
        now = outcome.measured_now if outcome else certificates.measure(cx)
    except (ValueError, KeyError, TypeError, OSError, json.JSONDecodeError) as exc:
        return 2, f"vla-verify: error: --replay: cannot replay {str(p)!r}: {exc}"
    if outcome is not None and _violates(cx):
        lines = [
            f"counterexample {p}",
            f"  still fails: {'yes' if outcome.reproduced else 'NO'}",
            "  interval check (mpmath.iv): "
            + ("certified" if outcome.interval.certified else "NOT certified"),
            outcome.summary(),
        ]
        return (0 if outcome.ok else 1), "\n".join(lines)
    reproduced = now == cx.measured or (
        math.isfinite(now) and abs(now - cx.measured) <= 1e-12 * max(abs(cx.measured), 1e-300)
    )
    kind = "counterexample" if _violates(cx) else "worst case found inside the claim"
    lines = [
        f"{kind} {p}",
        cx.describe(),
        f"  replayed in float64: {now:.17g} (recorded {cx.measured:.17g}): "
        + ("reproduced" if reproduced else "NOT reproduced"),
    ]
    if outcome is not None:
        lines.append(f"  interval re-check: {outcome.interval.detail}")
    else:
        lines.append(
            f"  interval re-check: not run ({_interval_cost(cx):.2g} interval multiply-adds > "
            f"{REPLAY_INTERVAL_BUDGET:.0e}); float64 re-measure only"
        )
    if _violates(cx):
        lines.append("  still fails: " + ("yes (float64 only)" if reproduced else "NO"))
    return (0 if reproduced else 1), "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    """``vla-verify claims``: exit 0 when the ledger was computed (whatever the verdicts)."""
    if args.replay:
        code, text = replay_file(args.replay)
        print(text, file=sys.stderr if code == 2 else sys.stdout)
        return code
    _check_output_file(args.json, "--json")
    _check_output_file(args.markdown, "--markdown")
    only = args.only.split(",") if args.only else None
    report = run_claims(
        args.profile,
        args.outdir,
        progress=not args.quiet,
        only=only,
        seed=args.seed,
        plots=not args.no_plots,
    )
    from .. import reports

    print(reports.terminal_table(report))
    if args.json:
        Path(args.json).write_text(json.dumps(report.to_dict(), indent=1) + "\n")
        print(f"wrote {args.json}")
    if args.markdown:
        Path(args.markdown).write_text(reports.markdown(report))
        print(f"wrote {args.markdown}")
    return 0


def run_from_cli(args: argparse.Namespace) -> dict[str, Any]:
    """The claims half of ``vla-verify run``: print the table, return the ledger as JSON data."""
    report = run_claims(
        getattr(args, "profile", "quick"),
        getattr(args, "outdir", "vla-verify-report"),
        progress=not getattr(args, "quiet", False),
        seed=getattr(args, "seed", 0) or 0,
        plots=not getattr(args, "no_plots", False),
    )
    from .. import reports

    print(reports.terminal_table(report))
    return report.to_dict()
