"""Triton kernels of the recurrent VLA backend: spec §2.3, forward and backward.

Only kernels live here (``@triton.jit`` functions and their named constants); the launches, the
plan, the autograd Function and the registry backend are in
:mod:`vla_verify.backends.triton_fused`.  Nothing is imported from the oracle (spec §4
independence): every line of the recurrence is written out below; the chunked state adjoint
shares the unit lower triangular inverse of the chunked backend's kernels.

The step of spec §2.3 is cut at the gate into two halves that run in different programs:

- the *gate pass* (:func:`_gate_pass`, one program per (b, h)) holds ``Aᵀ`` ``[BK, BK]`` and
  ``z`` in registers for the whole sequence and runs the key and penalty halves: ``k̂``, the
  Sherman–Morrison downdate, the nudge, the gate ``α̂`` from the UPDATED ``A_t`` (a second pass
  over ``A``: the one-pass shortcut ``A_{t-1}k̂ − s(sᵀk̂)/δ`` cancels at the scale of
  ``|A_{t-1}k̂|`` and fails the spec §4 budget on an ill-conditioned downdate).  It writes
  ``k̂, α̂`` and ``(α̂ᵀq, z_tᵀq)`` per token;
- the *state pass* (:func:`_state_pass`, one program per (b, h) and block of ``BV`` value rows)
  runs the generalized delta rule ``S_t = S_{t-1} + (v − S_{t-1}k̂) α̂ᵀ`` on them and the
  read-out.

The forward, :func:`vla_stream_kernel`, runs both passes in ONE launch, the state programs
reading each block of gates as soon as the gate program has published it (per-(b, h) progress
counts, release/acquire): the forward costs about the gate pass.  The backward is three kernels
per segment of tokens: :func:`vla_gate_kernel` reruns the gate pass from a checkpoint,
:func:`vla_state_bwd_kernel` the state adjoint per value block, :func:`vla_gate_bwd_kernel` the
penalty adjoint walking each chunk back from the next checkpoint.

The gate step is a chain of dependent reductions, and its cost on the H200 is their latency, not
arithmetic.  What shortens it:

- tiles are held *transposed*, so that ``A u``, ``A k̂``, ``S k̂`` and ``S q`` are sums down axis 0
  (thread-local adds and one cross-warp exchange) instead of per-row shuffle butterflies; every
  matrix the kernels read or write (states, checkpoints, their gradients) is transposed in memory
  too, because a loop-carried tile keeps the layout it was loaded with (1813 ``SHFL`` per token
  in the gate kernel's SASS at BK = 128 with a transposed load, against 35);
- independent sums share one reduction (:func:`_sum_pair`, :func:`_add_five`);
- the pipelined step (:func:`_gate_pipelined_t`): ``s_{t+1} = A_t u_{t+1}`` comes in the same
  pass over ``A_t`` as the gate, and the next token's key sums in the gate's last reduction:
  two dependent reductions per token;
- axis-0 sums as interleaved partial sums (:func:`_colsum`, ``SPLIT``);
- the downdate as one ``tl.fma`` per entry (``DOWNDATE_FMA``);
- the nudge without a select over the tile on every token (``NUDGE``: under a branch, a loop
  compiled per nudge period, or ``A`` kept as ``B + c·I``).

The nudge clock: token ``t`` (0-based within the call) is global step ``start + t + 1``, and the
nudge follows it when that step is a multiple of the period (spec §2.3; ``start`` the tokens
consumed before the call, reduced modulo the period by the caller).
"""

from __future__ import annotations

from enum import IntEnum

import triton
import triton.language as tl

from .triton_chunked_kernels import unit_lower_inverse as _unit_lower_inverse


class Bug(IntEnum):
    """Planted bugs, for the meta-tests that show the checks can fail (``BUG`` constexpr; never
    set otherwise).  Each sits in a code path a measured plan runs: the per-token kernels, the
    chunked state adjoint (``RecurrentPlan.chunked_state_adjoint``), the penalty adjoint in
    pieces (``RecurrentPlan.chunked_penalty_adjoint``) and the parallel gate rerun
    (``RecurrentPlan.parallel_rerun``), as each member's comment says."""

    NONE = 0
    GATE_FROM_OLD_A = 1  # α_t = A_{t-1} k̂ (the gate from the old A)
    NUDGE_ONE_STEP_LATE = 2  # nudge after step t with (t − 1) % period == 0
    DK_SIGN = 3  # backward: drop the −S_{t-1}ᵀ de term of dk̂
    FOLD_DROPS_NUDGES = 4  # NUDGE_SCALAR: each fold zeroes c without adding it to the tile
    IGNORES_START = 5  # the nudge clock restarts at every call (start taken as 0)
    CHUNK_TRIANGLE = 6  # chunked state adjoint: −S_{t-1}ᵀde reads e_t too (tril for stril)
    SCAN_STORES_LATE = 7  # chunked state adjoint: dSᵀ after a chunk stored after its update
    PIECE_END_DROPS_NUDGES = 8  # penalty adjoint in pieces: A at a piece's end without nudges
    PIECE_Y_WHOLE_T = 9  # penalty adjoint in pieces: y_t through the whole piece's T
    RERUN_NEXT_CHECKPOINT = 10  # parallel gate rerun: each piece from the next interval's A, z
    GROUP_ORDER = 11  # penalty adjoint in pieces, grouped scan: a group's Q composed reversed


class Downdate(IntEnum):
    """The Sherman–Morrison downdate of ``A`` (``DOWNDATE`` constexpr)."""

    EXACT = 0  # A − (s_i s_j)/δ, a correctly rounded division per entry (the oracle's order)
    FMA = 1  # fma(−s_i s_j, 1/δ, A): a multiply and one FMA per entry


class Nudge(IntEnum):
    """How the pipelined gate step adds the nudge ``η I`` (``NUDGE`` constexpr)."""

    SELECT = 0  # a select over the tile on every token (η = 0 off the period)
    BRANCH = 1  # the select under a branch taken on nudge tokens only
    NEVER = 3  # the caller knows no nudge falls on this token (PERIOD_LOOP)
    ALWAYS = 4  # the caller knows one does (PERIOD_LOOP)
    SCALAR = 5  # A kept as B + c·I: the nudge adds η to c, folded into the tile every FOLD_EVERY


# The same values as constexprs, for the kernels (a @triton.jit function reads only constexpr
# globals).
BUG_NONE = tl.constexpr(int(Bug.NONE))
BUG_GATE_FROM_OLD_A = tl.constexpr(int(Bug.GATE_FROM_OLD_A))
BUG_NUDGE_ONE_STEP_LATE = tl.constexpr(int(Bug.NUDGE_ONE_STEP_LATE))
BUG_DK_SIGN = tl.constexpr(int(Bug.DK_SIGN))
BUG_FOLD_DROPS_NUDGES = tl.constexpr(int(Bug.FOLD_DROPS_NUDGES))
BUG_IGNORES_START = tl.constexpr(int(Bug.IGNORES_START))
BUG_CHUNK_TRIANGLE = tl.constexpr(int(Bug.CHUNK_TRIANGLE))
BUG_SCAN_STORES_LATE = tl.constexpr(int(Bug.SCAN_STORES_LATE))
BUG_PIECE_END_DROPS_NUDGES = tl.constexpr(int(Bug.PIECE_END_DROPS_NUDGES))
BUG_PIECE_Y_WHOLE_T = tl.constexpr(int(Bug.PIECE_Y_WHOLE_T))
BUG_GROUP_ORDER = tl.constexpr(int(Bug.GROUP_ORDER))
DOWNDATE_EXACT = tl.constexpr(int(Downdate.EXACT))
DOWNDATE_FMA = tl.constexpr(int(Downdate.FMA))
NUDGE_SELECT = tl.constexpr(int(Nudge.SELECT))
NUDGE_BRANCH = tl.constexpr(int(Nudge.BRANCH))
NUDGE_NEVER = tl.constexpr(int(Nudge.NEVER))
NUDGE_ALWAYS = tl.constexpr(int(Nudge.ALWAYS))
NUDGE_SCALAR = tl.constexpr(int(Nudge.SCALAR))
#: Tokens between folds of the scalar shift c into the tile (NUDGE_SCALAR): c then stays below
#: η·⌈FOLD_EVERY / nudge_period⌉, so B = A − c·I loses nothing to cancellation.
FOLD_EVERY = tl.constexpr(64)
#: The cache modifier of the state programs' gate loads: ".cg" keeps them out of the L1, which
#: is not coherent with the gate program's SM.
GATE_CACHE = tl.constexpr(".cg")


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
def _add_five(a0, b0, c0, d0, e0, a1, b1, c1, d1, e1):
    """Combine function of a five-output sum (:func:`_gate_pipelined_t`)."""
    return a0 + a1, b0 + b1, c0 + c1, d0 + d1, e0 + e1


@triton.jit
def _gate_pipelined_t(
    At, s, delta_raw, kh, u_next, q, step, phase, eye, nudge_period, nudge_eta, sm_floor, norm_eps,
    k_next, zk_next, q_next, c,
    NORM_GATE: tl.constexpr, ACC: tl.constexpr, BUG: tl.constexpr, DOWNDATE: tl.constexpr,
    SPLIT: tl.constexpr, NUDGE: tl.constexpr,
):  # fmt: skip
    """The penalty half of one step (spec §2.3) on the transposed tile ``At[j, i] = A[i, j]``
    ``[BK, BK]``, with the next token's Sherman–Morrison vector and key sums one step ahead.

    ``s = A_{t-1} u_t`` and ``1 + u_tᵀs`` arrive from the previous step; the step downdates
    ``A`` by ``u_t`` (``A_t = A_{t-1} − s sᵀ/δ``, exactly symmetric: the product ``s_i s_j`` is),
    adds the nudge after step ``step`` of the call (``step % nudge_period == phase``, see
    :func:`_gate_pass`), then reads the updated ``A_t`` once for both ``α_t = A_t k̂_t`` and
    ``s_{t+1} = A_t u_{t+1}`` (one paired reduction); ``‖α_t‖²``, ``α_tᵀq``,
    ``u_{t+1}ᵀs_{t+1}`` and the next token's key sums ``‖k_{t+1}‖²``, ``z_{t+1}ᵀq_{t+1}``
    (``zk_next = z_t + k_{t+1}``) share a second: two dependent reductions per token.

    ``NUDGE == NUDGE_SCALAR``: ``At`` holds ``B`` with ``A = B + c·I`` (the nudge ``A += η·I``
    is ``c += η``), so ``α_t = B k̂_t + c k̂_t`` and ``s_{t+1} = B u_{t+1} + c u_{t+1}``: a scalar
    add and two vector FMAs instead of a select and an add over the tile per token.  The
    downdate acts on ``B`` (``A − s sᵀ/δ = (B − s sᵀ/δ) + c·I``).

    Returns ``(At, α̂, α̂ᵀq, s, 1 + uᵀs, δ, ‖α‖, s_{t+1}, 1 + u_{t+1}ᵀs_{t+1}, ‖k_{t+1}‖²,
    z_{t+1}ᵀq_{t+1}, c)``.
    """
    delta = tl.maximum(delta_raw, sm_floor)
    if BUG == BUG_NUDGE_ONE_STEP_LATE:
        step = step - 1
    nudge = (step % nudge_period == phase) & (step > 0)
    eta = tl.where(nudge, nudge_eta, 0.0)
    alpha_old = kh  # replaced under the planted bug only (dead code otherwise)
    if BUG == BUG_GATE_FROM_OLD_A:  # α from A_{t-1}: one more pass over the old tile
        alpha_old = _colsum(At * kh[:, None], SPLIT)
        if NUDGE == NUDGE_SCALAR:
            alpha_old = tl.fma(kh, c, alpha_old)
    if DOWNDATE == DOWNDATE_FMA:
        # A − (s_i s_j)·(1/δ) in one explicit fused multiply-add (tl.fma rounds once on the GPU
        # and in the interpreter alike): the term carries the roundings of s_i s_j and 1/δ, the
        # result one more — the error bound of the oracle's fl(A − fl(s_i s_j)/δ), with a
        # multiply and an FMA per entry instead of a correctly rounded division.
        At = tl.fma(-(s[:, None] * s[None, :]), _div(1.0, delta, ACC), At)
    else:
        At = At - _div(s[:, None] * s[None, :], delta, ACC)
    if NUDGE == NUDGE_NEVER:
        pass
    elif NUDGE == NUDGE_ALWAYS:
        At = At + tl.where(eye, nudge_eta, 0.0)
    elif NUDGE == NUDGE_SCALAR:
        c = c + eta
    elif NUDGE == NUDGE_BRANCH:
        # Only on nudge steps: a tile-valued branch keeps two copies of A live, which spills
        # registers at BK = 128 (there the select is the default).
        if nudge:
            At = At + tl.where(eye, nudge_eta, 0.0)
    else:
        At = At + tl.where(eye, eta, 0.0)
    alpha, s_next = _colsum_pair(At * kh[:, None], At * u_next[:, None], SPLIT)
    if NUDGE == NUDGE_SCALAR:
        alpha = tl.fma(kh, c, alpha)
        s_next = tl.fma(u_next, c, s_next)
    if BUG == BUG_GATE_FROM_OLD_A:
        alpha = alpha_old
    aa, aq, us, kk, zq = tl.reduce(
        (alpha * alpha, alpha * q, u_next * s_next, k_next * k_next, zk_next * q_next),
        0,
        _add_five,
    )
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
def _gate_token(
    i, t_begin, t_last, phase, A, c, z, s_n, dr_n, kh_c, zq_c, knorm_c, k_c, q_c, k_n, q_n,
    u_nn, q_ptr, k_ptr, u_ptr, kh_row, ah_row, sc_row, sv_ptr, cs_ptr, progress_ptr, i_bh,
    n_steps, base_k, stride_k, ok, mk, eye, nudge_period, nudge_eta, sm_floor, norm_eps,
    BK: tl.constexpr, NORM_GATE: tl.constexpr, ACC: tl.constexpr, BUG: tl.constexpr,
    DOWNDATE: tl.constexpr, SPLIT: tl.constexpr, NUDGE: tl.constexpr, SAVE_CHAIN: tl.constexpr,
    PUBLISH: tl.constexpr,
):  # fmt: skip
    """Token ``t_begin + i`` of :func:`_gate_pass`: loads two tokens ahead (a load issued in the
    iteration that uses it leaves its latency on the critical path), the pipelined step
    (:func:`_gate_pipelined_t`; ``NUDGE`` how it adds the nudge), the stores, the progress
    count.  ``k̂, z_tᵀq, ‖k‖`` of this token come from the previous token's last reduction.
    Returns the carried values, in the order they came."""
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
        A, s_n, dr_n, kh, u_n, q_c, t + 1, phase, eye, nudge_period, nudge_eta, sm_floor,
        norm_eps, k_n, z + k_n, q_n, c, NORM_GATE, ACC, BUG, DOWNDATE, SPLIT, NUDGE,
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
    i_bh, q_ptr, k_ptr, u_ptr, kh_ptr, ah_ptr, sc_ptr, sv_ptr, cs_ptr, a0_ptr, z0_ptr, aT_ptr,
    zT_ptr, cka_ptr, ckz_ptr, p_ptr, progress_ptr, T, H, DK, nudge_period, start, CK, NC,
    t_begin, n_steps, a_stride,
    BK: tl.constexpr, HAS_INIT: tl.constexpr, SAVE_CKPT: tl.constexpr,
    SAVE_CHAIN: tl.constexpr, NORM_GATE: tl.constexpr, ACC: tl.constexpr, BUG: tl.constexpr,
    DOWNDATE: tl.constexpr, SPLIT: tl.constexpr, NUDGE: tl.constexpr, LOAD_PLAIN: tl.constexpr,
    PERIOD_LOOP: tl.constexpr, PUBLISH: tl.constexpr,
):  # fmt: skip
    """The gate pass for the (b, h) ``i_bh`` (int64) over tokens ``t_begin ≤ t < t_begin +
    n_steps`` of a length-``T`` sequence.

    Starts from ``(a0, z0)`` ``[B, H, ...]`` (``HAS_INIT``, ``Aᵀ`` in memory) or the spec
    defaults ``A_0 = I/lambda0``, ``z_0 = 0``.  Writes, per token, ``k̂`` and ``α̂`` to ``kh``,
    ``ah`` ``[B·H, n_steps, BK]`` (``ACC``, zero past ``DK``) and ``(α̂ᵀq, z_tᵀq)`` to ``sc``
    ``[B·H, n_steps, 2]``; the last ``A, z`` to ``aT, zT``; with ``SAVE_CKPT`` the ``(A, z)``
    at the start of every chunk of ``CK`` tokens to slot ``t // CK`` of ``cka, ckz``
    ``[B, H, NC + 1, ...]`` and the last into slot ``NC`` (the end of the last chunk, for
    :func:`vla_gate_bwd_kernel`); with ``SAVE_CHAIN`` (the backward's rerun) also ``s`` to
    ``sv`` ``[B·H, n_steps, BK]`` and ``(1 + uᵀs, δ, ‖α‖, ‖k‖)`` to ``cs`` ``[B·H, n_steps,
    4]``.  With ``PUBLISH`` > 0 it stores, every ``PUBLISH`` tokens, how many tokens' gates are
    written to ``progress_ptr[i_bh]`` (int32, release), for :func:`vla_stream_kernel`'s state
    programs.  ``start``: the call's nudge clock (module docstring).
    """
    i_b = i_bh // H
    i_h = i_bh % H
    ok = tl.arange(0, BK)
    mk = ok < DK
    m_kk = mk[:, None] & mk[None, :]
    eye = (ok[:, None] == ok[None, :]) & m_kk
    lam, sm_floor, nudge_eta, _out_eps, norm_eps = _load_params(p_ptr)
    if BUG == BUG_IGNORES_START:
        start = 0
    # token t nudges when (start + t + 1) % period == 0, i.e. (t + 1) % period == phase: the
    # step's test keeps the form of a clock that starts at 0 (a runtime offset inside the
    # modulo made Triton 3.6 predicate the nudge branch: +70 instructions per token at BK = 64)
    phase = (nudge_period - start) % nudge_period
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
    q_c = tl.load(q_ptr + nk + ok, mask=mk, other=0.0).to(ACC)
    k_c = tl.load(k_ptr + nk + ok, mask=mk, other=0.0).to(ACC)
    u_n = tl.load(u_ptr + nk + ok, mask=mk, other=0.0).to(ACC)
    # The first token's s = A u, 1 + uᵀs and key half ahead of the loop; then each token's
    # come in the previous token's reductions, and q, k, u are loaded two tokens ahead.
    s_n = _colsum(A * u_n[:, None], SPLIT)
    dr_n = 1.0 + tl.sum(u_n * s_n, axis=0)
    _z, kh_c, zq_c, knorm_c = _key_t(z, k_c, q_c, norm_eps, ACC)
    nk = base_k + tl.minimum(t_begin + 1, t_last) * stride_k
    u_nn = tl.load(u_ptr + nk + ok, mask=mk, other=0.0).to(ACC)
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
    elif NUDGE == NUDGE_SCALAR:
        block = FOLD_EVERY
    else:
        block = n_steps
    for i0 in range(0, n_steps, block):
        if NUDGE == NUDGE_SCALAR:
            if BUG != BUG_FOLD_DROPS_NUDGES:
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
            # i >= i0 whose global step (start + t + 1; start + t under the planted late-nudge
            # bug) is a positive multiple of the period (int64: the period may be 2**31 - 1,
            # "never").
            if BUG == BUG_NUDGE_ONE_STEP_LATE:
                off = 0
            else:
                off = 1
            x = (t_begin + i0 + off).to(tl.int64) + start
            # (x·0 + period, not period.to(int64): a period of 1 is specialised to a Python
            # int by the launcher, which has no .to on the GPU)
            per = x * 0 + nudge_period
            f = i0 + (per - x % per) % per
            f = tl.where(x - i0 + f == 0, f + per, f)
            f = tl.minimum(f, i1).to(tl.int32)
            n_nudges = tl.where(f < i1, (i1 - 1 - f) // nudge_period + 1, 0)
            # Each period's first token is computed from r, not carried from the previous
            # period: Triton 3.6's TTGIR passes dropped a carried lower bound and restarted
            # every period at i0 (wrong results on the H200, bitwise right in the interpreter).
            for r in range(0, n_nudges + 1):
                p = tl.minimum(f.to(tl.int64) + r * per, i1).to(tl.int32)
                first = tl.where(
                    r == 0, i0, tl.minimum(f.to(tl.int64) + (r - 1) * per + 1, i1).to(tl.int32)
                )
                for i in range(first, p):
                    A, c, z, s_n, dr_n, kh_c, zq_c, knorm_c, k_c, q_c, k_n, q_n, u_nn = (
                        _gate_token(
                            i, t_begin, t_last, phase, A, c, z, s_n, dr_n, kh_c, zq_c, knorm_c,
                            k_c, q_c, k_n, q_n, u_nn, q_ptr, k_ptr, u_ptr, kh_row, ah_row,
                            sc_row, sv_ptr, cs_ptr, progress_ptr, i_bh, n_steps, base_k,
                            stride_k, ok, mk, eye, nudge_period, nudge_eta, sm_floor, norm_eps,
                            BK, NORM_GATE, ACC, BUG, DOWNDATE, SPLIT, NUDGE_NEVER, SAVE_CHAIN,
                            PUBLISH,
                        )
                    )  # fmt: skip
                for i in range(p, tl.minimum(p + 1, i1)):  # the nudge token, if any
                    A, c, z, s_n, dr_n, kh_c, zq_c, knorm_c, k_c, q_c, k_n, q_n, u_nn = (
                        _gate_token(
                            i, t_begin, t_last, phase, A, c, z, s_n, dr_n, kh_c, zq_c, knorm_c,
                            k_c, q_c, k_n, q_n, u_nn, q_ptr, k_ptr, u_ptr, kh_row, ah_row,
                            sc_row, sv_ptr, cs_ptr, progress_ptr, i_bh, n_steps, base_k,
                            stride_k, ok, mk, eye, nudge_period, nudge_eta, sm_floor, norm_eps,
                            BK, NORM_GATE, ACC, BUG, DOWNDATE, SPLIT, NUDGE_ALWAYS, SAVE_CHAIN,
                            PUBLISH,
                        )
                    )  # fmt: skip
        else:
            for i in range(i0, i1):
                A, c, z, s_n, dr_n, kh_c, zq_c, knorm_c, k_c, q_c, k_n, q_n, u_nn = _gate_token(
                    i, t_begin, t_last, phase, A, c, z, s_n, dr_n, kh_c, zq_c, knorm_c, k_c, q_c,
                    k_n, q_n, u_nn, q_ptr, k_ptr, u_ptr, kh_row, ah_row, sc_row, sv_ptr, cs_ptr,
                    progress_ptr, i_bh, n_steps, base_k, stride_k, ok, mk, eye, nudge_period,
                    nudge_eta, sm_floor, norm_eps, BK, NORM_GATE, ACC, BUG, DOWNDATE, SPLIT,
                    NUDGE, SAVE_CHAIN, PUBLISH,
                )  # fmt: skip
    if NUDGE == NUDGE_SCALAR and BUG != BUG_FOLD_DROPS_NUDGES:
        A = A + tl.where(eye, c, 0.0)
    tl.store(aT_ptr + i_bh * DK * DK + off_kk, A, mask=m_kk)
    tl.store(zT_ptr + i_bh * DK + ok, z, mask=mk)
    if SAVE_CKPT:
        slot = (i_bh * (NC + 1) + NC).to(tl.int64)
        tl.store(cka_ptr + slot * DK * DK + off_kk, A, mask=m_kk)
        tl.store(ckz_ptr + slot * DK + ok, z, mask=mk)


@triton.jit(do_not_specialize=["a_stride", "start"])
def vla_gate_kernel(
    q_ptr, k_ptr, u_ptr, kh_ptr, ah_ptr, sc_ptr, sv_ptr, cs_ptr, a0_ptr, z0_ptr, aT_ptr, zT_ptr,
    p_ptr, T, H, DK, nudge_period, start, t_begin, n_steps, a_stride, fold_m, fold_len,
    BK: tl.constexpr, NORM_GATE: tl.constexpr, ACC: tl.constexpr, DOWNDATE: tl.constexpr,
    SPLIT: tl.constexpr, NUDGE: tl.constexpr, LOAD_PLAIN: tl.constexpr,
    PERIOD_LOOP: tl.constexpr,
):  # fmt: skip
    """The backward's rerun of the gate pass (:func:`_gate_pass`), grid ``(B·H,)``: from the
    ``(A, z)`` checkpoint ``a0, z0`` ``[B, H, ...]`` at ``t_begin`` over ``n_steps`` tokens,
    writing ``k̂, α̂, (α̂ᵀq, z_tᵀq)`` and the Sherman–Morrison chain ``s, (1 + uᵀs, δ, ‖α‖,
    ‖k‖)`` that :func:`vla_state_bwd_kernel` and :func:`vla_gate_bwd_kernel` read (the forward
    keeps no per-token history).  ``aT, zT`` receive the end state (unused).  ``a_stride`` =
    ``DK``, read only with ``LOAD_PLAIN``.  The planted bugs are the forward's, not rerun here.
    A folded span (``fold_m`` pieces of ``fold_len`` tokens, batch element ``b = b₀·fold_m + j``
    holding piece ``j``): piece ``j``'s clock runs ``j·fold_len`` steps ahead of ``start``
    (``fold_m = 1``: no fold).
    """
    i_bh = tl.program_id(0).to(tl.int64)
    ahead = ((i_bh // H) % fold_m) * fold_len
    start = ((start + ahead) % nudge_period).to(tl.int32)
    _gate_pass(
        i_bh, q_ptr, k_ptr, u_ptr, kh_ptr, ah_ptr, sc_ptr, sv_ptr,
        cs_ptr, a0_ptr, z0_ptr, aT_ptr, zT_ptr, aT_ptr, zT_ptr, p_ptr, p_ptr, T, H, DK,
        nudge_period, start, 1, 0, t_begin, n_steps, a_stride, BK, True, False, True,
        NORM_GATE, ACC, BUG_NONE, DOWNDATE, SPLIT, NUDGE, LOAD_PLAIN, PERIOD_LOOP, 0,
    )  # fmt: skip


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
    i_v, i_bh, q_ptr, v_ptr, kh_ptr, ah_ptr, sc_ptr, o_ptr, s0_ptr, sT_ptr, cks_ptr, p_ptr,
    progress_ptr, T, H, DK, DV, CK, NC, t_begin, n_steps,
    BK: tl.constexpr, BV: tl.constexpr, HAS_INIT: tl.constexpr, SAVE_CKPT: tl.constexpr,
    NORM_OUT: tl.constexpr, ACC: tl.constexpr,
):  # fmt: skip
    """The state pass for value block ``i_v`` of the (b, h) ``i_bh`` (int64) over tokens
    ``t_begin ≤ t < t_begin + n_steps``: given the gates that :func:`_gate_pass` writes, the
    generalized delta rule ``S_t = S_{t-1} + (v − S_{t-1}k̂) α̂ᵀ`` and the read-out, one paired
    reduction per token.  It reads each token's gates only after ``progress_ptr[i_bh]`` says
    the gate program has written them.  Writes ``o`` ``[B, T, H, DV]`` (input dtype), the final
    ``S`` and (``SAVE_CKPT``) its checkpoints, ``Sᵀ`` ``[DK, DV]`` in memory like ``s0``."""
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
        # the loads below run one token ahead; wait only when that token's gates are not yet
        # published (a count seen earlier covers every token below it), so that the state
        # programs run at most one published block behind the gate program (with the last
        # block's publishes of _gate_store_t, about a token at the end)
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


@triton.jit(do_not_specialize=["a_stride", "start"])
def vla_stream_kernel(
    q_ptr, k_ptr, v_ptr, u_ptr, o_ptr, kh_ptr, ah_ptr, sc_ptr, sv_ptr, cs_ptr, a0_ptr, z0_ptr,
    s0_ptr, aT_ptr, zT_ptr, sT_ptr, cka_ptr, ckz_ptr, cks_ptr, p_ptr, counters_ptr, T, H, DK, DV,
    nudge_period, start, CK, NC, t_begin, n_steps, a_stride, BH, NV,
    BK: tl.constexpr, BV: tl.constexpr, HAS_INIT: tl.constexpr, SAVE_CKPT: tl.constexpr,
    SAVE_CHAIN: tl.constexpr, NORM_GATE: tl.constexpr, NORM_OUT: tl.constexpr,
    ACC: tl.constexpr, BUG: tl.constexpr, DOWNDATE: tl.constexpr, SPLIT: tl.constexpr,
    NUDGE: tl.constexpr, LOAD_PLAIN: tl.constexpr, PERIOD_LOOP: tl.constexpr,
    BLOCK_T: tl.constexpr,
):  # fmt: skip
    """The forward of spec §2.3 over tokens ``t_begin ≤ t < t_begin + n_steps`` in ONE launch,
    its two passes side by side: grid ``(B·H·(1 + NV),)``, ``B·H`` gate programs
    (:func:`_gate_pass`) and ``NV·B·H`` state programs (:func:`_state_pass`) that consume the
    gates at most ``BLOCK_T`` tokens behind them.

    Inputs ``q, k, u`` ``[B, T, H, DK]``, ``v`` ``[B, T, H, DV]`` (contiguous, any float dtype);
    ``o`` ``[B, T, H, DV]`` (input dtype); the per-token gates ``kh, ah`` ``[B·H, n_steps, BK]``
    and ``sc`` ``[B·H, n_steps, 2]`` (``ACC``); states ``Aᵀ [B, H, DK, DK]``, ``z [B, H, DK]``,
    ``Sᵀ [B, H, DK, DV]`` in ``ACC``, the initial ones read with ``HAS_INIT``; checkpoints
    (``SAVE_CKPT``) ``cka, ckz`` ``[B, H, NC + 1, ...]`` and ``cks`` ``[B, H, NC, DK, DV]``;
    with ``SAVE_CHAIN`` also the Sherman–Morrison chain ``s`` ``[B·H, n_steps, BK]`` and
    ``(1 + uᵀs, δ, ‖α‖, ‖k‖)`` ``[B·H, n_steps, 4]`` (as :func:`vla_gate_kernel` writes them),
    so that the backward needs no rerun of the gate pass.

    Roles go by a ticket (``counters_ptr[0]``, int32, zero at launch) taken when a program
    starts, not by its program id: the first ``B·H`` programs to start are the gate programs,
    so a state program only ever waits for a program that is already running, whatever the
    order the hardware starts them in, and under ``TRITON_INTERPRET=1``, which runs programs
    one after another, every gate program has finished before the first state program starts.
    ``counters_ptr[1:]`` ``[B·H]`` (int32, zero at launch): tokens whose gates are written, per
    (b, h).
    """
    role = tl.atomic_add(counters_ptr, 1)
    progress_ptr = counters_ptr + 1
    if role < BH:
        _gate_pass(
            role.to(tl.int64), q_ptr, k_ptr, u_ptr, kh_ptr, ah_ptr, sc_ptr, sv_ptr, cs_ptr,
            a0_ptr, z0_ptr, aT_ptr, zT_ptr, cka_ptr, ckz_ptr, p_ptr, progress_ptr, T, H, DK,
            nudge_period, start, CK, NC, t_begin, n_steps, a_stride, BK, HAS_INIT, SAVE_CKPT,
            SAVE_CHAIN, NORM_GATE, ACC, BUG, DOWNDATE, SPLIT, NUDGE, LOAD_PLAIN, PERIOD_LOOP,
            BLOCK_T,
        )  # fmt: skip
    else:
        r = role - BH
        _state_pass(
            r % NV, (r // NV).to(tl.int64), q_ptr, v_ptr, kh_ptr, ah_ptr, sc_ptr, o_ptr, s0_ptr,
            sT_ptr, cks_ptr, p_ptr, progress_ptr, T, H, DK, DV, CK, NC, t_begin, n_steps, BK,
            BV, HAS_INIT, SAVE_CKPT, NORM_OUT, ACC,
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
    chunk (scratch ``e`` ``[NV·B·H, CK, BV]``) and the sums that need no cotangent (``S_tᵀ dr``,
    ``doᵀ S_t q``) forward, then, per token backwards (``dS`` the gradient w.r.t. ``S_t``):
    ``dr = do/n``, ``dS += dr qᵀ``, ``de = dS α̂``, ``S_{t-1} = S_t − e α̂ᵀ``, ``dS −= de k̂ᵀ``;
    ``dv = de``.  The sums over value rows that the penalty half needs are
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
        # 1. The chunk's residuals e_t = v_t − S_{t-1} k̂_t, as the state pass made them, and
        # the sums that need S_t but no cotangent (S_tᵀdr, doᵀS_t q): from S_t as the forward
        # made it, not as the walk back reconstructs it (S_{t-1} = S_t − e α̂ᵀ carries the
        # rounding of the chunk's later, larger terms, which swamps S_t where it is small: the
        # first tokens after S_0 = 0).
        for j in range(nt):
            i = i0 + j
            t = t_begin + i
            kh = tl.load(kh_row + i * BK + ok)
            ah = tl.load(ah_row + i * BK + ok)
            v_t = tl.load(v_ptr + base_v + t * stride_v + ov, mask=mv, other=0.0).to(ACC)
            e = v_t - tl.sum(S * kh[:, None], axis=0)
            S = S + ah[:, None] * e[None, :]
            tl.store(e_row + j * BV + ob, e)
            do_t = tl.load(do_ptr + base_v + t * stride_v + ov, mask=mv, other=0.0).to(ACC)
            if NORM_OUT:
                q_t = tl.load(q_ptr + base_k + t * stride_k + ok, mask=mk, other=0.0).to(ACC)
                zq = tl.load(sc_row + 2 * i + 1)
                dr = _div(do_t, tl.maximum(zq, out_eps), ACC)
                dnp = tl.sum(do_t * tl.sum(S * q_t[:, None], axis=0), axis=0)  # this block's rows
            else:
                dr = do_t
                dnp = 0.0
            tl.store(dqp_ptr + (part + i) * BK + ok, tl.sum(S * dr[None, :], axis=1))
            tl.store(dnp_ptr + part + i, dnp)
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
            else:
                dr = do_t
            dS = dS + q_t[:, None] * dr[None, :]
            de = tl.sum(dS * ah[:, None], axis=0)
            dahp = tl.sum(dS * e[None, :], axis=1)
            S = S - ah[:, None] * e[None, :]  # S_{t-1}
            dkhp = -tl.sum(S * de[None, :], axis=1)
            dS = dS - kh[:, None] * de[None, :]
            tl.store(dv_ptr + base_v + t * stride_v + ov, de.to(dv_ptr.dtype.element_ty), mask=mv)
            tl.store(dahp_ptr + (part + i) * BK + ok, dahp)
            tl.store(dkhp_ptr + (part + i) * BK + ok, dkhp)
        # The next chunk overwrites the scratch that this one read.
        tl.debug_barrier()
    tl.store(ds0_ptr + i_bh * DV * DK + off_vk, dS, mask=m_vk)


@triton.jit(do_not_specialize=["start"])
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
    start,
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
):
    """Backward of the key and penalty halves of spec §2.3 for one (b, h) over the segment
    ``t_begin ≤ t < t_begin + n_steps``, given the value-row sums of the state backward
    (``dqs, dahs, dkhs`` ``[B·H, n_steps, BK]``, ``dns`` ``[B·H, n_steps]``: see
    :func:`vla_state_bwd_kernel`), the per-token vectors of the gate rerun (``kh, ah, sc, sv,
    cs``: :func:`vla_gate_kernel` with ``SAVE_CHAIN``) and ``dA, dz`` after the segment.

    No recomputation here: each chunk of ``CK`` tokens first writes its ``dq = Σ S_tᵀdr + dn
    z_t`` (``dn = −(Σ doᵀS_t q)/n²``), with ``z_t`` summed forward from the checkpoint at the
    chunk's start; then it starts from the state at its *end*, the next checkpoint (slot
    ``c + 1``; the last chunk's is slot ``NC``, the final state), and walks back with ``Aᵀ`` and
    ``dAᵀ`` in registers, reconstructing ``A_{t-1} = A_t + s sᵀ/δ − η_t I`` (rounding adds up
    over at most ``CK`` steps): ``dz += dn q``; ``dα`` from ``dα̂``;
    ``dk̂ = Σ(−S_{t-1}ᵀde) + A_tᵀdα``, ``dA += dα k̂ᵀ``; ``ds = −(dA + dAᵀ)s/δ``,
    ``dδ = sᵀdA s/δ²``, ``du = dδ s + A_{t-1}ᵀ ds``, ``dA += ds uᵀ`` (the adjoint equations of
    the step); ``dk = dz + ∂k̂/∂k · dk̂``.  Writes ``dA, dz`` before the segment.
    """
    i_bh = tl.program_id(0).to(tl.int64)
    i_b = i_bh // H
    i_h = i_bh % H
    ok = tl.arange(0, BK)
    mk = ok < DK
    m_kk = mk[:, None] & mk[None, :]
    eye = (ok[:, None] == ok[None, :]) & m_kk
    _lam, sm_floor, nudge_eta, out_eps, norm_eps = _load_params(p_ptr)
    if BUG == BUG_IGNORES_START:
        start = 0
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
        # dq = Σ S_tᵀdr + dn z_t needs no cotangent carried back, so the chunk's dq comes first,
        # with z_t summed forward from the checkpoint at the chunk's start: reconstructed
        # backwards (z_{t-1} = z_t − k_t) it carries the rounding of the whole chunk's sum,
        # which swamps z_t where it is small (the first tokens after z_0 = 0).
        z = tl.load(ckz_ptr + (c_end - 1) * DK + ok, mask=mk, other=0.0).to(ACC)
        for i in range(i0, i0 + nt):
            t = t_begin + i
            r = rows + i
            k_t = tl.load(k_ptr + base_k + t * stride_k + ok, mask=mk, other=0.0).to(ACC)
            z = z + k_t
            dq = tl.load(dqs_ptr + r * BK + ok)
            if NORM_OUT:
                zq = tl.load(sc_ptr + r * 2 + 1)
                n = tl.maximum(zq, out_eps)
                dn = -_div(tl.load(dns_ptr + r), n * n, ACC)
                dq = dq + tl.where(zq > out_eps, dn, 0.0) * z
            tl.store(dq_ptr + base_k + t * stride_k + ok, dq.to(dq_ptr.dtype.element_ty), mask=mk)
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
            dah = tl.load(dahs_ptr + r * BK + ok)
            if BUG == BUG_DK_SIGN:
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
            dk_t = dz
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
            eta = tl.where((start + t + 1) % nudge_period == 0, nudge_eta, 0.0)
            # A_{t-1} from A_t with the forward's downdate term: an FMA per entry (DOWNDATE_FMA);
            # a correctly rounded division per entry was half of this kernel's time at BK = 128.
            if DOWNDATE == DOWNDATE_FMA:
                A = tl.fma(s[:, None] * s[None, :], rd, A)
            else:
                A = A + _div(s[:, None] * s[None, :], delta, ACC)
            A = A - tl.where(eye, eta, 0.0)
            du = du + tl.sum(A * ds[None, :], axis=1)  # A_{t-1}ᵀ ds
            dA = dA + u_t[:, None] * ds[None, :]  # dA[i, j] += ds_i u_j
            # k̂ = k / max(||k||, norm_eps).
            rk = _div(1.0, tl.maximum(knorm, norm_eps), ACC)
            dk_t = dk_t + tl.where(knorm > norm_eps, dkh - kh * tl.sum(kh * dkh, axis=0), dkh) * rk
            tl.store(dk_ptr + base_k + t * stride_k + ok, dk_t.to(dk_ptr.dtype.element_ty), mask=mk)
            tl.store(du_ptr + base_k + t * stride_k + ok, du.to(du_ptr.dtype.element_ty), mask=mk)
    tl.store(da0_ptr + i_bh * DK * DK + off_kk, dA, mask=m_kk)
    tl.store(dz0_ptr + i_bh * DK + ok, dz, mask=mk)


# -- the state adjoint in chunks (tensor-core products) -------------------------------------------
#
# Over a chunk of C tokens from S_0 (rows t, spec §5's UT form): E = T_c (V − K̂ S_0ᵀ) with
# T_c = (I + N)^{-1}, N = stril(K̂ Âᵀ).  With X = dSᵀ [dk, dv] after the chunk (the cotangent of
# S_C) and DR = do/n [C, dv], the per-token adjoint of vla_state_bwd_kernel is, all tokens at once:
#
#   DE   = T_cᵀ (Â X + triu(Â Qᵀ) DR)                           the cotangents of e_t (= dv)
#   X_0  = X + Qᵀ DR − K̂ᵀ DE                                    dSᵀ before the chunk
#   DQP  = DR S_0 + tril(DR Eᵀ) Â                               S_tᵀ dr_t
#   DAHP = E Xᵀ + triu(E DRᵀ) Q − striu(E DEᵀ) K̂                dS_tᵀ e_t (dS_t after + dr q)
#   DKHP = −(DE S_0 + stril(DE Eᵀ) Â)                           −S_{t-1}ᵀ de_t
#   R    = Q S_0ᵀ + tril(Q Âᵀ) E, dnp = rowsum(do ∘ R)          doᵀ S_t q_t
#
# Only X_0 runs through the chunks in sequence (vla_state_bwd_scan_kernel, two products a chunk
# with W = T_cᵀ Â and U = T_cᵀ triu(Â Qᵀ) DR prepared for all chunks at once); everything else
# runs per chunk in parallel (vla_state_bwd_chunk_kernel).  Triangles: tril includes the
# diagonal, stril/striu exclude it.  The products take PREC ("ieee" for float32 inputs, "tf32"
# for 16-bit ones, as the chunked forward's state chain).


@triton.jit
def _chunk_rows(kh_ptr, ah_ptr, q_ptr, row0, t0, nt, base_k, stride_k, oc, ok, DK,
                BK: tl.constexpr, ACC: tl.constexpr):  # fmt: skip
    """``K̂, Â`` (the rerun's rows ``row0 + i``) and ``Q`` (tokens ``t0 + i``) ``[BC, BK]`` of one
    chunk of ``nt`` tokens, zero past it."""
    mc = oc < nt
    m = mc[:, None] & (ok[None, :] < DK)
    off = (row0 + oc)[:, None] * BK + ok[None, :]
    Kh = tl.load(kh_ptr + off, mask=mc[:, None], other=0.0)
    Ah = tl.load(ah_ptr + off, mask=mc[:, None], other=0.0)
    Q = tl.load(q_ptr + base_k + (t0 + oc)[:, None] * stride_k + ok[None, :], mask=m, other=0.0)
    return Kh, Ah, Q.to(ACC)


@triton.jit
def _chunk_dr(do_ptr, sc_ptr, row0, t0, nt, base_v, stride_v, oc, ov, DV, out_eps,
              NORM_OUT: tl.constexpr, ACC: tl.constexpr):  # fmt: skip
    """``do`` and ``DR = do/n`` ``[BC, BV]`` of one chunk (``n = max(z_tᵀq, out_eps)``)."""
    mc = oc < nt
    m = mc[:, None] & (ov[None, :] < DV)
    do = tl.load(do_ptr + base_v + (t0 + oc)[:, None] * stride_v + ov[None, :], mask=m, other=0.0)
    do = do.to(ACC)
    if NORM_OUT:
        zq = tl.load(sc_ptr + (row0 + oc) * 2 + 1, mask=mc, other=1.0)
        dr = do * (1.0 / tl.maximum(zq, out_eps))[:, None]
    else:
        dr = do
    return do, dr


@triton.jit
def vla_state_bwd_prep_kernel(
    q_ptr, do_ptr, kh_ptr, ah_ptr, sc_ptr, tm_ptr, w_ptr, u_ptr, p_ptr, T, H, DK, DV, CK,
    t_begin, n_steps, NV,
    BK: tl.constexpr, BV: tl.constexpr, BC: tl.constexpr, NORM_OUT: tl.constexpr,
    ACC: tl.constexpr, PREC: tl.constexpr,
):  # fmt: skip
    """Grid ``(chunks, B·H)``: per chunk of ``CK`` tokens of the span, ``T_c = (I + N)^{-1}``
    (``tm`` ``[B·H, chunks, BC, BC]``), ``W = T_cᵀ Â`` (``w`` ``[B·H, chunks·BC, BK]``) and, per
    value block, ``U = T_cᵀ triu(Â Qᵀ) DR`` (``u`` ``[B·H, chunks·BC, NV·BV]``)."""
    c = tl.program_id(0)
    i_bh = tl.program_id(1).to(tl.int64)
    i_b = i_bh // H
    i_h = i_bh % H
    n_chunks = tl.num_programs(0)
    oc = tl.arange(0, BC)
    ok = tl.arange(0, BK)
    ov = tl.arange(0, BV)
    _lam, _sm_floor, _nudge_eta, out_eps, _norm_eps = _load_params(p_ptr)
    i0 = c * CK
    nt = tl.minimum(CK, n_steps - i0)
    row0 = i_bh * n_steps + i0
    t0 = t_begin + i0
    base_k = (i_b * T * H + i_h) * DK
    Kh, Ah, Q = _chunk_rows(kh_ptr, ah_ptr, q_ptr, row0, t0, nt, base_k, H * DK, oc, ok, DK,
                            BK, ACC)  # fmt: skip
    N = tl.dot(Kh, tl.trans(Ah), input_precision=PREC)  # N[t, j] = k̂_t·α̂_j
    N = tl.where(oc[:, None] > oc[None, :], N, 0.0)
    Tm = _unit_lower_inverse(N, oc, oc, BC)
    tile = (i_bh * n_chunks + c) * BC * BC
    tl.store(tm_ptr + tile + oc[:, None] * BC + oc[None, :], Tm)
    TmT = tl.trans(Tm)
    rows = (i_bh * n_chunks + c) * BC + oc
    tl.store(w_ptr + rows[:, None] * BK + ok[None, :], tl.dot(TmT, Ah, input_precision=PREC))
    AQ = tl.dot(Ah, tl.trans(Q), input_precision=PREC)
    AQ = tl.where(oc[:, None] <= oc[None, :], AQ, 0.0)  # triu(Â Qᵀ)
    TAQ = tl.dot(TmT, AQ, input_precision=PREC)
    base_v = (i_b * T * H + i_h) * DV
    for iv in range(NV):
        _do, dr = _chunk_dr(do_ptr, sc_ptr, row0, t0, nt, base_v + iv * BV, H * DV, oc, ov,
                            DV - iv * BV, out_eps, NORM_OUT, ACC)  # fmt: skip
        U = tl.dot(TAQ, dr, input_precision=PREC)
        tl.store(u_ptr + rows[:, None] * (NV * BV) + iv * BV + ov[None, :], U)


@triton.jit
def vla_state_bwd_scan_kernel(
    q_ptr, do_ptr, kh_ptr, ah_ptr, sc_ptr, w_ptr, u_ptr, dsT_ptr, xend_ptr, ds0_ptr, p_ptr, T,
    H, DK, DV, CK, t_begin, n_steps, NV,
    BK: tl.constexpr, BV: tl.constexpr, BC: tl.constexpr, NORM_OUT: tl.constexpr,
    ACC: tl.constexpr, BUG: tl.constexpr, PREC: tl.constexpr,
):  # fmt: skip
    """Grid ``(NV, B·H)``: ``X = dSᵀ`` (one block of value columns) through the span's chunks in
    reverse, ``X ← X + Qᵀ DR − K̂ᵀ (W X + U)``, storing ``X`` after every chunk (``xend``
    ``[B·H, chunks, DK, DV]``) and before the span (``ds0``)."""
    i_v = tl.program_id(0)
    i_bh = tl.program_id(1).to(tl.int64)
    i_b = i_bh // H
    i_h = i_bh % H
    oc = tl.arange(0, BC)
    ok = tl.arange(0, BK)
    ob = tl.arange(0, BV)
    ov = i_v * BV + ob
    mk = ok < DK
    m_kv = mk[:, None] & (ov[None, :] < DV)
    off_kv = ok[:, None] * DV + ov[None, :]
    _lam, _sm_floor, _nudge_eta, out_eps, _norm_eps = _load_params(p_ptr)
    X = tl.load(dsT_ptr + i_bh * DK * DV + off_kv, mask=m_kv, other=0.0).to(ACC)
    base_k = (i_b * T * H + i_h) * DK
    base_v = (i_b * T * H + i_h) * DV
    n_chunks = tl.cdiv(n_steps, CK)
    for jc in range(n_chunks):
        c = n_chunks - 1 - jc
        i0 = c * CK
        nt = tl.minimum(CK, n_steps - i0)
        row0 = i_bh * n_steps + i0
        t0 = t_begin + i0
        if BUG != BUG_SCAN_STORES_LATE:
            tl.store(xend_ptr + (i_bh * n_chunks + c) * DK * DV + off_kv, X, mask=m_kv)
        Kh, _Ah, Q = _chunk_rows(kh_ptr, ah_ptr, q_ptr, row0, t0, nt, base_k, H * DK, oc, ok, DK,
                                 BK, ACC)  # fmt: skip
        _do, dr = _chunk_dr(do_ptr, sc_ptr, row0, t0, nt, base_v + i_v * BV, H * DV, oc, ob,
                            DV - i_v * BV, out_eps, NORM_OUT, ACC)  # fmt: skip
        rows = (i_bh * n_chunks + c) * BC + oc
        W = tl.load(w_ptr + rows[:, None] * BK + ok[None, :])
        U = tl.load(u_ptr + rows[:, None] * (NV * BV) + i_v * BV + ob[None, :])
        DE = tl.dot(W, X, input_precision=PREC) + U
        X = X + tl.dot(tl.trans(Q), dr, input_precision=PREC)
        X = X - tl.dot(tl.trans(Kh), DE, input_precision=PREC)
        if BUG == BUG_SCAN_STORES_LATE:
            tl.store(xend_ptr + (i_bh * n_chunks + c) * DK * DV + off_kv, X, mask=m_kv)
    tl.store(ds0_ptr + i_bh * DK * DV + off_kv, X, mask=m_kv)


@triton.jit
def vla_state_bwd_chunk_kernel(
    q_ptr, v_ptr, do_ptr, kh_ptr, ah_ptr, sc_ptr, tm_ptr, w_ptr, u_ptr, cks_ptr, xend_ptr,
    dv_ptr, dqp_ptr, dahp_ptr, dkhp_ptr, dnp_ptr, p_ptr, T, H, DK, DV, CK, NC, t_begin,
    n_steps, NV,
    BK: tl.constexpr, BV: tl.constexpr, BC: tl.constexpr, NORM_OUT: tl.constexpr,
    ACC: tl.constexpr, BUG: tl.constexpr, PREC: tl.constexpr, PARTS: tl.constexpr = 7,
):  # fmt: skip
    """Grid ``(chunks, B·H)``: every chunk's per-token adjoint from its ``S_0`` (checkpoint
    ``cks``, ``Sᵀ`` ``[B·H·NC, DK, DV]``), its ``dSᵀ`` after it (``xend``) and the prep
    kernel's ``T_c, W, U``: ``dv``, and the sums over the value rows ``DQP, DAHP, DKHP``
    ``[B·H, n_steps, BK]`` and ``dnp`` ``[B·H, n_steps]`` that :func:`vla_gate_bwd_kernel`
    reads.

    The program walks the ``NV`` value blocks of ``BV`` columns, each block's ``E`` and ``DE =
    W X + U`` formed and consumed there; what the outputs need of them is summed over the
    blocks as it forms (the ``[BC, BK]`` products with ``S_0`` and ``X``, and the ``[BC, BC]``
    products ``DR Eᵀ`` and ``E DEᵀ``), and the triangles of the two ``[BC, BC]`` sums meet
    ``Â``, ``Q`` and ``K̂`` once, after the walk.  With ``do = n ∘ DR`` the read-out's
    ``doᵀ S_t q_t`` needs no sum of its own: ``n ∘ rowsum(Q ∘ Σ DR S_0 + tril(Q Âᵀ) ∘ Σ DR
    Eᵀ)``.  ``PARTS`` picks the outputs (1: ``dv, dq, dn``; 2: ``dα̂``; 4: ``dk̂``), so that a
    wide key tile may take them in separate launches."""
    c = tl.program_id(0)
    i_bh = tl.program_id(1).to(tl.int64)
    n_chunks = tl.num_programs(0)
    i_b = i_bh // H
    i_h = i_bh % H
    oc = tl.arange(0, BC)
    ok = tl.arange(0, BK)
    ob = tl.arange(0, BV)
    mk = ok < DK
    _lam, _sm_floor, _nudge_eta, out_eps, _norm_eps = _load_params(p_ptr)
    i0 = c * CK
    nt = tl.minimum(CK, n_steps - i0)
    mc = oc < nt
    row0 = i_bh * n_steps + i0
    t0 = t_begin + i0
    base_k = (i_b * T * H + i_h) * DK
    base_v = (i_b * T * H + i_h) * DV
    base_s = (i_bh * NC + (t_begin + i0) // CK) * DK * DV
    base_x = (i_bh * n_chunks + c) * DK * DV
    rows = (i_bh * n_chunks + c) * BC + oc  # the prep kernel's rows of W and U
    off_ck = rows[:, None] * BK + ok[None, :]
    off_kh = (row0 + oc)[:, None] * BK + ok[None, :]
    off_tm = (i_bh * n_chunks + c) * BC * BC + oc[:, None] * BC + oc[None, :]
    lower = oc[:, None] >= oc[None, :]  # tril, the diagonal included
    upper = oc[:, None] <= oc[None, :]  # triu, the diagonal included
    DRE = tl.zeros([BC, BC], dtype=ACC)  # Σ_v DR_v E_vᵀ
    EDE = tl.zeros([BC, BC], dtype=ACC)  # Σ_v E_v DE_vᵀ
    # Σ_v DR_v S_0,v, Σ_v E_v X_vᵀ, Σ_v DE_v S_0,v (a launch forms those of its parts alone).
    acc_q = tl.zeros([BC, BK], dtype=ACC)
    acc_a = tl.zeros([BC, BK], dtype=ACC)
    acc_k = tl.zeros([BC, BK], dtype=ACC)
    for iv in range(NV):
        ov = iv * BV + ob
        mv = ov < DV
        m_kv = mk[:, None] & mv[None, :]
        off_kv = ok[:, None] * DV + ov[None, :]
        m_cv = mc[:, None] & mv[None, :]
        # The chunk's own rows are read in every block (from the cache), not held across it.
        Kh = tl.load(kh_ptr + off_kh, mask=mc[:, None], other=0.0)
        Tm = tl.load(tm_ptr + off_tm)
        W = tl.load(w_ptr + off_ck)
        U = tl.load(u_ptr + rows[:, None] * (NV * BV) + ov[None, :])
        _do, dr = _chunk_dr(do_ptr, sc_ptr, row0, t0, nt, base_v + iv * BV, H * DV, oc, ob,
                            DV - iv * BV, out_eps, NORM_OUT, ACC)  # fmt: skip
        V = tl.load(v_ptr + base_v + (t0 + oc)[:, None] * (H * DV) + ov[None, :], mask=m_cv,
                    other=0.0).to(ACC)  # fmt: skip
        S0T = tl.load(cks_ptr + base_s + off_kv, mask=m_kv, other=0.0).to(ACC)
        X = tl.load(xend_ptr + base_x + off_kv, mask=m_kv, other=0.0)
        E = tl.dot(Tm, V - tl.dot(Kh, S0T, input_precision=PREC), input_precision=PREC)
        DE = tl.dot(W, X, input_precision=PREC) + U
        if PARTS & 1:
            tl.store(dv_ptr + base_v + (t0 + oc)[:, None] * (H * DV) + ov[None, :],
                     DE.to(dv_ptr.dtype.element_ty), mask=m_cv)  # fmt: skip
            acc_q = tl.dot(dr, tl.trans(S0T), acc=acc_q, input_precision=PREC)
        if PARTS & 3:
            DRE = tl.dot(dr, tl.trans(E), acc=DRE, input_precision=PREC)
        if PARTS & 6:
            EDE = tl.dot(E, tl.trans(DE), acc=EDE, input_precision=PREC)
        if PARTS & 2:
            acc_a = tl.dot(E, tl.trans(X), acc=acc_a, input_precision=PREC)
        if PARTS & 4:
            acc_k = tl.dot(DE, tl.trans(S0T), acc=acc_k, input_precision=PREC)
    Kh, Ah, Q = _chunk_rows(kh_ptr, ah_ptr, q_ptr, row0, t0, nt, base_k, H * DK, oc, ok, DK,
                            BK, ACC)  # fmt: skip
    off = off_kh  # the rows of the value-row sums are the chain values' rows
    if PARTS & 1:
        dqp = acc_q + tl.dot(tl.where(lower, DRE, 0.0), Ah, input_precision=PREC)
        tl.store(dqp_ptr + off, dqp, mask=mc[:, None])
        if NORM_OUT:
            QA = tl.where(lower, tl.dot(Q, tl.trans(Ah), input_precision=PREC), 0.0)
            zq = tl.load(sc_ptr + (row0 + oc) * 2 + 1, mask=mc, other=1.0)
            dnp = tl.maximum(zq, out_eps) * (tl.sum(Q * acc_q, axis=1) + tl.sum(QA * DRE, axis=1))
        else:
            dnp = tl.zeros([BC], dtype=ACC)
        tl.store(dnp_ptr + row0 + oc, dnp, mask=mc)
    if PARTS & 2:
        dahp = (acc_a + tl.dot(tl.where(upper, tl.trans(DRE), 0.0), Q, input_precision=PREC)
                - tl.dot(tl.where(oc[:, None] < oc[None, :], EDE, 0.0), Kh,
                         input_precision=PREC))  # fmt: skip
        tl.store(dahp_ptr + off, dahp, mask=mc[:, None])
    if PARTS & 4:
        if BUG == BUG_CHUNK_TRIANGLE:
            strict = lower
        else:
            strict = oc[:, None] > oc[None, :]
        dkhp = acc_k + tl.dot(tl.where(strict, tl.trans(EDE), 0.0), Ah, input_precision=PREC)
        tl.store(dkhp_ptr + off, -dkhp, mask=mc[:, None])


# -- the penalty adjoint in pieces (products over nudge-free pieces) -----------------------------
#
# The nudges and the checkpoints cut a span into pieces of at most min(period, CK) tokens with no
# nudge inside (a nudge may follow a piece's last token).  Over a piece a..e, with the rerun's
# s_t, δ_t (rows S, δ), the keys k̂ (K̂), u (U) and the gates' cotangents dα (DA), no floored
# denominator and none above PIECES_MAX_DENOMINATOR (the caller falls back to
# vla_gate_bwd_kernel otherwise):
#
#   A_e      = A_ck' + S_>ᵀ D_>^{-1} S_> − ω η I   A after e, before its nudge: from the checkpoint
#                                                  at the interval's end and the interval's later
#                                                  rows (ω nudges from e on); every term added is
#                                                  positive, so nothing cancels where A contracts
#   α⁻, β    = K̂ A_e + (striu(K̂ Sᵀ) D^{-1}) S, the same with DA
#                                             (A_t before any nudge, times k̂, dα)
#   Tᵀ       = D^{-1} (I + L)^{-1}, L = stril(U Sᵀ) D^{-1}       (the compact WY factor of
#                                                              Q = N_aᵀ⋯N_eᵀ = I − Uᵀ T S)
#   Ã, K̃     = DA − (tril(DA Sᵀ) Tᵀ) U, the same with K̂
#   Σ_a      = Q Σ_e Qᵀ + sym(Ãᵀ K̃)                   the symmetric cotangent before the piece
#
# and, once Σ_e (after the piece's nudge) is known, every step's cotangents at once:
#
#   C, B     = triu(U α⁻ᵀ), triu(U βᵀ)                              (j ≥ t)
#   H        = ½ D (C triu(S DAᵀ)ᵀ + B triu(S K̂ᵀ)ᵀ)
#   W        = D U A_e Σ_e
#   Y        = ½ D (C DA + B K̂) + W − (striu((H + W Sᵀ) Tᵀ)) U        (y_t = Σ^{(t)} s_t)
#   dδ       = rowsum(S ∘ Y) / δ²,  DS = −2 D^{-1} Y + dδ U
#   du       = −(C β + B α⁻) − 2 U A_e Σ_e A_e                         (−2 Ω_t u_t)
#   dk̂       = (the state adjoint's part) + β + [e nudged] η dα_e       (A_tᵀ dα_t)
#   dAᵀ part = K̂ᵀ DA + Uᵀ DS                                          (Σ_t dα k̂ᵀ + ds uᵀ, as Aᵀ)
#
# dAᵀ before the span is the scan's Σ plus the antisymmetric part of dAᵀ after it and of the
# pieces' parts: the symmetric part of that sum cancels where the congruences contract, so it is
# taken from the scan.
#
# Derivations: benchmarks/prototypes/penalty_adjoint_pieces.py (float64, checked against
# autograd).  Only Σ runs through the pieces in sequence (vla_penalty_bwd_scan_kernel, with dz);
# the rest runs per piece in parallel (vla_penalty_bwd_prep_kernel before the scan,
# vla_penalty_bwd_piece_kernel after it).  Triangles: tril/triu include the diagonal,
# stril/striu exclude it.


@triton.jit
def _piece_rows(pc_ptr, kh_ptr, ah_ptr, sv_ptr, cs_ptr, dahs_ptr, u_ptr, p_ptr, T, H, DK,
                nudge_period, start, t_begin, n_steps, op, ok,
                BK: tl.constexpr, NORM_GATE: tl.constexpr, ACC: tl.constexpr):  # fmt: skip
    """One piece's rows ``[BP, BK]`` (zero past it; ``δ = 1`` there): ``(a, npc, U, S, K̂, DA,
    δ, η_e)``, ``η_e`` the nudge after the piece's last token (0 if none)."""
    i_p = tl.program_id(0)
    i_bh = tl.program_id(1).to(tl.int64)
    i_b = i_bh // H
    i_h = i_bh % H
    _lam, _sm_floor, nudge_eta, _out_eps, norm_eps = _load_params(p_ptr)
    a = tl.load(pc_ptr + i_p)
    npc = tl.load(pc_ptr + i_p + 1) - a
    mp = op < npc
    mk = ok < DK
    rows = i_bh * n_steps + a + op
    off = rows[:, None] * BK + ok[None, :]
    S = tl.load(sv_ptr + off, mask=mp[:, None], other=0.0)
    Kh = tl.load(kh_ptr + off, mask=mp[:, None], other=0.0)
    Ah = tl.load(ah_ptr + off, mask=mp[:, None], other=0.0)
    dah = tl.load(dahs_ptr + off, mask=mp[:, None], other=0.0)
    delta = tl.load(cs_ptr + rows * 4 + 1, mask=mp, other=1.0)
    base_k = (i_b * T * H + i_h) * DK
    U = tl.load(u_ptr + base_k + (t_begin + a + op)[:, None] * (H * DK) + ok[None, :],
                mask=mp[:, None] & mk[None, :], other=0.0).to(ACC)  # fmt: skip
    # dα from dα̂ (α̂ = α / max(‖α‖, norm_eps)), as vla_gate_bwd_kernel.
    if NORM_GATE:
        anorm = tl.load(cs_ptr + rows * 4 + 2, mask=mp, other=1.0)
        proj = tl.sum(Ah * dah, axis=1)
        DA = tl.where((anorm > norm_eps)[:, None], dah - Ah * proj[:, None], dah)
        DA = DA * (1.0 / tl.maximum(anorm, norm_eps))[:, None]
    else:
        DA = dah
    e_nudged = (start + t_begin + a + npc) % nudge_period == 0
    eta_e = tl.where(e_nudged, nudge_eta, 0.0)
    return a, npc, U, S, Kh, DA, delta, eta_e


@triton.jit
def _piece_end_a(a, npc, sv_ptr, cs_ptr, cka_ptr, p_ptr, DK, CK, NC, nudge_period, start,
                 t_begin, n_steps, ob, ok, BK: tl.constexpr, ACC: tl.constexpr,
                 PREC: tl.constexpr, BUG: tl.constexpr):  # fmt: skip
    """``A`` after the piece's last step ``e``, before the nudge that may follow it (``A_e``,
    tile ``Aᵀ``)."""
    i_bh = tl.program_id(1).to(tl.int64)
    _lam, _sm_floor, nudge_eta, _out_eps, _norm_eps = _load_params(p_ptr)
    mk = ok < DK
    # A_e (before the piece's closing nudge) from the checkpoint at the interval's end, adding
    # back the interval's later rows' downdates and taking off the nudges from e on: each term
    # is positive, so no digit cancels where the steps contract A (from the interval's start,
    # A_ck − Σ s sᵀ/δ, the rounding of A_ck swamps a strongly contracted A_e).
    c = (t_begin + a) // CK
    i_end = tl.minimum((c + 1) * CK - t_begin, n_steps)
    e = a + npc - 1
    ob_m = ob < i_end - 1 - e
    nxt = i_bh * n_steps + e + 1 + ob
    Sb = tl.load(sv_ptr + nxt[:, None] * BK + ok[None, :], mask=ob_m[:, None], other=0.0)
    db = tl.load(cs_ptr + nxt * 4 + 1, mask=ob_m, other=1.0)
    nudges = (ob < i_end - e) & ((start + t_begin + e + ob + 1) % nudge_period == 0)
    omega = tl.sum(nudges.to(ACC), axis=0)
    if BUG == BUG_PIECE_END_DROPS_NUDGES:
        omega = omega * 0.0
    eye = (ok[:, None] == ok[None, :]) & mk[:, None] & mk[None, :]
    off_kk = ok[:, None] * DK + ok[None, :]
    A_e = tl.load(cka_ptr + (i_bh * (NC + 1) + c + 1) * DK * DK + off_kk,
                  mask=mk[:, None] & mk[None, :], other=0.0).to(ACC)  # fmt: skip
    A_e = A_e + tl.dot(tl.trans(Sb * (1.0 / db)[:, None]), Sb, input_precision=PREC)
    A_e = A_e - tl.where(eye, omega * nudge_eta, 0.0)
    return A_e


@triton.jit
def _piece_gates(Kh, S, DA, delta, A_e, op, PREC: tl.constexpr):
    """``α⁻, β`` ``[BP, BK]`` of one piece (the comment above)."""
    rd = 1.0 / delta
    after = op[:, None] < op[None, :]  # striu: j > t for rows t, columns j
    KS = tl.where(after, tl.dot(Kh, tl.trans(S), input_precision=PREC) * rd[None, :], 0.0)
    alpha = tl.dot(Kh, A_e, input_precision=PREC) + tl.dot(KS, S, input_precision=PREC)
    DS_ = tl.where(after, tl.dot(DA, tl.trans(S), input_precision=PREC) * rd[None, :], 0.0)
    beta = tl.dot(DA, A_e, input_precision=PREC) + tl.dot(DS_, S, input_precision=PREC)
    return alpha, beta


@triton.jit
def _piece_wy(U, S, delta, op, BP: tl.constexpr, PREC: tl.constexpr):
    """``Tᵀ`` ``[BP, BP]``, the compact WY factor of one piece (the comment above)."""
    rd = 1.0 / delta
    L = tl.where(op[:, None] > op[None, :],
                 tl.dot(U, tl.trans(S), input_precision=PREC) * rd[None, :], 0.0)  # fmt: skip
    return _unit_lower_inverse(L, op, op, BP) * rd[:, None]


@triton.jit
def vla_penalty_bwd_prep_kernel(
    pc_ptr, q_ptr, kh_ptr, ah_ptr, sc_ptr, sv_ptr, cs_ptr, dahs_ptr, dns_ptr, u_ptr, qm_ptr,
    lm_ptr, dzp_ptr, p_ptr, T, H, DK, CK, NC, nudge_period, start, t_begin, n_steps,
    BK: tl.constexpr, BP: tl.constexpr, BC: tl.constexpr, NORM_GATE: tl.constexpr,
    NORM_OUT: tl.constexpr, ACC: tl.constexpr, PREC: tl.constexpr, BUG: tl.constexpr,
):  # fmt: skip
    """Grid ``(pieces, B·H)``: each piece's ``Q`` and ``sym(Ãᵀ K̃)`` (``qm, lm`` ``[B·H, pieces,
    BK, BK]``) and its ``Σ_t dn_t q_t`` (``dzp`` ``[B·H, pieces, BK]``), for the scan."""
    i_p = tl.program_id(0)
    i_bh = tl.program_id(1).to(tl.int64)
    n_p = tl.num_programs(0)
    op = tl.arange(0, BP)
    ok = tl.arange(0, BK)
    a, npc, U, S, Kh, DA, delta, _eta = _piece_rows(
        pc_ptr, kh_ptr, ah_ptr, sv_ptr, cs_ptr, dahs_ptr, u_ptr, p_ptr, T, H, DK,
        nudge_period, start, t_begin, n_steps, op, ok, BK, NORM_GATE, ACC,
    )  # fmt: skip
    Tt = _piece_wy(U, S, delta, op, BP, PREC)
    incl = op[:, None] >= op[None, :]
    TS = tl.dot(tl.trans(Tt), S, input_precision=PREC)
    eye = ok[:, None] == ok[None, :]
    Qm = tl.where(eye, 1.0, 0.0) - tl.dot(tl.trans(U), TS, input_precision=PREC)
    DSt = tl.where(incl, tl.dot(DA, tl.trans(S), input_precision=PREC), 0.0)
    At = DA - tl.dot(tl.dot(DSt, Tt, input_precision=PREC), U, input_precision=PREC)
    KSt = tl.where(incl, tl.dot(Kh, tl.trans(S), input_precision=PREC), 0.0)
    Kt = Kh - tl.dot(tl.dot(KSt, Tt, input_precision=PREC), U, input_precision=PREC)
    AK = tl.dot(tl.trans(At), Kt, input_precision=PREC)
    Lm = 0.5 * (AK + tl.trans(AK))
    tile = (i_bh * n_p + i_p) * BK * BK + ok[:, None] * BK + ok[None, :]
    tl.store(qm_ptr + tile, Qm)
    tl.store(lm_ptr + tile, Lm)
    # Σ_t dn_t q_t over the piece (the read-out denominator's part of dz).
    i_b = i_bh // H
    i_h = i_bh % H
    _lam, _sm_floor, _eta_n, out_eps, _norm_eps = _load_params(p_ptr)
    mp = op < npc
    rows = i_bh * n_steps + a + op
    if NORM_OUT:
        zq = tl.load(sc_ptr + rows * 2 + 1, mask=mp, other=1.0)
        n = tl.maximum(zq, out_eps)
        dn = -tl.load(dns_ptr + rows, mask=mp, other=0.0) / (n * n)
        dn = tl.where(mp & (zq > out_eps), dn, 0.0)
        base_k = (i_b * T * H + i_h) * DK
        Q = tl.load(q_ptr + base_k + (t_begin + a + op)[:, None] * (H * DK) + ok[None, :],
                    mask=mp[:, None] & (ok[None, :] < DK), other=0.0).to(ACC)  # fmt: skip
        dzp = tl.sum(dn[:, None] * Q, axis=0)
    else:
        dzp = tl.zeros([BK], dtype=ACC)
    tl.store(dzp_ptr + (i_bh * n_p + i_p) * BK + ok, dzp)


@triton.jit
def vla_penalty_bwd_scan_kernel(
    qm_ptr, lm_ptr, dzp_ptr, daT_ptr, dzT_ptr, sig_ptr, dze_ptr, sig0_ptr, dz0_ptr, DK, n_p,
    per_group, BK: tl.constexpr, ACC: tl.constexpr, FROM_TILES: tl.constexpr,
):  # fmt: skip
    """Grid ``(groups, B·H)``: ``Σ`` (the symmetric part of ``dAᵀ``) and ``dz`` through the
    pieces ``g·m ≤ i < min((g + 1)·m, n_p)`` of group ``g`` (``m = per_group``) in reverse,
    ``Σ ← Q Σ Qᵀ + sym(Ãᵀ K̃)``, ``dz ← dz + Σ dn q``, storing both after every piece (``sig``
    ``[B·H, n_p, BK, BK]``, ``dze`` ``[B·H, n_p, BK]``) and before the group (``sig0``
    ``[B·H, groups, BK, BK]``, ``dz0`` ``[B·H, groups, BK]``).  Each group starts from
    ``dAᵀ`` ``[B·H, DK, DK]`` and ``dz`` ``[B·H, DK]`` after the span (one group), or, with
    ``FROM_TILES``, from its own ``Σ`` and ``dz`` (``[B·H, groups, BK, BK]`` and ``[B·H,
    groups, BK]``: a scan of the groups' composed pieces, :func:`vla_penalty_bwd_group_kernel`,
    gave them).  Products in ``tf32x3`` (three tf32 products, about float32's accuracy, on
    tensor cores) whatever the inputs: the scan's rounding adds up over the pieces, and
    ``ieee`` float32 products of ``[64, 64]`` tiles, beside the loaded local term, compile for
    sm_90 to a kernel that keeps most of its state on the stack (Triton 3.6)."""
    i_g = tl.program_id(0)
    i_bh = tl.program_id(1).to(tl.int64)
    at = i_bh * tl.num_programs(0) + i_g
    ok = tl.arange(0, BK)
    mk = ok < DK
    m_kk = mk[:, None] & mk[None, :]
    tile0 = ok[:, None] * BK + ok[None, :]
    if FROM_TILES:
        sig = tl.load(daT_ptr + at * BK * BK + tile0)
        dz = tl.load(dzT_ptr + at * BK + ok)
    else:
        dA = tl.load(daT_ptr + i_bh * DK * DK + ok[:, None] * DK + ok[None, :], mask=m_kk,
                     other=0.0).to(ACC)  # fmt: skip
        sig = 0.5 * (dA + tl.trans(dA))
        dz = tl.load(dzT_ptr + i_bh * DK + ok, mask=mk, other=0.0).to(ACC)
    first = i_g * per_group
    count = tl.minimum(per_group, n_p - first)
    for jp in range(count):
        ip = first + count - 1 - jp
        tile = (i_bh * n_p + ip) * BK * BK + tile0
        tl.store(sig_ptr + tile, sig)
        tl.store(dze_ptr + (i_bh * n_p + ip) * BK + ok, dz)
        Qm = tl.load(qm_ptr + tile)
        sig = tl.dot(tl.dot(Qm, sig, input_precision="tf32x3"), tl.trans(Qm),
                     input_precision="tf32x3") + tl.load(lm_ptr + tile)  # fmt: skip
        dz = dz + tl.load(dzp_ptr + (i_bh * n_p + ip) * BK + ok)
    tl.store(sig0_ptr + at * BK * BK + tile0, sig)
    tl.store(dz0_ptr + at * BK + ok, dz)


@triton.jit
def vla_penalty_bwd_group_kernel(
    qm_ptr, lm_ptr, dzp_ptr, qg_ptr, lg_ptr, dzg_ptr, n_p, per_group,
    BK: tl.constexpr, BUG: tl.constexpr,
):  # fmt: skip
    """Grid ``(groups, B·H)``: the pieces ``f ≤ i ≤ l`` of group ``g`` (``f = g·m``, ``l =
    min(f + m, n_p) − 1``, ``m = per_group``) as one piece of the scan: ``Q_g = Q_f ⋯ Q_l``,
    ``L_g = Σ_i (Q_f ⋯ Q_{i−1}) L_i (Q_f ⋯ Q_{i−1})ᵀ``, ``dz_g = Σ_i dz_i`` (``qg, lg``
    ``[B·H, groups, BK, BK]``, ``dzg`` ``[B·H, groups, BK]``; the pieces' as the scan's), from
    the last piece to the first: ``(Q, L) ← (Q_i Q, Q_i L Q_iᵀ + L_i)``.  The scan then takes
    one step per group, and the same scan kernel from each group's ``Σ`` after it gives the
    group's inner ``Σ`` (``FROM_TILES``), every group side by side.  Products in ``tf32x3``,
    as the scan's."""
    i_g = tl.program_id(0)
    i_bh = tl.program_id(1).to(tl.int64)
    at = i_bh * tl.num_programs(0) + i_g
    ok = tl.arange(0, BK)
    tile0 = ok[:, None] * BK + ok[None, :]
    first = i_g * per_group
    last = tl.minimum(first + per_group, n_p) - 1
    Qg = tl.load(qm_ptr + (i_bh * n_p + last) * BK * BK + tile0)
    Lg = tl.load(lm_ptr + (i_bh * n_p + last) * BK * BK + tile0)
    dz = tl.load(dzp_ptr + (i_bh * n_p + last) * BK + ok)
    for jp in range(last - first):
        ip = last - 1 - jp
        tile = (i_bh * n_p + ip) * BK * BK + tile0
        Qi = tl.load(qm_ptr + tile)
        Lg = tl.dot(tl.dot(Qi, Lg, input_precision="tf32x3"), tl.trans(Qi),
                    input_precision="tf32x3") + tl.load(lm_ptr + tile)  # fmt: skip
        if BUG == BUG_GROUP_ORDER:
            Qg = tl.dot(Qg, Qi, input_precision="tf32x3")
        else:
            Qg = tl.dot(Qi, Qg, input_precision="tf32x3")
        dz = dz + tl.load(dzp_ptr + (i_bh * n_p + ip) * BK + ok)
    tl.store(qg_ptr + at * BK * BK + tile0, Qg)
    tl.store(lg_ptr + at * BK * BK + tile0, Lg)
    tl.store(dzg_ptr + at * BK + ok, dz)


@triton.jit
def vla_penalty_bwd_da_part_kernel(
    kh_ptr, da_ptr, u_ptr, dsm_ptr, part_ptr, T, H, DK, t_begin, n_steps, rows,
    BK: tl.constexpr, BR: tl.constexpr,
):  # fmt: skip
    """Grid ``(segments, B·H)``: the pieces' part of ``dAᵀ`` over segment ``s`` of ``rows``
    tokens of the span, ``Σ_t k̂_t dα_tᵀ + u_t ds_tᵀ`` (``K̂``, ``DA``, ``DS`` rows
    ``[B·H, n_steps, BK]``, float32, as :func:`vla_penalty_bwd_piece_kernel` stores them; ``u``
    ``[B, T, H, DK]``), ``BR`` rows a product, float32 accumulation of ``tf32x3`` products
    (about float32's accuracy; the per-token adjoint sums the same terms in float32 one token
    after another); ``part`` ``[B·H, segments, BK, BK]``, the caller sums the segments."""
    i_s = tl.program_id(0)
    i_bh = tl.program_id(1).to(tl.int64)
    i_b = i_bh // H
    i_h = i_bh % H
    orr = tl.arange(0, BR)
    ok = tl.arange(0, BK)
    mk = ok < DK
    acc = tl.zeros([BK, BK], dtype=tl.float32)
    first = i_s * rows
    last = tl.minimum(first + rows, n_steps)
    base_u = (i_b * T * H + i_h) * DK
    for r0 in range(first, last, BR):
        r = r0 + orr
        mr = r < last
        off = (i_bh * n_steps + r)[:, None] * BK + ok[None, :]
        Kh = tl.load(kh_ptr + off, mask=mr[:, None], other=0.0)
        DA = tl.load(da_ptr + off, mask=mr[:, None], other=0.0)
        DS = tl.load(dsm_ptr + off, mask=mr[:, None], other=0.0)
        U = tl.load(u_ptr + base_u + (t_begin + r)[:, None] * (H * DK) + ok[None, :],
                    mask=mr[:, None] & mk[None, :], other=0.0).to(tl.float32)  # fmt: skip
        acc = tl.dot(tl.trans(Kh), DA, acc=acc, input_precision="tf32x3")
        acc = tl.dot(tl.trans(U), DS, acc=acc, input_precision="tf32x3")
    seg = i_bh * tl.num_programs(0) + i_s
    tl.store(part_ptr + seg * BK * BK + ok[:, None] * BK + ok[None, :], acc)


@triton.jit
def vla_penalty_bwd_piece_kernel(
    pc_ptr, q_ptr, k_ptr, kh_ptr, ah_ptr, sc_ptr, sv_ptr, cs_ptr, dqs_ptr, dahs_ptr, dkhs_ptr,
    dns_ptr, u_ptr, cka_ptr, ckz_ptr, sig_ptr, dze_ptr, da_ptr, dsm_ptr, dq_ptr, dk_ptr, du_ptr,
    p_ptr,
    T, H, DK, CK, NC, nudge_period, start, t_begin, n_steps,
    BK: tl.constexpr, BP: tl.constexpr, BC: tl.constexpr, NORM_GATE: tl.constexpr,
    NORM_OUT: tl.constexpr, ACC: tl.constexpr, PREC: tl.constexpr, BUG: tl.constexpr,
):  # fmt: skip
    """Grid ``(pieces, B·H)``: from ``Σ, dz`` after the piece (the scan's), every token's
    ``dq, dk, du``, and its rows of ``DA`` and ``DS`` (``da``, ``dsm`` ``[B·H, n_steps, BK]``),
    from which the caller forms the pieces' part of ``dAᵀ``, ``Σ K̂ᵀ DA + Uᵀ DS``, as one
    product over the span."""
    i_p = tl.program_id(0)
    i_bh = tl.program_id(1).to(tl.int64)
    i_b = i_bh // H
    i_h = i_bh % H
    n_p = tl.num_programs(0)
    op = tl.arange(0, BP)
    ob = tl.arange(0, BC)
    ok = tl.arange(0, BK)
    mk = ok < DK
    a, npc, U, S, Kh, DA, delta, eta_e = _piece_rows(
        pc_ptr, kh_ptr, ah_ptr, sv_ptr, cs_ptr, dahs_ptr, u_ptr, p_ptr, T, H, DK,
        nudge_period, start, t_begin, n_steps, op, ok, BK, NORM_GATE, ACC,
    )  # fmt: skip
    A_e = _piece_end_a(a, npc, sv_ptr, cs_ptr, cka_ptr, p_ptr, DK, CK, NC, nudge_period, start,
                       t_begin, n_steps, ob, ok, BK, ACC, PREC, BUG)  # fmt: skip
    alpha, beta = _piece_gates(Kh, S, DA, delta, A_e, op, PREC)
    Tt = _piece_wy(U, S, delta, op, BP, PREC)
    _lam, _sm_floor, _eta_n, out_eps, norm_eps = _load_params(p_ptr)
    mp = op < npc
    rows = i_bh * n_steps + a + op
    off = rows[:, None] * BK + ok[None, :]
    base_k = (i_b * T * H + i_h) * DK
    off_in = base_k + (t_begin + a + op)[:, None] * (H * DK) + ok[None, :]
    m_in = mp[:, None] & mk[None, :]
    rd = 1.0 / delta
    upper = op[:, None] <= op[None, :]  # j ≥ t for rows t, columns j
    later = op[:, None] < op[None, :]  # i > t
    if BUG == BUG_PIECE_Y_WHOLE_T:
        later = op[:, None] >= 0
    # The read-out denominator: dz after each token (the suffix within the piece), z_t, dq.
    dz_e = tl.load(dze_ptr + (i_bh * n_p + i_p) * BK + ok)
    Q = tl.load(q_ptr + off_in, mask=m_in, other=0.0).to(ACC)
    K = tl.load(k_ptr + off_in, mask=m_in, other=0.0).to(ACC)
    dq = tl.load(dqs_ptr + off, mask=mp[:, None], other=0.0)
    if NORM_OUT:
        zq = tl.load(sc_ptr + rows * 2 + 1, mask=mp, other=1.0)
        n = tl.maximum(zq, out_eps)
        dn = -tl.load(dns_ptr + rows, mask=mp, other=0.0) / (n * n)
        dn = tl.where(mp & (zq > out_eps), dn, 0.0)
        # Suffix and prefix sums over the piece's rows as scans: as float32 products with a
        # triangle of ones they ran off the tensor cores and spilled the kernel's tiles.
        dz_t = dz_e[None, :] + tl.cumsum(dn[:, None] * Q, axis=0, reverse=True)
        # z_t = z at the interval's start + the interval's keys to t.
        c = (t_begin + a) // CK
        i0 = c * CK - t_begin
        z0 = tl.load(ckz_ptr + (i_bh * (NC + 1) + c) * DK + ok, mask=mk, other=0.0).to(ACC)
        ob_m = ob < a - i0
        Kb = tl.load(k_ptr + base_k + (t_begin + i0 + ob)[:, None] * (H * DK) + ok[None, :],
                     mask=ob_m[:, None] & mk[None, :], other=0.0).to(ACC)  # fmt: skip
        z = z0[None, :] + tl.sum(Kb, axis=0)[None, :]
        z = z + tl.cumsum(K, axis=0)
        dq = dq + dn[:, None] * z
    else:
        dz_t = dz_e[None, :] + tl.zeros([BP, BK], dtype=ACC)
    # dk̂ = the state adjoint's part + A_tᵀ dα_t (A_t after the closing nudge on the last token).
    last = (op == npc - 1)[:, None]
    dkh = tl.load(dkhs_ptr + off, mask=mp[:, None], other=0.0) + beta
    dkh = dkh + tl.where(last, eta_e * DA, 0.0)
    knorm = tl.load(cs_ptr + rows * 4 + 3, mask=mp, other=1.0)
    proj = tl.sum(Kh * dkh, axis=1)
    dkn = tl.where((knorm > norm_eps)[:, None], dkh - Kh * proj[:, None], dkh)
    dk = dz_t + dkn * (1.0 / tl.maximum(knorm, norm_eps))[:, None]
    tl.store(dq_ptr + off_in, dq.to(dq_ptr.dtype.element_ty), mask=m_in)
    tl.store(dk_ptr + off_in, dk.to(dk_ptr.dtype.element_ty), mask=m_in)
    tl.store(da_ptr + off, DA, mask=mp[:, None])
    sig = tl.load(sig_ptr + (i_bh * n_p + i_p) * BK * BK + ok[:, None] * BK + ok[None, :])
    UAe = tl.dot(U, A_e, input_precision=PREC)
    # y_t = Σ^{(t)} s_t, then the steps' cotangents.
    C = tl.where(upper, tl.dot(U, tl.trans(alpha), input_precision=PREC), 0.0)
    B = tl.where(upper, tl.dot(U, tl.trans(beta), input_precision=PREC), 0.0)
    SD = tl.where(upper, tl.dot(S, tl.trans(DA), input_precision=PREC), 0.0)
    SK = tl.where(upper, tl.dot(S, tl.trans(Kh), input_precision=PREC), 0.0)
    Hm = 0.5 * delta[:, None] * (tl.dot(C, tl.trans(SD), input_precision=PREC)
                                 + tl.dot(B, tl.trans(SK), input_precision=PREC))  # fmt: skip
    W = delta[:, None] * tl.dot(UAe, sig, input_precision=PREC)
    G = tl.dot(Hm + tl.dot(W, tl.trans(S), input_precision=PREC), Tt,
               input_precision=PREC)  # fmt: skip
    Y = (0.5 * delta[:, None] * (tl.dot(C, DA, input_precision=PREC)
                                 + tl.dot(B, Kh, input_precision=PREC))
         + W - tl.dot(tl.where(later, G, 0.0), U, input_precision=PREC))  # fmt: skip
    ddelta = tl.sum(S * Y, axis=1) * rd * rd
    DSm = -2.0 * Y * rd[:, None] + ddelta[:, None] * U
    tl.store(dsm_ptr + off, DSm, mask=mp[:, None])
    # du_t = −2 Ω_t u_t (fewer products than dδ s + A_{t-1} ds, the same in exact
    # arithmetic); U A_e Σ A_e as (W / δ) A_e, reusing W: BP·d² multiply-adds instead
    # of 2d³ for A_e Σ A_e.
    WAe = tl.dot(W * rd[:, None], A_e, input_precision=PREC)
    du = -(tl.dot(C, beta, input_precision=PREC) + tl.dot(B, alpha, input_precision=PREC)
           + 2.0 * WAe)  # fmt: skip
    tl.store(du_ptr + off_in, du.to(du_ptr.dtype.element_ty), mask=m_in)
