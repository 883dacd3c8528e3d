"""The penalty adjoint's scan with ``Q`` in compact WY form
(``benchmarks/prototypes/penalty_scan_low_rank.py``) and the backend's scan in groups of pieces
against the backend's scan piece after piece and a float64 reference, under Triton's
interpreter on the CPU."""

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


@pytest.mark.parametrize("m", [2, 4])
def test_grouped_scan_equals_the_shipped_scan(m: int) -> None:
    """Groups of ``m`` pieces composed, scanned and expanded (the backend's
    ``penalty_scan_group``) give every output of the scan piece after piece, with ``Q`` far
    from the identity and a piece count that ``m`` does not divide (a short last group)."""
    x = scan.make_inputs(2, 7, 16, 16, seed=4)
    x["u"] *= 8.0
    qm = scan.form_q(x)
    grouped, shipped = scan.scan_grouped(x, qm, m), scan.scan_shipped(x, qm)
    for name in ("sig", "dze", "sig0", "dz0"):
        assert _relative(grouped[name], shipped[name]) < FLOAT32_SCAN, name


def test_planted_slip_in_the_grouped_scan_is_rejected() -> None:
    """Composing a group's ``Q`` in the reverse order (the backend's planted bug) fails the
    float64 comparison."""
    from vla_verify.backends.triton_fused_kernels import Bug

    x = scan.make_inputs(2, 7, 16, 16, seed=4)
    x["u"] *= 8.0
    qm = scan.form_q(x)
    bad = scan.scan_grouped(x, qm, 4, bug=int(Bug.GROUP_ORDER))
    assert _relative(bad["sig0"], scan.scan_float64(x)) > 100 * FLOAT32_SCAN


def test_the_timing_script_checks_every_variant(tmp_path) -> None:
    """The GPU script's loop on the CPU with a stand-in timer: every variant is checked against
    the float64 scan and the shipped kernel (the float32 variants to rounding), and the file is
    written."""
    result = scan.main(str(tmp_path), device="cpu", widths=(16,), bh=1, pieces=5,
                       timer=lambda fn: 0.0)  # fmt: skip
    names = {r["variant"] for r in result["records"]}
    assert {"shipped", "low_rank", "grouped4", "grouped32"} <= names
    for r in result["records"]:
        assert r["sig0_error_vs_float64"] < FLOAT32_SCAN, r
        assert r["sig_error_vs_shipped"] < FLOAT32_SCAN, r
    assert (tmp_path / "penalty_scan_low_rank.json").is_file()
