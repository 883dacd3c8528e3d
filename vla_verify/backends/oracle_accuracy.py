"""The oracle's own accuracy: what the NumPy recurrence tracks to know how far it may be off.

The float64 recurrence of spec §2.3 is not backward stable: the Sherman–Morrison downdate
``A_t = A_{t-1} − s sᵀ/δ`` subtracts numbers of size ``||s||²/δ`` to make numbers as small as
``1/(lambda0 + Σ||u||²)``, so a long or strongly penalised chain loses digits, and once the
computed ``A`` leaves the cone of symmetric positive definite matrices the floor on ``δ`` may
take effect where the exact chain never reaches it.  :class:`AccuracyTracker` runs beside the
recurrence and turns what it sees into an a-posteriori relative error estimate for ``o`` and the
state.  Three parts:

1. **The penalty the chain represents.**  Alongside ``A`` it accumulates ``M`` with
   ``A_t = M_t^{-1}`` in exact arithmetic (in extended precision, ``numpy.longdouble``):
   ``M ← M + c·u uᵀ`` per downdate (``c = 1``, or ``1/(sm_floor − uᵀs + 1)`` where the floor
   takes effect: the inverse of the floored update), ``M ← M (I + η M)^{-1}`` per nudge (a
   well-conditioned solve, refined once), and a lower bound ``λ`` on ``λ_min(M)``: rank-one
   terms leave it, a nudge maps it to ``λ/(1 + ηλ)``.  The residual of each gate then bounds its
   error: ``||α_t − M_t^{-1}k̂_t|| ≤ ||M_t^{-1}||·||M_t α_t − k̂_t||`` with
   ``||M^{-1}|| ≤ ||A||/(1 − ρ)``, ``ρ = ||I − M A||`` (or ``1/λ`` where ``ρ ≥ 1/2``: the
   computed ``A`` is then no guide); the residual of ``s_t`` bounds the error of ``δ_t``, and
   where that interval contains ``sm_floor`` the branch of the ``max`` is uncertain (figure
   ``floor``).
2. **The memory's amplification.**  A first-order perturbation ``E`` of ``S`` is propagated by
   the exact linearisation of the state update (``E ← E (I − k̂ gᵀ)`` for ``vla``), receiving at
   each step the gate's error bound (in a random direction with ``E||ξ||² = dk``, so that the
   propagated norm estimates the worst direction's) and the step's own rounding
   ``(dk + 2)·u·(||S|| + ||e||·||g||)``.  A product of per-step norms would grow exponentially
   where the actual propagation does not; the tangent measures the actual one.
3. **Figures.**  The cancellation ``max_t (||s||²/δ)/||A_t||`` (the factor by which a
   downdate's rounding exceeds the size of its result), the floor, the symmetry and the least
   eigenvalue of the final ``A`` against ``||A||``, and the first non-finite step.

The estimate is first order: it is meant to be within a small factor of the true error when it
is small, and large (never small) when the chain has lost its digits.  ``tests/meta/
test_oracle_accuracy_estimate.py`` checks both against mpmath.  Shapes: everything is
``[B, H, ...]`` (heads next to batch, as inside the recurrence); the estimate is per
``(b, h)`` slice and reported as the largest over slices.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from ..spec import VLAConfig

__all__ = ["AccuracyTracker", "Diagnostics", "Figure"]

Array = np.ndarray
_LD = np.longdouble


class Figure(NamedTuple):
    """One tracked quantity: its value and the 1-based step where it was worst (None: final)."""

    value: float
    step: int | None


class Diagnostics(NamedTuple):
    """What the oracle knows about its own accuracy (relative errors, largest over slices).

    ``error_o``: ``max_t ||Δo_t|| / max_t ||o_t||``; ``error_state``: the largest of
    ``||ΔS||/||S||`` and ``||ΔA||/||A||`` for the final state.  ``worst``: the figure that
    dominates the estimate (``"gate"``: the penalty chain's residual, ``"floor"``: the branch of
    ``max(δ, sm_floor)`` is uncertain, ``"memory"``: the rounding of ``S`` amplified by the
    updates, ``"nonfinite"``: overflow) and ``step`` where it happened.  ``figures``: every
    tracked figure by name.
    """

    error_o: float
    error_state: float
    worst: str
    step: int | None
    unit_roundoff: float
    figures: dict[str, Figure]
    spd_chain: bool = True  # no or an SPD initial A: the estimate is a bound (else first order)

    @property
    def estimate(self) -> float:
        """The larger of the two relative error estimates."""
        return max(self.error_o, self.error_state)


def _norm(x: Array, axes: tuple[int, ...] = (-1,)) -> Array:
    return np.sqrt(np.sum(np.square(x, dtype=np.float64), axis=axes, dtype=np.float64))


class AccuracyTracker:
    """Runs beside :func:`vla_verify.backends.numpy_oracle.recurrence` (see the module docstring).

    The recurrence calls, per step and in this order: :meth:`downdate` (before it updates
    ``A``), :meth:`nudge` when the nudge fires, :meth:`gate`, :meth:`memory`, :meth:`readout`;
    then :meth:`finish` with the final state.
    """

    def __init__(
        self,
        config: VLAConfig,
        variant: str,
        shape: tuple[int, int, int, int],
        A0: Array,
        *,
        unit_roundoff: float,
        seed: int = 0,
    ) -> None:
        B, H, dk, dv = shape
        self.config, self.variant, self.u = config, variant, unit_roundoff
        self.dk, self.dv = dk, dv
        self.rng = np.random.default_rng(seed)
        self.tracks_penalty = variant in ("vla", "rls")
        self.step = 0
        self.E = np.zeros((B, H, dv, dk))
        self.gate_error = np.zeros((B, H))  # absolute error bound of this step's gate
        self.probe_error = np.zeros((B, H))  # rls: error bound of P_t u_t
        self.o_error = np.zeros((B, H))
        self.o_size = np.zeros((B, H))
        self.worst_gate = Figure(0.0, None)
        self.floor = Figure(0.0, None)
        self.floor_on_spd = Figure(0.0, None)
        self.cancellation = Figure(0.0, None)
        self.nonfinite: int | None = None
        if self.tracks_penalty:
            self._start_chain(np.asarray(A0, dtype=np.float64))

    def _start_chain(self, A0: Array) -> None:
        """``M_0 = A_0^{-1}`` (refined in extended precision) and the bound ``λ``."""
        dk = A0.shape[-1]
        self.spd = False
        self.lam = np.full(A0.shape[:-2], np.finfo(float).tiny)
        self.M = np.full(A0.shape, np.nan, dtype=_LD)
        with np.errstate(all="ignore"):
            sym = 0.5 * (A0 + np.swapaxes(A0, -1, -2))
            if not np.all(np.isfinite(sym)):
                return  # overflow: the estimate is infinite
            try:
                eig = np.linalg.eigvalsh(sym)
                asym = _norm(A0 - np.swapaxes(A0, -1, -2), (-2, -1))
                # A symmetric positive definite A_0 gives an SPD chain: δ ≥ 1 exactly, and
                # the residuals bound the errors through λ_min(M) ≥ 1/λ_max(A_0).
                self.spd = bool(
                    np.all(eig[..., 0] > 0) and np.all(asym <= 8 * self.u * _norm(A0, (-2, -1)))
                )
                if self.spd:
                    self.lam = 1.0 / eig[..., -1]
                    M = np.linalg.inv(sym).astype(_LD)
                else:
                    # Outside the SPD cone the exact chain has no such bound: first order only.
                    self.lam = 1.0 / np.maximum(np.abs(eig).max(axis=-1), np.finfo(float).tiny)
                    M = np.linalg.pinv(A0).astype(_LD)
            except np.linalg.LinAlgError:
                return
            # Newton steps in extended precision (M ← M + M(I − A₀M)): a float64 inverse of an
            # ill-conditioned A₀ is off by u·cond(A₀), which the residuals would charge to the
            # chain.
            A0l = A0.astype(_LD)
            eye = np.eye(dk, dtype=_LD)
            for _ in range(2):
                M = M + M @ (eye - A0l @ M)
            self.M = 0.5 * (M + np.swapaxes(M, -1, -2))

    # -- the penalty chain ---------------------------------------------------------------------
    def _inverse_norm(self, A: Array) -> Array:
        """A bound on ``||M^{-1}||₂`` from the computed ``A ≈ M^{-1}``: with
        ``ρ = ||I − M A||``, ``||M^{-1}|| ≤ ||A||/(1 − ρ)`` when ``ρ < 1``; else ``1/λ``."""
        A64 = np.asarray(A, dtype=np.float64)
        with np.errstate(all="ignore"):
            rho = _norm(np.eye(self.dk) - self.M.astype(np.float64) @ A64, (-2, -1))
            bound = _norm(A64, (-2, -1)) / (1.0 - rho)
            return np.where(
                (rho < 0.5) & np.isfinite(bound), np.minimum(bound, 1 / self.lam), 1 / self.lam
            )

    def _solve_error(self, x: Array, y: Array, A: Array) -> Array:
        """Bound on ``||y − M^{-1}x||`` for a computed ``y ≈ M^{-1}x`` (``A ≈ M^{-1}``):
        ``||M^{-1}||·||M y − x||``."""
        r = np.einsum("bhij,bhj->bhi", self.M, y.astype(_LD)) - x.astype(_LD)
        return _norm(r.astype(np.float64)) * self._inverse_norm(A)

    def downdate(self, x: Array, s: Array, delta_raw: Array, floor: float | None, A: Array) -> None:
        """One Sherman–Morrison downdate of ``A`` along ``x`` (``s = A x``, ``δ_raw = 1 + xᵀs``;
        ``floor=None``: no floor, as for rls's key term); ``A`` is the matrix before it."""
        err_s = self._solve_error(x, s, A)
        xn = _norm(x)
        err_delta = xn * err_s + (self.dk + 2) * self.u * np.sum(np.abs(x * s), axis=-1)
        delta = delta_raw if floor is None else np.maximum(delta_raw, floor)
        with np.errstate(all="ignore"):
            size = (
                _norm(s) ** 2 / np.abs(delta) / np.maximum(_norm(A, (-2, -1)), np.finfo(float).tiny)
            )
        self._worse("cancellation", size)
        c = np.ones_like(delta_raw)
        if floor is not None:
            clamped = delta_raw < floor
            uncertain = np.abs(delta_raw - floor) <= err_delta
            if np.any(uncertain | ~np.isfinite(err_delta)):
                self._worse("floor", np.where(uncertain | ~np.isfinite(err_delta), np.inf, 0.0))
            if self.spd and floor <= 1 and np.any(clamped):
                self._worse("floor_on_spd", clamped.astype(float))
            with np.errstate(all="ignore"):
                c = np.where(clamped, 1.0 / (floor - delta_raw + 1.0), 1.0)
        xl = x.astype(_LD)
        self.M = self.M + c[..., None, None].astype(_LD) * (xl[..., :, None] * xl[..., None, :])

    def nudge(self, eta: float) -> None:
        """``A += η I``: ``M ← M (I + ηM)^{-1}`` and ``λ ← λ/(1 + ηλ)``."""
        dk = self.dk
        K = np.eye(dk) + eta * self.M.astype(np.float64)
        with np.errstate(all="ignore"):
            try:
                X = np.linalg.solve(K, self.M.astype(np.float64)).astype(_LD)
                # One refinement step in extended precision: on an SPD chain K is well
                # conditioned (eigenvalues ≥ 1).
                R = self.M - (np.eye(dk, dtype=_LD) + _LD(eta) * self.M) @ X
                X = X + np.linalg.solve(K, R.astype(np.float64)).astype(_LD)
            except np.linalg.LinAlgError:
                # Outside the SPD cone I + ηM can be singular: the exact chain has no inverse
                # penalty to compare with, and the estimate says so (NaN residuals: infinite).
                X = np.full_like(self.M, np.nan)
        self.M = 0.5 * (X + np.swapaxes(X, -1, -2))
        self.lam = self.lam / (1.0 + eta * self.lam)

    def gate(self, k_hat: Array, alpha: Array, normalized: bool, A: Array | None = None) -> None:
        """The gate ``α = A k̂`` (before normalisation, ``A`` the updated matrix): its error
        bound from the residual."""
        if not self.tracks_penalty:
            # delta: the gate is k̂ itself; linear: k. Rounding only.
            self.gate_error = (self.dk + 2) * self.u * _norm(alpha)
            return
        assert A is not None, "a tracked penalty needs the updated A"
        err = self._solve_error(k_hat, alpha, A) + (self.dk + 2) * self.u * _norm(alpha)
        with np.errstate(all="ignore"):
            # A zero key gives α = 0 exactly (err = 0): no error, not 0/0.
            rel = np.where(err == 0, 0.0, err / _norm(alpha))
        self._worse("gate", rel)
        # A normalised gate moves by at most 2·(relative error of α); unnormalised: err itself.
        self.gate_error = 2 * rel if normalized else err

    def probe(self, x: Array, y: Array, A: Array) -> None:
        """rls: the error bound of ``P_t u_t`` (the second term of its state update)."""
        self.probe_error = self._solve_error(x, y, A) + (self.dk + 2) * self.u * _norm(y)

    # -- the memory ----------------------------------------------------------------------------
    def memory(
        self,
        S_prev: Array,
        k_hat: Array,
        gate: Array,
        residual: Array,
        *,
        x: Array | None = None,
        w: Array | None = None,
    ) -> None:
        """Propagate ``E`` through one state update ``S ← S (I − k̂ gᵀ) + v gᵀ`` (and, for rls,
        ``− (S x) wᵀ``; linear: ``S ← S + v kᵀ``, ``gate = k``, ``residual = v``)."""
        E = self.E
        B, H, dv, dk = E.shape
        with np.errstate(all="ignore"):
            if self.variant != "linear":
                E = E - np.einsum("bhij,bhj->bhi", E, k_hat)[..., None] * gate[..., None, :]
            if x is not None and w is not None:
                E = E - np.einsum("bhij,bhj->bhi", E, x)[..., None] * w[..., None, :]
                Sx = np.einsum("bhij,bhj->bhi", S_prev, x)
                xi = self.rng.standard_normal((B, H, dk))
                E = E + (Sx * self.probe_error[..., None])[..., None] * xi[..., None, :]
            xi = self.rng.standard_normal((B, H, dk))
            E = E + (residual * self.gate_error[..., None])[..., None] * xi[..., None, :]
            rounding = (
                (self.dk + 2) * self.u * (_norm(S_prev, (-2, -1)) + _norm(residual) * _norm(gate))
            )
            noise = self.rng.standard_normal((B, H, dv, dk))
            noise /= np.maximum(_norm(noise, (-2, -1)), 1e-300)[..., None, None]
            self.E = E + rounding[..., None, None] * noise

    def readout(self, S: Array, q: Array, read: Array, denominator: Array | None) -> None:
        """The error of ``o_t`` from that of ``S_t`` (and the read-out's own rounding)."""
        self.step += 1
        with np.errstate(all="ignore"):
            err = _norm(np.einsum("bhij,bhj->bhi", self.E, q))
            if denominator is not None:
                err = err / denominator
            err = err + (self.dk + 3) * self.u * _norm(read)
        if self.nonfinite is None and not (np.all(np.isfinite(read)) and np.all(np.isfinite(S))):
            self.nonfinite = self.step
        self.o_error = np.fmax(self.o_error, err)
        self.o_size = np.fmax(self.o_size, _norm(read))

    def _worse(self, name: str, values: Array) -> None:
        values = np.asarray(values, dtype=float)
        if np.any(np.isnan(values)):
            value = math.inf
        else:
            value = float(np.max(values)) if values.size else 0.0
        attr = {"floor_on_spd": "floor_on_spd"}.get(name, name)
        attr = "worst_gate" if name == "gate" else attr
        current: Figure = getattr(self, attr)
        if value > current.value:
            setattr(self, attr, Figure(value, self.step + 1))

    # -- the result ----------------------------------------------------------------------------
    def finish(self, S: Array, A: Array) -> Diagnostics:
        """The estimate for the final state ``S`` ``[B, H, dv, dk]``, ``A`` ``[B, H, dk, dk]``."""
        figures: dict[str, Figure] = {}
        with np.errstate(all="ignore"):
            rel_o = np.where(self.o_size > 0, self.o_error / self.o_size, self.o_error)
            S_size = _norm(S, (-2, -1))
            rel_S = np.where(S_size > 0, _norm(self.E, (-2, -1)) / S_size, _norm(self.E, (-2, -1)))
            rel_A = np.zeros_like(rel_S)
            if self.tracks_penalty:
                A64 = np.asarray(A, dtype=np.float64)
                A_size = _norm(A64, (-2, -1))
                R = np.eye(self.dk, dtype=_LD) - self.M @ A64.astype(_LD)
                rel_A = (
                    _norm(R.astype(np.float64), (-2, -1))
                    * self._inverse_norm(A64)
                    / np.maximum(A_size, 1e-300)
                    + (self.dk + 2) * self.u
                )
                sym = 0.5 * (A64 + np.swapaxes(A64, -1, -2))
                if np.all(np.isfinite(sym)) and np.all(A_size > 0):
                    eig = np.linalg.eigvalsh(sym)[..., 0]
                    figures["min_eig_A_rel"] = Figure(float(np.min(eig / A_size)), None)
                    figures["asymmetry_A"] = Figure(
                        float(np.max(_norm(A64 - np.swapaxes(A64, -1, -2), (-2, -1)) / A_size)),
                        None,
                    )
        rel_o = np.where(np.isnan(rel_o), np.inf, rel_o)
        rel_state = np.fmax(
            np.where(np.isnan(rel_S), np.inf, rel_S), np.where(np.isnan(rel_A), np.inf, rel_A)
        )
        error_o = float(np.max(rel_o)) if rel_o.size else 0.0
        error_state = float(np.max(rel_state)) if rel_state.size else 0.0
        figures.update(
            gate=self.worst_gate,
            floor=self.floor,
            floor_on_spd=self.floor_on_spd,
            cancellation=self.cancellation,
        )
        worst, step = "memory", None
        if self.tracks_penalty and self.worst_gate.value * 1e3 >= max(error_o, error_state):
            worst, step = "gate", self.worst_gate.step
        if self.floor_on_spd.value > 0:
            # δ ≥ 1 on an exact SPD chain: a floor below 1 that takes effect marks a wrong A.
            worst, step = "floor", self.floor_on_spd.step
            error_o = error_state = math.inf
        if self.floor.value > 0:
            worst, step = "floor", self.floor.step
            error_o = error_state = math.inf
        if self.nonfinite is not None:
            worst, step = "nonfinite", self.nonfinite
            error_o = error_state = math.inf
            figures["nonfinite"] = Figure(math.inf, self.nonfinite)
        spd = self.spd if self.tracks_penalty else True
        return Diagnostics(error_o, error_state, worst, step, self.u, figures, spd)
