"""The float32 block-starts prototype (``benchmarks/prototypes/float32_block_starts.py``): its
float64 walk of the blocks' matrices gives the recurrence's starts (a known answer, and the
backend's own ``penalty_block_starts``), its float32 walk rounds in float32, and the error it
reports can fail: matrices without their nudges give starts far off."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks" / "prototypes"))
import float32_block_starts as fbs

# Blocks of 70 tokens and nudges every 20: the blocks start at four phases of the clock.
WALK = dict(period=20, eta=1e-3, block=70)


def _layer(T: int, dk: int) -> np.ndarray:
    return fbs.penalties("layer", T, dk, np.random.default_rng(3))


def test_the_float64_walk_gives_the_recurrences_starts() -> None:
    u = _layer(420, 8)
    A0 = np.eye(8) / 0.1
    ref = fbs.recurrence_starts(u, A0, **WALK)
    got = fbs.products_only_starts(fbs.block_matrices(u, dtype=np.float64, **WALK), A0,
                                   np.float64)  # fmt: skip
    assert len(got) == len(ref) == 5
    assert fbs.start_error(got, ref) < 1e-12


def test_the_float64_walk_is_the_backends() -> None:
    torch = pytest.importorskip("torch")
    tc = pytest.importorskip("vla_verify.backends.triton_chunked")
    u = _layer(420, 8)
    A0 = np.eye(8) / 0.1
    mine = fbs.products_only_starts(fbs.block_matrices(u, dtype=np.float64, **WALK), A0,
                                    np.float64)  # fmt: skip
    theirs = tc.penalty_block_starts(
        torch.tensor(u)[None], torch.tensor(A0)[None], start=0, nudge_period=20,
        nudge_eta=1e-3, block=70, normalise=False,
    )[0, 1:].numpy()  # fmt: skip
    assert fbs.start_error(mine, list(theirs)) < 1e-12


def test_the_float32_walk_rounds_in_float32() -> None:
    u = _layer(420, 8)
    A0 = np.eye(8) / 0.1
    ref = fbs.recurrence_starts(u, A0, **WALK)
    err = fbs.start_error(
        fbs.products_only_starts(fbs.block_matrices(u, dtype=np.float32, **WALK), A0,
                                 np.float32), ref)  # fmt: skip
    # float32's unit roundoff is 6e-8: its starts err above float64's and within a few
    # thousand roundings.
    assert 1e-9 < err < 1e-4


def test_matrices_without_their_nudges_are_rejected() -> None:
    row = fbs.study(420, 8, 70, "layer")
    assert row["float64"] < 1e-12
    assert row["planted_no_nudges"] > 1e-3


def test_tf32_rounding_keeps_ten_mantissa_bits_to_nearest() -> None:
    """The emulated tf32 rounding keeps 10 mantissa bits, to nearest with ties away from zero:
    1 + 2^-11 (a tie) rounds up to 1 + 2^-10, 1 + 2^-12 down to 1, and a float32 with 23
    mantissa bits differs from its rounding by at most 2^-11 relative."""
    x = np.array([1 + 2.0**-11, 1 + 2.0**-12, -(1 + 2.0**-11)], dtype=np.float32)
    assert fbs._tf32(x).tolist() == [1 + 2.0**-10, 1.0, -(1 + 2.0**-10)]
    y = np.random.default_rng(0).standard_normal(1000).astype(np.float32)
    assert np.max(np.abs(fbs._tf32(y) - y) / np.abs(y)) <= 2.0**-11


def test_tf32x3_products_and_matrices_round_near_float32() -> None:
    """tf32x3 products err by a few float32 roundings where one tf32 product errs by about
    2^-11; the float32 chain's tf32x3 matrices, applied in float64, give starts within its
    check's tolerance (``block · 2^-24``), and without their nudges far outside it."""
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((32, 64)), rng.standard_normal((64, 32))
    exact = a @ b
    err3 = np.abs(fbs.tf32x3_dot(a, b) - exact).max() / np.abs(exact).max()
    err1 = np.abs(fbs._tf32(a) @ fbs._tf32(b) - exact).max() / np.abs(exact).max()
    assert err3 < 1e-6 < 1e-4 < err1
    u = fbs._bf16(_layer(420, 8))
    A0 = np.eye(8) / 0.1
    ref = fbs.recurrence_starts(u, A0, **WALK)
    m = fbs.tf32x3_block_matrices(u, u_exact=True, **WALK)
    err = fbs.start_error(fbs.products_only_starts(m, A0, np.float64), ref)
    tol = WALK["block"] * 2.0**-24
    assert 1e-12 < err < tol
    planted = fbs.block_matrices(u, dtype=np.float64, nudges=False, **WALK)
    assert fbs.start_error(fbs.products_only_starts(planted, A0, np.float64), ref) > 100 * tol


def test_a_truncating_accumulator_is_biased_toward_zero() -> None:
    """The model of a truncating accumulator (``tf32x3_dot_into``) takes a bias where small
    terms are added to a large sum, one rounding toward zero each: 1000 terms of about 2^-20
    (tf32 numbers) added to 1 fall short of the exact sum by about half a float32 unit each,
    where rounding each sum to nearest errs like a random walk."""
    rng = np.random.default_rng(0)
    acc = np.ones((1, 1), np.float32)
    nearest = np.ones((1, 1), np.float32)
    exact = 1.0
    for _ in range(1000):
        b = fbs._tf32(np.full((1, 1), rng.uniform(1, 2) * 2.0**-20))
        acc = fbs.tf32x3_dot_into(acc, np.ones((1, 1)), b, a_exact=True)
        nearest = nearest + fbs.tf32x3_dot(np.ones((1, 1)), b, a_exact=True)
        exact += float(b[0, 0])
    ulp = 2.0**-23
    assert (exact - float(acc[0, 0])) / ulp > 300
    assert abs(exact - float(nearest[0, 0])) / ulp < 60
