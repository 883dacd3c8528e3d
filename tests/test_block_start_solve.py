"""The penalty chain's block starts solved by one Triton kernel
(``benchmarks/prototypes/block_start_solve.py``) against the backend's solve, under Triton's
interpreter on the CPU."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

_PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "prototypes" / "block_start_solve.py"
_spec = importlib.util.spec_from_file_location("block_start_solve", _PATH)
assert _spec is not None and _spec.loader is not None
bss = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bss)

#: Float64 elimination of a ``d × d`` system whose ``Θ`` has condition number ``κ`` errs by
#: about ``d · κ · 2⁻⁵³`` relative to ``A``; the starts here have ``κ(Θ)`` below 10³ and d ≤ 32,
#: so 1e-11 leaves a margin of about 30.  Measured: 4e-16 to 6e-16.
FLOAT64_SOLVE = 1e-11


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max())


def _exchanged(BH: int, d: int, *, seed: int) -> torch.Tensor:
    """``(Π; Θ)`` whose ``Θ`` has zeros on the diagonal of ``Θᵀ`` (an anti-diagonal ``Θ``
    mixed with a small random part), so that elimination in order divides by nearly zero; ``A``
    symmetric positive definite and ``Π = A Θ``."""
    g = torch.Generator().manual_seed(seed)
    Th = torch.eye(d, dtype=torch.float64).flip(0) + 1e-9 * torch.randn(
        BH, d, d, generator=g, dtype=torch.float64
    )
    G = torch.randn(BH, d, d, generator=g, dtype=torch.float64)
    A = G @ G.mT / d + torch.eye(d, dtype=torch.float64)
    return torch.cat([A @ Th, Th], dim=1)[None]


@pytest.mark.parametrize("d, BK", [(16, 16), (24, 32), (32, 32)])
def test_the_kernel_equals_the_backends_solve(d: int, BK: int) -> None:
    """On starts formed as the forward forms them (four nudge periods a block, four blocks),
    the kernel's scratch equals the backend's solve, symmetrised and padded, to float64
    rounding, and is zero beyond ``d``."""
    XX = bss.make_inputs(2, 4, d, seed=1)
    want = bss.solve_backend(XX, BK)
    got = bss.solve_kernel(XX, BK)
    assert got.shape == (2, 4, BK, BK)
    assert _relative(got, want) < FLOAT64_SOLVE
    assert torch.equal(got, got.mT)
    assert not got[:, :, d:].any() and not got[:, :, :, d:].any()


def test_row_exchanges_are_needed_and_made() -> None:
    """Where ``Θᵀ`` has (near) zeros on its diagonal the kernel still meets the solve; the
    planted slip that eliminates in order (``BUG_NO_PIVOTING``) misses it by orders of
    magnitude more than the tolerance, or gives non-finite starts."""
    XX = _exchanged(2, 16, seed=4)
    want = bss.solve_backend(XX, 16)
    assert _relative(bss.solve_kernel(XX, 16), want) < FLOAT64_SOLVE
    planted = bss.solve_kernel(XX, 16, bug=int(bss.BUG_NO_PIVOTING))
    assert not bool(torch.isfinite(planted).all()) or _relative(planted, want) > 1e3 * FLOAT64_SOLVE


def test_a_singular_theta_gives_non_finite_starts() -> None:
    """A zero column of ``Θ`` (no solution) makes the start non-finite, which the forward's
    block-end check rejects (as it rejects the LU's)."""
    XX = bss.make_inputs(1, 2, 16, seed=2)
    XX[1, 0, 16:, 3] = 0.0
    got = bss.solve_kernel(XX, 16)
    assert bool(torch.isfinite(got[0, 0]).all())
    assert not bool(torch.isfinite(got[0, 1]).all())
