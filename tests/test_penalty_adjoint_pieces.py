"""The piecewise penalty adjoint of ``benchmarks/prototypes/penalty_adjoint_pieces.py`` against
autograd of the recurrence's penalty half (spec §2.3), float64; planted slips must fail."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

_PATH = (
    Path(__file__).resolve().parents[1] / "benchmarks" / "prototypes" / "penalty_adjoint_pieces.py"
)
_spec = importlib.util.spec_from_file_location("penalty_adjoint_pieces", _PATH)
assert _spec is not None and _spec.loader is not None
pieces = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(pieces)

ETA = 0.05


def _case(T: int, d: int, seed: int):  # type: ignore[no-untyped-def]
    g = torch.Generator().manual_seed(seed)
    G = torch.randn(d, d, generator=g, dtype=torch.float64)
    A0 = torch.linalg.inv(0.5 * torch.eye(d, dtype=torch.float64) + G @ G.T)
    u = torch.randn(T, d, generator=g, dtype=torch.float64) / d**0.5
    k = torch.randn(T, d, generator=g, dtype=torch.float64)
    k_hat = k / k.norm(dim=1, keepdim=True)
    da = torch.randn(T, d, generator=g, dtype=torch.float64)
    sigma = torch.randn(d, d, generator=g, dtype=torch.float64)
    return u, k_hat, A0, da, sigma + sigma.T


def _autograd(u, k_hat, A0, da, sigma_T, period, start):  # type: ignore[no-untyped-def]
    """``d/du``, ``d/dk̂``, the symmetric part of ``d/dA0`` and ``d/dA0`` itself of
    ``Σ_t ⟨dα_t, α_t⟩ + ⟨Σ_T, A_T⟩``, the step written out as spec §2.3 orders it."""
    leaves = [x.clone().requires_grad_() for x in (u, k_hat, A0)]
    U, K, A = leaves
    loss = torch.zeros((), dtype=torch.float64)
    for t in range(U.shape[0]):
        s = A @ U[t]
        A = A - torch.outer(s, s) / (1 + U[t] @ s)
        if period is not None and (start + t + 1) % period == 0:
            A = A + ETA * torch.eye(A.shape[0], dtype=torch.float64)
        loss = loss + da[t] @ (A @ K[t])
    loss = loss + (A * sigma_T).sum()
    du, dk, dA0 = torch.autograd.grad(loss, leaves)
    return du, dk, 0.5 * (dA0 + dA0.T), dA0


def _mismatch(T: int, d: int, period: int | None, start: int, slip: str | None = None) -> list:
    case = _case(T, d, seed=T + d)
    want = _autograd(*case, period, start)
    u, k_hat, A0, da, sigma = case
    du, gate, dA0, _ds, dA0_full, du_steps = pieces.penalty_adjoint_in_pieces(
        u, k_hat, A0, da, sigma, nudge_eta=ETA, nudge_period=period, start=start, slip=slip
    )
    # d/dk̂ of Σ⟨dα, A k̂⟩ is the gate term A_tᵀdα_t; du comes two ways.
    got = (du, gate, dA0, dA0_full, du_steps)
    want = (want[0], want[1], want[2], want[3], want[0])
    return [
        name
        for name, g, w in zip(
            ("du", "dk_hat", "dA0", "dA0_full", "du_steps"), got, want, strict=True
        )
        if not float((g - w).abs().max()) <= 1e-12 * (1 + float(w.abs().max()))
    ]


@pytest.mark.parametrize(
    ("T", "d", "period", "start"),
    [(23, 4, 5, 2), (17, 3, None, 0), (9, 4, 1, 0), (30, 6, 7, 6), (12, 5, 4, 0)],
)
def test_pieces_match_autograd(T: int, d: int, period: int | None, start: int) -> None:
    """Several pieces (a partial first one with ``start`` off the period), no nudge at all, a
    nudge after every token, and a sequence that ends on a nudge."""
    assert _mismatch(T, d, period, start) == []


@pytest.mark.parametrize("slip", pieces.SLIPS)
def test_planted_slip_fails(slip: str) -> None:
    """``A`` after the closing nudge in ``Ω``, the piece-end term dropped, ``Q`` transposed in
    the scan, ``y_t`` taking the whole piece's ``T`` (not its block after ``t``): each moves a
    result off autograd's."""
    assert _mismatch(23, 4, 5, 2, slip=slip) != []
