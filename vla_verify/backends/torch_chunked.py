"""PyTorch exact chunked VLA (spec §5): the Woodbury/LDLᵀ penalty chain and the UT state chain.

This is the *chunk* half of flash-linear-attention's naive/chunk split.  The sequence is cut into
chunks of ``C`` tokens (``chunk_size`` ∈ {16, 32, 64}); inside a chunk every token-to-token
dependency is one batched matrix product or one triangular solve, and only the ``T / C``
chunk-to-chunk steps of the state ``S`` remain a Python loop.  Everything is ``torch`` ops, so
autograd differentiates it through ``q, k, v, u`` and the initial state.

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

    Without nudges and from the default ``A_0 = I/lambda0``, ``M = A^{-1}`` at chunk starts is a
    prefix sum, ``M_c = lambda0·I + Σ_{c' < c} U_{c'}ᵀ U_{c'}``, so the chunk-start ``A`` of every
    chunk comes from one batched Cholesky inverse and the whole penalty chain runs in parallel
    across chunks (:func:`_penalty_prefix`).  Otherwise it runs chunk after chunk
    (:func:`_penalty_serial`).

State chain (spec §5, UT/WY form).
    Residuals ``e_t = v_t − S_{t-1} k̂_t`` solve ``(I + N) E = V − K̂ S_0ᵀ`` with
    ``N = tril(K̂ Âᵀ, −1)`` (rows: the transpose of the spec's strictly upper ``N``); then
    ``O = Q S_0ᵀ + tril(Q Âᵀ) E`` (before the read-out normaliser) and ``S_C = S_0 + Eᵀ Â``.
    The unit-triangular solves are done for all chunks at once *before* the loop, against ``V``
    and ``K̂`` (``Ṽ = (I + N)^{-1} V``, ``K̃ = (I + N)^{-1} K̂``), so that each loop step is
    ``E = Ṽ − K̃ S_0ᵀ``, ``O = Q S_0ᵀ + P E``, ``S ← S_0 + Eᵀ Â`` — the structure of fla's
    ``chunk_delta_h`` / ``chunk_o``.

Variants: ``vla`` (above), ``delta`` (``Â = K̂``: no penalty chain), ``linear`` (``E = V``,
``Â = K``: no solve).  ``rls`` is refused (its rank-2 step needs the inverse of a given initial
``P``; use the ``torch`` backend).  Nudges are exact only at chunk boundaries, so a nudge period
that is not a multiple of ``chunk_size`` is refused.

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
``concentrated`` penalties of :mod:`vla_verify.properties.strategies`).  The chain costs
``O(C·dk² + C²·dk)`` per chunk, a fraction of the work, and its float64 error ``u_64·||A_c||``
is far below float32's.  For float64 inputs the effect remains:
``tests/test_torch_backends.py`` records it as a known limitation, and the float64 conformance
run covers the penalty regimes where ``u_tᵀ A u_t`` stays moderate.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ..errors import UnsupportedConfigurationError
from ..spec import FLOAT_DTYPES, Shapes, VLAConfig
from .registry import Backend, Capabilities
from .torch_sequential import check_tensors, normalize, readout, work_dtype

__all__ = ["CHUNK_SIZES", "TorchChunkedBackend", "chunked", "ldl_clamped"]

Tensor = torch.Tensor
State = tuple[Tensor, Tensor, Tensor]

#: Chunk sizes the backend takes (those of fla's chunk kernels).
CHUNK_SIZES: tuple[int, ...] = (16, 32, 64)
#: Variants the chunked form implements (see the module docstring for ``rls``).
CHUNKED_VARIANTS: tuple[str, ...] = ("vla", "delta", "linear")


# -- penalty chain ------------------------------------------------------------------------------


def ldl_clamped(M: Tensor, floor: float) -> tuple[Tensor, Tensor]:
    """``M = L D Lᵀ`` with every pivot clamped, ``d_j = max(d_j, floor)``, column by column.

    ``M`` ``[..., n, n]`` symmetric (only its lower triangle is read).  Returns ``L`` unit lower
    triangular ``[..., n, n]`` and ``d`` ``[..., n]``.  With the clamp this is exactly the chain
    of floored Sherman–Morrison denominators of spec §2.3 (the module docstring), which a plain
    Cholesky factorisation cannot express; it costs ``n`` sequential steps, so it is the fallback
    of :func:`_ldl`, taken only when some pivot is below the floor.
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
    clamped recursion :func:`ldl_clamped`.
    """
    R, info = torch.linalg.cholesky_ex(M)
    diag = R.diagonal(dim1=-2, dim2=-1)
    d = diag * diag
    if bool((info == 0).all()) and bool((d >= floor).all()):
        return R / diag.unsqueeze(-2), d
    return ldl_clamped(M, floor)


def _penalty_chunk(
    A0: Tensor, U: Tensor, K_hat: Tensor, floor: float
) -> tuple[Tensor, Tensor, Tensor]:
    """Gates and chunk-end ``A`` of one chunk (or a batch of chunks), spec §5 penalty chain.

    ``A0`` ``[..., dk, dk]``; ``U``, ``K_hat`` ``[..., C, dk]``.  Returns the un-normalised gates
    ``α`` ``[..., C, dk]`` (row t is ``(A_t k̂_t)ᵀ``, without the nudge), ``A_C`` ``[..., dk, dk]``
    and the pivots ``d`` ``[..., C]``.
    """
    Y = U @ A0.mT  # row t: (A_0 u_t)ᵀ
    G = U @ Y.mT  # G[t, j] = u_tᵀ A_0 u_j
    # Symmetrise from the lower triangle: the recurrence only forms u_tᵀ A_0 u_j for j ≤ t, and
    # Cholesky's backward assumes a symmetric argument (a non-symmetric A_0 would otherwise get a
    # gradient split over entries the forward never read).
    lower = torch.tril(G)
    eye = torch.eye(G.shape[-1], dtype=G.dtype, device=G.device)
    L, d = _ldl(eye + lower + torch.tril(G, -1).mT, floor)
    W = torch.linalg.solve_triangular(L, Y, upper=False, unitriangular=True)  # rows w_jᵀ
    W_scaled = W / d.unsqueeze(-1)
    # α_tᵀ = k̂_tᵀ A_0ᵀ − Σ_{j≤t} (k̂_tᵀ w_j / d_j) w_jᵀ: causal mask including the diagonal,
    # since α_t is formed from the UPDATED A_t (spec §2.3).
    alpha = K_hat @ A0.mT - torch.tril(K_hat @ W_scaled.mT) @ W
    A_end = A0 - W.mT @ W_scaled
    return alpha, A_end, d


def _penalty_prefix(
    U: Tensor, K_hat: Tensor, config: VLAConfig
) -> tuple[Tensor, Tensor, Tensor] | None:
    """All chunks at once from ``A_0 = I/lambda0`` without nudges (spec §5, last sentence).

    ``U``, ``K_hat`` ``[B, H, NC, C, dk]``.  ``M_c = lambda0·I + Σ_{c'<c} U_{c'}ᵀ U_{c'}`` is an
    exclusive prefix sum over chunks; ``A_c = M_c^{-1}`` by one batched Cholesky inverse.  Returns
    ``(α [B, H, NC, C, dk], A_T [B, H, dk, dk], d)`` or ``None`` when a pivot falls below
    ``sm_floor`` (then ``A`` is not ``M^{-1}`` and the caller runs the serial chain).
    """
    dk = U.shape[-1]
    gram = U.mT @ U  # [B, H, NC, dk, dk]
    # Exclusive prefix sum by shifting, never cumsum − gram: that difference cancels, and its
    # rounding error (u·||Σ U Uᵀ||) would swamp lambda0.
    prefix = torch.cumsum(gram, dim=2)
    prefix = torch.cat([torch.zeros_like(prefix[:, :, :1]), prefix[:, :, :-1]], dim=2)
    M = config.lambda0 * torch.eye(dk, dtype=U.dtype, device=U.device) + prefix
    # A = M^{-1} = R^{-T} R^{-1} from the Cholesky factor R; a batched triangular solve is much
    # faster on CPU than cholesky_inverse, which runs one LAPACK potri per matrix.
    R = torch.linalg.cholesky(M)
    eye = torch.eye(dk, dtype=M.dtype, device=M.device).expand_as(M)
    R_inv = torch.linalg.solve_triangular(R, eye, upper=False)
    A_start = R_inv.mT @ R_inv
    alpha, A_end, d = _penalty_chunk(A_start, U, K_hat, config.sm_floor)
    if not bool((d >= config.sm_floor).all()):
        return None
    return alpha, A_end[:, :, -1], d


def _penalty_serial(
    A0: Tensor, U: Tensor, K_hat: Tensor, config: VLAConfig, T: int
) -> tuple[Tensor, Tensor]:
    """The penalty chain chunk after chunk from any ``A_0``, nudging at chunk ends.

    ``A0`` ``[B, H, dk, dk]``; ``U``, ``K_hat`` ``[B, H, NC, C, dk]``; ``T`` the unpadded length
    (a nudge fires after global step ``e`` when ``e % nudge_period == 0`` and ``e ≤ T``).
    Returns ``α`` ``[B, H, NC, C, dk]`` and the final ``A``.
    """
    NC, C = U.shape[2], U.shape[3]
    A = A0
    gates = []
    for c in range(NC):
        alpha, A, _ = _penalty_chunk(A, U[:, :, c], K_hat[:, :, c], config.sm_floor)
        end = (c + 1) * C
        if end <= T and config.nudges_at(end):
            eye = torch.eye(A.shape[-1], dtype=A.dtype, device=A.device)
            A = A + config.nudge_eta * eye
            # The last token of the chunk reads the nudged A (α_t uses the updated A_t).
            last = torch.zeros(C, 1, dtype=A.dtype, device=A.device)
            last[-1] = config.nudge_eta
            alpha = alpha + last * K_hat[:, :, c]
        gates.append(alpha)
    return torch.stack(gates, dim=2), A


# -- state chain --------------------------------------------------------------------------------


def _state_chain(
    S0: Tensor, K_hat: Tensor | None, gate: Tensor, V: Tensor, Q: Tensor
) -> tuple[Tensor, Tensor]:
    """The UT/WY state chain of spec §5 (module docstring).

    ``S0`` ``[B, H, dv, dk]``; ``K_hat``, ``gate``, ``Q`` ``[B, H, NC, C, dk]``; ``V``
    ``[B, H, NC, C, dv]``.  ``K_hat=None`` means no delta-rule correction (linear attention:
    ``E = V``).  Returns ``S Q`` per token ``[B, H, NC, C, dv]`` and the final ``S``.
    """
    if K_hat is not None:
        # (I + N) with N[t, i] = k̂_tᵀ α̂_i for i < t; the unit diagonal is implicit.
        N = torch.tril(K_hat @ gate.mT, -1)
        V_t = torch.linalg.solve_triangular(N, V, upper=False, unitriangular=True)
        K_t = torch.linalg.solve_triangular(N, K_hat, upper=False, unitriangular=True)
    else:
        V_t, K_t = V, None
    P = torch.tril(Q @ gate.mT)  # P[t, i] = α̂_iᵀ q_t for i ≤ t
    S = S0
    outputs = []
    for c in range(V.shape[2]):
        E = V_t[:, :, c] if K_t is None else V_t[:, :, c] - K_t[:, :, c] @ S.mT  # [B, H, C, dv]
        outputs.append(Q[:, :, c] @ S.mT + P[:, :, c] @ E)
        S = S + E.mT @ gate[:, :, c]
    return torch.stack(outputs, dim=2), S


# -- the chunked algorithm ----------------------------------------------------------------------


def _to_chunks(x: Tensor, C: int) -> Tensor:
    """``[B, T, H, D]`` → ``[B, H, NC, C, D]``, the last chunk zero-padded."""
    B, T, H, D = x.shape
    NC = math.ceil(T / C)
    x = x.transpose(1, 2)
    if NC * C != T:
        x = torch.nn.functional.pad(x, (0, 0, 0, NC * C - T))
    return x.reshape(B, H, NC, C, D)


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
) -> tuple[Tensor, State]:
    """VLA by the exact chunked forms of spec §5 (module docstring).

    Parameters
    ----------
    q, k, u : ``[B, T, H, dk]``; v : ``[B, T, H, dv]`` — one float dtype, one device.
    config : :class:`~vla_verify.spec.VLAConfig`; ``nudge_period`` must be None or a multiple of
        ``chunk_size`` (not checked here: :meth:`TorchChunkedBackend.check_support` does).
    variant : ``"vla"`` | ``"delta"`` | ``"linear"``.
    initial_state : ``(S [B, H, dv, dk], A [B, H, dk, dk], z [B, H, dk])`` or None for
        ``(0, I/lambda0, 0)``.  ``delta`` and ``linear`` carry ``A`` through unchanged.
    chunk_size : ``C``, tokens per chunk.

    Returns
    -------
    ``o`` ``[B, T, H, dv]`` and ``(S, A, z)``, in the working dtype (float64 for float64 inputs,
    float32 otherwise); the caller casts.
    """
    B, T, H, dk = q.shape
    dv = v.shape[-1]
    work = work_dtype(q.dtype)
    q, k, v, u = (x.to(work) for x in (q, k, v, u))
    if initial_state is None:
        S0 = q.new_zeros(B, H, dv, dk)
        A0 = torch.eye(dk, dtype=work, device=q.device).div(config.lambda0).expand(B, H, dk, dk)
        z0 = q.new_zeros(B, H, dk)
    else:
        S0, A0, z0 = (x.to(work) for x in initial_state)
    eps = config.norm_eps
    C = chunk_size

    k_hat = normalize(k, eps)
    Kc, Qc, Vc = _to_chunks(k_hat, C), _to_chunks(q, C), _to_chunks(v, C)
    A_final = A0
    if variant == "vla":
        # The penalty chain runs in float64 whatever the working precision (module docstring,
        # "Precision"): its Woodbury form cancels at the scale of the chunk-start A.
        Uc, Kc64, A0_64 = _to_chunks(u, C).double(), Kc.double(), A0.double()
        prefix = None
        if initial_state is None and not any(config.nudges_at(t) for t in _chunk_ends(T, C)):
            prefix = _penalty_prefix(Uc, Kc64, config)
        if prefix is not None:
            alpha, A_final, _ = prefix
        else:
            alpha, A_final = _penalty_serial(A0_64, Uc, Kc64, config, T)
        gate = normalize(alpha, eps) if config.normalize_gate else alpha
        gate, A_final = gate.to(work), A_final.to(work)
        reads, S = _state_chain(S0, Kc, gate, Vc, Qc)
    elif variant == "delta":
        reads, S = _state_chain(S0, Kc, Kc, Vc, Qc)
    elif variant == "linear":
        reads, S = _state_chain(S0, None, _to_chunks(k, C), Vc, Qc)
    else:  # pragma: no cover - check_support refuses it
        raise ValueError(variant)

    reads = reads.reshape(B, H, -1, dv)[:, :, :T].transpose(1, 2)  # [B, T, H, dv]
    z = z0.unsqueeze(1) + torch.cumsum(k, dim=1)  # z_t for every t: [B, T, H, dk]
    o = readout(reads, z, q, config)
    if A_final.stride(-1) == 0 or A_final.stride(0) == 0:  # the expanded default A_0
        A_final = A_final.contiguous()
    return o, (S, A_final, z[:, -1])


def _chunk_ends(T: int, C: int) -> range:
    """Global steps that end a full chunk (where a nudge may fire)."""
    return range(C, T + 1, C)


class TorchChunkedBackend(Backend):
    """Registry name ``torch_chunked``: :func:`chunked` as a spec §4 callable, differentiable.

    Option ``chunk_size`` (16, 32 or 64; default 64).  Variants ``vla``, ``delta``, ``linear``;
    ``nudge_period`` None or a multiple of ``chunk_size``.  float64/float32/bfloat16/float16
    tensors on ``cpu`` or ``cuda``; returns ``(o, (S, A, z))`` in the inputs' dtype and device.
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
        options={"chunk_size": 64},
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

    @property
    def chunk_size(self) -> int:
        return int(self.options["chunk_size"])

    def _nudge_reason(self, config: VLAConfig) -> str | None:
        period = config.nudge_period
        if period is not None and period % self.chunk_size:
            return (
                f"nudge_period={period} is not a multiple of chunk_size={self.chunk_size}: "
                "the chunked form is exact only with nudges at chunk boundaries (spec §5); use "
                "a nudge_period that is a multiple of the chunk size, None, or the 'torch' backend"
            )
        return None

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
        if reason is not None:
            if (variant or self.variant) == "rls":
                reason += (
                    "; rls has a rank-2 step whose chunked form needs the inverse of a given "
                    "initial P: use the 'torch' backend"
                )
            return reason
        return self._nudge_reason(config)

    def _precheck(self, q, k, v, u, initial_state, config):  # type: ignore[no-untyped-def]
        check_tensors(self.name, self.capabilities, q, k, v, u, initial_state)
        reason = self._nudge_reason(config)
        if reason is not None:
            raise UnsupportedConfigurationError(self.name, reason, argument="config.nudge_period")

    def _run(self, q, k, v, u, *, config, initial_state):  # type: ignore[no-untyped-def]
        o, state = chunked(
            q,
            k,
            v,
            u,
            config=config,
            variant=self.variant,
            initial_state=initial_state,
            chunk_size=self.chunk_size,
        )
        return o.to(q.dtype), tuple(x.to(q.dtype) for x in state)
