"""The penalty half of the adjoint of spec §2.3 by products over nudge-free pieces: a float64
PyTorch prototype of the formulas a tensor-core penalty adjoint would compute (not a backend).

The step's penalty half is ``s_t = A_{t-1}u_t``, ``δ_t = 1 + u_tᵀs_t``, ``A_t = A_{t-1} −
s_t s_tᵀ/δ_t``, the nudge ``A_t += η·I`` after some steps, and the gate ``α_t = A_t k̂_t`` from
the updated ``A_t``.  Given the gates' cotangents ``dα_t`` and the final ``A``'s symmetric
cotangent ``Σ_T``, the adjoint needs ``du_t``, the gate's ``A_tᵀdα_t`` (a term of ``dk̂_t``) and
the initial ``A``'s cotangent.  Where no denominator is floored, with ``G_t = sym(dα_t k̂_tᵀ)``
and ``N_t = I − s_t u_tᵀ/δ_t`` (the downdate maps a symmetric ``dA`` to ``N_t dA N_tᵀ``; the
nudge's Jacobian is the identity):

- **pieces.** The nudges cut the sequence into pieces; inside a piece ``A_j^- = (A_a^{-1} +
  Σ_{a≤i≤j} u_i u_iᵀ)^{-1}`` (``A^-``: before the piece's closing nudge), so the loss depends on
  ``u_t`` through a sum of inverses and ``du_t = −2 Ω_t u_t`` with ``Ω_t = A_e^- Σ_e A_e^- +
  Σ_{t≤j≤e} A_j^- G_j A_j^-`` (``e`` the piece's last token, ``Σ_e`` the cotangent after its
  nudge, the gate of ``e`` excluded).  ``A_j^- G_j A_j^- u = ½(β_j α_j^{-ᵀ}u + α_j^- β_jᵀu)``
  with ``β_j = A_j^- dα_j``: masked products over the piece.
- **the scan.** Across a piece, ``Σ_a = Q Σ_e Qᵀ + sym(Ãᵀ K̃)``, ``Q = N_aᵀ⋯N_eᵀ`` and
  ``ã_j = Q_j dα_j``, ``k̃_j = Q_j k̂_j`` with ``Q_j = N_aᵀ⋯N_jᵀ``.  In compact WY form ``Q_j =
  I − U T_{≤j} Sᵀ`` (``T`` upper triangular, column ``j``: ``T_jj = 1/δ_j``, ``T_{<j,j} =
  −T_{<j}(S_{<j}ᵀu_j)/δ_j``), so ``Ã = dA − (tril(dA Sᵀ) Tᵀ) U``: products again.

- **the step's cotangents.** The full (non-symmetric) cotangent of the initial ``A`` needs each
  step's ``ds_t = −2 y_t/δ_t + dδ_t u_t``, ``dδ_t = s_tᵀy_t/δ_t²``, with ``y_t = Σ^{(t)} s_t``
  and ``Σ^{(t)}`` the symmetric cotangent of ``A_t^-`` (the gate of ``t`` included):
  ``dA_a = dA_e + Σ_t (dα_t k̂_tᵀ + ds_t u_tᵀ)``.  Inside a piece ``Σ^{(t)} = Σ_{j≥t} P_{tj}
  G_j P_{tj}ᵀ + P_{te} Σ_e P_{teᵀ}`` with ``P_{tj} = N_{t+1}ᵀ⋯N_jᵀ``, whose compact WY factor is
  the diagonal block ``T_{(t,j]}`` of the piece's ``T`` (``T^{-1}`` has ``δ_j`` on its
  diagonal and ``s_iᵀu_j`` above it, so a contiguous product's ``T`` is a diagonal block of
  ``T``).  Since ``s_t = δ_t A_t^- u_t`` and ``A_j^- = N_j⋯N_{t+1} A_t^-``, ``P_{tj}ᵀ s_t =
  δ_t A_j^- u_t`` and, with ``C = U α^{-ᵀ}``, ``B = U βᵀ`` (``[n, n]``), ``H = ½ D_δ((C∘M)(SDᵀ∘M)ᵀ
  + (B∘M)(SKᵀ∘M)ᵀ)`` (``M`` the mask ``j ≥ t``; ``SDᵀ = S dAᵀ``, ``SKᵀ = S K̂ᵀ``) and ``W = D_δ U
  A_e^- Σ_e``: ``Y = ½ D_δ((C∘M) dA + (B∘M) K̂) + W − (((H + W Sᵀ) Tᵀ) ∘ M') U`` (``M'`` the mask
  ``i > t``).  Then ``du_t = dδ_t s_t + A_{t-1} ds_t``, a second route to ``du``.

Only the scan runs from piece to piece; the rest is parallel.
``tests/test_penalty_adjoint_pieces.py`` checks every output against autograd of the
recurrence, and that planted slips fail.
"""

from __future__ import annotations

import torch
from torch import Tensor

#: Planted slips for the meta-test: each must move a result off autograd's.
SLIPS = ("after_nudge", "no_piece_end", "Q_transposed", "T_whole")


def _sym(x: Tensor) -> Tensor:
    return 0.5 * (x + x.mT)


def _pieces(T: int, nudge_period: int | None, start: int) -> list[tuple[int, int]]:
    """``(a, e)`` 0-based, inclusive: runs of tokens whose last one is followed by a nudge (or
    ends the sequence); step ``t`` (0-based) is global step ``start + t + 1``."""
    if nudge_period is None:
        return [(0, T - 1)]
    ends = [t for t in range(T) if (start + t + 1) % nudge_period == 0]
    if not ends or ends[-1] != T - 1:
        ends.append(T - 1)
    pieces, a = [], 0
    for e in ends:
        pieces.append((a, e))
        a = e + 1
    return pieces


def penalty_adjoint_in_pieces(
    u: Tensor, k_hat: Tensor, A0: Tensor, da: Tensor, sigma_T: Tensor, *, nudge_eta: float,
    nudge_period: int | None, start: int = 0, slip: str | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:  # fmt: skip
    """``du`` ``[T, d]``, the gate term ``A_tᵀdα_t`` ``[T, d]``, the symmetric part of the
    initial ``A``'s cotangent ``[d, d]``, the steps' ``ds`` ``[T, d]`` and the full initial
    cotangent ``Σ_T + Σ_t (dα_t k̂_tᵀ + ds_t u_tᵀ)`` ``[d, d]`` and ``du`` by the steps
    ``[T, d]`` from ``u, k̂, dα`` ``[T, d]``, a
    symmetric ``A0`` and a symmetric ``Σ_T`` (float64, one head; no floored denominator).
    ``du`` comes from ``Ω``; ``dδ_t s_t + A_{t-1} ds_t`` must agree with it."""
    T, d = u.shape
    eye = torch.eye(d, dtype=u.dtype)
    pieces = _pieces(T, nudge_period, start)
    nudged = [nudge_period is not None and (start + e + 1) % nudge_period == 0 for _, e in pieces]
    # The forward's chain (a kernel takes s, δ from its rerun and A at piece starts from
    # checkpoints and the chain's rank updates).
    starts, S, delta = [], torch.empty_like(u), torch.empty(T, dtype=u.dtype)
    A = A0
    for a, e in pieces:
        starts.append(A)
        for t in range(a, e + 1):
            s = A @ u[t]
            S[t], delta[t] = s, 1 + u[t] @ s
            A = A - torch.outer(s, s) / delta[t]
        if nudged[len(starts) - 1]:
            A = A + nudge_eta * eye
    local, Qs, gate_term, du = [], [], torch.empty_like(u), torch.empty_like(u)
    minus = []  # per piece: A_j^- for every token, and the piece's nudge
    Ts: list[Tensor] = []  # per piece: the compact WY factor T
    for p, (a, e) in enumerate(pieces):
        n = e - a + 1
        rows = slice(a, e + 1)
        Sp, Up, Dp, Kp, DAp = S[rows], u[rows], delta[rows], k_hat[rows], da[rows]
        lower = torch.tril(torch.ones(n, n, dtype=torch.bool))
        # A_j^- v = A_a v − Σ_{i≤j} s_i (s_iᵀ v)/δ_i, for v = k̂_j and dα_j (rows j).
        alpha_m = Kp @ starts[p] - torch.where(lower, (Kp @ Sp.mT) / Dp, 0.0) @ Sp
        beta = DAp @ starts[p] - torch.where(lower, (DAp @ Sp.mT) / Dp, 0.0) @ Sp
        eta = nudge_eta if nudged[p] else 0.0
        # The gate reads A_j, which is A_j^- except after the closing nudge.
        last = torch.zeros(n, 1, dtype=u.dtype)
        last[-1] = eta
        gate_term[a : e + 1] = beta + last * DAp
        minus.append((alpha_m, beta, starts[p] - Sp.mT @ (Sp / Dp[:, None])))
        # The compact WY form of Q_j = N_aᵀ⋯N_jᵀ = I − U T_{≤j} Sᵀ.
        Tm = torch.zeros(n, n, dtype=u.dtype)
        for j in range(n):
            Tm[j, j] = 1 / Dp[j]
            Tm[:j, j] = -(Tm[:j, :j] @ (Sp[:j] @ Up[j])) / Dp[j]
        A_t = DAp - (torch.where(lower, DAp @ Sp.mT, 0.0) @ Tm.mT) @ Up
        K_t = Kp - (torch.where(lower, Kp @ Sp.mT, 0.0) @ Tm.mT) @ Up
        local.append(_sym(A_t.mT @ K_t))
        Q = eye - Up.mT @ Tm @ Sp
        Qs.append(Q.mT if slip == "Q_transposed" else Q)
        Ts.append(Tm)
    # The scan: Σ after every piece, from the last.
    sigma_end = [torch.empty(0)] * len(pieces)
    sigma = sigma_T
    for p in reversed(range(len(pieces))):
        sigma_end[p] = sigma
        sigma = Qs[p] @ sigma @ Qs[p].mT + local[p]
    # du_t = −2 Ω_t u_t, per piece; and each step's ds_t.
    ds, du_steps = torch.empty_like(u), torch.empty_like(u)
    for p, (a, e) in enumerate(pieces):
        n = e - a + 1
        alpha_m, beta, A_e = minus[p]
        if slip == "after_nudge" and nudged[p]:
            A_e = A_e + nudge_eta * eye
        Up = u[a : e + 1]
        upper = torch.triu(torch.ones(n, n, dtype=torch.bool))  # j ≥ t
        w = 0.5 * (
            torch.where(upper, Up @ alpha_m.mT, 0.0) @ beta
            + torch.where(upper, Up @ beta.mT, 0.0) @ alpha_m
        )
        if slip != "no_piece_end":
            w = w + Up @ (A_e @ sigma_end[p] @ A_e)
        du[a : e + 1] = -2 * w
        # y_t = Σ^{(t)} s_t, then ds_t (module docstring).
        Sp, Dp, Kp, DAp = S[a : e + 1], delta[a : e + 1], k_hat[a : e + 1], da[a : e + 1]
        C, Bm = Up @ alpha_m.mT, Up @ beta.mT
        Cm, Bmm = torch.where(upper, C, 0.0), torch.where(upper, Bm, 0.0)
        H = (
            0.5
            * Dp[:, None]
            * (
                Cm @ torch.where(upper, Sp @ DAp.mT, 0.0).mT
                + Bmm @ torch.where(upper, Sp @ Kp.mT, 0.0).mT
            )
        )
        W = Dp[:, None] * (Up @ (A_e @ sigma_end[p]))
        later = torch.triu(torch.ones(n, n, dtype=torch.bool), diagonal=1)  # i > t
        if slip == "T_whole":
            later = torch.ones(n, n, dtype=torch.bool)
        Y = (
            0.5 * Dp[:, None] * (Cm @ DAp + Bmm @ Kp)
            + W
            - torch.where(later, (H + W @ Sp.mT) @ Ts[p].mT, 0.0) @ Up
        )
        ddelta = (Sp * Y).sum(1) / Dp**2
        ds[a : e + 1] = -2 * Y / Dp[:, None] + ddelta[:, None] * Up
        # A_{t-1} ds_t = A_a ds_t − Σ_{i<t} s_i (s_iᵀds_t)/δ_i.
        before = torch.tril(torch.ones(n, n, dtype=torch.bool), diagonal=-1)
        DSp = ds[a : e + 1]
        A_ds = DSp @ starts[p] - torch.where(before, (DSp @ Sp.mT) / Dp, 0.0) @ Sp
        du_steps[a : e + 1] = ddelta[:, None] * Sp + A_ds
    dA0_full = sigma_T + da.mT @ k_hat + ds.mT @ u
    return du, gate_term, sigma, ds, dA0_full, du_steps
