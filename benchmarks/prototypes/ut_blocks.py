"""Prototype: the UT transform of the chunked forward by 16-row blocks, against the shipped
:func:`vla_verify.backends.triton_chunked_kernels.state_prep_kernel`.

The shipped kernel inverts ``I + N`` (``N = stril(K̂ Âᵀ)``, ``C × C``) by forward substitution,
``C`` dependent steps, each a reduction over the ``C × C`` tile; at D = 64, T = 16384, B·H = 16
it took 0.80 ms of the forward's 4.56 ms of device time on the H200
(``benchmarks/results/h200/forward_block_matrices.json``).  ``state_prep_blocks_kernel`` (same
arguments, same outputs) inverts each 16 × 16 diagonal block by forward substitution and the
blocks below by ``T_ij = −T_ii Σ_{j≤m<i} N_im T_mj`` in float32 (``ieee``) products: 16
dependent steps over 16 × 16 tiles, as flash-linear-attention's ``solve_tril`` does; ``K̃`` and
``Ṽ`` then take ``PREC`` products block by block.  It moves into the package when it is
measured faster:

    python benchmarks/prototypes/ut_blocks.py            # on a GPU: agreement, then both timed

``tests/test_ut_blocks.py`` checks it against the shipped kernel in the interpreter.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path
from typing import Any

import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from vla_verify.backends.triton_chunked_kernels import (
    state_prep_kernel,
    unit_lower_inverse,
)


@triton.jit
def _prep_rows(k_ptr, v_ptr, gate_ptr, bh, b, h, T, s_t, s_h, sv_t, sv_h, DK, DV, norm_eps,
               row0, TP, BK: tl.constexpr, BV: tl.constexpr):  # fmt: skip
    """``K̂, Â, V`` of the 16 tokens from ``row0`` (zero past ``T``), float32."""
    ot = tl.arange(0, 16)
    ok = tl.arange(0, BK)
    ov = tl.arange(0, BV)
    tok = row0 + ot
    tmask = tok < T
    mk = tmask[:, None] & (ok[None, :] < DK)
    K = tl.load(k_ptr + b * T * s_t + h * s_h + tok[:, None] * s_t + ok[None, :], mask=mk,
                other=0.0).to(tl.float32)  # fmt: skip
    rk = 1.0 / tl.maximum(tl.sqrt_rn(tl.sum(K * K, axis=1)), norm_eps)
    Kh = K * rk[:, None]
    mv = tmask[:, None] & (ov[None, :] < DV)
    V = tl.load(v_ptr + b * T * sv_t + h * sv_h + tok[:, None] * sv_t + ov[None, :], mask=mv,
                other=0.0).to(tl.float32)  # fmt: skip
    Ag = tl.load(gate_ptr + bh * TP * BK + tok[:, None] * BK + ok[None, :], mask=mk, other=0.0)
    return Kh, Ag, V


@triton.jit
def _diagonal_inverse(Kh, Ag, PREC: tl.constexpr):
    """``(I + N)^{-1}`` of one 16 × 16 diagonal block, ``N = stril(K̂ Âᵀ)``."""
    o = tl.arange(0, 16)
    N = tl.dot(Kh, tl.trans(Ag), input_precision=PREC)
    return unit_lower_inverse(tl.where(o[:, None] > o[None, :], N, 0.0), o, o, 16)


@triton.jit
def _off(Kh_i, Ag_j, PREC: tl.constexpr):
    """``N_ij = K̂_i Â_jᵀ`` of a block below the diagonal (``i > j``)."""
    return tl.dot(Kh_i, tl.trans(Ag_j), input_precision=PREC)


@triton.jit
def _mm(a, b):
    """A 16 × 16 product of the inverse's blocks in float32 (``ieee``), so that they stay as
    exact as the diagonal blocks' forward substitution, whatever ``PREC``."""
    return tl.dot(a, b, input_precision="ieee")


@triton.jit
def _store_rows(kt_ptr, vt_ptr, Kt, Vt, bh, row0, TP, BK: tl.constexpr, BV: tl.constexpr):
    ot = tl.arange(0, 16)
    ok = tl.arange(0, BK)
    ov = tl.arange(0, BV)
    tok = row0 + ot
    tl.store(kt_ptr + bh * TP * BK + tok[:, None] * BK + ok[None, :], Kt)
    tl.store(vt_ptr + bh * TP * BV + tok[:, None] * BV + ov[None, :], Vt)


@triton.jit
def state_prep_blocks_kernel(
    k_ptr, v_ptr, gate_ptr, kt_ptr, vt_ptr, params_ptr, T, H, s_t, s_h, sv_t, sv_h, DK, DV,
    BK: tl.constexpr, BV: tl.constexpr, C: tl.constexpr, TP, PREC: tl.constexpr,
    BUG: tl.constexpr = 0,
):  # fmt: skip
    """:func:`state_prep_kernel` (the same arguments and outputs) by 16-row blocks, for chunks
    of ``C`` ∈ {16, 32, 64} tokens.  ``BUG = 1`` (a planted slip for the test): ``T_20``
    without its ``N_21 T_10`` term."""
    c = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    norm_eps = tl.load(params_ptr + 4).to(tl.float32)
    r0 = c * C
    K0, A0, V0 = _prep_rows(k_ptr, v_ptr, gate_ptr, bh, b, h, T, s_t, s_h, sv_t, sv_h, DK, DV,
                            norm_eps, r0, TP, BK, BV)  # fmt: skip
    T00 = _diagonal_inverse(K0, A0, PREC)
    _store_rows(kt_ptr, vt_ptr, tl.dot(T00, K0, input_precision=PREC),
                tl.dot(T00, V0, input_precision=PREC), bh, r0, TP, BK, BV)  # fmt: skip
    if C >= 32:
        K1, A1, V1 = _prep_rows(k_ptr, v_ptr, gate_ptr, bh, b, h, T, s_t, s_h, sv_t, sv_h, DK,
                                DV, norm_eps, r0 + 16, TP, BK, BV)  # fmt: skip
        T11 = _diagonal_inverse(K1, A1, PREC)
        T10 = -_mm(T11, _mm(_off(K1, A0, PREC), T00))
        Kt1 = tl.dot(T10, K0, input_precision=PREC) + tl.dot(T11, K1, input_precision=PREC)
        Vt1 = tl.dot(T10, V0, input_precision=PREC) + tl.dot(T11, V1, input_precision=PREC)
        _store_rows(kt_ptr, vt_ptr, Kt1, Vt1, bh, r0 + 16, TP, BK, BV)
        if C == 64:
            K2, A2, V2 = _prep_rows(k_ptr, v_ptr, gate_ptr, bh, b, h, T, s_t, s_h, sv_t, sv_h,
                                    DK, DV, norm_eps, r0 + 32, TP, BK, BV)  # fmt: skip
            T22 = _diagonal_inverse(K2, A2, PREC)
            N20 = _off(K2, A0, PREC)
            N21 = _off(K2, A1, PREC)
            T21 = -_mm(T22, _mm(N21, T11))
            S20 = _mm(N20, T00)
            if BUG == 0:
                S20 += _mm(N21, T10)
            T20 = -_mm(T22, S20)
            Kt2 = (tl.dot(T20, K0, input_precision=PREC) + tl.dot(T21, K1, input_precision=PREC)
                   + tl.dot(T22, K2, input_precision=PREC))  # fmt: skip
            Vt2 = (tl.dot(T20, V0, input_precision=PREC) + tl.dot(T21, V1, input_precision=PREC)
                   + tl.dot(T22, V2, input_precision=PREC))  # fmt: skip
            _store_rows(kt_ptr, vt_ptr, Kt2, Vt2, bh, r0 + 32, TP, BK, BV)
            K3, A3, V3 = _prep_rows(k_ptr, v_ptr, gate_ptr, bh, b, h, T, s_t, s_h, sv_t, sv_h,
                                    DK, DV, norm_eps, r0 + 48, TP, BK, BV)  # fmt: skip
            T33 = _diagonal_inverse(K3, A3, PREC)
            N30 = _off(K3, A0, PREC)
            N31 = _off(K3, A1, PREC)
            N32 = _off(K3, A2, PREC)
            T32 = -_mm(T33, _mm(N32, T22))
            T31 = -_mm(T33, _mm(N31, T11) + _mm(N32, T21))
            T30 = -_mm(T33, _mm(N30, T00) + _mm(N31, T10) + _mm(N32, T20))
            Kt3 = (tl.dot(T30, K0, input_precision=PREC) + tl.dot(T31, K1, input_precision=PREC)
                   + tl.dot(T32, K2, input_precision=PREC)
                   + tl.dot(T33, K3, input_precision=PREC))  # fmt: skip
            Vt3 = (tl.dot(T30, V0, input_precision=PREC) + tl.dot(T31, V1, input_precision=PREC)
                   + tl.dot(T32, V2, input_precision=PREC)
                   + tl.dot(T33, V3, input_precision=PREC))  # fmt: skip
            _store_rows(kt_ptr, vt_ptr, Kt3, Vt3, bh, r0 + 48, TP, BK, BV)


def launch(
    kernel: Any, k: Any, v: Any, gates: Any, params: Any, C: int, **bug: int
) -> tuple[Any, Any]:
    """``K̃, Ṽ`` ``[BH, TP, BK]``, ``[BH, TP, BV]`` of ``kernel`` (either) for keys ``k``
    ``[B, T, H, dk]``, values ``v`` ``[B, T, H, dv]`` and gates ``[BH, TP, BK]`` float32."""
    import torch

    B, T, H, dk = k.shape
    dv = v.shape[-1]
    BK, BV = max(32, triton.next_power_of_2(dk)), max(16, triton.next_power_of_2(dv))
    TP = gates.shape[1]
    Kt = torch.empty(B * H, TP, BK, dtype=torch.float32, device=k.device)
    Vt = torch.empty(B * H, TP, BV, dtype=torch.float32, device=k.device)
    prec = "tf32" if k.dtype in (torch.bfloat16, torch.float16) else "ieee"
    kernel[(TP // C, B * H)](
        k, v, gates, Kt, Vt, params, T, H, H * dk, dk, H * dv, dv,
        DK=dk, DV=dv, BK=BK, BV=BV, C=C, TP=TP, PREC=prec, num_warps=4 if BK <= 64 else 8,
        **bug,
    )  # fmt: skip
    return Kt, Vt


def inputs(B: int, T: int, H: int, dk: int, dv: int, dtype: Any, device: str, C: int) -> Any:
    """Keys, values and unit gates (random, not a penalty chain's: the transform's cost and
    agreement do not depend on where the gates come from)."""
    import torch

    from vla_verify import VLAConfig
    from vla_verify.backends.triton_chunked import _params

    g = torch.Generator(device=device).manual_seed(0)
    k = torch.rand(B, T, H, dk, generator=g, device=device).to(dtype) + 0.1
    v = torch.randn(B, T, H, dv, generator=g, device=device).to(dtype)
    BK = max(32, triton.next_power_of_2(dk))
    TP = -(-T // C) * C
    gates = torch.zeros(B * H, TP, BK, device=device)
    a = torch.rand(B * H, T, dk, generator=g, device=device)
    gates[:, :T, :dk] = a / a.norm(dim=-1, keepdim=True)
    return k, v, gates, _params(VLAConfig(), torch.device(device))


def main() -> None:
    import json

    import torch

    from vla_verify.bench import machine_info, time_ms

    out: dict[str, Any] = {"machine": machine_info(), "records": []}
    for D in (64, 128):
        for T in (4096, 16384):
            k, v, gates, params = inputs(1, T, 16, D, D, torch.bfloat16, "cuda", 64)
            old = launch(state_prep_kernel, k, v, gates, params, 64)
            new = launch(state_prep_blocks_kernel, k, v, gates, params, 64)
            diff = max(
                float((a - b).abs().max() / a.abs().max()) for a, b in zip(old, new, strict=True)
            )
            shipped = functools.partial(launch, state_prep_kernel, k, v, gates, params, 64)
            blocks = functools.partial(launch, state_prep_blocks_kernel, k, v, gates, params, 64)
            rec = {"D": D, "T": T, "rel_max_diff": diff, "shipped_ms": time_ms(shipped),
                   "blocks_ms": time_ms(blocks)}  # fmt: skip
            out["records"].append(rec)
            print(json.dumps(rec), flush=True)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
