"""``benchmarks/gpu/block_matrix_variants.py``: its check of the blocks' matrices kernel in other
launch shapes against the backend's launch passes on the same arithmetic and rejects a planted
fault (the nudge applied before a piece's steps), under Triton's interpreter."""

from __future__ import annotations

from script_support import interpreted_chunked_marks, load_script

pytestmark = interpreted_chunked_marks()
bmv = load_script("benchmarks/gpu/block_matrix_variants.py")

from vla_verify.backends import triton_chunked_kernels as kernels  # noqa: E402


def test_every_launch_shape_agrees_with_the_backend() -> None:
    rows = bmv.compare(40, 192, "cpu", timing=False)
    assert len(rows) == len(bmv.CANDIDATES[64])
    assert all(r["agrees"] for r in rows)


def test_a_planted_nudge_order_is_rejected() -> None:
    rows = bmv.compare(40, 192, "cpu", timing=False, bug=kernels.BUG_MATRIX_NUDGE_FIRST)
    assert not any(r["agrees"] for r in rows)
    assert min(r["relative_difference"] for r in rows) > 1e3 * bmv.AGREE_RTOL
