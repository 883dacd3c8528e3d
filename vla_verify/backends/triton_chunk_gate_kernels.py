"""The penalty chain of spec §2.3 in chunks (spec §5, Woodbury / LDLᵀ): a Triton gate kernel.

:func:`vla_gate_chunk_kernel` is a drop-in for the forward's recurrent gate kernel
(:func:`~vla_verify.backends.triton_fused_kernels.vla_gate_kernel`): for one (b, h) it writes the
same per-token ``k̂, α̂, (α̂ᵀq, z_tᵀq)`` that the state pass reads, the final ``A, z`` and the
checkpoints, but it walks the sequence a chunk of up to ``C`` tokens at a time.  The recurrent
kernel's cost is a chain of dependent cross-warp reductions over the ``dk × dk`` tile per token
(``docs/design/triton_recurrent.md``); here, per chunk, everything but one ``C``-step LDLᵀ
recursion on a ``C × C`` tile is a matrix product (``tl.dot``):

    Y = U A_0ᵀ,  KA = K̂ A_0ᵀ                     (rows: (A_0 u_t)ᵀ, (A_0 k̂_t)ᵀ)
    I + G = L D Lᵀ,  G[t, j] = u_tᵀ A_0 u_j        (lower triangle; pivots clamped at sm_floor)
    W = L^{-1} Y                                  (row j: s_jᵀ, the Sherman–Morrison vector)
    α_tᵀ = (KA)_t − Σ_{j≤t} (k̂_tᵀ w_j / d_j) w_jᵀ  (the gate from the UPDATED A_t)
    A_C = A_0 − Wᵀ D^{-1} W  (+ nudge_eta·I when the nudge period ends the chunk)

The pivots ``d_j`` are the Sherman–Morrison denominators ``δ_j`` of spec §2.3, so the floor
``max(δ_j, sm_floor)`` is a clamped pivot, exact.  ``L^{-1}`` of the unit lower triangular ``L``
is ``(I − N)(I + N²)(I + N⁴)…`` with ``N = L − I`` nilpotent: ``log2 C`` products, no
triangular solve.

Chunks end where the recurrence is not a rank-``C`` Woodbury update: after a nudge step
(``(t + 1) % nudge_period == 0``, so the nudge only ever follows a chunk's last token), at a
checkpoint boundary (``t % CK == 0`` starts a chunk) and at the segment's end.  A chunk of ``L <
C`` tokens runs with rows ``L..C-1`` zero (``u = 0`` is an exact no-op of the chain).

Precision.  The penalty chain (``A``, ``Y``, ``G``, ``L``, ``W``, ``α``) is float64.  The
Woodbury form re-derives every ``A_t`` of a chunk from the chunk-start ``A_0``; its rounding is
``u·‖A_0‖``, where the step-by-step recurrence makes ``u·‖A_{t-1}‖``, and one strong penalty can
shrink ``A`` by orders of magnitude inside a chunk — a float32 Woodbury chain was up to 10³× the
spec §4 budget there (:mod:`vla_verify.backends.torch_chunked`, "Precision").  In float64 that
error is ``u_64·‖A_0‖``, far below the float32 recurrence's.  ``A`` lives in a float64 scratch
``[B·H, 2, BK, BK]`` in global memory (L2-resident; two buffers, read one, write the other),
processed in row blocks of ``BKB``, so the kernel does not hold ``dk²`` float64 values in
registers; the state the wrapper sees (final ``A``, checkpoints) is rounded to ``ACC``.  The key
half (``k̂``, ``z``, ``z_tᵀq``) and the gate's normalisation run in ``ACC`` with correctly
rounded division and square root, as the recurrent kernel does.

Every matrix in memory is transposed as in :mod:`.triton_fused_kernels` (``Aᵀ`` ``[DK, DK]``).
"""

from __future__ import annotations

import triton
import triton.language as tl

from vla_verify.backends.triton_fused_kernels import _div, _load_params, _sqrt


@triton.jit
def _copy_a_block(src_ptr, src_row, dst_ptr, dst_row, rows, ok, m, dtype: tl.constexpr):
    """Copy the row block ``rows`` of a ``[*, BK]`` matrix between two row strides, cast."""
    x = tl.load(src_ptr + rows[:, None] * src_row + ok[None, :], mask=m, other=0.0)
    tl.store(dst_ptr + rows[:, None] * dst_row + ok[None, :], x.to(dtype), mask=m)


@triton.jit
def _unit_lower_inverse(Lm, eye, C: tl.constexpr, LOG2C: tl.constexpr):
    """``L^{-1}`` of a unit lower triangular ``[C, C]`` float64 tile: with ``N = L − I``
    (nilpotent, ``N^C = 0``), ``L^{-1} = Σ_{i<C} (−N)^i = (I − N)(I + N²)(I + N⁴)…``."""
    N = Lm - tl.where(eye, 1.0, 0.0).to(tl.float64)
    inv = tl.where(eye, 1.0, 0.0).to(tl.float64) - N
    P = N
    for _ in tl.static_range(LOG2C - 1):
        P = tl.dot(P, P)
        inv = inv + tl.dot(inv, P)
    return inv


@triton.jit
def _ldl_clamped(M, n, floor, oc, C: tl.constexpr):
    """``M = L D Lᵀ`` of a symmetric ``[C, C]`` float64 tile, right-looking, every pivot clamped
    ``d_j = max(d_j, floor)`` (the floored Sherman–Morrison denominators, spec §2.3); only the
    first ``n`` pivots are eliminated (``L`` is the identity, ``d`` one, past them).
    Returns ``(L, d)``."""
    col = oc[None, :]
    row = oc[:, None]
    Lm = tl.where(row == col, 1.0, 0.0).to(tl.float64)
    d = tl.full([C], 1.0, tl.float64)
    for j in range(n):
        c = tl.sum(tl.where(col == j, M, 0.0), axis=1)  # column j, indexed by row
        r = tl.sum(tl.where(row == j, M, 0.0), axis=0)  # row j (= column j: M is symmetric)
        dj = tl.maximum(tl.sum(tl.where(oc == j, c, 0.0), axis=0), floor)
        lj = tl.where(oc > j, c / dj, 0.0)
        Lm = Lm + tl.where(col == j, lj[:, None], 0.0)
        d = tl.where(oc == j, dj, d)
        # The trailing block loses l_j d_j l_jᵀ = l_j c_jᵀ; entries left of column j are not
        # read again (with a clamped pivot they are not zero, and need not be).
        M = M - lj[:, None] * r[None, :]
    return Lm, d


@triton.jit
def vla_gate_chunk_kernel(
    q_ptr,
    k_ptr,
    u_ptr,
    kh_ptr,
    ah_ptr,
    sc_ptr,
    a0_ptr,
    z0_ptr,
    aT_ptr,
    zT_ptr,
    cka_ptr,
    ckz_ptr,
    ascr_ptr,
    wscr_ptr,
    p_ptr,
    T,
    H,
    DK,
    nudge_period,
    CK,
    NC,
    t_begin,
    n_steps,
    BK: tl.constexpr,
    C: tl.constexpr,
    LOG2C: tl.constexpr,
    BKB: tl.constexpr,
    HAS_INIT: tl.constexpr,
    SAVE_CKPT: tl.constexpr,
    NORM_GATE: tl.constexpr,
    ACC: tl.constexpr,
    BUG: tl.constexpr = 0,
    ANATOMY: tl.constexpr = 0,
):
    """Pass 1 of the two-pass forward, by chunks (module docstring): for one (b, h), tokens
    ``t_begin ≤ t < t_begin + n_steps`` of a length-``T`` sequence.

    Inputs ``q, k, u`` ``[B, T, H, DK]``; writes ``k̂, α̂`` to ``kh, ah`` ``[B·H, n_steps, BK]``
    (``ACC``, zero past ``DK``), ``(α̂ᵀq, z_tᵀq)`` to ``sc`` ``[B·H, n_steps, 2]``, the last
    ``Aᵀ, z`` to ``aT, zT`` and (``SAVE_CKPT``) ``(Aᵀ, z)`` at every ``t % CK == 0`` and after the
    last token into slot ``NC``, exactly like the recurrent gate kernel.  ``ascr`` is a float64
    scratch ``[B·H, 2, BK, BK]``, ``wscr`` a float64 scratch ``[B·H, 3, C, BK]``.  ``BK ≥ 16``
    and ``C ≥ 16`` (``tl.dot``), ``C = 2**LOG2C``, ``BKB`` divides ``BK``.  ``BUG`` plants the
    recurrent kernel's bugs 1 and 2 (meta-tests only); ``ANATOMY`` skips parts, to time the
    others (``benchmarks/gpu/chunk_gate_anatomy.py`` only: the results are then wrong).
    """
    i_bh = tl.program_id(0).to(tl.int64)
    i_b = i_bh // H
    i_h = i_bh % H
    ok = tl.arange(0, BK)
    ob = tl.arange(0, BKB)
    oc = tl.arange(0, C)
    mk = ok < DK
    eye_c = oc[:, None] == oc[None, :]
    lower = oc[:, None] >= oc[None, :]  # j ≤ t: the gate reads the UPDATED A_t
    if BUG == 1:  # planted: α_t = A_{t-1} k̂_t, the gate from the old A
        gate_mask = oc[:, None] > oc[None, :]
    else:
        gate_mask = lower
    # The nudge follows step t (1-based) with t % nudge_period == 0, i.e. token index i with
    # (i + 1) % nudge_period == 0; planted bug 2 shifts it one step late.
    shift = 1 if BUG == 2 else 0
    lam, sm_floor, nudge_eta, _out_eps, norm_eps = _load_params(p_ptr)
    floor = sm_floor.to(tl.float64)
    eta64 = nudge_eta.to(tl.float64)
    scr = ascr_ptr + i_bh * 2 * BK * BK  # two [BK, BK] float64 buffers: read one, write one
    vscr = wscr_ptr + i_bh * 3 * C * BK  # U, k̂, W of the chunk [C, BK] each, float64
    wscr = vscr + 2 * C * BK
    # A_0 into buffer 0 (float64), row block by row block.
    for kb in tl.static_range(BK // BKB):
        rows = kb * BKB + ob
        m = (rows < DK)[:, None] & mk[None, :]
        if HAS_INIT:
            a = tl.load(
                a0_ptr + i_bh * DK * DK + rows[:, None] * DK + ok[None, :], mask=m, other=0.0
            )
            a = a.to(tl.float64)
        else:
            a = tl.where(rows[:, None] == ok[None, :], 1.0 / lam.to(tl.float64), 0.0)
        # the whole [BK, BK] buffer: its padding (past DK) must be zeros, not torch.empty's bits
        tl.store(scr + rows[:, None] * BK + ok[None, :], tl.where(m, a, 0.0))
    if HAS_INIT:
        z = tl.load(z0_ptr + i_bh * DK + ok, mask=mk, other=0.0).to(ACC)
    else:
        z = tl.zeros([BK], dtype=ACC)
    tl.debug_barrier()
    base_k = (i_b * T * H + i_h) * DK
    stride_k = H * DK
    t_end = t_begin + n_steps
    start = t_begin
    par = 0
    while start < t_end:
        cur = scr + par * BK * BK
        nxt = scr + (1 - par) * BK * BK
        # The chunk: at most C tokens, ending at the segment's end, after a nudge step, and
        # before a checkpoint boundary.
        n = tl.minimum(C, t_end - start)
        n = tl.minimum(n, nudge_period - (start - shift + nudge_period) % nudge_period)
        if SAVE_CKPT:
            n = tl.minimum(n, CK - start % CK)
            if start % CK == 0:
                c = (i_bh * (NC + 1) + start // CK).to(tl.int64)
                for kb in tl.static_range(BK // BKB):
                    rows = kb * BKB + ob
                    m = (rows < DK)[:, None] & mk[None, :]
                    _copy_a_block(cur, BK, cka_ptr + c * DK * DK, DK, rows, ok, m, ACC)
                tl.store(ckz_ptr + c * DK + ok, z, mask=mk)
        # --- key half, in ACC: k̂ = k / max(‖k‖, norm_eps), z_t = z_{t-1} + k_t, z_tᵀq.
        mrow = oc < n
        m_ck = mrow[:, None] & mk[None, :]
        off = base_k + (start + oc)[:, None].to(tl.int64) * stride_k + ok[None, :]
        K = tl.load(k_ptr + off, mask=m_ck, other=0.0).to(ACC)
        Q = tl.load(q_ptr + off, mask=m_ck, other=0.0).to(ACC)
        knorm = _sqrt(tl.sum(K * K, axis=1), ACC)
        rk = tl.maximum(knorm, norm_eps)
        Kh = _div(K, rk[:, None], ACC)
        Z = tl.cumsum(tl.where(oc[:, None] == 0, K + z[None, :], K), axis=0)  # z_{t-1} + k_t, …
        zq = tl.sum(Z * Q, axis=1)
        z = tl.sum(tl.where(oc[:, None] == C - 1, Z, 0.0), axis=0)  # rows past n add zeros
        # --- penalty half, in float64.  U and k̂ reach the products through a float64 scratch:
        # Triton 3.6 sizes a dot operand's registers by the narrowest type in its chain of
        # casts (bf16 for U), and its fp64 MMA does not support that operand layout.
        off_c = oc[:, None] * BK + ok[None, :]
        tl.store(
            vscr + off_c,
            tl.where(mrow[:, None], tl.load(u_ptr + off, mask=m_ck, other=0.0).to(tl.float64), 0.0),
        )
        tl.store(vscr + C * BK + off_c, Kh.to(tl.float64))
        tl.debug_barrier()
        U = tl.load(vscr + off_c)
        K64 = tl.load(vscr + C * BK + off_c)
        Y = tl.zeros([C, BK], dtype=tl.float64)
        KA = tl.zeros([C, BK], dtype=tl.float64)
        for kb in tl.static_range(BK // BKB):
            rows = kb * BKB + ob
            a = tl.load(cur + rows[:, None] * BK + ok[None, :])  # Aᵀ rows j, all columns i
            if BKB == BK:
                Ub = U
                Kb = K64
            else:  # the same column block of u and k̂
                Ub = tl.load(vscr + oc[:, None] * BK + rows[None, :])
                Kb = tl.load(vscr + C * BK + oc[:, None] * BK + rows[None, :])
            if (ANATOMY & 8) == 0:
                Y += tl.dot(Ub, a)  # Y[t, i] = Σ_j u_t[j] A[i, j]
                KA += tl.dot(Kb, a)
        if (ANATOMY & 8) != 0:
            Y = U + Y
            KA = K64 + KA
            G = tl.zeros([C, C], dtype=tl.float64)
        else:
            G = tl.dot(
                Y, tl.trans(U)
            )  # G[t, j] = (A_0 u_t)ᵀ u_j; the lower triangle is u_tᵀ A_0 u_j
        M = tl.where(lower, G, tl.trans(G)) + tl.where(eye_c, 1.0, 0.0).to(tl.float64)
        if (ANATOMY & 1) != 0:
            Lm = tl.where(eye_c, M, 0.0)
            d = tl.sum(tl.where(eye_c, M, 0.0), axis=1)
        else:
            Lm, d = _ldl_clamped(M, n, floor, oc, C)
        if (ANATOMY & 2) != 0:
            Linv = Lm
        else:
            Linv = _unit_lower_inverse(Lm, eye_c, C, LOG2C)
        if (ANATOMY & 8) != 0:
            W = Y + tl.sum(Linv, axis=1)[:, None]
            Ws = W / d[:, None]
            alpha = KA - Ws
        else:
            W = tl.dot(Linv, Y)  # row j: s_jᵀ
            Ws = W / d[:, None]
            X = tl.where(gate_mask, tl.dot(K64, tl.trans(Ws)), 0.0)  # X[t, j] = k̂_tᵀ w_j / d_j
            alpha = KA - tl.dot(X, W)
        nudge = (((start + n - shift) % nudge_period) == 0) & (start + n - shift > 0)
        eta = tl.where(nudge, eta64, 0.0)
        if BUG != 1:
            alpha += tl.where(oc[:, None] == n - 1, eta * K64, 0.0)  # the last gate sees it
        # --- A_C = A_0 − Wᵀ D^{-1} W (+ η I) into the other buffer.
        if BKB < BK:
            tl.store(wscr + off_c, W)
            tl.debug_barrier()
        if (ANATOMY & 4) == 0:
            for kb in tl.static_range(BK // BKB):
                rows = kb * BKB + ob
                a = tl.load(cur + rows[:, None] * BK + ok[None, :])
                if BKB == BK:
                    Wb = W
                else:
                    Wb = tl.load(wscr + oc[:, None] * BK + rows[None, :])
                a = a - tl.dot(tl.trans(Wb), Ws)  # Aᵀ[j, i] −= Σ_t w_t[j] w_t[i] / d_t
                a += tl.where((rows[:, None] == ok[None, :]) & (rows < DK)[:, None], eta, 0.0)
                tl.store(nxt + rows[:, None] * BK + ok[None, :], a)
        # --- gates, in ACC.
        al = alpha.to(ACC)
        anorm = _sqrt(tl.sum(al * al, axis=1), ACC)
        aq = tl.sum(al * Q, axis=1)
        if NORM_GATE:
            rn = tl.maximum(anorm, norm_eps)
            ah = _div(al, rn[:, None], ACC)
            ahq = _div(aq, rn, ACC)
        else:
            ah = al
            ahq = aq
        i_tok = (start - t_begin + oc).to(tl.int64)
        row_out = (i_bh * n_steps + i_tok)[:, None] * BK + ok[None, :]
        m_out = mrow[:, None] & (ok < BK)[None, :]
        tl.store(kh_ptr + row_out, Kh, mask=m_out)
        tl.store(ah_ptr + row_out, ah, mask=m_out)
        sc = sc_ptr + (i_bh * n_steps + i_tok) * 2
        tl.store(sc, ahq, mask=mrow)
        tl.store(sc + 1, zq, mask=mrow)
        tl.debug_barrier()  # the new A is complete (and the W scratch free) for the next chunk
        start += n
        if (ANATOMY & 4) == 0:
            par = 1 - par
    cur = scr + par * BK * BK
    for kb in tl.static_range(BK // BKB):
        rows = kb * BKB + ob
        m = (rows < DK)[:, None] & mk[None, :]
        _copy_a_block(cur, BK, aT_ptr + i_bh * DK * DK, DK, rows, ok, m, ACC)
        if SAVE_CKPT:
            c = (i_bh * (NC + 1) + NC).to(tl.int64)
            _copy_a_block(cur, BK, cka_ptr + c * DK * DK, DK, rows, ok, m, ACC)
    tl.store(zT_ptr + i_bh * DK + ok, z, mask=mk)
    if SAVE_CKPT:
        c = (i_bh * (NC + 1) + NC).to(tl.int64)
        tl.store(ckz_ptr + c * DK + ok, z, mask=mk)
