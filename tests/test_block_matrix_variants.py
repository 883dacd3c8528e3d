"""``benchmarks/gpu/block_matrix_variants.py``: its check of the blocks' matrices kernel in other
launch shapes against the backend's launch passes on the same arithmetic and rejects a planted
fault (the nudge applied before a piece's steps), in float64 and in float32 (tf32x3), under
Triton's interpreter."""

from __future__ import annotations

from script_support import interpreted_chunked_marks, load_script

pytestmark = interpreted_chunked_marks()
bmv = load_script("benchmarks/gpu/block_matrix_variants.py")

import pytest  # noqa: E402

from vla_verify.backends import triton_chunked_kernels as kernels  # noqa: E402


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_every_launch_shape_agrees_with_the_backend(dtype: str) -> None:
    rows = bmv.compare(40, 192, "cpu", timing=False, dtype=dtype)
    assert len(rows) == len(bmv.CANDIDATES[64])
    assert all(r["agrees"] for r in rows)


@pytest.mark.parametrize(("dtype", "margin"), [("float64", 1e3), ("float32", 10.0)])
def test_a_planted_nudge_order_is_rejected(dtype: str, margin: float) -> None:
    """Rejected with room: in float64 the tolerance is rounding's; in float32 a
    token's rounding per token of the block (64 tokens here), and the fault 14.7 times it."""
    rows = bmv.compare(40, 192, "cpu", timing=False, bug=kernels.BUG_MATRIX_NUDGE_FIRST,
                       dtype=dtype)  # fmt: skip
    assert not any(r["agrees"] for r in rows)
    assert min(r["relative_difference"] / r["tolerance"] for r in rows) > margin
