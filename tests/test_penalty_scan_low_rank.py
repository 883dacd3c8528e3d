"""The penalty adjoint's scan with ``Q`` in compact WY form
(``benchmarks/prototypes/penalty_scan_low_rank.py``) against the shipped scan kernel and a
float64 reference, under Triton's interpreter on the CPU."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

_PATH = (
    Path(__file__).resolve().parents[1] / "benchmarks" / "prototypes" / "penalty_scan_low_rank.py"
)
_spec = importlib.util.spec_from_file_location("penalty_scan_low_rank", _PATH)
assert _spec is not None and _spec.loader is not None
scan = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(scan)

#: Float32 products over five pieces: the relative error a correct scan stays under (about
#: 10 · 5 · 2⁻²⁴ ≈ 3e-6 for products of 32 terms on values of order one; measured 2e-7 to 4e-7
#: for both kernels).  A wrong formula errs by order one with these inputs.
FLOAT32_SCAN = 1e-5


def _relative(a, b) -> float:
    return float((a.double() - b.double()).abs().max() / b.double().abs().max())


@pytest.mark.parametrize("d, n", [(16, 16), (32, 16)])
def test_low_rank_scan_equals_the_shipped_scan(d: int, n: int) -> None:
    """Every output (``Σ`` and ``dz`` after each piece and before the span) of the WY form
    equals the shipped kernel's on ``Q = I − Uᵀ M`` to float32 rounding, and ``Σ`` before the
    span meets the float64 recurrence."""
    x = scan.make_inputs(2, 5, d, n, seed=3)
    x["u"] *= 8.0  # Q far from the identity, so that the rank-n correction matters
    low, shipped = scan.scan_low_rank(x), scan.scan_shipped(x, scan.form_q(x))
    for name in ("sig", "dze", "sig0", "dz0"):
        assert _relative(low[name], shipped[name]) < FLOAT32_SCAN, name
    assert _relative(low["sig0"], scan.scan_float64(x)) < FLOAT32_SCAN


def test_planted_slip_in_the_low_rank_scan_is_rejected() -> None:
    """Without the ½ on ``Z U`` the same comparison fails."""
    x = scan.make_inputs(2, 5, 16, 16, seed=3)
    x["u"] *= 8.0
    bad = scan.scan_low_rank(x, bug=scan.BUG_NO_HALF)
    assert _relative(bad["sig0"], scan.scan_float64(x)) > 100 * FLOAT32_SCAN
