"""Adversarial inputs for the claims that bound something (spec §3 C4, C5).

A claim that bounds a quantity (``sup_t ||S_t||_F`` for C5, ``||J_T ⋯ J_1||₂`` for C4) is only as
credible as the hardest search it survived.  This module searches inside the claim's constraint
set — unit keys ``||k̂_t|| = 1``, values ``||v_t|| ≤ 1``, penalties ``||u_t||² = 1/dk`` (spec §2.1,
§2.5; the product searches take another penalty norm ``u_norm`` for another input class) — in
four ways:

- **greedy adaptive adversaries** (:func:`greedy_state_norm`): at each step the next
  ``(k_t, v_t, u_t)`` maximises ``||S_t||_F`` given the current state.  Every variant's step is
  ``S_t = B + v_t g_tᵀ`` with ``B`` and ``g`` independent of ``v_t``, so
  ``||S_t||_F² = ||B||_F² + 2 v_tᵀ B g + ||v_t||² ||g||²`` is convex in ``v_t`` and its maximum over
  the unit ball is the closed form ``v_t = B g / ||B g||``; ``(k̂_t, u_t)`` come from a small inner
  optimisation over the sphere (a grid in angle at dk = 2, random candidates elsewhere, then
  rounds of local refinement around the best).  The penalty may instead follow a pattern (a
  *rule*, :class:`PenaltyRule`) while keys and values stay greedy;
- **gradient search over whole sequences** (:func:`gradient_search_state_norm`,
  :func:`gradient_search_product`): PyTorch autograd through a lean copy of the recurrence, the
  free parameters projected onto the constraint set at every evaluation, several restarts run as
  one batch;
- **subspace-lifted search** (:func:`lifted_search_product`): at a wide head the product
  searches run in an r-dimensional subspace with the full width's penalty norm (``u_norm``),
  and the best is embedded into R^dk (:func:`embed`, exact: inputs in a subspace leave its
  complement alone) to seed the gradient search at the full width;
- **extension**: what the gradient search finds at a moderate ``T₀`` becomes a rule
  (:func:`rule_from_search`: the penalty's principal direction) that the greedy adversary replays
  at ``10·T₀`` and ``100·T₀``; growth is fitted over all those lengths (:func:`fit_exponent`,
  log-log least squares).

The engine is calibrated on problems whose worst case is known in closed form
(:func:`known_worst_state_norm`, :func:`max_rank_one_deviation`; tests/meta): the delta rule's
``||S_T||_F ≤ √T`` (tight), linear attention's ``||S_T||_F ≤ T`` (tight) and
``max ||I − a bᵀ||₂ = 2`` over unit ``a, b``.

The adversary is a search tool: the figures a verdict uses are re-measured from the inputs it
returns by the float64 oracle (:mod:`vla_verify.backends.numpy_oracle`).  PyTorch is imported
inside the gradient searches only (``import vla_verify`` does not need it).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import VLAInputError
from ..spec import VLAConfig
from .strategies import Case

__all__ = [
    "AdversaryRun",
    "PenaltyRule",
    "embed",
    "fit_exponent",
    "gradient_search_product",
    "gradient_search_state_norm",
    "greedy_product_norm",
    "greedy_state_norm",
    "known_worst_state_norm",
    "lifted_search_product",
    "max_rank_one_deviation",
    "product_norms",
    "rule_from_search",
    "running_sup",
    "subspace_basis",
]

VARIANTS = ("linear", "delta", "vla", "rls")


@dataclass
class AdversaryRun:
    """Inputs found by a search and the quantity they reach.

    ``k``: ``[T, dk]`` unit keys; ``v``: ``[T, dv]`` with ``||v_t|| ≤ 1``; ``u``: ``[T, dk]`` with
    ``||u_t||² = 1/dk`` (or the ``u_norm`` a product search was given); ``values``: the quantity
    after each step (``||S_t||_F`` or ``||X_1 ⋯ X_t||₂``), float64 ``[T]``, as the search
    computed it; ``value``: its figure of merit (the largest of ``values``); ``method``: how the
    inputs were found.
    """

    k: np.ndarray
    v: np.ndarray
    u: np.ndarray
    values: np.ndarray
    method: str
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def value(self) -> float:
        finite = self.values[np.isfinite(self.values)]
        return float(finite.max()) if finite.size else float("inf")

    @property
    def T(self) -> int:
        return int(self.k.shape[0])

    def case(self) -> Case:
        """The inputs as a :class:`Case` (``[1, T, 1, d]`` float64, spec §1); queries positive."""
        q = np.abs(self.k) + 0.1
        q4, k4, v4, u4 = (
            x[None, :, None, :].astype(np.float64) for x in (q, self.k, self.v, self.u)
        )
        return Case(q4, k4, v4, u4, None, max(1, self.T // 2), {"adversary": self.method})

    def prefix(self, T: int) -> AdversaryRun:
        """The first ``T`` steps (a causal search's run at length ``T``)."""
        return AdversaryRun(
            self.k[:T], self.v[:T], self.u[:T], self.values[:T], self.method, dict(self.info)
        )


# -- the constraint set ------------------------------------------------------------------------


def _unit(x: np.ndarray) -> np.ndarray:
    n = np.linalg.norm(x, axis=-1, keepdims=True)
    return x / np.where(n > 0, n, 1.0)


def _penalty_norm(dk: int, u_norm: float | None) -> float:
    """``||u_t||`` of the input class: ``1/√dk`` (spec §2.5, the default) or the given norm,
    which a subspace search sets to the full width's ``1/√dk``."""
    if u_norm is None:
        return 1.0 / math.sqrt(dk)
    if not (math.isfinite(u_norm) and u_norm > 0):
        raise VLAInputError("u_norm", f"expected a finite real > 0 or None, got {u_norm!r}")
    return float(u_norm)


def _sphere(rng: np.random.Generator, n: int, d: int) -> np.ndarray:
    return _unit(rng.standard_normal((n, d)))


def _angle_grid(n: int, center: float = 0.0, width: float = math.pi) -> np.ndarray:
    """``n`` unit vectors of R² at angles ``center + [−width/2, width/2)`` (a half circle by
    default: ``k̂`` and ``−k̂`` give the same state norm, as do ``u`` and ``−u``)."""
    th = center + width * (np.arange(n) / n - 0.5)
    out = np.empty((n, 2))
    out[:, 0] = np.cos(th)
    out[:, 1] = np.sin(th)
    return out


@dataclass(frozen=True)
class PenaltyRule:
    """A penalty pattern: ``u_t = pattern[(t − 1) mod P] / sqrt(dk)`` (rows normalised)."""

    pattern: np.ndarray  # [P, dk]
    source: str = ""

    def at(self, t: int) -> np.ndarray:
        p = _unit(np.asarray(self.pattern, dtype=np.float64))
        return p[(t - 1) % p.shape[0]] / math.sqrt(p.shape[1])


# -- greedy adaptive adversary (numpy) ---------------------------------------------------------


def _candidate_steps(
    variant: str,
    S: np.ndarray,
    A: np.ndarray,
    K: np.ndarray,
    U: np.ndarray,
    t: int,
    config: VLAConfig,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For candidate pairs ``(K[i], U[i])`` (unit keys, penalties with ``||u||² = 1/dk``) from
    the state ``(S [dv, dk], A [dk, dk])``: the part ``B_i`` of ``S_t`` that does not depend on
    ``v_t`` ``[N, dv, dk]``, the gate ``g_i`` ``[N, dk]`` (``S_t = B_i + v_t g_iᵀ``) and the next
    ``A`` ``[N, dk, dk]`` (spec §2.3, §2.4)."""
    N, dk = K.shape
    SK = K @ S.T  # [N, dv]: S k̂ per candidate
    if variant == "linear":
        return np.broadcast_to(S, (N, *S.shape)), K, np.broadcast_to(A, (N, dk, dk))
    if variant == "delta":
        return S[None] - SK[:, :, None] * K[:, None, :], K, np.broadcast_to(A, (N, dk, dk))

    def downdate(M: np.ndarray, x: np.ndarray, floor: float | None) -> np.ndarray:
        s = x @ M if M.ndim == 2 else np.matmul(M, x[:, :, None])[:, :, 0]  # M symmetric
        den = 1.0 + np.sum(x * s, axis=-1)
        if floor is not None:
            den = np.maximum(den, floor)
        return M - s[:, :, None] * s[:, None, :] / den[:, None, None]

    if variant == "vla":
        A_new = downdate(A, U, config.sm_floor)
        if config.nudges_at(t):
            A_new = A_new + config.nudge_eta * np.eye(dk)
        alpha = np.matmul(A_new, K[:, :, None])[:, :, 0]
        gate = _unit(alpha) if config.normalize_gate else alpha
        return S[None] - SK[:, :, None] * gate[:, None, :], gate, A_new
    if variant == "rls":
        P = downdate(downdate(A, K, None), U, config.sm_floor)
        gate = np.matmul(P, K[:, :, None])[:, :, 0]
        pu = np.matmul(P, U[:, :, None])[:, :, 0]
        SU = U @ S.T
        B = S[None] - SK[:, :, None] * gate[:, None, :] - SU[:, :, None] * pu[:, None, :]
        return B, gate, P
    raise ValueError(f"variant: expected one of {VARIANTS}, got {variant!r}")


def _gain(B: np.ndarray, g: np.ndarray) -> np.ndarray:
    """``max_{||v|| ≤ 1} ||B + v gᵀ||_F²`` per candidate: ``||B||² + 2||B g|| + ||g||²``."""
    Bg = np.matmul(B, g[:, :, None])[:, :, 0]
    return (
        np.sum(B * B, axis=(1, 2))
        + 2.0 * np.sqrt(np.sum(Bg * Bg, axis=-1))
        + np.sum(g * g, axis=-1)
    )


def _best_value(B: np.ndarray, g: np.ndarray, S: np.ndarray) -> np.ndarray:
    """The maximising ``v = B g/||B g||``; where ``B g = 0`` every unit ``v`` ties, and the one
    along ``B``'s (else ``S``'s) top left singular vector keeps the state's rank low."""
    Bg = B @ g
    n = float(np.linalg.norm(Bg))
    scale = max(float(np.linalg.norm(B)), 1.0) * float(np.linalg.norm(g))
    if n > 1e-12 * max(scale, 1e-300):
        return Bg / n
    if B.shape[0] == 1:
        return np.ones(1)
    M = B if np.linalg.norm(B) > 0 else S
    if np.linalg.norm(M) > 0:
        return np.linalg.svd(M)[0][:, 0]
    return np.eye(B.shape[0])[0]


def greedy_state_norm(
    config: VLAConfig,
    variant: str,
    T: int,
    dk: int,
    *,
    dv: int = 1,
    rule: PenaltyRule | None = None,
    candidates: int = 32,
    refinements: int = 3,
    seed: int = 0,
) -> AdversaryRun:
    """The greedy adaptive adversary for ``||S_t||_F`` (module docstring), ``T`` steps.

    At step t it evaluates ``candidates`` keys (a half-circle grid at dk = 2, random unit
    vectors plus the previous step's choice otherwise) — and, without a ``rule``, as many
    penalty directions, all pairs at dk = 2 — then ``refinements`` rounds of candidates around
    the best with a shrinking radius, and keeps the pair with the largest
    ``max_v ||S_t||_F``; ``v_t`` is the closed form.  The adversary is causal: its run at length
    ``T`` is the prefix of its run at any longer length.
    """
    if variant not in VARIANTS:
        raise ValueError(f"variant: expected one of {VARIANTS}, got {variant!r}")
    if dk < 2:
        raise ValueError(f"dk: expected >= 2, got {dk}")
    rng = np.random.default_rng(seed)
    S = np.zeros((dv, dk))
    A = np.eye(dk) / config.lambda0
    ks, vs, us, norms = (np.empty((T, dk)), np.empty((T, dv)), np.empty((T, dk)), np.empty(T))
    prev_k = np.eye(dk)[0]
    prev_u = np.eye(dk)[-1]
    inv_sqrt = 1.0 / math.sqrt(dk)
    # linear attention and the delta rule do not read u: their keys alone are searched.
    ignores_u = variant in ("linear", "delta")
    for t in range(1, T + 1):
        fixed_u = prev_u * inv_sqrt if ignores_u else (None if rule is None else rule.at(t))

        def pairs(
            Kc: np.ndarray, Uc: np.ndarray | None, fixed_u: np.ndarray | None = fixed_u
        ) -> tuple[np.ndarray, np.ndarray]:
            if fixed_u is not None:
                return Kc, np.broadcast_to(fixed_u, Kc.shape)
            assert Uc is not None
            if dk == 2 and Kc.shape[0] * Uc.shape[0] <= 4096:
                return np.repeat(Kc, Uc.shape[0], 0), np.tile(Uc, (Kc.shape[0], 1)) * inv_sqrt
            return Kc, Uc[: Kc.shape[0]] * inv_sqrt

        if dk == 2:
            Kc = _angle_grid(candidates)
            Uc = _angle_grid(candidates)
        else:
            Kc = np.vstack([prev_k, _sphere(rng, candidates - 1, dk)])
            Uc = np.vstack([prev_u, _sphere(rng, candidates - 1, dk)])
        K, U = pairs(Kc, Uc)
        B, g, A_new = _candidate_steps(variant, S, A, K, U, t, config)
        i = int(np.argmax(_gain(B, g)))
        best = (K[i], U[i], B[i], g[i], A_new[i])
        radius = math.pi / candidates if dk == 2 else 0.5
        for _ in range(refinements):
            k0, u0 = best[0], best[1] * math.sqrt(dk)
            if dk == 2:
                Kc = _angle_grid(8, math.atan2(k0[1], k0[0]), 2 * radius)
                Uc = _angle_grid(8, math.atan2(u0[1], u0[0]), 2 * radius)
            else:
                Kc = _unit(k0 + radius * rng.standard_normal((candidates, dk)) / math.sqrt(dk))
                Uc = _unit(u0 + radius * rng.standard_normal((candidates, dk)) / math.sqrt(dk))
            K, U = pairs(np.vstack([k0, Kc]), np.vstack([u0, Uc]))
            B, g, A_new = _candidate_steps(variant, S, A, K, U, t, config)
            i = int(np.argmax(_gain(B, g)))
            best = (K[i], U[i], B[i], g[i], A_new[i])
            radius /= 4.0
        k, u, Bb, gb, A = best
        v = _best_value(Bb, gb, S)
        S = Bb + np.outer(v, gb)
        ks[t - 1], vs[t - 1], us[t - 1], norms[t - 1] = k, v, u, np.linalg.norm(S)
        prev_k, prev_u = k, u * math.sqrt(dk)
    if ignores_u:
        how = "greedy (k, v)"
    else:
        how = "greedy (k, v, u)" if rule is None else f"greedy (k, v), u by rule {rule.source}"
    return AdversaryRun(ks, vs, us, norms, f"{how}, {variant}", {"dk": dk, "dv": dv})


# -- gradient search over whole sequences (torch) ----------------------------------------------


def _torch_project(k: Any, v: Any, u: Any, u_norm: float | None = None) -> tuple[Any, Any, Any]:
    """The constraint set: unit keys, ``||v|| ≤ 1``, ``||u|| = u_norm`` (None: ``1/√dk``)."""
    import torch

    dk = k.shape[-1]
    scale = _penalty_norm(dk, u_norm)
    kh = k / k.norm(dim=-1, keepdim=True).clamp_min(1e-12)
    vv = v / torch.clamp(v.norm(dim=-1, keepdim=True), min=1.0)
    uu = u / u.norm(dim=-1, keepdim=True).clamp_min(1e-12) * scale
    return kh, vv, uu


def _torch_states(
    config: VLAConfig, variant: str, k: Any, v: Any, u: Any, *, factors: bool = False
) -> tuple[list[Any], list[Any]]:
    """A lean batched copy of spec §2.3/§2.4 in torch (float64): per step the state ``S``
    ``[R, dv, dk]`` and the step matrix ``X_t = I − k̂_t g_tᵀ`` ``[R, dk, dk]`` — or, with
    ``factors``, its low-rank part as pairs ``[(a, b), …]`` ``[R, dk]`` with
    ``X_t = I − Σ a bᵀ`` (a row times ``X_t`` then costs ``O(dk)``, not ``O(dk²)``).  ``k, v,
    u`` ``[R, T, ·]`` already projected."""
    import torch

    R, T, dk = k.shape
    dv = v.shape[-1]
    eye = torch.eye(dk, dtype=k.dtype)
    S = torch.zeros(R, dv, dk, dtype=k.dtype)
    A = (eye / config.lambda0).expand(R, dk, dk)
    states, steps = [], []

    def mv(M: Any, x: Any) -> Any:
        return (M * x[:, None, :]).sum(-1)

    def downdate(M: Any, x: Any, floor: float | None) -> Any:
        s = mv(M, x)
        den = 1.0 + (x * s).sum(-1)
        if floor is not None:
            den = torch.clamp(den, min=floor)
        return M - s[:, :, None] * s[:, None, :] / den[:, None, None]

    for t in range(1, T + 1):
        kt, vt, ut = k[:, t - 1], v[:, t - 1], u[:, t - 1]
        if variant == "linear":
            S = S + vt[:, :, None] * kt[:, None, :]
            X = [] if factors else eye.expand(R, dk, dk)
        elif variant == "delta":
            e = vt - mv(S, kt)
            S = S + e[:, :, None] * kt[:, None, :]
            X = [(kt, kt)] if factors else eye - kt[:, :, None] * kt[:, None, :]
        elif variant == "vla":
            A = downdate(A, ut, config.sm_floor)
            if config.nudges_at(t):
                A = A + config.nudge_eta * eye
            alpha = mv(A, kt)
            gate = (
                alpha / alpha.norm(dim=-1, keepdim=True).clamp_min(config.norm_eps)
                if config.normalize_gate
                else alpha
            )
            e = vt - mv(S, kt)
            S = S + e[:, :, None] * gate[:, None, :]
            X = [(kt, gate)] if factors else eye - kt[:, :, None] * gate[:, None, :]
        elif variant == "rls":
            A = downdate(downdate(A, kt, None), ut, config.sm_floor)
            gate = mv(A, kt)
            pu = mv(A, ut)
            e = vt - mv(S, kt)
            su = mv(S, ut)
            S = S + e[:, :, None] * gate[:, None, :] - su[:, :, None] * pu[:, None, :]
            X = (
                [(kt, gate), (ut, pu)]
                if factors
                else eye - kt[:, :, None] * gate[:, None, :] - ut[:, :, None] * pu[:, None, :]
            )
        else:
            raise ValueError(f"variant: expected one of {VARIANTS}, got {variant!r}")
        states.append(S)
        steps.append(X)
    return states, steps


@contextmanager
def _one_thread() -> Iterator[None]:
    """Run torch on one intra-op thread: the searches' tensors are small (``R·dk²`` elements),
    and splitting each operation over threads costs more in synchronisation than it saves —
    an order of magnitude more on a machine whose cores are busy."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _ascend(params: list[Any], objective: Any, steps: int, lr: float) -> tuple[Any, list[float]]:
    """Adam ascent on ``objective(params) -> [R]`` (one value per restart); returns the best
    value per restart seen at any iteration and the trace of the batch's best."""
    with _one_thread():
        return _adam(params, objective, steps, lr)


def _adam(params: list[Any], objective: Any, steps: int, lr: float) -> tuple[Any, list[float]]:
    import torch

    opt = torch.optim.Adam(params, lr=lr)
    best_val = None
    best_params = [p.detach().clone() for p in params]
    trace: list[float] = []
    for _ in range(steps):
        opt.zero_grad()
        val = objective(params)
        with torch.no_grad():
            if best_val is None:
                best_val = val.detach().clone()
            better = val.detach() > best_val
            best_val = torch.where(better, val.detach(), best_val)
            for bp, p in zip(best_params, params, strict=True):
                mask = better.view(-1, *([1] * (p.dim() - 1)))
                bp.copy_(torch.where(mask, p.detach(), bp))
            trace.append(float(best_val.max()))
        (-val.sum()).backward()
        opt.step()
    with torch.no_grad():
        val = objective(params)
        better = val > best_val
        best_val = torch.where(better, val, best_val)
        for bp, p in zip(best_params, params, strict=True):
            mask = better.view(-1, *([1] * (p.dim() - 1)))
            bp.copy_(torch.where(mask, p.detach(), bp))
    return (best_params, best_val), trace


def gradient_search_state_norm(
    config: VLAConfig,
    variant: str,
    T: int,
    dk: int,
    *,
    dv: int = 1,
    restarts: int = 8,
    steps: int = 150,
    lr: float = 0.05,
    seed: int = 0,
) -> AdversaryRun:
    """Maximise ``||S_T||_F`` over whole sequences: projected parameters (unit keys,
    ``||v|| ≤ 1``, ``||u||² = 1/dk``), Adam on ``log ||S_T||_F`` through autograd, ``restarts``
    random starts in one batch; the best restart is returned."""
    import torch

    g = torch.Generator().manual_seed(seed)
    shape = (restarts, T)
    k = torch.randn(*shape, dk, generator=g, dtype=torch.float64, requires_grad=True)
    v = torch.randn(*shape, dv, generator=g, dtype=torch.float64, requires_grad=True)
    u = torch.randn(*shape, dk, generator=g, dtype=torch.float64, requires_grad=True)

    def objective(p: list[Any]) -> Any:
        kh, vv, uu = _torch_project(*p)
        states, _ = _torch_states(config, variant, kh, vv, uu)
        return torch.log(states[-1].flatten(1).norm(dim=-1).clamp_min(1e-300))

    (best, vals), trace = _ascend([k, v, u], objective, steps, lr)
    r = int(torch.argmax(vals))
    with torch.no_grad():
        kh, vv, uu = _torch_project(*best)
        states, _ = _torch_states(config, variant, kh, vv, uu)
        norms = torch.stack([s[r].norm() for s in states]).numpy()
    return AdversaryRun(
        kh[r].numpy().copy(),
        vv[r].numpy().copy(),
        uu[r].numpy().copy(),
        norms,
        f"gradient search ||S_T||_F, {variant} ({restarts} restarts × {steps} Adam steps)",
        {"trace": trace, "restart_values": np.exp(vals.numpy()).tolist(), "dk": dk, "dv": dv},
    )


def gradient_search_product(
    config: VLAConfig,
    T: int,
    dk: int,
    *,
    variant: str = "vla",
    maximise: bool = True,
    restarts: int = 4,
    steps: int = 100,
    lr: float = 0.05,
    seed: int = 0,
    u_period: int | None = None,
    u_norm: float | None = None,
    init: AdversaryRun | None = None,
    init_noise: float = 0.3,
    restart_dims: tuple[int, ...] | None = None,
) -> AdversaryRun:
    """Maximise (or minimise) ``log ||X_1 ⋯ X_T||₂``, ``X_t = I − k̂_t g_tᵀ`` (C4: the linear part
    of ``S_0 ↦ S_T``), over unit keys and penalties with ``||u|| = u_norm`` (None: ``1/√dk``;
    values do not enter the product; the returned ``v`` is ``e_1``).  ``values``:
    ``||X_1 ⋯ X_t||₂`` for every t of the best restart.  ``u_period``: search penalties of that
    period only (a periodic pattern, ``u_t = u_{t mod P}``; period 1 penalises one direction
    throughout), None: all free.  ``init``: a run of length ``T`` at width ``dk`` (e.g.
    :func:`embed`) that the first restart starts from exactly and the others from with Gaussian
    noise of relative size ``init_noise`` (``u_period`` must be None then); the row ``w`` starts
    at the top left singular vector of its product.  ``restart_dims``: one width per restart,
    each restart confined to the first that many coordinates (keys, penalties and the row ``w``
    zero beyond them; exactly a search at that width, :func:`embed`), so searches in several
    subspaces run as one batch; ``info["restart_values"]`` holds each restart's best value."""
    import torch

    g = torch.Generator().manual_seed(seed)
    k = torch.randn(restarts, T, dk, generator=g, dtype=torch.float64)
    P_u = T if u_period is None else u_period
    u_free = torch.randn(restarts, P_u, dk, generator=g, dtype=torch.float64)
    w = torch.randn(restarts, dk, generator=g, dtype=torch.float64)
    if init is not None:
        if init.k.shape != (T, dk) or init.u.shape != (T, dk) or u_period is not None:
            raise VLAInputError(
                "init",
                f"expected a run of shape ({T}, {dk}) and u_period None, got {init.k.shape} "
                f"(u_period {u_period!r})",
            )
        k0 = torch.from_numpy(_unit(init.k))
        u0 = torch.from_numpy(_unit(init.u))
        noise = init_noise / math.sqrt(dk)
        k = k0 + noise * k * (torch.arange(restarts) > 0).to(k.dtype)[:, None, None]
        u_free = u0 + noise * u_free * (torch.arange(restarts) > 0).to(k.dtype)[:, None, None]
        w[:] = torch.from_numpy(_top_left_singular_vector(init.k, init.u, config, variant, u_norm))
    mask = torch.ones(restarts, dk, dtype=torch.float64)
    if restart_dims is not None:
        if len(restart_dims) != restarts or not all(1 <= r <= dk for r in restart_dims):
            raise VLAInputError(
                "restart_dims",
                f"expected {restarts} widths in [1, {dk}], got {restart_dims!r}",
            )
        mask = (torch.arange(dk)[None, :] < torch.tensor(restart_dims)[:, None]).to(mask.dtype)
    k.requires_grad_(True)
    u_free.requires_grad_(True)
    w.requires_grad_(True)
    reps = -(-T // P_u)

    def tile(x: Any) -> Any:
        return x.repeat(1, reps, 1)[:, :T] * mask[:, None, :]

    v0 = torch.zeros(restarts, T, 1, dtype=torch.float64)
    sign = 1.0 if maximise else -1.0

    def log_norm(p: list[Any]) -> Any:
        # Maximising: ||P||₂ = max_w ||wᵀ P|| over unit w, so the row wᵀX_1⋯X_T (O(dk) per
        # step) stands in for the matrix; minimising needs the matrix itself.
        kh, vv, uu = _torch_project(p[0] * mask[:, None, :], v0, tile(p[1]), u_norm)
        _, steps_ = _torch_states(config, variant, kh, vv, uu, factors=maximise)
        if maximise:
            r = p[2] * mask
            r = r / r.norm(dim=-1, keepdim=True)
            log_scale = torch.zeros(restarts, dtype=torch.float64)
            for pairs in steps_:
                # wᵀ(I − Σ a bᵀ) = wᵀ − Σ (wᵀa) bᵀ, every wᵀa from the same wᵀ
                dots = [(r * a).sum(-1, keepdim=True) for a, _ in pairs]
                for d, (_, b) in zip(dots, pairs, strict=True):
                    r = r - d * b
                f = r.norm(dim=-1).clamp_min(1e-300)
                log_scale = log_scale + torch.log(f)
                r = r / f[:, None]
            return log_scale
        P = torch.eye(dk, dtype=torch.float64).expand(restarts, dk, dk)
        log_scale = torch.zeros(restarts, dtype=torch.float64)
        for X in steps_:
            P = P @ X
            f = P.flatten(1).norm(dim=-1).clamp_min(1e-300)
            log_scale = log_scale + torch.log(f)
            P = P / f[:, None, None]
        return log_scale + torch.log(torch.linalg.matrix_norm(P, ord=2).clamp_min(1e-300))

    (best, vals), trace = _ascend([k, u_free, w], lambda p: sign * log_norm(p), steps, lr)
    r = int(torch.argmax(vals))
    with torch.no_grad():
        kh, _, uu = _torch_project(best[0] * mask[:, None, :], v0, tile(best[1]), u_norm)
    k_np, u_np = kh[r].numpy().copy(), uu[r].numpy().copy()
    v = np.zeros((T, 1))
    v[:, 0] = 1.0
    word = "maximise" if maximise else "minimise"
    return AdversaryRun(
        k_np,
        v,
        u_np,
        product_norms(k_np, u_np, config, variant),
        f"gradient search ({word} ||X_1⋯X_T||₂), {variant} ({restarts} restarts × {steps} "
        "Adam steps"
        + ("" if u_period is None else f", u of period {u_period}")
        + ("" if init is None else f", from {init.method}")
        + ")",
        {
            "trace": [sign * x for x in trace],
            "dk": dk,
            "u_norm": _penalty_norm(dk, u_norm),
            "restart_values": np.exp(sign * vals.numpy()).tolist(),
        },
    )


def greedy_product_norm(
    config: VLAConfig,
    T: int,
    dk: int,
    *,
    variant: str = "vla",
    candidates: int = 64,
    refinements: int = 3,
    seed: int = 0,
    u_norm: float | None = None,
) -> AdversaryRun:
    """The greedy adaptive adversary for ``||X_1 ⋯ X_t||₂``: at each step the ``(k̂_t, u_t)``
    among random candidates (and refinements around the best) that maximises the norm of the
    product so far times the new step matrix; ``||u_t|| = u_norm`` (None: ``1/√dk``)."""
    rng = np.random.default_rng(seed)
    A = np.eye(dk) / config.lambda0
    P = np.eye(dk)
    log_scale = 0.0
    ks, us, vals = np.empty((T, dk)), np.empty((T, dk)), np.empty(T)
    S_dummy = np.zeros((1, dk))
    inv_sqrt = _penalty_norm(dk, u_norm)
    for t in range(1, T + 1):
        K = _sphere(rng, candidates, dk)
        U = _sphere(rng, candidates, dk) * inv_sqrt
        best = None
        radius = 0.5
        for _ in range(refinements + 1):
            _, g, A_new = _candidate_steps(variant, S_dummy, A, K, U, t, config)
            X = np.eye(dk)[None] - K[:, :, None] * g[:, None, :]
            if variant == "rls":
                pu = np.matmul(A_new, U[:, :, None])[:, :, 0]
                X = X - U[:, :, None] * pu[:, None, :]
            norms = np.linalg.norm(P[None] @ X, ord=2, axis=(-2, -1))
            i = int(np.argmax(norms))
            if best is None or norms[i] > best[0]:
                best = (norms[i], K[i], U[i], X[i], A_new[i])
            K = _unit(best[1] + radius * rng.standard_normal((candidates, dk)) / math.sqrt(dk))
            U = _unit(best[2] / inv_sqrt + radius * rng.standard_normal((candidates, dk)))
            U = U * inv_sqrt
            radius /= 3.0
        assert best is not None
        _, k, u, X, A = best
        P = P @ X
        f = float(np.linalg.norm(P))
        log_scale += math.log(f)
        P = P / f
        ks[t - 1], us[t - 1] = k, u
        vals[t - 1] = math.exp(log_scale) * float(np.linalg.norm(P, 2))
    v = np.zeros((T, 1))
    v[:, 0] = 1.0
    return AdversaryRun(
        ks, v, us, vals, f"greedy ||X_1⋯X_t||₂, {variant}", {"dk": dk, "u_norm": inv_sqrt}
    )


# -- subspace-lifted search --------------------------------------------------------------------


def subspace_basis(dk: int, r: int, rng: np.random.Generator) -> np.ndarray:
    """A random orthonormal basis ``Q`` ``[dk, r]`` (``QᵀQ = I_r``) of an r-dimensional
    subspace of R^dk (QR of a Gaussian matrix)."""
    if not 1 <= r <= dk:
        raise VLAInputError("r", f"expected 1 <= r <= dk = {dk}, got {r}")
    q, _ = np.linalg.qr(rng.standard_normal((dk, r)))
    return q


def embed(
    run: AdversaryRun, basis: np.ndarray, config: VLAConfig, variant: str = "vla"
) -> AdversaryRun:
    """A product search's run at width r carried into R^dk by ``basis`` ``[dk, r]``
    (orthonormal columns): ``k_t ↦ Q k_t``, ``u_t ↦ Q u_t``.

    Norms are kept, so unit keys stay unit and ``||u_t||`` stays what the run used (the class's
    norm at the full width when the run was searched with ``u_norm`` set to it).  The embedding
    is exact: ``A_0 = I/λ0`` and penalties in ``range(Q)`` give ``A_t = Q A_t^{(r)} Qᵀ + c_t
    (I − QQᵀ)`` (the nudges add ``η I`` to both parts), so ``α_t = Q α_t^{(r)}``,
    ``X_t = Q X_t^{(r)} Qᵀ + (I − QQᵀ)`` and ``||X_1 ⋯ X_t||₂ = max(||X_1^{(r)} ⋯ X_t^{(r)}||₂,
    1)``.  ``values`` are re-measured at the full width (:func:`product_norms`)."""
    dk, r = basis.shape
    if run.k.shape[1] != r or run.u.shape[1] != r:
        raise VLAInputError("basis", f"expected {run.k.shape[1]} columns, got shape {basis.shape}")
    if not np.allclose(basis.T @ basis, np.eye(r), atol=1e-12):
        raise VLAInputError("basis", "expected orthonormal columns (QᵀQ = I)")
    k, u = run.k @ basis.T, run.u @ basis.T
    return AdversaryRun(
        k,
        run.v.copy(),
        u,
        product_norms(k, u, config, variant),
        f"{run.method}, embedded in dk = {dk}",
        {**run.info, "dk": dk, "subspace_dim": r},
    )


def lifted_search_product(
    config: VLAConfig,
    T: int,
    dk: int,
    *,
    dims: tuple[int, ...] = (2, 4, 8),
    variant: str = "vla",
    u_norm: float | None = None,
    restarts: int = 4,
    steps: int = 60,
    refine_steps: int = 12,
    greedy: bool = True,
    seed: int = 0,
) -> AdversaryRun:
    """The subspace-lifted adversary for ``||X_1 ⋯ X_T||₂`` at width ``dk``.

    A large product needs a large condition number of ``A_t`` (``c_t = α̂_tᵀk̂_t`` falls with it),
    which penalties concentrated in a few directions reach; keys need only move in those
    directions.  So for each ``r`` of ``dims`` (``r < dk``) the gradient search (``restarts``
    restarts per r, all subspaces in one batch: ``restart_dims`` of
    :func:`gradient_search_product`) and, with ``greedy``, the greedy adversary run in R^r with
    the full width's penalty norm (``u_norm``, None: ``1/√dk``) — cheap, so with all of
    ``steps`` — the best is embedded in R^dk along a random orthonormal basis (:func:`embed`,
    exact) and seeds the gradient search at the full width (``refine_steps`` Adam steps,
    ``restarts`` restarts around it).  The run returned is the best of the embedded and the
    refined inputs; ``info["by_dim"]`` holds the value reached in each subspace."""
    norm = _penalty_norm(dk, u_norm)
    subs = sorted({r for r in dims if 1 <= r < dk})
    if not subs:
        raise VLAInputError("dims", f"expected a subspace dimension 1 <= r < dk = {dk}, got {dims}")
    # One batch for every subspace: restarts confined to the first r coordinates of R^{max r}
    # are exactly searches in R^r.
    width = subs[-1]
    restart_dims = tuple(r for r in subs for _ in range(restarts))
    batch = gradient_search_product(
        config,
        T,
        width,
        variant=variant,
        restarts=len(restart_dims),
        steps=steps,
        seed=seed,
        u_norm=norm,
        restart_dims=restart_dims,
    )
    values = np.asarray(batch.info["restart_values"])
    by_dim = {r: float(values[np.asarray(restart_dims) == r].max()) for r in subs}
    found = [batch]
    if greedy:
        for r in subs:
            run_r = greedy_product_norm(config, T, r, variant=variant, seed=seed, u_norm=norm)
            by_dim[r] = max(by_dim[r], run_r.value)
            found.append(run_r)
    sub = max(found, key=lambda x: x.value)
    sub_dim = int(np.flatnonzero(np.abs(sub.k).sum(0) + np.abs(sub.u).sum(0))[-1]) + 1
    basis = subspace_basis(dk, sub.k.shape[1], np.random.default_rng(seed))
    lifted = embed(sub, basis, config, variant)
    runs = [lifted]
    if refine_steps > 0:
        runs.append(
            gradient_search_product(
                config,
                T,
                dk,
                variant=variant,
                restarts=restarts,
                steps=refine_steps,
                seed=seed,
                u_norm=norm,
                init=lifted,
            )
        )
    best = max(runs, key=lambda x: x.value)
    info = {
        **best.info,
        "by_dim": by_dim,
        "lifted_value": lifted.value,
        "refined_value": runs[-1].value,
        "subspace_dim": sub_dim,
    }
    method = (
        f"subspace-lifted search (r ∈ {subs}; best r = {sub_dim}: {sub.method}; "
        f"embedded in dk = {dk}"
        + (f", refined by {refine_steps} Adam steps at dk = {dk})" if refine_steps else ")")
    )
    return AdversaryRun(best.k, best.v, best.u, best.values, method, info)


def _top_left_singular_vector(
    k: np.ndarray, u: np.ndarray, config: VLAConfig, variant: str, u_norm: float | None
) -> np.ndarray:
    """The unit row ``w`` maximising ``||wᵀ X_1 ⋯ X_T||`` for the inputs ``k, u`` ``[T, dk]``
    (penalties rescaled to ``||u|| = u_norm``, None: ``1/√dk``)."""
    dk = k.shape[1]
    P = np.eye(dk)
    for X in _step_matrices(_unit(k), _unit(u) * _penalty_norm(dk, u_norm), config, variant):
        P = P @ X
        P = P / max(float(np.linalg.norm(P)), 1e-300)
    return np.linalg.svd(P)[0][:, 0]


# -- extension, fits, calibration problems -----------------------------------------------------


def rule_from_search(run: AdversaryRun) -> tuple[PenaltyRule, float]:
    """The penalty rule a whole-sequence search suggests: its penalties' principal direction
    (top eigenvector of ``Σ u_t u_tᵀ``, the sign of ``u`` being immaterial), as a pattern of
    period 1; and the fraction of ``Σ ||u_t||²`` along it (1: the search penalised one
    direction throughout)."""
    G = run.u.T @ run.u
    w, V = np.linalg.eigh(G)
    return PenaltyRule(V[:, -1][None, :], "principal direction of the search's u"), float(
        w[-1] / max(w.sum(), 1e-300)
    )


def running_sup(values: np.ndarray) -> np.ndarray:
    """``sup_{s ≤ t} values_s`` for every t."""
    return np.maximum.accumulate(np.where(np.isfinite(values), values, np.inf))


def fit_exponent(lengths: Any, values: Any) -> tuple[float, float]:
    """Least-squares fit of ``log values = p·log T + c`` over all the points: ``(p, r²)``."""
    x = np.log(np.asarray(lengths, dtype=np.float64))
    y = np.log(np.maximum(np.asarray(values, dtype=np.float64), 1e-300))
    if x.size < 2 or np.ptp(x) == 0:
        raise ValueError("fit_exponent: expected at least two distinct lengths")
    p, c = np.polyfit(x, y, 1)
    resid = y - (p * x + c)
    ss = float(np.sum((y - y.mean()) ** 2))
    r2 = 1.0 - float(np.sum(resid**2)) / ss if ss > 0 else 1.0
    return float(p), r2


def known_worst_state_norm(variant: str, T: int) -> float:
    """The tight worst case of ``||S_T||_F`` over unit keys and ``||v_t|| ≤ 1`` from ``S_0 = 0``:
    ``T`` for linear attention (``||S_t|| ≤ ||S_{t-1}|| + 1``, equality for constant ``k, v``) and
    ``√T`` for the delta rule (``||S_t||_F² = ||S_{t-1}||_F² − ||S_{t-1}k̂_t||² + ||v_t||² ≤
    ||S_{t-1}||_F² + 1``, equality when every key lies in the kernel of the state, which a rank-one
    state ``a bᵀ`` keeps: ``k̂_t ⊥ b``, ``v_t = a``)."""
    if variant == "linear":
        return float(T)
    if variant == "delta":
        return math.sqrt(T)
    raise ValueError(f"variant: no closed-form worst case for {variant!r} (linear, delta)")


def max_rank_one_deviation(
    dk: int, *, restarts: int = 8, steps: int = 200, lr: float = 0.05, seed: int = 0
) -> float:
    """``max ||I − a bᵀ||₂`` over unit ``a, b`` by projected gradient ascent (calibration: the
    exact maximum is 2, at ``b = −a``)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    a = torch.randn(restarts, dk, generator=g, dtype=torch.float64, requires_grad=True)
    b = torch.randn(restarts, dk, generator=g, dtype=torch.float64, requires_grad=True)
    eye = torch.eye(dk, dtype=torch.float64)

    def objective(p: list[Any]) -> Any:
        ah = p[0] / p[0].norm(dim=-1, keepdim=True)
        bh = p[1] / p[1].norm(dim=-1, keepdim=True)
        return torch.linalg.matrix_norm(eye - ah[:, :, None] * bh[:, None, :], ord=2)

    (_, vals), _ = _ascend([a, b], objective, steps, lr)
    return float(vals.max())


def _step_matrices(
    k: np.ndarray, u: np.ndarray, config: VLAConfig, variant: str
) -> Iterator[np.ndarray]:
    """The step matrices ``X_t`` ``[dk, dk]`` of the inputs ``k, u`` ``[T, dk]``, one per t
    (numpy, spec §2.3/§2.4; the greedy's step)."""
    T, dk = k.shape
    A = np.eye(dk) / config.lambda0
    for t in range(1, T + 1):
        step = slice(t - 1, t)
        _, g, A_new = _candidate_steps(variant, np.zeros((1, dk)), A, k[step], u[step], t, config)
        X = np.eye(dk) - np.outer(k[t - 1], g[0])
        if variant == "rls":
            X = X - np.outer(u[t - 1], A_new[0] @ u[t - 1])
        A = A_new[0]
        yield X


def product_norms(k: np.ndarray, u: np.ndarray, config: VLAConfig, variant: str) -> np.ndarray:
    """``||X_1 ⋯ X_t||₂`` for every t (numpy, rescaled products) from the greedy's step
    matrices — a cross-check of a search's own figures."""
    T, dk = k.shape
    P = np.eye(dk)
    log_scale = 0.0
    out = np.empty(T)
    for t, X in enumerate(_step_matrices(k, u, config, variant), start=1):
        P = P @ X
        f = float(np.linalg.norm(P))
        log_scale += math.log(f) if f > 0 else -math.inf
        P = P / (f if f > 0 else 1.0)
        out[t - 1] = math.exp(log_scale) * float(np.linalg.norm(P, 2))
    return out
