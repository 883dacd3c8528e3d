"""Certified counterexamples (spec §3: "a FAILS verdict carries a concrete, minimal, reproducible
counterexample").

A :class:`Counterexample` holds the exact float64 inputs of one (batch, head) slice — every
number as ``float.hex`` — cut at the step where a claim is violated, the configuration, the
variant, the violated statement, the measured figure and what the claim asserts.  It is saved as
JSON (:func:`save`, :func:`load`), and:

- :func:`recheck_interval` recomputes the violated quantity from those exact inputs in
  ``mpmath.iv`` interval arithmetic (every operation rounds outwards, so the true value of the
  quantity — the recurrence of spec §2.3 in exact arithmetic on these inputs — lies inside the
  interval) and reports whether the interval lies strictly on the violating side of the claimed
  value: then the failure is *certified*, not a rounding artefact;
- :func:`replay` (``vla-verify claims --replay FILE``) reloads a file, recomputes the figure in
  float64 and re-checks it in intervals.

Quantities (``Counterexample.quantity``), each at 0-based step ``t`` of the slice:

==========================  ============================================  ========  =========
quantity                    figure                                        relation  claimed
==========================  ============================================  ========  =========
``sm_residual``  (C1)       ``||A_t M_t − I||_F``, ``M_t = A_0^{-1}+Σuuᵀ``  ``==``     0
``selectivity_increase``    ``u_tᵀA_t u_t − u_tᵀA_{t-1}u_t`` (C2)         ``<``      0
``argmin_residual`` (C3)    ``||S_t G_t − C_t||_F / ||C_t||_F``           ``==``     0
``jacobian_step_norm`` (C4) ``||I − k̂_t α̂_tᵀ||₂``                           ``==``     1
``state_norm`` (C5/C6)      ``||S_t||_F``                                 ``<=``     a bound
==========================  ============================================  ========  =========

For C3, ``G_t = Σ k̂k̂ᵀ + M_t`` and ``C_t = Σ v k̂ᵀ``: the argmin is the unique ``S`` with
``S G_t = C_t`` (:func:`vla_verify.proofs.symbolic.prove_argmin_closed_form`), so a nonzero
residual certifies ``S_t ≠ argmin`` without an interval linear solve.  For C4 the interval is a
rigorous *lower* bound ``||X w||/||w||`` (``w`` the float top singular vector) and the upper bound
``||X||_F``.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import platform
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import mpmath
import numpy as np

from ..backends.numpy_oracle import recurrence
from ..properties.strategies import Case
from ..spec import VLAConfig

__all__ = [
    "QUANTITIES",
    "Counterexample",
    "IntervalVerdict",
    "ReplayResult",
    "from_case",
    "load",
    "measure",
    "recheck_interval",
    "replay",
    "save",
]

FORMAT_VERSION = 1

#: quantity -> (relation the claim asserts, default claimed value, description)
QUANTITIES: dict[str, tuple[str, float | None, str]] = {
    "sm_residual": ("==", 0.0, "||A_t M_t − I||_F with M_t = A_0^{-1} + Σ_{s≤t} u_s u_sᵀ"),
    "selectivity_increase": ("<", 0.0, "u_tᵀA_t u_t − u_tᵀA_{t-1} u_t"),
    "argmin_residual": ("==", 0.0, "||S_t G_t − C_t||_F / ||C_t||_F"),
    "jacobian_step_norm": ("==", 1.0, "||I − k̂_t α̂_tᵀ||₂"),
    "state_norm": ("<=", None, "||S_t||_F"),
    # C4.product, "neither explode nor vanish" formalised as 0.1 ≤ ||J_1 ⋯ J_t||₂ ≤ 10: one
    # quantity per side, since a relation is fixed per quantity.
    "jacobian_product_vanishing": (">=", 0.1, "||X_1 X_2 ⋯ X_t||₂ with X_s = I − k̂_s α̂_sᵀ"),
    "jacobian_product_growth": ("<=", 10.0, "||X_1 X_2 ⋯ X_t||₂ with X_s = I − k̂_s α̂_sᵀ"),
}

_INPUTS = ("q", "k", "v", "u")
_STATE = ("S0", "A0", "z0")


# -- the record --------------------------------------------------------------------------------


def _encode(x: np.ndarray) -> dict[str, Any]:
    a = np.asarray(x, dtype=np.float64)
    return {"shape": list(a.shape), "hex": [float(v).hex() for v in a.ravel()]}


def _decode(d: dict[str, Any]) -> np.ndarray:
    flat = np.array([float.fromhex(h) for h in d["hex"]], dtype=np.float64)
    return flat.reshape(d["shape"])


def _commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=Path(__file__).resolve().parent,
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def _provenance() -> dict[str, Any]:
    import hypothesis
    import sympy

    from .. import __version__

    return {
        "vla_verify": __version__,
        "commit": _commit(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "mpmath": mpmath.__version__,
        "sympy": sympy.__version__,
        "hypothesis": hypothesis.__version__,
        "created_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }


@dataclass
class Counterexample:
    """One violation of a claim of spec §3 on exact inputs (one (batch, head) slice).

    ``inputs`` maps ``q, k, v, u`` (``[1, T, 1, dk|dv]``, spec §1) and optionally
    ``S0, A0, z0`` to ``{"shape", "hex"}`` (``float.hex`` of every element); ``t`` is the
    0-based step where ``quantity`` is measured; the claim asserts
    ``quantity <relation> claimed``; ``measured`` is the float64 figure and ``bound`` the limit
    the float check judged it against (``claimed`` plus the rounding tolerance).
    """

    claim: str
    statement: str
    quantity: str
    relation: str
    claimed: float
    measured: float
    bound: float
    t: int
    variant: str
    config: dict[str, Any]
    inputs: dict[str, dict[str, Any]]
    created: dict[str, Any] = field(default_factory=dict)
    backend: str = "numpy"
    note: str = ""
    format_version: int = FORMAT_VERSION

    def arrays(self) -> dict[str, np.ndarray]:
        """The exact float64 inputs by name."""
        return {name: _decode(d) for name, d in self.inputs.items()}

    def vla_config(self) -> VLAConfig:
        return VLAConfig(**self.config)

    def initial_state(self) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        arrays = self.arrays()
        if "S0" not in arrays:
            return None
        return arrays["S0"], arrays["A0"], arrays["z0"]

    def case(self) -> Case:
        """The inputs as a :class:`Case` (``split`` at the middle), e.g. to rerun an invariant."""
        a = self.arrays()
        T = a["q"].shape[1]
        return Case(
            a["q"],
            a["k"],
            a["v"],
            a["u"],
            self.initial_state(),
            max(1, T // 2),
            {"source": "counterexample"},
            0,
        )

    def describe(self) -> str:
        a = self.arrays()
        _, T, _, dk = a["q"].shape
        dv = a["v"].shape[-1]
        return (
            f"{self.claim} counterexample ({self.variant}, dk={dk}, dv={dv}, T={T}, step "
            f"t={self.t + 1}): {self.quantity} = {self.measured:.17g}; the claim asserts "
            f"{self.quantity} {self.relation} {self.claimed:g} — {self.statement}"
        )


def save(cx: Counterexample, path: str | Path) -> Path:
    """Write ``cx`` as JSON (exact: floats as hex strings) and return the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(dataclasses.asdict(cx), indent=1, ensure_ascii=False) + "\n")
    return path


def load(path: str | Path) -> Counterexample:
    """Read a counterexample written by :func:`save`."""
    data = json.loads(Path(path).read_text())
    version = data.get("format_version", FORMAT_VERSION)
    if version != FORMAT_VERSION:
        raise ValueError(f"{path}: counterexample format {version}, expected {FORMAT_VERSION}")
    fields = {f.name for f in dataclasses.fields(Counterexample)}
    return Counterexample(**{k: v for k, v in data.items() if k in fields})


# -- float64 measurement -----------------------------------------------------------------------


def _slice_run(
    arrays: dict[str, np.ndarray], config: VLAConfig, variant: str
) -> tuple[Any, np.ndarray]:
    state = None
    if "S0" in arrays:
        state = (arrays["S0"], arrays["A0"], arrays["z0"])
    r = recurrence(
        arrays["q"],
        arrays["k"],
        arrays["v"],
        arrays["u"],
        config=config,
        variant=variant,
        initial_state=state,
        return_states=True,
    )
    dk = arrays["q"].shape[-1]
    A0 = (np.eye(dk) / config.lambda0) if state is None else np.asarray(state[1])[0, 0]
    return r.history, A0


def _measure_float(
    quantity: str, arrays: dict[str, np.ndarray], config: VLAConfig, variant: str, t: int
) -> float:
    h, A0 = _slice_run(arrays, config, variant)
    u = arrays["u"][0, :, 0]
    dk = u.shape[-1]
    if quantity == "sm_residual":
        M = np.linalg.inv(A0) + sum(np.outer(u[s], u[s]) for s in range(t + 1))
        return float(np.linalg.norm(h.A[0, t, 0] @ M - np.eye(dk)))
    if quantity == "selectivity_increase":
        A_prev = A0 if t == 0 else h.A[0, t - 1, 0]
        return float(u[t] @ h.A[0, t, 0] @ u[t] - u[t] @ A_prev @ u[t])
    if quantity == "argmin_residual":
        kh = h.k_hat[0, : t + 1, 0]
        v = arrays["v"][0, : t + 1, 0]
        G = config.lambda0 * np.eye(dk) + kh.T @ kh + u[: t + 1].T @ u[: t + 1]
        C = v.T @ kh
        nC = np.linalg.norm(C)
        return float(np.linalg.norm(h.S[0, t, 0] @ G - C) / (nC if nC > 0 else 1.0))
    if quantity == "jacobian_step_norm":
        X = np.eye(dk) - np.outer(h.k_hat[0, t, 0], h.gate[0, t, 0])
        return float(np.linalg.norm(X, 2))
    if quantity == "state_norm":
        return float(np.linalg.norm(h.S[0, t, 0]))
    if quantity in ("jacobian_product_vanishing", "jacobian_product_growth"):
        # S_t = S_0 X_1 ⋯ X_t + (terms without S_0): the linear part of S_0 ↦ S_t.
        P = np.eye(dk)
        for s in range(t + 1):
            P = P @ (np.eye(dk) - np.outer(h.k_hat[0, s, 0], h.gate[0, s, 0]))
        return float(np.linalg.norm(P, 2))
    raise ValueError(f"unknown quantity {quantity!r}; expected one of {sorted(QUANTITIES)}")


def measure(cx: Counterexample) -> float:
    """Recompute ``cx``'s figure in float64 with the oracle (spec §2.3)."""
    return _measure_float(cx.quantity, cx.arrays(), cx.vla_config(), cx.variant, cx.t)


def from_case(
    claim: str,
    quantity: str,
    case: Case,
    config: VLAConfig,
    where: tuple[int, int, int],
    *,
    variant: str = "vla",
    statement: str = "",
    claimed: float | None = None,
    bound: float | None = None,
    backend: str = "numpy",
    note: str = "",
) -> Counterexample:
    """A counterexample from a (Hypothesis-shrunk) case: the slice ``(b, h)`` of ``where`` cut
    after step ``t`` (causality: later tokens cannot matter), with its figure measured again in
    float64.  ``claimed`` defaults to the quantity's claimed value (:data:`QUANTITIES`);
    ``bound`` (what the float check used) defaults to ``claimed``."""
    if quantity not in QUANTITIES:
        raise ValueError(f"unknown quantity {quantity!r}; expected one of {sorted(QUANTITIES)}")
    relation, default, description = QUANTITIES[quantity]
    if claimed is None:
        if default is None:
            raise ValueError(f"quantity {quantity!r} needs an explicit claimed bound")
        claimed = default
    b, t, h = where
    arrays: dict[str, np.ndarray] = {}
    for name, x in zip(_INPUTS, (case.q, case.k, case.v, case.u), strict=True):
        arrays[name] = np.ascontiguousarray(x[b : b + 1, : t + 1, h : h + 1], dtype=np.float64)
    if case.initial_state is not None:
        for name, x in zip(_STATE, case.initial_state, strict=True):
            arrays[name] = np.ascontiguousarray(x[b : b + 1, h : h + 1], dtype=np.float64)
    config_dict = dataclasses.asdict(config)
    measured = _measure_float(quantity, arrays, config, variant, t)
    return Counterexample(
        claim=claim,
        statement=statement or f"{description} {relation} {claimed:g}",
        quantity=quantity,
        relation=relation,
        claimed=float(claimed),
        measured=measured,
        bound=float(claimed if bound is None else bound),
        t=int(t),
        variant=variant,
        config=config_dict,
        inputs={name: _encode(x) for name, x in arrays.items()},
        created=_provenance(),
        backend=backend,
        note=note,
    )


# -- interval re-check -------------------------------------------------------------------------


@dataclass(frozen=True)
class IntervalVerdict:
    """The interval ``[lower, upper]`` that provably contains the exact figure, and whether it
    lies strictly on the violating side of ``quantity <relation> claimed``."""

    certified: bool
    lower: float  # rounded outward to float64
    upper: float
    claimed: float
    relation: str
    dps: int
    detail: str
    log10_width: float = float("-inf")  # log10(upper − lower), finite where the floats overflow


def _iv_recurrence(
    arrays: dict[str, np.ndarray], config: VLAConfig, variant: str, t_last: int
) -> dict[str, Any]:
    """Spec §2.3 (``vla``) or §2.4 (``rls``) on one slice in ``mpmath.iv``, up to step
    ``t_last``; returns interval lists for ``A_prev``, ``A``, ``S``, ``k_hat``, ``gate`` at
    ``t_last`` and the running sums for C3."""
    iv = mpmath.iv
    X = lambda x: iv.mpf(float(x))  # noqa: E731  exact: a float is an mpf
    q, k, v, u = (arrays[n][0, :, 0] for n in _INPUTS)
    dk, dv = k.shape[-1], v.shape[-1]
    floor, norm_eps, eta = X(config.sm_floor), X(config.norm_eps), X(config.nudge_eta)
    lam0 = X(config.lambda0)

    def imax(a: Any, b: Any) -> Any:
        if a.a >= b.b:
            return a
        if a.b <= b.a:
            return b
        return iv.mpf([min(a.a, b.a), max(a.b, b.b)])

    def dot(x: list, y: list) -> Any:
        acc = X(0)
        for a, b in zip(x, y, strict=True):
            acc = acc + a * b
        return acc

    def matvec(M: list, x: list) -> list:
        return [dot(row, x) for row in M]

    def normalize(x: list) -> list:
        n = imax(iv.sqrt(sum((a**2 for a in x), X(0))), norm_eps)
        return [a / n for a in x]

    def downdate(M: list, x: list, fl: Any | None) -> list:
        s = matvec(M, x)
        den = X(1) + dot(x, s)
        if fl is not None:
            den = imax(den, fl)
        return [[M[i][j] - s[i] * s[j] / den for j in range(dk)] for i in range(dk)]

    if "S0" in arrays:
        S = [[X(x) for x in row] for row in arrays["S0"][0, 0]]
        A = [[X(x) for x in row] for row in arrays["A0"][0, 0]]
    else:
        S = [[X(0)] * dk for _ in range(dv)]
        A = [[(X(1) / lam0) if i == j else X(0) for j in range(dk)] for i in range(dk)]
    out: dict[str, Any] = {}
    for t in range(t_last + 1):
        kt = [X(x) for x in k[t]]
        ut = [X(x) for x in u[t]]
        vt = [X(x) for x in v[t]]
        kh = normalize(kt)
        A_prev = A
        if variant == "vla":
            A = downdate(A, ut, floor)
            if config.nudges_at(t + 1):
                A = [[A[i][j] + (eta if i == j else 0) for j in range(dk)] for i in range(dk)]
            alpha = matvec(A, kh)
            gate = normalize(alpha) if config.normalize_gate else alpha
            e = [vt[i] - dot(S[i], kh) for i in range(dv)]
            S = [[S[i][j] + e[i] * gate[j] for j in range(dk)] for i in range(dv)]
        elif variant == "rls":
            A = downdate(A, kh, None)
            A = downdate(A, ut, floor)
            gate = matvec(A, kh)
            pu = matvec(A, ut)
            e = [vt[i] - dot(S[i], kh) for i in range(dv)]
            su = [dot(S[i], ut) for i in range(dv)]
            S = [[S[i][j] + e[i] * gate[j] - su[i] * pu[j] for j in range(dk)] for i in range(dv)]
        else:
            raise ValueError(
                f"interval re-check supports variants 'vla' and 'rls', not {variant!r}"
            )
        out.setdefault("k_hats", []).append(kh)
        out.setdefault("gates", []).append(gate)
        out["A_prev"], out["A"], out["S"], out["k_hat"], out["gate"] = A_prev, A, S, kh, gate
    _ = q
    return out


def _iv_quantity(cx: Counterexample) -> Any:
    iv = mpmath.iv
    X = lambda x: iv.mpf(float(x))  # noqa: E731
    arrays = cx.arrays()
    config = cx.vla_config()
    t = cx.t
    r = _iv_recurrence(arrays, config, cx.variant, t)
    k = arrays["k"][0, :, 0]
    u = arrays["u"][0, :, 0]
    v = arrays["v"][0, :, 0]
    dk, dv = k.shape[-1], v.shape[-1]
    U = [[X(x) for x in row] for row in u[: t + 1]]

    def frob(rows: list) -> Any:
        return iv.sqrt(sum((a**2 for row in rows for a in row), X(0)))

    if cx.quantity == "sm_residual":
        if "A0" in arrays:
            M0 = mpmath.iv.matrix([[X(x) for x in row] for row in arrays["A0"][0, 0]]) ** -1
            M = [[M0[i, j] for j in range(dk)] for i in range(dk)]
        else:
            M = [[X(config.lambda0) if i == j else X(0) for j in range(dk)] for i in range(dk)]
        for us in U:
            M = [[M[i][j] + us[i] * us[j] for j in range(dk)] for i in range(dk)]
        A = r["A"]
        R = [
            [
                sum((A[i][m] * M[m][j] for m in range(dk)), X(0)) - (1 if i == j else 0)
                for j in range(dk)
            ]
            for i in range(dk)
        ]
        return frob(R)
    if cx.quantity == "selectivity_increase":
        ut = U[t]

        def quad(A: list) -> Any:
            return sum((ut[i] * A[i][j] * ut[j] for i in range(dk) for j in range(dk)), X(0))

        return quad(r["A"]) - quad(r["A_prev"])
    if cx.quantity == "argmin_residual":
        G = [[X(config.lambda0) if i == j else X(0) for j in range(dk)] for i in range(dk)]
        C = [[X(0)] * dk for _ in range(dv)]
        for s in range(t + 1):
            kh, us = r["k_hats"][s], U[s]
            vs = [X(x) for x in v[s]]
            G = [[G[i][j] + kh[i] * kh[j] + us[i] * us[j] for j in range(dk)] for i in range(dk)]
            C = [[C[i][j] + vs[i] * kh[j] for j in range(dk)] for i in range(dv)]
        S = r["S"]
        R = [
            [sum((S[i][m] * G[m][j] for m in range(dk)), X(0)) - C[i][j] for j in range(dk)]
            for i in range(dv)
        ]
        nC = frob(C)
        return frob(R) / nC if nC.a > 0 else frob(R)
    if cx.quantity == "jacobian_step_norm":
        kh, gate = r["k_hat"], r["gate"]
        Xm = [[(1 if i == j else 0) - kh[i] * gate[j] for j in range(dk)] for i in range(dk)]
        mid = np.array([[float(e.mid) for e in row] for row in Xm])
        w = np.linalg.svd(mid)[2][0]  # top right singular vector (float64; exact as given)
        W = [X(x) for x in w]
        Xw = [sum((Xm[i][j] * W[j] for j in range(dk)), X(0)) for i in range(dk)]
        lower = iv.sqrt(sum((a**2 for a in Xw), X(0)) / sum((a**2 for a in W), X(0)))
        upper = frob(Xm)
        return iv.mpf([lower.a, upper.b])
    if cx.quantity == "state_norm":
        return frob(r["S"])
    if cx.quantity in ("jacobian_product_vanishing", "jacobian_product_growth"):
        P = [[X(1) if i == j else X(0) for j in range(dk)] for i in range(dk)]
        for kh, gate in zip(r["k_hats"], r["gates"], strict=True):
            Xs = [[(1 if i == j else 0) - kh[i] * gate[j] for j in range(dk)] for i in range(dk)]
            P = [
                [sum((P[i][m] * Xs[m][j] for m in range(dk)), X(0)) for j in range(dk)]
                for i in range(dk)
            ]
        return _spectral_norm_enclosure(P, dk)
    raise ValueError(f"unknown quantity {cx.quantity!r}")


def _spectral_norm_enclosure(M: list, dk: int) -> Any:
    """An interval containing ``||M||₂`` for an interval matrix ``M``: below, ``||M w||/||w||``
    for the (float64) top right singular vector ``w`` of the midpoint; above, ``||M||_F``."""
    iv = mpmath.iv
    X = lambda x: iv.mpf(float(x))  # noqa: E731
    mid = np.array([[float(e.mid) for e in row] for row in M])
    w = np.linalg.svd(mid)[2][0]
    W = [X(x) for x in w]
    Mw = [sum((M[i][j] * W[j] for j in range(dk)), X(0)) for i in range(dk)]
    lower = iv.sqrt(sum((a**2 for a in Mw), X(0)) / sum((a**2 for a in W), X(0)))
    upper = iv.sqrt(sum((a**2 for row in M for a in row), X(0)))
    return iv.mpf([lower.a, upper.b])


#: Most digits :func:`recheck_interval` works at when it raises the precision by itself.
MAX_DPS = 6000


def recheck_interval(cx: Counterexample, *, dps: int | None = None) -> IntervalVerdict:
    """Recompute ``cx``'s figure from its exact inputs in ``mpmath.iv`` at ``dps`` digits and
    decide whether the enclosing interval lies strictly on the violating side of the claim:
    ``==``: the interval excludes ``claimed``; ``<``: ``lower >= claimed``; ``<=``:
    ``lower > claimed``; ``>=``: ``upper < claimed``.

    ``dps=None`` chooses the precision: 50 digits first; when that interval is too wide to
    decide, the enclosure's width grows with T (interval arithmetic loses the correlations of
    the recurrence's non-normal steps, a factor per step), so the check is repeated with the
    digits the first width asks for — ``log10(width / gap)`` more, ``gap`` the float64 distance of
    the figure from the claimed value — up to :data:`MAX_DPS`."""
    if dps is not None:
        return _recheck_at(cx, dps)
    first = _recheck_at(cx, 50)
    gap = abs(cx.measured - cx.claimed)
    straddles = first.lower <= cx.claimed <= first.upper
    if first.certified or not straddles or not np.isfinite(first.log10_width):
        return first
    if not np.isfinite(gap) or gap == 0.0:
        return first
    extra = int(np.ceil(first.log10_width - np.log10(gap))) + 30
    if extra <= 0:
        return first
    return _recheck_at(cx, min(MAX_DPS, 50 + extra))


def _recheck_at(cx: Counterexample, dps: int) -> IntervalVerdict:
    saved = mpmath.iv.dps
    mpmath.iv.dps = dps
    try:
        value = _iv_quantity(cx)
        lo, hi = value.a, value.b  # degenerate intervals at the endpoints
        claimed = mpmath.iv.mpf(float(cx.claimed))  # exact
        if cx.relation == "==":
            certified = (lo > claimed) is True or (hi < claimed) is True
        elif cx.relation == "<":
            certified = (lo >= claimed) is True
        elif cx.relation == "<=":
            certified = (lo > claimed) is True
        elif cx.relation == ">=":
            certified = (hi < claimed) is True
        else:
            raise ValueError(f"unknown relation {cx.relation!r}")
        lo_mpf, hi_mpf = value._mpi_
        # Outward rounding to float64 (floor / ceiling).
        lo_f = mpmath.libmp.to_float(lo_mpf, rnd=mpmath.libmp.round_floor)
        hi_f = mpmath.libmp.to_float(hi_mpf, rnd=mpmath.libmp.round_ceiling)
        with mpmath.mp.workdps(dps):
            lo_s = mpmath.nstr(mpmath.mpf(lo_mpf), 17)
            hi_s = mpmath.nstr(mpmath.mpf(hi_mpf), 17)
    finally:
        mpmath.iv.dps = saved
    side = "violates" if certified else "does NOT certainly violate"
    detail = (
        f"{cx.quantity} ∈ [{lo_s}, {hi_s}] (mpmath.iv, {dps} digits, exact float inputs): "
        f"{side} '{cx.quantity} {cx.relation} {cx.claimed:g}'"
    )
    with mpmath.mp.workdps(30):
        w = mpmath.mpf(hi_mpf) - mpmath.mpf(lo_mpf)
        log10_width = float(mpmath.log10(w)) if w > 0 else float("-inf")
    return IntervalVerdict(
        certified, lo_f, hi_f, float(cx.claimed), cx.relation, dps, detail, log10_width
    )


# -- replay ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ReplayResult:
    """What :func:`replay` found: the figure recomputed in float64 (``reproduced``: bit-for-bit
    the recorded one, or within ``1e-12`` relative), and the interval verdict.  ``ok`` means the
    failure replays and is certified."""

    counterexample: Counterexample
    measured_now: float
    reproduced: bool
    interval: IntervalVerdict

    @property
    def ok(self) -> bool:
        return self.reproduced and self.interval.certified

    def summary(self) -> str:
        cx = self.counterexample
        return "\n".join(
            [
                cx.describe(),
                f"  replayed in float64: {self.measured_now:.17g} (recorded "
                f"{cx.measured:.17g}): {'reproduced' if self.reproduced else 'NOT reproduced'}",
                f"  interval re-check: {self.interval.detail}",
                f"  => {'CERTIFIED counterexample' if self.ok else 'NOT certified'}",
            ]
        )


def replay(path: str | Path | Counterexample, *, dps: int | None = None) -> ReplayResult:
    """Reload a counterexample (a path or the object), recompute its figure in float64 and
    re-check it in interval arithmetic (used by ``vla-verify claims --replay FILE``)."""
    cx = path if isinstance(path, Counterexample) else load(path)
    now = measure(cx)
    same = now == cx.measured or (
        np.isfinite(now) and abs(now - cx.measured) <= 1e-12 * max(abs(cx.measured), 1e-300)
    )
    return ReplayResult(cx, now, bool(same), recheck_interval(cx, dps=dps))
