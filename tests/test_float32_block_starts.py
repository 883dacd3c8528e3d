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
