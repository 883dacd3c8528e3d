"""C8 — cost (spec §3 C8): operations per token, the ratio to linear attention, total O(T).

The paper: O(d²) per token and ≈5× the operations of linear attention; O(T) total.

Two independent counts of one token of spec §2.3 (and §2.4 ``linear``, ``delta``, ``rls``):

- :func:`formula_flops` — written from the lines of spec §2.3;
- :func:`counted_flops` — an *instrumented* count: the step functions below are run on
  :class:`FlopArray`, an ndarray subclass that counts every arithmetic operation NumPy performs
  (``matmul`` of ``[m, n] @ [n]`` as ``2mn``; every elementwise add, subtract, multiply, divide,
  square root and maximum as one per output element; reductions as one per input element).

Convention: one flop per add, multiply, divide, square root or maximum (no fused multiply-add);
the nudge's ``A += η·I`` touches the diagonal once every ``nudge_period`` steps.

Sub-claims: ``C8.per_token`` (count grows as d², fitted exponent over d = 16…128),
``C8.ratio`` (vla / linear within ±25 % of 5 at d = 32… 128) and ``C8.total`` (the count of T
tokens is T × the count of one: total O(T)).  ``subject="naive"`` (``A_t`` recomputed as
``M_t^{-1}`` by an O(d³) inverse, an implementation where the mathematics of the cost differs)
and ``subject="refit"`` (``S_t`` refitted from all past tokens, O(t·d²) per token) exist for the
meta-tests.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..ledger import Claim, ClaimResult, Context, Verdict

__all__ = ["CLAIM", "FlopArray", "counted_flops", "formula_flops", "run"]

PAPER_RATIO = 5.0
RATIO_TOLERANCE = 0.25  # "≈5×" read as 5 ± 25 %
SUBJECTS = ("vla", "delta", "linear", "rls", "naive", "refit")


class FlopArray(np.ndarray):
    """An ndarray that adds the flops of every ufunc it takes part in to ``FlopArray.count``."""

    count: int = 0

    def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
        raw = [np.asarray(x) if isinstance(x, FlopArray) else x for x in inputs]
        result = getattr(ufunc, method)(*raw, **kwargs)
        if ufunc is np.matmul:
            a, _b = (np.asarray(x) for x in raw)
            FlopArray.count += 2 * int(np.asarray(result).size) * int(a.shape[-1])
        elif method == "reduce":
            FlopArray.count += int(np.asarray(raw[0]).size)
        elif ufunc in _COUNTED:
            FlopArray.count += int(np.asarray(result).size)
        if isinstance(result, (np.ndarray, np.generic)):  # 0-d results stay counted too
            return np.asarray(result).view(FlopArray)
        return result


_COUNTED = {np.add, np.subtract, np.multiply, np.divide, np.true_divide, np.sqrt, np.maximum}


def _normalize(x: np.ndarray) -> np.ndarray:
    return x / np.maximum(np.sqrt(x @ x), 1e-12)


def _steps(dk: int, dv: int, period: int | None) -> dict[str, Callable[..., Any]]:
    """One token of each variant, written plainly from spec §2.3–§2.4."""
    lambda0, eta, floor = 0.1, 1e-3, 1e-4
    diag = np.arange(dk)

    def readout(S: Any, z: Any, q: Any) -> Any:
        return (S @ q) / np.maximum(z @ q, 1e-4)

    def vla(st: dict[str, Any], t: int, q: Any, k: Any, v: Any, u: Any) -> Any:
        s = st["A"] @ u
        delta = np.maximum(1 + u @ s, floor)
        st["A"] = st["A"] - np.multiply.outer(s, s) / delta
        if period and t % period == 0:
            st["A"][diag, diag] = st["A"][diag, diag] + eta
        k_hat = _normalize(k)
        gate = _normalize(st["A"] @ k_hat)
        st["S"] = st["S"] + np.multiply.outer(v - st["S"] @ k_hat, gate)
        st["z"] = st["z"] + k
        return readout(st["S"], st["z"], q)

    def delta_rule(st: dict[str, Any], t: int, q: Any, k: Any, v: Any, u: Any) -> Any:
        k_hat = _normalize(k)
        st["S"] = st["S"] + np.multiply.outer(v - st["S"] @ k_hat, k_hat)
        st["z"] = st["z"] + k
        return readout(st["S"], st["z"], q)

    def linear(st: dict[str, Any], t: int, q: Any, k: Any, v: Any, u: Any) -> Any:
        st["S"] = st["S"] + np.multiply.outer(v, k)
        st["z"] = st["z"] + k
        return readout(st["S"], st["z"], q)

    def rls(st: dict[str, Any], t: int, q: Any, k: Any, v: Any, u: Any) -> Any:
        k_hat = _normalize(k)
        p = st["A"] @ k_hat
        st["A"] = st["A"] - np.multiply.outer(p, p) / (1 + k_hat @ p)
        s = st["A"] @ u
        st["A"] = st["A"] - np.multiply.outer(s, s) / np.maximum(1 + u @ s, floor)
        S = st["S"]
        pk, pu = st["A"] @ k_hat, st["A"] @ u
        st["S"] = S + np.multiply.outer(v - S @ k_hat, pk) - np.multiply.outer(S @ u, pu)
        st["z"] = st["z"] + k
        return readout(st["S"], st["z"], q)

    def naive(st: dict[str, Any], t: int, q: Any, k: Any, v: Any, u: Any) -> Any:
        # A_t recomputed from M_t by Gauss–Jordan elimination: O(dk³) per token.
        st["M"] = st["M"] + np.multiply.outer(u, u)
        M = st["M"].copy()
        inv = np.eye(dk).view(FlopArray)
        for i in range(dk):
            pivot = M[i, i]
            M[i] = M[i] / pivot
            inv[i] = inv[i] / pivot
            for j in range(dk):
                if j != i:
                    f = M[j, i]
                    M[j] = M[j] - f * M[i]
                    inv[j] = inv[j] - f * inv[i]
        k_hat = _normalize(k)
        gate = _normalize(inv @ k_hat)
        st["S"] = st["S"] + np.multiply.outer(v - st["S"] @ k_hat, gate)
        st["z"] = st["z"] + k
        return readout(st["S"], st["z"], q)

    def refit(st: dict[str, Any], t: int, q: Any, k: Any, v: Any, u: Any) -> Any:
        # S_t refitted from every past token: the Gram matrix rebuilt each step, O(t·dk²).
        st["past"].append((_normalize(k), v))
        gram = np.zeros((dk, dk)).view(FlopArray)
        cross = np.zeros((dv, dk)).view(FlopArray)
        for k_hat, v_s in st["past"]:
            gram = gram + np.multiply.outer(k_hat, k_hat)
            cross = cross + np.multiply.outer(v_s, k_hat)
        st["S"] = cross @ (gram + lambda0 * np.eye(dk))
        st["z"] = st["z"] + k
        return readout(st["S"], st["z"], q)

    return {
        "vla": vla,
        "delta": delta_rule,
        "linear": linear,
        "rls": rls,
        "naive": naive,
        "refit": refit,
    }


def counted_flops(
    variant: str, dk: int, dv: int | None = None, T: int = 1, *, nudge_period: int | None = 20
) -> float:
    """Instrumented count of ``T`` tokens of ``variant``, divided by ``T`` (flops per token)."""
    if variant not in SUBJECTS:
        raise ValueError(f"variant: expected one of {SUBJECTS}, got {variant!r}")
    dv = dk if dv is None else dv
    rng = np.random.default_rng(0)
    step = _steps(dk, dv, nudge_period)[variant]
    state = {
        "S": np.zeros((dv, dk)).view(FlopArray),
        "A": (np.eye(dk) / 0.1).view(FlopArray),
        "M": (0.1 * np.eye(dk)).view(FlopArray),
        "z": np.zeros(dk).view(FlopArray),
        "past": [],
    }
    tokens = [
        tuple(rng.standard_normal(n).view(FlopArray) for n in (dk, dk, dv, dk)) for _ in range(T)
    ]
    FlopArray.count = 0
    for t, (q, k, v, u) in enumerate(tokens, 1):
        step(state, t, q, k, v, u)
    return FlopArray.count / T


def formula_flops(variant: str, dk: int, dv: int | None = None, nudge_period: int | None = 20):
    """Flops per token from the lines of spec §2.3–§2.4 (module docstring's convention)."""
    n, m = dk, dk if dv is None else dv
    readout = 2 * m * n + 2 * n + 1 + m  # S q, z·q, max, divide
    normalize = 3 * n + 2  # x·x, sqrt, max, divide
    if variant == "linear":
        return 2 * m * n + n + readout
    if variant == "delta":
        return normalize + (2 * m * n + m) + 2 * m * n + n + readout
    if variant == "vla":
        penalty = 2 * n * n + (2 * n + 2) + 3 * n * n  # A u; 1 + u·s, max; outer, divide, sub
        nudge = (n / nudge_period) if nudge_period else 0.0
        gate = 2 * n * n + normalize  # A k̂, normalise
        write = (2 * m * n + m) + 2 * m * n  # residual; outer, add
        return penalty + nudge + normalize + gate + write + n + readout
    raise ValueError(f"variant: no formula for {variant!r}")


def _exponent(xs: list[int], ys: list[float]) -> float:
    """Slope of log y against log x over the last two points (the asymptotic exponent)."""
    return float(np.log(ys[-1] / ys[-2]) / np.log(xs[-1] / xs[-2]))


def run(ctx: Context, *, subject: str = "vla") -> list[ClaimResult]:
    widths = [16, 32, 64, 128]
    # 20 tokens: one nudge period, so the nudge's amortised cost is in the average.
    counts = {s: [counted_flops(s, d, T=20) for d in widths] for s in (subject, "linear")}
    formula = {d: formula_flops("vla", d) for d in widths}
    exponent = _exponent(widths, counts[subject])
    ratio = {d: counts[subject][i] / counts["linear"][i] for i, d in enumerate(widths)}
    ratios = [ratio[d] for d in widths[1:]]
    ratio_ok = all(abs(r / PAPER_RATIO - 1) <= RATIO_TOLERANCE for r in ratios)
    lengths = [16, 64, 256]
    totals = [counted_flops(subject, 16, T=T) * T for T in lengths]
    per_token_growth = totals[-1] / totals[0] / (lengths[-1] / lengths[0])
    formula_matches = subject != "vla" or all(
        abs(counts["vla"][i] - formula[d]) < 1 for i, d in enumerate(widths)
    )
    evidence_formula = (
        "instrumented count equals the formula of spec §2.3 at every width"
        if subject == "vla" and formula_matches
        else "instrumented count only"
    )
    flops = {d: counts[subject][i] for i, d in enumerate(widths)}
    return [
        ClaimResult(
            id="C8.per_token",
            title="Cost: O(d²) per token",
            statement="O(d²) per token.",
            formalisation="flops per token ~ d^p with p ≤ 2 (slope of log flops at d = 64→128)",
            method="instrumented flop count (FlopArray) of one token, dk = dv = d",
            verdict=Verdict.from_search(int(exponent > 2.05)),
            figures={"exponent": exponent, "flops_per_token": flops, "formula_vla": formula},
            key_figure="exponent",
            evidence=[f"{subject}: fitted exponent {exponent:.3f}; {evidence_formula}"],
        ),
        ClaimResult(
            id="C8.ratio",
            title="Cost: ≈5× linear attention",
            statement="≈5× the operations of linear attention.",
            formalisation=(
                f"flops({subject}) / flops(linear) within ±{RATIO_TOLERANCE:.0%} of "
                f"{PAPER_RATIO:g} at d = 32, 64, 128"
            ),
            method="instrumented flop counts (one flop per add, mul, div, sqrt, max)",
            verdict=Verdict.from_measurement(ratio_ok),
            figures={"ratio": ratio, "ratio_at_128": ratio[128], "paper_ratio": PAPER_RATIO},
            key_figure="ratio_at_128",
            evidence=[
                "ratio " + ", ".join(f"d={d}: {r:.2f}" for d, r in ratio.items()),
                "asymptotically 13d²/4d² = 3.25 for dk = dv = d under this convention"
                if subject == "vla"
                else f"subject {subject}",
            ],
        ),
        ClaimResult(
            id="C8.total",
            title="Cost: O(T) total",
            statement="O(T) total.",
            formalisation="total flops of T tokens / T constant in T (T = 16, 64, 256)",
            method="instrumented flop count of whole sequences, d = 16",
            verdict=Verdict.from_search(int(per_token_growth > 1.05)),
            figures={
                "total_flops": dict(zip(lengths, totals, strict=True)),
                "per_token_growth_16_to_256": per_token_growth,
            },
            key_figure="per_token_growth_16_to_256",
            evidence=[f"flops per token at T=256 / at T=16 = {per_token_growth:.4f}"],
        ),
    ]


CLAIM = Claim("C8", "Cost", run)
