"""Triton kernels of the chunked VLA forward (spec §5), used by :mod:`.triton_chunked`.

The launches, in this order:

0. :func:`penalty_block_matrix_kernel` — each block's ``2dk × 2dk`` matrix on ``(Π; Θ)``,
   ``A = Π Θ^{-1}``, from which the host forms the block-start penalties of step 1
   (:func:`~vla_verify.backends.triton_chunked.penalty_block_starts`); one program per (b, h,
   block, ``NC`` columns), the block's Sherman–Morrison steps and nudges applied to those
   columns of the identity as float64 products.  Only for more than one block with nudges.
1. :func:`penalty_chain_kernel` — the ``A`` recurrence, one program per (b, h, block of
   ``CPB`` penalty chunks), chunk after chunk of ``CP`` tokens inside its block, from the
   block-start penalty that :func:`~vla_verify.backends.triton_chunked.penalty_block_starts`
   computes (one block: the whole sequence from ``A_0``).  Per chunk, with rows = tokens and
   ``X = A_0ᵀ`` (the chunk-start penalty, transposed, in a scratch in global memory):

       Y = U X + c_{t-1}·U        KA = K̂ X                     (tensor-core products)
       G = U Yᵀ  (lower triangle)  I + G = L D Lᵀ  (pivots clamped at sm_floor)
       W = L^{-1} Y  (rows s_jᵀ)    α = KA − tril(K̂ (W D^{-1})ᵀ) W + c_t·K̂

   ``W`` and ``D`` come from the factorisation followed by the inverse of ``L`` and a product
   (``ELIMINATE`` 0) or from one elimination on ``[I + G | Y]`` (1: half the dependent steps,
   faster on the H200); ``PENALTY_FACTORISATION`` in :mod:`.triton_chunked`.
       X ← X − (W D^{-1})ᵀ W + c_C·I

   ``c_t`` is the isotropic shift of ``A_t = B_t + c_t·I`` inside the chunk: the nudges that
   fired up to step t (:mod:`.torch_chunked`, "Nudges inside a chunk").  The gates
   ``α̂ = α / max(‖α‖, norm_eps)`` are written in float32.  The chain's precision ``PD`` is
   float64 (products with ``ieee`` operands) or float32 (``tf32x3`` operands): ``CHAIN_PREC``,
   from ``penalty_dtype``; its error is measured, ``docs/design/triton_chunked.md``.
   ``X`` is read and written in row blocks of ``BKB`` rows (a ``dk × dk`` float64 tile does not
   fit in registers at ``dk = 128``).  In training (``SAVE_CKPT``, ``SAVE_CHAIN``) it also
   stores ``A`` every 64 tokens and, per token, ``k̂``, ``s_t`` (the rows of ``W``), the pivots
   before and after the clamp and ``‖α‖``, ``‖k‖``: what the recurrent backward reads.
2. :func:`state_prep_kernel` — per chunk of ``C`` tokens, all chunks in parallel: the UT
   transform ``T = (I + N)^{-1}``, ``N = tril(K̂ Âᵀ, −1)``, by 16-row blocks (each diagonal
   block by forward substitution, the blocks below it by products), then ``K̃ = T K̂`` and
   ``Ṽ = T V``.
3. :func:`state_starts_kernel` — the inter-chunk ``S`` recurrence, one program per (b, h,
   block of value rows), chunk after chunk: ``E_c = Ṽ_c − K̃_c S_cᵀ`` and
   ``S_{c+1} = S_c + E_cᵀ Â_c`` (two products a chunk), storing every ``S_c`` and ``E_c``;
   one more program per head sums the keys, storing ``z`` at every chunk start.
4. :func:`state_output_kernel` — every chunk's read-out at once:
   ``O_c = Q_c S_cᵀ + tril(Q_c Â_cᵀ) E_c`` and the read-out normaliser from
   ``z_t = z_c + Σ_{s ≤ t in the chunk} k_s`` (in training also ``α̂_tᵀq_t`` and ``z_tᵀq_t`` per
   token for the backward).  Keeping the read-out out of the sequential loop
   leaves that loop two products a chunk instead of five (as fla's ``chunk_fwd_h`` and
   ``chunk_fwd_o`` split the delta rule).

With more than one block, the float64 chain's block starts are checked on the device against
the blocks' ends (:data:`~vla_verify.backends.triton_chunked.BLOCK_START_RTOL`), and a second
pass (``COND``: every kernel of steps 1-4 first reads an int32 flag and returns at once unless
the check failed) runs the penalty chain in one block from ``A_0`` and the state chain again,
writing over the first pass's outputs: a failed check costs the device a sequential chain, a
passed one a few empty launches, and neither a host synchronisation.

Products of the state chain take float32 operands with ``PREC`` (``"ieee"`` or ``"tf32"``: the
``input_precision`` switch of :func:`~vla_verify.backends.triton_chunked.chunked_vla`; tf32 for
16-bit inputs), accumulating in float32.  The penalty chain's products are
``PD`` × ``PD`` with ``PD`` accumulation (float64 tensor cores on sm_90).
"""

from __future__ import annotations

import os

import triton
import triton.language as tl

#: Whether the kernels run under Triton's CPU interpreter (``TRITON_INTERPRET=1`` when this
#: module is imported), which cannot multiply 16-bit float operands (:func:`_mm`).
INTERPRETED = tl.constexpr(os.environ.get("TRITON_INTERPRET", "0") == "1")

#: Planted bugs for the meta-tests (constexpr ``BUG``).
BUG_NONE = 0
BUG_NUDGE_ONE_STEP_LATE = 1
BUG_READ_BEFORE_WRITE = 2
#: In the block starts (:func:`~vla_verify.backends.triton_chunked.penalty_block_starts`): the
#: blocks' matrices leave out the nudges.
BUG_BLOCK_STARTS_WITHOUT_NUDGES = 3
#: The same, with the check of the block starts against the chain's block ends skipped.
BUG_UNCHECKED_BLOCK_STARTS = 4
#: In :func:`penalty_block_matrix_kernel`: each nudge acts before its piece's rank-one terms.
BUG_MATRIX_NUDGE_FIRST = 5
#: In :func:`state_prep_kernel` (chunks of 64): ``T_20`` without its ``N_21 T_10`` term.
BUG_UT_BLOCK_TERM = 6
#: In the penalty chain's elimination (``ELIMINATE`` 1): each step subtracts row ``j`` of
#: ``Y`` as loaded, not as solved (``W = Y − stril(L) Y`` instead of ``L^{-1} Y``).
BUG_ELIMINATION_UNSOLVED_ROW = 7
#: In the per-token values kept for the backward (``SAVE_CHAIN``): ``s_t / δ_t`` stored as
#: ``s_t``.
BUG_SAVED_S_OVER_PIVOT = 8
#: The same: the read-out normaliser's ``z_tᵀq_t`` stored as ``z_{t-1}ᵀq_t``.
BUG_SAVED_NORMALISER_BEFORE_KEY = 9


@triton.jit
def _tf32_split(x):
    """``x = hi + lo`` for a float32 tile: ``hi`` rounded to tf32 (10 mantissa bits, to nearest
    with ties away from zero, as ``cvt.rna.tf32.f32``), ``lo = x − hi``, exact in float32.
    Finite ``x`` only: an infinite one gives a NaN ``lo``."""
    bits = x.to(tl.uint32, bitcast=True)
    hi = ((bits + 0x1000) & 0xFFFFE000).to(tl.float32, bitcast=True)
    return hi, x - hi


@triton.jit
def _tf32_split_unless_exact(x, EXACT: tl.constexpr):
    """:func:`_tf32_split` of ``x``, or ``(x, x)`` where ``x`` is exactly a tf32 number
    (``EXACT``: 16-bit inputs), whose remainder :func:`_tf32x3_dot` then does not read."""
    if EXACT:
        return x, x
    else:
        return _tf32_split(x)


@triton.jit
def _tf32x3_dot(a_hi, a_lo, b_hi, b_lo, acc, A_IS_TF32: tl.constexpr):
    """``acc + a b`` from the tf32 splits of ``a`` and ``b`` (:func:`_tf32_split`) in three
    tf32 tensor-core products, the small ones first (``a_lo b_hi``, ``a_hi b_lo``; their product
    ``a_lo b_lo`` is below float32's rounding), with float32 accumulation; two where ``a`` is
    exactly a tf32 number (``A_IS_TF32``: 16-bit inputs, whose 8 or 11 significant bits tf32
    holds), whose ``a_lo`` is zero and not read.  Triton's ``tf32x3`` splits every operand of
    every product again; here a split serves every product of its operand."""
    if not A_IS_TF32:
        acc = tl.dot(a_lo, b_hi, acc, input_precision="tf32")
    acc = tl.dot(a_hi, b_lo, acc, input_precision="tf32")
    return tl.dot(a_hi, b_hi, acc, input_precision="tf32")


@triton.jit
def unit_lower_inverse(N, rows, cols, C: tl.constexpr):
    """``(I + N)^{-1}`` of a strictly lower triangular ``[C, C]`` tile ``N`` by forward
    substitution, row by row: ``T_i = e_i − Σ_{m<i} N_{im} T_m``.  (The product series
    ``Σ (−N)^i`` is exact in exact arithmetic but its powers grow like binomial coefficients
    on near-parallel keys, so it cancels catastrophically.)"""
    Tm = tl.where(rows[:, None] == cols[None, :], 1.0, 0.0).to(N.dtype)
    for i in range(1, C):
        n_i = tl.sum(tl.where(rows[:, None] == i, N, 0.0), axis=0)  # row i of N, over m
        new = -tl.sum(n_i[:, None] * Tm, axis=0)  # Σ_m N_im T_m (rows m >= i are zero in n_i)
        new = tl.where(cols == i, 1.0, new)
        Tm = tl.where(rows[:, None] == i, new[None, :], Tm)
    return Tm


@triton.jit
def _ldl_clamped(M, rows, cols, floor, C: tl.constexpr):
    """``M = L D Lᵀ`` of a ``[C, C]`` tile, reading its lower triangle only, every pivot
    clamped ``d_j = max(d_j, floor)`` (the floored Sherman–Morrison denominators of spec §2.3).
    Right-looking; returns ``(L, d, d_raw)``, ``d_raw`` the pivots before the clamp."""
    Lm = tl.where(rows[:, None] == cols[None, :], 1.0, 0.0).to(M.dtype)
    d = tl.full([C], 1.0, M.dtype)
    d_raw = tl.full([C], 1.0, M.dtype)
    for j in range(C):
        col = tl.sum(tl.where(cols[None, :] == j, M, 0.0), axis=1)  # column j, over rows
        raw = tl.sum(tl.where(rows == j, col, 0.0), axis=0)
        piv = tl.maximum(raw, floor)
        lcol = tl.where(rows > j, col * (1.0 / piv), 0.0)
        Lm = tl.where((cols[None, :] == j) & (rows[:, None] > j), lcol[:, None], Lm)
        d = tl.where(rows == j, piv, d)
        d_raw = tl.where(rows == j, raw, d_raw)
        # Trailing update of the lower part: M -= piv · l lᵀ (rows and columns > j).
        M = M - piv * (lcol[:, None] * lcol[None, :])
    return Lm, d, d_raw


@triton.jit
def _ldl_solve_clamped(M, Y, rows, cols, floor, C: tl.constexpr, BUG: tl.constexpr):
    """``W = L^{-1} Y`` and the pivots ``d`` of ``M = L D Lᵀ`` (``[C, C]``, its lower triangle
    read, every pivot clamped ``d_j = max(d_j, floor)``), by elimination on ``[M | Y]``: step
    ``j`` subtracts ``L_rj`` times the already solved row ``j`` of ``Y`` from every row
    ``r > j``.  One pass of ``C`` steps (two dependent reductions each: the column, then its
    pivot) instead of the factorisation's ``C`` and the inverse's ``C − 1``, and no product
    ``L^{-1} Y`` after them; the same multiply-adds.  Returns ``(W, d, d_raw)``, ``d_raw`` the
    pivots before the clamp."""
    d = tl.full([C], 1.0, M.dtype)
    d_raw = tl.full([C], 1.0, M.dtype)
    Y0 = Y
    for j in range(C):
        col = tl.sum(tl.where(cols[None, :] == j, M, 0.0), axis=1)  # column j, over rows
        if BUG == 7:  # BUG_ELIMINATION_UNSOLVED_ROW (a jit function reads literals only)
            yj = tl.sum(tl.where(rows[:, None] == j, Y0, 0.0), axis=0)
        else:
            yj = tl.sum(tl.where(rows[:, None] == j, Y, 0.0), axis=0)  # row j of Y, solved
        raw = tl.sum(tl.where(rows == j, col, 0.0), axis=0)
        piv = tl.maximum(raw, floor)
        # One division per pivot, then products: a float64 division is a Newton iteration of
        # about a dozen instructions with a slow path, on the step's dependent path.
        lcol = tl.where(rows > j, col * (1.0 / piv), 0.0)
        d = tl.where(rows == j, piv, d)
        d_raw = tl.where(rows == j, raw, d_raw)
        M = M - piv * (lcol[:, None] * lcol[None, :])
        Y = Y - lcol[:, None] * yj[None, :]
    return Y, d, d_raw


@triton.jit
def penalty_chain_kernel(
    k_ptr,
    u_ptr,
    x_ptr,  # [BH, NB, BK, BK] scratch: each block's start Aᵀ on entry, its end Aᵀ on exit (PD)
    w_ptr,  # [BH, NB, CP, BK] scratch for W D^{-1} (PD)
    gate_ptr,  # [BH, TP, BK] float32 out: the normalised gates α̂
    cka_ptr,  # [BH, NCK, DK, DK] float32 out: Aᵀ after every CKE tokens (slot t / CKE)
    kh_ptr,  # [BH, T, BKS] float32 out (SAVE_CHAIN): k̂_t
    sv_ptr,  # [BH, T, BKS] float32 out (SAVE_CHAIN): s_t = A_{t-1} u_t
    cs_ptr,  # [BH, T, 4] float32 out (SAVE_CHAIN): 1 + u_tᵀs_t, δ_t, ‖α_t‖, ‖k_t‖
    params_ptr,  # lambda0, sm_floor, nudge_eta, out_eps, norm_eps (float64)
    flag_ptr,  # int32 [1] (COND): nonzero where the block-start check failed
    T,
    H,
    start,
    period,
    s_t,
    s_h,
    DK,
    CPB,  # penalty chunks per block (runtime: a new length compiles nothing)
    NCK,  # checkpoint slots per head
    CKE,  # tokens between checkpoints, a multiple of CP
    BK: tl.constexpr,
    BKB: tl.constexpr,
    CP: tl.constexpr,
    TP,  # the padded length: a runtime value, so a new T compiles nothing
    PD: tl.constexpr,
    CHAIN_PREC: tl.constexpr,  # the products' operands: "ieee" (float64) or "tf32x3" (float32)
    NORMALIZE_GATE: tl.constexpr,
    SAVE_CKPT: tl.constexpr,
    SAVE_CHAIN: tl.constexpr,
    BKS: tl.constexpr,  # the row width of kh, sv (the recurrent backward's key tile, <= BK)
    ELIMINATE: tl.constexpr,  # 0 or 1: PENALTY_FACTORISATIONS (module docstring, step 1)
    BUG: tl.constexpr,
    COND: tl.constexpr = False,
):
    if COND:  # the fallback pass (module docstring): only where the block-start check failed
        if tl.load(flag_ptr) == 0:
            return
    # tf32x3 products split each operand once (:func:`_tf32x3_dot`); 16-bit penalties are
    # exact in tf32, so their products take two tf32 products instead of three.
    SPLIT: tl.constexpr = CHAIN_PREC == "tf32x3"
    U_IS_TF32: tl.constexpr = u_ptr.dtype.element_ty != tl.float32
    bh = tl.program_id(0).to(tl.int64)  # B·H·T·d may pass 2**31
    blk = tl.program_id(1)
    NB = tl.num_programs(1)
    b = bh // H
    h = bh % H
    floor = tl.load(params_ptr + 1).to(PD)
    eta = tl.load(params_ptr + 2).to(PD)
    norm_eps = tl.load(params_ptr + 4).to(tl.float32)
    ot = tl.arange(0, CP)
    ok = tl.arange(0, BK)
    okb = tl.arange(0, BKB)
    kmask = ok < DK
    base = b * T * s_t + h * s_h
    xb = x_ptr + (bh * NB + blk) * BK * BK
    wb = w_ptr + (bh * NB + blk) * CP * BK
    tril = ot[:, None] >= ot[None, :]
    c_first = blk * CPB
    c_last = tl.minimum(c_first + CPB, tl.cdiv(T, CP))
    for c in range(c_first, c_last):
        tok = c * CP + ot
        tmask = tok < T
        m2 = tmask[:, None] & kmask[None, :]
        ptrs = base + tok[:, None] * s_t + ok[None, :]
        U = tl.load(u_ptr + ptrs, mask=m2, other=0.0).to(tl.float32)
        K = tl.load(k_ptr + ptrs, mask=m2, other=0.0).to(tl.float32)
        knorm = tl.sqrt_rn(tl.sum(K * K, axis=1))
        rk = 1.0 / tl.maximum(knorm, norm_eps)
        Kh = K * rk[:, None]
        if SAVE_CHAIN:
            # The backward's per-token values (the recurrent gate pass's, which the recurrent
            # adjoint would otherwise recompute from the checkpoints), rows of [BH, T, ·], each
            # stored as soon as it is formed (shorter live ranges: less spilled at BK = 128).
            row = bh.to(tl.int64) * T + tok
            ms = tmask[:, None] & (ok[None, :] < BKS)
            sp = row[:, None] * BKS + ok[None, :]
            tl.store(kh_ptr + sp, Kh, mask=ms)
            tl.store(cs_ptr + row * 4 + 3, knorm, mask=tmask)
        U = U.to(PD)
        Kh_p = Kh.to(PD)
        # Y = U X, KA = K̂ X, over row blocks of X (the chunk-start Aᵀ).
        Y = tl.zeros([CP, BK], PD)
        KA = tl.zeros([CP, BK], PD)
        for kb in tl.static_range(BK // BKB):
            cb = kb * BKB + okb
            mb = tmask[:, None] & (cb[None, :] < DK)
            pb = base + tok[:, None] * s_t + cb[None, :]
            Ub = tl.load(u_ptr + pb, mask=mb, other=0.0).to(tl.float32).to(PD)
            Kb = (tl.load(k_ptr + pb, mask=mb, other=0.0).to(tl.float32) * rk[:, None]).to(PD)
            Xb = tl.load(xb + cb[:, None] * BK + ok[None, :])
            if SPLIT:
                Xh, Xl = _tf32_split(Xb)
                Kbh, Kbl = _tf32_split(Kb)
                Ubh, Ubl = _tf32_split_unless_exact(Ub, U_IS_TF32)
                Y = _tf32x3_dot(Ubh, Ubl, Xh, Xl, Y, U_IS_TF32)
                KA = _tf32x3_dot(Kbh, Kbl, Xh, Xl, KA, False)
            else:
                Y += tl.dot(Ub, Xb, input_precision=CHAIN_PREC, out_dtype=PD)
                KA += tl.dot(Kb, Xb, input_precision=CHAIN_PREC, out_dtype=PD)
        # The nudge clock (spec §2.3): step t of the call (1-based) is global step start + t.
        if BUG == 1:
            nudged = (((start + tok) % period) == 0) & (start + tok > 0) & tmask
        else:
            nudged = (((start + tok + 1) % period) == 0) & tmask
        n_after = tl.cumsum(nudged.to(tl.int32), axis=0)
        c_after = n_after.to(PD) * eta
        c_before = c_after - nudged.to(PD) * eta
        Y = Y + c_before[:, None] * U
        if SPLIT:
            Yh, Yl = _tf32_split(Y)
            Uh, Ul = _tf32_split_unless_exact(U, U_IS_TF32)
            G = _tf32x3_dot(Uh, Ul, tl.trans(Yh), tl.trans(Yl), tl.zeros([CP, CP], PD), U_IS_TF32)
        else:
            G = tl.dot(
                U, tl.trans(Y), input_precision=CHAIN_PREC, out_dtype=PD
            )  # G[t, j] = u_t·y_j
        eye = tl.where(ot[:, None] == ot[None, :], 1.0, 0.0).to(PD)
        if ELIMINATE == 2:
            # The elimination on [I + G | I]: L^{-1} on a P × P tile, then W = L^{-1} Y as one
            # product, where the elimination on [I + G | Y] updates the P × d tile every step.
            Linv, d, d_raw = _ldl_solve_clamped(eye + G, eye, ot, ot, floor, CP, BUG)
            if SPLIT:
                Lh, Ll = _tf32_split(Linv)
                W = _tf32x3_dot(Lh, Ll, Yh, Yl, tl.zeros([CP, BK], PD), False)  # rows s_jᵀ
            else:
                W = tl.dot(Linv, Y, input_precision=CHAIN_PREC, out_dtype=PD)  # rows s_jᵀ
        elif ELIMINATE == 1:
            W, d, d_raw = _ldl_solve_clamped(eye + G, Y, ot, ot, floor, CP, BUG)  # rows s_jᵀ
        else:
            Lm, d, d_raw = _ldl_clamped(eye + G, ot, ot, floor, CP)
            Linv = unit_lower_inverse(Lm - eye, ot, ot, CP)
            W = tl.dot(Linv, Y, input_precision=CHAIN_PREC, out_dtype=PD)  # rows s_jᵀ
        if SAVE_CHAIN:
            if BUG == 8:  # BUG_SAVED_S_OVER_PIVOT (a jit function reads literals only)
                tl.store(sv_ptr + sp, (W / d[:, None]).to(tl.float32), mask=ms)
            else:
                tl.store(sv_ptr + sp, W.to(tl.float32), mask=ms)
            tl.store(cs_ptr + row * 4, d_raw.to(tl.float32), mask=tmask)
            tl.store(cs_ptr + row * 4 + 1, d.to(tl.float32), mask=tmask)
        Ws = W * (1.0 / d)[:, None]  # CP divisions, not CP·BK (as the elimination's pivots)
        if SPLIT:
            Wh, Wl = _tf32_split(W)
            Wsh, Wsl = _tf32_split(Ws)
            Khh, Khl = _tf32_split(Kh_p)
            zero = tl.zeros([CP, CP], PD)
            KWs = _tf32x3_dot(Khh, Khl, tl.trans(Wsh), tl.trans(Wsl), zero, False)
            Xm = tl.where(tril, KWs, 0.0)
            Xmh, Xml = _tf32_split(Xm)
            alpha = _tf32x3_dot(-Xmh, -Xml, Wh, Wl, KA, False)
        else:
            KWs = tl.dot(Kh_p, tl.trans(Ws), input_precision=CHAIN_PREC, out_dtype=PD)
            Xm = tl.where(tril, KWs, 0.0)
            alpha = KA - tl.dot(Xm, W, input_precision=CHAIN_PREC, out_dtype=PD)
        alpha = alpha + c_after[:, None] * Kh_p
        alpha = alpha.to(tl.float32)
        anorm = tl.sqrt_rn(tl.sum(alpha * alpha, axis=1))
        if NORMALIZE_GATE:
            ra = 1.0 / tl.maximum(anorm, norm_eps)
            alpha = alpha * ra[:, None]
        gp = gate_ptr + bh * TP * BK + tok[:, None] * BK + ok[None, :]
        tl.store(gp, alpha, mask=tmask[:, None])
        if SAVE_CHAIN:
            tl.store(cs_ptr + row * 4 + 2, anorm, mask=tmask)
        # X ← X − (W D^{-1})ᵀ W + c_C·I, row block by row block (W D^{-1} read back by columns).
        c_end = tl.sum(tl.where(ot == CP - 1, c_after, 0.0), axis=0)
        tl.store(wb + ot[:, None] * BK + ok[None, :], Ws)
        tl.debug_barrier()
        for kb in tl.static_range(BK // BKB):
            cb = kb * BKB + okb
            # (W D^{-1})ᵀ's row block, loaded transposed: Triton 3.6 fails to lower a register
            # transpose of a loaded float64 tile into a dot operand on sm_90.
            WsbT = tl.load(wb + ot[None, :] * BK + cb[:, None])  # [BKB, CP]
            Xb = tl.load(xb + cb[:, None] * BK + ok[None, :])
            if SPLIT:
                WsbTh, WsbTl = _tf32_split(WsbT)
                # Subtracted from X after the tensor cores: their accumulator truncates, and a
                # block's chunks would bias X once each.
                Xb = Xb - _tf32x3_dot(WsbTh, WsbTl, Wh, Wl, tl.zeros([BKB, BK], PD), False)
            else:
                Xb = Xb - tl.dot(WsbT, W, input_precision=CHAIN_PREC, out_dtype=PD)
            Xb = Xb + tl.where((cb[:, None] == ok[None, :]) & (cb[:, None] < DK), c_end, 0.0)
            tl.store(xb + cb[:, None] * BK + ok[None, :], Xb)
        tl.debug_barrier()
        if SAVE_CKPT:
            # The backward's checkpoints (the recurrent adjoint's layout): A after every CKE
            # tokens inside the sequence; slot 0 and the last are the caller's.  Read back from
            # the scratch after the update rather than stored from inside it: at BK = 128 the
            # store inside the update's loop, with SAVE_CHAIN's, made the chain non-finite on
            # sm_90 (h100/block_check_training_fcb06ea.json); read back, both stores leave the
            # chain exact (h100/block_check_training_eaff479.json, test_triton_chunked_gpu.py).
            t_end = (c + 1) * CP
            if (t_end % CKE == 0) & (t_end < T):
                slot = bh * NCK + t_end // CKE
                for kb in tl.static_range(BK // BKB):
                    cb = kb * BKB + okb
                    cm = (cb[:, None] < DK) & (ok[None, :] < DK)
                    Xb = tl.load(xb + cb[:, None] * BK + ok[None, :])
                    cp_ = cka_ptr + (slot * DK + cb[:, None]) * DK + ok[None, :]
                    tl.store(cp_, Xb.to(tl.float32), mask=cm)


@triton.jit
def penalty_block_matrix_kernel(
    u_ptr,  # [B, T, H, dk] float32: the penalty directions
    m_ptr,  # [BH, NB, 2·DK, 2·DK] PD out: each block's matrix on the stacked (Π; Θ)
    params_ptr,  # lambda0, sm_floor, nudge_eta, out_eps, norm_eps (float64)
    T,
    H,
    start,  # the nudge clock modulo the period
    period,
    block,  # tokens per block
    NB,  # blocks in m_ptr (the grid may leave out the last, whose matrix no start needs)
    s_t,
    s_h,
    DK,
    BK: tl.constexpr,
    NC: tl.constexpr,  # columns of the block matrix per program
    CH: tl.constexpr,  # token rows per product
    PD: tl.constexpr,  # the matrices' dtype: float64, or float32 with tf32x3 products
    BUG: tl.constexpr,
):
    """Each block's ``2dk × 2dk`` matrix on ``(Π; Θ)``, ``A = Π Θ^{-1}`` (spec §2.3; the forms
    of :func:`~vla_verify.backends.triton_chunked.penalty_block_starts`), applied column by
    column: one program per (b·h, block, ``NC`` columns), from those columns of the identity,
    walking the block's tokens once.  A Sherman–Morrison step is ``Θ ← Θ + u uᵀ Π`` and a
    nudge ``Π ← Π + η Θ``; between two nudges ``Π`` is fixed, so a piece's steps are
    ``Θ ← Θ + Uᵀ (U Π)``, two float64 products per ``CH`` rows of the piece.  ``4 dk²``
    multiply-adds per token against ``16 dk³`` per piece for a product of the pieces' matrices
    (``16·dk / period`` times fewer at ``dk = 64``, ``period = 20`` before padding).

    In float32 (``PD``; the float32 chain's starts) each product is three tf32 tensor-core
    products of split operands (:func:`_tf32x3_dot`), two where the penalties are 16-bit and so
    exact in tf32; ``Π`` is split once a piece."""
    SPLIT: tl.constexpr = PD == tl.float32
    U_IS_TF32: tl.constexpr = u_ptr.dtype.element_ty != tl.float32
    bh = tl.program_id(0).to(tl.int64)  # B·H·T·d may pass 2**31
    blk = tl.program_id(1)
    cblk = tl.program_id(2)
    b = bh // H
    h = bh % H
    eta = tl.load(params_ptr + 2)
    if (BUG == 3) | (BUG == 4):
        eta = eta * 0.0
    ok = tl.arange(0, BK)
    ot = tl.arange(0, CH)
    col = cblk * NC + tl.arange(0, NC)  # columns of the padded [2BK, 2BK] matrix
    Pi = tl.where(ok[:, None] == col[None, :], 1.0, 0.0).to(PD)
    Th = tl.where(ok[:, None] + BK == col[None, :], 1.0, 0.0).to(PD)
    base = b.to(tl.int64) * T * s_t + h * s_h
    kmask = ok < DK
    t = blk.to(tl.int64) * block
    t_end = tl.minimum(t + block, T)
    # Piece after piece: a piece ends at a nudge (after step t when (start + t + 1) % period
    # == 0, spec §2.3) or at the block's end.
    while t < t_end:
        nudge_at = t + (period - (start + t) % period)  # the next piece's first token
        e = tl.minimum(nudge_at, t_end)
        if BUG == 5:
            Pi = tl.where(e == nudge_at, Pi + eta.to(PD) * Th, Pi)
        if SPLIT:
            Pih, Pil = _tf32_split(Pi)
        for r in range(0, tl.cdiv(e - t, CH)):
            tok = t + r * CH + ot
            tm = tok < e
            rows = base + tok * s_t
            U = tl.load(u_ptr + rows[:, None] + ok[None, :], mask=tm[:, None] & kmask[None, :],
                        other=0.0).to(tl.float32).to(PD)  # fmt: skip
            # Uᵀ loaded transposed: Triton 3.6 fails to lower a register transpose of a
            # float64 tile into a dot operand on sm_90.
            UT = tl.load(u_ptr + rows[None, :] + ok[:, None], mask=tm[None, :] & kmask[:, None],
                         other=0.0).to(tl.float32).to(PD)  # fmt: skip
            if SPLIT:
                Uh, Ul = _tf32_split_unless_exact(U, U_IS_TF32)
                UTh, UTl = _tf32_split_unless_exact(UT, U_IS_TF32)
                UPi = _tf32x3_dot(Uh, Ul, Pih, Pil, tl.zeros([CH, NC], PD), U_IS_TF32)
                UPih, UPil = _tf32_split(UPi)
                # Added to Θ outside the tensor cores: their accumulator truncates, and a
                # block's hundreds of truncations of Θ would bias its matrix.
                Th += _tf32x3_dot(UTh, UTl, UPih, UPil, tl.zeros([BK, NC], PD), U_IS_TF32)
            else:
                UPi = tl.dot(U, Pi, input_precision="ieee", out_dtype=tl.float64)
                Th += tl.dot(UT, UPi, input_precision="ieee", out_dtype=tl.float64)
        if BUG != 5:
            Pi = tl.where(e == nudge_at, Pi + eta.to(PD) * Th, Pi)
        t = e
    # Rows and columns of the padded matrix map to the unpadded (Π; Θ): i < BK -> i,
    # BK + i -> DK + i.
    out_col = tl.where(col < BK, col, col - BK + DK)
    cmask = tl.where(col < BK, col, col - BK) < DK
    mb = m_ptr + (bh * NB + blk).to(tl.int64) * (4 * DK * DK)
    m2 = kmask[:, None] & cmask[None, :]
    tl.store(mb + ok[:, None] * (2 * DK) + out_col[None, :], Pi, mask=m2)
    tl.store(mb + (DK + ok[:, None]) * (2 * DK) + out_col[None, :], Th, mask=m2)


@triton.jit
def penalty_block_starts_kernel(
    m_ptr,  # [BH, NB, 2·DK, 2·DK] float64 or float32: each block's matrix on (Π; Θ)
    x_ptr,  # [NB, BH, 2·DK, DK] float64: (Π; Θ) at each block's start, x[0] given
    NB,
    BH,
    DK,
    B0,  # the first block whose matrix is applied: x[B0] is given
    B1,  # x[B0 + 1] to x[B1] are written
    R: tl.constexpr,  # rows of (Π; Θ) padded to a power of two
    KB: tl.constexpr,  # rows of (Π; Θ) per product
    NC: tl.constexpr,  # columns per program
):
    """``(Π; Θ)`` at the starts of blocks ``B0 + 1`` to ``B1``, block after block,
    ``x[b + 1] = m[:, b] x[b]`` (:func:`~vla_verify.backends.triton_chunked.penalty_block_starts`
    without normalising): one program per (b·h, ``NC`` of the ``DK`` columns), the
    ``B1 − B0`` dependent ``2dk × 2dk`` by ``2dk × NC`` float64 products in one launch instead
    of one launch per block.  Each column of ``x[b + 1]`` depends on the same column of ``x[b]``
    alone, so the programs never wait for each other; a program reads back its own stores of
    the block before, after a barrier."""
    bh = tl.program_id(0).to(tl.int64)
    col = tl.program_id(1) * NC + tl.arange(0, NC)
    orow = tl.arange(0, R)
    ok = tl.arange(0, KB)
    mrow = orow < 2 * DK
    mcol = col < DK
    for b in range(B0, B1):
        mb = m_ptr + (bh * NB + b) * (4 * DK * DK)
        xb = x_ptr + (b * BH + bh) * (2 * DK * DK)
        acc = tl.zeros([R, NC], dtype=tl.float64)
        for k0 in range(0, 2 * DK, KB):
            kk = k0 + ok
            mk = kk < 2 * DK
            # The matrices may be float32 (the float32 chain's); the starts stay float64.
            a = tl.load(mb + orow[:, None] * (2 * DK) + kk[None, :],
                        mask=mrow[:, None] & mk[None, :], other=0.0).to(tl.float64)  # fmt: skip
            x = tl.load(xb + kk[:, None] * DK + col[None, :], mask=mk[:, None] & mcol[None, :],
                        other=0.0)  # fmt: skip
            acc = tl.dot(a, x, acc, input_precision="ieee", out_dtype=tl.float64)
        tl.store(x_ptr + ((b + 1) * BH + bh) * (2 * DK * DK) + orow[:, None] * DK + col[None, :],
                 acc, mask=mrow[:, None] & mcol[None, :])  # fmt: skip
        # The next block's products read these stores, written by other threads of the program.
        tl.debug_barrier()


@triton.jit
def block_end_check_kernel(
    x_ptr,  # [BH, NB, BK, BK] float64: each block's end Aᵀ (the penalty chain's scratch)
    starts_ptr,  # [BH, NB, DK, DK] float64, strides (sb_h, sb_n, DK, 1): each block's start A
    flag_ptr,  # int32 [1] out: set to 1 where a check fails, else left as it is
    NB,
    sb_h,
    sb_n,
    DK,
    rtol,
    BK: tl.constexpr,
    RB: tl.constexpr,  # rows per tile
):
    """Grid ``(BH, NB − 1)``: block ``n``'s end, run by the chain from its start, must equal
    block ``n + 1``'s start entry by entry to ``rtol`` times that start's largest entry
    (:func:`~vla_verify.backends.triton_chunked.penalty_block_starts`, the products-only starts
    checked); a larger difference or a NaN sets the flag."""
    bh = tl.program_id(0).to(tl.int64)
    n = tl.program_id(1)
    r = tl.arange(0, RB)
    c = tl.arange(0, BK)
    gap = tl.zeros([], dtype=tl.float64)
    scale = tl.zeros([], dtype=tl.float64)
    nans = tl.zeros([], dtype=tl.int32)
    for r0 in range(0, BK, RB):
        i = r0 + r
        m = (i[:, None] < DK) & (c[None, :] < DK)
        # The scratch holds Aᵀ: element (i, j) of the end A is X[j, i].
        end = tl.load(x_ptr + ((bh * NB + n) * BK + c[None, :]) * BK + i[:, None], mask=m,
                      other=0.0)  # fmt: skip
        start = tl.load(starts_ptr + bh * sb_h + (n + 1) * sb_n + i[:, None] * DK + c[None, :],
                        mask=m, other=0.0)  # fmt: skip
        diff = tl.abs(end - start)
        nans += tl.sum(tl.sum((diff != diff).to(tl.int32), axis=1), axis=0)
        gap = tl.maximum(gap, tl.max(tl.max(diff, axis=1), axis=0))
        scale = tl.maximum(scale, tl.max(tl.max(tl.abs(start), axis=1), axis=0))
    if (nans > 0) | (gap > scale * rtol):
        tl.store(flag_ptr, 1)


@triton.jit
def _mm(a, b, OP: tl.constexpr, PREC: tl.constexpr):
    """A state-side product with float32 accumulation: operands in ``OP``, float32 ones in
    ``PREC`` (``tf32`` or ``ieee``); ``OP`` is the dtype of the stored intermediates (the
    gates, ``K̃``, ``Ṽ``, ``E``, the chunk-start ``S``)."""
    if OP == tl.float32:
        if INTERPRETED and PREC == "tf32":
            # The interpreter multiplies float32 exactly; the GPU's tf32 products keep 10 of
            # the operands' 23 mantissa bits.  Triton hands the tensor cores float32 registers
            # without rounding them first, so the low 13 bits are dropped: truncation here,
            # which errs by up to twice as much as rounding to nearest would.
            ab = a.to(tl.float32).to(tl.int32, bitcast=True)
            bb = b.to(tl.float32).to(tl.int32, bitcast=True)
            a32 = (ab & -8192).to(tl.float32, bitcast=True)
            b32 = (bb & -8192).to(tl.float32, bitcast=True)
            return tl.dot(a32, b32, input_precision="ieee")
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision=PREC)
    elif INTERPRETED:
        # Triton's interpreter multiplies 16-bit float operands as their bits: the same
        # products in float32 instead (exact there; only the order of the sums differs).
        a16 = a.to(OP).to(tl.float32)
        b16 = b.to(OP).to(tl.float32)
        return tl.dot(a16, b16, input_precision="ieee")
    else:
        return tl.dot(a.to(OP), b.to(OP))


@triton.jit
def _ut_rows(k_ptr, v_ptr, gate_ptr, bh, b, h, T, s_t, s_h, sv_t, sv_h, DK, DV, norm_eps, row0,
             TP, BK: tl.constexpr, BV: tl.constexpr):  # fmt: skip
    """``K̂``, ``Â``, ``V`` of the 16 tokens from ``row0`` (zero past ``T``), float32."""
    ot = tl.arange(0, 16)
    ok = tl.arange(0, BK)
    ov = tl.arange(0, BV)
    tok = row0 + ot
    tmask = tok < T
    mk = tmask[:, None] & (ok[None, :] < DK)
    K = tl.load(k_ptr + b * T * s_t + h * s_h + tok[:, None] * s_t + ok[None, :], mask=mk,
                other=0.0).to(tl.float32)  # fmt: skip
    rk = 1.0 / tl.maximum(tl.sqrt_rn(tl.sum(K * K, axis=1)), norm_eps)
    mv = tmask[:, None] & (ov[None, :] < DV)
    V = tl.load(v_ptr + b * T * sv_t + h * sv_h + tok[:, None] * sv_t + ov[None, :], mask=mv,
                other=0.0).to(tl.float32)  # fmt: skip
    Ag = tl.load(gate_ptr + bh * TP * BK + tok[:, None] * BK + ok[None, :], mask=mk, other=0.0)
    return K * rk[:, None], Ag, V


@triton.jit
def _chunk_key_sum(k_ptr, key_sums_ptr, b, h, c, T, H, s_t, s_h, DK, BK: tl.constexpr,
                   C: tl.constexpr):  # fmt: skip
    """Chunk ``c``'s sum of keys (float32) into ``key_sums`` ``[B, NC, H, DK]``, from one load
    of the chunk's keys before the UT transform: its tile is not live across the transform's,
    and the program waits for memory once."""
    NC = tl.cdiv(T, C)
    if c < NC:
        tok = c * C + tl.arange(0, C)
        ok = tl.arange(0, BK)
        kmask = ok < DK
        keys = tl.load(k_ptr + b * T * s_t + h * s_h + tok[:, None] * s_t + ok[None, :],
                       mask=(tok < T)[:, None] & kmask[None, :], other=0.0)  # fmt: skip
        total = tl.sum(keys.to(tl.float32), axis=0)
        tl.store(key_sums_ptr + ((b * NC + c) * H + h) * DK + ok, total, mask=kmask)


@triton.jit
def _ut_diagonal(Kh, Ag, OP: tl.constexpr, PREC: tl.constexpr):
    """``(I + N_ii)^{-1}`` of one 16 × 16 diagonal block, ``N_ii = tril(K̂_i Â_iᵀ, −1)``."""
    o = tl.arange(0, 16)
    N = _mm(Kh, tl.trans(Ag), OP, PREC)
    return unit_lower_inverse(tl.where(o[:, None] > o[None, :], N, 0.0), o, o, 16)


@triton.jit
def _ut_below(Kh_i, Ag_j, OP: tl.constexpr, PREC: tl.constexpr):
    """``N_ij = K̂_i Â_jᵀ`` of a block below the diagonal (``i > j``)."""
    return _mm(Kh_i, tl.trans(Ag_j), OP, PREC)


@triton.jit
def _ut_mm(a, b):
    """A 16 × 16 product of the inverse's blocks in float32 (``ieee``): the blocks below the
    diagonal stay as exact as the diagonal blocks' forward substitution, whatever ``PREC``."""
    return tl.dot(a, b, input_precision="ieee")


@triton.jit
def _ut_store(kt_ptr, vt_ptr, Kt, Vt, bh, row0, TP, BK: tl.constexpr, BV: tl.constexpr):
    ot = tl.arange(0, 16)
    ok = tl.arange(0, BK)
    ov = tl.arange(0, BV)
    tok = row0 + ot
    tl.store(kt_ptr + bh * TP * BK + tok[:, None] * BK + ok[None, :], Kt)
    tl.store(vt_ptr + bh * TP * BV + tok[:, None] * BV + ov[None, :], Vt)


@triton.jit
def state_prep_kernel(
    k_ptr,
    v_ptr,
    gate_ptr,  # [BH, TP, BK] float32
    kt_ptr,  # [BH, TP, BK] float32 out: K̃ = T K̂
    vt_ptr,  # [BH, TP, BV] float32 out: Ṽ = T V
    key_sums_ptr,  # [B, NC, H, DK] float32 out: each chunk's sum of keys
    params_ptr,
    flag_ptr,  # int32 [1] (COND): nonzero where the block-start check failed
    T,
    H,
    s_t,
    s_h,
    sv_t,
    sv_h,
    DK,
    DV,
    BK: tl.constexpr,
    BV: tl.constexpr,
    C: tl.constexpr,  # 16, 32 or 64
    TP,  # the padded length: a runtime value, so a new T compiles nothing
    OP: tl.constexpr,  # the state side's product operands: float32 (PREC products) or bf16
    PREC: tl.constexpr,
    BUG: tl.constexpr = 0,
    COND: tl.constexpr = False,
):
    """The UT transform of one chunk by 16-row blocks: ``T = (I + N)^{-1}`` with ``T_ii`` by
    forward substitution (16 dependent steps over a 16 × 16 tile, not ``C`` over ``C × C``) and
    ``T_ij = −T_ii Σ_{j≤m<i} N_im T_mj`` below the diagonal, then ``K̃ = T K̂``, ``Ṽ = T V`` block
    row by block row (the pattern of flash-linear-attention's ``solve_tril``).  It first stores
    the chunk's sum of keys, from which :func:`_key_sums` forms ``z`` at every chunk start."""
    if COND:  # the fallback pass (module docstring): only where the block-start check failed
        if tl.load(flag_ptr) == 0:
            return
    c = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)  # B·H·T·d may pass 2**31
    b = bh // H
    h = bh % H
    norm_eps = tl.load(params_ptr + 4).to(tl.float32)
    r0 = c * C
    _chunk_key_sum(k_ptr, key_sums_ptr, b, h, c, T, H, s_t, s_h, DK, BK, C)
    K0, A0, V0 = _ut_rows(k_ptr, v_ptr, gate_ptr, bh, b, h, T, s_t, s_h, sv_t, sv_h, DK, DV,
                          norm_eps, r0, TP, BK, BV)  # fmt: skip
    T00 = _ut_diagonal(K0, A0, OP, PREC)
    _ut_store(kt_ptr, vt_ptr, _mm(T00, K0, OP, PREC),
              _mm(T00, V0, OP, PREC), bh, r0, TP, BK, BV)  # fmt: skip
    if C >= 32:
        K1, A1, V1 = _ut_rows(k_ptr, v_ptr, gate_ptr, bh, b, h, T, s_t, s_h, sv_t, sv_h, DK, DV,
                              norm_eps, r0 + 16, TP, BK, BV)  # fmt: skip
        T11 = _ut_diagonal(K1, A1, OP, PREC)
        T10 = -_ut_mm(T11, _ut_mm(_ut_below(K1, A0, OP, PREC), T00))
        Kt1 = _mm(T10, K0, OP, PREC) + _mm(T11, K1, OP, PREC)
        Vt1 = _mm(T10, V0, OP, PREC) + _mm(T11, V1, OP, PREC)
        _ut_store(kt_ptr, vt_ptr, Kt1, Vt1, bh, r0 + 16, TP, BK, BV)
        if C == 64:
            K2, A2, V2 = _ut_rows(k_ptr, v_ptr, gate_ptr, bh, b, h, T, s_t, s_h, sv_t, sv_h, DK,
                                  DV, norm_eps, r0 + 32, TP, BK, BV)  # fmt: skip
            T22 = _ut_diagonal(K2, A2, OP, PREC)
            N21 = _ut_below(K2, A1, OP, PREC)
            T21 = -_ut_mm(T22, _ut_mm(N21, T11))
            S20 = _ut_mm(_ut_below(K2, A0, OP, PREC), T00)
            if BUG != 6:
                S20 += _ut_mm(N21, T10)
            T20 = -_ut_mm(T22, S20)
            Kt2 = (_mm(T20, K0, OP, PREC) + _mm(T21, K1, OP, PREC)
                   + _mm(T22, K2, OP, PREC))  # fmt: skip
            Vt2 = (_mm(T20, V0, OP, PREC) + _mm(T21, V1, OP, PREC)
                   + _mm(T22, V2, OP, PREC))  # fmt: skip
            _ut_store(kt_ptr, vt_ptr, Kt2, Vt2, bh, r0 + 32, TP, BK, BV)
            K3, A3, V3 = _ut_rows(k_ptr, v_ptr, gate_ptr, bh, b, h, T, s_t, s_h, sv_t, sv_h, DK,
                                  DV, norm_eps, r0 + 48, TP, BK, BV)  # fmt: skip
            T33 = _ut_diagonal(K3, A3, OP, PREC)
            N31 = _ut_below(K3, A1, OP, PREC)
            N32 = _ut_below(K3, A2, OP, PREC)
            T32 = -_ut_mm(T33, _ut_mm(N32, T22))
            T31 = -_ut_mm(T33, _ut_mm(N31, T11) + _ut_mm(N32, T21))
            T30 = -_ut_mm(T33, _ut_mm(_ut_below(K3, A0, OP, PREC), T00) + _ut_mm(N31, T10)
                          + _ut_mm(N32, T20))  # fmt: skip
            Kt3 = (_mm(T30, K0, OP, PREC) + _mm(T31, K1, OP, PREC)
                   + _mm(T32, K2, OP, PREC)
                   + _mm(T33, K3, OP, PREC))  # fmt: skip
            Vt3 = (_mm(T30, V0, OP, PREC) + _mm(T31, V1, OP, PREC)
                   + _mm(T32, V2, OP, PREC)
                   + _mm(T33, V3, OP, PREC))  # fmt: skip
            _ut_store(kt_ptr, vt_ptr, Kt3, Vt3, bh, r0 + 48, TP, BK, BV)


@triton.jit
def _key_sums(z0_ptr, z_chunks_ptr, z_out_ptr, bh, T, H, DK, BK: tl.constexpr, C: tl.constexpr,
              ZB: tl.constexpr, HAS_Z0: tl.constexpr):  # fmt: skip
    """The read-out normaliser's ``z`` (spec §2.3, ``z_t = z_{t-1} + k_t``) of head ``bh`` at
    each chunk's start (``[B, NC, H, DK]``) and after the last token (``[BH, DK]``), in float32:
    ``z_chunks`` holds each chunk's sum of keys (:func:`state_prep_kernel`) and is overwritten
    by their exclusive prefix sums from ``z_0``, ``ZB`` chunks a step (a scan over the step's
    rows), so the walk takes ``NC / ZB`` dependent steps instead of ``NC``."""
    b = bh // H
    h = bh % H
    ok = tl.arange(0, BK)
    oc = tl.arange(0, ZB)
    kmask = ok < DK
    if HAS_Z0:
        z = tl.load(z0_ptr + bh * DK + ok, mask=kmask, other=0.0)
    else:
        z = tl.zeros([BK], dtype=tl.float32)
    NC = tl.cdiv(T, C)
    for c0 in range(0, NC, ZB):
        cs = c0 + oc
        at = z_chunks_ptr + ((b * NC + cs[:, None]) * H + h) * DK + ok[None, :]
        m = (cs < NC)[:, None] & kmask[None, :]
        sums = tl.load(at, mask=m, other=0.0)
        # Exclusive prefix: the inclusive scan less each row's own sum.
        tl.store(at, z[None, :] + (tl.cumsum(sums, axis=0) - sums), mask=m)
        z += tl.sum(sums, axis=0)
    tl.store(z_out_ptr + bh * DK + ok, z, mask=kmask)


@triton.jit
def state_starts_kernel(
    gate_ptr,  # [BH, TP, BK] float32
    kt_ptr,  # [BH, TP, BK] float32
    vt_ptr,  # [BH, TP, BV] float32
    s0_ptr,  # [BH, DV, DK] float32
    s_chunks_ptr,  # [BH, NC, BV, BK] float32 out: S at each chunk's start
    e_ptr,  # [BH, TP, BV] float32 out: E_c = Ṽ_c − K̃_c S_cᵀ
    s_out_ptr,  # [BH, DV, DK] float32 out
    z0_ptr,  # [BH, DK] float32 (HAS_Z0): z before the first token
    z_chunks_ptr,  # [B, NC, H, DK] float32: each chunk's sum of keys in, z at its start out
    z_out_ptr,  # [BH, DK] float32 out: z after the last token
    flag_ptr,  # int32 [1] (COND): nonzero where the block-start check failed
    T,
    H,
    DK,
    DV,
    BK: tl.constexpr,
    BV: tl.constexpr,
    BVB: tl.constexpr,
    C: tl.constexpr,
    TP,
    OP: tl.constexpr,  # the state side's product operands: float32 (PREC products) or bf16
    PREC: tl.constexpr,
    HAS_Z0: tl.constexpr,
    ZB: tl.constexpr,  # chunks per step of z's scan
    COND: tl.constexpr = False,
):
    """The sequential half of the state chain: per chunk only ``E_c`` and ``S_{c+1} = S_c +
    E_cᵀ Â_c`` (two products), storing ``S_c`` and ``E_c`` for :func:`state_output_kernel`.
    Grid ``(BH, DV / BVB + 1)``: the last program of each head sums the keys instead
    (:func:`_key_sums`), beside the value blocks' chains rather than inside one of them."""
    if COND:  # the fallback pass (module docstring): only where the block-start check failed
        if tl.load(flag_ptr) == 0:
            return
    bh = tl.program_id(0).to(tl.int64)  # B·H·T·d may pass 2**31
    pv = tl.program_id(1)
    if pv == tl.num_programs(1) - 1:
        _key_sums(z0_ptr, z_chunks_ptr, z_out_ptr, bh, T, H, DK, BK, C, ZB, HAS_Z0)
        return
    ot = tl.arange(0, C)
    ok = tl.arange(0, BK)
    ov = pv * BVB + tl.arange(0, BVB)
    kmask = ok < DK
    vmask = ov < DV
    S = tl.load(
        s0_ptr + bh * DV * DK + ov[:, None] * DK + ok[None, :],
        mask=vmask[:, None] & kmask[None, :],
        other=0.0,
    )  # [BVB, BK]
    NC = tl.cdiv(T, C)
    for c in range(0, NC):
        tok = c * C + ot
        tl.store(s_chunks_ptr + ((bh * NC + c) * BV + ov[:, None]) * BK + ok[None, :], S)
        # The gates past T are not written by the penalty chain: masked to zero.
        mk = (tok < T)[:, None] & kmask[None, :]
        Ag = tl.load(gate_ptr + bh * TP * BK + tok[:, None] * BK + ok[None, :], mask=mk, other=0.0)
        Kt = tl.load(kt_ptr + bh * TP * BK + tok[:, None] * BK + ok[None, :])
        Vt = tl.load(vt_ptr + bh * TP * BV + tok[:, None] * BV + ov[None, :])
        E = Vt - _mm(Kt, tl.trans(S), OP, PREC)
        tl.store(e_ptr + bh * TP * BV + tok[:, None] * BV + ov[None, :], E)
        S = S + _mm(tl.trans(E), Ag, OP, PREC)
    tl.store(
        s_out_ptr + bh * DV * DK + ov[:, None] * DK + ok[None, :],
        S,
        mask=vmask[:, None] & kmask[None, :],
    )


@triton.jit
def state_output_kernel(
    q_ptr,
    k_ptr,
    gate_ptr,  # [BH, TP, BK] float32
    e_ptr,  # [BH, TP, BV] float32
    s_chunks_ptr,  # [BH, NC, BV, BK] float32
    z_chunks_ptr,  # [B, NC, H, DK] float32: z at each chunk's start
    o_ptr,  # [B, T, H, DV] out, the inputs' dtype
    sc_ptr,  # [BH, T, 2] float32 out (SAVE_CHAIN): α̂_tᵀq_t, z_tᵀq_t
    params_ptr,
    flag_ptr,  # int32 [1] (COND): nonzero where the block-start check failed
    T,
    H,
    s_t,
    s_h,
    so_t,
    so_h,
    DK,
    DV,
    BK: tl.constexpr,
    BV: tl.constexpr,
    BVB: tl.constexpr,
    C: tl.constexpr,
    TP,
    OP: tl.constexpr,  # the state side's product operands: float32 (PREC products) or bf16
    PREC: tl.constexpr,
    NORMALIZE_OUTPUT: tl.constexpr,
    SAVE_CHAIN: tl.constexpr,
    BUG: tl.constexpr,
    COND: tl.constexpr = False,
):
    """The parallel half: every chunk at once, ``O_c = Q_c S_cᵀ + tril(Q_c Â_cᵀ) E_c`` and the
    read-out normaliser from ``z_t = z_c + Σ_{s ≤ t in the chunk} k_s``.  With ``SAVE_CHAIN``
    the first value block's programs also store, per token, ``α̂_tᵀq_t`` and ``z_tᵀq_t`` (before
    the floor ``out_eps``) for the backward, as float32 row sums (not the diagonal of the
    ``PREC`` product ``Q Âᵀ``)."""
    if COND:  # the fallback pass (module docstring): only where the block-start check failed
        if tl.load(flag_ptr) == 0:
            return
    c = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)  # B·H·T·d may pass 2**31
    pv = tl.program_id(2)
    b = bh // H
    h = bh % H
    NC = tl.cdiv(T, C)
    out_eps = tl.load(params_ptr + 3).to(tl.float32)
    ot = tl.arange(0, C)
    ok = tl.arange(0, BK)
    ov = pv * BVB + tl.arange(0, BVB)
    kmask = ok < DK
    vmask = ov < DV
    tok = c * C + ot
    tmask = tok < T
    mk = tmask[:, None] & kmask[None, :]
    io = b * T * s_t + h * s_h + tok[:, None] * s_t + ok[None, :]
    Q = tl.load(q_ptr + io, mask=mk, other=0.0).to(tl.float32)
    Ag = tl.load(gate_ptr + bh * TP * BK + tok[:, None] * BK + ok[None, :], mask=mk, other=0.0)
    E = tl.load(e_ptr + bh * TP * BV + tok[:, None] * BV + ov[None, :])
    S = tl.load(s_chunks_ptr + ((bh * NC + c) * BV + ov[:, None]) * BK + ok[None, :])
    if BUG == 2:
        causal = ot[:, None] > ot[None, :]
    else:
        causal = ot[:, None] >= ot[None, :]
    P = tl.where(causal, _mm(Q, tl.trans(Ag), OP, PREC), 0.0)
    O = _mm(Q, tl.trans(S), OP, PREC)
    O += _mm(P, E, OP, PREC)
    if NORMALIZE_OUTPUT or SAVE_CHAIN:
        Kr = tl.load(k_ptr + io, mask=mk, other=0.0).to(tl.float32)
        z = tl.load(z_chunks_ptr + ((b * NC + c) * H + h) * DK + ok, mask=kmask, other=0.0)
        Z = z[None, :] + tl.cumsum(Kr, axis=0)
        zq = tl.sum(Z * Q, axis=1)
        if NORMALIZE_OUTPUT:
            O = O / tl.maximum(zq, out_eps)[:, None]
        if SAVE_CHAIN:
            if pv == 0:
                if BUG == 9:  # BUG_SAVED_NORMALISER_BEFORE_KEY (jit functions read literals)
                    zq = tl.sum((Z - Kr) * Q, axis=1)
                sp = sc_ptr + (bh.to(tl.int64) * T + tok) * 2
                tl.store(sp, tl.sum(Q * Ag, axis=1), mask=tmask)
                tl.store(sp + 1, zq, mask=tmask)
    op = o_ptr + b * T * so_t + h * so_h + tok[:, None] * so_t + ov[None, :]
    tl.store(op, O.to(o_ptr.dtype.element_ty), mask=tmask[:, None] & vmask[None, :])
