"""``benchmarks/chain_instruction_counts.py``: the count of a chunk's instructions on a known
listing, each inner loop weighted by its trip count."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from chain_instruction_counts import per_chunk

_SOURCE = [
    "@triton.jit",  # 1
    "def _ldl_solve_clamped(M, Y, rows, cols, floor, C, BUG):",  # 2
    "    for j in range(C):",  # 3
    "        pass",  # 4
    "@triton.jit",  # 5
    "def unit_lower_inverse(N, rows, cols, C):",  # 6
    "    for i in range(1, C):",  # 7
    "        pass",  # 8
    "@triton.jit",  # 9
    "def penalty_chain_kernel(k_ptr):",  # 10
    "    for c in range(c_first, c_last):",  # 11
    "        pass",  # 12
]


def _listing(inner_line: int) -> str:
    """A chunk loop (lines 11-12) of three instructions around an inner loop of five, whose
    instructions come from ``inner_line`` (its first one from the line before the loop)."""
    f = '\t//## File "/x/triton_chunked_kernels.py", line {}'
    return "\n".join([
        f.format(10), "        /*0000*/                   MOV R1, c[0x0][0x28] ;",
        ".L_x_0:",
        f.format(11), "        /*0010*/                   FADD R2, R2, R3 ;",
        ".L_x_1:",
        "        /*0020*/                   MOV R9, R2 ;",
        f.format(inner_line),
        "        /*0030*/                   FADD R4, R4, R5 ;",
        "        /*0040*/                   SHFL.BFLY PT, R6, R4, 0x1, 0x1f ;",
        "        /*0050*/                   FFMA R4, R4, R6, R4 ;",
        "        /*0060*/              @P0  BRA `(.L_x_1) ;",
        f.format(12), "        /*0070*/                   STG.E [R8], R2 ;",
        "        /*0080*/              @P1  BRA `(.L_x_0) ;",
        "        /*0090*/                   EXIT ;",
    ])  # fmt: skip


def test_inner_loops_count_once_per_trip() -> None:
    row = per_chunk(_listing(4), _SOURCE, cp=16)
    assert row["inner_loops"] == [
        {"function": "_ldl_solve_clamped", "instructions": 5, "trips": 16, "bar": 0, "shfl": 1}
    ]
    assert row["per_chunk"] == 3 + 5 * 16
    assert row["by_opcode"]["SHFL"] == 16
    assert row["by_opcode"]["STG"] == 1


def test_an_inner_loops_barriers_are_counted_per_trip() -> None:
    listing = _listing(4).replace("FFMA R4, R4, R6, R4", "BAR.SYNC.DEFER_BLOCKING 0x0")
    row = per_chunk(listing, _SOURCE, cp=16)
    assert row["inner_loops"][0]["bar"] == 1
    assert row["by_opcode"]["BAR"] == 16


def test_the_inverse_runs_one_step_fewer() -> None:
    row = per_chunk(_listing(8), _SOURCE, cp=16)
    assert row["per_chunk"] == 3 + 5 * 15


def test_a_loop_of_unknown_trips_is_refused() -> None:
    with pytest.raises(ValueError, match="penalty_chain_kernel"):
        per_chunk(_listing(12), _SOURCE, cp=16)
