"""Triton kernels of the fused recurrent VLA backend: spec §2.3, forward and backward.

Only kernels live here (``@triton.jit`` functions); the launch wrappers, the autograd Function and
the registry backend are in :mod:`vla_verify.backends.triton_fused`.  Nothing is imported from the
oracle or from the other backends (spec §4 independence): every line of the recurrence is written
out below.

Organisation (``docs/design/triton_recurrent.md`` has the cost model behind it)
-------------------------------------------------------------------------------
Forward, :func:`vla_fwd_kernel`: grid ``(NV, B·H)``.  One program runs *all* T steps of one
(batch, head) for one block of ``BV`` value rows: ``Aᵀ`` ``[BK, BK]``, ``Sᵀ`` ``[BK, BV]`` and ``z``
``[BK]`` stay in registers for the whole sequence, in float32 (float64 for float64 inputs).  The
penalty chain ``A`` is shared by all value blocks and is recomputed by each of them: at
B·H = 16 the chip has 132 SMs, so splitting the value rows over NV programs costs no wall time
for the redundant chain and divides the ``S`` work by NV.

The step (:func:`_vla_step_t`) is a chain of dependent reductions, and its cost on the H200 is
their latency, not arithmetic (``docs/design/triton_recurrent.md``).  Four choices shorten it:

- the tiles are held transposed, so that ``A u``, ``A k̂``, ``S k̂`` and ``S q`` are sums down
  axis 0 (thread-local adds and one cross-warp exchange) instead of per-row shuffle butterflies;
- independent sums share one reduction (:func:`_sum_pair`): ``(‖k‖², z_tᵀq)``, ``(S k̂, S q)``,
  ``(‖α‖², αᵀq)`` — the read-out is ``S_t q = S_{t-1} q + e (αᵀq)/‖α‖``;
- the downdate ``A − (s_i s_j)/δ`` is one ``tl.fma`` per entry by default (``DOWNDATE``), the
  oracle's error bound without a correctly rounded division per entry;
- the next token's ``q, k, v, u`` are loaded one iteration ahead (software prefetch).

The two-pass gate kernel adds (``docs/design/triton_recurrent.md``): the
pipelined step (:func:`_gate_pipelined_t`, ``u`` loaded two tokens ahead), axis-0 sums as
interleaved partial sums (:func:`_colsum`, only where the kernel neither loads nor stores the
``A`` tile: see ``_gate_split`` in the wrapper) and the nudge under a branch at BK <= 64.

The gate is still formed from the UPDATED ``A_t`` by a second pass (spec §2.3): the one-pass
shortcut ``A_{t-1}k̂ − s(sᵀk̂)/δ`` cancels at the scale of ``|A_{t-1}k̂|`` and failed the spec §4
budget on an ill-conditioned downdate.  :func:`_vla_step` is the same step on untransposed
tiles; the backward, which needs ``S`` and ``A`` row-wise, uses it.

Two-pass forward, :func:`vla_gate_kernel` then :func:`vla_state_kernel`: the same step cut at
the gate.  The gate kernel (grid ``(B·H,)``) holds only ``Aᵀ`` and writes ``k̂, α̂`` and two
scalars per token; the state kernel (grid ``(NV, B·H)``) runs the generalized delta rule on them.
At dk = 128 the fused program's ``A`` and ``S`` tiles do not fit its registers together; apart,
each does.  Its backward is three kernels per segment of tokens (:func:`vla_gate_kernel` rerun
from a checkpoint, :func:`vla_state_bwd_kernel` per value block, :func:`vla_gate_bwd_kernel`).
Every matrix the two-pass kernels read or write — initial and final states, checkpoints and
their gradients — is in memory *transposed* (``Aᵀ`` ``[DK, DK]``, ``Sᵀ`` ``[DK, DV]``, row-major),
as the tiles hold it: a tile loaded through transposed offsets gets a layout whose axis-0 sums
are shuffle butterflies (1813 ``SHFL`` per token in the gate kernel's SASS at BK = 128 against
35), and a loop-carried tile keeps the layout it was loaded with.  The wrapper transposes the
user-facing states.

Streamed two-pass forward, :func:`vla_stream_kernel` (the default): both passes in one launch,
grid ``(B·H·(1 + NV),)``; the first ``B·H`` programs to start run the gate pass
(:func:`_gate_pass`, the body of :func:`vla_gate_kernel`), the others the state pass of one value
block (:func:`_state_pass`), reading each block of gates once the gate program has published it
(per-(b, h) progress counts, release/acquire).  Same operations as the two kernels; the forward
costs about the gate pass.  In the pipelined gate step the next token's key sums join the
current token's last reduction (``KEY_AHEAD``).

Backward, :func:`vla_bwd_kernel`: grid ``(B·H,)``, chunks of ``C`` tokens in reverse.  For each
chunk it reloads the checkpoint of ``(S, A, z)`` that the forward stored at the chunk start,
recomputes the C steps (storing per-token *vectors* — k̂, s, α̂, e and a few scalars — in a
per-program scratch of C rows), then walks the chunk backwards, reconstructing
``S_{t-1} = S_t − e α̂ᵀ``, ``A_{t-1} = A_t + s sᵀ/δ − η_t I`` and ``z_{t-1} = z_t − k_t`` from
the stored vectors (rounding errors add up over at most C steps, never over T) while
accumulating the adjoints ``dS, dA, dz``.
"""

from __future__ import annotations

import triton
import triton.language as tl

# Planted bugs, for the meta-tests that prove the checks can fail (never used otherwise).
BUG_NONE = 0
BUG_GATE_FROM_OLD_A = 1  # α_t = A_{t-1} k̂ (the gate from the old A)
BUG_NUDGE_ONE_STEP_LATE = 2  # nudge after step t with (t − 1) % period == 0
BUG_DK_SIGN = 3  # backward: drop the -S_{t-1}ᵀ de term of dk̂
BUG_FOLD_DROPS_NUDGES = 4  # NUDGE_SCALAR: each fold zeroes c without adding it to the tile

# How a pipelined gate step adds the nudge: NUDGE_BRANCH False/True (a select over the tile every
# step / under a branch), or, from the period loop of _gate_pass, known at compile time, or
# NUDGE_SCALAR: A is kept as B + c·I, the nudge adds η to the scalar c, and _gate_pass folds c
# into the tile's diagonal once every FOLD_EVERY tokens.
NUDGE_NEVER = tl.constexpr(3)
NUDGE_ALWAYS = tl.constexpr(4)
NUDGE_SCALAR = tl.constexpr(5)
#: Tokens between folds of the scalar shift c into the tile (NUDGE_SCALAR): c then stays below
#: η·⌈FOLD_EVERY / nudge_period⌉, so B = A − c·I loses nothing to cancellation.
FOLD_EVERY = tl.constexpr(64)

# The Sherman–Morrison downdate of A (a performance/accuracy trade-off, option ``downdate``).
DOWNDATE_EXACT = 0  # A − (s_i s_j)/δ, correctly rounded division per entry (the oracle's order)
DOWNDATE_FMA = 1  # fma(−s_i s_j, 1/δ, A): a multiply and one FMA per entry


@triton.jit
def _div(x, y, ACC: tl.constexpr):
    """Division rounded to nearest (IEEE); plain ``/`` of float32 compiles to an approximate
    ``div.full.f32`` on NVIDIA GPUs, which would not match the float32 oracle's rounding."""
    if ACC == tl.float64:
        return x / y
    else:
        return tl.math.div_rn(x, y)


@triton.jit
def _sqrt(x, ACC: tl.constexpr):
    """Square root rounded to nearest (``tl.sqrt`` of float32 is an approximation on GPUs)."""
    if ACC == tl.float64:
        return tl.sqrt(x)
    else:
        return tl.sqrt_rn(x)


@triton.jit
def _vla_step(
    A,
    S,
    z,
    q,
    k,
    v,
    u,
    t,
    eye,
    nudge_period,
    nudge_eta,
    sm_floor,
    out_eps,
    norm_eps,
    NORM_GATE: tl.constexpr,
    NORM_OUT: tl.constexpr,
    ACC: tl.constexpr,
    BUG: tl.constexpr,
    DOWNDATE: tl.constexpr = 0,
):
    """One step of spec §2.3 at 0-based token ``t`` (global step ``t + 1``).

    ``A`` ``[BK, BK]``, ``S`` ``[BV, BK]``, ``z`` ``[BK]``; ``q, k, u`` ``[BK]``, ``v`` ``[BV]``;
    all in the accumulation dtype, zero in the padding.  Returns the new state, the read-out
    ``o_t`` ``[BV]`` and the per-token quantities the backward needs.
    """
    # k̂_t = k_t / max(||k_t||, norm_eps)
    knorm = _sqrt(tl.sum(k * k, axis=0), ACC)
    kh = _div(k, tl.maximum(knorm, norm_eps), ACC)
    # s = A_{t-1} u (rows i, reduce over j); A_{t-1} k̂ only for the planted bug (dead code
    # otherwise, removed by the compiler).
    s = tl.sum(A * u[None, :], axis=1)
    Ak = tl.sum(A * kh[None, :], axis=1)
    delta_raw = 1.0 + tl.sum(u * s, axis=0)
    delta = tl.maximum(delta_raw, sm_floor)
    # Sherman–Morrison: A_t = A_{t-1} − (s_i s_j)/δ.  The product s_i s_j is symmetric, so A
    # stays exactly symmetric in floating point: the asymmetric s (s/δ)ᵀ loses symmetry and was
    # measured 3-6x less accurate than the float32 oracle (docs/design/triton_recurrent.md).
    rd = _div(1.0, delta, ACC)
    if BUG == 2:
        step = t
    else:
        step = t + 1
    # nudge_period >= 1 always (the wrapper passes 2**31 - 1 for 'never').
    nudge = (step % nudge_period == 0) & (step > 0)
    eta = tl.where(nudge, nudge_eta, 0.0)
    # A true (rounded-to-nearest) division of each s_i s_j by δ, as the oracle does: the cheaper
    # (s_i s_j)·(1/δ) rounds three times instead of two and, in ill-conditioned downdates
    # (cond(M) ~ 1e8), left the float32 kernel 2.5x outside the spec §4 budget.
    if DOWNDATE == 1:  # DOWNDATE_FMA, see _vla_step_t
        A = tl.fma(-(s[:, None] * s[None, :]), _div(1.0, delta, ACC), A)
    else:
        A = A - _div(s[:, None] * s[None, :], delta, ACC)
    if nudge:
        A = tl.where(eye, A + eta, A)
    # Gate from the UPDATED A_t (spec §2.3), by a second pass over A.  The one-pass shortcut
    # A_{t-1}k̂ − s(sᵀk̂)/δ + ηk̂ cancels at the scale of |A_{t-1}k̂| instead of that of A's
    # entries, and measured 2.1x the float32 oracle's error on an ill-conditioned downdate on
    # the H200 (cond(M) ~ 1e5, T = 1): outside the spec §4 budget.
    if BUG == 1:
        alpha = Ak
    else:
        alpha = tl.sum(A * kh[None, :], axis=1)
    anorm = _sqrt(tl.sum(alpha * alpha, axis=0), ACC)
    if NORM_GATE:
        ah = _div(alpha, tl.maximum(anorm, norm_eps), ACC)
    else:
        ah = alpha
    # One pass over S_{t-1}: S_{t-1} k̂ and S_{t-1} q.
    Sk = tl.sum(S * kh[None, :], axis=1)
    Sq = tl.sum(S * q[None, :], axis=1)
    e = v - Sk
    S = S + e[:, None] * ah[None, :]
    z = z + k
    # Read-out from S_t: S_t q = S_{t-1} q + e (α̂ᵀ q).
    o = Sq + e * tl.sum(ah * q, axis=0)
    zq = tl.sum(z * q, axis=0)
    if NORM_OUT:
        o = _div(o, tl.maximum(zq, out_eps), ACC)
    return A, S, z, o, kh, s, ah, e, delta_raw, delta, rd, anorm, knorm, zq


@triton.jit
def _add_pair(a0, b0, a1, b1):
    """Combine function of a two-output sum (:func:`_sum_pair`)."""
    return a0 + a1, b0 + b1


@triton.jit
def _sum_pair(a, b, axis: tl.constexpr):
    """``(tl.sum(a, axis), tl.sum(b, axis))`` in ONE reduction: one round of shuffles and one
    cross-warp exchange for both, where two ``tl.sum`` calls pay for two."""
    return tl.reduce((a, b), axis, _add_pair)


@triton.jit
def _colsum(x, SPLIT: tl.constexpr):
    """``tl.sum(x, axis=0)`` of a tile ``[BK, N]`` as ``SPLIT`` partial sums of ``BK/SPLIT`` rows
    each, added last.  A sum down axis 0 is a thread-local chain of dependent adds (the layout
    puts a whole column in one thread), ``BK`` adds long; ``SPLIT`` independent chains of
    ``BK/SPLIT`` overlap in the pipeline (gate kernel on the H200, T = 4096, dk = 128: 1.69 ->
    1.27 µs per token, ``benchmarks/results/h200/gate_anatomy.json``).  A different grouping of
    the same sum, with a smaller error bound than one chain."""
    if SPLIT > 1:
        r = tl.reshape(x, [SPLIT, x.shape[0] // SPLIT, x.shape[1]])
        return tl.sum(tl.sum(r, axis=1), axis=0)
    else:
        return tl.sum(x, axis=0)


@triton.jit
def _colsum_pair(a, b, SPLIT: tl.constexpr):
    """``(_colsum(a), _colsum(b))`` in one reduction (see :func:`_sum_pair`)."""
    if SPLIT > 1:
        ra = tl.reshape(a, [SPLIT, a.shape[0] // SPLIT, a.shape[1]])
        rb = tl.reshape(b, [SPLIT, b.shape[0] // SPLIT, b.shape[1]])
        pa, pb = tl.reduce((ra, rb), 1, _add_pair)
        return tl.reduce((pa, pb), 0, _add_pair)
    else:
        return tl.reduce((a, b), 0, _add_pair)


@triton.jit
def _key_t(z, k, q, norm_eps, ACC: tl.constexpr):
    """The key half of a step (spec §2.3): ``z_t = z_{t-1} + k``, ``k̂ = k / max(‖k‖, norm_eps)``
    and the read-out denominator's ``z_tᵀq``, with ``‖k‖²`` and ``z_tᵀq`` in one reduction.
    Returns ``(z, k̂, z_tᵀq, ‖k‖)``."""
    z = z + k
    kk, zq = _sum_pair(k * k, z * q, 0)
    knorm = _sqrt(kk, ACC)
    kh = _div(k, tl.maximum(knorm, norm_eps), ACC)
    return z, kh, zq, knorm


@triton.jit
def _gate_t(
    At,
    kh,
    u,
    q,
    t,
    eye,
    nudge_period,
    nudge_eta,
    sm_floor,
    norm_eps,
    NORM_GATE: tl.constexpr,
    ACC: tl.constexpr,
    BUG: tl.constexpr,
    DOWNDATE: tl.constexpr,
    SPLIT: tl.constexpr = 1,
):
    """The penalty half of a step on the transposed tile ``At[j, i] = A[i, j]`` ``[BK, BK]``:
    Sherman–Morrison downdate by ``u``, the nudge, and the gate ``α̂`` from the UPDATED ``A_t``
    (spec §2.3).  Returns ``(At, α̂, α̂ᵀq)`` and, for the backward, ``(s, 1 + uᵀs, δ, ‖α‖)``.

    Every product is a sum down axis 0 of the tile (see :func:`_vla_step_t`); ``‖α‖²`` and
    ``αᵀq`` share one reduction.
    """
    if BUG == 1:
        s, Ak = _colsum_pair(At * u[:, None], At * kh[:, None], SPLIT)  # A_{t-1} u, A_{t-1} k̂
    else:
        s = _colsum(At * u[:, None], SPLIT)  # s_i = Σ_j A_ij u_j
        Ak = s  # unused
    delta_raw = 1.0 + tl.sum(u * s, axis=0)
    delta = tl.maximum(delta_raw, sm_floor)
    if BUG == 2:
        step = t
    else:
        step = t + 1
    nudge = (step % nudge_period == 0) & (step > 0)
    eta = tl.where(nudge, nudge_eta, 0.0)
    if DOWNDATE == 1:  # DOWNDATE_FMA
        # A − (s_i s_j)·(1/δ) in one explicit fused multiply-add (tl.fma rounds once on the GPU
        # and in the interpreter alike): the term carries the roundings of s_i s_j and 1/δ, the
        # result one more — the same error bound as the oracle's fl(A − fl(s_i s_j)/δ), with a
        # multiply and an FMA per entry instead of a correctly rounded division.  Still exactly
        # symmetric.  (A − h hᵀ with h = s/√δ was cheaper by one multiply but carries four
        # roundings in the term; it failed validate in a dk = 1 ill-conditioned downdate.)
        At = tl.fma(-(s[:, None] * s[None, :]), _div(1.0, delta, ACC), At)
    else:
        At = At - _div(s[:, None] * s[None, :], delta, ACC)
    # Branch-free nudge (eta = 0 off the period): a tile-valued `if` keeps two copies of A live,
    # which spilled registers at BK = 128.
    At = At + tl.where(eye, eta, 0.0)
    if BUG == 1:
        alpha = Ak
    else:
        alpha = _colsum(At * kh[:, None], SPLIT)  # α_i = Σ_j A_t[i, j] k̂_j
    aa, aq = _sum_pair(alpha * alpha, alpha * q, 0)
    anorm = _sqrt(aa, ACC)
    if NORM_GATE:
        rn = tl.maximum(anorm, norm_eps)
        ah = _div(alpha, rn, ACC)
        ahq = _div(aq, rn, ACC)
    else:
        ah = alpha
        ahq = aq
    return At, ah, ahq, s, delta_raw, delta, anorm


@triton.jit
def _state_read_t(St, kh, q):
    """``(S_{t-1} k̂, S_{t-1} q)`` ``[BV]`` each from ``St[j, r] = S[r, j]`` ``[BK, BV]``, in one
    reduction (one chain: split sums made the state and fused kernels slower on the H200)."""
    return _sum_pair(St * kh[:, None], St * q[:, None], 0)


@triton.jit
def _state_write_t(St, Sk, Sq, ah, ahq, zq, v, out_eps, NORM_OUT: tl.constexpr, ACC: tl.constexpr):
    """The state half of a step: ``e = v − S_{t-1}k̂``, ``S_t = S_{t-1} + e α̂ᵀ`` and the read-out
    ``o_t = (S_{t-1}q + e (α̂ᵀq)) / max(z_tᵀq, out_eps)`` (spec §2.3; ``S_t q`` without a second
    pass over ``S``).  Returns ``(St, o)``."""
    e = v - Sk
    St = St + ah[:, None] * e[None, :]
    o = Sq + e * ahq
    if NORM_OUT:
        o = _div(o, tl.maximum(zq, out_eps), ACC)
    return St, o


@triton.jit
def _add_triple(a0, b0, c0, a1, b1, c1):
    """Combine function of a three-output sum (:func:`_sum_triple`)."""
    return a0 + a1, b0 + b1, c0 + c1


@triton.jit
def _sum_triple(a, b, c, axis: tl.constexpr):
    """Three independent sums in ONE reduction (see :func:`_sum_pair`)."""
    return tl.reduce((a, b, c), axis, _add_triple)


@triton.jit
def _add_five(a0, b0, c0, d0, e0, a1, b1, c1, d1, e1):
    """Combine function of a five-output sum (:func:`_gate_pipelined_t`, ``KEY_AHEAD``)."""
    return a0 + a1, b0 + b1, c0 + c1, d0 + d1, e0 + e1


@triton.jit
def _gate_pipelined_t(
    At,
    s,
    delta_raw,
    kh,
    u_next,
    q,
    t,
    eye,
    nudge_period,
    nudge_eta,
    sm_floor,
    norm_eps,
    NORM_GATE: tl.constexpr,
    ACC: tl.constexpr,
    BUG: tl.constexpr,
    DOWNDATE: tl.constexpr,
    SPLIT: tl.constexpr = 1,
    NUDGE_BRANCH: tl.constexpr = False,
    k_next=0.0,
    zk_next=0.0,
    q_next=0.0,
    KEY_AHEAD: tl.constexpr = False,
    c=0.0,
):
    """:func:`_gate_t` with the next token's Sherman–Morrison vector computed one step ahead.

    ``s = A_{t-1} u_t`` and ``1 + u_tᵀs`` arrive from the previous step; the updated ``A_t`` is
    then read once for both ``α_t = A_t k̂_t`` and ``s_{t+1} = A_t u_{t+1}`` (one paired
    reduction), and ``u_{t+1}ᵀs_{t+1}`` joins ``‖α_t‖²`` and ``α_tᵀq`` in a second: two
    dependent reductions per token instead of four, with the same operations on the same
    numbers as :func:`_gate_t`.  Returns ``_gate_t``'s seven values and ``(s_{t+1},
    1 + u_{t+1}ᵀs_{t+1})``, and ``(‖k_{t+1}‖², z_{t+1}ᵀq_{t+1})``.  (The planted bug
    BUG_GATE_FROM_OLD_A is not supported here.)

    ``KEY_AHEAD``: the next token's key sums, ``‖k_{t+1}‖²`` and ``z_{t+1}ᵀq_{t+1}`` with
    ``zk_next = z_t + k_{t+1}``, join the same reduction (five sums in one), so that the key
    half costs no reduction of its own on the token's critical path; otherwise they are
    returned as zeros' stand-ins and :func:`_key_t` runs in the token.

    ``NUDGE_BRANCH == NUDGE_SCALAR``: ``At`` holds ``B`` with ``A = B + c·I`` (spec §2.3's
    nudge ``A += η·I`` is ``c += η``), so ``α_t = B k̂_t + c k̂_t`` and ``s_{t+1} = B u_{t+1} +
    c u_{t+1}``: a scalar add and two vector FMAs instead of a select and an add over the tile
    per token.  The downdate acts on ``B`` (``A − s sᵀ/δ = (B − s sᵀ/δ) + c·I``).  Returns
    ``c`` last (unchanged in the other modes).
    """
    delta = tl.maximum(delta_raw, sm_floor)
    if BUG == 2:
        step = t
    else:
        step = t + 1
    nudge = (step % nudge_period == 0) & (step > 0)
    eta = tl.where(nudge, nudge_eta, 0.0)
    if DOWNDATE == 1:  # DOWNDATE_FMA, as in _gate_t
        At = tl.fma(-(s[:, None] * s[None, :]), _div(1.0, delta, ACC), At)
    else:
        At = At - _div(s[:, None] * s[None, :], delta, ACC)
    if NUDGE_BRANCH == NUDGE_NEVER:
        pass  # the caller knows no nudge falls on this token (_gate_pass, PERIOD_LOOP)
    elif NUDGE_BRANCH == NUDGE_ALWAYS:
        At = At + tl.where(eye, nudge_eta, 0.0)  # the caller knows one does
    elif NUDGE_BRANCH == NUDGE_SCALAR:
        c = c + eta
    elif NUDGE_BRANCH:
        # Only on nudge steps: the select over the tile was ~12% of the gate kernel's time per
        # token at dk = 64 (gate_anatomy.json); a tile-valued branch spills at BK = 128.
        if nudge:
            At = At + tl.where(eye, nudge_eta, 0.0)
    else:
        At = At + tl.where(eye, eta, 0.0)
    alpha, s_next = _colsum_pair(At * kh[:, None], At * u_next[:, None], SPLIT)
    if NUDGE_BRANCH == NUDGE_SCALAR:
        alpha = tl.fma(kh, c, alpha)
        s_next = tl.fma(u_next, c, s_next)
    if KEY_AHEAD:
        aa, aq, us, kk, zq = tl.reduce(
            (alpha * alpha, alpha * q, u_next * s_next, k_next * k_next, zk_next * q_next),
            0,
            _add_five,
        )
    else:
        aa, aq, us = _sum_triple(alpha * alpha, alpha * q, u_next * s_next, 0)
        kk = us  # unused
        zq = us
    anorm = _sqrt(aa, ACC)
    if NORM_GATE:
        rn = tl.maximum(anorm, norm_eps)
        ah = _div(alpha, rn, ACC)
        ahq = _div(aq, rn, ACC)
    else:
        ah = alpha
        ahq = aq
    return At, ah, ahq, s, delta_raw, delta, anorm, s_next, 1.0 + us, kk, zq, c


@triton.jit
def _vla_step_t(
    At,
    St,
    z,
    q,
    k,
    v,
    u,
    t,
    eye,
    nudge_period,
    nudge_eta,
    sm_floor,
    out_eps,
    norm_eps,
    NORM_GATE: tl.constexpr,
    NORM_OUT: tl.constexpr,
    ACC: tl.constexpr,
    BUG: tl.constexpr,
    DOWNDATE: tl.constexpr,
):
    """The step of :func:`_vla_step` on transposed tiles, for the fused forward kernel.

    ``At[j, i] = A[i, j]`` ``[BK, BK]`` and ``St[j, r] = S[r, j]`` ``[BK, BV]`` (the layout of
    fla's ``h [K, V]``).  Every matrix-vector product of the step, ``A u``, ``A k̂``, ``S k̂`` and
    ``S q``, is then a sum down axis 0.  Why: Triton lays a tile's columns across the 32 lanes of
    a warp, so a sum along axis 1 costs a 5-level shuffle butterfly *per row a thread holds*
    (~500 SHFL per step in the SASS of :func:`_vla_step` at BK = 64), where a sum along axis 0
    is a thread-local chain of adds plus one cross-warp exchange.  Independent sums share one
    reduction (:func:`_sum_pair`), so the step's critical path is five reductions: ``(‖k‖²,
    z_tᵀq)``, ``A u``, ``uᵀs``, ``A_t k̂``, ``(‖α‖², αᵀq)``; ``(S k̂, S q)`` is issued before the
    penalty half so that it runs beside it.  Same mathematics as :func:`_vla_step` (the gate is
    still a second pass, over the updated ``A_t``); the two-pass kernels
    (:func:`vla_gate_kernel`, :func:`vla_state_kernel`) run the same four pieces.  Returns
    ``(At, St, z, o)``.
    """
    z, kh, zq, _knorm = _key_t(z, k, q, norm_eps, ACC)
    Sk, Sq = _state_read_t(St, kh, q)
    At, ah, ahq, _s, _dr, _d, _an = _gate_t(
        At,
        kh,
        u,
        q,
        t,
        eye,
        nudge_period,
        nudge_eta,
        sm_floor,
        norm_eps,
        NORM_GATE,
        ACC,
        BUG,
        DOWNDATE,
    )
    St, o = _state_write_t(St, Sk, Sq, ah, ahq, zq, v, out_eps, NORM_OUT, ACC)
    return At, St, z, o


@triton.jit
def _load_params(p_ptr):
    """The configuration scalars of spec §2.2, in the accumulation dtype (so float64 runs keep
    lambda0 = 0.1 exact to float64, not rounded through a float32 kernel argument)."""
    lam = tl.load(p_ptr + 0)
    sm_floor = tl.load(p_ptr + 1)
    nudge_eta = tl.load(p_ptr + 2)
    out_eps = tl.load(p_ptr + 3)
    norm_eps = tl.load(p_ptr + 4)
    return lam, sm_floor, nudge_eta, out_eps, norm_eps


@triton.jit
def vla_fwd_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    u_ptr,
    o_ptr,
    s0_ptr,
    a0_ptr,
    z0_ptr,
    sT_ptr,
    aT_ptr,
    zT_ptr,
    cks_ptr,
    cka_ptr,
    ckz_ptr,
    p_ptr,
    T,
    H,
    DK,
    DV,
    nudge_period,
    CK,
    NC,
    BK: tl.constexpr,
    BV: tl.constexpr,
    HAS_INIT: tl.constexpr,
    SAVE_CKPT: tl.constexpr,
    NORM_GATE: tl.constexpr,
    NORM_OUT: tl.constexpr,
    ACC: tl.constexpr,
    BUG: tl.constexpr,
    DOWNDATE: tl.constexpr = 0,
):
    """Forward of spec §2.3 over all T tokens for one (b, h) and value block.

    Inputs ``q, k, u`` ``[B, T, H, DK]``, ``v`` ``[B, T, H, DV]`` (contiguous, any float dtype);
    ``o`` ``[B, T, H, DV]`` (input dtype).  States are contiguous ``S [B, H, DV, DK]``,
    ``A [B, H, DK, DK]``, ``z [B, H, DK]``; the final state is written in ``ACC``.  With
    ``SAVE_CKPT`` the state at the start of every chunk of ``CK`` tokens is written to
    ``[B, H, NC, ...]`` for the backward.
    """
    i_v = tl.program_id(0)
    i_bh = tl.program_id(1).to(tl.int64)
    i_b = i_bh // H
    i_h = i_bh % H
    ok = tl.arange(0, BK)
    ov = i_v * BV + tl.arange(0, BV)
    mk = ok < DK
    mv = ov < DV
    m_kk = mk[:, None] & mk[None, :]
    eye = (ok[:, None] == ok[None, :]) & m_kk
    lam, sm_floor, nudge_eta, out_eps, norm_eps = _load_params(p_ptr)

    # Registers hold Aᵀ and Sᵀ (see _vla_step_t): tile [j, i] reads A[i, j], tile [j, r] S[r, j].
    m_vk = mk[:, None] & mv[None, :]
    off_kk = ok[None, :] * DK + ok[:, None]
    off_vk = ov[None, :] * DK + ok[:, None]
    if HAS_INIT:
        S = tl.load(s0_ptr + i_bh * DV * DK + off_vk, mask=m_vk, other=0.0).to(ACC)
        A = tl.load(a0_ptr + i_bh * DK * DK + off_kk, mask=m_kk, other=0.0).to(ACC)
        z = tl.load(z0_ptr + i_bh * DK + ok, mask=mk, other=0.0).to(ACC)
    else:
        S = tl.zeros([BK, BV], dtype=ACC)
        A = tl.where(eye, _div(1.0, lam, ACC), 0.0).to(ACC)
        z = tl.zeros([BK], dtype=ACC)

    # Token t of (b, h) starts at ((b·T + t)·H + h)·D.
    base_k = (i_b * T * H + i_h) * DK
    base_v = (i_b * T * H + i_h) * DV
    stride_k = H * DK
    stride_v = H * DV
    # Prefetch token 0; inside the loop token t+1 is loaded before token t is computed.
    q_n = tl.load(q_ptr + base_k + ok, mask=mk, other=0.0).to(ACC)
    k_n = tl.load(k_ptr + base_k + ok, mask=mk, other=0.0).to(ACC)
    u_n = tl.load(u_ptr + base_k + ok, mask=mk, other=0.0).to(ACC)
    v_n = tl.load(v_ptr + base_v + ov, mask=mv, other=0.0).to(ACC)
    for t in range(T):
        q_t = q_n
        k_t = k_n
        u_t = u_n
        v_t = v_n
        # The last iteration reloads token T-1 (harmless) rather than masking the load.
        t_next = tl.minimum(t + 1, T - 1)
        nk = base_k + t_next * stride_k
        nv = base_v + t_next * stride_v
        q_n = tl.load(q_ptr + nk + ok, mask=mk, other=0.0).to(ACC)
        k_n = tl.load(k_ptr + nk + ok, mask=mk, other=0.0).to(ACC)
        u_n = tl.load(u_ptr + nk + ok, mask=mk, other=0.0).to(ACC)
        v_n = tl.load(v_ptr + nv + ov, mask=mv, other=0.0).to(ACC)
        if SAVE_CKPT:
            if t % CK == 0:
                c = (i_bh * NC + t // CK).to(tl.int64)
                tl.store(cks_ptr + c * DV * DK + off_vk, S, mask=m_vk)
                if i_v == 0:
                    tl.store(cka_ptr + c * DK * DK + off_kk, A, mask=m_kk)
                    tl.store(ckz_ptr + c * DK + ok, z, mask=mk)
        A, S, z, o = _vla_step_t(
            A,
            S,
            z,
            q_t,
            k_t,
            v_t,
            u_t,
            t,
            eye,
            nudge_period,
            nudge_eta,
            sm_floor,
            out_eps,
            norm_eps,
            NORM_GATE,
            NORM_OUT,
            ACC,
            BUG,
            DOWNDATE,
        )
        tl.store(o_ptr + base_v + t * stride_v + ov, o.to(o_ptr.dtype.element_ty), mask=mv)
    tl.store(sT_ptr + i_bh * DV * DK + off_vk, S, mask=m_vk)
    if i_v == 0:
        tl.store(aT_ptr + i_bh * DK * DK + off_kk, A, mask=m_kk)
        tl.store(zT_ptr + i_bh * DK + ok, z, mask=mk)


@triton.jit
def _gate_store_t(
    i, kh, ah, ahq, zq, s, delta_raw, delta, anorm, knorm, kh_row, ah_row, sc_row, sv_ptr,
    cs_ptr, progress_ptr, i_bh, n_steps, ok,
    BK: tl.constexpr, SAVE_CHAIN: tl.constexpr, PUBLISH: tl.constexpr,
):  # fmt: skip
    """What the gate pass writes for token ``i`` of its segment (:func:`vla_gate_kernel`), and,
    with ``PUBLISH`` > 0, the progress count every ``PUBLISH`` tokens (and more often in the
    last block): after a barrier (every thread's stores of tokens ≤ i issued), one thread
    releases it to the state programs waiting in :func:`_wait_for`."""
    tl.store(kh_row + i * BK + ok, kh)
    tl.store(ah_row + i * BK + ok, ah)
    tl.store(sc_row + 2 * i, ahq)
    tl.store(sc_row + 2 * i + 1, zq)
    if SAVE_CHAIN:
        tl.store(sv_ptr + (i_bh * n_steps + i) * BK + ok, s)
        cs = cs_ptr + (i_bh * n_steps + i) * 4
        tl.store(cs, delta_raw)
        tl.store(cs + 1, delta)
        tl.store(cs + 2, anorm)
        tl.store(cs + 3, knorm)
    if PUBLISH > 0:
        # every PUBLISH tokens, and in the last block when 2^j tokens are left (16, 8, ..., 1,
        # 0): the state programs, one published block behind, then finish a token after the
        # gate program instead of a block after it (a few publishes more, once per segment)
        left = n_steps - 1 - i
        if ((i + 1) % PUBLISH == 0) | (((left & (left - 1)) == 0) & (left < PUBLISH)):
            tl.debug_barrier()
            tl.atomic_xchg(progress_ptr + i_bh, i + 1, sem="release")


@triton.jit
def _gate_token_ahead(
    i, t_begin, t_last, A, c, z, s_n, dr_n, kh_c, zq_c, knorm_c, k_c, q_c, k_n, q_n, u_nn,
    q_ptr, k_ptr, u_ptr, kh_row, ah_row, sc_row, sv_ptr, cs_ptr, progress_ptr, i_bh, n_steps,
    base_k, stride_k, ok, mk, eye, nudge_period, nudge_eta, sm_floor, norm_eps,
    BK: tl.constexpr, NORM_GATE: tl.constexpr, ACC: tl.constexpr, BUG: tl.constexpr,
    DOWNDATE: tl.constexpr, SPLIT: tl.constexpr, NUDGE: tl.constexpr, SAVE_CHAIN: tl.constexpr,
    PUBLISH: tl.constexpr,
):  # fmt: skip
    """One token ``t_begin + i`` of :func:`_gate_pass` with ``KEY_AHEAD`` (the pipelined step,
    the key half one token ahead): loads two tokens ahead, the step, the stores, the progress
    count.  ``NUDGE``: how the step adds the nudge (``NUDGE_BRANCH`` of
    :func:`_gate_pipelined_t`).  Returns the carried values, in the order they came."""
    t = t_begin + i
    nk2 = base_k + tl.minimum(t + 2, t_last) * stride_k
    q_nn = tl.load(q_ptr + nk2 + ok, mask=mk, other=0.0).to(ACC)
    k_nn = tl.load(k_ptr + nk2 + ok, mask=mk, other=0.0).to(ACC)
    u_n = u_nn
    u_nn = tl.load(u_ptr + nk2 + ok, mask=mk, other=0.0).to(ACC)
    kh = kh_c
    zq = zq_c
    knorm = knorm_c
    z = z + k_c  # as _key_t
    A, ah, ahq, s, delta_raw, delta, anorm, s_n, dr_n, kk_c, zq_c, c = _gate_pipelined_t(
        A, s_n, dr_n, kh, u_n, q_c, t, eye, nudge_period, nudge_eta, sm_floor,
        norm_eps, NORM_GATE, ACC, BUG, DOWNDATE, SPLIT, NUDGE, k_n, z + k_n, q_n, True, c,
    )  # fmt: skip
    knorm_c = _sqrt(kk_c, ACC)  # the next token's k̂, as _key_t forms it
    kh_c = _div(k_n, tl.maximum(knorm_c, norm_eps), ACC)
    _gate_store_t(
        i, kh, ah, ahq, zq, s, delta_raw, delta, anorm, knorm, kh_row, ah_row, sc_row, sv_ptr,
        cs_ptr, progress_ptr, i_bh, n_steps, ok, BK, SAVE_CHAIN, PUBLISH,
    )  # fmt: skip
    return A, c, z, s_n, dr_n, kh_c, zq_c, knorm_c, k_n, q_n, k_nn, q_nn, u_nn


@triton.jit
def _gate_pass(
    i_bh,
    q_ptr,
    k_ptr,
    u_ptr,
    kh_ptr,
    ah_ptr,
    sc_ptr,
    sv_ptr,
    cs_ptr,
    a0_ptr,
    z0_ptr,
    aT_ptr,
    zT_ptr,
    cka_ptr,
    ckz_ptr,
    p_ptr,
    T,
    H,
    DK,
    nudge_period,
    CK,
    NC,
    t_begin,
    n_steps,
    a_stride,
    BK: tl.constexpr,
    HAS_INIT: tl.constexpr,
    SAVE_CKPT: tl.constexpr,
    SAVE_CHAIN: tl.constexpr,
    NORM_GATE: tl.constexpr,
    ACC: tl.constexpr,
    BUG: tl.constexpr,
    DOWNDATE: tl.constexpr,
    PIPELINE: tl.constexpr,
    SPLIT: tl.constexpr,
    NUDGE_BRANCH: tl.constexpr,
    LOAD_PLAIN: tl.constexpr,
    KEY_AHEAD: tl.constexpr,
    PERIOD_LOOP: tl.constexpr,
    progress_ptr,
    PUBLISH: tl.constexpr,
):
    """The body of :func:`vla_gate_kernel` for the (b, h) ``i_bh`` (int64); with ``PUBLISH`` > 0
    it also stores, every ``PUBLISH`` tokens, how many tokens' gates are written to
    ``progress_ptr[i_bh]`` (int32, release), for :func:`vla_stream_kernel`'s state programs."""

    i_b = i_bh // H
    i_h = i_bh % H
    ok = tl.arange(0, BK)
    mk = ok < DK
    m_kk = mk[:, None] & mk[None, :]
    eye = (ok[:, None] == ok[None, :]) & m_kk
    lam, sm_floor, nudge_eta, _out_eps, norm_eps = _load_params(p_ptr)
    if LOAD_PLAIN:
        # a_stride (= DK) is not specialised: the compiler cannot prove the rows 16-byte
        # aligned, so the A tile is loaded and stored without vector accesses and keeps the
        # loop's layout (offline Triton 3.6 SASS, BK = 64, split sums after a load: 626
        # instructions per token and no spills, against 5218 and 32 registers with vector loads)
        row = a_stride
    else:
        row = DK
    off_kk = ok[:, None] * row + ok[None, :]  # Aᵀ in memory and in the tile
    if HAS_INIT:
        A = tl.load(a0_ptr + i_bh * DK * DK + off_kk, mask=m_kk, other=0.0).to(ACC)
        z = tl.load(z0_ptr + i_bh * DK + ok, mask=mk, other=0.0).to(ACC)
    else:
        A = tl.where(eye, _div(1.0, lam, ACC), 0.0).to(ACC)
        z = tl.zeros([BK], dtype=ACC)
    base_k = (i_b * T * H + i_h) * DK
    stride_k = H * DK
    kh_row = kh_ptr + i_bh * n_steps * BK
    ah_row = ah_ptr + i_bh * n_steps * BK
    sc_row = sc_ptr + i_bh * n_steps * 2
    t_last = t_begin + n_steps - 1
    nk = base_k + t_begin * stride_k
    q_n = tl.load(q_ptr + nk + ok, mask=mk, other=0.0).to(ACC)
    k_n = tl.load(k_ptr + nk + ok, mask=mk, other=0.0).to(ACC)
    u_n = tl.load(u_ptr + nk + ok, mask=mk, other=0.0).to(ACC)
    if PIPELINE:  # s = A u and 1 + uᵀs of the first token, ahead of the loop
        s_n = _colsum(A * u_n[:, None], SPLIT)
        dr_n = 1.0 + tl.sum(u_n * s_n, axis=0)
        # u is used one token ahead, so it is loaded two ahead (a load issued in the iteration
        # that uses it left its latency on the critical path: gate_anatomy.json)
        nk = base_k + tl.minimum(t_begin + 1, t_last) * stride_k
        u_nn = tl.load(u_ptr + nk + ok, mask=mk, other=0.0).to(ACC)
        if KEY_AHEAD:
            # the first token's key half before the loop; then each token's (‖k‖², z·q) comes
            # in the previous token's last reduction, and q, k are loaded two tokens ahead
            _z, kh_c, zq_c, knorm_c = _key_t(z, k_n, q_n, norm_eps, ACC)
            k_c = k_n
            q_c = q_n
            q_n = tl.load(q_ptr + nk + ok, mask=mk, other=0.0).to(ACC)
            k_n = tl.load(k_ptr + nk + ok, mask=mk, other=0.0).to(ACC)
    # With checkpoints, blocks of CK tokens: t_begin is a multiple of CK, so every block starts
    # at a checkpoint, stored before the block's token loop (a tile store under a branch in
    # the token loop cost the BK = 128 loop 196 spilled instructions per token in the offline
    # SASS, 14 this way).
    # NUDGE_SCALAR: blocks of FOLD_EVERY tokens (or of CK), at whose start c is folded into the
    # tile: one select over the tile per block instead of one per token.
    c = tl.zeros([], dtype=ACC)  # A = tile + c·I (NUDGE_SCALAR; otherwise 0 throughout)
    if SAVE_CKPT:
        block = CK
    elif NUDGE_BRANCH == NUDGE_SCALAR:
        block = FOLD_EVERY
    else:
        block = n_steps
    for i0 in range(0, n_steps, block):
        if NUDGE_BRANCH == NUDGE_SCALAR:
            if BUG != 4:
                A = A + tl.where(eye, c, 0.0)
            c = c * 0.0
        if SAVE_CKPT:
            slot = (i_bh * (NC + 1) + (t_begin + i0) // CK).to(tl.int64)
            tl.store(cka_ptr + slot * DK * DK + off_kk, A, mask=m_kk)
            tl.store(ckz_ptr + slot * DK + ok, z, mask=mk)
        i1 = tl.minimum(i0 + block, n_steps)
        if PERIOD_LOOP:
            # Tokens between nudges run a step compiled without the nudge, each nudge token one
            # compiled with it: no select over the tile on the others.  f: the first token
            # i >= i0 whose step (t + 1; t under the planted late-nudge bug) is a positive
            # multiple of the period (int64: the period may be 2**31 - 1, "never").
            off = 0 if BUG == 2 else 1
            x = (t_begin + i0 + off).to(tl.int64)
            # (x·0 + period, not period.to(int64): a period of 1 is specialised to a Python
            # int by the launcher, which has no .to on the GPU)
            per = x * 0 + nudge_period
            f = i0 + (per - x % per) % per
            f = tl.where(t_begin + f + off == 0, f + per, f)
            f = tl.minimum(f, i1).to(tl.int32)
            n_nudges = tl.where(f < i1, (i1 - 1 - f) // nudge_period + 1, 0)
            # Each period's first token is computed from r, not carried from the previous
            # period: Triton 3.6's TTGIR passes dropped a carried lower bound and restarted
            # every period at i0 (wrong results on the H200, bitwise right in the interpreter).
            for r in range(0, n_nudges + 1):
                p = tl.minimum(f.to(tl.int64) + r * per, i1).to(tl.int32)
                start = tl.where(
                    r == 0, i0, tl.minimum(f.to(tl.int64) + (r - 1) * per + 1, i1).to(tl.int32)
                )
                for i in range(start, p):
                    A, c, z, s_n, dr_n, kh_c, zq_c, knorm_c, k_c, q_c, k_n, q_n, u_nn = (
                        _gate_token_ahead(
                            i, t_begin, t_last, A, c, z, s_n, dr_n, kh_c, zq_c, knorm_c, k_c, q_c,
                            k_n, q_n, u_nn, q_ptr, k_ptr, u_ptr, kh_row, ah_row, sc_row, sv_ptr,
                            cs_ptr, progress_ptr, i_bh, n_steps, base_k, stride_k, ok, mk, eye,
                            nudge_period, nudge_eta, sm_floor, norm_eps, BK, NORM_GATE, ACC, BUG,
                            DOWNDATE, SPLIT, NUDGE_NEVER, SAVE_CHAIN, PUBLISH,
                        )
                    )  # fmt: skip
                for i in range(p, tl.minimum(p + 1, i1)):  # the nudge token, if any
                    A, c, z, s_n, dr_n, kh_c, zq_c, knorm_c, k_c, q_c, k_n, q_n, u_nn = (
                        _gate_token_ahead(
                            i, t_begin, t_last, A, c, z, s_n, dr_n, kh_c, zq_c, knorm_c, k_c, q_c,
                            k_n, q_n, u_nn, q_ptr, k_ptr, u_ptr, kh_row, ah_row, sc_row, sv_ptr,
                            cs_ptr, progress_ptr, i_bh, n_steps, base_k, stride_k, ok, mk, eye,
                            nudge_period, nudge_eta, sm_floor, norm_eps, BK, NORM_GATE, ACC, BUG,
                            DOWNDATE, SPLIT, NUDGE_ALWAYS, SAVE_CHAIN, PUBLISH,
                        )
                    )  # fmt: skip
        elif KEY_AHEAD:
            for i in range(i0, i1):
                A, c, z, s_n, dr_n, kh_c, zq_c, knorm_c, k_c, q_c, k_n, q_n, u_nn = (
                    _gate_token_ahead(
                        i, t_begin, t_last, A, c, z, s_n, dr_n, kh_c, zq_c, knorm_c, k_c, q_c,
                        k_n, q_n, u_nn, q_ptr, k_ptr, u_ptr, kh_row, ah_row, sc_row, sv_ptr,
                        cs_ptr, progress_ptr, i_bh, n_steps, base_k, stride_k, ok, mk, eye,
                        nudge_period, nudge_eta, sm_floor, norm_eps, BK, NORM_GATE, ACC, BUG,
                        DOWNDATE, SPLIT, NUDGE_BRANCH, SAVE_CHAIN, PUBLISH,
                    )
                )  # fmt: skip
        else:
            for i in range(i0, i1):
                t = t_begin + i
                q_t = q_n
                k_t = k_n
                u_t = u_n
                nk = base_k + tl.minimum(t + 1, t_last) * stride_k
                q_n = tl.load(q_ptr + nk + ok, mask=mk, other=0.0).to(ACC)
                k_n = tl.load(k_ptr + nk + ok, mask=mk, other=0.0).to(ACC)
                if PIPELINE:
                    u_n = u_nn
                    nk2 = base_k + tl.minimum(t + 2, t_last) * stride_k
                    u_nn = tl.load(u_ptr + nk2 + ok, mask=mk, other=0.0).to(ACC)
                else:
                    u_n = tl.load(u_ptr + nk + ok, mask=mk, other=0.0).to(ACC)
                z, kh, zq, knorm = _key_t(z, k_t, q_t, norm_eps, ACC)
                if PIPELINE:
                    A, ah, ahq, s, delta_raw, delta, anorm, s_n, dr_n, _kk, _zq, c = (
                        _gate_pipelined_t(
                            A, s_n, dr_n, kh, u_n, q_t, t, eye, nudge_period, nudge_eta,
                            sm_floor, norm_eps, NORM_GATE, ACC, BUG, DOWNDATE, SPLIT,
                            NUDGE_BRANCH, 0.0, 0.0, 0.0, False, c,
                        )
                    )  # fmt: skip
                else:
                    A, ah, ahq, s, delta_raw, delta, anorm = _gate_t(
                        A, kh, u_t, q_t, t, eye, nudge_period, nudge_eta, sm_floor, norm_eps,
                        NORM_GATE, ACC, BUG, DOWNDATE, SPLIT,
                    )  # fmt: skip
                _gate_store_t(
                    i, kh, ah, ahq, zq, s, delta_raw, delta, anorm, knorm, kh_row, ah_row,
                    sc_row, sv_ptr, cs_ptr, progress_ptr, i_bh, n_steps, ok, BK, SAVE_CHAIN,
                    PUBLISH,
                )  # fmt: skip
    if NUDGE_BRANCH == NUDGE_SCALAR and BUG != 4:
        A = A + tl.where(eye, c, 0.0)
    tl.store(aT_ptr + i_bh * DK * DK + off_kk, A, mask=m_kk)
    tl.store(zT_ptr + i_bh * DK + ok, z, mask=mk)
    if SAVE_CKPT:
        slot = (i_bh * (NC + 1) + NC).to(tl.int64)
        tl.store(cka_ptr + slot * DK * DK + off_kk, A, mask=m_kk)
        tl.store(ckz_ptr + slot * DK + ok, z, mask=mk)


@triton.jit(do_not_specialize=["a_stride"])
def vla_gate_kernel(
    q_ptr,
    k_ptr,
    u_ptr,
    kh_ptr,
    ah_ptr,
    sc_ptr,
    sv_ptr,
    cs_ptr,
    a0_ptr,
    z0_ptr,
    aT_ptr,
    zT_ptr,
    cka_ptr,
    ckz_ptr,
    p_ptr,
    T,
    H,
    DK,
    nudge_period,
    CK,
    NC,
    t_begin,
    n_steps,
    a_stride,
    BK: tl.constexpr,
    HAS_INIT: tl.constexpr,
    SAVE_CKPT: tl.constexpr,
    SAVE_CHAIN: tl.constexpr,
    NORM_GATE: tl.constexpr,
    ACC: tl.constexpr,
    BUG: tl.constexpr,
    DOWNDATE: tl.constexpr,
    PIPELINE: tl.constexpr = False,
    SPLIT: tl.constexpr = 1,
    NUDGE_BRANCH: tl.constexpr = False,
    LOAD_PLAIN: tl.constexpr = False,
    KEY_AHEAD: tl.constexpr = False,
    PERIOD_LOOP: tl.constexpr = False,
):
    """Pass 1 of the two-pass forward: the key and penalty halves of spec §2.3 for one (b, h),
    over tokens ``t_begin ≤ t < t_begin + n_steps`` of a length-``T`` sequence.

    Only ``Aᵀ`` ``[BK, BK]`` and ``z`` live in registers, so at dk = 128 ``A`` can take a whole
    program's registers without the ``S`` tile competing for them.  Writes, per token, ``k̂``
    and ``α̂`` to ``kh``, ``ah`` ``[B·H, n_steps, BK]`` (``ACC``, zero past ``DK``) and ``(α̂ᵀq,
    z_tᵀq)`` to ``sc`` ``[B·H, n_steps, 2]``: everything the state pass
    (:func:`vla_state_kernel`) and the state backward (:func:`vla_state_bwd_kernel`) need.
    Starts from ``(a0, z0)`` ``[B, H, ...]`` (``HAS_INIT``) or the spec defaults; writes the last
    ``A, z`` and (``SAVE_CKPT``) the checkpoints as :func:`vla_fwd_kernel` does, plus the last
    state into slot ``NC`` (the end of the last chunk, for :func:`vla_gate_bwd_kernel`) — every
    ``A`` transposed in memory (module docstring).  With ``SAVE_CHAIN`` (the backward's rerun)
    also the Sherman–Morrison vectors ``s`` to ``sv`` ``[B·H, n_steps, BK]`` and ``(1 + uᵀs, δ,
    ‖α‖, ‖k‖)`` to ``cs`` ``[B·H, n_steps, 4]``.  The backward
    reruns it from a checkpoint, one segment at a time.  ``a_stride`` = ``DK``, read only with
    ``LOAD_PLAIN``.  ``PIPELINE``: the step of
    :func:`_gate_pipelined_t` (two dependent reductions per token instead of four).
    """
    _gate_pass(
        tl.program_id(0).to(tl.int64),
        q_ptr,
        k_ptr,
        u_ptr,
        kh_ptr,
        ah_ptr,
        sc_ptr,
        sv_ptr,
        cs_ptr,
        a0_ptr,
        z0_ptr,
        aT_ptr,
        zT_ptr,
        cka_ptr,
        ckz_ptr,
        p_ptr,
        T,
        H,
        DK,
        nudge_period,
        CK,
        NC,
        t_begin,
        n_steps,
        a_stride,
        BK,
        HAS_INIT,
        SAVE_CKPT,
        SAVE_CHAIN,
        NORM_GATE,
        ACC,
        BUG,
        DOWNDATE,
        PIPELINE,
        SPLIT,
        NUDGE_BRANCH,
        LOAD_PLAIN,
        KEY_AHEAD,
        PERIOD_LOOP,
        p_ptr,  # unused: PUBLISH = 0
        0,
    )


@triton.jit
def _wait_for(ptr, need):
    """Spin until the int32 at ``ptr`` is at least ``need`` (acquire: what its writer stored
    before releasing the count is visible after); returns the count seen.  Only
    :func:`vla_stream_kernel` calls it, where the writer is a program that started earlier (its
    ticket), so it always finishes."""
    seen = tl.atomic_add(ptr, 0, sem="acquire")
    while seen < need:
        seen = tl.atomic_add(ptr, 0, sem="acquire")
    return seen


@triton.jit
def _state_pass(
    i_v,
    i_bh,
    q_ptr,
    v_ptr,
    kh_ptr,
    ah_ptr,
    sc_ptr,
    o_ptr,
    s0_ptr,
    sT_ptr,
    cks_ptr,
    p_ptr,
    T,
    H,
    DK,
    DV,
    CK,
    NC,
    t_begin,
    n_steps,
    BK: tl.constexpr,
    BV: tl.constexpr,
    HAS_INIT: tl.constexpr,
    SAVE_CKPT: tl.constexpr,
    NORM_OUT: tl.constexpr,
    ACC: tl.constexpr,
    progress_ptr,
    WAIT: tl.constexpr,
    GATE_CACHE: tl.constexpr,
):
    """The body of :func:`vla_state_kernel` for value block ``i_v`` of the (b, h) ``i_bh``
    (int64).  With ``WAIT`` > 0 it reads the gates only after ``progress_ptr[i_bh]`` says the
    gate program has written them, ``WAIT`` tokens at a time (:func:`vla_stream_kernel`), and
    ``GATE_CACHE`` (".cg") keeps those loads out of the L1, which is not coherent with the
    writer's SM."""

    i_b = i_bh // H
    i_h = i_bh % H
    ok = tl.arange(0, BK)
    ov = i_v * BV + tl.arange(0, BV)
    mk = ok < DK
    mv = ov < DV
    m_vk = mk[:, None] & mv[None, :]
    off_vk = ok[:, None] * DV + ov[None, :]  # Sᵀ [DK, DV] in memory and in the tile
    _lam, _sm_floor, _nudge_eta, out_eps, _norm_eps = _load_params(p_ptr)
    if HAS_INIT:
        S = tl.load(s0_ptr + i_bh * DV * DK + off_vk, mask=m_vk, other=0.0).to(ACC)
    else:
        S = tl.zeros([BK, BV], dtype=ACC)
    base_k = (i_b * T * H + i_h) * DK
    base_v = (i_b * T * H + i_h) * DV
    stride_k = H * DK
    stride_v = H * DV
    kh_row = kh_ptr + i_bh * n_steps * BK
    ah_row = ah_ptr + i_bh * n_steps * BK
    sc_row = sc_ptr + i_bh * n_steps * 2
    q_n = tl.load(q_ptr + base_k + t_begin * stride_k + ok, mask=mk, other=0.0).to(ACC)
    v_n = tl.load(v_ptr + base_v + t_begin * stride_v + ov, mask=mv, other=0.0).to(ACC)
    if WAIT > 0:
        seen = _wait_for(progress_ptr + i_bh, 1)
    kh_n = tl.load(kh_row + ok, cache_modifier=GATE_CACHE)
    ah_n = tl.load(ah_row + ok, cache_modifier=GATE_CACHE)
    ahq_n = tl.load(sc_row, cache_modifier=GATE_CACHE)
    zq_n = tl.load(sc_row + 1, cache_modifier=GATE_CACHE)
    for i in range(n_steps):
        t = t_begin + i
        q_t = q_n
        v_t = v_n
        kh = kh_n
        ah = ah_n
        ahq = ahq_n
        zq = zq_n
        i_next = tl.minimum(i + 1, n_steps - 1)
        t_next = t_begin + i_next
        q_n = tl.load(q_ptr + base_k + t_next * stride_k + ok, mask=mk, other=0.0).to(ACC)
        v_n = tl.load(v_ptr + base_v + t_next * stride_v + ov, mask=mv, other=0.0).to(ACC)
        if WAIT > 0:
            # the loads below run one token ahead; wait only when that token's gates are not
            # yet published (a count seen earlier covers every token below it), so that the
            # state programs run at most one published block behind the gate program (with
            # the last block's publishes of _gate_store_t, about a token at the end)
            if i_next >= seen:
                seen = _wait_for(progress_ptr + i_bh, i_next + 1)
        kh_n = tl.load(kh_row + i_next * BK + ok, cache_modifier=GATE_CACHE)
        ah_n = tl.load(ah_row + i_next * BK + ok, cache_modifier=GATE_CACHE)
        ahq_n = tl.load(sc_row + 2 * i_next, cache_modifier=GATE_CACHE)
        zq_n = tl.load(sc_row + 2 * i_next + 1, cache_modifier=GATE_CACHE)
        if SAVE_CKPT:
            if t % CK == 0:
                c = (i_bh * NC + t // CK).to(tl.int64)
                tl.store(cks_ptr + c * DV * DK + off_vk, S, mask=m_vk)
        Sk, Sq = _state_read_t(S, kh, q_t)
        S, o = _state_write_t(S, Sk, Sq, ah, ahq, zq, v_t, out_eps, NORM_OUT, ACC)
        tl.store(o_ptr + base_v + t * stride_v + ov, o.to(o_ptr.dtype.element_ty), mask=mv)
    tl.store(sT_ptr + i_bh * DV * DK + off_vk, S, mask=m_vk)


@triton.jit
def vla_state_kernel(
    q_ptr,
    v_ptr,
    kh_ptr,
    ah_ptr,
    sc_ptr,
    o_ptr,
    s0_ptr,
    sT_ptr,
    cks_ptr,
    p_ptr,
    T,
    H,
    DK,
    DV,
    CK,
    NC,
    t_begin,
    n_steps,
    BK: tl.constexpr,
    BV: tl.constexpr,
    HAS_INIT: tl.constexpr,
    SAVE_CKPT: tl.constexpr,
    NORM_OUT: tl.constexpr,
    ACC: tl.constexpr,
):
    """Pass 2 of the two-pass forward: the state half of spec §2.3 for one (b, h) and block of
    ``BV`` value rows over tokens ``t_begin ≤ t < t_begin + n_steps``, from the ``k̂, α̂, α̂ᵀq,
    z_tᵀq`` that :func:`vla_gate_kernel` wrote for them.

    Given the gates, this is the generalized delta rule ``S_t = S_{t-1} + (v − S_{t-1}k̂) α̂ᵀ``:
    one paired reduction per token.  Writes ``o`` ``[B, T, H, DV]`` (input dtype), the final
    ``S`` and (``SAVE_CKPT``) its checkpoints, ``Sᵀ`` ``[DK, DV]`` in memory like ``s0``.
    """
    _state_pass(
        tl.program_id(0),
        tl.program_id(1).to(tl.int64),
        q_ptr,
        v_ptr,
        kh_ptr,
        ah_ptr,
        sc_ptr,
        o_ptr,
        s0_ptr,
        sT_ptr,
        cks_ptr,
        p_ptr,
        T,
        H,
        DK,
        DV,
        CK,
        NC,
        t_begin,
        n_steps,
        BK,
        BV,
        HAS_INIT,
        SAVE_CKPT,
        NORM_OUT,
        ACC,
        p_ptr,  # unused: WAIT = 0
        0,
        "",
    )


@triton.jit(do_not_specialize=["a_stride"])
def vla_stream_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    u_ptr,
    o_ptr,
    kh_ptr,
    ah_ptr,
    sc_ptr,
    a0_ptr,
    z0_ptr,
    s0_ptr,
    aT_ptr,
    zT_ptr,
    sT_ptr,
    cka_ptr,
    ckz_ptr,
    cks_ptr,
    p_ptr,
    ticket_ptr,
    progress_ptr,
    T,
    H,
    DK,
    DV,
    nudge_period,
    CK,
    NC,
    t_begin,
    n_steps,
    a_stride,
    BH,
    NV,
    BK: tl.constexpr,
    BV: tl.constexpr,
    HAS_INIT: tl.constexpr,
    SAVE_CKPT: tl.constexpr,
    NORM_GATE: tl.constexpr,
    NORM_OUT: tl.constexpr,
    ACC: tl.constexpr,
    BUG: tl.constexpr,
    DOWNDATE: tl.constexpr,
    PIPELINE: tl.constexpr,
    SPLIT: tl.constexpr,
    NUDGE_BRANCH: tl.constexpr,
    LOAD_PLAIN: tl.constexpr,
    KEY_AHEAD: tl.constexpr,
    PERIOD_LOOP: tl.constexpr,
    BLOCK_T: tl.constexpr,
):
    """The two-pass forward in ONE launch, its passes running side by side: grid
    ``(B·H·(1 + NV),)``, ``B·H`` gate programs (:func:`_gate_pass`) and ``NV·B·H`` state
    programs (:func:`_state_pass`) that consume the gates ``BLOCK_T`` tokens behind them.

    The forward then costs about the gate pass alone (the state pass is the faster of the two)
    and nothing is cut into segments, so every gate program starts from ``I/lambda0`` in
    registers and keeps its split sums.  Roles go by a ticket (``ticket_ptr``, int32, zero at
    launch) taken when a program starts, not by its program id: the first ``B·H`` programs to
    start are the gate programs, so a state program only ever waits for a program that is
    already running, whatever the order the hardware starts them in (the single-pass scan's
    argument), and under ``TRITON_INTERPRET=1``, which runs programs one after another, every
    gate program has finished before the first state program starts.  ``progress_ptr``
    ``[B·H]`` (int32, zero at launch): tokens whose gates are written, per (b, h).  Same
    arguments otherwise as the two kernels; same operations, hence the same bits.
    """
    role = tl.atomic_add(ticket_ptr, 1)
    if role < BH:
        _gate_pass(
            role.to(tl.int64), q_ptr, k_ptr, u_ptr, kh_ptr, ah_ptr, sc_ptr, kh_ptr, sc_ptr,
            a0_ptr, z0_ptr, aT_ptr, zT_ptr, cka_ptr, ckz_ptr, p_ptr, T, H, DK, nudge_period,
            CK, NC, t_begin, n_steps, a_stride, BK, HAS_INIT, SAVE_CKPT, False, NORM_GATE, ACC,
            BUG, DOWNDATE, PIPELINE, SPLIT, NUDGE_BRANCH, LOAD_PLAIN, KEY_AHEAD, PERIOD_LOOP,
            progress_ptr, BLOCK_T,
        )  # fmt: skip
    else:
        r = role - BH
        _state_pass(
            r % NV, (r // NV).to(tl.int64), q_ptr, v_ptr, kh_ptr, ah_ptr, sc_ptr, o_ptr, s0_ptr,
            sT_ptr, cks_ptr, p_ptr, T, H, DK, DV, CK, NC, t_begin, n_steps, BK, BV, HAS_INIT,
            SAVE_CKPT, NORM_OUT, ACC, progress_ptr, BLOCK_T, ".cg",
        )  # fmt: skip


@triton.jit
def vla_state_bwd_kernel(
    q_ptr,
    v_ptr,
    do_ptr,
    kh_ptr,
    ah_ptr,
    sc_ptr,
    cks_ptr,
    dsT_ptr,
    e_ptr,
    dv_ptr,
    dqp_ptr,
    dahp_ptr,
    dkhp_ptr,
    dnp_ptr,
    ds0_ptr,
    p_ptr,
    T,
    H,
    DK,
    DV,
    CK,
    NC,
    t_begin,
    n_steps,
    BK: tl.constexpr,
    BV: tl.constexpr,
    NORM_OUT: tl.constexpr,
    ACC: tl.constexpr,
):
    """Backward of the state half of spec §2.3 for one (b, h), one block of ``BV`` value rows and
    the segment ``t_begin ≤ t < t_begin + n_steps`` (``t_begin`` a multiple of ``CK``).

    Given the gates of the segment (``kh, ah, sc`` ``[B·H, n_steps, ...]`` from
    :func:`vla_gate_kernel`) and ``dS`` after the segment (``dsT``), walks its chunks of ``CK``
    tokens in reverse: reloads the ``S`` checkpoint, recomputes the residuals ``e`` of the
    chunk (scratch ``e`` ``[NV·B·H, CK, BV]``), then, per token (``dS`` the gradient w.r.t.
    ``S_t``):  ``dr = do/n``, ``dS += dr qᵀ``, ``de = dS α̂``, ``S_{t-1} = S_t − e α̂ᵀ``,
    ``dS −= de k̂ᵀ``; ``dv = de``.  The sums over value rows that the penalty half needs are
    written per value block, ``[NV, B·H, n_steps, BK]``: ``S_tᵀ dr`` (``dqp``), ``dSᵀ e``
    (``dahp``), ``−S_{t-1}ᵀ de`` (``dkhp``), and ``doᵀ S_t q`` (``dnp`` ``[NV, B·H, n_steps]``);
    :func:`vla_gate_bwd_kernel` takes their sums.  Writes ``dS`` before the segment to ``ds0``.
    """
    i_v = tl.program_id(0)
    i_bh = tl.program_id(1).to(tl.int64)
    BH = tl.num_programs(1)
    i_b = i_bh // H
    i_h = i_bh % H
    ok = tl.arange(0, BK)
    ob = tl.arange(0, BV)
    ov = i_v * BV + ob
    mk = ok < DK
    mv = ov < DV
    m_vk = mk[:, None] & mv[None, :]
    off_vk = ok[:, None] * DV + ov[None, :]  # Sᵀ, dSᵀ [DK, DV] in memory and tiles
    _lam, _sm_floor, _nudge_eta, out_eps, _norm_eps = _load_params(p_ptr)
    dS = tl.load(dsT_ptr + i_bh * DV * DK + off_vk, mask=m_vk, other=0.0).to(ACC)
    base_k = (i_b * T * H + i_h) * DK
    base_v = (i_b * T * H + i_h) * DV
    stride_k = H * DK
    stride_v = H * DV
    kh_row = kh_ptr + i_bh * n_steps * BK
    ah_row = ah_ptr + i_bh * n_steps * BK
    sc_row = sc_ptr + i_bh * n_steps * 2
    part = (i_v * BH + i_bh) * n_steps  # first row of this program in the [NV, B·H, n] parts
    e_row = e_ptr + (i_v * BH + i_bh) * CK * BV
    n_chunks = tl.cdiv(n_steps, CK)
    for jc in range(n_chunks):
        i0 = (n_chunks - 1 - jc) * CK
        nt = tl.minimum(CK, n_steps - i0)
        c = i_bh * NC + (t_begin + i0) // CK
        S = tl.load(cks_ptr + c * DV * DK + off_vk, mask=m_vk, other=0.0).to(ACC)
        # 1. The chunk's residuals e_t = v_t − S_{t-1} k̂_t, as the state pass made them.
        for j in range(nt):
            i = i0 + j
            t = t_begin + i
            kh = tl.load(kh_row + i * BK + ok)
            ah = tl.load(ah_row + i * BK + ok)
            v_t = tl.load(v_ptr + base_v + t * stride_v + ov, mask=mv, other=0.0).to(ACC)
            e = v_t - tl.sum(S * kh[:, None], axis=0)
            S = S + ah[:, None] * e[None, :]
            tl.store(e_row + j * BV + ob, e)
        # The scratch was written by other threads than those that read it below.
        tl.debug_barrier()
        # 2. Backwards through the chunk: S = S_t on entry to each step.
        for jj in range(nt):
            j = nt - 1 - jj
            i = i0 + j
            t = t_begin + i
            q_t = tl.load(q_ptr + base_k + t * stride_k + ok, mask=mk, other=0.0).to(ACC)
            do_t = tl.load(do_ptr + base_v + t * stride_v + ov, mask=mv, other=0.0).to(ACC)
            kh = tl.load(kh_row + i * BK + ok)
            ah = tl.load(ah_row + i * BK + ok)
            zq = tl.load(sc_row + 2 * i + 1)
            e = tl.load(e_row + j * BV + ob)
            if NORM_OUT:
                dr = _div(do_t, tl.maximum(zq, out_eps), ACC)
                r = tl.sum(S * q_t[:, None], axis=0)  # this block's rows of S_t q
                dnp = tl.sum(do_t * r, axis=0)
            else:
                dr = do_t
                dnp = 0.0
            dqp = tl.sum(S * dr[None, :], axis=1)  # S_tᵀ dr over this block's rows
            dS = dS + q_t[:, None] * dr[None, :]
            de = tl.sum(dS * ah[:, None], axis=0)
            dahp = tl.sum(dS * e[None, :], axis=1)
            S = S - ah[:, None] * e[None, :]  # S_{t-1}
            dkhp = -tl.sum(S * de[None, :], axis=1)
            dS = dS - kh[:, None] * de[None, :]
            tl.store(dv_ptr + base_v + t * stride_v + ov, de.to(dv_ptr.dtype.element_ty), mask=mv)
            tl.store(dqp_ptr + (part + i) * BK + ok, dqp)
            tl.store(dahp_ptr + (part + i) * BK + ok, dahp)
            tl.store(dkhp_ptr + (part + i) * BK + ok, dkhp)
            tl.store(dnp_ptr + part + i, dnp)
        # The next chunk overwrites the scratch that this one read.
        tl.debug_barrier()
    tl.store(ds0_ptr + i_bh * DV * DK + off_vk, dS, mask=m_vk)


@triton.jit
def vla_gate_bwd_kernel(
    q_ptr,
    k_ptr,
    u_ptr,
    kh_ptr,
    ah_ptr,
    sc_ptr,
    sv_ptr,
    cs_ptr,
    dqs_ptr,
    dahs_ptr,
    dkhs_ptr,
    dns_ptr,
    cka_ptr,
    ckz_ptr,
    daT_ptr,
    dzT_ptr,
    dq_ptr,
    dk_ptr,
    du_ptr,
    da0_ptr,
    dz0_ptr,
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
    NORM_GATE: tl.constexpr,
    NORM_OUT: tl.constexpr,
    ACC: tl.constexpr,
    BUG: tl.constexpr,
    DOWNDATE: tl.constexpr,
    NUDGE_SCALAR_WALK: tl.constexpr = False,
):
    """Backward of the key and penalty halves of spec §2.3 for one (b, h) over the segment
    ``t_begin ≤ t < t_begin + n_steps``, given the value-row sums of the state backward
    (``dqs, dahs, dkhs`` ``[B·H, n_steps, BK]``, ``dns`` ``[B·H, n_steps]``: see
    :func:`vla_state_bwd_kernel`), the per-token vectors of the gate rerun (``kh, ah, sc, sv,
    cs``: :func:`vla_gate_kernel` with ``SAVE_CHAIN``) and ``dA, dz`` after the segment.

    No recomputation here: each chunk of ``CK`` tokens starts from the state at its *end*, the
    next checkpoint (slot ``c + 1``; the last chunk's is slot ``NC``, the final state), and walks
    back with ``Aᵀ`` and ``dAᵀ`` in registers, reconstructing ``A_{t-1} = A_t + s sᵀ/δ − η_t I``
    and ``z_{t-1} = z_t − k_t`` (rounding adds up over at most ``CK`` steps):
    ``dn = −(Σ doᵀS_t q)/n²``, ``dz += dn q``, ``dq = Σ S_tᵀdr + dn z_t``; ``dα`` from ``dα̂``;
    ``dk̂ = Σ(−S_{t-1}ᵀde) + A_tᵀdα``, ``dA += dα k̂ᵀ``; ``ds = −(dA + dAᵀ)s/δ``,
    ``dδ = sᵀdA s/δ²``, ``du = dδ s + A_{t-1}ᵀ ds``, ``dA += ds uᵀ`` (the adjoint equations of
    :func:`vla_bwd_kernel`); ``dk = dz + ∂k̂/∂k · dk̂``.  Writes ``dA, dz`` before the segment.

    ``NUDGE_SCALAR_WALK``: the walk keeps ``A = B + c·I`` (the forward's ``NUDGE_SCALAR``, in
    reverse): undoing a nudge is ``c −= η``, and ``Aᵀx = Bᵀx + c x`` in the two products with
    ``A``; ``c`` starts at 0 at each chunk's checkpoint, so it never exceeds ``η·⌈CK /
    nudge_period⌉``.  No select over the tile per token.
    """
    i_bh = tl.program_id(0).to(tl.int64)
    i_b = i_bh // H
    i_h = i_bh % H
    ok = tl.arange(0, BK)
    mk = ok < DK
    m_kk = mk[:, None] & mk[None, :]
    eye = (ok[:, None] == ok[None, :]) & m_kk
    _lam, sm_floor, nudge_eta, out_eps, norm_eps = _load_params(p_ptr)
    off_kk = ok[:, None] * DK + ok[None, :]  # Aᵀ, dAᵀ in memory and in the tiles
    dA = tl.load(daT_ptr + i_bh * DK * DK + off_kk, mask=m_kk, other=0.0).to(ACC)
    dz = tl.load(dzT_ptr + i_bh * DK + ok, mask=mk, other=0.0).to(ACC)
    base_k = (i_b * T * H + i_h) * DK
    stride_k = H * DK
    rows = i_bh * n_steps  # this program's first row in the segment buffers
    n_chunks = tl.cdiv(n_steps, CK)
    for jc in range(n_chunks):
        i0 = (n_chunks - 1 - jc) * CK
        nt = tl.minimum(CK, n_steps - i0)
        c_end = i_bh * (NC + 1) + (t_begin + i0) // CK + 1
        A = tl.load(cka_ptr + c_end * DK * DK + off_kk, mask=m_kk, other=0.0).to(ACC)
        z = tl.load(ckz_ptr + c_end * DK + ok, mask=mk, other=0.0).to(ACC)
        shift = tl.zeros([], dtype=ACC)  # A = tile + shift·I (NUDGE_SCALAR_WALK; else 0)
        for jj in range(nt):
            i = i0 + nt - 1 - jj
            t = t_begin + i
            r = rows + i
            q_t = tl.load(q_ptr + base_k + t * stride_k + ok, mask=mk, other=0.0).to(ACC)
            k_t = tl.load(k_ptr + base_k + t * stride_k + ok, mask=mk, other=0.0).to(ACC)
            u_t = tl.load(u_ptr + base_k + t * stride_k + ok, mask=mk, other=0.0).to(ACC)
            kh = tl.load(kh_ptr + r * BK + ok)
            ah = tl.load(ah_ptr + r * BK + ok)
            s = tl.load(sv_ptr + r * BK + ok)
            zq = tl.load(sc_ptr + r * 2 + 1)
            delta_raw = tl.load(cs_ptr + r * 4)
            delta = tl.load(cs_ptr + r * 4 + 1)
            anorm = tl.load(cs_ptr + r * 4 + 2)
            knorm = tl.load(cs_ptr + r * 4 + 3)
            dq = tl.load(dqs_ptr + r * BK + ok)
            dah = tl.load(dahs_ptr + r * BK + ok)
            if BUG == 3:
                dkh = tl.zeros([BK], dtype=ACC)
            else:
                dkh = tl.load(dkhs_ptr + r * BK + ok)
            # Read-out denominator n = max(z_tᵀq, out_eps); z_t = z_{t-1} + k_t.
            if NORM_OUT:
                n = tl.maximum(zq, out_eps)
                dn = -_div(tl.load(dns_ptr + r), n * n, ACC)
                dn = tl.where(zq > out_eps, dn, 0.0)
            else:
                dn = 0.0
            dz = dz + dn * q_t
            dq = dq + dn * z
            dk_t = dz
            z = z - k_t
            # α̂ = α / max(||α||, norm_eps).  Vectors are scaled by one correctly rounded reciprocal
            # (0.5 + 1 ulp; the gradient budgets of spec §4 are far wider): a vector division
            # compiles to a call per element, and calls in this loop spilled its two tiles.
            if NORM_GATE:
                ra = _div(1.0, tl.maximum(anorm, norm_eps), ACC)
                da = tl.where(anorm > norm_eps, dah - ah * tl.sum(ah * dah, axis=0), dah) * ra
            else:
                da = dah
            # α = A_t k̂: dk̂ += A_tᵀ dα (Σ_i A[i, j] dα_i = Σ_i Aᵀ[j, i] dα_i), dA += dα k̂ᵀ.
            dkh = dkh + tl.sum(A * da[None, :], axis=1)
            if NUDGE_SCALAR_WALK:
                dkh = tl.fma(da, shift, dkh)
            dA = dA + kh[:, None] * da[None, :]
            # A_t = A_{t-1} − s sᵀ/δ + η_t I, δ = max(1 + uᵀs, sm_floor), s = A_{t-1} u.
            P1 = tl.sum(dA * s[:, None], axis=0)  # (dA s)_i
            P2 = tl.sum(dA * s[None, :], axis=1)  # (dAᵀ s)_j
            rd = _div(1.0, delta, ACC)
            ds = -(P1 + P2) * rd
            ddelta = tl.sum(s * P1, axis=0) * (rd * rd)
            through = delta_raw > sm_floor
            ds = ds + tl.where(through, ddelta, 0.0) * u_t
            du = tl.where(through, ddelta, 0.0) * s
            eta = tl.where((t + 1) % nudge_period == 0, nudge_eta, 0.0)
            # A_{t-1} from A_t with the forward's downdate term: an FMA per entry (DOWNDATE_FMA);
            # a correctly rounded division per entry was half of this kernel's time at BK = 128.
            if DOWNDATE == 1:
                A = tl.fma(s[:, None] * s[None, :], rd, A)
            else:
                A = A + _div(s[:, None] * s[None, :], delta, ACC)
            if NUDGE_SCALAR_WALK:
                shift = shift - eta
                du = du + tl.sum(A * ds[None, :], axis=1)  # A_{t-1}ᵀ ds
                du = tl.fma(ds, shift, du)
            else:
                A = A - tl.where(eye, eta, 0.0)
                du = du + tl.sum(A * ds[None, :], axis=1)  # A_{t-1}ᵀ ds
            dA = dA + u_t[:, None] * ds[None, :]  # dA[i, j] += ds_i u_j
            # k̂ = k / max(||k||, norm_eps).
            rk = _div(1.0, tl.maximum(knorm, norm_eps), ACC)
            dk_t = dk_t + tl.where(knorm > norm_eps, dkh - kh * tl.sum(kh * dkh, axis=0), dkh) * rk
            tl.store(dq_ptr + base_k + t * stride_k + ok, dq.to(dq_ptr.dtype.element_ty), mask=mk)
            tl.store(dk_ptr + base_k + t * stride_k + ok, dk_t.to(dk_ptr.dtype.element_ty), mask=mk)
            tl.store(du_ptr + base_k + t * stride_k + ok, du.to(du_ptr.dtype.element_ty), mask=mk)
    tl.store(da0_ptr + i_bh * DK * DK + off_kk, dA, mask=m_kk)
    tl.store(dz0_ptr + i_bh * DK + ok, dz, mask=mk)


@triton.jit
def vla_bwd_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    u_ptr,
    do_ptr,
    dsT_ptr,
    daT_ptr,
    dzT_ptr,
    cks_ptr,
    cka_ptr,
    ckz_ptr,
    vec_ptr,
    sc_ptr,
    dq_ptr,
    dk_ptr,
    dv_ptr,
    du_ptr,
    ds0_ptr,
    da0_ptr,
    dz0_ptr,
    p_ptr,
    T,
    H,
    DK,
    DV,
    nudge_period,
    CK,
    NC,
    BK: tl.constexpr,
    BV: tl.constexpr,
    HAS_DFINAL: tl.constexpr,
    NORM_GATE: tl.constexpr,
    NORM_OUT: tl.constexpr,
    ACC: tl.constexpr,
    BUG: tl.constexpr,
    DOWNDATE: tl.constexpr = 0,
):
    """Backward of spec §2.3 for one (b, h): gradients of q, k, v, u ``[B, T, H, D]`` (input
    dtype) and of the initial state ``(S_0, A_0, z_0)`` (``ACC``), given ``do`` and the gradients
    of the final state ``dS_T, dA_T, dz_T`` (``ACC``; absent when ``HAS_DFINAL`` is False).

    ``vec_ptr`` is a per-program scratch ``[B·H, CK, 3·BK + BV]`` and ``sc_ptr`` ``[B·H, CK, 8]``
    (float32/64): the per-token vectors of the chunk being differentiated, recomputed from the
    checkpoint ``(cks, cka, ckz)`` ``[B, H, NC, ...]`` that the forward stored.

    Adjoint equations per token (reverse order; ``dS, dA, dz`` hold the gradient w.r.t. the state
    after step t):  read-out ``r = S_t q``, ``n = max(z_tᵀq, out_eps)``: ``dS += (do/n) qᵀ``,
    ``dq = S_tᵀ do/n − (doᵀr/n²) z_t``, ``dz −= (doᵀr/n²) q``;  ``dk += dz``;
    ``de = dS α̂``, ``dα̂ = dSᵀ e``, ``dv = de``, ``dk̂ = −S_{t-1}ᵀ de``, ``dS −= de k̂ᵀ``;
    ``dα`` from ``dα̂`` through the normalisation; ``dk̂ += A_tᵀ dα``, ``dA += dα k̂ᵀ``;
    ``ds = −(dA + dAᵀ) s/δ``, ``dδ = sᵀ dA s/δ²`` (through the floor only when ``1 + uᵀs >
    sm_floor``: ``ds += dδ u``, ``du = dδ s``); ``du += A_{t-1}ᵀ ds``, ``dA += ds uᵀ``;
    ``dk += ∂k̂/∂k · dk̂``.
    """
    i_bh = tl.program_id(0).to(tl.int64)
    i_b = i_bh // H
    i_h = i_bh % H
    ok = tl.arange(0, BK)
    ov = tl.arange(0, BV)
    mk = ok < DK
    mv = ov < DV
    m_kk = mk[:, None] & mk[None, :]
    m_vk = mv[:, None] & mk[None, :]
    eye = (ok[:, None] == ok[None, :]) & m_kk
    _lam, sm_floor, nudge_eta, out_eps, norm_eps = _load_params(p_ptr)
    off_kk = ok[:, None] * DK + ok[None, :]
    off_vk = ov[:, None] * DK + ok[None, :]

    if HAS_DFINAL:
        dS = tl.load(dsT_ptr + i_bh * DV * DK + off_vk, mask=m_vk, other=0.0).to(ACC)
        dA = tl.load(daT_ptr + i_bh * DK * DK + off_kk, mask=m_kk, other=0.0).to(ACC)
        dz = tl.load(dzT_ptr + i_bh * DK + ok, mask=mk, other=0.0).to(ACC)
    else:
        dS = tl.zeros([BV, BK], dtype=ACC)
        dA = tl.zeros([BK, BK], dtype=ACC)
        dz = tl.zeros([BK], dtype=ACC)

    base_k = (i_b * T * H + i_h) * DK
    base_v = (i_b * T * H + i_h) * DV
    stride_k = H * DK
    stride_v = H * DV
    W = 3 * BK + BV
    vec = vec_ptr + i_bh * CK * W
    sc = sc_ptr + i_bh * CK * 8

    for jc in range(NC):
        ic = NC - 1 - jc
        t0 = ic * CK
        nt = tl.minimum(CK, T - t0)
        c = i_bh * NC + ic
        S = tl.load(cks_ptr + c * DV * DK + off_vk, mask=m_vk, other=0.0).to(ACC)
        A = tl.load(cka_ptr + c * DK * DK + off_kk, mask=m_kk, other=0.0).to(ACC)
        z = tl.load(ckz_ptr + c * DK + ok, mask=mk, other=0.0).to(ACC)
        # 1. Recompute the chunk forward from its checkpoint, keeping the per-token vectors.
        for j in range(nt):
            t = t0 + j
            q_t = tl.load(q_ptr + base_k + t * stride_k + ok, mask=mk, other=0.0).to(ACC)
            k_t = tl.load(k_ptr + base_k + t * stride_k + ok, mask=mk, other=0.0).to(ACC)
            u_t = tl.load(u_ptr + base_k + t * stride_k + ok, mask=mk, other=0.0).to(ACC)
            v_t = tl.load(v_ptr + base_v + t * stride_v + ov, mask=mv, other=0.0).to(ACC)
            A, S, z, _o, kh, s, ah, e, delta_raw, delta, rd, anorm, knorm, zq = _vla_step(
                A,
                S,
                z,
                q_t,
                k_t,
                v_t,
                u_t,
                t,
                eye,
                nudge_period,
                nudge_eta,
                sm_floor,
                out_eps,
                norm_eps,
                NORM_GATE,
                NORM_OUT,
                ACC,
                0,
                DOWNDATE,
            )
            row = vec + j * W
            tl.store(row + ok, kh)
            tl.store(row + BK + ok, s)
            tl.store(row + 2 * BK + ok, ah)
            tl.store(row + 3 * BK + ov, e)
            srow = sc + j * 8
            tl.store(srow + 0, delta_raw)
            tl.store(srow + 1, delta)
            tl.store(srow + 5, rd)
            tl.store(srow + 2, anorm)
            tl.store(srow + 3, knorm)
            tl.store(srow + 4, zq)
        # The scratch was written by other threads than those that read it below.
        tl.debug_barrier()
        # 2. Walk the chunk backwards: S = S_t, A = A_t, z = z_t on entry to each step.
        for jj in range(nt):
            j = nt - 1 - jj
            t = t0 + j
            q_t = tl.load(q_ptr + base_k + t * stride_k + ok, mask=mk, other=0.0).to(ACC)
            k_t = tl.load(k_ptr + base_k + t * stride_k + ok, mask=mk, other=0.0).to(ACC)
            u_t = tl.load(u_ptr + base_k + t * stride_k + ok, mask=mk, other=0.0).to(ACC)
            do_t = tl.load(do_ptr + base_v + t * stride_v + ov, mask=mv, other=0.0).to(ACC)
            row = vec + j * W
            kh = tl.load(row + ok)
            s = tl.load(row + BK + ok)
            ah = tl.load(row + 2 * BK + ok)
            e = tl.load(row + 3 * BK + ov)
            srow = sc + j * 8
            delta_raw = tl.load(srow + 0)
            delta = tl.load(srow + 1)
            rd = tl.load(srow + 5)
            anorm = tl.load(srow + 2)
            knorm = tl.load(srow + 3)
            zq = tl.load(srow + 4)

            # Read-out o_t = S_t q / max(z_tᵀq, out_eps).
            if NORM_OUT:
                n = tl.maximum(zq, out_eps)
                dr = _div(do_t, n, ACC)
                r = tl.sum(S * q_t[None, :], axis=1)
                dn = -_div(tl.sum(do_t * r, axis=0), n * n, ACC)
                dn = tl.where(zq > out_eps, dn, 0.0)
            else:
                dr = do_t
                dn = 0.0
            dq = tl.sum(S * dr[:, None], axis=0)
            dS = dS + dr[:, None] * q_t[None, :]
            # z_t = z_{t-1} + k_t, read out through z_tᵀq.
            dz = dz + dn * q_t
            dq = dq + dn * z
            dk_t = dz
            z = z - k_t
            # S_t = S_{t-1} + e α̂ᵀ, e = v − S_{t-1} k̂.
            de = tl.sum(dS * ah[None, :], axis=1)
            dah = tl.sum(dS * e[:, None], axis=0)
            S = S - e[:, None] * ah[None, :]
            if BUG == 3:
                dkh = tl.zeros([BK], dtype=ACC)
            else:
                dkh = -tl.sum(S * de[:, None], axis=0)
            dS = dS - de[:, None] * kh[None, :]
            # α̂ = α / max(||α||, norm_eps).
            if NORM_GATE:
                da = tl.where(
                    anorm > norm_eps,
                    _div(dah - ah * tl.sum(ah * dah, axis=0), anorm, ACC),
                    _div(dah, norm_eps, ACC),
                )
            else:
                da = dah
            # α = A_t k̂.
            dkh = dkh + tl.sum(A * da[:, None], axis=0)
            dA = dA + da[:, None] * kh[None, :]
            # A_t = A_{t-1} − s sᵀ/δ + η_t I, δ = max(1 + uᵀs, sm_floor), s = A_{t-1} u.
            P1 = tl.sum(dA * s[None, :], axis=1)
            P2 = tl.sum(dA * s[:, None], axis=0)
            ds = -(P1 + P2) * rd
            ddelta = tl.sum(s * P1, axis=0) * (rd * rd)
            through = delta_raw > sm_floor
            ds = ds + tl.where(through, ddelta, 0.0) * u_t
            du = tl.where(through, ddelta, 0.0) * s
            nudge = (t + 1) % nudge_period == 0
            if DOWNDATE == 1:  # the forward's downdate term, one FMA per entry
                A = tl.fma(s[:, None] * s[None, :], rd, A)
            else:
                A = A + _div(s[:, None] * s[None, :], delta, ACC)  # the forward's quotient
            if nudge:
                A = tl.where(eye, A - nudge_eta, A)
            du = du + tl.sum(A * ds[:, None], axis=0)
            dA = dA + ds[:, None] * u_t[None, :]
            # k̂ = k / max(||k||, norm_eps).
            dk_t = dk_t + tl.where(
                knorm > norm_eps,
                _div(dkh - kh * tl.sum(kh * dkh, axis=0), knorm, ACC),
                _div(dkh, norm_eps, ACC),
            )
            tl.store(dq_ptr + base_k + t * stride_k + ok, dq.to(dq_ptr.dtype.element_ty), mask=mk)
            tl.store(dk_ptr + base_k + t * stride_k + ok, dk_t.to(dk_ptr.dtype.element_ty), mask=mk)
            tl.store(du_ptr + base_k + t * stride_k + ok, du.to(du_ptr.dtype.element_ty), mask=mk)
            tl.store(dv_ptr + base_v + t * stride_v + ov, de.to(dv_ptr.dtype.element_ty), mask=mv)
        # The next chunk overwrites the scratch that this one read.
        tl.debug_barrier()

    tl.store(ds0_ptr + i_bh * DV * DK + off_vk, dS, mask=m_vk)
    tl.store(da0_ptr + i_bh * DK * DK + off_kk, dA, mask=m_kk)
    tl.store(dz0_ptr + i_bh * DK + ok, dz, mask=mk)


__all__ = [
    "BUG_DK_SIGN",
    "BUG_GATE_FROM_OLD_A",
    "BUG_NONE",
    "BUG_NUDGE_ONE_STEP_LATE",
    "vla_bwd_kernel",
    "vla_fwd_kernel",
    "vla_gate_bwd_kernel",
    "vla_gate_kernel",
    "vla_state_bwd_kernel",
    "vla_state_kernel",
]
