"""PyTorch sequential reference: spec §2.3 and the variants of §2.4, token by token.

This is the *naive* half of flash-linear-attention's naive/chunk split: one Python loop over
tokens, every step the lines of spec §2.3 in that order, batched over ``B`` and ``H`` with
``torch`` ops only, so that autograd differentiates it through ``q, k, v, u`` and the initial
state ``(S, A, z)``.  It runs on any device PyTorch has (``cpu``, ``cuda``).

Precision.  float64 inputs compute in float64; float32, bfloat16 and float16 inputs compute in
float32 (the low precisions are *storage* formats: every product accumulates in float32, as
fla's ``fused_recurrent`` kernels do).  ``o`` and the returned state are cast back to the input
dtype; the state is cast because spec §4 carries it as an ``initial_state`` of the inputs' dtype
(see :func:`vla_verify.spec.check_inputs`), so a low-precision state is rounded once per call.

Independence (spec §4).  Nothing numerical is imported from the oracle or the closed forms:
normalisation, the Sherman–Morrison downdate and the read-out are written here.  The small
helpers of this module (:func:`normalize`, :func:`readout`, :func:`check_tensors`) are shared
with the chunked backend (:mod:`.torch_chunked`), which is checked against this one *and* the
oracle.
"""

from __future__ import annotations

from typing import Any, TypeAlias

import torch

from ..errors import DeviceError, DTypeError, ShapeError
from ..spec import FLOAT_DTYPES, VLAConfig, dtype_name
from .registry import Backend, Capabilities

__all__ = [
    "TorchSequentialBackend",
    "check_tensors",
    "normalize",
    "penalty_step",
    "readout",
    "recurrent",
    "work_dtype",
]

Tensor: TypeAlias = torch.Tensor
State = tuple[Tensor, Tensor, Tensor]

_TORCH_DTYPES: dict[str, torch.dtype] = {
    "float64": torch.float64,
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}


def work_dtype(dtype: torch.dtype) -> torch.dtype:
    """The precision a backend computes in: float64 for float64, float32 for everything else."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def normalize(x: Tensor, eps: float) -> Tensor:
    """``x / max(||x||, eps)`` along the last axis (spec §2.2, ``norm_eps``)."""
    norm = torch.linalg.vector_norm(x, dim=-1, keepdim=True)
    return x / torch.clamp_min(norm, eps)


def readout(read: Tensor, z: Tensor, q: Tensor, config: VLAConfig) -> Tensor:
    """``S q / max(z·q, out_eps)`` (or ``S q``), spec §2.3 last line.

    ``read = S q`` ``[..., dv]``; ``z``, ``q`` ``[..., dk]``.
    """
    if not config.normalize_output:
        return read
    denominator = torch.clamp_min((z * q).sum(-1, keepdim=True), config.out_eps)
    return read / denominator


def check_tensors(
    backend: str,
    capabilities: Capabilities,
    q: Any,
    k: Any,
    v: Any,
    u: Any,
    initial_state: Any,
) -> None:
    """Typed, argument-naming checks a torch backend makes before the registry's generic ones.

    Every input must be a ``torch.Tensor`` (:class:`DTypeError`), on one device
    (:class:`DeviceError`, naming the first argument that differs from ``q``), of a device type
    the backend declares (:class:`DeviceError`) and of a dtype it declares (:class:`DTypeError`).
    """
    arrays: dict[str, Any] = {"q": q, "k": k, "v": v, "u": u}
    if initial_state is not None:
        if not isinstance(initial_state, (tuple, list)) or len(initial_state) != 3:
            raise ShapeError("initial_state", "expected a tuple (S, A, z) or None")
        arrays.update(
            zip(
                ("initial_state.S", "initial_state.A", "initial_state.z"),
                initial_state,
                strict=True,
            )
        )
    for name, x in arrays.items():
        if not isinstance(x, torch.Tensor):
            raise DTypeError(
                name, f"expected a torch.Tensor (backend {backend!r}), got {type(x).__name__}"
            )
    device = q.device
    if device.type not in capabilities.devices:
        raise DeviceError(
            "q",
            f"expected a tensor on one of {capabilities.devices} (backend {backend!r}), "
            f"got device {str(device)!r}",
        )
    for name, x in arrays.items():
        if x.device != device:
            raise DeviceError(
                name, f"expected every input on the device of q ({device}), got {x.device}"
            )
    for name, x in arrays.items():
        got = dtype_name(x)
        if got not in capabilities.dtypes:
            raise DTypeError(
                name,
                f"expected one of the dtypes {capabilities.dtypes} (backend {backend!r}), "
                f"got {got}",
            )


def _default_state(
    B: int, H: int, dk: int, dv: int, config: VLAConfig, dtype: torch.dtype, device: torch.device
) -> State:
    """``S_0 = 0``, ``A_0 = I / lambda0``, ``z_0 = 0`` (spec §2.3)."""
    S = torch.zeros(B, H, dv, dk, dtype=dtype, device=device)
    A = torch.eye(dk, dtype=dtype, device=device).div(config.lambda0).expand(B, H, dk, dk)
    z = torch.zeros(B, H, dk, dtype=dtype, device=device)
    return S, A, z


def _matvec(M: Tensor, x: Tensor) -> Tensor:
    """``M x`` for ``M`` ``[..., m, n]`` and ``x`` ``[..., n]``."""
    return (M @ x.unsqueeze(-1)).squeeze(-1)


def _outer(x: Tensor, y: Tensor) -> Tensor:
    return x.unsqueeze(-1) * y.unsqueeze(-2)


def _dot(x: Tensor, y: Tensor) -> Tensor:
    return (x * y).sum(-1)


def penalty_step(A: Tensor, u: Tensor, t: int, config: VLAConfig, eye: Tensor) -> Tensor:
    """``A_t`` from ``A_{t-1}`` at 0-based global token ``t`` (the call's ``start`` included;
    spec §2.3): the Sherman–Morrison downdate
    ``A − s sᵀ/δ``, ``s = A u``, ``δ = max(1 + uᵀs, sm_floor)`` — i.e. ``A_t = (M_{t-1} +
    u uᵀ)^{-1}`` — then the nudge ``+ nudge_eta·I`` after every ``nudge_period``-th step.

    ``A`` ``[..., dk, dk]``, ``u`` ``[..., dk]``, ``eye`` the ``dk × dk`` identity.  Shared by the
    sequential backend and the chunked one's step-by-step penalty chain (never by the oracle).
    """
    s = _matvec(A, u)
    delta = torch.clamp_min(1 + _dot(u, s), config.sm_floor)
    A = A - _outer(s, s) / delta[..., None, None]
    if config.nudges_at(t + 1):
        A = A + config.nudge_eta * eye
    return A


def recurrent(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    u: Tensor,
    *,
    config: VLAConfig,
    variant: str = "vla",
    initial_state: State | None = None,
    start: int = 0,
) -> tuple[Tensor, State]:
    """The recurrence of spec §2.3 (``vla``) or §2.4 (``rls``, ``delta``, ``linear``), step by step.

    Parameters
    ----------
    q, k, u : ``[B, T, H, dk]``; v : ``[B, T, H, dv]`` — one float dtype, one device.
    config : :class:`~vla_verify.spec.VLAConfig`.
    variant : ``"vla"`` | ``"rls"`` | ``"delta"`` | ``"linear"``.
    initial_state : ``(S [B, H, dv, dk], A [B, H, dk, dk], z [B, H, dk])`` or None for
        ``(0, I/lambda0, 0)``.  For ``rls`` the ``A`` slot holds ``P = (Σ k̂k̂ᵀ + M)^{-1}``;
        ``delta`` and ``linear`` carry ``A`` through unchanged.
    start : tokens consumed before this call (spec §2.3: the nudge clock continues).

    Returns
    -------
    ``o`` ``[B, T, H, dv]`` and ``(S, A, z)`` after the last token, all in the *working* dtype
    (float64 for float64 inputs, float32 otherwise); the caller casts.
    """
    B, T, H, dk = q.shape
    dv = v.shape[-1]
    work = work_dtype(q.dtype)
    q, k, v, u = (x.to(work) for x in (q, k, v, u))
    if initial_state is None:
        S, A, z = _default_state(B, H, dk, dv, config, work, q.device)
    else:
        S, A, z = (x.to(work) for x in initial_state)
    eye = torch.eye(dk, dtype=work, device=q.device)
    eps = config.norm_eps
    outputs = []
    for t in range(T):
        q_t, k_t, v_t, u_t = q[:, t], k[:, t], v[:, t], u[:, t]  # [B, H, D]
        if variant == "vla":
            A = penalty_step(A, u_t, start + t, config, eye)
            k_hat = normalize(k_t, eps)
            alpha = _matvec(A, k_hat)  # the UPDATED A_t (spec §2.3)
            gate = normalize(alpha, eps) if config.normalize_gate else alpha
            S = S + _outer(v_t - _matvec(S, k_hat), gate)
        elif variant == "rls":
            # Rank-2 RLS step: P^{-1} gains k̂k̂ᵀ (plain Sherman–Morrison) and uuᵀ (floored).
            k_hat = normalize(k_t, eps)
            p = _matvec(A, k_hat)
            A = A - _outer(p, p) / (1 + _dot(k_hat, p))[..., None, None]
            s = _matvec(A, u_t)
            delta = torch.clamp_min(1 + _dot(u_t, s), config.sm_floor)
            A = A - _outer(s, s) / delta[..., None, None]
            gain_k = _matvec(A, k_hat)
            gain_u = _matvec(A, u_t)
            # Both corrections use S_{t-1}; summed before they touch S (as the oracle does), since
            # with an indefinite initial P the two terms can be large and nearly cancel.
            S = S + (_outer(v_t - _matvec(S, k_hat), gain_k) - _outer(_matvec(S, u_t), gain_u))
        elif variant == "delta":
            k_hat = normalize(k_t, eps)
            S = S + _outer(v_t - _matvec(S, k_hat), k_hat)
        elif variant == "linear":
            S = S + _outer(v_t, k_t)
        else:  # pragma: no cover - the registry checks the variant
            raise ValueError(variant)
        z = z + k_t
        outputs.append(readout(_matvec(S, q_t), z, q_t, config))
    if T:
        o = torch.stack(outputs, dim=1)
    else:  # pragma: no cover - check_inputs refuses T = 0
        o = q.new_zeros(B, 0, H, dv)
    if A.stride(-1) == 0 or A.stride(0) == 0:  # an expanded default A_0 (delta, linear)
        A = A.contiguous()
    return o, (S, A, z)


class TorchSequentialBackend(Backend):
    """Registry name ``torch``: :func:`recurrent` as a spec §4 callable, differentiable.

    Takes every variant of spec §2.3–§2.4, any nudge period, float64/float32/bfloat16/float16
    tensors on ``cpu`` or ``cuda``.  Returns ``(o, (S, A, z))`` in the inputs' dtype and device.
    """

    name = "torch"
    description = "PyTorch sequential reference, token by token (spec §2.3-§2.4), differentiable"
    capabilities = Capabilities(
        array="torch",
        devices=("cpu", "cuda"),
        dtypes=FLOAT_DTYPES,
        differentiable=True,
        requires=("torch",),
    )

    def _precheck(self, q, k, v, u, initial_state, config):  # type: ignore[no-untyped-def]
        check_tensors(self.name, self.capabilities, q, k, v, u, initial_state)

    def _run(self, q, k, v, u, *, config, initial_state, start=0):  # type: ignore[no-untyped-def]
        o, state = recurrent(
            q,
            k,
            v,
            u,
            config=config,
            variant=self.variant,
            initial_state=initial_state,
            start=start,
        )
        return o.to(q.dtype), tuple(x.to(q.dtype) for x in state)


def torch_dtype(name: str) -> torch.dtype:
    """The ``torch.dtype`` of a dtype name of :data:`vla_verify.spec.FLOAT_DTYPES`."""
    try:
        return _TORCH_DTYPES[name]
    except KeyError:
        raise DTypeError("dtype", f"expected one of {FLOAT_DTYPES}, got {name!r}") from None
