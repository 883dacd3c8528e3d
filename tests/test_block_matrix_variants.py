"""``benchmarks/gpu/block_matrix_variants.py``: its check of the blocks' matrices kernel in other
launch shapes against the backend's launch passes on the same arithmetic and rejects a planted
fault (the nudge applied before a piece's steps), under Triton's interpreter."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("triton")
tc = pytest.importorskip("vla_verify.backends.triton_chunked")
pytestmark = [
    pytest.mark.skipif(tc.availability_reason() is not None, reason=str(tc.availability_reason())),
    pytest.mark.skipif(not tc.interpreted(), reason="runs under TRITON_INTERPRET=1"),
]

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks" / "gpu"))

import block_matrix_variants as bmv  # noqa: E402

from vla_verify.backends import triton_chunked_kernels as kernels  # noqa: E402


def test_every_launch_shape_agrees_with_the_backend() -> None:
    rows = bmv.compare(40, 192, "cpu", timing=False)
    assert len(rows) == len(bmv.CANDIDATES[64])
    assert all(r["agrees"] for r in rows)


def test_a_planted_nudge_order_is_rejected() -> None:
    rows = bmv.compare(40, 192, "cpu", timing=False, bug=kernels.BUG_MATRIX_NUDGE_FIRST)
    assert not any(r["agrees"] for r in rows)
    assert min(r["relative_difference"] for r in rows) > 1e3 * bmv.AGREE_RTOL
