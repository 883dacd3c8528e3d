"""Registry backend ``triton_fused``: the fused recurrent Triton kernel of spec §2.3, trainable.

- :func:`fused_recurrent_vla` — the functional API: ``(o, (S, A, z))`` from ``q, k, u``
  ``[B, T, H, dk]`` and ``v`` ``[B, T, H, dv]`` (spec §1 layouts), differentiable in
  ``q, k, v, u`` and the initial state through :class:`FusedRecurrentVLAFunction`.
- :class:`TritonFusedBackend` — the same as a spec §4 callable in the registry.

Every kernel launch runs all T steps of every (batch, head) (kernels and their organisation:
:mod:`vla_verify.backends.triton_fused_kernels`).  Two schedules (option ``schedule``): *fused*,
one launch for the whole step, and *two-pass*, a gate kernel (the penalty chain, one program per
(b, h)) then a state kernel (value rows split over programs) — the same operations cut at the
gate, faster at dk = 128 and for training (``docs/design/triton_recurrent.md``).
The two-pass gate pass either steps through the tokens (default) or, with ``gate="chunked"``,
takes chunks of tokens in the Woodbury/LDLᵀ form of spec §5
(:mod:`vla_verify.backends.triton_chunk_gate_kernels`; correct, slower on the H200 so far).

Inputs may be float32, bfloat16 or float16 (accumulated in float32) or float64 (accumulated in
float64, useful to separate algorithm from rounding); the output ``o`` has the inputs' dtype,
the returned state the accumulation dtype (the registry backend casts it back to the inputs'
dtype, as spec §4 expects).

The backward stores a checkpoint of ``(S, A, z)`` every ``checkpoint_every`` tokens in the
forward (memory ``B·H·⌈T/C⌉·(dk² + dv·dk + dk)`` floats, not a T-long history) and recomputes
each chunk from its checkpoint (two-pass: the gate pass of one segment of tokens at a time).

Without a CUDA GPU the same kernels run on CPU tensors through Triton's interpreter, which must
be switched on (``TRITON_INTERPRET=1``) before Triton is first imported.
"""

from __future__ import annotations

import os
from typing import Any

import torch
import triton
import triton.language as tl

from ..errors import DeviceError, DTypeError, UnsupportedConfigurationError
from ..spec import VLAConfig, check_inputs
from . import triton_chunk_gate_kernels as chunk_kernels
from . import triton_fused_kernels as kernels
from .registry import Backend, Capabilities, refuse_shifted_clock

__all__ = [
    "DOWNDATES",
    "GATES",
    "MAX_HEAD_DIM",
    "PLANTED_BUGS",
    "SCHEDULES",
    "FusedRecurrentVLAFunction",
    "TritonFusedBackend",
    "availability_reason",
    "fused_recurrent_vla",
    "interpreted",
]

#: Largest dk and dv: A [dk, dk] and a block of S live in registers for the whole sequence.
MAX_HEAD_DIM = 128
_DTYPES = ("float32", "bfloat16", "float16", "float64")
_NEVER = 2**31 - 1  # nudge period meaning "never" (t + 1 < 2**31 for any T we can hold)
_NAME = "triton_fused"

#: The forward's Sherman–Morrison downdate variants (kernel constexpr ``DOWNDATE``).
DOWNDATES: dict[str, int] = {"exact": kernels.DOWNDATE_EXACT, "fma": kernels.DOWNDATE_FMA}

#: Planted bugs for the meta-tests (``planted_bug=`` of :func:`fused_recurrent_vla`).
PLANTED_BUGS: dict[str, int] = {
    "gate_from_previous_A": kernels.BUG_GATE_FROM_OLD_A,
    "nudge_one_step_late": kernels.BUG_NUDGE_ONE_STEP_LATE,
    "backward_drops_dk_term": kernels.BUG_DK_SIGN,
    "fold_drops_nudges": kernels.BUG_FOLD_DROPS_NUDGES,
}


def interpreted() -> bool:
    """Whether the kernels were built for Triton's CPU interpreter (``TRITON_INTERPRET=1`` was
    set when Triton decorated them)."""
    return type(kernels.vla_fwd_kernel).__name__ == "InterpretedFunction"


def availability_reason() -> str | None:
    """``None`` if the kernels can run here, else why not."""
    if torch.cuda.is_available() or interpreted():
        return None
    if os.environ.get("TRITON_INTERPRET") == "1":
        return (
            "no CUDA GPU, and TRITON_INTERPRET=1 was set only after Triton had built the "
            "kernels; set it before the first import of triton"
        )
    return "no CUDA GPU and TRITON_INTERPRET is not set (TRITON_INTERPRET=1 runs it on CPU)"


def _pow2(n: int) -> int:
    return max(16, triton.next_power_of_2(n))


def _acc(dtype: torch.dtype) -> tuple[torch.dtype, Any]:
    if dtype == torch.float64:
        return torch.float64, tl.float64
    return torch.float32, tl.float32


_PARAMS: dict[tuple[Any, ...], torch.Tensor] = {}


def _params(config: VLAConfig, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """The configuration scalars as a device tensor, made once per (config, dtype, device):
    a host-to-device copy per call sat on the GPU timeline and in the host time before the
    first launch.  The kernels only read it."""
    values = (config.lambda0, config.sm_floor, config.nudge_eta, config.out_eps, config.norm_eps)
    key = (values, dtype, device)
    if key not in _PARAMS:
        if len(_PARAMS) > 64:  # many configs (a property search): do not grow without bound
            _PARAMS.clear()
        _PARAMS[key] = torch.tensor(values, dtype=dtype, device=device)
    return _PARAMS[key]


def _default_block_v(
    B: int,
    H: int,
    dk: int,
    dv: int,
    device: torch.device,
    two_pass: bool = False,
    stream: bool = False,
) -> int:
    """Value rows per program: split dv until B·H·NV programs fill the SMs (with ``stream``,
    B·H·(1 + NV): the streamed forward's gate programs run beside them, and a gate program that
    shares its SM with a state program is slowed: D = 128, T = 4096 on the H200, streamed kernel
    7.92 ms with NV = 8, 144 programs on 132 SMs, against 6.53 ms with NV = 4, both with the
    since-dropped shifted nudge; ``results/h200/stream/profile_579b46f.json``).

    Fused: each program redoes the dk×dk penalty chain, which costs no wall time while SMs
    would otherwise idle.  Not below 32 rows when dk > 64: on the H200 (Triton 3.6) the
    BK = 128 fused forward with 16 rows compiled to a spilling kernel, 129 ms against 19.4 ms
    with 32 rows at T = 4096 (``fused.json`` of commit ``59890ab``, ``tuning``).  Two-pass:
    the state pass holds no ``A``, so 16 rows are always allowed."""
    bv = _pow2(dv)
    if device.type != "cuda" or interpreted():
        return bv
    least = 32 if dk > 64 and not two_pass else 16
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    gates = B * H if stream else 0
    while bv > least and gates + B * H * triton.cdiv(dv, bv // 2) <= sms:
        bv //= 2
    return bv


def _default_warps(bk: int, bv: int) -> int:
    """Warps per fused forward program, from the H200 A/B (benchmarks/results/h200/variants.json):
    the step is a chain of dependent reductions, and fewer warps mean cheaper cross-warp
    exchanges.  At dk = 128, 4 warps (128 ``A`` entries per thread, a few spilled registers)
    measured 19.4 ms at T = 4096 against 352 ms with 8 warps (``fused.json`` of ``59890ab``)."""
    return 4 if bk * (bk + bv) > 64 * (64 + 64) else 2


def _default_gate_warps(bk: int) -> int:
    """Warps of the two-pass gate kernel, which holds only ``Aᵀ`` ``[BK, BK]``.

    From the SASS of Triton 3.9 for sm_90 (docs/design/triton_recurrent.md): at BK = 128, 4 warps
    compile to 232 registers and no spills (1388 instructions per token), where 8 warps spill
    (779 ``STL`` per token) and 16 spill less but run 4x the threads; BK = 64 takes 2 warps."""
    return max(2, bk * bk // 4096)


#: Row block of the chunked gate kernel's A scratch: with whole [64, 64] float64 tiles of A,
#: Triton 3.6 / ptxas compiled the kernel to 56 registers and ~5000 spill instructions per chunk
#: (offline SASS, benchmarks/gpu/offline_sass.py); with [32, BK] blocks, 255 and ~300.
_CHUNK_GATE_ROWS = 32


def _default_gate_chunk(bk: int) -> int:
    """Tokens per chunk of the chunked gate kernel: 16, the faster of 16 and 32 on the H200 at
    dk = 64 and 128 (``benchmarks/results/h200/chunk_gate.json``: 7.2 against 9.9 ms and 15.0
    against 27.6 ms at T = 4096)."""
    return 16


def _default_chunk_gate_warps(bk: int) -> int:
    """Warps of the chunked gate kernel: 8, faster than 4 at dk = 64 and 128 with chunks of 16
    (``chunk_gate.json``: 7.2 against 7.4 ms, 15.0 against 17.7 ms at T = 4096)."""
    return 8


def _default_state_warps(bk: int, bv: int) -> int:
    """Warps of the two-pass state kernel (``Sᵀ`` ``[BK, BV]``, 16 entries per thread, at most 4
    warps): at BK = 128, BV = 16, 4 warps measured 1.95 ms against 2.25 ms with 2 at T = 4096
    (``benchmarks/results/h200/two_pass_sweep.json``)."""
    return max(1, min(4, bk * bv // 512))


#: Forward schedules (option ``schedule``; :func:`fused_recurrent_vla`).
SCHEDULES: tuple[str, ...] = ("auto", "fused", "two_pass")
#: The two-pass forward's gate pass (option ``gate`` of :func:`fused_recurrent_vla`).
GATES: tuple[str, ...] = ("recurrent", "chunked")


def _two_pass(schedule: str) -> bool:
    """Whether ``schedule`` runs the two-pass kernels: ``auto`` always does.  Session 3 kept the
    fused forward for dk ≤ 64 (6.4 against 9.1 ms at T = 4096 on the H200); with the pipelined,
    split-sum gate the two-pass forward is faster there too (5.5-5.7 against 6.3 ms,
    ``benchmarks/results/h200/two_pass_sweeps/run5_c26525f.json``), and forward + backward was
    already faster two-pass (15.8 against 19.9 ms at T = 2048)."""
    return schedule in ("two_pass", "auto")


def _check_run(q: torch.Tensor, v: torch.Tensor) -> None:
    name = str(q.dtype).removeprefix("torch.")
    if name not in _DTYPES:
        raise DTypeError("q", f"triton_fused takes {_DTYPES}, got {name}")
    if q.device.type == "cpu" and not interpreted():
        raise DeviceError(
            "q",
            "CPU tensors need Triton's interpreter: set TRITON_INTERPRET=1 before importing "
            "triton, or move the inputs to a CUDA device",
        )
    if q.device.type not in ("cpu", "cuda"):
        raise DeviceError("q", f"expected a CUDA (or, interpreted, CPU) tensor, got {q.device}")
    for arg, d in (("q", q.shape[-1]), ("v", v.shape[-1])):
        if d > MAX_HEAD_DIM:
            raise UnsupportedConfigurationError(
                _NAME,
                f"head dim {d} > {MAX_HEAD_DIM}: A [dk, dk] and S must fit in one program's "
                "registers for the whole sequence",
                argument=arg,
            )


def _forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    u: torch.Tensor,
    state0: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None,
    config: VLAConfig,
    *,
    save_checkpoints: bool,
    checkpoint_every: int,
    block_v: int | None,
    num_warps: int | None,
    bug: int,
    downdate: int = 0,
    schedule: str = "auto",
    gate_num_warps: int | None = None,
    forward_segment: int | None = None,
    pipeline_gate: bool = True,
    split_sums: int | None = 1,
    overlap_passes: bool | None = None,
    nudge_branch: bool | None = None,
    split_after_load: bool | None = None,
    gate: str = "recurrent",
    gate_chunk: int | None = None,
    stream_passes: bool | None = None,
    key_ahead: bool = True,
    period_loop: bool | None = None,
    nudge_scalar: bool | None = None,
) -> tuple[torch.Tensor, tuple[torch.Tensor, ...], tuple[torch.Tensor, ...] | None]:
    B, T, H, dk = q.shape
    dv = v.shape[-1]
    acc, acc_tl = _acc(q.dtype)
    dev = q.device
    two_pass = _two_pass(schedule)
    # float64 inputs keep the recurrent gate: the chunked chain is float64 too, and its
    # Woodbury rounding u·‖A_0‖ is not within the float64 recurrence's u·‖A_{t-1}‖ budget
    chunked_gate = two_pass and gate == "chunked" and q.dtype != torch.float64
    # tl.dot needs every dimension >= 16: the chunked gate pads dk to 16 (the state pass follows)
    bk = max(16, _pow2(dk)) if chunked_gate else _pow2(dk)
    # One launch in which the state programs follow the gate programs (vla_stream_kernel);
    # otherwise the passes one after the other, or overlapped by segments on two streams.
    stream = two_pass and _stream(stream_passes) and not chunked_gate
    bv = block_v if block_v is not None else _default_block_v(B, H, dk, dv, dev, two_pass, stream)
    nv = triton.cdiv(dv, bv)
    o = torch.empty(B, T, H, dv, dtype=q.dtype, device=dev)
    sT = torch.empty(B, H, dv, dk, dtype=acc, device=dev)
    aT = torch.empty(B, H, dk, dk, dtype=acc, device=dev)
    zT = torch.empty(B, H, dk, dtype=acc, device=dev)
    nc = triton.cdiv(T, checkpoint_every)
    if save_checkpoints:
        # Two-pass: Sᵀ checkpoints, and A, z with one more slot for the final state (the
        # penalty adjoint walks each chunk back from the next checkpoint).
        slots = nc + 1 if two_pass else nc
        ck = (
            torch.empty(
                (B, H, nc, dk, dv) if two_pass else (B, H, nc, dv, dk), dtype=acc, device=dev
            ),
            torch.empty(B, H, slots, dk, dk, dtype=acc, device=dev),
            torch.empty(B, H, slots, dk, dtype=acc, device=dev),
        )
    else:
        ck = None
    s0, a0, z0 = state0 if state0 is not None else (sT, aT, zT)  # unused pointers when absent
    cks, cka, ckz = ck if ck is not None else (sT, aT, zT)
    params = _params(config, acc, dev)
    flags = {"HAS_INIT": state0 is not None, "SAVE_CKPT": save_checkpoints, "ACC": acc_tl}
    if not two_pass:
        kernels.vla_fwd_kernel[(nv, B * H)](
            q, k, v, u, o, s0, a0, z0, sT, aT, zT, cks, cka, ckz, params,
            T, H, dk, dv, config.nudge_period or _NEVER, checkpoint_every, nc,
            BK=bk, BV=bv, NORM_GATE=config.normalize_gate, NORM_OUT=config.normalize_output,
            BUG=bug, DOWNDATE=downdate, num_warps=num_warps or _default_warps(bk, bv), **flags,
        )  # fmt: skip
        return o, (sT, aT, zT), ck
    # Two passes (spec §2.3 split at the gate): per token k̂, α̂ [BK] and (α̂ᵀq, z_tᵀq) go
    # through global memory, (B·H·L·(2·BK + 2)) floats for a segment of L tokens, which the state
    # pass reads back; segments (of whole checkpoint chunks) keep that under _FORWARD_FLOATS, the
    # state carried between them exactly (accumulation dtype).  These kernels keep every matrix
    # transposed in memory (triton_fused_kernels, module docstring).
    s_in, a_in = (s0.mT.contiguous(), a0.mT.contiguous()) if state0 is not None else (sT, aT)
    z_in = z0
    # On a GPU the state pass of segment i runs on a side stream beside the gate pass of
    # segment i + 1 (the gate pass holds B·H SMs, the state pass NV·B·H more): the forward then
    # costs about the gate pass plus one segment's state pass, not the sum of the two.
    split_after_load = _split_after_load(split_after_load, _pow2(dk))
    overlap = (
        not stream
        and _overlap(overlap_passes, split_after_load, save_checkpoints)
        and dev.type == "cuda"
    )
    seg = forward_segment or max(1, _FORWARD_FLOATS // (B * H * (2 * bk + 2)))
    if overlap and forward_segment is None:
        seg = min(seg, triton.cdiv(T, _OVERLAP_SEGMENTS))
    seg = T if seg >= T else max(checkpoint_every, seg // checkpoint_every * checkpoint_every)
    if chunked_gate:
        chunk = gate_chunk or _default_gate_chunk(bk)
        bkb = min(bk, _CHUNK_GATE_ROWS)
        # float64 scratch: A (two buffers), and the chunk's U, k̂, W
        a_scr = torch.empty(B * H, 2, bk, bk, dtype=torch.float64, device=dev)
        w_scr = torch.empty(B * H, 3, chunk, bk, dtype=torch.float64, device=dev)
    main = side = None
    if overlap and seg < T:
        main = torch.cuda.current_stream(dev)
        side = _side_stream(dev)
        side.wait_stream(main)  # the inputs, o and the checkpoints are ready
    for t_begin in range(0, T, seg):
        n = min(seg, T - t_begin)
        sTt = torch.empty(B, H, dk, dv, dtype=acc, device=dev)
        aTt = torch.empty(B, H, dk, dk, dtype=acc, device=dev)
        z_out = torch.empty(B, H, dk, dtype=acc, device=dev)
        cks, cka, ckz = ck if ck is not None else (sTt, aTt, z_out)
        kh = torch.empty(B * H, n, bk, dtype=acc, device=dev)
        ah = torch.empty(B * H, n, bk, dtype=acc, device=dev)
        sc = torch.empty(B * H, n, 2, dtype=acc, device=dev)
        init = {**flags, "HAS_INIT": state0 is not None or t_begin > 0}
        scalar = _nudge_scalar(nudge_scalar, bk, stream)
        gate_flags = {
            "NORM_GATE": config.normalize_gate, "BUG": bug, "DOWNDATE": downdate,
            "PIPELINE": pipeline_gate and bug != kernels.BUG_GATE_FROM_OLD_A,
            "KEY_AHEAD": key_ahead and pipeline_gate and bug != kernels.BUG_GATE_FROM_OLD_A,
            # the scalar shift removes the select the period loop avoids: it takes precedence
            "PERIOD_LOOP": _period_loop(period_loop, bk, save_checkpoints) and not scalar
            and key_ahead and pipeline_gate and bug != kernels.BUG_GATE_FROM_OLD_A,
            "SPLIT": _gate_split(
                split_sums,
                bk,
                # the streamed kernel keeps its split sums while it stores checkpoints:
                # forward + backward at dk = 128, T = 4096 51.5 -> 49.1 ms (the checkpointed
                # forward 8.83 -> 6.37 ms; stream/backward_08c8bde.json)
                (init["HAS_INIT"] or (save_checkpoints and not stream)) and not split_after_load,
            ),
            "LOAD_PLAIN": split_after_load,
            "NUDGE_BRANCH": _nudge_branch(nudge_branch, scalar, bk),
        }  # fmt: skip
        if stream:
            # [0]: the ticket that assigns roles; [1:]: tokens done per (b, h); both start at 0
            counters = torch.zeros(1 + B * H, dtype=torch.int32, device=dev)
            kernels.vla_stream_kernel[(B * H * (1 + nv),)](
                q, k, v, u, o, kh, ah, sc, a_in, z_in, s_in, aTt, z_out, sTt, cka, ckz, cks,
                params, counters, counters[1:], T, H, dk, dv, config.nudge_period or _NEVER,
                checkpoint_every, nc, t_begin, n, dk, B * H, nv,
                BK=bk, BV=bv, NORM_OUT=config.normalize_output, BLOCK_T=_STREAM_BLOCK,
                num_warps=gate_num_warps or _default_gate_warps(bk), **gate_flags, **init,
            )  # fmt: skip
            s_in, a_in, z_in = sTt, aTt, z_out
            continue
        if chunked_gate:
            chunk_kernels.vla_gate_chunk_kernel[(B * H,)](
                q, k, u, kh, ah, sc, a_in, z_in, aTt, z_out, cka, ckz, a_scr, w_scr, params,
                T, H, dk, config.nudge_period or _NEVER, checkpoint_every, nc, t_begin, n,
                BK=bk, C=chunk, LOG2C=chunk.bit_length() - 1, BKB=bkb,
                NORM_GATE=config.normalize_gate, BUG=bug,
                num_warps=gate_num_warps or _default_chunk_gate_warps(bk), **init,
            )  # fmt: skip
        else:
            kernels.vla_gate_kernel[(B * H,)](
                q, k, u, kh, ah, sc, kh, sc, a_in, z_in, aTt, z_out, cka, ckz, params,
                T, H, dk, config.nudge_period or _NEVER, checkpoint_every, nc, t_begin, n, dk,
                BK=bk, SAVE_CHAIN=False, num_warps=gate_num_warps or _default_gate_warps(bk),
                **gate_flags, **init,
            )  # fmt: skip
        with _on_stream(side, after=main):
            kernels.vla_state_kernel[(nv, B * H)](
                q, v, kh, ah, sc, o, s_in, sTt, cks, params, T, H, dk, dv, checkpoint_every, nc,
                t_begin, n, BK=bk, BV=bv, NORM_OUT=config.normalize_output,
                num_warps=num_warps or _default_state_warps(bk, bv), **init,
            )  # fmt: skip
        if side is not None:  # these die on the main stream while the side stream reads them
            for x in (kh, ah, sc, sTt):
                x.record_stream(side)
        s_in, a_in, z_in = sTt, aTt, z_out
    if side is not None:
        main.wait_stream(side)
    zT = z_in
    # The final S and A as transposed views of the kernels' buffers (which hold them
    # transposed), not copies: no copy kernels in the forward's fixed cost.
    return o, (s_in.mT, a_in.mT, zT), ck


_Grads = tuple[torch.Tensor, ...]


def _backward_fused(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    u: torch.Tensor,
    ck: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    do: torch.Tensor,
    final: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    config: VLAConfig,
    options: dict[str, Any],
) -> _Grads:
    """One program per (b, h) for the whole adjoint (:func:`kernels.vla_bwd_kernel`).  Returns
    ``dq, dk, dv, du`` (inputs' dtype) and ``dS_0, dA_0, dz_0`` (accumulation dtype)."""
    B, T, H, dk = q.shape
    dv = v.shape[-1]
    acc, acc_tl = _acc(q.dtype)
    dev = q.device
    bk, bv = _pow2(dk), _pow2(dv)
    every = options["checkpoint_every"]
    dq, dk_, du = (torch.empty_like(x) for x in (q, k, u))
    dv_ = torch.empty_like(v)
    ds0 = torch.empty(B, H, dv, dk, dtype=acc, device=dev)
    da0 = torch.empty(B, H, dk, dk, dtype=acc, device=dev)
    dz0 = torch.empty(B, H, dk, dtype=acc, device=dev)
    # Per-program scratch of one chunk's per-token vectors (k̂, s, α̂ | e) and scalars.
    vec = torch.empty(B * H, every, 3 * bk + bv, dtype=acc, device=dev)
    sc = torch.empty(B * H, every, 8, dtype=acc, device=dev)
    kernels.vla_bwd_kernel[(B * H,)](
        q, k, v, u, do, *final, *ck, vec, sc, dq, dk_, dv_, du, ds0, da0, dz0,
        _params(config, acc, dev), T, H, dk, dv, config.nudge_period or _NEVER, every,
        triton.cdiv(T, every),
        BK=bk, BV=bv, HAS_DFINAL=True, NORM_GATE=config.normalize_gate,
        NORM_OUT=config.normalize_output, ACC=acc_tl, BUG=options["bug"],
        DOWNDATE=options["downdate"],
        num_warps=options["bwd_num_warps"] or (16 if bk >= 128 else 8 if bk >= 64 else 4),
    )  # fmt: skip
    return dq, dk_, dv_, du, ds0, da0, dz0


def _gate_split(split_sums: int | None, bk: int, tile_io: bool) -> int:
    """The gate kernel's ``SPLIT``: ``split_sums`` (at most BK), but 1 when the kernel loads or
    stores the ``A`` tile (a given initial state, a later forward segment, the backward's rerun,
    checkpoints).  On the H200 (Triton 3.6) the split loop compiled beside a tile load ran 20-50x
    slower than with an in-register ``A_0 = I/lambda0`` (gate kernel at T = 4096, dk = 64: 70.8
    against 3.6 ms; ``two_pass_sweeps/run5_c26525f.json``), and beside the checkpoint stores
    (forward + backward at T = 1024, dk = 64, one segment: 18.1 against 8.7 ms with segments,
    ``two_pass_sweeps/run6_83aef0f_options.json``), while the one-chain loop did not care.
    The streamed kernel's checkpoint stores, outside its token loop, do not count as tile I/O
    (its caller passes ``tile_io`` without them): one chain there made the checkpointed forward
    at dk = 128 1.4x slower (``stream/backward_08c8bde.json``).
    The state and fused kernels keep one chain: split sums made them slower there
    (state pass at dk = 128 3.3 against 2.5 ms, fused forward at dk = 64 7.4 against 6.3)."""
    if split_sums is None:
        # 8 at BK = 128: the H200 forward at T = 1024 / 4096, bf16, 1.309 -> 1.284 and
        # 5.163 -> 5.062 ms (16: 1.318, 5.203; 32: 1.346, 5.310); at BK = 64 4 stays (16:
        # 0.900 -> 0.924 ms); stream/gate_sweep_*.json
        split_sums = 8 if bk > 64 else 4
    return 1 if tile_io else min(split_sums, bk)


def _split_after_load(option: bool | None, bk: int) -> bool:
    """Option ``split_after_load``, by default on for BK ≤ 64: measured on the H200
    (``two_pass_sweeps/run8_d07206e.json``, T = 4096, bf16) the forward went 5.29 -> 4.19 ms at
    dk = 64 (forward + backward at T = 2048 14.8 -> 13.7), while at dk = 128 the gate kernel
    slowed 7.86 -> 11.8 ms (its plain loads compile to a 255-register loop that spills)."""
    return bk <= 64 if option is None else bool(option)


def _overlap(option: bool | None, split_after_load: bool, save_checkpoints: bool) -> bool:
    """Option ``overlap_passes``, by default on where the segments' gate kernels do not lose
    their split sums by being segments (they load ``A``): with ``split_after_load``, or when the
    forward stores checkpoints (then no gate kernel splits).  Otherwise the overlap trades the
    split of 7 of 8 gate passes for hiding the state pass: at dk = 128, T = 4096 the forward took
    8.65 ms overlapped and 7.98 ms not (``two_pass_sweeps/run8_d07206e.json``)."""
    if option is not None:
        return bool(option)
    return split_after_load or save_checkpoints


def _stream(option: bool | None) -> bool:
    """Option ``stream_passes`` (default on): the two-pass forward as one launch of
    :func:`kernels.vla_stream_kernel`, state programs consuming the gates ``_STREAM_BLOCK``
    tokens behind the gate programs (recurrent gate only)."""
    return True if option is None else bool(option)


#: Tokens per progress count of :func:`kernels.vla_stream_kernel`: the gate programs publish
#: every ``_STREAM_BLOCK`` tokens (a barrier and an atomic each), and a state program waits
#: only when the next token's gates are not yet published: it runs at most one block behind.
_STREAM_BLOCK = 32


def _period_loop(option: bool | None, bk: int, checkpoints: bool) -> bool:
    """Option ``period_loop``, by default on only where it was measured faster on the H200: the
    forward without checkpoints (inference) at BK = 64 (``stream/gate_sweep_*.json``, bf16,
    B = 1, H = 16: T = 1024 0.900 -> 0.871 ms, T = 4096 3.535 -> 3.421 ms).  Off by default
    where the gate loop also stores checkpoints or the backward reruns it: with it there,
    forward + backward at dk = 64 went 6.20 -> 6.69 ms (T = 1024) and 25.1 -> 27.7 ms
    (T = 4096; pytest-benchmark against ``0005_5631f4d``,
    ``stream/pytest_benchmark_fbadab6_regressed.json``).  Off at dk = 128: the nested loops
    compile to a token loop twice as slow (1.319 -> 2.744 ms streamed at T = 1024,
    ``stream/period_loop_fixed.json``; the gate kernel alone too) although the offline SASS of
    its loop between nudges is shorter (884 against 1310 instructions, with a longer dependency
    chain).  Narrower tiles are not measured."""
    if option is not None:
        return bool(option)
    return bk == 64 and not checkpoints


def _nudge_scalar(option: bool | None, bk: int, stream: bool) -> bool:
    """Option ``nudge_scalar``, by default on where the H200 measured it faster: the streamed
    forward at BK = 128 (``stream/gate_sweep_646c312_scalar.json``, bf16, B = 1, H = 16, T =
    1024 / 4096: 1.278 -> 1.171 ms and 5.058 -> 4.638 ms; offline SASS of the token loop 1317 ->
    936 instructions, no spill).  Off in the two-kernel gate, which it made slower at BK = 128
    (4.64 -> 8.01 ms at T = 4096 against the streamed forward with it), and so in the
    backward's rerun (7.87 -> 8.96 ms, ``stream/backward_0e808a0.json``); at BK = 64 the
    streamed forward is the same speed with it or with the default period loop (3.439 against
    3.442 ms at T = 4096).  The gate backward's walk with it (``NUDGE_SCALAR_WALK``: 2079 ->
    1846 instructions per token offline at BK = 128, 17 -> 19 barriers) is not yet timed, so
    off unless asked for (``stream=False`` there)."""
    if option is not None:
        return bool(option)
    return stream and bk > 64


def _nudge_branch(option: bool | None, scalar: bool, bk: int) -> int:
    """The gate kernel's ``NUDGE_BRANCH``: ``NUDGE_SCALAR`` where ``scalar``
    (:func:`_nudge_scalar`); otherwise option ``nudge_branch``, by default BK ≤ 64 (offline
    SASS at BK = 64: 794 -> 667 instructions per token, 234 registers, no spill)."""
    if scalar:
        return int(kernels.NUDGE_SCALAR.value)
    return int(bk <= 64 if option is None else bool(option))


#: Segments of the two-pass forward on a GPU, so that gate and state passes overlap
#: (``overlap_passes``).
_OVERLAP_SEGMENTS = 8
_SIDE_STREAMS: dict[Any, Any] = {}


def _side_stream(dev: torch.device) -> Any:
    """One side stream per device for the overlapped state pass (created once: a stream per call
    would leak CUDA streams)."""
    key = dev.index if dev.index is not None else torch.cuda.current_device()
    if key not in _SIDE_STREAMS:
        _SIDE_STREAMS[key] = torch.cuda.Stream(device=key)
    return _SIDE_STREAMS[key]


class _on_stream:
    """``with torch.cuda.stream(side)`` after ``side`` waits for what ``after`` queued so far;
    a no-op when ``side`` is None."""

    def __init__(self, side: Any, *, after: Any) -> None:
        self.side, self.after, self.ctx = side, after, None

    def __enter__(self) -> None:
        if self.side is not None:
            self.side.wait_stream(self.after)
            self.ctx = torch.cuda.stream(self.side)
            self.ctx.__enter__()

    def __exit__(self, *exc: Any) -> None:
        if self.ctx is not None:
            self.ctx.__exit__(*exc)


#: Floats of the two-pass backward's per-segment buffers (value-block partial sums) at most.
_SEGMENT_FLOATS = 1 << 26
#: Floats of the two-pass forward's per-token gate buffers at most (4 GiB in float32; the H200
#: grid of issue 5, B·H = 16 and T ≤ 65536, stays in one segment).
_FORWARD_FLOATS = 1 << 30


def _backward_two_pass(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    u: torch.Tensor,
    ck: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    do: torch.Tensor,
    final: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    config: VLAConfig,
    options: dict[str, Any],
) -> _Grads:
    """The adjoint in three kernels per segment of ``L`` tokens (``L`` a multiple of the
    checkpoint interval), segments in reverse order, ``dS, dA, dz`` carried between them:

    1. :func:`kernels.vla_gate_kernel` reruns the penalty chain from the segment's ``(A, z)``
       checkpoint, for the segment's ``k̂, α̂, s`` and scalars (the forward keeps no per-token
       history);
    2. :func:`kernels.vla_state_bwd_kernel`, one program per (b, h) and value block: the state
       adjoint, with per-block partial sums of the vectors the penalty half needs;
    3. :func:`kernels.vla_gate_bwd_kernel`, one program per (b, h): the penalty adjoint from the
       summed partials and the rerun's vectors, walking each chunk back from the next
       checkpoint (the forward stores the final state as one more).

    ``L`` keeps the partial sums (``4·NV·B·H·L·BK`` floats) under :data:`_SEGMENT_FLOATS`, or is
    ``options["backward_segment"]`` when given.  Same returns as :func:`_backward_fused`.
    """
    B, T, H, dk = q.shape
    dv = v.shape[-1]
    BH = B * H
    acc, acc_tl = _acc(q.dtype)
    dev = q.device
    bk = _pow2(dk)
    bv = options["block_v"] or _default_block_v(B, H, dk, dv, dev, two_pass=True)
    nv = triton.cdiv(dv, bv)
    every = options["checkpoint_every"]
    nc = triton.cdiv(T, every)
    seg = options["backward_segment"] or _SEGMENT_FLOATS // (4 * nv * BH * bk)
    seg = max(every, seg // every * every)
    cks, cka, ckz = ck
    params = _params(config, acc, dev)
    nudge = config.nudge_period or _NEVER
    dq, dk_, du = (torch.empty_like(x) for x in (q, k, u))
    dv_ = torch.empty_like(v)
    # dSᵀ, dAᵀ: the kernels' memory layout, like the checkpoints (cks holds Sᵀ [dk, dv]).
    dS, dA, dz = final[0].mT.contiguous(), final[1].mT.contiguous(), final[2]
    e = torch.empty(nv * BH, every, bv, dtype=acc, device=dev)
    a_end = torch.empty(B, H, dk, dk, dtype=acc, device=dev)  # the rerun's end state, unused
    z_end = torch.empty(B, H, dk, dtype=acc, device=dev)
    gate_warps = options["gate_num_warps"] or _default_gate_warps(bk)
    split_after_load = _split_after_load(options["split_after_load"], bk)
    # the rerun is a two-kernel gate and the walk is not yet timed: both off unless asked for
    scalar = _nudge_scalar(options["nudge_scalar"], bk, False)
    for t_begin in reversed(range(0, T, seg)):
        n = min(seg, T - t_begin)
        c = t_begin // every
        kh = torch.empty(BH, n, bk, dtype=acc, device=dev)
        ah = torch.empty(BH, n, bk, dtype=acc, device=dev)
        sc = torch.empty(BH, n, 2, dtype=acc, device=dev)
        sv = torch.empty(BH, n, bk, dtype=acc, device=dev)
        cs = torch.empty(BH, n, 4, dtype=acc, device=dev)
        kernels.vla_gate_kernel[(BH,)](
            q, k, u, kh, ah, sc, sv, cs, cka[:, :, c].contiguous(), ckz[:, :, c].contiguous(),
            a_end, z_end, cka, ckz, params, T, H, dk, nudge, every, nc, t_begin, n, dk,
            BK=bk, HAS_INIT=True, SAVE_CKPT=False, SAVE_CHAIN=True,
            NORM_GATE=config.normalize_gate, ACC=acc_tl, BUG=0, DOWNDATE=options["downdate"],
            PIPELINE=options["pipeline_gate"],
            SPLIT=_gate_split(options["split_sums"], bk, not split_after_load),
            LOAD_PLAIN=split_after_load,
            NUDGE_BRANCH=_nudge_branch(options["nudge_branch"], scalar, bk),
            num_warps=gate_warps,
            KEY_AHEAD=options["key_ahead"] and options["pipeline_gate"],
            PERIOD_LOOP=_period_loop(options["period_loop"], bk, True) and not scalar
            and options["key_ahead"] and options["pipeline_gate"],
        )  # fmt: skip
        parts = torch.empty(3, nv, BH, n, bk, dtype=acc, device=dev)
        dn_parts = torch.empty(nv, BH, n, dtype=acc, device=dev)
        dS_begin = torch.empty(B, H, dk, dv, dtype=acc, device=dev)
        kernels.vla_state_bwd_kernel[(nv, BH)](
            q, v, do, kh, ah, sc, cks, dS, e, dv_, parts[0], parts[1], parts[2], dn_parts,
            dS_begin, params, T, H, dk, dv, every, nc, t_begin, n,
            BK=bk, BV=bv, NORM_OUT=config.normalize_output, ACC=acc_tl,
            num_warps=options["num_warps"] or _default_state_warps(bk, bv),
        )  # fmt: skip
        sums = parts.sum(dim=1) if nv > 1 else parts[:, 0]
        dn_sum = dn_parts.sum(dim=0) if nv > 1 else dn_parts[0]
        dA_begin = torch.empty(B, H, dk, dk, dtype=acc, device=dev)
        dz_begin = torch.empty(B, H, dk, dtype=acc, device=dev)
        kernels.vla_gate_bwd_kernel[(BH,)](
            q, k, u, kh, ah, sc, sv, cs, sums[0], sums[1], sums[2], dn_sum, cka, ckz, dA, dz,
            dq, dk_, du, dA_begin, dz_begin, params, T, H, dk, nudge, every, nc, t_begin, n,
            BK=bk, NORM_GATE=config.normalize_gate, NORM_OUT=config.normalize_output,
            ACC=acc_tl, BUG=options["bug"], DOWNDATE=options["downdate"],
            num_warps=options["bwd_num_warps"] or _default_gate_bwd_warps(bk),
            NUDGE_SCALAR_WALK=scalar,
        )  # fmt: skip
        dS, dA, dz = dS_begin, dA_begin, dz_begin
    return dq, dk_, dv_, du, dS.mT.contiguous(), dA.mT.contiguous(), dz


def _default_gate_bwd_warps(bk: int) -> int:
    """Warps of the two-pass gate backward, which holds ``Aᵀ`` and ``dAᵀ`` ``[BK, BK]``: 2, 4, 8
    for BK ≤ 32, 64, 128 (H200 at T = 2048: 4 warps 10.6 ms against 17.2 with 2 at BK = 64; 8
    warps 30.6 ms against 36.7 with 16 and 37.5 with 4 at BK = 128;
    ``benchmarks/results/h200/two_pass_sweep.json``)."""
    return 2 if bk <= 32 else 4 if bk <= 64 else 8


class FusedRecurrentVLAFunction(torch.autograd.Function):
    """Autograd for the fused kernel: forward saves checkpoints, backward recomputes chunks.

    ``forward(q, k, v, u, S0, A0, z0, config, options)`` returns ``(o, S_T, A_T, z_T)``; the
    initial-state arguments may be ``None`` (spec §2.3 defaults).  Gradients flow to ``q, k, v,
    u`` and, when given, the initial state.
    """

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        u: torch.Tensor,
        S0: torch.Tensor | None,
        A0: torch.Tensor | None,
        z0: torch.Tensor | None,
        config: VLAConfig,
        options: dict[str, Any],
    ) -> tuple[torch.Tensor, ...]:
        state0 = None if S0 is None else (S0, A0, z0)
        save = any(ctx.needs_input_grad[:7])
        two_pass = _two_pass(options["schedule"])
        options = {**options, "schedule": "two_pass" if two_pass else "fused"}  # resolved
        o, (sT, aT, zT), ck = _forward(
            q,
            k,
            v,
            u,
            state0,
            config,
            save_checkpoints=save,
            checkpoint_every=options["checkpoint_every"],
            block_v=options["block_v"],
            num_warps=options["num_warps"],
            bug=options["bug"],
            downdate=options["downdate"],
            schedule=options["schedule"],
            gate_num_warps=options["gate_num_warps"],
            forward_segment=options["forward_segment"],
            pipeline_gate=options["pipeline_gate"],
            split_sums=options["split_sums"],
            overlap_passes=options["overlap_passes"],
            nudge_branch=options["nudge_branch"],
            nudge_scalar=options["nudge_scalar"],
            split_after_load=options["split_after_load"],
            gate=options["gate"],
            gate_chunk=options["gate_chunk"],
            stream_passes=options["stream_passes"],
            key_ahead=options["key_ahead"],
            period_loop=options["period_loop"],
        )
        if save:
            assert ck is not None
            ctx.save_for_backward(q, k, v, u, *ck)
            ctx.config = config
            ctx.options = options
            ctx.state_dtypes = None if S0 is None else (S0.dtype, A0.dtype, z0.dtype)  # type: ignore[union-attr]
        return o, sT, aT, zT

    @staticmethod
    def backward(  # type: ignore[override]
        ctx: Any,
        do: torch.Tensor,
        dsT: torch.Tensor,
        daT: torch.Tensor,
        dzT: torch.Tensor,
    ) -> tuple[torch.Tensor | None, ...]:
        q, k, v, u, cks, cka, ckz = ctx.saved_tensors
        config: VLAConfig = ctx.config
        options = ctx.options
        acc = _acc(q.dtype)[0]
        final = tuple(x.to(acc).contiguous() for x in (dsT, daT, dzT))
        run = _backward_two_pass if options["schedule"] == "two_pass" else _backward_fused
        dq, dk_, dv_, du, ds0, da0, dz0 = run(
            q, k, v, u, (cks, cka, ckz), do.contiguous(), final, config, options
        )
        grads_state: tuple[torch.Tensor | None, ...] = (None, None, None)
        if ctx.state_dtypes is not None:
            grads_state = tuple(
                g.to(dt) for g, dt in zip((ds0, da0, dz0), ctx.state_dtypes, strict=True)
            )
        return (dq, dk_, dv_, du, *grads_state, None, None)


def fused_recurrent_vla(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    u: torch.Tensor,
    *,
    config: VLAConfig | None = None,
    initial_state: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
    checkpoint_every: int = 64,
    block_v: int | None = None,
    num_warps: int | None = None,
    downdate: str = "fma",
    schedule: str = "auto",
    gate_num_warps: int | None = None,
    backward_segment: int | None = None,
    forward_segment: int | None = None,
    pipeline_gate: bool = True,
    split_sums: int | None = None,
    overlap_passes: bool | None = None,
    nudge_branch: bool | None = None,
    split_after_load: bool | None = None,
    gate: str = "recurrent",
    gate_chunk: int | None = None,
    stream_passes: bool | None = None,
    key_ahead: bool = True,
    period_loop: bool | None = None,
    nudge_scalar: bool | None = None,
    bwd_num_warps: int | None = None,
    check_finite: bool = False,
    planted_bug: str | None = None,
) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """The recurrence of spec §2.3 in one fused Triton launch; differentiable.

    Parameters
    ----------
    q, k, u : ``[B, T, H, dk]``; v : ``[B, T, H, dv]`` (spec §1), one float dtype (float32,
        bfloat16, float16 accumulate in float32; float64 in float64), on a CUDA device — or on
        the CPU when Triton's interpreter is on.  ``dk, dv <= 128``.
    config : :class:`VLAConfig` (every field honoured; default the paper preset).
    initial_state : ``(S [B, H, dv, dk], A [B, H, dk, dk], z [B, H, dk])`` or ``None``.
    checkpoint_every : C, tokens between the state checkpoints that the backward recomputes
        from (memory ``⌈T/C⌉`` states per (b, h); rounding of the in-chunk reversal grows with C).
    block_v : value rows per program (power of two ≥ 16; default: fill the SMs).
    num_warps : warps per forward program (fused: default 2, or 4 when dk = 128; two-pass:
        the state kernel's, default 1-4 by tile size).
    downdate : the forward's Sherman–Morrison downdate of ``A``: ``"fma"`` (default;
        ``fma(−s_i s_j, 1/δ, A)``, a multiply and a fused multiply-add per entry, the oracle's
        error bound) or ``"exact"`` (each ``s_i s_j / δ`` a correctly rounded division, the
        oracle's order of operations; 2-3x slower on the H200, see
        ``benchmarks/results/h200/variants.json``).  float64 inputs always take ``"exact"``.
        The backward's recomputation uses the forward's downdate, so that it retraces the
        forward's rounding.
    schedule : ``"fused"`` (one kernel: every program runs the whole step, the penalty chain
        redone per value block; backward: one program per (b, h)), ``"two_pass"`` (a gate
        kernel per (b, h) holding only ``A`` writes ``k̂, α̂`` and two scalars per token; a state
        kernel per value block reads them: same operations, same rounding; backward: three
        kernels, value-split) or ``"auto"``: two-pass (faster at every dk since session 4; the
        measurements behind it: :func:`_two_pass`).
    gate_num_warps : warps of the two-pass gate kernel (default 2, or 4 when dk = 128).
    backward_segment : two-pass backward only: tokens per segment, rounded down to a multiple
        of ``checkpoint_every`` (default: as long as keeps its partial sums under 256 MiB).
    forward_segment : two-pass forward only: tokens per gate/state pass pair, rounded down to a
        multiple of ``checkpoint_every`` (default: all T while its per-token buffers stay under
        4 GiB); the result does not depend on it.
    pipeline_gate : two-pass only: the gate kernel computes the next token's ``s = A u`` in the
        same pass over ``A`` as the current gate (:func:`kernels._gate_pipelined_t`): two
        dependent reductions per token instead of four, the same operations (default on).
    split_sums : the gate kernel's sums down the tile's axis 0 (``A u``, ``A k̂``) as this many
        interleaved partial sums (:func:`kernels._colsum`; a power of two, 1 = one chain;
        default 8 at dk > 64, else 4).  Only where the gate kernel starts from
        ``A_0 = I/lambda0`` (see :func:`_gate_split` for why, and for the defaults).
    overlap_passes : two-pass forward on a GPU with ``stream_passes=False``: cut T into 8
        segments (whole checkpoint chunks; ``forward_segment`` overrides) and run each
        segment's state pass on a side stream while the gate pass goes on with the next
        segment; the result does not change.  Default
        (``None``): on where the later segments' gate kernels keep their split sums anyway
        (``split_after_load``, or a forward that stores checkpoints), see :func:`_overlap`.
    nudge_branch : pipelined gate only: add ``η I`` to the tile under a branch taken on nudge
        steps only, instead of a select over the tile every step (default: when dk ≤ 64; at
        BK = 128 the branch made ptxas spill).  Same result.
    split_after_load : also split the sums of gate kernels that load or store ``A`` (later
        forward segments, a given initial state, the backward's rerun, checkpoints), which then
        access the tile without vector loads and stores (``LOAD_PLAIN``): in the offline Triton
        3.6 SASS that keeps the split loop's layout and registers at dk = 64.  Default
        (``None``): on for dk <= 64, where the H200 measured it faster, off at dk = 128
        (:func:`_split_after_load`).
    gate : two-pass forward only: how the gate pass runs the penalty chain.  ``"recurrent"``
        (default) steps through the tokens (:func:`kernels.vla_gate_kernel`); ``"chunked"``
        takes ``gate_chunk`` tokens at a time in the Woodbury/LDLᵀ form of spec §5 in float64
        (:mod:`.triton_chunk_gate_kernels`): per chunk matrix products and one ``C``-step
        recursion on a ``C × C`` tile instead of a chain of reductions over ``A`` per token.
        The backward reruns the recurrent gate from the checkpoints either way; float64 inputs
        always take the recurrent gate (a float64 Woodbury chain is not within the float64
        recurrence's error budget).
    gate_chunk : tokens per chunk of the chunked gate (16, 32 or 64; default 16).
    stream_passes : two-pass forward with the recurrent gate: both passes in one launch
        (:func:`kernels.vla_stream_kernel`), the state programs reading each block of gates as
        soon as the gate programs have written it, so that the forward costs about the gate
        pass alone and is not cut into segments (default on; ``False``: the passes as two
        kernels, one after the other or overlapped by ``overlap_passes``).  Same result.  Its
        warps are the gate kernel's (``gate_num_warps``).
    key_ahead : pipelined gate only: form each next token's key sums (``‖k‖²``, ``z_tᵀq``) in
        the same reduction as the current token's gate norms (:func:`kernels._gate_pipelined_t`),
        one cross-warp reduction fewer per token; the same operations (default on).
    period_loop : with ``key_ahead``: the gate loop runs the tokens between two nudges with a
        step compiled without the nudge and each nudge token with one compiled with it, instead
        of a select over the tile every token (the same result, bit for bit).  Default: see
        :func:`_period_loop`.
    nudge_scalar : pipelined gate: keep ``A`` as ``B + c·I`` with a scalar ``c``, so that the
        nudge ``A += η·I`` is ``c += η`` and the gate reads ``A x = B x + c x`` (two vector
        FMAs) instead of a select and an add over the tile every token; ``c`` is folded into
        the tile's diagonal every 64 tokens (and at checkpoints and the end), so it stays below
        ``η·⌈64 / nudge_period⌉``.  The same step up to rounding; where it is on,
        ``period_loop`` is off.  ``True`` also takes it into the two-pass backward (the gate
        rerun, and the gate backward's walk, which undoes a nudge as ``c −= η``).  Default: see
        :func:`_nudge_scalar` (on in the streamed forward at dk > 64, off in the backward).
    bwd_num_warps : warps of the fused backward kernel (default 4/8/16 for dk ≤ 32/64/128), or
        of the two-pass gate backward (default 2, 4, 8 for dk ≤ 32, 64, 128).
    check_finite : also refuse NaN/Inf inputs (one device sync).
    planted_bug : meta-tests only (:data:`PLANTED_BUGS`).

    Returns
    -------
    ``o`` ``[B, T, H, dv]`` in the inputs' dtype and the final ``(S, A, z)`` in float32
    (float64 for float64 inputs).

    Raises
    ------
    ShapeError, DTypeError, NonFiniteError, DeviceError, UnsupportedConfigurationError
        naming the argument (e.g. ``q`` for dk > 128, ``q`` for CPU tensors without the
        interpreter).
    """
    config = VLAConfig() if config is None else config
    check_inputs(q, k, v, u, initial_state, dtypes=_DTYPES, check_finite=check_finite)
    _check_run(q, v)
    if checkpoint_every < 1:
        raise UnsupportedConfigurationError(
            _NAME, f"checkpoint_every must be >= 1, got {checkpoint_every}", "checkpoint_every"
        )
    if block_v is not None and (block_v < 16 or block_v & (block_v - 1)):
        raise UnsupportedConfigurationError(
            _NAME, f"block_v must be a power of two >= 16, got {block_v}", "block_v"
        )
    if downdate not in DOWNDATES:
        raise UnsupportedConfigurationError(
            _NAME, f"downdate must be one of {sorted(DOWNDATES)}, got {downdate!r}", "downdate"
        )
    if split_sums is not None and (split_sums < 1 or split_sums & (split_sums - 1)):
        raise UnsupportedConfigurationError(
            _NAME, f"split_sums must be a power of two >= 1, got {split_sums}", "split_sums"
        )
    for name, value in (
        ("backward_segment", backward_segment),
        ("forward_segment", forward_segment),
    ):
        if value is not None and value < 1:
            raise UnsupportedConfigurationError(_NAME, f"{name} must be >= 1, got {value}", name)
    if schedule not in SCHEDULES:
        raise UnsupportedConfigurationError(
            _NAME, f"schedule must be one of {SCHEDULES}, got {schedule!r}", "schedule"
        )
    if gate not in GATES:
        raise UnsupportedConfigurationError(
            _NAME, f"gate must be one of {GATES}, got {gate!r}", "gate"
        )
    if gate_chunk is not None and gate_chunk not in (16, 32, 64):
        raise UnsupportedConfigurationError(
            _NAME, f"gate_chunk must be 16, 32 or 64, got {gate_chunk}", "gate_chunk"
        )
    bug = 0 if planted_bug is None else PLANTED_BUGS[planted_bug]
    options = {
        # float64 is the reference-grade path: it keeps the oracle's order of operations (the
        # fma form left float64 gradients 1.3x outside their error budget in the tests).
        "downdate": kernels.DOWNDATE_EXACT if q.dtype == torch.float64 else DOWNDATES[downdate],
        "checkpoint_every": int(checkpoint_every),
        "block_v": block_v,
        "num_warps": num_warps,
        "schedule": schedule,
        "gate_num_warps": gate_num_warps,
        "backward_segment": backward_segment,
        "forward_segment": forward_segment,
        "pipeline_gate": bool(pipeline_gate),
        "split_sums": None if split_sums is None else int(split_sums),
        "overlap_passes": overlap_passes,
        "nudge_branch": nudge_branch,
        "nudge_scalar": nudge_scalar,
        "split_after_load": split_after_load,
        "gate": gate,
        "gate_chunk": gate_chunk,
        "stream_passes": stream_passes,
        "key_ahead": bool(key_ahead),
        "period_loop": period_loop,
        "bwd_num_warps": bwd_num_warps,
        "bug": bug,
    }
    q, k, v, u = (x.contiguous() for x in (q, k, v, u))
    S0 = A0 = z0 = None
    if initial_state is not None:
        S0, A0, z0 = (x.contiguous() for x in initial_state)
    o, sT, aT, zT = FusedRecurrentVLAFunction.apply(q, k, v, u, S0, A0, z0, config, options)
    return o, (sT, aT, zT)


class TritonFusedBackend(Backend):
    """Registry name ``triton_fused``: :func:`fused_recurrent_vla` as a spec §4 callable.

    Returns ``(o, (S, A, z))`` all in the inputs' dtype and device.  Options: ``block_v``,
    ``num_warps``, ``checkpoint_every``, ``downdate``, ``schedule``, ``gate_num_warps``,
    ``pipeline_gate``, ``split_sums``, ``overlap_passes``, ``split_after_load``, ``gate``,
    ``gate_chunk``, ``stream_passes``, ``key_ahead``, ``period_loop``, ``nudge_scalar`` (see
    :func:`fused_recurrent_vla`).
    """

    name = _NAME
    description = "Triton fused recurrent kernel (spec §2.3), one launch, forward and backward"
    capabilities = Capabilities(
        array="torch",
        devices=("cuda", "cpu"),
        dtypes=_DTYPES,
        variants=("vla",),
        differentiable=True,
        max_head_dim=MAX_HEAD_DIM,
        requires=("torch", "triton"),
        options={
            "block_v": None,
            "num_warps": None,
            "checkpoint_every": 64,
            "downdate": "fma",
            "schedule": "auto",
            "gate_num_warps": None,
            "pipeline_gate": True,
            "split_sums": None,
            "overlap_passes": None,
            "split_after_load": None,
            "gate": "recurrent",
            "gate_chunk": None,
            "stream_passes": None,
            "key_ahead": True,
            "period_loop": None,
            "nudge_scalar": None,
        },
    )

    def availability(self) -> str | None:
        return availability_reason()

    def check_support(
        self,
        config: VLAConfig,
        shapes: Any,
        dtype: str,
        device: str = "cpu",
        *,
        variant: str | None = None,
    ) -> str | None:
        reason = super().check_support(config, shapes, dtype, device, variant=variant)
        if reason is not None:
            return reason
        if device == "cpu" and not interpreted():
            return (
                "CPU tensors need Triton's interpreter (TRITON_INTERPRET=1 before importing "
                "triton); use CUDA tensors"
            )
        return None

    def _run(self, q, k, v, u, *, config, initial_state, start=0):  # type: ignore[no-untyped-def]
        refuse_shifted_clock(self.name, config, start)
        o, state = fused_recurrent_vla(
            q,
            k,
            v,
            u,
            config=config,
            initial_state=initial_state,
            checkpoint_every=int(self.options["checkpoint_every"]),
            block_v=self.options["block_v"],
            num_warps=self.options["num_warps"],
            downdate=str(self.options["downdate"]),
            schedule=str(self.options["schedule"]),
            gate_num_warps=self.options["gate_num_warps"],
            pipeline_gate=bool(self.options["pipeline_gate"]),
            split_sums=self.options["split_sums"],
            overlap_passes=self.options["overlap_passes"],
            split_after_load=self.options["split_after_load"],
            gate=str(self.options["gate"]),
            gate_chunk=self.options["gate_chunk"],
            stream_passes=self.options["stream_passes"],
            key_ahead=bool(self.options["key_ahead"]),
            period_loop=self.options["period_loop"],
        )
        return o, tuple(x.to(q.dtype) for x in state)
