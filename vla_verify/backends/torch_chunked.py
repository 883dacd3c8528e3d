"""PyTorch exact chunked VLA (spec §5): the Woodbury/LDLᵀ penalty chain and the UT state chain.

This is the *chunk* half of flash-linear-attention's naive/chunk split.  The sequence is cut into
chunks of ``C`` tokens (``chunk_size`` ∈ {16, 32, 64}); inside a chunk every token-to-token
dependency is one batched matrix product, one factorisation or one triangular solve, and only
the ``T / C`` chunk-to-chunk steps of the state ``S`` remain a Python loop.  Everything is
``torch`` ops, so autograd differentiates it through ``q, k, v, u`` and the initial state.

Within one chunk, rows are tokens (``U``, ``K̂``, ``Q`` ``[C, dk]``, ``V`` ``[C, dv]``) and the
chunk starts from ``(S_0, A_0)``:

Penalty chain (spec §5, Woodbury / LDLᵀ).
    ``Y = U A_0ᵀ`` (row t is ``(A_0 u_t)ᵀ``), ``G = U A_0 Uᵀ``; ``I + G = L D Lᵀ`` with ``L`` unit
    lower triangular (only the lower triangle of ``G`` is read: the recurrence of spec §2.3 only
    ever forms ``u_tᵀ A_0 u_j`` for ``j ≤ t``); ``W = L^{-1} Y`` (row j is ``w_jᵀ = s_jᵀ``, the
    Sherman–Morrison vector of step j).  The pivots ``d_t`` *are* the Sherman–Morrison
    denominators ``δ_t``, so the floor ``max(δ_t, sm_floor)`` is a clamped pivot
    (:func:`ldl_clamped`; it acts only for an indefinite ``A_0`` or ``sm_floor > 1``).  Then all
    gates at once: ``α_tᵀ = k̂_tᵀ A_0ᵀ − Σ_{j≤t} (k̂_tᵀ w_j / d_j) w_jᵀ`` — a causally masked product
    — and the chunk ends at ``A_C = A_0 − Wᵀ D^{-1} W`` (+ ``nudge_eta·I`` when the nudge period
    ends the chunk; the last gate of that chunk then sees the nudge too: ``α_C += nudge_eta·k̂_C``).
    When no pivot is floored, the Cholesky factor ``R = L D^{1/2}`` is used as it is:
    ``R^{-1} Y`` has rows ``w_jᵀ / √d_j``, so ``W D^{-1} Wᵀ``-type sums need no division.

    Without nudges and from the default ``A_0 = I/lambda0``, ``M = A^{-1}`` at chunk starts is a
    prefix sum, ``M_c = lambda0·I + Σ_{c' < c} U_{c'}ᵀ U_{c'}``, so the chain can start anywhere
    from a batched Cholesky inverse of ``M``: it is cut into blocks of 256 tokens that run in
    parallel, each from its ``M^{-1}``, and inside a block it takes steps of (at most) 32 tokens,
    each from the end ``A`` of the step before (:func:`_gates_prefix`, :func:`_penalty_blocks`;
    only the last block's end ``A`` is formed).  Otherwise it runs chunk after chunk
    (:func:`_penalty_serial`).

State chain (spec §5, UT/WY form).
    Residuals ``e_t = v_t − S_{t-1} k̂_t`` solve ``(I + N) E = V − K̂ S_0ᵀ`` with
    ``N = tril(K̂ Âᵀ, −1)`` (rows: the transpose of the spec's strictly upper ``N``); then
    ``O = Q S_0ᵀ + tril(Q Âᵀ) E`` (before the read-out normaliser) and ``S_C = S_0 + Eᵀ Â``.
    ``T = (I + N)^{-1}`` is formed for all chunks at once (the UT transform, by batched products:
    :func:`_unit_lower_inverse`), with ``Ṽ = T V`` and ``K̃ = T K̂``; the loop over chunks then only
    carries ``E_c = Ṽ_c − K̃_c S_cᵀ`` and ``S_{c+1} = S_c + E_cᵀ Â_c``, and the read-outs
    ``Q_c S_cᵀ + P_c E_c`` of all chunks are batched products after it — the structure of fla's
    ``chunk_delta_h`` / ``chunk_o``.

Variants: ``vla`` (above), ``delta`` (``Â = K̂``: no penalty chain), ``linear`` (``E = V``,
``Â = K``: no solve).  ``rls`` is refused (its rank-2 step needs the inverse of a given initial
``P``; use the ``torch`` backend).

Nudges inside a chunk (any ``nudge_period``, any ``start``).  Inside a chunk the penalty is
carried as ``A_t = B_t + c_t·I``: the Sherman–Morrison downdates act on ``B`` and the nudge
adds ``nudge_eta`` to the scalar ``c`` (``c_0 = 0``, so ``B_0 = A_0``).  Step t's vector is
``s_t = A_{t-1} u_t = (A_0 + c_{t-1} I) u_t − Σ_{j<t} s_j (s_jᵀ u_t)/δ_j``, so with
``Y`` row t ``= ((A_0 + c_{t-1} I) u_t)ᵀ`` and ``L_{tj} = u_tᵀ s_j / δ_j`` it is ``S = L^{-1} Y``;
``u_tᵀ s_j`` for ``j ≤ t`` is the lower triangle of ``(L D − I) Lᵀ``, which makes
``lower(I + G) = lower(L D Lᵀ)`` with ``G[t, j] = u_tᵀ (A_0 + c_{j-1} I) u_j``.  So the chain
is the nudge-free one with ``Y`` shifted row by row and only ``G``'s lower triangle read (the
Cholesky factorisation and :func:`ldl_clamped` read nothing else), and the gates and the chunk's
end gain the shift: ``α_t = B_t k̂_t + c_t k̂_t``, ``A_C = B_C + c_C·I``.  The nudge clock is
global (spec §2.3): step t of the call is global step ``start + t``.  Without nudges in the
call the prefix chain below runs; otherwise the chain runs chunk after chunk.

Zero padding of the last chunk is exact: a zero token has ``k̂ = 0`` (so ``α = 0`` and nothing is
written) and ``u = 0`` (so ``w = 0``); padded outputs are dropped.

Precision.  The state chain computes as :mod:`.torch_sequential` does (float64 for float64
inputs, float32 for every other dtype), and ``o`` and the state come back in the inputs'
dtype.  The *penalty chain* (gates and ``A``) always computes in float64.  Its Woodbury form
re-derives every ``A_t`` of a chunk from the chunk-start ``A_c``, so its rounding error is
``u·||A_c||``, where the step-by-step Sherman–Morrison recurrence of spec §2.3 makes
``u·||A_{t-1}||`` at each step and damps it afterwards.  When one strong penalty
(``u_tᵀ A u_t ≫ 1``) shrinks ``A`` by orders of magnitude inside a chunk, a float32 penalty
chain is far worse than the float32 recurrence (up to ~10³× the spec §4 budget on the
``concentrated`` penalties of :mod:`vla_verify.properties.strategies`).  Its float64 error
``u_64·||A_c||`` is far below float32's, also where the steps of a block carry ``A`` from one
to the next (for 256 tokens at most, then a restart from ``M``).  For float64 inputs no wider dtype
exists, and the effect was measured: ``vla-verify run`` found a float64 example (T = 5,
dk = 2, a given SPD ``A_0``, penalties of norm ~20) 4x outside the spec §4 budget.  So by
default (``penalty_chain="auto"``) float64 inputs run the penalty chain step by step, as spec
§2.3 writes it (one batched matrix-vector product, rank-one downdate and gate per token), and keep
the chunked UT state chain; ``penalty_chain="woodbury"`` forces the spec §5 form
(``tests/test_torch_backends.py`` records its float64 limitation).

Speed (CPU; ``benchmarks/test_bench_torch_cpu.py``).  The float64 penalty chain is
most of the work, and PyTorch runs a batched Cholesky factorisation or triangular solve on CPU
as one LAPACK call per matrix (the factorisation on one thread): at ``C = dk = 64`` those calls
cost about as much as all of the chain's batched products.  So the prefix chain factorises ``M``
once per block of :data:`_RESTART_TOKENS` tokens, not once per chunk, and carries ``A`` through
the block by batched downdates; it takes steps of :data:`_PENALTY_CHUNK` = 32 tokens whatever the
chunk size (a step's factorisation, solve and masked products shrink with ``C`` faster than the
number of steps grows); and it forms ``Y`` and ``G`` transposed, so that LAPACK reads them
column-major and solves in place.  With autograd off, the intermediates live in a per-thread
workspace reused from call to call (:class:`_Workspace`): on CPU, fresh multi-MiB tensors
page-fault on every call, which costs as much as the products that fill them; buffers whose
contents are spent are reused, since a smaller working set was measured a few percent faster.
``chunk_size=64`` is the fastest of the three sizes there: about 22 ms against ~270 ms for the
sequential backend on the benchmark machine when its VM is in its fast state, ~27 ms against
~345 ms in its slow one (``benchmarks/results/cpu/torch_chunked_vs_sequential.json``).  Measured
and dropped: running head groups on two Python threads (their OpenMP teams oversubscribe two
cores, and once a second thread has run a LAPACK call, the main thread's triangular solves stay
~3× slower, the sequential backend's products included); one product for ``U Aᵀ`` and ``K̂ Aᵀ``
over stacked rows, or for ``T V`` and ``T K̂`` over adjacent columns (the in-place products that
follow copy strided operands; 4% of two products at most); checking the factorisations and
normalising the gates once for all steps of a block instead of step by step (no difference).
"""

from __future__ import annotations

import math
import threading
from typing import Any, TypeAlias

import torch

from ..errors import UnsupportedConfigurationError
from ..spec import FLOAT_DTYPES, Shapes, VLAConfig
from .registry import Backend, Capabilities
from .torch_sequential import check_tensors, penalty_step, work_dtype

__all__ = ["CHUNK_SIZES", "PENALTY_CHAINS", "TorchChunkedBackend", "chunked", "ldl_clamped"]

Tensor: TypeAlias = torch.Tensor
State = tuple[Tensor, Tensor, Tensor]

#: Chunk sizes the backend takes (those of fla's chunk kernels).
CHUNK_SIZES: tuple[int, ...] = (16, 32, 64)
#: Variants the chunked form implements (see the module docstring for ``rls``).
CHUNKED_VARIANTS: tuple[str, ...] = ("vla", "delta", "linear")
#: How the penalty chain is computed (option ``penalty_chain``; module docstring, "Precision").
PENALTY_CHAINS: tuple[str, ...] = ("auto", "woodbury", "stepwise")


# -- workspace ----------------------------------------------------------------------------------


class _Workspace(threading.local):
    """Intermediate tensors kept from one call to the next (per thread) while autograd is off.

    On CPU, a fresh intermediate of a few MiB page-faults on every call (the C allocator hands
    freed memory back to the OS), and on a small machine that costs about as much as the product
    that fills it.  Buffers are keyed by the name of their call site and replaced when a shape
    changes, so at most one call signature's intermediates are held.  What the backend returns
    never lives here.
    """

    def __init__(self) -> None:
        self.active = False
        self.buffers: dict[str, Tensor] = {}

    def get(
        self,
        name: str,
        shape: tuple[int, ...],
        dtype: torch.dtype,
        device: torch.device,
        columns: bool = False,
    ) -> Tensor | None:
        """The buffer ``name`` (``columns``: column-major matrices, as LAPACK writes them), or
        None when the workspace is off."""
        if not self.active:
            return None
        size = torch.Size(shape)
        buf = self.buffers.get(name)
        if buf is None or buf.shape != size or buf.dtype != dtype or buf.device != device:
            if columns:
                buf = torch.empty((*size[:-2], size[-1], size[-2]), dtype=dtype, device=device).mT
            else:
                buf = torch.empty(size, dtype=dtype, device=device)
            self.buffers[name] = buf
        return buf


_WORKSPACE = _Workspace()


def _bmm(a: Tensor, b: Tensor, name: str) -> Tensor:
    """``a @ b`` over equal batch dimensions, into the workspace buffer ``name`` when it is on."""
    out = _WORKSPACE.get(name, (*a.shape[:-1], b.shape[-1]), a.dtype, a.device)
    if out is None:
        return a @ b
    torch.bmm(a.flatten(0, -3), b.flatten(0, -3), out=out.view(-1, *out.shape[-2:]))
    return out


def _divide(x: Tensor, y: Tensor, name: str, dtype: torch.dtype | None = None) -> Tensor:
    """``(x / y).to(dtype)`` (broadcast to ``x``'s shape; default dtype ``x``'s), into the
    workspace buffer ``name`` when it is on (``name`` may be ``x``'s own buffer)."""
    dtype = x.dtype if dtype is None else dtype
    out = _WORKSPACE.get(name, x.shape, dtype, x.device)
    return (x / y).to(dtype) if out is None else torch.div(x, y, out=out)


def _cholesky(M: Tensor, name: str) -> tuple[Tensor, Tensor]:
    """``torch.linalg.cholesky_ex(M)`` (lower factor, ``info``), into the workspace when it is
    on."""
    R = _WORKSPACE.get(name, M.shape, M.dtype, M.device, columns=True)
    if R is None:
        return torch.linalg.cholesky_ex(M)
    info = _WORKSPACE.get(name + ".info", M.shape[:-2], torch.int32, M.device)
    assert info is not None
    return torch.linalg.cholesky_ex(M, out=(R, info))


def _solve_lower(
    R: Tensor, Y: Tensor, name: str | None = None, *, overwrite: bool = False
) -> Tensor:
    """``R^{-1} Y`` for lower triangular ``R``, into the workspace buffer ``name`` when it is on
    (or, with ``overwrite``, over ``Y`` itself, which must then be a column-major workspace
    buffer: LAPACK solves in place, without a copy)."""
    if overwrite:
        X = Y if _WORKSPACE.active else None
    else:
        X = None if name is None else _WORKSPACE.get(name, Y.shape, Y.dtype, Y.device, columns=True)
    if X is None:
        return torch.linalg.solve_triangular(R, Y, upper=False)
    return torch.linalg.solve_triangular(R, Y, upper=False, out=X)


# -- penalty chain ------------------------------------------------------------------------------


def ldl_clamped(M: Tensor, floor: float) -> tuple[Tensor, Tensor]:
    """``M = L D Lᵀ`` with every pivot clamped, ``d_j = max(d_j, floor)``, column by column.

    ``M`` ``[..., n, n]`` symmetric (only its lower triangle is read).  Returns ``L`` unit lower
    triangular ``[..., n, n]`` and ``d`` ``[..., n]``.  With the clamp this is exactly the chain
    of floored Sherman–Morrison denominators of spec §2.3 (the module docstring), which a plain
    Cholesky factorisation cannot express; it costs ``n`` sequential steps, so it is the fallback
    of :func:`_gates`, taken only when some pivot is below the floor.
    """
    n = M.shape[-1]
    rows = torch.arange(n, device=M.device)
    columns: list[Tensor] = []
    pivots: list[Tensor] = []
    for j in range(n):
        c = M[..., :, j]
        if j:
            L_prev = torch.stack(columns, dim=-1)  # [..., n, j]
            d_prev = torch.stack(pivots, dim=-1)  # [..., j]
            c = c - (L_prev @ (L_prev[..., j, :] * d_prev).unsqueeze(-1)).squeeze(-1)
        d_j = torch.clamp_min(c[..., j], floor)
        column = torch.where(rows > j, c / d_j.unsqueeze(-1), (rows == j).to(c.dtype))
        columns.append(column)
        pivots.append(d_j)
    return torch.stack(columns, dim=-1), torch.stack(pivots, dim=-1)


def _ldl(M: Tensor, floor: float) -> tuple[Tensor, Tensor]:
    """LDLᵀ of the SPD-in-exact-arithmetic ``M = I + G`` through one batched Cholesky.

    ``L = R / diag(R)``, ``d = diag(R)²`` for the Cholesky factor ``R``.  If the factorisation
    fails or a pivot is below ``floor`` (the Sherman–Morrison floor acts), fall back to the exact
    clamped recursion :func:`ldl_clamped`.  (:func:`_gates` uses ``R`` itself and takes the
    clamped recursion directly; this unit-diagonal form is the textbook one of spec §5.)
    """
    R, info = torch.linalg.cholesky_ex(M)
    diag = R.diagonal(dim1=-2, dim2=-1)
    d = diag * diag
    if bool((info == 0).all()) and bool((d >= floor).all()):
        return R / diag.unsqueeze(-2), d
    return ldl_clamped(M, floor)


def _gates(
    A0: Tensor,
    U: Tensor,
    K_hat: Tensor,
    floor: float,
    clamp: bool = True,
    shift: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor] | None:
    """The Woodbury/LDLᵀ gates of a batch of chunks (spec §5 penalty chain).

    ``A0`` ``[..., dk, dk]``; ``U``, ``K_hat`` ``[..., C, dk]``.  Returns ``(α, W, W_s, d)``:
    the un-normalised gates ``α`` ``[..., C, dk]`` (row t is ``(A_t k̂_t)ᵀ``, without the
    nudge), ``W``, ``W_s`` ``[..., C, dk]`` with ``A_t = A_0 − W_{≤t}ᵀ W_s,{≤t}`` (rows up to
    t; the chunk ends at ``A_0 − Wᵀ W_s``), and the pivots ``d`` ``[..., C]``.

    When every pivot is at least ``floor`` the Cholesky factor ``R = L D^{1/2}`` of ``I + G``
    gives ``W = W_s = R^{-1} Y`` (rows ``w_jᵀ / √d_j``): no division by the pivots and no
    unit-diagonal ``L``.  Otherwise the clamped LDLᵀ (:func:`ldl_clamped`) takes over, or, with
    ``clamp=False``, ``None`` is returned.

    ``shift`` ``[C]`` (nudges inside the chunk, module docstring "Nudges inside a chunk"): the
    isotropic shift ``c_{t-1}`` that step ``t``'s Sherman–Morrison update sees, ``A_{t-1} = B_{t-1}
    + c_{t-1}·I``.  Then ``Y`` row t is ``((A_0 + c_{t-1} I) u_t)ᵀ``, ``G[t, j] = u_tᵀ (A_0 +
    c_{j-1} I) u_j`` for ``j ≤ t`` (only that triangle is read), and the returned ``α`` and
    ``W``, ``W_s`` are those of ``B``: the caller adds ``c_t·k̂_t`` and ``c_C·I``.
    """
    # Y and G are formed transposed, so that they are column-major: LAPACK reads and writes
    # column-major matrices, and a row-major argument costs a transposing copy per call.
    Y = _bmm(A0, U.mT, "Yt").mT  # row t: (A_0 u_t)ᵀ
    if shift is not None:  # row t: ((A_0 + c_{t-1} I) u_t)ᵀ, a new (row-major) tensor
        Y = Y + shift.to(Y.dtype).unsqueeze(-1) * U
    KA = _bmm(K_hat, A0.mT, "KA")  # row t: (A_0 k̂_t)ᵀ
    G = _bmm(Y, U.mT, "Gt").mT  # G[t, j] = u_tᵀ A_0 u_j
    if G.requires_grad:
        # Symmetrise from the lower triangle: the recurrence only forms u_tᵀ A_0 u_j for j ≤ t,
        # and Cholesky's backward assumes a symmetric argument (a non-symmetric A_0 would
        # otherwise get a gradient split over entries the forward never read).
        eye = torch.eye(G.shape[-1], dtype=G.dtype, device=G.device)
        M = eye + torch.tril(G) + torch.tril(G, -1).mT
    else:
        # The factorisation reads the lower triangle only: the same numbers, without copies.
        M = G
        M.diagonal(dim1=-2, dim2=-1).add_(1.0)
    R, info = _cholesky(M, "R_G")
    r = R.diagonal(dim1=-2, dim2=-1)
    d = r * r
    if bool((info == 0).all()) and bool((d >= floor).all()):
        W = _solve_lower(R, Y, overwrite=shift is None)  # rows w_jᵀ / √d_j
        W_s = W
    elif not clamp:
        return None
    else:
        L, d = ldl_clamped(M, floor)
        W = torch.linalg.solve_triangular(L, Y, upper=False, unitriangular=True)  # rows w_jᵀ
        W_s = W / d.unsqueeze(-1)
    # α_tᵀ = k̂_tᵀ A_0ᵀ − Σ_{j≤t} (k̂_tᵀ w_j / d_j) w_jᵀ: causal mask including the diagonal,
    # since α_t is formed from the UPDATED A_t (spec §2.3).  In place into K̂ A_0ᵀ: the
    # products' backward needs only their inputs.
    X = _bmm(K_hat, W_s.mT, "X").tril_()
    alpha = KA.view(-1, *KA.shape[-2:]).baddbmm_(
        X.view(-1, *X.shape[-2:]), W.reshape(-1, *W.shape[-2:]), alpha=-1.0
    )
    return alpha.view(KA.shape), W, W_s, d


def _penalty_chunk(
    A0: Tensor, U: Tensor, K_hat: Tensor, floor: float, shift: Tensor | None = None
) -> tuple[Tensor, Tensor, Tensor]:
    """Gates and chunk-end ``A`` of one chunk (or a batch of chunks), spec §5 penalty chain.

    ``A0`` ``[..., dk, dk]``; ``U``, ``K_hat`` ``[..., C, dk]``.  Returns the un-normalised gates
    ``α`` ``[..., C, dk]`` (row t is ``(A_t k̂_t)ᵀ``, without the nudge), ``A_C`` ``[..., dk, dk]``
    and the pivots ``d`` ``[..., C]`` (:func:`_gates`).  With ``shift`` (the isotropic shift
    ``c_{t-1}`` before each step, :func:`_nudge_shifts`), ``α`` and ``A_C`` are those of ``B``
    in ``A = B + c·I``: the caller adds the shift after each step.
    """
    if shift is not None:
        result = _gates(A0, U, K_hat, floor, shift=shift)
        assert result is not None
        alpha, W, W_s, d = result
        return alpha, A0 - W.mT @ W_s, d
    result = _gates(A0, U, K_hat, floor)
    assert result is not None  # clamp=True always gives gates
    alpha, W, W_s, d = result
    return alpha, A0 - W.mT @ W_s, d


#: Tokens per Woodbury step of the prefix chain (:func:`_gates_prefix`; at most the chunk size):
#: the chain's products, factorisations and solves cost ``C²`` per step, its downdates do not
#: depend on ``C``, and its work does not depend on the state chain's chunks, so it cuts a chunk
#: of 64 tokens in two (on the CPU benchmark ``benchmarks/test_bench_torch_cpu.py``: about 5%
#: faster than 64).
_PENALTY_CHUNK = 32
#: Tokens between two restarts of the prefix chain from a Cholesky factorisation of ``M``
#: (:func:`_penalty_blocks`; on that benchmark, the fastest of the lengths tried,
#: 16…1024, at each chunk size).
_RESTART_TOKENS = 256
#: Blocks (of all heads together) per batched call in :func:`_gates_prefix`: about 1 MiB per
#: float64 ``dk × dk`` intermediate at ``dk = 64``.
_GROUP_CHUNKS = 32


def _block_start_M(U: Tensor, config: VLAConfig) -> Tensor:
    """``M_b = lambda0·I + Σ_{b'<b} U_{b'}ᵀ U_{b'}`` ``[G, NB, dk, dk]``, the ``M = A^{-1}`` that
    block ``b`` starts from (spec §2.3, last line), for blocks of tokens ``U``
    ``[G, NB, L, dk]``."""
    G, NB, _, dk = U.shape
    gram = _bmm(U.mT, U, "gram")  # [G, NB, dk, dk]; the last block's is not used
    # Exclusive prefix sums by shifting, never cumsum − gram: that difference cancels, and its
    # rounding error (u·||Σ U Uᵀ||) would swamp lambda0.
    M = _WORKSPACE.get("M", gram.shape, gram.dtype, gram.device)
    if M is None:
        M = torch.cat([gram.new_zeros(G, 1, dk, dk), gram[:, :-1].cumsum(dim=1)], dim=1)
    else:  # the same sums in the same order as cumsum, without its slow strided kernel
        M[:, 0].zero_()
        for b in range(1, NB):
            torch.add(M[:, b - 1], gram[:, b - 1], out=M[:, b])
    M.diagonal(dim1=-2, dim2=-1).add_(config.lambda0)
    return M


def _downdate(A: Tensor, W: Tensor, W_s: Tensor, name: str) -> Tensor:
    """``A − (Wᵀ W_s)``, the end ``A`` of a batch of chunks (:func:`_gates`), into the workspace
    buffer ``name`` when it is on.  The product is formed first and subtracted once, as in
    :func:`_penalty_chunk` (a ``baddbmm`` would add its terms into ``A`` one after another)."""
    out = _WORKSPACE.get(name, A.shape, A.dtype, A.device)
    if out is None:
        return A - W.mT @ W_s
    return torch.sub(A, _bmm(W.mT, W_s, "WW"), out=out)


def _penalty_blocks(
    U: Tensor, K_hat: Tensor, config: VLAConfig, work: torch.dtype, out: Tensor | None
) -> tuple[Tensor, Tensor] | None:
    """Gates and final ``A`` of a few heads from ``A_0 = I/lambda0`` without nudges (spec §5).

    ``U``, ``K_hat`` ``[G, NB, m, C, dk]``: ``G`` heads, each ``NB`` blocks of ``m`` chunks;
    ``U`` in float64, ``K_hat`` in any float dtype: each step converts its own slice (a small
    buffer instead of a float64 copy of every ``k̂``, which on the benchmark machine is measurably
    faster: the working set shrinks by 4 MiB at T = 2048).
    Every block starts from ``A = M_b^{-1}`` (spec §5, last sentence: ``M`` at chunk starts is a
    prefix sum, :func:`_block_start_M`), through one batched Cholesky factorisation and one
    triangular solve; then the ``m`` chunks of a block run one after the other, each from the end
    ``A − Wᵀ W_s`` of the one before (:func:`_gates`, :func:`_downdate`), with all blocks and
    heads in one batch.  A factorisation per chunk would make the whole chain parallel, but
    PyTorch runs batched Cholesky factorisations and triangular solves on CPU one matrix at a
    time, and those calls cost more than ``m − 1`` batched downdates; restarting from ``M`` keeps
    the float64 rounding of the downdates to ``m − 1`` steps.

    Returns the gates ``Â`` ``[G, NB, m, C, dk]`` (in ``work``; into ``out`` when given) and
    ``A_T`` ``[G, dk, dk]`` (the last block's end ``A``), or ``None`` when a factorisation fails
    or a pivot falls below ``sm_floor`` (then ``A`` is not ``M^{-1}``; the caller runs the serial
    chain).
    """
    G, NB, m, C, dk = U.shape
    M = _block_start_M(U.reshape(G, NB, m * C, dk), config)
    R, info = _cholesky(M, "R_M")
    if not bool((info == 0).all()):
        return None
    # A = M^{-1} = R^{-T} R^{-1}; a batched triangular solve is much faster on CPU than
    # cholesky_inverse, which runs one LAPACK potri per matrix.
    eye = torch.eye(dk, dtype=M.dtype, device=M.device).expand_as(M)
    R_inv = _solve_lower(R, eye, "R_inv")
    A = _bmm(R_inv.mT, R_inv, "A_0")
    gates = []
    for r in range(m):
        K_r = _to_chunks_like(K_hat[:, :, r], "K64_step", U.dtype)
        result = _gates(A, U[:, :, r], K_r, config.sm_floor, clamp=False)
        if result is None:
            return None
        alpha, W, W_s, _ = result
        if r + 1 < m:  # chunk r + 1 of every block starts where chunk r ends
            A = _downdate(A, W, W_s, f"A_{(r + 1) % 2}")
        else:  # only the last block's end is wanted
            A = A[:, -1] - W[:, -1].mT @ W_s[:, -1]
        gates.append(_gate(alpha, config, work, None if out is None else out[:, :, r]))
    return (out if out is not None else torch.stack(gates, dim=2)), A


def _gates_prefix(
    U: Tensor, K_hat: Tensor, config: VLAConfig, work: torch.dtype
) -> tuple[Tensor, Tensor] | None:
    """The gates ``Â`` (``[B, H, NC, C, dk]``, in ``work``) and ``A_T`` by :func:`_penalty_blocks`,
    a few heads at a time (or ``None``, as :func:`_penalty_blocks`).

    The penalty chain's steps need not be the state chain's chunks: chunks longer than
    :data:`_PENALTY_CHUNK` tokens are cut into steps of that length, and every
    :data:`_RESTART_TOKENS` tokens make a block (the last block padded with zero tokens, which
    change nothing: module docstring).  Heads are independent; taking about
    :data:`_GROUP_CHUNKS` blocks at a time keeps the float64 intermediates of one call (a few
    MiB) in the CPU's cache.
    """
    B, H, NC, C_state, dk = U.shape
    C = min(C_state, _PENALTY_CHUNK)
    n = NC * C_state // C  # steps of C tokens
    m = min(max(1, _RESTART_TOKENS // C), n)
    NB = -(-n // m)
    U, K_hat = U.reshape(B * H, n, C, dk), K_hat.reshape(B * H, n, C, dk)
    if NB * m != n:
        pad = (0, 0, 0, 0, 0, NB * m - n)
        U, K_hat = torch.nn.functional.pad(U, pad), torch.nn.functional.pad(K_hat, pad)
    U, K_hat = U.view(B * H, NB, m, C, dk), K_hat.view(B * H, NB, m, C, dk)
    out = _WORKSPACE.get("gate", U.shape, work, U.device)
    size = max(1, _GROUP_CHUNKS // NB)
    gates, ends = [], []
    for lo in range(0, B * H, size):
        hi = min(lo + size, B * H)
        target = None if out is None else out[lo:hi]
        result = _penalty_blocks(U[lo:hi], K_hat[lo:hi], config, work, target)
        if result is None:
            return None
        gates.append(result[0])
        ends.append(result[1])
    gate = (out if out is not None else torch.cat(gates)).view(B, H, NB * m * C, dk)
    gate = gate[:, :, : NC * C_state].reshape(B, H, NC, C_state, dk)
    return gate, torch.cat(ends).view(B, H, dk, dk)


def _gate(alpha: Tensor, config: VLAConfig, work: torch.dtype, out: Tensor | str | None) -> Tensor:
    """The gates ``α̂ = α / max(||α||, norm_eps)`` (or ``α``, spec §2.2 ``normalize_gate``),
    normalised in float64 and rounded to ``work``; into ``out`` (a tensor, or the name of a
    workspace buffer) when given."""
    if isinstance(out, str):
        out = _WORKSPACE.get(out, alpha.shape, work, alpha.device)
    if config.normalize_gate:
        norm = _norm(alpha, config.norm_eps)
        return (alpha / norm).to(work) if out is None else torch.div(alpha, norm, out=out)
    return alpha.to(work) if out is None else out.copy_(alpha)


def _nudge_shifts(
    config: VLAConfig, first: int, C: int, T: int, dtype: torch.dtype, device: torch.device
) -> tuple[Tensor, Tensor] | None:
    """The isotropic shift of one chunk (module docstring, "Nudges inside a chunk").

    The chunk's local steps ``i = 0..C-1`` are the global steps ``first + i + 1`` (1-based, the
    call's ``start`` included); a step is nudged when :meth:`VLAConfig.nudges_at` says so and it
    lies inside the call (``first + i + 1 ≤ T``, ``T`` counted from global step 0 too).  Returns
    ``(before, after)`` ``[C]``: ``c_{i-1}`` and ``c_i``, ``nudge_eta`` times the nudges up to
    and excluding / including step ``i``; ``None`` when the chunk holds no nudge.
    """
    nudged = [first + i + 1 <= T and config.nudges_at(first + i + 1) for i in range(C)]
    if not any(nudged):
        return None
    after = torch.tensor(nudged, dtype=dtype, device=device).cumsum(0) * config.nudge_eta
    before = after - torch.tensor(nudged, dtype=dtype, device=device) * config.nudge_eta
    return before, after


def _penalty_serial(
    A0: Tensor, U: Tensor, K_hat: Tensor, config: VLAConfig, T: int, start: int = 0
) -> tuple[Tensor, Tensor]:
    """The penalty chain chunk after chunk from any ``A_0``, nudges anywhere.

    ``A0`` ``[B, H, dk, dk]``; ``U``, ``K_hat`` ``[B, H, NC, C, dk]``; ``T`` the unpadded length
    and ``start`` the tokens consumed before the call (a nudge fires after step ``t`` of the call
    when ``(start + t) % nudge_period == 0`` and ``t ≤ T``, spec §2.3).  A chunk with nudges
    runs on the shifted form ``A = B + c·I`` (:func:`_nudge_shifts`).  Returns ``α``
    ``[B, H, NC, C, dk]`` and the final ``A``.
    """
    NC, C = U.shape[2], U.shape[3]
    A = A0
    gates = []
    # Each chunk's gates are kept until the loop ends: no workspace buffers here.
    active, _WORKSPACE.active = _WORKSPACE.active, False
    try:
        for c in range(NC):
            shifts = _nudge_shifts(config, start + c * C, C, start + T, A.dtype, A.device)
            if shifts is None:
                alpha, A, _ = _penalty_chunk(A, U[:, :, c], K_hat[:, :, c], config.sm_floor)
            else:
                before, after = shifts
                alpha, A, _ = _penalty_chunk(
                    A, U[:, :, c], K_hat[:, :, c], config.sm_floor, shift=before
                )
                # A_t = B_t + c_t·I: the gate reads the updated A_t, the chunk ends at c_C.
                alpha = alpha + after.unsqueeze(-1) * K_hat[:, :, c]
                eye = torch.eye(A.shape[-1], dtype=A.dtype, device=A.device)
                A = A + after[-1] * eye
            gates.append(alpha)
    finally:
        _WORKSPACE.active = active
    return torch.stack(gates, dim=2), A


def _penalty_stepwise(
    A0: Tensor, U: Tensor, K_hat: Tensor, config: VLAConfig, T: int, start: int = 0
) -> tuple[Tensor, Tensor]:
    """The penalty chain as spec §2.3 writes it, token by token (batched over B and H).

    For float64 inputs (module docstring, "Precision"): the Woodbury form's rounding error is at
    the scale of the chunk-start ``A``, and float64 has no wider dtype to hide it in.  ``A0``
    ``[B, H, dk, dk]``; ``U``, ``K_hat`` ``[B, H, NC, C, dk]`` (zero-padded past ``T``);
    ``start`` the tokens consumed before the call (spec §2.3).  Returns ``α``
    ``[B, H, NC, C, dk]`` (zero on padding) and the final ``A``.
    """
    B, H, NC, C, dk = U.shape
    u = U.reshape(B, H, NC * C, dk)
    kh = K_hat.reshape(B, H, NC * C, dk)
    eye = torch.eye(dk, dtype=A0.dtype, device=A0.device)
    A = A0
    gates = []
    for t in range(T):
        A = penalty_step(A, u[:, :, t], start + t, config, eye)
        gates.append((A @ kh[:, :, t, :, None]).squeeze(-1))  # α_t from the updated A_t
    alpha = torch.stack(gates, dim=2)
    alpha = torch.nn.functional.pad(alpha, (0, 0, 0, NC * C - T))
    return alpha.reshape(B, H, NC, C, dk), A


# -- state chain --------------------------------------------------------------------------------


def _pair_blocks(grid: Tensor, row: int, column: int) -> Tensor:
    """Blocks ``(2m + row, 2m + column)`` of ``grid`` ``[..., P, 2, s, P, 2, s]``:
    ``[..., P, s, s]`` (a view)."""
    return grid.select(-2, column).select(-4, row).diagonal(dim1=-4, dim2=-2).movedim(-1, -3)


def _unit_lower_inverse(N: Tensor, name: str) -> Tensor:
    """``(I + N)^{-1}``, where only the strictly lower triangle of ``N`` ``[..., n, n]`` is read.

    The recursive triangular inverse (LAPACK ``trtri``) from the bottom up, for all matrices of
    the batch at once and without a per-matrix LAPACK call: diagonal blocks of size s = 1, 2,
    4, … are merged pairwise, ``[[X₁, 0], [N₂₁, X₂]] → [[X₁, 0], [−X₂ N₂₁ X₁, X₂]]``, one pair of
    batched products per level.  With autograd off the inverse is built in place (in the
    workspace buffer ``name``); otherwise the blocks are joined by concatenation.
    """
    n = N.shape[-1]
    batch = N.shape[:-2]
    eye = torch.eye(n, dtype=N.dtype, device=N.device)
    if n & (n - 1):  # not a power of two (no chunk size is): one triangular solve
        L = eye + torch.tril(N, -1)
        return torch.linalg.solve_triangular(L, eye.expand_as(L), upper=False, unitriangular=True)
    if not N.requires_grad:
        X = _WORKSPACE.get(name, N.shape, N.dtype, N.device)
        X = torch.empty_like(N) if X is None else X
        X.copy_(eye)
        s = 1
        while s < n:
            P = n // (2 * s)
            lower = _pair_blocks(N.reshape(*batch, P, 2, s, P, 2, s), 1, 0)
            grid = X.view(*batch, P, 2, s, P, 2, s)
            X21 = _pair_blocks(grid, 1, 0)
            X21.copy_(_pair_blocks(grid, 1, 1) @ (lower @ _pair_blocks(grid, 0, 0))).neg_()
            s *= 2
        return X
    blocks = torch.ones(*batch, n, 1, 1, dtype=N.dtype, device=N.device)  # inverses of 1×1 blocks
    s = 1
    while s < n:
        P = n // (2 * s)
        lower = _pair_blocks(N.reshape(*batch, P, 2, s, P, 2, s), 1, 0)
        X1, X2 = blocks[..., 0::2, :, :], blocks[..., 1::2, :, :]
        X21 = -(X2 @ (lower @ X1))
        top = torch.cat([X1, torch.zeros_like(X1)], dim=-1)
        bottom = torch.cat([X21, X2], dim=-1)
        blocks = torch.cat([top, bottom], dim=-2)
        s *= 2
    return blocks.reshape(*batch, n, n)


def _state_chain(
    S0: Tensor, K_hat: Tensor | None, gate: Tensor, V: Tensor, Q: Tensor
) -> tuple[Tensor, Tensor]:
    """The UT/WY state chain of spec §5 (module docstring).

    ``S0`` ``[B, H, dv, dk]``; ``K_hat``, ``gate``, ``Q`` ``[B, H, NC, C, dk]``; ``V``
    ``[B, H, NC, C, dv]``.  ``K_hat=None`` means no delta-rule correction (linear attention:
    ``E = V``).  Returns ``S Q`` per token ``[B, H, NC, C, dv]`` and the final ``S``.

    Only ``E_c = Ṽ_c − K̃_c S_cᵀ`` and ``S_{c+1} = S_c + E_cᵀ Â_c`` run chunk after chunk; the
    read-outs ``Q_c S_cᵀ + P_c E_c`` of all chunks are two batched products after the loop.
    """
    B, H, NC, C, dv = V.shape
    dk = Q.shape[-1]
    if K_hat is not None:
        # T = (I + N)^{-1} with N[t, i] = k̂_tᵀ α̂_i for i < t (the UT transform).
        T = _unit_lower_inverse(_bmm(K_hat, gate.mT, "N"), "T")
        V_t, K_t = _bmm(T, V, "V_t").flatten(0, 1), _bmm(T, K_hat, "K_t").flatten(0, 1)
    else:
        V_t, K_t = V.flatten(0, 1), None
    gates = gate.flatten(0, 1)  # [B·H, NC, C, dk]
    S = S0.reshape(B * H, dv, dk)
    starts, residuals = [], []
    for c in range(NC):
        starts.append(S)
        E = V_t[:, c] if K_t is None else torch.baddbmm(V_t[:, c], K_t[:, c], S.mT, alpha=-1.0)
        residuals.append(E)
        # S + (Eᵀ Â), never baddbmm(S, Eᵀ, Â): that accumulates the product's terms into S one
        # after another, and on near-parallel keys it was measured 3x further from the oracle.
        S = S + E.mT @ gates[:, c]
    S_starts = _stack(starts, "S_starts")  # [B·H, NC, dv, dk]
    E = _stack(residuals, "E") if K_t is not None else V_t
    # P and the reads go into the buffers of N and Ṽ, which are spent by now: a smaller working
    # set is measurably faster on the benchmark machine (2 MiB each at T = 2048).
    P = _bmm(Q, gate.mT, "N").tril_()  # P[t, i] = α̂_iᵀ q_t for i ≤ t
    reads = _bmm(Q, S_starts.view(B, H, NC, dv, dk).mT, "V_t")
    reads.view(-1, C, dv).baddbmm_(P.view(-1, C, C), E.reshape(-1, C, dv))
    return reads, S.view(B, H, dv, dk)


def _stack(xs: list[Tensor], name: str) -> Tensor:
    """``torch.stack(xs, dim=1)``, into the workspace buffer ``name`` when it is on."""
    out = _WORKSPACE.get(
        name, (xs[0].shape[0], len(xs), *xs[0].shape[1:]), xs[0].dtype, xs[0].device
    )
    return torch.stack(xs, dim=1) if out is None else torch.stack(xs, dim=1, out=out)


# -- the chunked algorithm ----------------------------------------------------------------------


def _to_chunks(x: Tensor, C: int, name: str, dtype: torch.dtype | None = None) -> Tensor:
    """``[B, T, H, D]`` → ``[B, H, NC, C, D]`` (in ``dtype``), the last chunk zero-padded."""
    B, T, H, D = x.shape
    NC = math.ceil(T / C)
    dtype = x.dtype if dtype is None else dtype
    out = _WORKSPACE.get(name, (B, H, NC * C, D), dtype, x.device)
    if out is None:
        out = torch.empty(B, H, NC * C, D, dtype=dtype, device=x.device)
    out[:, :, :T].copy_(x.transpose(1, 2))
    if NC * C != T:
        out[:, :, T:].zero_()
    return out.view(B, H, NC, C, D)


def _norm(x: Tensor, eps: float) -> Tensor:
    """``max(||x||, eps)`` along the last axis, kept as an axis (spec §2.2, ``norm_eps``)."""
    return torch.clamp_min(torch.linalg.vector_norm(x, dim=-1, keepdim=True), eps)


def chunked(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    u: Tensor,
    *,
    config: VLAConfig,
    variant: str = "vla",
    initial_state: State | None = None,
    chunk_size: int = 64,
    penalty_chain: str = "auto",
    start: int = 0,
) -> tuple[Tensor, State]:
    """VLA by the exact chunked forms of spec §5 (module docstring).

    Parameters
    ----------
    q, k, u : ``[B, T, H, dk]``; v : ``[B, T, H, dv]`` — one float dtype, one device.
    config : :class:`~vla_verify.spec.VLAConfig`; any ``nudge_period`` (nudges inside a chunk
        run on the shifted form, module docstring).
    variant : ``"vla"`` | ``"delta"`` | ``"linear"``.
    initial_state : ``(S [B, H, dv, dk], A [B, H, dk, dk], z [B, H, dk])`` or None for
        ``(0, I/lambda0, 0)``.  ``delta`` and ``linear`` carry ``A`` through unchanged.
    chunk_size : ``C``, tokens per chunk.
    penalty_chain : ``"woodbury"`` (spec §5, in float64), ``"stepwise"`` (spec §2.3 token by
        token, in the working precision) or ``"auto"``: stepwise for float64 inputs, Woodbury
        otherwise (module docstring, "Precision").
    start : the tokens consumed before the call (spec §2.3: the nudge clock continues).

    Returns
    -------
    ``o`` ``[B, T, H, dv]`` and ``(S, A, z)``, in the working dtype (float64 for float64 inputs,
    float32 otherwise); the caller casts.
    """
    tensors = (q, k, v, u, *(initial_state or ()))
    grad = torch.is_grad_enabled() and any(x.requires_grad for x in tensors)
    active = _WORKSPACE.active
    _WORKSPACE.active = q.device.type == "cpu" and not grad
    try:
        return _chunked(
            q, k, v, u, config, variant, initial_state, chunk_size, penalty_chain, start
        )
    finally:
        _WORKSPACE.active = active


def _chunked(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    u: Tensor,
    config: VLAConfig,
    variant: str,
    initial_state: State | None,
    C: int,
    penalty_chain: str = "auto",
    start: int = 0,
) -> tuple[Tensor, State]:
    B, T, H, dk = q.shape
    dv = v.shape[-1]
    work = work_dtype(q.dtype)
    q, k, v, u = (x.to(work) for x in (q, k, v, u))
    if initial_state is None:
        S0 = q.new_zeros(B, H, dv, dk)
        A0 = torch.eye(dk, dtype=work, device=q.device).div(config.lambda0).expand(B, H, dk, dk)
        z0 = None
    else:
        S0, A0, z0 = (x.to(work) for x in initial_state)
    eps = config.norm_eps

    K_raw, Qc, Vc = _to_chunks(k, C, "K_raw"), _to_chunks(q, C, "Q"), _to_chunks(v, C, "V")
    Kc = _divide(K_raw, _norm(K_raw, eps), "K")  # k̂ (a zero pad stays zero)
    A_final = A0
    if variant == "vla":
        # The penalty chain runs in float64 whatever the working precision (module docstring,
        # "Precision"): its Woodbury form cancels at the scale of the chunk-start A.
        f64 = torch.float64
        Uc = _to_chunks(u, C, "U64", f64)
        if penalty_chain == "auto":
            penalty_chain = "stepwise" if work == f64 else "woodbury"
        prefix = None
        stepwise = penalty_chain == "stepwise"
        if not stepwise and initial_state is None and not _nudges_within(config, start, T):
            prefix = _gates_prefix(Uc, Kc, config, work)  # k̂ converted step by step
        if prefix is not None:
            gate, A_final = prefix
        else:
            Kc64 = Kc if work == f64 else _to_chunks_like(Kc, "K64", f64)
            if stepwise:
                alpha, A_final = _penalty_stepwise(A0.double(), Uc, Kc64, config, T, start)
                gate = _gate(alpha, config, work, None)
            else:
                alpha, A_final = _penalty_serial(A0.double(), Uc, Kc64, config, T, start)
                gate = _gate(alpha, config, work, "gate")
        reads, S = _state_chain(S0, Kc, gate, Vc, Qc)
        A_final = A_final.to(work)
    elif variant == "delta":
        reads, S = _state_chain(S0, Kc, Kc, Vc, Qc)
    elif variant == "linear":
        reads, S = _state_chain(S0, None, K_raw, Vc, Qc)
    else:  # pragma: no cover - check_support refuses it
        raise ValueError(variant)

    # z_t = z_0 + Σ_{s≤t} k_s, in the chunk layout of the reads: [B, H, NC, C, dk].  torch's CPU
    # cumsum accumulates float32 in float64 and rounds each z_t once, so its error is at most the
    # float32 recurrence's (one rounding per step).
    flat = K_raw.view(B, H, -1, dk)
    z = flat.cumsum_(dim=2) if _WORKSPACE.active else torch.cumsum(flat, dim=2)  # k is spent
    if z0 is not None:
        z = z0[:, :, None] + z
    z_T = z[:, :, T - 1].clone()  # [B, H, dk]; z may live in the workspace
    if config.normalize_output:  # spec §2.3 read-out
        zq = z.mul_(Qc.view(z.shape)) if _WORKSPACE.active else z * Qc.view(z.shape)
        den = torch.clamp_min(zq.sum(-1, keepdim=True), config.out_eps).view(*reads.shape[:-1], 1)
        reads = reads / den
    elif _WORKSPACE.active:  # o must not live in the workspace
        reads = reads.clone()
    o = reads.reshape(B, H, -1, dv)[:, :, :T].transpose(1, 2)  # [B, T, H, dv]
    if A_final.stride(-1) == 0 or A_final.stride(0) == 0:  # the expanded default A_0
        A_final = A_final.contiguous()
    return o, (S, A_final, z_T)


def _to_chunks_like(x: Tensor, name: str, dtype: torch.dtype) -> Tensor:
    """``x.to(dtype)``, into the workspace buffer ``name`` when it is on."""
    if x.dtype == dtype:
        return x
    out = _WORKSPACE.get(name, x.shape, dtype, x.device)
    return x.to(dtype) if out is None else out.copy_(x)


def _nudges_within(config: VLAConfig, start: int, T: int) -> bool:
    """Whether a nudge fires at some global step ``start + 1 … start + T`` (spec §2.3)."""
    period = config.nudge_period
    return period is not None and (start + T) // period > start // period


class TorchChunkedBackend(Backend):
    """Registry name ``torch_chunked``: :func:`chunked` as a spec §4 callable, differentiable.

    Options ``chunk_size`` (16, 32 or 64; default 64), ``penalty_chain`` (``auto``,
    ``woodbury``, ``stepwise``; see :func:`chunked`) and ``check_finite`` (default True: NaN/Inf
    inputs are refused; on a GPU the check reads every input back, a device sync per call, which
    a training loop that queues work ahead of the device turns off).  Variants ``vla``,
    ``delta``, ``linear``; any ``nudge_period`` and any ``start`` (spec §2.3).
    float64/float32/bfloat16/float16 tensors on ``cpu`` or ``cuda``; returns ``(o, (S, A, z))``
    in the inputs' dtype and device.
    """

    name = "torch_chunked"
    description = "PyTorch exact chunked form (spec §5): LDLᵀ penalty chain, UT state chain"
    capabilities = Capabilities(
        array="torch",
        devices=("cpu", "cuda"),
        dtypes=FLOAT_DTYPES,
        variants=CHUNKED_VARIANTS,
        differentiable=True,
        requires=("torch",),
        options={"chunk_size": 64, "penalty_chain": "auto", "check_finite": True},
    )

    def __init__(self, *, variant: str = "vla", **options: Any) -> None:
        super().__init__(variant=variant, **options)
        size = self.options["chunk_size"]
        if isinstance(size, bool) or not isinstance(size, int) or size not in CHUNK_SIZES:
            raise UnsupportedConfigurationError(
                self.name,
                f"chunk_size must be one of {CHUNK_SIZES}, got {size!r}",
                argument="chunk_size",
            )
        chain = self.options["penalty_chain"]
        if chain not in PENALTY_CHAINS:
            raise UnsupportedConfigurationError(
                self.name,
                f"penalty_chain must be one of {PENALTY_CHAINS}, got {chain!r}",
                argument="penalty_chain",
            )

    @property
    def chunk_size(self) -> int:
        return int(self.options["chunk_size"])

    def _checks_finite(self) -> bool:
        return bool(self.options["check_finite"])

    def check_support(
        self,
        config: VLAConfig,
        shapes: Shapes,
        dtype: str,
        device: str = "cpu",
        *,
        variant: str | None = None,
    ) -> str | None:
        reason = super().check_support(config, shapes, dtype, device, variant=variant)
        if reason is not None and (variant or self.variant) == "rls":
            reason += (
                "; rls has a rank-2 step whose chunked form needs the inverse of a given "
                "initial P: use the 'torch' backend"
            )
        return reason

    def _precheck(self, q, k, v, u, initial_state, config):  # type: ignore[no-untyped-def]
        check_tensors(self.name, self.capabilities, q, k, v, u, initial_state)

    def _run(self, q, k, v, u, *, config, initial_state, start=0):  # type: ignore[no-untyped-def]
        o, state = chunked(
            q,
            k,
            v,
            u,
            config=config,
            variant=self.variant,
            initial_state=initial_state,
            chunk_size=self.chunk_size,
            penalty_chain=str(self.options["penalty_chain"]),
            start=start,
        )
        return o.to(q.dtype), tuple(x.to(q.dtype) for x in state)
