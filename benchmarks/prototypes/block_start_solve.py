"""The penalty chain's block starts solved by one Triton kernel, prototyped beside the backend's
cuBLAS solve (not a backend; design doc ``docs/design/triton_chunked.md``, "Blocks of the
penalty chain" and "Measured times").

The chunked forward applies the blocks' matrices to ``(A_0; I)`` block after block and gets
every block's ``(Π; Θ)`` (``XX`` ``[NB, B·H, 2d, d]`` float64, :func:`~vla_verify.backends.
triton_chunked.penalty_block_starts` with ``normalise=False``); each start is ``A = Π Θ^{-1}``.
The backend solves all of them with cuBLAS's batched LU (``torch.linalg.solve_ex``), then
symmetrises, transposes and copies the starts into the penalty kernel's float64 scratch
``X = Aᵀ`` ``[B·H, NB, BK, BK]`` (zero-padded to the key tile ``BK``): on an H200 at D = 64 the
LU and its two triangular solves take 0.188 ms of device time at T = 4096 and at 16384 (16
blocks of 16 heads, ``benchmarks/results/h200/forward_breakdown_704b24b.json``), 0.49 ms at
D = 128, T = 16384 on an H100 (``h100/chunk_704b24b.json``), about a fifth of the forward's
device time at D = 64, T = 4096; for the host, six kinds of cuBLAS kernel (the LU's panels, its row
exchanges and a product, two triangular solves, a set-up of pointers) and the symmetrisation's
PyTorch operations.

:func:`block_start_solve_kernel` does it in one launch, one program per start: Gauss–Jordan
elimination with partial pivoting on ``[Θᵀ | Πᵀ]`` (``Θᵀ Aᵀ = Πᵀ``), the row exchanges kept
implicit (each pivot row is marked used and remembers its column), the solution's rows put in
order by one product with the permutation, then ``X = (Z + Zᵀ)/2`` stored in the scratch's
layout.  Each of the ``d`` steps is a few reductions over a ``BK × BK`` float64 tile; about
``3d³`` multiply-adds a start (the elimination's ``2d³`` and the permutation's product) against
about ``4d³/3`` for the LU and its two triangular solves: more arithmetic in one launch, without
the LU's panel steps.  A singular
``Θ`` gives non-finite starts, which the forward's block-end check rejects, as with the LU.

``python benchmarks/prototypes/block_start_solve.py OUT`` (on a GPU) checks the kernel against
the backend's solve on starts built as the forward's are (:func:`make_inputs`), then times both
alone, then the whole forward with each (:func:`forward_side_by_side`), with
``triton.testing.do_bench`` (B·H = 16; D = 64 with 16 and 4 blocks, D = 32 with 16; the
kernel at 4 and 8 warps),
writing ``OUT/block_start_solve.json``; ``--preflight [JSON]`` builds the kernel for sm_90
without a GPU (:func:`preflight`).

Measured on an H100 (``benchmarks/results/h100/block_start_solve_b51cfca.json``): slower than
cuBLAS at D = 64 (0.58 against 0.24 ms for 16 blocks of 16 heads), and the forward with it
slower too (3.48 against 3.09 ms at T = 16384), so the backend keeps the LU.
"""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path
from typing import Any

import torch
import triton
import triton.language as tl

#: Planted slip for the meta-tests: the pivot taken in order (no row exchanges).
BUG_NO_PIVOTING = tl.constexpr(1)


@triton.jit
def block_start_solve_kernel(
    xx_ptr, x_ptr, DK, NBH, BK: tl.constexpr, BUG: tl.constexpr
):  # fmt: skip
    """Grid ``(NB, B·H)``: from ``XX`` ``[NB, B·H, 2·DK, DK]`` (``Π`` over ``Θ``), float64,
    the start ``X = sym(Π Θ^{-1})ᵀ`` ``[B·H, NB, BK, BK]`` float64, zero beyond ``DK``."""
    i_b = tl.program_id(0).to(tl.int64)
    i_bh = tl.program_id(1).to(tl.int64)
    n_b = tl.num_programs(0)
    o_r = tl.arange(0, BK)
    o_c = tl.arange(0, BK)
    m_r = o_r < DK
    m_c = o_c < DK
    base = (i_b * NBH + i_bh) * 2 * DK * DK
    # M = Θᵀ, R = Πᵀ: M[i, j] = Θ[j, i] = XX[DK + j, i]; the padding is the identity in M
    # and zero in R, so that it stays out of the elimination and of the solution.
    m_rc = m_r[:, None] & m_c[None, :]
    M = tl.load(xx_ptr + base + (DK + o_c[None, :]) * DK + o_r[:, None], mask=m_rc, other=0.0)
    M = tl.where(m_rc, M, tl.where(o_r[:, None] == o_c[None, :], 1.0, 0.0))
    R = tl.load(xx_ptr + base + o_c[None, :] * DK + o_r[:, None], mask=m_rc, other=0.0)
    used = o_r < 0
    column = tl.zeros([BK], dtype=tl.int32)
    for k in range(DK):
        col = tl.sum(tl.where(o_c[None, :] == k, M, 0.0), axis=1)
        if BUG == BUG_NO_PIVOTING:
            p = k
        else:
            # The largest remaining entry of column k; used rows and the padding rank below
            # every real row (-1 and -2), so a column of zeros still picks an unused row.
            p = tl.argmax(tl.where(used, -1.0, tl.where(m_r, tl.abs(col), -2.0)), axis=0)
        at_p = o_r == p
        piv = tl.sum(tl.where(at_p, col, 0.0), axis=0)
        m_p = tl.sum(tl.where(at_p[:, None], M, 0.0), axis=0) / piv
        r_p = tl.sum(tl.where(at_p[:, None], R, 0.0), axis=0) / piv
        f = tl.where(at_p, 0.0, col)
        M = tl.where(at_p[:, None], m_p[None, :], M - f[:, None] * m_p[None, :])
        R = tl.where(at_p[:, None], r_p[None, :], R - f[:, None] * r_p[None, :])
        used = used | at_p
        column = tl.where(at_p, k, column)
    # Row p of R holds row column[p] of the solution Z = Aᵀ: Z = P R with P[k, p] = (column[p]
    # == k); the padding rows, never pivots, stay zero.
    P = tl.where((column[None, :] == o_r[:, None]) & used[None, :], 1.0, 0.0).to(tl.float64)
    Z = tl.dot(P, R, input_precision="ieee")
    X = 0.5 * (Z + tl.trans(Z))
    tl.store(x_ptr + ((i_bh * n_b + i_b) * BK + o_r[:, None]) * BK + o_c[None, :], X)


def solve_kernel(XX: torch.Tensor, BK: int, *, bug: int = 0, warps: int = 8) -> torch.Tensor:
    """The starts ``X`` ``[B·H, NB, BK, BK]`` float64 from ``XX`` ``[NB, B·H, 2d, d]`` by
    :func:`block_start_solve_kernel` (``d ≤ BK ≤ 64``: at 128 the two float64 tiles are the
    whole register file of an SM, :func:`preflight`)."""
    NB, BH, _, d = XX.shape
    X = torch.empty(BH, NB, BK, BK, dtype=torch.float64, device=XX.device)
    block_start_solve_kernel[(NB, BH)](
        XX.contiguous(), X, d, BH, BK=BK, BUG=bug, num_warps=warps
    )  # fmt: skip
    return X


def solve_backend(XX: torch.Tensor, BK: int) -> torch.Tensor:
    """The backend's way, as ``penalty_block_starts`` and ``_forward`` run it: cuBLAS's batched
    LU (on a GPU), symmetrised (``_solve_block_starts``), transposed and copied into the
    scratch's layout."""
    from vla_verify.backends.triton_chunked import _solve_block_starts

    d = XX.shape[-1]
    starts = _solve_block_starts(XX)
    if d == BK:
        return starts.mT.to(torch.float64, memory_format=torch.contiguous_format, copy=True)
    X = torch.zeros(*starts.shape[:2], BK, BK, dtype=torch.float64, device=XX.device)
    X[:, :, :d, :d] = starts.mT
    return X


def starts_by_kernel(XX: torch.Tensor) -> torch.Tensor:
    """A stand-in for the backend's ``_solve_block_starts`` (the same inputs and outputs,
    ``[BH, NB, d, d]``), by :func:`block_start_solve_kernel` at 4 warps: the starts are
    symmetric, so the kernel's ``X = Aᵀ`` is ``A``."""
    d = XX.shape[-1]
    BK = max(16, triton.next_power_of_2(d))
    return solve_kernel(XX, BK, warps=4)[:, :, :d, :d]


def make_inputs(
    BH: int, NB: int, d: int, *, seed: int = 0, device: str = "cpu", periods: int = 4,
    eta: float = 0.05, rows: int = 8,
) -> torch.Tensor:  # fmt: skip
    """``XX`` ``[NB, B·H, 2d, d]`` as the forward forms it: ``(Π; Θ)`` from ``(A_0; I)``
    through ``periods`` pieces a block, each ``Θ ← Θ + Uᵀ(U Π)`` for ``rows`` penalties
    ``u ~ N(0, I/d)`` and then the nudge ``Π ← Π + η Θ``; block after block, unnormalised."""
    g = torch.Generator().manual_seed(seed)
    A0 = torch.eye(d, dtype=torch.float64).expand(BH, d, d)
    Pi, Th = A0.clone(), torch.eye(d, dtype=torch.float64).expand(BH, d, d).clone()
    out = []
    for _ in range(NB):
        out.append(torch.cat([Pi, Th], dim=1))
        for _ in range(periods):
            U = torch.randn(BH, rows, d, generator=g, dtype=torch.float64) / d**0.5
            Th = Th + U.mT @ (U @ Pi)
            Pi = Pi + eta * Th
    return torch.stack(out).to(device)


def preflight(out: Path | None = None) -> list[dict[str, Any]]:
    """Build :func:`block_start_solve_kernel` for sm_90 (Triton's own compiler, no GPU) at
    BK = 64 and 128; registers and stack from ``cuobjdump -res-usage``."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import preflight_sm90 as pf

    rows = []
    for BK, warps in ((64, 4), (64, 8), (128, 16), (128, 32)):
        launch = {
            "module": "block_start_solve", "kernel": "block_start_solve_kernel",
            "args": [{"tensor": "float64"}, {"tensor": "float64"}, {"int": BK}, {"int": 16}],
            "kwargs": {"BK": {"int": BK}, "BUG": {"int": 0}, "num_warps": {"int": warps}},
        }  # fmt: skip
        rows.extend(pf.build([launch], {"block_start_solve": types.SimpleNamespace(
            block_start_solve_kernel=block_start_solve_kernel)}))  # fmt: skip
    if out is not None:
        out.write_text(json.dumps({"triton": triton.__version__, "rows": rows}, indent=1))
    return rows


def main(out: Path) -> None:
    """On a GPU: equality with the backend's solve, then both timed side by side."""
    from triton.testing import do_bench

    from vla_verify.bench import machine_info

    res: dict[str, Any] = {"machine": machine_info(), "rows": []}
    for d, NB in ((64, 16), (64, 4), (32, 16)):
        XX = make_inputs(16, NB, d, device="cuda")
        ref = solve_backend(XX, d)
        row: dict[str, Any] = {"d": d, "blocks": NB, "heads": 16,
                               "backend_ms": do_bench(lambda: solve_backend(XX, d))}  # noqa: B023  # fmt: skip
        for warps in (4, 8):
            got = solve_kernel(XX, d, warps=warps)
            row[f"relative_difference_{warps}_warps"] = float((got - ref).abs().max()
                                                               / ref.abs().max())  # fmt: skip
            row[f"kernel_{warps}_warps_ms"] = do_bench(
                lambda: solve_kernel(XX, d, warps=warps)  # noqa: B023
            )
        res["rows"].append(row)
        print(row, flush=True)
    res["forward"] = forward_side_by_side()
    out.mkdir(parents=True, exist_ok=True)
    (out / "block_start_solve.json").write_text(json.dumps(res, indent=1))


def forward_side_by_side(sizes: tuple[tuple[int, int], ...] = ((64, 4096), (64, 16384))) -> list:
    """The chunked forward (B = 1, H = 16, bf16, paper preset) with the backend's solve and
    with :func:`starts_by_kernel` in its place, side by side: medians, the outputs' largest
    relative difference, and the block-start check's fallbacks (none expected)."""
    from triton.testing import do_bench

    from vla_verify.backends import triton_chunked as tc
    from vla_verify.bench import _inputs

    backend_solve = tc._solve_block_starts
    rows = []
    for D, T in sizes:
        x = _inputs(1, T, 16, D, torch.bfloat16, "cuda")
        args = [x[n] for n in "qkvu"]
        row: dict[str, Any] = {"D": D, "T": T}
        outputs = {}
        for name, solve in (("backend", backend_solve), ("kernel", starts_by_kernel)):
            tc._solve_block_starts = solve
            try:
                before = tc.BLOCK_START_FALLBACKS[0]
                outputs[name] = tc.chunked_vla(*args)[0].float()
                row[f"{name}_ms"] = do_bench(lambda: tc.chunked_vla(*args))  # noqa: B023
                torch.cuda.synchronize()
                row[f"{name}_fallbacks"] = tc.BLOCK_START_FALLBACKS[0] - before
            finally:
                tc._solve_block_starts = backend_solve
        ref = outputs["backend"]
        row["o_relative_difference"] = float((outputs["kernel"] - ref).abs().max()
                                             / ref.abs().max())  # fmt: skip
        rows.append(row)
        print(row, flush=True)
    return rows


if __name__ == "__main__":
    if sys.argv[1:2] == ["--preflight"]:
        print(json.dumps(preflight(Path(sys.argv[2]) if len(sys.argv) > 2 else None), indent=1))
    else:
        main(Path(sys.argv[1]))
