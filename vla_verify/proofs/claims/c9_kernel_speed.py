"""C9 — kernel speed (spec §3 C9), read from the kernel benchmarks.

The paper: the fused Triton kernel is 14× faster than sequential Python, scales as O(T), and
beats softmax attention latency above ≈43,000 tokens.

This module measures nothing itself (the ledger runs on CPU machines).  It reads the results of
``vla-verify bench --suite grid`` from an explicit path (``run(ctx, path=...)``) or, by default,
from the package's copy of the stored H200 run, ``vla_verify/data/h200_fused.json`` (a copy of
``benchmarks/results/h200/fused.json``; a test keeps the two equal), never from the working
directory; without results it says plainly that the claim is not yet measured.  Schema::

    {"machine": {...}, "records": [{"op": "vla_triton_fused" | "vla_torch_sequential" | "sdpa"
                                          | ..., "B": 1, "T": 4096, "H": 16, "D": 64,
                                    "dtype": "bfloat16", "mode": "fwd" | "fwdbwd",
                                    "median_ms": 1.23}, ...]}

Forward times at head dim ``D = 64`` are used ("sequential Python" is the PyTorch per-token loop,
``vla_torch_sequential``; "softmax attention" is PyTorch SDPA).  Sub-claims: ``C9.speedup``
(sequential / fused at the longest common T within a factor 2 of 14), ``C9.scaling`` (fused time
~ T^p with p ≤ 1.15 over the two longest T) and ``C9.crossover`` (VLA beats softmax from a
length within a factor 2 of 43,000).

The crossover's verdict reads the bracket that the measured lengths put around it, not a
single length: with VLA slower at every measured T below the first one at which it is faster,
the crossing lies in ``(lo, hi]``, ``lo`` the measured T before ``hi`` (0 if none).
REPRODUCED if the bracket lies inside ``[43,000/2, 2·43,000]``; NOT_REPRODUCED if it lies
wholly below the window, or if VLA is slower at some measured T at or above the window's top
(then the crossing is above it); otherwise NOT_MEASURED, with the lengths left to measure — a
grid too coarse to place the crossing decides nothing.

The crossover asks whether VLA, by whichever of its kernels is faster at each T, beats softmax
attention; so it reads the run that timed the chunked kernel, the recurrent one and SDPA side
by side (``benchmarks/gpu/chunk_h200.py``; by default the package's copy
``vla_verify/data/chunk.json`` of the newest grid, ``benchmarks/results/h200/chunk.json``,
which names its GPU), and takes per
T the faster of ``vla_triton_fused`` and ``vla_triton_chunked`` against ``sdpa`` of the same
run.  An explicit ``path`` is read for all three sub-claims; ``crossover_path`` overrides the
crossover's file.
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from ..ledger import Claim, ClaimResult, Context, Verdict

__all__ = ["CLAIM", "RESULTS", "load_rows", "run"]

#: The package's copy of the stored results (``benchmarks/results/h200/fused.json``).
RESULTS = "data/h200_fused.json"
#: The package's copy of the chunked kernel's run (``benchmarks/results/h200/chunk.json``).
CROSSOVER_RESULTS = "data/chunk.json"
#: The VLA kernels whose faster time, per T, meets softmax attention.
VLA_KERNELS = ("vla_triton_fused", "vla_triton_chunked")
PAPER_SPEEDUP = 14.0
PAPER_CROSSOVER = 43_000.0


def load_rows(
    path: Path | None = None, packaged_name: str = RESULTS
) -> tuple[list[dict[str, Any]] | None, str]:
    """The benchmark rows of ``path`` (default: the package's copy ``packaged_name``, which is
    :data:`RESULTS` unless given) and where they came from (the file, and the GPU its machine
    record names), or ``(None, why not)``."""
    if path is None:
        packaged = resources.files("vla_verify").joinpath(packaged_name)
        if not packaged.is_file():
            return None, f"no kernel benchmark results yet (vla_verify/{packaged_name} is missing)"
        text, source = packaged.read_text(), f"vla_verify/{packaged_name}"
    elif Path(path).is_file():
        text, source = Path(path).read_text(), str(path)
    else:
        return None, f"no kernel benchmark results yet ({path} does not exist)"
    data = json.loads(text)
    rows = data.get("records") if isinstance(data, dict) else None
    if not isinstance(rows, list):
        return None, f"{source}: expected {{'records': [...]}}"
    machine = data.get("machine")
    if isinstance(machine, dict) and machine.get("gpu"):
        source = f"{source} ({machine['gpu']})"
    return rows, source


def _times(
    rows: list[dict[str, Any]], op: str, *, D: int = 64, mode: str = "fwd"
) -> dict[int, float]:
    """Forward median times by T for one op at head dim D (the best over dtypes, if several)."""
    times: dict[int, float] = {}
    for r in rows:
        if r.get("op") == op and r.get("mode") == mode and int(r.get("D", D)) == D:
            if r.get("median_ms") is not None:
                T = int(r["T"])
                times[T] = min(times.get(T, np.inf), float(r["median_ms"]))
    return times


def _fastest_vla(rows: list[dict[str, Any]]) -> tuple[dict[int, float], dict[int, str]]:
    """Per T, the faster of the :data:`VLA_KERNELS` timed in ``rows``: times and which op."""
    times: dict[int, float] = {}
    which: dict[int, str] = {}
    for op in VLA_KERNELS:
        for T, ms in _times(rows, op).items():
            if ms < times.get(T, np.inf):
                times[T], which[T] = ms, op
    return times, which


def run(
    ctx: Context, *, path: Path | None = None, crossover_path: Path | None = None
) -> list[ClaimResult]:
    rows, source = load_rows(path)
    fused = _times(rows, "vla_triton_fused") if rows else {}
    python = _times(rows, "vla_torch_sequential") if rows else {}
    method = f"read {source}" if rows else source
    if crossover_path is None and path is not None:
        cross_rows, cross_source = rows, source
    else:
        cross_rows, cross_source = load_rows(crossover_path, CROSSOVER_RESULTS)
    vla, fastest = _fastest_vla(cross_rows) if cross_rows else ({}, {})
    softmax = _times(cross_rows, "sdpa") if cross_rows else {}
    cross_method = f"read {cross_source}" if cross_rows else cross_source

    common = sorted(set(fused) & set(python))
    speedup = python[common[-1]] / fused[common[-1]] if common else None
    Ts = sorted(fused)
    exponent = (
        float(np.log(fused[Ts[-1]] / fused[Ts[-2]]) / np.log(Ts[-1] / Ts[-2]))
        if len(Ts) >= 2
        else None
    )
    both = sorted(set(vla) & set(softmax))
    crossover = next((T for T in both if vla[T] < softmax[T]), None) if both else None
    low, high = PAPER_CROSSOVER / 2, PAPER_CROSSOVER * 2
    bracket: tuple[int, int | None] | None = None
    if both:
        slower = [T for T in both if crossover is None or T < crossover]
        bracket = (slower[-1] if slower else 0, crossover)
    placed = _place(bracket, low, high)
    # Where the two power laws through the two longest common T would cross (an extrapolation,
    # reported as a figure, never used for the verdict).
    extrapolated = None
    if crossover is None and len(both) >= 2:
        T1, T2 = both[-2], both[-1]
        p_f = np.log(vla[T2] / vla[T1]) / np.log(T2 / T1)
        p_s = np.log(softmax[T2] / softmax[T1]) / np.log(T2 / T1)
        if p_s > p_f:
            extrapolated = float(T2 * (vla[T2] / softmax[T2]) ** (1.0 / (p_s - p_f)))
    kernels = ", ".join(f"{T}: {fastest[T].removeprefix('vla_triton_')}" for T in both)

    def at_least(value: float | None, claimed: float) -> bool | None:
        # A speed-up is a lower bound: faster than claimed reproduces it too.
        return None if value is None else value >= claimed / 2

    not_yet = [] if rows else ["not yet measured: " + source]
    cross_not_yet = [] if cross_rows else ["not yet measured: " + cross_source]
    return [
        ClaimResult(
            id="C9.speedup",
            title="Kernel speed: 14× sequential Python",
            statement="The fused Triton kernel is 14× faster than sequential Python.",
            formalisation="python_ms / fused_ms at the longest common T ≥ 14/2 (a speed-up is "
            "a lower bound; within a factor 2)",
            method=method,
            verdict=Verdict.from_measurement(at_least(speedup, PAPER_SPEEDUP)),
            figures={"speedup": speedup, "paper": PAPER_SPEEDUP},
            key_figure="speedup" if speedup is not None else None,
            evidence=not_yet or [f"speedup {speedup} at T = {common[-1] if common else '-'}"],
        ),
        ClaimResult(
            id="C9.scaling",
            title="Kernel speed: O(T)",
            statement="The fused kernel scales as O(T).",
            formalisation="fused time ~ T^p with p ≤ 1.15 over the two longest T",
            method=method,
            verdict=Verdict.from_measurement(None if exponent is None else exponent <= 1.15),
            figures={"exponent": exponent},
            key_figure="exponent" if exponent is not None else None,
            evidence=not_yet or [f"fitted exponent {exponent}"],
        ),
        ClaimResult(
            id="C9.crossover",
            title="Kernel speed: beats softmax above ≈43k tokens",
            statement="Beats softmax attention latency above ≈43,000 tokens.",
            formalisation="the crossing of min(fused_ms, chunked_ms) and softmax_ms, all from "
            "one run, bracketed by the measured T: (last T slower, first T faster] inside "
            "[43,000/2, 2·43,000]",
            method=cross_method,
            verdict=Verdict.from_measurement(placed[0]),
            figures={
                "crossover_T": crossover,
                "crossover_bracket": list(bracket) if bracket else None,
                "extrapolated_crossover_T": extrapolated,
                "vla_over_softmax_at_longest_T": vla[both[-1]] / softmax[both[-1]]
                if both
                else None,
                "fastest_vla_kernel": {T: fastest[T] for T in both},
                "paper": PAPER_CROSSOVER,
            },
            key_figure=("crossover_T" if crossover else "extrapolated_crossover_T")
            if both
            else None,
            evidence=cross_not_yet
            or [
                placed[1],
                f"crossover at T = {crossover} (measured T: {both})"
                if crossover
                else f"no crossover up to T = {both[-1]}: the faster VLA kernel is "
                f"{vla[both[-1]] / softmax[both[-1]]:.1f}x slower than softmax there; the power "
                f"laws through the two longest T cross near T = {extrapolated:.3g}"
                if extrapolated
                else f"no crossover up to T = {both[-1]}",
                f"the faster VLA kernel per T: {kernels}",
            ],
        ),
    ]


def _place(
    bracket: tuple[int, int | None] | None, low: float, high: float
) -> tuple[bool | None, str]:
    """Whether the crossing's bracket ``(lo, hi]`` (``hi`` None: VLA slower at every measured
    T up to ``lo``) lies inside ``[low, high]`` (True), outside it (False) or across an edge
    (None), and why (module docstring)."""
    if bracket is None:
        return None, "no lengths measured for both"
    lo, hi = bracket
    window = f"[{low:.0f}, {high:.0f}]"
    if hi is None:
        if lo >= high:
            return False, f"VLA slower at T = {lo}, above the window {window}"
        return None, (f"VLA slower up to T = {lo}, below the window's top {high:.0f}: "
                      "longer sequences decide")  # fmt: skip
    if hi < low:
        return False, f"VLA faster from T = {hi}, below the window {window}"
    if lo >= high:
        return False, f"VLA slower at T = {lo}, above the window {window}"
    if lo >= low and hi <= high:
        return True, f"the crossing lies in ({lo}, {hi}], inside the window {window}"
    return None, (f"the crossing lies in ({lo}, {hi}], across an edge of the window {window}: "
                  "lengths between them decide")  # fmt: skip


CLAIM = Claim("C9", "Kernel speed", run)
