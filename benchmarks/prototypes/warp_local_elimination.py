"""The penalty chain's pivots alone: the shipped elimination against one that runs inside a
warp, as a micro-benchmark (not a backend; design doc ``docs/design/triton_chunked.md``,
"The forward's floor against fla's `chunk_delta_rule`").

The float32 chain walks a block one chunk of ``P = 16`` tokens after another, and a chunk
takes about 14.5 µs at D = 64 on an H100 (the chain's kernel 0.465 ms for blocks of 32 chunks
at T = 16384, ``benchmarks/results/h100/chunk_30b44f2.json``) where its products would take
about 1.6 µs at a quarter of an SM's tf32 rate.  The design doc infers that the 16 pivots of
the chunk's elimination (``_ldl_solve_clamped`` on ``[I + G | I]``) set it: each pivot
reduces a column of the ``P × P`` tile across the program's warps, five barriers a pivot.
Plain Triton spreads every tile over the program's warps as it chooses; Gluon (Triton's
layout-explicit dialect) lets the kernel choose: with ``BlockedLayout([1, P/2], [16, 2],
[warps, 1], [1, 0])`` one warp covers the whole ``16 × 16`` tile and the other warps hold
copies, so every reduction is a warp's shuffles and no step needs a barrier.  The tile is kept
exactly symmetric (the multipliers from the column and from the row are the same numbers), so
the update needs no layout conversion.

One program per chain of ``N`` dependent eliminations (each matrix ``I + G_i`` nudged by a
negligible function of the previous result, so the eliminations cannot overlap), in six
variants (:func:`variants`):

- ``triton``: :func:`elimination_triton_kernel`, the backend's ``_ldl_solve_clamped`` as the
  chain calls it, on a loaded tile;
- ``triton_from_dot``: the same on ``G = U Uᵀ`` formed by the chain's tf32x3 product, so the
  tile comes in the tensor cores' layout as in the chain;
- ``triton_as_chain``: besides, ``L^{-1}`` feeds a tf32x3 product ``L^{-1} U`` (``16 × 64``)
  as in the chain: its build is the chain's loop;
- ``triton_as_chain_through_memory``: the same with ``L^{-1}`` stored and loaded back before
  that product;
- ``gluon``: the same steps in the warp-local layout, on a loaded tile;
- ``gluon_from_dot``: the same on ``G = U Uᵀ`` formed by tf32x3 ``mma_v2`` products and
  converted into the warp-local layout once an elimination (through shared memory: the barriers
  a chain kernel in Gluon would pay once a chunk, not once a pivot).

``python benchmarks/prototypes/warp_local_elimination.py OUT.json`` (on a GPU, Triton 3.6):
each against :func:`reference` (float64 LDLᵀ) on the chain's last matrix, within
:func:`tolerance`; then ``triton.testing.do_bench`` of each at 528 programs (four 2-warp
programs on each of 132 SMs, as the float32 chain runs at D = 64, T = 16384) and at 16, in
µs per elimination.  ``--preflight JSON`` builds them for sm_90 without a GPU and reads each
one's pivots' loop in its SASS (:func:`pivot_loop`), registers and stack.

What the builds say (Triton 3.6, ``benchmarks/results/sm90/preflight_warp_local_elimination.json``;
instructions / barriers / shuffles a pivot): ``triton`` 121 / 8 / 20, ``triton_from_dot``
127 / 0 / 23, ``triton_as_chain`` and ``..._through_memory`` 98 / 5 / 14, the shipped chain's
own loop 99 / 5 / 14 (``benchmarks/chain_instruction_counts.py``, the float32 chain at D = 64,
2 warps), ``gluon`` and ``gluon_from_dot`` 245 / 0 / 69.  What decides it is how Triton spreads
the product ``G`` over the warps (its TTGIR's MMA layout, ``mma_warps_per_cta`` in the rows):
alone, ``G``'s ``16 × 16`` tile goes to both warps whole (``warpsPerCTA = [2, 1]``, the second
warp a copy), and the pivots' reductions stay inside a warp; beside a ``16 × 64`` product that
shares an operand (Triton gives a product connected through operands and results to one it
has already placed that one's layout) the warps split its columns (``[1, 2]``), and every pivot's
column crosses them.  So plain Triton runs the pivots without a barrier where ``G``'s product
keeps both warps on all its rows, for 29 more instructions a pivot; the warp-local Gluon form
removes the barriers for two and a half times the instructions (each thread holds 8 of the
tile's 256 entries instead of 4, and reduces the row as well as the column).  Where a chunk's
time follows its instruction count, as ``chain_instruction_counts.py`` takes it to, neither is
faster; only a timing says which costs more on the chain's path, the barriers or the
instructions.  If ``triton_from_dot`` beats
``triton_as_chain`` by much, the chain's ``G`` should be formed with both warps on all its
rows (in Gluon, where each product's layout is chosen, or by a conversion once a chunk); if
``gluon`` does, a penalty chain written in Gluon (its products through ``mma_v2``, the tile
converted into the warp-local layout once a chunk) is worth building.  Not yet run on a GPU.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

import numpy as np
import triton
import triton.language as tl

from vla_verify.backends.triton_chunked_kernels import (
    _ldl_solve_clamped,
    _tf32_split,
    _tf32x3_dot,
)

#: The chain's penalty chunk (``DEFAULT_PENALTY_CHUNK``) and the float32 chain's warps at D = 64.
P = 16
WARPS = 2
#: The pivots' clamp (``VLAConfig.sm_floor``'s default); the test matrices never reach it.
FLOOR = 1e-6
#: Planted slip (meta-tests): the row eliminated with the unsolved row ``j`` of ``[I + G | I]``
#: (the backend's ``BUG_ELIMINATION_UNSOLVED_ROW``).
BUG_UNSOLVED_ROW = 7


@triton.jit
def elimination_triton_kernel(g_ptr, u_ptr, w_ptr, d_ptr, N, floor, C: tl.constexpr,
                              FROM_DOT: tl.constexpr, BUG: tl.constexpr):  # fmt: skip
    """``N`` dependent eliminations of ``I + G_i`` (``g`` ``[programs, N, C, C]`` float32) by the
    backend's ``_ldl_solve_clamped`` on ``[I + G | I]``; stores the last ``L^{-1}`` (``w``
    ``[programs, C, C]``) and pivots (``d`` ``[programs, C]``).  ``FROM_DOT``: ``G_i = U_i U_iᵀ``
    formed from ``u`` ``[programs, N, C, 64]`` by the chain's tf32x3 product, so that the tile
    comes in the tensor cores' layout as in the chain (the loaded ``g`` unused); 2: besides,
    ``L^{-1}`` feeds a tf32x3 product ``L^{-1} U`` as in the chain."""
    pid = tl.program_id(0)
    o = tl.arange(0, C)
    ok = tl.arange(0, 64)
    offs = o[:, None] * C + o[None, :]
    eye = tl.where(o[:, None] == o[None, :], 1.0, 0.0)
    dep = floor * 0.0
    W = eye
    d = tl.full([C], 1.0, tl.float32)
    for i in range(N):
        if FROM_DOT:
            U = tl.load(u_ptr + (pid.to(tl.int64) * N + i) * C * 64 + o[:, None] * 64 + ok[None, :])
            Uh, Ul = _tf32_split(U)
            G = _tf32x3_dot(Uh, Ul, tl.trans(Uh), tl.trans(Ul), tl.zeros([C, C], tl.float32),
                            False)  # fmt: skip
        else:
            G = tl.load(g_ptr + (pid.to(tl.int64) * N + i) * C * C + offs)
        W, d, _ = _ldl_solve_clamped(eye + G + dep, eye, o, o, floor, C, BUG)
        if FROM_DOT >= 2:
            # W feeds a tf32x3 product, as L^{-1} does in the chain (W = L^{-1} Y): the
            # product's operand layout then reaches back into the elimination's loop.
            Wp = W
            if FROM_DOT == 3:
                # Through memory: the product reads W from a store (its own layout), and the
                # loop keeps the layout of the product that formed G.
                tl.store(w_ptr + pid * C * C + offs, W)
                tl.debug_barrier()
                Wp = tl.load(w_ptr + pid * C * C + offs)
            Wh, Wl = _tf32_split(Wp)
            Z = _tf32x3_dot(Wh, Wl, Uh, Ul, tl.zeros([C, 64], tl.float32), False)
            dep = tl.sum(tl.sum(Z, axis=1), axis=0) * 1e-30
        else:
            dep = tl.sum(tl.sum(W, axis=1), axis=0) * 1e-30
    tl.store(w_ptr + pid * C * C + offs, W)
    tl.store(d_ptr + pid * C + o, d)


def _gluon_kernel() -> Any:
    """The Gluon kernel, defined where Gluon is importable (Triton 3.6 or later)."""
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.ampere import mma_v2

    @gluon.jit
    def _split(x):
        """``_tf32_split`` in Gluon: ``x = hi + lo``, ``hi`` rounded to tf32."""
        bits = x.to(gl.uint32, bitcast=True)
        hi = ((bits + 0x1000) & 0xFFFFE000).to(gl.float32, bitcast=True)
        return hi, x - hi

    @gluon.jit
    def elimination_gluon_kernel(g_ptr, u_ptr, w_ptr, d_ptr, N, floor, C: gl.constexpr,
                                 NW: gl.constexpr, FROM_DOT: gl.constexpr,
                                 BUG: gl.constexpr):  # fmt: skip
        """As :func:`elimination_triton_kernel`, every warp holding the whole tile.
        ``FROM_DOT``: ``G = U Uᵀ`` by tf32x3 ``mma_v2`` products, converted into the warp-local
        layout once (its upper triangle from the transpose of its lower, so the tile is
        exactly symmetric), as a chain kernel in Gluon would take it."""
        L: gl.constexpr = gl.BlockedLayout([1, C // 2], [16, 2], [NW, 1], [1, 0])
        MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[1, NW],
                                                      instr_shape=[16, 8])  # fmt: skip
        A_OP: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=MMA, k_width=1)
        B_OP: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=MMA, k_width=1)
        LU: gl.constexpr = gl.BlockedLayout([1, 4], [2, 16], [NW, 1], [1, 0])  # U [C, 64]
        LUT: gl.constexpr = gl.BlockedLayout([4, 1], [16, 2], [1, NW], [0, 1])  # Uᵀ [64, C]
        rows = gl.arange(0, C, layout=gl.SliceLayout(1, L))
        cols = gl.arange(0, C, layout=gl.SliceLayout(0, L))
        ur = gl.arange(0, C, layout=gl.SliceLayout(1, LU))
        uk = gl.arange(0, 64, layout=gl.SliceLayout(0, LU))
        tk = gl.arange(0, 64, layout=gl.SliceLayout(1, LUT))
        tc = gl.arange(0, C, layout=gl.SliceLayout(0, LUT))
        pid = gl.program_id(0)
        offs = rows[:, None] * C + cols[None, :]
        eye = gl.where(rows[:, None] == cols[None, :], 1.0, 0.0)
        dep = floor * 0.0
        Y = eye
        d = gl.full([C], 1.0, gl.float32, gl.SliceLayout(1, L))
        for i in range(N):
            if FROM_DOT:
                ub = u_ptr + (pid.to(gl.int64) * N + i) * C * 64
                U = gl.load(ub + ur[:, None] * 64 + uk[None, :])
                UT = gl.load(ub + tc[None, :] * 64 + tk[:, None])
                Uh, Ul = _split(U)
                Th, Tl = _split(UT)
                acc = gl.zeros([C, C], gl.float32, MMA)
                acc = mma_v2(gl.convert_layout(Ul, A_OP), gl.convert_layout(Th, B_OP), acc,
                             input_precision="tf32")  # fmt: skip
                acc = mma_v2(gl.convert_layout(Uh, A_OP), gl.convert_layout(Tl, B_OP), acc,
                             input_precision="tf32")  # fmt: skip
                acc = mma_v2(gl.convert_layout(Uh, A_OP), gl.convert_layout(Th, B_OP), acc,
                             input_precision="tf32")  # fmt: skip
                G = gl.convert_layout(acc, L)
                GT = gl.convert_layout(gl.permute(acc, [1, 0]), L)
                G = gl.where(rows[:, None] >= cols[None, :], G, GT)
            else:
                G = gl.load(g_ptr + (pid.to(gl.int64) * N + i) * C * C + offs)
            M = eye + G + dep
            Y = eye
            Y0 = eye
            for j in range(C):
                col = gl.sum(gl.where(cols[None, :] == j, M, 0.0), axis=1)
                row = gl.sum(gl.where(rows[:, None] == j, M, 0.0), axis=0)
                if BUG == 7:
                    yj = gl.sum(gl.where(rows[:, None] == j, Y0, 0.0), axis=0)
                else:
                    yj = gl.sum(gl.where(rows[:, None] == j, Y, 0.0), axis=0)
                raw = gl.sum(gl.where(rows == j, col, 0.0), axis=0)
                piv = gl.maximum(raw, floor)
                r = 1.0 / piv
                lcol = gl.where(rows > j, col * r, 0.0)
                lrow = gl.where(cols > j, row * r, 0.0)
                d = gl.where(rows == j, piv, d)
                M = M - piv * (lcol[:, None] * lrow[None, :])
                Y = Y - lcol[:, None] * yj[None, :]
            dep = gl.sum(gl.sum(Y, axis=1), axis=0) * 1e-30
        gl.store(w_ptr + pid * C * C + offs, Y)
        gl.store(d_ptr + pid * C + rows, d)

    return elimination_gluon_kernel


def make_inputs(programs: int, N: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``U_i`` ``[P, 64]`` with rows of norm about 1/√2 (the layer's penalties meet a penalty
    ``A`` near the identity) and ``G_i = U_i U_iᵀ``: ``[programs, N, P, 64]`` and
    ``[programs, N, P, P]`` float32, ``G`` exactly symmetric, ``I + G`` well conditioned."""
    rng = np.random.default_rng(seed)
    U = rng.standard_normal((programs, N, P, 64)).astype(np.float32) / np.float32(np.sqrt(128))
    G = U.astype(np.float64) @ np.swapaxes(U, -1, -2).astype(np.float64)
    return U, ((G + np.swapaxes(G, -1, -2)) / 2).astype(np.float32)


def reference(G: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``L^{-1}`` and ``d`` of ``I + G = L D Lᵀ`` in float64 (``G`` ``[..., P, P]``)."""
    M = np.eye(G.shape[-1]) + G.astype(np.float64)
    C = np.linalg.cholesky(M)
    d = np.diagonal(C, axis1=-2, axis2=-1) ** 2
    Lm = C / np.sqrt(d)[..., None, :]
    return np.linalg.inv(Lm), d


def tolerance(G: np.ndarray) -> float:
    """Largest relative error (to the largest entry) that a float32 elimination of ``I + G``
    may reach: ``P`` steps of rounding ``2^-24`` each, amplified by ``cond(I + G)``."""
    cond = float(np.max(np.linalg.cond(np.eye(G.shape[-1]) + G.astype(np.float64))))
    return 4 * P * cond * 2.0**-24


def check(W: np.ndarray, d: np.ndarray, G_last: np.ndarray) -> float:
    """The worst of ``W`` and ``d`` against :func:`reference`, relative to the largest entry,
    over the tolerance (at most 1 passes)."""
    W_ref, d_ref = reference(G_last)
    err_w = np.max(np.abs(W - W_ref)) / np.max(np.abs(W_ref))
    err_d = np.max(np.abs(d - d_ref)) / np.max(np.abs(d_ref))
    return float(max(err_w, err_d) / tolerance(G_last))


def run(kernel: Any, g: Any, u: Any, N: int, bug: int = 0, gluon: bool = False,
        from_dot: int = 0) -> tuple[Any, Any]:  # fmt: skip
    """One launch over ``g`` ``[programs, N, P, P]`` and ``u`` ``[programs, N, P, 64]`` (torch
    tensors); ``(W, d)``."""
    import torch

    programs = g.shape[0]
    w = torch.empty(programs, P, P, dtype=torch.float32, device=g.device)
    d = torch.empty(programs, P, dtype=torch.float32, device=g.device)
    if gluon:
        kernel[(programs,)](g, u, w, d, N, FLOOR, C=P, NW=WARPS, FROM_DOT=from_dot, BUG=bug,
                            num_warps=WARPS)  # fmt: skip
    else:
        kernel[(programs,)](g, u, w, d, N, FLOOR, C=P, FROM_DOT=from_dot, BUG=bug,
                            num_warps=WARPS)  # fmt: skip
    return w, d


def variants() -> list[tuple[str, Any, dict[str, Any]]]:
    """(name, kernel, :func:`run`'s flags): the shipped elimination and the warp-local one,
    each on a loaded tile and on a tile from a tf32x3 product (module docstring)."""
    gluon = _gluon_kernel()
    return [("triton", elimination_triton_kernel, {}),
            ("triton_from_dot", elimination_triton_kernel, {"from_dot": 1}),
            ("triton_as_chain", elimination_triton_kernel, {"from_dot": 2}),
            ("triton_as_chain_through_memory", elimination_triton_kernel, {"from_dot": 3}),
            ("gluon", gluon, {"gluon": True}),
            ("gluon_from_dot", gluon, {"gluon": True, "from_dot": 1})]  # fmt: skip


def measure(out: Path) -> None:
    import torch

    from vla_verify.bench import machine_info, time_ms

    result: dict[str, Any] = {"machine": machine_info(), "checks": {}, "times": []}
    table = variants()  # once: each call defines the Gluon kernel afresh
    U, G = make_inputs(8, 4)
    u, g = torch.from_numpy(U).cuda(), torch.from_numpy(G).cuda()
    for name, kernel, flags in table:
        w, d = run(kernel, g, u, 4, **flags)
        result["checks"][name] = max(check(w[p].cpu().numpy(), d[p].cpu().numpy(), G[p, -1])
                                     for p in range(8))  # fmt: skip
    out.write_text(json.dumps(result, indent=1))
    if max(result["checks"].values()) > 1:
        raise SystemExit(f"an elimination misses the reference: {result['checks']}")
    N = 256
    for programs in (528, 16):
        U, G = make_inputs(programs, N, seed=1)
        u, g = torch.from_numpy(U).cuda(), torch.from_numpy(G).cuda()
        row: dict[str, Any] = {"programs": programs, "N": N}
        for _ in range(2):
            for name, kernel, flags in table:
                ms = time_ms(lambda k=kernel, f=flags, g=g, u=u: run(k, g, u, N, **f))
                row.setdefault(f"{name}_us_per_elimination", []).append(ms * 1e3 / N)
        result["times"].append(row)
        print(json.dumps(row), flush=True)
        out.write_text(json.dumps(result, indent=1))


def pivot_loop(sass: str) -> dict[str, int]:
    """The innermost loop of at least four instructions in ``nvdisasm -c`` output (the pivots'
    loop: the eliminations' loop holds it): its instructions, barriers (``BAR``) and shuffles
    (``SHFL``) per trip."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from chain_instruction_counts import sass_loops

    seq, loops = sass_loops(sass)
    lo, hi = min((r for r in loops if r[1] - r[0] >= 3), key=lambda r: r[1] - r[0])
    body = [ins for _, ins in seq[lo : hi + 1]]
    return {"instructions": len(body), "bar": sum(" BAR" in f" {x}" for x in body),
            "shfl": sum("SHFL" in x for x in body)}  # fmt: skip


def preflight(out: Path | None) -> list[dict[str, Any]]:
    """Every variant built for sm_90 (no GPU): its pivots' loop (:func:`pivot_loop`), registers
    and stack."""
    import subprocess
    import tempfile

    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.experimental.gluon._runtime import GluonASTSource

    rows = []
    tools = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
    sig = {"g_ptr": "*fp32", "u_ptr": "*fp32", "w_ptr": "*fp32", "d_ptr": "*fp32", "N": "i32",
           "floor": "fp32", "C": "constexpr", "BUG": "constexpr"}  # fmt: skip
    for name, fn, flags in variants():
        extra: dict[str, Any] = {"FROM_DOT": int(flags.get("from_dot", 0))}
        if flags.get("gluon"):
            extra["NW"] = WARPS
        signature = dict(sig, **{k: "constexpr" for k in extra})
        # Gluon's source sets the module's warps before its layouts are verified.
        kind = GluonASTSource if flags.get("gluon") else ASTSource
        source = kind(fn=fn, signature=signature, constexprs={"C": P, "BUG": 0, **extra})
        compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32),
                                  options={"num_warps": WARPS})  # fmt: skip
        with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
            f.write(compiled.asm["cubin"])
            f.flush()
            sass = subprocess.run([str(tools / "nvdisasm"), "-c", f.name], capture_output=True,
                                  text=True, check=True).stdout  # fmt: skip
            usage = subprocess.run([str(tools / "cuobjdump"), "-res-usage", f.name],
                                   capture_output=True, text=True).stdout  # fmt: skip
        row: dict[str, Any] = {"kernel": name, "num_warps": WARPS, "pivot_loop": pivot_loop(sass)}
        # How the tensor cores' tiles are spread over the warps (TTGIR's MMA layouts).
        row["mma_warps_per_cta"] = sorted(set(re.findall(
            r"nvidia_mma<\{[^}]*warpsPerCTA = \[(\d+, \d+)\]", compiled.asm["ttgir"])))  # fmt: skip
        for field in ("REG", "STACK"):
            m = re.search(rf"{field}:(\d+)", usage)
            row[field.lower()] = int(m.group(1)) if m else None
        rows.append(row)
        print(json.dumps(row), flush=True)
    if out is not None:
        out.write_text(json.dumps({"triton": triton.__version__, "target": "cuda sm_90",
                                   "rows": rows}, indent=1))  # fmt: skip
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path, nargs="?")
    ap.add_argument("--preflight", type=Path, nargs="?", const=Path("-"), default=None)
    a = ap.parse_args()
    if a.preflight is not None:
        preflight(None if str(a.preflight) == "-" else a.preflight)
        return
    if a.out is None:
        sys.exit("give OUT.json (on a GPU) or --preflight [JSON]")
    measure(a.out)


if __name__ == "__main__":
    main()
