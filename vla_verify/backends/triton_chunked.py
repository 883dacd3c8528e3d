"""Registry backend ``triton_chunked``: VLA by the chunked forms of spec §5 on tensor cores.

- :func:`chunked_vla` — the functional API: ``(o, (S, A, z))`` from ``q, k, u`` ``[B, T, H, dk]``
  and ``v`` ``[B, T, H, dv]`` (spec §1 layouts), differentiable through
  :class:`ChunkedVLAFunction`.
- :class:`TritonChunkedBackend` — the same as a spec §4 callable in the registry, with the
  option ``chunk_size`` (so :func:`vla_verify.validate` uses the chunked floor of
  :mod:`vla_verify.error_model`).

The forward is a few Triton launches (:mod:`.triton_chunked_kernels`): the penalty chain
(Woodbury/LDLᵀ per chunk of ``penalty_chunk`` tokens, nudges inside a chunk through the
isotropic shift ``A = B + c·I``), run in parallel over blocks of ``penalty_block`` tokens from
block-start penalties computed by :func:`penalty_block_starts` from each block's matrix
(:func:`penalty_block_matrices`); the per-chunk UT transform of the state chain; the
inter-chunk state recurrence; and the read-out.  Every nudge period
and every ``start`` runs exactly (spec §2.3: the nudge fires after step t of the call when
``(start + t) % nudge_period == 0``).

Precision.  Inputs are float32, bfloat16 or float16; the state chain's products accumulate in
float32.  In the inference forward of bf16 inputs the stored intermediates are bf16 and the
state side's products (the UT transform's, the state chain's, the read-out's) take bf16
operands (:func:`_state_dtype`).  Otherwise the intermediates are float32: tf32 products for
16-bit inputs and, for float32 inputs, ``input_precision`` ``"ieee"`` (default) or ``"tf32"``
(faster, 10-bit mantissa operands).  The penalty chain runs in ``penalty_dtype``: by default
(``"auto"``, :func:`_penalty_dtype`) float32 with tf32x3 products in the inference forward of
bf16 inputs, whose budget it keeps, and float64 otherwise, since a float32 Woodbury chain
re-derives every ``A_t`` from the chunk-start ``A`` and cancels at that scale, which was
measured outside the spec §4 float32 budget on strong penalties
(``docs/design/triton_chunked.md``).  Either chain checks its block ends against the float64
block starts at its own precision.  The state comes back in float32.

Gradients.  The backward is the adjoint of the recurrence (spec §2.3) by the recurrent kernels
of :mod:`.triton_fused`, started from checkpoints that this forward keeps when an input needs a
gradient: ``S`` and ``z`` at the state chain's chunk starts, ``A`` stored by the penalty kernel,
every 64 tokens (the recurrent backward's interval and layout); and with the per-token values
that the recurrent adjoint would otherwise rerun its gate pass for (``k̂, α̂, s``, the
pivots, the norms, ``α̂ᵀq`` and ``zᵀq``: :data:`Chain`), which the penalty and read-out kernels
store as they form them (``3·BK + 6`` floats per token and head until the backward).  There
is no chunked Triton adjoint yet; the recurrent one is about 8× faster than recomputing the
forward through :func:`vla_verify.backends.torch_chunked.chunked` and differentiating it with
autograd (94.5 against 768 ms for forward + backward on the H200 at T = 16384, D = 64;
``docs/design/triton_chunked.md``, "Measured times"), and with the checkpoints and the chain
values it reruns neither the recurrent forward nor its gate pass.  The recurrent kernels take
every input this forward takes (float32, bfloat16, float16; dk, dv ≤ 128; every configuration
and ``start``; any initial state, in the same spec §1 layouts).  The gradients are those of
spec §2.3 along the chunked trajectory, as the recurrent adjoint walks it from the
checkpoints with the chain values; on long inputs that adjoint runs in blocks of tokens side
by side (``RecurrentPlan.adjoint_blocks``).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import Any

import torch
import triton

from ..errors import (
    DTypeError,
    NonFiniteResultError,
    UnsupportedConfigurationError,
    VLAInputError,
)
from ..spec import VLAConfig, check_inputs, check_start
from . import triton_chunked_kernels as kernels
from . import triton_fused as fused
from .registry import Capabilities
from .triton_common import TritonKernelBackend, built_for_interpreter, check_offsets
from .triton_common import availability_reason as _availability_reason
from .triton_fused_kernels import Bug, Downdate

__all__ = [
    "CHUNK_SIZES",
    "DEFAULT_PENALTY_BLOCK",
    "DEFAULT_PENALTY_CHUNK",
    "HALF_PENALTY_WARPS_FROM",
    "INPUT_PRECISIONS",
    "MAX_HEAD_DIM",
    "MAX_PENALTY_BLOCKS",
    "ONE_PENALTY_BLOCK_UP_TO",
    "PENALTY_DTYPES",
    "PLANTED_BUGS",
    "ChunkedVLAFunction",
    "TritonChunkedBackend",
    "availability_reason",
    "chunked_vla",
    "interpreted",
    "penalty_block_length",
    "penalty_block_starts",
]

_NAME = "triton_chunked"
#: Tokens between the checkpoints that the forward keeps for the backward (the recurrent
#: adjoint's, ``fused_recurrent_vla``'s default: ``⌈T/64⌉`` states per head; its in-interval
#: reversal's rounding grows with the interval).  A multiple of every chunk size.
_CHECKPOINT_EVERY = 64
#: Chunks per step of the scan that forms ``z`` at every chunk start from the chunks' sums of
#: keys (``_key_sums``): the walk takes ``⌈T / (C·32)⌉`` dependent steps, each over a
#: ``[32, BK]`` float32 tile.
_KEY_SUM_CHUNKS = 32
#: The backward's checkpoints: ``Sᵀ``, ``Aᵀ``, ``z`` (:func:`_forward`).
Checkpoints = tuple[torch.Tensor, torch.Tensor, torch.Tensor]
#: The backward's per-token values of the chains: ``k̂, α̂, (α̂ᵀq, zᵀq), s, (1 + uᵀs, δ, ‖α‖,
#: ‖k‖)`` (:func:`_forward`).
Chain = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]
#: Chunk sizes of the state chain (those of fla's chunk kernels).
CHUNK_SIZES: tuple[int, ...] = (16, 32, 64)
#: The penalty chain's chunk by default: the fastest measured on the H200 (B = 1, H = 16, bf16,
#: T = 4096; ``benchmarks/results/h200/chunk_c32ddae.json``, "variants" for 16 and 64, the
#: forward records for 32): 5.1 ms at 16 against 7.2 ms at 32 and 12.7 ms at 64 for D = 64
#: (9.5 / 11.5 / 40.5 ms at D = 128).  Its LDLᵀ and
#: triangular inverse take P dependent steps per chunk of P tokens over P × P tiles, so their
#: latency per token grows with P; the matrix products per token do not depend on it.
DEFAULT_PENALTY_CHUNK = 16
#: How the penalty chain forms ``W = L^{-1} Y`` and the pivots of each chunk:
#: ``"elimination_inverse"``, one elimination on ``[I + G | I]`` (``P`` dependent steps a chunk,
#: each updating a ``P × P`` tile) and ``W = L^{-1} Y`` as one product after it;
#: ``"elimination"``, one elimination on ``[I + G | Y]`` (``P`` steps, each updating the
#: ``P × d`` tile of ``Y`` as well); ``"factor_inverse"``, the factorisation, the inverse of
#: ``L`` and a product (``2P − 1`` steps and the product).  The chunk's time grows with ``P``
#: (above), so its dependent steps, not its products, set it.  On the H200 (B = 1, H = 16,
#: bf16, T = 16384, paper preset, side by side; ``benchmarks/results/h200/chain_variants.json``)
#: the elimination took the penalty kernel from 1.33 to 1.09 ms at D = 64 and from 3.91 to
#: 3.29 ms at D = 128.  On one H100 (``benchmarks/results/h100/chain_split_inverse_0bd45e9.json``,
#: two rounds) the elimination on ``[I + G | I]`` takes the float64 chain's kernel from 0.763 /
#: 0.759 to 0.697 / 0.692 ms at D = 64 and from 3.17 / 3.14 to 3.08 / 3.06 at D = 128.  (An
#: elimination with fewer barriers per step, slower on the H100: ``docs/design/triton_chunked.md``,
#: "What runs", step 1.)
PENALTY_FACTORISATION = "elimination_inverse"
#: Warps of a penalty-chain program per key tile width, where they differ from the state
#: kernels' (4 up to BK = 64, 8 above).  Fewer warps keep more of the float64 tiles on the stack
#: (sm_90, Triton 3.6, in inference: 848 / 152 / 24 / 0 bytes per thread with 1 / 2 / 4 / 8
#: warps at BK = 64, 2040 / 352 / 176 / 1344 with 2 / 4 / 8 / 16 at 128,
#: ``benchmarks/preflight_sm90.py``), more warps spread the chunk's short reductions across more
#: of them.  Timed on an H100 (``benchmarks/results/h100/chain_variants_eaff479.json``, T = 16384,
#: the forward's median / the penalty kernel's device time), the state kernels' count is the
#: fastest: at D = 64 4 warps 3.57 / 1.09 ms, 2 warps 3.68 / 1.18, 8 warps 3.98 / 1.82; at
#: D = 128 8 warps 10.98 / 3.20, 4 warps 13.07 / 3.56.
PENALTY_CHAIN_WARPS: dict[int, int] = {}
#: Value columns per read-out program (``state_output_kernel``'s ``BVB``) per value tile width,
#: where they differ from the state chain's 32.  Each program loads its chunk's queries, keys
#: and gates and forms ``Q Âᵀ`` for its columns alone, so narrower blocks repeat that work
#: ``BV / BVB`` times over, while wider ones hold more registers per program.  Built for sm_90
#: (Triton 3.6, bf16 inputs) every width keeps its tiles off the stack: 184 registers at
#: BV = BVB = 64, 255 at BV = 128 with BVB = 64 and 247 with 128
#: (``benchmarks/preflight_sm90.py``).  The read-out kernel's device time on the H200, B = 1,
#: H = 16, bf16, 32 columns against the table's (``h200/readout_variants_075acb0.json``,
#: ``benchmarks/gpu/chunk_h200.py --readout-variants``): at D = 64 0.148 against 0.110 ms at
#: T = 16384 and 0.556 against 0.408 at 65536; at D = 128 0.990 against 0.414 and 3.94 against
#: 1.60 (64 columns: 0.590 and 2.32).
READOUT_VALUE_BLOCK: dict[int, int] = {64: 64, 128: 128}
#: Value rows per program of the state chain's sequential kernel (``state_starts_kernel``, grid
#: ``(B·H, BV / BVB + 1)``), per value tile width ``BV``.  The kernel walks every chunk of its
#: head, so narrower value blocks shorten each step's products and add programs, which the SMs
#: have to spare.  Side by side on one H100 (``benchmarks/results/h100/launch_ab_09c787e.json``,
#: B = 1, H = 16, bf16 inference, paper preset; the kernel's device time) 16 rows against 32
#: took 0.159 against 0.179 ms at D = 64, T = 16384, 0.310 against 0.354 at D = 128, T = 16384,
#: 1.209 against 1.393 at D = 128, T = 65536 and 0.043 against 0.047 at D = 64, T = 4096.
#: Training's forward (float32 intermediates) takes the same launch, untimed.
STATE_CHAIN_VALUE_BLOCK: dict[int, int] = {64: 16, 128: 16}
#: Warps of the state chain's sequential kernel by key tile width, where not the read-out's
#: (4 up to a 64-wide key tile, 8 above), which ``benchmarks/gpu/launch_warps.py`` kept with
#: value blocks of 32 rows (``h200/launch_warps_64_8e0d05d.json``,
#: ``h100/launch_warps_128_1b3e657.json``); with 16 rows not measured (built for sm_90 with 2
#: warps at BK = 64 and 4 at 128 it spills nothing,
#: ``sm90/preflight_state_chain_value_blocks.json``).
STATE_CHAIN_WARPS: dict[int, int] = {}
#: The values of :data:`PENALTY_FACTORISATION`, in the kernel's ``ELIMINATE`` order.
PENALTY_FACTORISATIONS: tuple[str, ...] = ("factor_inverse", "elimination", "elimination_inverse")
#: Tokens per block of the penalty chain (the blocks run in parallel, each from its start
#: penalty; :func:`penalty_block_starts`), at least, per key width (the row of the narrowest
#: width at least ``dk``): see :func:`penalty_block_length`.  Measured on the H200 (B = 1,
#: H = 16, bf16, paper preset; ``benchmarks/results/h200/chunk_f8f8578.json``, "variants" and
#: "variants_second_run", T = 16384): at D = 64 blocks of 256 / 512 / 1024 / 2048 tokens
#: take 7.48 / 5.79 / 4.97 / 5.55 ms, one block of T tokens 18.6 ms (second run 7.28 / 5.58 /
#: 4.82 / 5.34, 18.5); at D = 128 26.9 / 19.7 / 16.4 / 15.2 and 34.8 ms (26.2 / 19.1 / 15.8 /
#: 14.4, 34.9).  At D = 128, T = 4096 (``h200/chain_variants.json``, "block_variants") blocks
#: of 128 / 256 / 512 tokens take 10.6 / 7.14 / **4.80** ms against 7.13 in two blocks of
#: 2048: there the blocks were too few to fill the GPU (:func:`penalty_block_length`).  With
#: this default on an H100 (``benchmarks/results/h100/block_variants_eaff479.json``) its eight
#: blocks at D = 128 were the fastest of 512 to 8192 tokens at T = 4096, 8192 and 65536.  With
#: the block starts from one kernel (:func:`penalty_block_starts`), shorter blocks pay at D = 64
#: (``benchmarks/results/h100/block_variants_753ac4b.json``, an H100): at T = 4096 blocks of
#: 256 / 512 / 1024 tokens take 1.16 / 1.17 / 1.55 ms; at T = 16384 3.86 / 3.31 / 3.09 ms, where
#: :data:`MAX_PENALTY_BLOCKS` keeps this default's blocks at 1024 tokens.
DEFAULT_PENALTY_BLOCK: dict[int, int] = {64: 256, 128: 512}
#: Up to this many tokens the chain runs in one block, per key width (as
#: :data:`DEFAULT_PENALTY_BLOCK`): blocking costs about 2 ms of fixed work (the starts, their
#: check, the second pass's launches).  At T = 1024 (``h200/chain_variants.json``) one block
#: takes 1.44 ms at D = 64 against 3.34 in two blocks of 512, and 2.15 ms at D = 128 against
#: 4.14 (two of 512), 3.87 (eight of 128).
ONE_PENALTY_BLOCK_UP_TO: dict[int, int] = {64: 1024, 128: 2048}
#: At most this many blocks of programs of 4 warps or more (twice as many of 2 warps, which run
#: four to an SM: :data:`HALF_PENALTY_WARPS_FROM`).  At T = 65536, D = 64 (``chunk.json``) blocks
#: of 512 / 1024 / 2048 / 4096 tokens (128 / 64 / 32 / 16 blocks) take 20.8 / 17.5 / 15.8 /
#: 15.1 ms: past 16 blocks of 4-warp programs, which fill one wave at B·H = 16, the penalty
#: chain is no longer what the forward waits on, and more blocks cost their starts.
MAX_PENALTY_BLOCKS = 16
#: From this many tokens per sequence the penalty kernel runs with half the state kernels' warps
#: at a key tile width and chain dtype (``(BK, "float64" or "float32")``), twice the programs to
#: an SM, in up to twice as many blocks (:data:`MAX_PENALTY_BLOCKS`, :func:`penalty_block_length`):
#: each program's walk is short dependent reductions, bound by latency, so twice the programs
#: per SM with half the warps each shorten the chain's walk where the blocks are long.  Side by
#: side on an H100 (B = 1, H = 16, bf16, paper preset; ``benchmarks/gpu/chain_occupancy.py``,
#: ``h100/chain_occupancy_b6d5ea8.json``; the penalty kernel's device time, the forward's and
#: the forward + backward's medians), 2 warps in 32 blocks against 4 in 16: T = 16384
#: 0.84 / 2.95 / 17.3 ms against 1.09 / 3.01 / 17.9; T = 65536 3.27 / 9.91 / 67.6 against
#: 4.25 / 10.7 / 69.0.  At T = 4096 (blocks of 256 tokens) 2 warps are slower: the forward's
#: device time 1.03 against 1.00 ms in 16 blocks, 1.15 in 32.  At D = 128 half the warps were
#: slower in every block count measured (8 and 16 blocks at T = 16384) with the float64 chain.
#: The float32 chain of the bf16 inference forward gains there
#: (``h100/chain_occupancy_27f2c2f.json``, the forward's median / the penalty kernel's device
#: time): 4 warps in 16 blocks against 8 in 8 take 5.05 / 1.37 against 5.35 / 2.15 ms at
#: T = 16384 and 16.5 / 5.50 against 19.0 / 8.57 at 65536, and 2.19 against 1.96 ms (in 16
#: blocks of 256 tokens) at T = 4096.
HALF_PENALTY_WARPS_FROM: dict[tuple[int, str], int] = {
    (64, "float64"): 16384,
    (64, "float32"): 16384,
    (128, "float32"): 16384,
}
#: Registers per thread of the penalty kernel: every build of it reaches the 255 that sm_90
#: allows (``benchmarks/results/sm90/preflight_*.json``), allocated in units of 256 per thread
#: of a warp, so at 4 warps two programs fit an SM's 65536 registers and at 8 warps one.
_PENALTY_KERNEL_REGISTERS = 256
#: The float64 chain's check of its products-only block starts: each block's end (the chain's
#: own, from that block's start) and the next block's start agree to this relative error, or the
#: chain runs again in one block from ``A_0`` (on the device, no host synchronisation).  The
#: chain's float64 rounding over a block is far below it; a start error at it is far below the
#: float32 state's rounding.
BLOCK_START_RTOL = 1e-9
#: The float32 chain's check, per token of a block: ``L`` float32 unit roundoffs relative for a
#: block of ``L`` tokens, the first-order bound of a chain that rounds once a step at the scale
#: of ``A``.  Its block ends differ from the float64 starts by 0.012 to 0.019 of it on the
#: layer's penalties under the interpreter (bf16 inputs, dk = 16 and 64, blocks of 256 to 2048
#: tokens) and by 0.014 to 0.034 on an H100's tf32x3 products (dk = 64 and 128), and starts
#: without the nudges by 133 to 348 times it (benchmarks/gpu/float32_chain_checks.py).
FLOAT32_CHAIN_RTOL_PER_TOKEN = 2.0**-24
#: Products-only block starts (:func:`penalty_block_starts` with ``normalise=False``) apply the
#: blocks' matrices without re-normalising over at most this many tokens per unit of key width,
#: then take the next span from its first start solved.  Their error grows steeply with the
#: span (``benchmarks/results/cpu/block_start_spans.json``: the layer's penalties,
#: ``‖u‖² = 1/dk``, random directions, paper preset, 32 blocks, against the normalised
#: starts): over the whole sequence 2.6 and 1.7 at dk = 4 and 8 over 32768 tokens,
#: 3.9e-13 / 2.1e-11 / 2.4e-8 / 2.3 at dk = 16 over 8192 / 16384 / 32768 / 65536,
#: 1.7e-13 / 1.7e-10 / 4.6e-5 at dk = 32 over 16384 / 32768 / 65536, 2.8e-13 / 6.7e-11 /
#: 8.6e-6 at dk = 64 over 32768 / 65536 / 131072, 1.4e-13 at dk = 128 over 65536, so that
#: past about ``512·dk`` tokens the block-end check fails and the forward runs its sequential
#: second pass; in spans of ``512·dk`` tokens at most 6.3e-13 in every case.
PRODUCTS_ONLY_SPAN_PER_KEY = 512
#: Bytes of float64 piece matrices that :func:`penalty_block_starts` holds at once.
_PIECE_BYTES = 256 * 2**20


class _FallbackCount:
    """How many calls failed the block-start check and ran the chain in one block
    (``BLOCK_START_FALLBACKS[0]``; tests and benchmarks read it).  The count is kept on each
    device, so that the forward never waits for the check; reading it waits for the devices
    that counted."""

    def __init__(self) -> None:
        self._counts: dict[torch.device, torch.Tensor] = {}

    def add(self, flag: torch.Tensor) -> None:
        """Count the int32 ``flag`` ``[1]`` (0 or 1) on its device, without synchronising."""
        count = self._counts.get(flag.device)
        if count is None:
            self._counts[flag.device] = flag.to(torch.int64).clone()
        else:
            count.add_(flag)

    def __getitem__(self, index: int) -> int:
        if index != 0:
            raise IndexError("BLOCK_START_FALLBACKS has one entry, [0]")
        return sum(int(c.item()) for c in self._counts.values())


#: How many calls recomputed their chain after a failed block-start check (``[0]``).
BLOCK_START_FALLBACKS = _FallbackCount()
#: Largest dk and dv.
MAX_HEAD_DIM = 128
#: ``input_precision`` of the float32 state-chain products.
INPUT_PRECISIONS: tuple[str, ...] = ("ieee", "tf32")
#: Precisions of the penalty chain (``penalty_dtype``); ``"auto"`` is :func:`_penalty_dtype`.
PENALTY_DTYPES: tuple[str, ...] = ("auto", "float64", "float32")
_DTYPES = ("float32", "bfloat16", "float16")
_NEVER = 2**31 - 1  # a nudge period meaning "never"
#: Planted bugs for the meta-tests (``planted_bug=`` of :func:`chunked_vla`).
PLANTED_BUGS: dict[str, int] = {
    "nudge_one_step_late": kernels.BUG_NUDGE_ONE_STEP_LATE,
    "read_before_write": kernels.BUG_READ_BEFORE_WRITE,
    "block_starts_without_nudges": kernels.BUG_BLOCK_STARTS_WITHOUT_NUDGES,
    "unchecked_block_starts": kernels.BUG_UNCHECKED_BLOCK_STARTS,
    "block_matrix_nudge_first": kernels.BUG_MATRIX_NUDGE_FIRST,
    "ut_block_term": kernels.BUG_UT_BLOCK_TERM,
    "elimination_unsolved_row": kernels.BUG_ELIMINATION_UNSOLVED_ROW,
    "saved_s_over_pivot": kernels.BUG_SAVED_S_OVER_PIVOT,
    "saved_normaliser_before_key": kernels.BUG_SAVED_NORMALISER_BEFORE_KEY,
}


def interpreted() -> bool:
    """Whether the kernels were built for Triton's CPU interpreter."""
    return built_for_interpreter(kernels.state_starts_kernel)


def availability_reason() -> str | None:
    """``None`` if the kernels can run here, else why not."""
    return _availability_reason(interpreted())


def _pow2(n: int) -> int:
    return max(16, triton.next_power_of_2(n))


_PARAMS: dict[tuple[Any, ...], torch.Tensor] = {}
_IDENTITIES: dict[tuple[Any, ...], torch.Tensor] = {}
_ZERO_STATES: dict[tuple[Any, ...], torch.Tensor] = {}


def _capturing(device: torch.device) -> bool:
    """Whether the current stream on ``device`` is capturing a CUDA graph: a tensor made then
    is filled only when the graph replays, so it must not be cached."""
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


def _identity(dk: int, device: torch.device) -> torch.Tensor:
    """The float64 identity of order ``dk`` on ``device``, made once (the callers only read it):
    each call's own would cost the host a launch."""
    key = (dk, device)
    if key not in _IDENTITIES:
        eye = torch.eye(dk, dtype=torch.float64, device=device)
        if _capturing(device):
            return eye
        if len(_IDENTITIES) > 64:
            _IDENTITIES.clear()
        _IDENTITIES[key] = eye
    return _IDENTITIES[key]


def _zero_state(BH: int, dv: int, dk: int, device: torch.device) -> torch.Tensor:
    """A zero float32 ``S`` ``[BH, dv, dk]``, made once per shape and device: the state kernel
    only reads its initial state."""
    key = (BH, dv, dk, device)
    if key not in _ZERO_STATES:
        zeros = torch.zeros(BH, dv, dk, dtype=torch.float32, device=device)
        if _capturing(device):
            return zeros
        if len(_ZERO_STATES) > 16:  # many shapes (a property search): do not grow forever
            _ZERO_STATES.clear()
        _ZERO_STATES[key] = zeros
    return _ZERO_STATES[key]


def _params(config: VLAConfig, device: torch.device) -> torch.Tensor:
    """The configuration scalars as a float64 device tensor, made once per (config, device): a
    host-to-device copy from pageable memory waits for the stream, so a copy per call would
    stall the host before every launch."""
    values = (config.lambda0, config.sm_floor, config.nudge_eta, config.out_eps, config.norm_eps)
    key = (values, device)
    if key not in _PARAMS:
        if len(_PARAMS) > 64:  # many configurations (a property search): do not grow forever
            _PARAMS.clear()
        _PARAMS[key] = torch.tensor(values, dtype=torch.float64, device=device)
    return _PARAMS[key]


def penalty_block_length(
    T: int,
    penalty_chunk: int,
    penalty_block: int | None = None,
    *,
    dk: int = 64,
    heads: int = 1,
    device: torch.device | str | None = None,
    chain_dtype: str = "float64",
) -> int:
    """Tokens per penalty-chain block: ``penalty_block`` if given; else one block of ``T``
    tokens (rounded up to ``penalty_chunk``) up to the key width's
    :data:`ONE_PENALTY_BLOCK_UP_TO`; else the smallest multiple of ``penalty_chunk`` that is
    at least the width's :data:`DEFAULT_PENALTY_BLOCK` and gives at most as many blocks as
    the penalty kernel's programs that run at once on ``device`` share among the ``heads``
    (``B·H``) sequences, and at most :data:`MAX_PENALTY_BLOCKS` (twice as many where its
    programs have 2 warps); ``chain_dtype``, the penalty chain's (``"float64"`` or
    ``"float32"``), chooses the warps with the key width (:data:`HALF_PENALTY_WARPS_FROM`).

    Each block is one program walking its tokens one chunk after another, so the chain takes
    as long as its longest walk times the waves of programs: past one wave more blocks only
    add block starts (at D = 128, B·H = 16 on a 132-SM GPU: eight blocks, the fastest measured
    at T = 4096 and 16384; :data:`DEFAULT_PENALTY_BLOCK`).  ``device`` ``None`` or not a CUDA
    device: no limit but :data:`MAX_PENALTY_BLOCKS`."""
    if penalty_block is not None:
        return penalty_block
    chunks = max(1, math.ceil(T / penalty_chunk))
    if T <= _row(ONE_PENALTY_BLOCK_UP_TO, dk):
        return chunks * penalty_chunk
    warps = _penalty_chain_warps(dk, T, chain_dtype)
    most = MAX_PENALTY_BLOCKS * max(1, 4 // warps)
    programs = _penalty_programs_at_once(device, warps)
    if programs is not None:
        most = min(most, max(1, programs // max(1, heads)))
    least = _row(DEFAULT_PENALTY_BLOCK, dk)
    per_block = max(math.ceil(least / penalty_chunk), math.ceil(chunks / most))
    return per_block * penalty_chunk


def _row(table: dict[int, int], dk: int) -> int:
    """The row of the narrowest width at least ``dk`` (the widest row past every width)."""
    return next((n for w, n in sorted(table.items()) if dk <= w), table[max(table)])


def _penalty_chain_warps(dk: int, T: int, chain_dtype: str = "float64") -> int:
    """Warps of the penalty kernel at key width ``dk`` over ``T`` tokens per sequence, its chain
    in ``chain_dtype`` (:data:`PENALTY_CHAIN_WARPS`, else the state kernels' 4 up to a 64-wide
    key tile and 8 above, halved from :data:`HALF_PENALTY_WARPS_FROM`)."""
    BK = max(32, _pow2(dk))
    if BK in PENALTY_CHAIN_WARPS:
        return PENALTY_CHAIN_WARPS[BK]
    warps = 4 if BK <= 64 else 8
    if T >= HALF_PENALTY_WARPS_FROM.get((BK, chain_dtype), T + 1):
        return warps // 2
    return warps


_PROGRAMS_AT_ONCE: dict[tuple[int, int], int] = {}


def _penalty_programs_at_once(device: torch.device | str | None, warps: int) -> int | None:
    """How many penalty-kernel programs of ``warps`` warps the CUDA ``device`` runs at once
    (its SMs times the programs whose registers fit one SM); ``None`` off CUDA."""
    if device is None:
        return None
    where = torch.device(device)
    if where.type != "cuda":
        return None
    index: int = torch.cuda.current_device() if where.index is None else where.index
    key = (index, warps)
    if key not in _PROGRAMS_AT_ONCE:
        props = torch.cuda.get_device_properties(index)
        registers = int(getattr(props, "regs_per_multiprocessor", 65536))
        per_sm = max(1, registers // (_PENALTY_KERNEL_REGISTERS * 32 * warps))
        _PROGRAMS_AT_ONCE[key] = int(props.multi_processor_count) * per_sm
    return _PROGRAMS_AT_ONCE[key]


def penalty_block_starts(
    u: torch.Tensor | None,
    A0: torch.Tensor,
    *,
    start: int,
    nudge_period: int | None,
    nudge_eta: float,
    block: int,
    normalise: bool = True,
    matrices: torch.Tensor | None = None,
    cholesky: bool = False,
) -> torch.Tensor:
    """The penalty ``A`` at the start of every block of ``block`` tokens (spec §2.3), float64.

    ``u`` ``[BH, T, dk]`` (``None`` where ``matrices`` are given) and ``A0`` ``[BH, dk, dk]``
    (symmetric positive definite) in float64;
    ``start`` the nudge clock (spec §2.3).  Returns ``[BH, NB, dk, dk]``, ``NB = ⌈T/block⌉``,
    block 0 starting from ``A0``.

    Writing ``A = Π Θ^{-1}``, a Sherman–Morrison step is ``Θ ← Θ + u uᵀ Π`` and a nudge
    ``Π ← Π + η Θ``: both are linear in ``(Π, Θ)``.  A piece of tokens between nudges with
    ``G = Σ u uᵀ`` followed by a nudge ``η`` (0 if none) acts on the stacked ``(Π; Θ)`` as the
    ``2dk × 2dk`` matrix ``E = [[I + ηG, ηI], [G, I]]``, and a block as the product of its
    pieces' matrices.  ``normalise=True`` then applies each block's matrix
    to ``(A, I)`` and re-normalises by one solve, ``A ← Π Θ^{-1}``, block after block, so that
    no product of many blocks' matrices (whose modes separate like ``(1 + √(η‖G‖))`` per
    period) is ever formed.  ``normalise=False`` applies the blocks' matrices to ``(A0; I)``
    block after block (``NB − 1`` dependent ``2dk × 2dk`` by ``2dk × dk`` products, one launch of
    :func:`~.triton_chunked_kernels.penalty_block_starts_kernel` per span of
    :data:`PRODUCTS_ONLY_SPAN_PER_KEY` ``· dk`` tokens, each span from its first start solved)
    and solves once for all blocks: no solve per block, exact in exact arithmetic but open to
    the modes' separation, so its caller checks the result (:func:`_forward`).  Without nudges
    the block starts are ``(A0^{-1} + Σ_{earlier blocks} UᵀU)^{-1}``, all at once.

    ``matrices`` ``[BH, NB, 2dk, 2dk]`` float64: the blocks' matrices, from
    :func:`penalty_block_matrices` (the forward's way: the block's steps applied column by
    column in one kernel); else formed here as products of the pieces' matrices by pairwise
    trees (``⌈log₂ m⌉`` batched products for ``m`` pieces per block), the reference that the
    kernel is tested against.

    ``cholesky``: the products-only starts solved in the Cholesky form of
    :func:`_solve_block_starts` (the float32 chain's), else by LU.

    Exact only where no Sherman–Morrison denominator is floored: ``δ = 1 + uᵀAu ≥ 1`` for a
    positive definite ``A``, so the caller runs one block when ``A0`` is not positive definite
    or ``sm_floor > 1``.
    """
    BH, dk = A0.shape[0], A0.shape[-1]
    if matrices is not None:
        NB = matrices.shape[1]
    elif u is not None:
        NB = math.ceil(u.shape[1] / block)
    else:
        raise VLAInputError("u", "the penalty directions are needed where no matrices are given")
    if NB == 1:
        return A0[:, None]
    dev, f64 = A0.device, torch.float64
    eye = _identity(dk, dev)
    if nudge_period is None:
        assert u is not None
        T = u.shape[1]
        Up = torch.nn.functional.pad(u, (0, 0, 0, NB * block - T)).view(BH, NB, block, dk)
        G = Up.mT @ Up
        M = torch.linalg.inv(A0)[:, None] + (torch.cumsum(G, dim=1) - G)
        return torch.cholesky_inverse(torch.linalg.cholesky(M))
    if matrices is None:
        assert u is not None
        matrices = _block_matrices_by_trees(u, start, int(nudge_period), nudge_eta, block)
    Bm = matrices
    if not normalise:
        # (Π; Θ) at every block start, block after block: (Π; Θ)_{b+1} = Bm_b (Π; Θ)_b from
        # (A0; I), a 2dk × 2dk by 2dk × dk product per block, in one launch per span of
        # PRODUCTS_ONLY_SPAN_PER_KEY · dk tokens, each span from its first start solved.
        XX = torch.empty(NB, BH, 2 * dk, dk, dtype=f64, device=dev)
        XX[0, :, :dk] = A0
        XX[0, :, dk:] = eye
        Bm = Bm.contiguous()
        nc = 16
        per_span = max(1, PRODUCTS_ONLY_SPAN_PER_KEY * dk // block)
        for b0 in range(0, NB - 1, per_span):
            if b0 > 0:
                XX[b0, :, :dk] = _solve_block_starts(XX[b0 : b0 + 1], cholesky)[:, 0]
                XX[b0, :, dk:] = eye
            kernels.penalty_block_starts_kernel[(BH, math.ceil(dk / nc))](
                Bm, XX, NB, BH, dk, b0, min(NB - 1, b0 + per_span), R=max(16, _pow2(2 * dk)),
                KB=32, NC=nc, num_warps=4 if dk <= 32 else 8,
            )  # fmt: skip
        return _solve_block_starts(XX, cholesky)
    A = A0
    starts = [A0]
    Bm = Bm.to(f64)
    for b in range(NB - 1):
        NumDen = Bm[:, b, :, :dk] @ A + Bm[:, b, :, dk:]
        A = torch.linalg.solve(NumDen[:, dk:], NumDen[:, :dk], left=False)  # Π Θ^{-1}
        A = 0.5 * (A + A.mT)
        starts.append(A)
    return torch.stack(starts, dim=1)


def _solve_block_starts(XX: torch.Tensor, cholesky: bool = False) -> torch.Tensor:
    """The starts ``A = Π Θ^{-1}``, symmetrised, ``[BH, NB, dk, dk]`` float64, from every
    block's ``(Π; Θ)`` ``XX`` ``[NB, BH, 2dk, dk]`` float64.

    Without ``cholesky``, by ``solve_ex`` without its error check and by cuBLAS's batched LU:
    ``torch.linalg.solve`` reads the LU's info back, and the batched LU PyTorch takes by
    default (MAGMA's) synchronises the device, so each call waited for the GPU
    (``h200/host_trace_syncs.json``: 6.4 ms at D = 128, T = 16384).  A singular ``Θ`` gives
    non-finite starts, which the caller's block-end check rejects.

    ``cholesky``: ``A`` is symmetric, so ``Πᵀ Θ = Θᵀ Π`` and ``S = Θᵀ Π = Θᵀ A Θ`` is
    symmetric positive definite; with ``S = L Lᵀ`` and ``W = Π L^{-T}``, ``A = W Wᵀ``,
    symmetric by construction, from one factorisation without a pivot search and one
    triangular solve.  Forming ``S`` squares ``Θ``'s condition in its rounding: on the layer's
    penalties the starts err by up to about 1e-10 where the LU's err by 1e-12
    (``benchmarks/prototypes/block_start_inverse_forms.py``), so only the float32 chain, whose
    check allows ``block · 2^-24``, takes it.  The factorisation reads ``S``'s lower triangle
    alone, without its info read back: a factor that does not exist gives wrong starts, which
    the block-end check rejects.  Side by side on one H100 (B = 1, H = 16, T = 16384, bf16;
    ``h100/block_start_solve_forms_float32_gate_0dc9f85.json``, ``validate`` of the backend
    with it passing first): the solve 0.263 against the LU's 0.351 ms at dk = 64 and 0.577
    against 0.865 at 128, the forward 1.57 against 1.66 and 4.32 against 4.59 ms."""
    NB, BH, _, dk = XX.shape
    if cholesky:
        # Three-dimensional operands, so that each product is one batched product.
        X3 = XX.reshape(NB * BH, 2 * dk, dk)
        Pi, Th = X3[:, :dk], X3[:, dk:]
        S = torch.bmm(Th.mT, Pi)
        with _batched_cublas_lu(XX.device):
            L = torch.linalg.cholesky_ex(S)[0]
            W = torch.linalg.solve_triangular(L.mT, Pi, upper=True, left=False)  # Π L^{-T}
        return torch.bmm(W, W.mT).view(NB, BH, dk, dk).transpose(0, 1)
    with _batched_cublas_lu(XX.device):
        A = torch.linalg.solve_ex(XX[:, :, dk:], XX[:, :, :dk], left=False)[0]  # Π Θ^{-1}
    return (0.5 * (A + A.mT)).transpose(0, 1)


@contextlib.contextmanager
def _batched_cublas_lu(device: torch.device) -> Iterator[None]:
    """PyTorch's linear algebra on ``device`` by cuSOLVER/cuBLAS inside the block: its batched LU
    and LU solve are then cuBLAS's ``getrfBatched``/``getrsBatched``, which leave the info on the
    device.  The setting is process-wide: restored on exit; nothing else runs in between on this
    thread."""
    if device.type != "cuda":
        yield
        return
    previous = torch.backends.cuda.preferred_linalg_library()
    torch.backends.cuda.preferred_linalg_library("cusolver")
    try:
        yield
    finally:
        torch.backends.cuda.preferred_linalg_library(previous)


def penalty_block_matrices(
    u: torch.Tensor, params: torch.Tensor, *, start: int, nudge_period: int, block: int,
    bug: int = 0, last: bool = True, dtype: torch.dtype = torch.float64,
) -> torch.Tensor:  # fmt: skip
    """Each block's matrix on ``(Π; Θ)`` (:func:`penalty_block_starts`) by
    :func:`~.triton_chunked_kernels.penalty_block_matrix_kernel`: ``[BH, NB, 2dk, 2dk]``
    of ``dtype`` from ``u`` ``[B, T, H, dk]`` (contiguous; float32 for float64 matrices,
    float32 or 16-bit for float32 ones, whose products are tf32x3), ``params`` the
    configuration scalars (:func:`_params`), ``start`` the nudge clock modulo ``nudge_period``.
    Without ``last`` the last block's matrix is left zero: no block starts after it, so the
    block starts never read it, and its tokens are ``1/NB`` of the kernel's work."""
    B, T, H, dk = u.shape
    NB = math.ceil(T / block)
    BK = max(32, _pow2(dk))
    nc, ch, warps = _block_matrix_launch(BK, dtype)
    out = torch.empty(B * H, NB, 2 * dk, 2 * dk, dtype=dtype, device=u.device)
    built = NB if last else NB - 1
    if built < NB:
        out[:, built:].zero_()
    if built > 0:
        kernels.penalty_block_matrix_kernel[(B * H, built, 2 * BK // nc)](
            u, out, params, T, H, start, nudge_period, block, NB, H * dk, dk, dk,
            BK=BK, NC=nc, CH=ch, PD=_tl_dtype(dtype), BUG=bug, num_warps=warps,
        )  # fmt: skip
    return out


def _block_matrix_launch(BK: int, dtype: torch.dtype) -> tuple[int, int, int]:
    """``(NC, CH, warps)`` of :func:`penalty_block_matrices`' launch: columns per program,
    token rows per product and warps, at key tile width ``BK`` for matrices of ``dtype``.

    Measured side by side on an H100 at T = 16384 (``benchmarks/gpu/block_matrix_variants.py``;
    each shape's matrices agreeing with the backend's first).  float64
    (``h100/block_matrix_variants_8e0d05d.json`` and ``..._wider_8e0d05d.json``, bit for bit):
    32 columns and rows, 2 warps at BK = 64 (0.42 against 0.64 ms with 4), 4 at 128 (1.90
    against 3.13 with 8, 4.08 with 2).  float32, the tf32x3 matrices of the float32 chain
    (``h100/block_matrix_variants_float32_27f2c2f.json``, within the per-token tolerance):
    64 columns a program, 4 warps at BK = 64 (0.252 against 0.317 ms for 32 columns with 2
    warps, blocks of 512 tokens) and 8 at 128 (1.09 against 1.50 for 32 columns with 4, blocks
    of 2048)."""
    if dtype == torch.float64:
        return 32, 32, 2 if BK <= 64 else 4
    return min(64, 2 * BK), 32, 4 if BK <= 64 else 8


def _block_matrices_by_trees(
    u: torch.Tensor, start: int, P: int, nudge_eta: float, block: int
) -> torch.Tensor:
    """Each block's matrix on ``(Π; Θ)`` (:func:`penalty_block_starts`) as the product of its
    pieces' matrices, by pairwise trees: ``[BH, NB, 2dk, 2dk]`` float64 from ``u``
    ``[BH, T, dk]`` float64."""
    BH, T, dk = u.shape
    NB = math.ceil(T / block)
    dev, f64 = u.device, torch.float64
    eye = torch.eye(dk, dtype=f64, device=dev)
    t = torch.arange(T, device=dev)
    g = start + t + 1  # the global step of each token
    grp = (g - 1) // P  # the nudge period it falls in; a nudge follows its last step
    blk = t // block
    # Pieces of a block between nudges: ``sidx`` counts the periods begun inside the block.
    sidx = grp - (start + blk * block) // P
    m = (block - 1) // P + 2  # pieces per block, at most (empty pieces are the identity)
    Lseg = min(P, block)
    pos = t - torch.maximum(blk * block, grp * P - start)
    piece = blk * m + sidx
    Up = torch.zeros(BH, NB * m * Lseg, dk, dtype=f64, device=dev)
    Up[:, piece * Lseg + pos] = u
    Up = Up.view(BH, NB, m, Lseg, dk)
    nudged = torch.zeros(NB * m, dtype=f64, device=dev)
    nudged.index_put_((piece,), (g % P == 0).to(f64), accumulate=True)
    eta = (nudged.view(NB, m) * nudge_eta)[None, :, :, None, None]
    # The block's matrix E_{m-1} ⋯ E_0: pairwise trees over groups of pieces (an odd last
    # matrix carries over), the groups sized to keep their matrices within _PIECE_BYTES.
    group = max(1, min(m, _PIECE_BYTES // (BH * NB * (2 * dk) ** 2 * 8)))
    Bm = None
    for s0 in range(0, m, group):
        Us = Up[:, :, s0 : s0 + group]
        G = Us.mT @ Us  # [BH, NB, group, dk, dk]
        e = eta[:, :, s0 : s0 + group]
        E = torch.empty(*G.shape[:3], 2 * dk, 2 * dk, dtype=f64, device=dev)
        E[..., :dk, :dk] = eye + e * G
        E[..., :dk, dk:] = e * eye
        E[..., dk:, :dk] = G
        E[..., dk:, dk:] = eye
        while E.shape[2] > 1:
            pairs = E.shape[2] // 2
            prod = E[:, :, 1 : 2 * pairs : 2] @ E[:, :, 0 : 2 * pairs : 2]
            E = torch.cat([prod, E[:, :, 2 * pairs :]], dim=2)
        Bm = E[:, :, 0] if Bm is None else E[:, :, 0] @ Bm
    assert Bm is not None  # m >= 2
    return Bm


def _symmetric_positive_definite(A: torch.Tensor) -> bool:
    """Whether the float64 ``A`` ``[BH, dk, dk]`` is symmetric to its input's rounding and
    positive definite (a device sync)."""
    scale = A.abs().amax(dim=(-2, -1), keepdim=True)
    asym = (A - A.mT).abs().amax(dim=(-2, -1), keepdim=True)
    if bool((asym > 64 * torch.finfo(torch.float32).eps * scale).any()):
        return False
    return bool((torch.linalg.cholesky_ex(0.5 * (A + A.mT)).info == 0).all())


def _state_dtype(dtype: torch.dtype, training: bool) -> torch.dtype:
    """The dtype of the state side's stored intermediates (the gates, ``K̃``, ``Ṽ``, ``E``, the
    chunk-start ``S``) and of its products' operands (the UT transform's, the state chain's
    and the read-out's), for inputs of ``dtype`` in training or not (design doc, "What
    runs"): bf16 in the inference forward of bf16 inputs, as fla's kernels keep theirs,
    float32 (tf32 products for 16-bit inputs) otherwise; the backward reads the gates and the
    chunk-start states, so training keeps float32.

    Side by side on one H100 (B = 1, H = 16, paper preset, T = 16384, two rounds), the bf16
    inference forward takes 2.33 / 2.34 ms against 2.40 / 2.40 with the UT transform's
    products in tf32 at D = 64 and 7.25 / 7.25 against 7.34 / 7.38 at D = 128
    (``h100/ut_operands_7e50d46.json``), and 2.39 / 2.40 (UT in tf32) against 2.62 / 2.62 with
    float32 intermediates at D = 64 (``h100/forward_patches_7a12987.json``).  On the carry
    counterexample of ``tests/data`` (tiny queries on positive keys, the state carried across a
    cut) it errs by 0.42 of the spec §4 bf16 budget, on the H100 and in the interpreter alike
    (tf32 UT products 0.46, float32 intermediates 0.13)."""
    if dtype == torch.bfloat16 and not training:
        return torch.bfloat16
    return torch.float32


def _penalty_dtype(penalty_dtype: str, dtype: torch.dtype, training: bool) -> torch.dtype:
    """The penalty chain's dtype: ``penalty_dtype`` where it names one; for ``"auto"`` float32
    in the inference forward of bf16 inputs and float64 otherwise (design doc, "Precision of
    the penalty chain").

    Under the bf16 budget of spec §4 the float32 and float64 chains give the same ratios (the
    bf16 state side's rounding sets them), and the float32 chain's block ends, checked against
    the float64 products-only starts at :data:`FLOAT32_CHAIN_RTOL_PER_TOKEN` a token, sit at
    0.014 to 0.034 of that tolerance on the layer's penalties on an H100
    (``h100/float32_chain_checks_56ff2c5.json``).  Side by side on that H100 (B = 1, H = 16,
    paper preset) the forward takes 2.04 against 2.34 ms at D = 64, T = 16384, 6.24 against
    7.25 at D = 128 and 6.49 against 7.62 at D = 64, T = 65536
    (``h100/float32_chain_timings_56ff2c5.json``); at D = 64, T = 4096 its device time is
    0.78 against 0.87 ms, and there the call waits for the host (medians 1.01 / 1.07 against
    1.05 / 1.07 in two rounds on another H100, ``h100/chain_reciprocals_387233f.json``).
    Float32 inputs keep
    float64: there the float32 chain puts ``S`` at 1.93 of the budget on strong penalties.
    Training keeps it as well: the backward starts from the chain's checkpoints, its gradients
    are measured with the float64 chain, and the forward + backward gains nothing measurable
    (13.65 against 13.72 ms at D = 64, T = 16384)."""
    if penalty_dtype == "float64" or (
        penalty_dtype == "auto" and (dtype != torch.bfloat16 or training)
    ):
        return torch.float64
    return torch.float32


def _forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    u: torch.Tensor,
    config: VLAConfig,
    initial_state: tuple[torch.Tensor, ...] | None,
    start: int,
    C: int,
    CP: int,
    penalty_block: int | None,
    input_precision: str,
    penalty_dtype: str,
    bug: int,
    save_checkpoints: bool = False,
) -> tuple[
    torch.Tensor, tuple[torch.Tensor, torch.Tensor, torch.Tensor], tuple[Checkpoints, Chain] | None
]:
    """Launch the kernels (module docstring); returns ``o`` (inputs' dtype), the float32
    state and, with ``save_checkpoints``, what the backward reads (:func:`_recurrent_adjoint`):
    the checkpoints ``Sᵀ`` ``[B, H, nc, dk, dv]``, ``Aᵀ`` ``[B, H, nc + 1, dk, dk]``, ``z``
    ``[B, H, nc + 1, dk]`` float32 before every :data:`_CHECKPOINT_EVERY` tokens and after the
    last, ``nc = ⌈T / _CHECKPOINT_EVERY⌉``; and the chains' per-token values (:data:`Chain`),
    float32 ``[B·H, T, ·]`` rows of the recurrent backward's key tile width (``k̂, α̂, s``) or
    2 and 4 scalars, which the penalty and read-out kernels store as they form them."""
    B, T, H, dk = q.shape
    dv = v.shape[-1]
    dev = q.device
    q, k, v, u = (x.contiguous() for x in (q, k, v, u))
    # At least 32: Triton 3.6 failed to lower the float64 penalty kernel at a 16-wide key tile
    # on sm_90 (an H200 run of benchmarks/gpu/chunk_h200.py); zero padding is exact.
    BK, BV = max(32, _pow2(dk)), _pow2(dv)
    BH = B * H
    L = max(C, CP)
    TP = math.ceil(T / L) * L
    pd = _penalty_dtype(penalty_dtype, q.dtype, save_checkpoints)
    f32 = torch.float32
    # Each torch operation costs the host a launch, and at T of a few thousand the host's work
    # per call is above the device's (the H100 traces of benchmarks/gpu/chunk_h200.py
    # --host-trace): the default state comes from cached tensors, z from three operations.
    z0: torch.Tensor | None
    if initial_state is None:
        A0 = _identity(dk, dev).div(config.lambda0).expand(BH, dk, dk)
        S0 = _zero_state(BH, dv, dk, dev)
        z0 = None
        parallel = config.sm_floor <= 1.0
    else:
        S_in, A_in, z_in = initial_state
        A0 = A_in.reshape(BH, dk, dk).to(torch.float64)
        S0 = S_in.reshape(BH, dv, dk).to(f32).contiguous()
        z0 = z_in.reshape(BH, dk).to(f32).contiguous()
        parallel = config.sm_floor <= 1.0 and _symmetric_positive_definite(A0)
    params = _params(config, dev)
    period = _NEVER if config.nudge_period is None else int(config.nudge_period)
    start_mod = start % period
    # Blocks of the penalty chain run in parallel from their start penalties, which are exact
    # only where no denominator is floored (penalty_block_starts); else one block.
    chain_dtype = "float64" if pd == torch.float64 else "float32"
    block = (penalty_block_length(T, CP, penalty_block, dk=dk, heads=BH, device=dev,
                                  chain_dtype=chain_dtype)
             if parallel else CP * math.ceil(T / CP))  # fmt: skip
    NB = math.ceil(T / block)
    # The penalty chain reads float32 keys and penalties: Triton 3.6 fails to lower the
    # kernel's 16-bit → float64 conversions on sm_90 (`PassManager::run failed` in
    # ConvertTritonGPUToLLVM, an H200 run of benchmarks/gpu/chunk_h200.py --compile-check),
    # while the same kernel on float32 inputs builds.  The copies cost 8·dk bytes per token.
    kp, up = (x.float() if pd == torch.float64 else x for x in (k, u))
    matrices: dict[bool, torch.Tensor] = {}

    def starts(normalise: bool, planted: bool) -> torch.Tensor:
        if NB == 1:
            return A0[:, None]
        if config.nudge_period is None:  # closed form from the keys' Gram matrices
            u64 = u.permute(0, 2, 1, 3).reshape(BH, T, dk).to(torch.float64)
            return penalty_block_starts(
                u64, A0, start=start_mod, nudge_period=None, block=block, nudge_eta=0.0,
                normalise=normalise,
            )  # fmt: skip
        if planted not in matrices:
            matrix_bug = bug if bug == kernels.BUG_MATRIX_NUDGE_FIRST else kernels.BUG_NONE
            # The float32 chain's starts from float32 matrices (tf32x3 products of the
            # penalties as they are), applied and solved in float64 as the float64 chain's.
            matrices[planted] = penalty_block_matrices(
                up if pd == torch.float32 or up.dtype == torch.float32 else u.float(), params,
                start=start_mod, nudge_period=period, block=block,
                bug=kernels.BUG_BLOCK_STARTS_WITHOUT_NUDGES if planted else matrix_bug,
                last=False, dtype=pd,
            )  # fmt: skip
        return penalty_block_starts(
            None, A0, start=start_mod, nudge_period=config.nudge_period, block=block,
            nudge_eta=config.nudge_eta, normalise=normalise, matrices=matrices[planted],
            cholesky=pd == torch.float32,
        )  # fmt: skip

    # The chain starts from the products-only block starts and checks them against its own
    # block ends (below), to its own precision.
    scan_bug = bug in (kernels.BUG_BLOCK_STARTS_WITHOUT_NUDGES, kernels.BUG_UNCHECKED_BLOCK_STARTS)
    A_starts = starts(normalise=False, planted=scan_bug)
    # The state side's stored intermediates (gates, K̃, Ṽ, E, the chunk-start S).
    sd = _state_dtype(q.dtype, save_checkpoints)
    gates = torch.empty(BH, TP, BK, dtype=sd, device=dev)
    W = torch.empty(BH, NB, CP, BK, dtype=pd, device=dev)
    bkb = min(BK, 32)
    # At dk = 128 a [64, 128] float32 tile is 64 registers per thread over 4 warps, and each
    # kernel holds several: 8 warps keep them in registers.
    warps = 4 if BK <= 64 else 8
    # The UT transform's program: 2 warps up to a 64-wide key tile, 4 above.  The forward at
    # T = 16384 took 2.32 ms at D = 64 against 2.46 with 4 (h200/launch_warps_64_8e0d05d.json,
    # the rows that changed only backward kernels), 7.43 against 7.76 with 8 at D = 128
    # (h200/ut_warps_9d069e1.json).  Those forwards kept bf16 intermediates; with float32 ones
    # the training step took 16.8 against a median of 17.2 ms at D = 64 and 53.9 against 55.1
    # at D = 128.
    prep_warps = 2 if BK <= 64 else 4
    nck = math.ceil(T / _CHECKPOINT_EVERY)
    cka = torch.empty(BH, nck + 1, dk, dk, dtype=f32, device=dev) if save_checkpoints else W
    # The chains' per-token values for the backward, in the recurrent adjoint's layout (rows
    # of its key tile BKS, which is narrower than BK below dk = 32).
    BKS = fused._pow2(dk)
    if save_checkpoints:
        kh_s, sv_s = (torch.empty(BH, T, BKS, dtype=f32, device=dev) for _ in range(2))
        sc_s = torch.empty(BH, T, 2, dtype=f32, device=dev)
        cs_s = torch.empty(BH, T, 4, dtype=f32, device=dev)
    else:
        kh_s = sv_s = sc_s = cs_s = gates  # not written

    def penalty_chain(A_starts: torch.Tensor, flag: torch.Tensor | None = None) -> torch.Tensor:
        # X = each block's start Aᵀ, zero-padded to [BK, BK] (padding stays zero); on exit
        # each block's end Aᵀ.  With a flag, one block from A_0 that runs only where it is set.
        nb = A_starts.shape[1]
        if dk == BK:
            X = A_starts.mT.to(pd, memory_format=torch.contiguous_format, copy=True)
        else:
            X = torch.zeros(BH, nb, BK, BK, dtype=pd, device=dev)
            X[:, :, :dk, :dk] = A_starts.mT.to(pd)
        kernels.penalty_chain_kernel[(BH, nb)](
            kp, up, X, W, gates, cka, kh_s, sv_s, cs_s, params, gates if flag is None else flag,
            T, H, start_mod, period, H * dk, dk, DK=dk,
            CPB=(block if flag is None else CP * math.ceil(T / CP)) // CP, NCK=nck + 1,
            CKE=_CHECKPOINT_EVERY, BK=BK, BKB=bkb, CP=CP, TP=TP, PD=_tl_dtype(pd),
            CHAIN_PREC="ieee" if pd == torch.float64 else "tf32x3",
            NORMALIZE_GATE=config.normalize_gate, SAVE_CKPT=save_checkpoints,
            SAVE_CHAIN=save_checkpoints, BKS=BKS,
            ELIMINATE=PENALTY_FACTORISATIONS.index(PENALTY_FACTORISATION), BUG=bug,
            COND=flag is not None, num_warps=_penalty_chain_warps(dk, T, chain_dtype),
        )  # fmt: skip
        return X

    # The state chain's buffers: written by the first pass, written over by the fallback's.
    NCk = math.ceil(T / C)
    Kt = torch.empty(BH, TP, BK, dtype=sd, device=dev)
    Vt = torch.empty(BH, TP, BV, dtype=sd, device=dev)
    o = torch.empty(B, T, H, dv, dtype=q.dtype, device=dev)
    S_out = torch.empty(BH, dv, dk, dtype=f32, device=dev)
    S_chunks = torch.empty(BH, NCk, BV, BK, dtype=sd, device=dev)
    E_buf = torch.empty(BH, TP, BV, dtype=sd, device=dev)
    # The read-out normaliser's z at each chunk's start, in the inputs' layout, and at the end.
    z_chunks = torch.empty(B, NCk, H, dk, dtype=f32, device=dev)
    z_out = torch.empty(B, H, dk, dtype=f32, device=dev)
    # Float32 operands of the state side's products (where the intermediates are float32):
    # tf32 for 16-bit inputs, whose spec §4 budget is set by the low-precision oracle, far
    # above tf32's rounding; the caller's input_precision for float32 inputs.
    prec = "tf32" if q.dtype in (torch.bfloat16, torch.float16) else input_precision
    bvb = min(BV, STATE_CHAIN_VALUE_BLOCK.get(BV, 32))
    bvo = min(BV, READOUT_VALUE_BLOCK.get(BV, 32))

    def state_chain(flag: torch.Tensor | None = None) -> None:
        # The state chain from the gates: the UT transform, the sequential S recurrence (two
        # products a chunk), then every chunk's read-out at once.  With a flag, only where set.
        cond = {"COND": flag is not None, "OP": _tl_dtype(sd), "PREC": prec}
        fl = gates if flag is None else flag
        kernels.state_prep_kernel[(TP // C, BH)](
            k, v, gates, Kt, Vt, z_chunks, params, fl, T, H, H * dk, dk, H * dv, dv,
            DK=dk, DV=dv, BK=BK, BV=BV, C=C, TP=TP, BUG=bug, num_warps=prep_warps, **cond,
        )  # fmt: skip
        kernels.state_starts_kernel[(BH, BV // bvb + 1)](
            gates, Kt, Vt, S0, S_chunks, E_buf, S_out, gates if z0 is None else z0,
            z_chunks, z_out, fl, T, H, dk, dv,
            BK=BK, BV=BV, BVB=bvb, C=C, TP=TP, HAS_Z0=z0 is not None, ZB=_KEY_SUM_CHUNKS,
            # Three pipeline stages (Triton's default) at every width: built for sm_90 at
            # BK = 128 with float32 intermediates they take 196608 bytes of shared memory in
            # value blocks of 32 rows (one stage 81920) and 180224 in blocks of 16, and the
            # forward at D = 128, T = 16384 took 7.81 against 8.21 ms with one
            # (h100/state_starts_stages_1b3e657.json).
            num_warps=STATE_CHAIN_WARPS.get(BK, warps), num_stages=3, **cond,
        )  # fmt: skip
        kernels.state_output_kernel[(NCk, BH, BV // bvo)](
            q, k, gates, E_buf, S_chunks, z_chunks, o, sc_s, params, fl, T, H, H * dk, dk,
            H * dv, dv, DK=dk, DV=dv, BK=BK, BV=BV, BVB=bvo, C=C, TP=TP,
            NORMALIZE_OUTPUT=config.normalize_output, SAVE_CHAIN=save_checkpoints, BUG=bug,
            num_warps=warps, **cond,
        )  # fmt: skip

    X = penalty_chain(A_starts)
    state_chain()
    A_end = X[:, NB - 1]
    if NB > 1 and bug != kernels.BUG_UNCHECKED_BLOCK_STARTS:
        # Each block's end, by the chain itself from its start, must be the next block's start.
        # The check stays on the device (a host synchronisation would expose the host's work of
        # every call): where it fails (rarely) a second pass runs the penalty chain in one block
        # from A_0, exact by construction, and the state chain again, writing over the first
        # pass's outputs; elsewhere its kernels return at once.
        flag = torch.zeros(1, dtype=torch.int32, device=dev)
        if A_starts.stride(-1) != 1 or A_starts.stride(-2) != dk:
            A_starts = A_starts.contiguous()
        kernels.block_end_check_kernel[(BH, NB - 1)](
            X, A_starts, flag, NB, A_starts.stride(0), A_starts.stride(1), dk,
            BLOCK_START_RTOL if pd == torch.float64 else FLOAT32_CHAIN_RTOL_PER_TOKEN * block,
            BK=BK, RB=min(BK, 32), num_warps=4,
        )  # fmt: skip
        BLOCK_START_FALLBACKS.add(flag)
        X_one = penalty_chain(A0[:, None], flag)
        state_chain(flag)
        A_end = torch.where(flag.bool(), X_one[:, 0], A_end)
    A = A_end[:, :dk, :dk].mT.to(f32).reshape(B, H, dk, dk)
    state = (S_out.view(B, H, dv, dk), A, z_out)
    if not save_checkpoints:
        return o, state, None
    # The chains' values at the checkpoints: S and z at every state chunk's start (a chunk
    # divides the interval), A from the penalty kernel, the first and last here.
    cka[:, 0] = A0.mT
    cka[:, nck] = A_end[:, :dk, :dk]
    every = _CHECKPOINT_EVERY // C
    cks = S_chunks[:, ::every, :dv, :dk].mT.reshape(B, H, nck, dk, dv).float().contiguous()
    ckz = torch.cat([z_chunks[:, ::every], z_out[:, None]], dim=1).transpose(1, 2).contiguous()
    ck = (cks, cka.view(B, H, nck + 1, dk, dk), ckz)
    # α̂ from the gate buffer: a view where its rows are the backward's (T = TP, BK = BKS).
    ah_s = gates[:, :T, :BKS].float().contiguous()
    return o, state, (ck, (kh_s, ah_s, sc_s, sv_s, cs_s))


def _tl_dtype(dtype: torch.dtype) -> Any:
    import triton.language as tl

    return {
        torch.float64: tl.float64,
        torch.float32: tl.float32,
        torch.bfloat16: tl.bfloat16,
        torch.float16: tl.float16,
    }[dtype]


def _recurrent_adjoint(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    u: torch.Tensor,
    initial: tuple[torch.Tensor, ...],
    config: VLAConfig,
    start: int,
    cotangents: tuple[torch.Tensor | None, ...],
    ck: Checkpoints,
    chain: Chain | None = None,
) -> tuple[torch.Tensor | None, ...]:
    """``dq, dk, dv, du, dS_0, dA_0, dz_0`` by the recurrent kernels' adjoint (module
    docstring, "Gradients") from the chunked forward's checkpoints ``ck`` and per-token chain
    values ``chain`` (:func:`_forward`; ``None``: the adjoint reruns the gate pass from the
    checkpoints instead).  ``initial`` ``()``: the spec §2.3 defaults, then the state's
    gradients are ``None``.  Both backends hold the state in the spec §1 layouts, so the
    cotangents and gradients pass through untransposed; ``None`` cotangents are zeros."""
    B, T, H, dk = q.shape
    run = fused._Run(
        config=config,
        plan=fused.plan_for(B, H, T, dk, v.shape[-1], q.dtype, q.device, True),
        checkpoint_every=_CHECKPOINT_EVERY,
        downdate=Downdate.FMA,  # fused_recurrent_vla's default
        start=start,
        bug=Bug.NONE,
    )
    q, k, v, u = (x.contiguous() for x in (q, k, v, u))
    dv = v.shape[-1]
    f32 = torch.float32
    shapes = (((B, T, H, dv), q.dtype), ((B, H, dv, dk), f32), ((B, H, dk, dk), f32),
              ((B, H, dk), f32))  # fmt: skip
    do, dS, dA, dz = (
        torch.zeros(shape, dtype=dt, device=q.device) if g is None else g.to(dt).contiguous()
        for g, (shape, dt) in zip(cotangents, shapes, strict=True)
    )
    dq, dk_, dv_, du, *d0 = fused._backward(q, k, v, u, ck, do, (dS, dA, dz), run, chain)  # type: ignore[arg-type]
    if not initial:
        return dq, dk_, dv_, du, None, None, None
    # The state's gradients come in float32, the initial state in the inputs' dtype.
    return dq, dk_, dv_, du, *(g.to(x.dtype) for g, x in zip(d0, initial, strict=True))


class ChunkedVLAFunction(torch.autograd.Function):
    """The Triton forward; the backward is the recurrent kernels' adjoint of spec §2.3
    (module docstring, "Gradients")."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        options: dict[str, Any],
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        u: torch.Tensor,
        S0: torch.Tensor | None,
        A0: torch.Tensor | None,
        z0: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        initial = None if S0 is None else (S0, A0, z0)
        save = any(ctx.needs_input_grad[1:])
        o, (S, A, z), saved = _forward(
            q, k, v, u, initial_state=initial, save_checkpoints=save, **options
        )
        ctx.options = options
        if save:
            assert saved is not None
            ck, chain = saved
            ctx.save_for_backward(q, k, v, u, *ck, *chain, *(initial or ()))
        return o, S, A, z

    @staticmethod
    def backward(ctx: Any, do: Any, dS: Any, dA: Any, dz: Any) -> Any:  # type: ignore[override]
        q, k, v, u, cks, cka, ckz, kh, ah, sc, sv, cs, *initial = ctx.saved_tensors
        grads = _recurrent_adjoint(
            q, k, v, u, tuple(initial), ctx.options["config"], ctx.options["start"],
            (do, dS, dA, dz), (cks, cka, ckz), (kh, ah, sc, sv, cs),
        )  # fmt: skip
        return (None, *grads)


def chunked_vla(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    u: torch.Tensor,
    *,
    config: VLAConfig | None = None,
    initial_state: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
    start: int = 0,
    chunk_size: int = 64,
    check_finite: bool = False,
    input_precision: str = "ieee",
    penalty_dtype: str = "auto",
    penalty_chunk: int | None = None,
    penalty_block: int | None = None,
    planted_bug: str | None = None,
) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """VLA (spec §2.3) by the chunked forms of spec §5 in Triton; differentiable.

    Parameters
    ----------
    q, k, u : ``[B, T, H, dk]``; v : ``[B, T, H, dv]`` — float32, bfloat16 or float16, one
        dtype, on a CUDA device (or the CPU under ``TRITON_INTERPRET=1``); ``dk, dv <= 128``;
        ``(T + 64)·H·max(dk, dv) < 2**31`` (the kernels' offsets inside one batch element).
    config : :class:`VLAConfig` (default the paper preset); every field is honoured.
    initial_state : ``(S [B, H, dv, dk], A [B, H, dk, dk], z [B, H, dk])`` or ``None``, each
        in the inputs' dtype or float32 (the state this function returns, taken as it is).
    start : tokens consumed before the call (spec §2.3: the nudge clock continues).
    chunk_size : ``C`` of the state chain, 16, 32 or 64.
    check_finite : check that the inputs are finite (:class:`~vla_verify.errors.NonFiniteError`)
        and raise :class:`~vla_verify.errors.NonFiniteResultError` when they give a non-finite
        output or state (device-to-host syncs; off by default).
    input_precision : float32 state-chain products, ``"ieee"`` or ``"tf32"`` (module
        docstring, "Precision"); ignored for 16-bit inputs.
    penalty_dtype : ``"auto"`` (default), ``"float64"`` or ``"float32"``, the penalty chain's
        precision; ``"auto"`` takes float32 in the inference forward of bf16 inputs and
        float64 otherwise (:func:`_penalty_dtype`).
    penalty_chunk : tokens per penalty-chain chunk, 16, 32 or 64 (default
        :data:`DEFAULT_PENALTY_CHUNK`), independent of
        ``chunk_size``: the gates are per token, so the two chains may cut the sequence
        differently (``docs/design/triton_chunked.md``, "The penalty chain").
    penalty_block : tokens per block of the penalty chain, a positive multiple of
        ``penalty_chunk`` (default :func:`penalty_block_length`); the blocks run in parallel
        from start penalties computed by :func:`penalty_block_starts`.  A block of ``T`` or
        more tokens runs the chain in one pass.  One block is always used when the initial
        ``A`` is not symmetric positive definite or ``sm_floor > 1`` (a floored denominator).
    planted_bug : a name of :data:`PLANTED_BUGS` (meta-tests only).

    Returns
    -------
    ``o`` ``[B, T, H, dv]`` in the inputs' dtype and ``(S, A, z)`` in float32.
    """
    config = VLAConfig() if config is None else config
    start = check_start(start)
    # A finiteness check of the inputs is a device-to-host sync, so only with check_finite (the
    # registry backend checks them itself).
    shapes = check_inputs(
        q, k, v, u, initial_state, check_finite=check_finite, state_dtypes=("float32",)
    )
    for name, x in (("q", q), ("k", k), ("v", v), ("u", u)):
        if not isinstance(x, torch.Tensor):
            raise DTypeError(name, f"expected a torch.Tensor, got {type(x).__name__}")
        if x.dtype != q.dtype:
            raise DTypeError(name, f"expected the dtype of q ({q.dtype}), got {x.dtype}")
    if str(q.dtype).removeprefix("torch.") not in _DTYPES:
        raise DTypeError("q", f"expected one of {_DTYPES}, got {q.dtype}")
    if chunk_size not in CHUNK_SIZES:
        raise UnsupportedConfigurationError(
            _NAME, f"chunk_size must be one of {CHUNK_SIZES}, got {chunk_size!r}",
            argument="chunk_size",
        )  # fmt: skip
    if max(shapes.dk, shapes.dv) > MAX_HEAD_DIM:
        raise UnsupportedConfigurationError(
            _NAME, f"dk={shapes.dk}, dv={shapes.dv}: at most {MAX_HEAD_DIM}", argument="q"
        )
    check_offsets(_NAME, shapes.T, shapes.H, shapes.dk, shapes.dv)
    if input_precision not in INPUT_PRECISIONS:
        raise UnsupportedConfigurationError(
            _NAME, f"input_precision must be one of {INPUT_PRECISIONS}, got {input_precision!r}",
            argument="input_precision",
        )  # fmt: skip
    if penalty_dtype not in PENALTY_DTYPES:
        raise UnsupportedConfigurationError(
            _NAME, f"penalty_dtype must be one of {PENALTY_DTYPES}, got {penalty_dtype!r}",
            argument="penalty_dtype",
        )  # fmt: skip
    if penalty_chunk is None:
        penalty_chunk = DEFAULT_PENALTY_CHUNK
    if penalty_chunk not in CHUNK_SIZES:
        raise UnsupportedConfigurationError(
            _NAME, f"penalty_chunk must be one of {CHUNK_SIZES}, got {penalty_chunk!r}",
            argument="penalty_chunk",
        )  # fmt: skip
    if penalty_block is not None and (
        isinstance(penalty_block, bool)
        or not isinstance(penalty_block, int)
        or penalty_block < penalty_chunk
        or penalty_block % penalty_chunk
    ):
        raise UnsupportedConfigurationError(
            _NAME, f"penalty_block must be a positive multiple of penalty_chunk "
            f"({penalty_chunk}), got {penalty_block!r}", argument="penalty_block",
        )  # fmt: skip
    if planted_bug is not None and planted_bug not in PLANTED_BUGS:
        raise UnsupportedConfigurationError(
            _NAME, f"planted_bug must be one of {tuple(PLANTED_BUGS)}", argument="planted_bug"
        )
    options = dict(
        config=config, start=start, C=chunk_size, CP=penalty_chunk,
        penalty_block=penalty_block, input_precision=input_precision, penalty_dtype=penalty_dtype,
        bug=PLANTED_BUGS.get(planted_bug or "", kernels.BUG_NONE),
    )  # fmt: skip
    S0, A0, z0 = initial_state if initial_state is not None else (None, None, None)
    o, S, A, z = ChunkedVLAFunction.apply(options, q, k, v, u, S0, A0, z0)
    if check_finite:
        if not bool(torch.isfinite(o).all()):
            raise NonFiniteResultError(_NAME, "o")
        for name, x in (("S", S), ("A", A), ("z", z)):
            if not bool(torch.isfinite(x).all()):
                raise NonFiniteResultError(_NAME, f"state.{name}")
    return o, (S, A, z)


class TritonChunkedBackend(TritonKernelBackend):
    """Registry name ``triton_chunked``: :func:`chunked_vla` as a spec §4 callable.

    Options ``chunk_size`` (16, 32, 64; default 64), ``input_precision``, ``penalty_dtype``,
    ``penalty_chunk``, ``penalty_block`` (see :func:`chunked_vla`), ``check_finite`` (default
    off on a GPU: the NaN/Inf checks of inputs and outputs read them back, a device sync per
    call; on the CPU the outputs are always checked).  Returns ``(o, (S, A, z))`` in the inputs'
    dtype; any nudge period and any ``start``.
    """

    name = _NAME
    description = "Triton chunked kernel (spec §5): Woodbury/LDLᵀ penalty chain, UT state chain"
    capabilities = Capabilities(
        array="torch",
        devices=("cuda", "cpu"),
        dtypes=_DTYPES,
        variants=("vla",),
        differentiable=True,
        max_head_dim=MAX_HEAD_DIM,
        requires=("torch", "triton"),
        options={
            "chunk_size": 64,
            "input_precision": "ieee",
            "penalty_dtype": "auto",
            "penalty_chunk": None,
            "penalty_block": None,
            "check_finite": False,
        },
    )

    def __init__(self, *, variant: str = "vla", **options: Any) -> None:
        super().__init__(variant=variant, **options)
        size = self.options["chunk_size"]
        if isinstance(size, bool) or not isinstance(size, int) or size not in CHUNK_SIZES:
            raise UnsupportedConfigurationError(
                self.name, f"chunk_size must be one of {CHUNK_SIZES}, got {size!r}",
                argument="chunk_size",
            )  # fmt: skip

    def _interpreted(self) -> bool:
        return interpreted()

    def _explain_refusal(self, reason: str) -> str:
        if reason.startswith("dtype float64"):
            return reason + (
                ": the kernels accumulate the state chain in float32; the 'torch_chunked' "
                "backend runs the same chunked forms in float64"
            )
        if reason.startswith("variant"):
            return reason + "; 'torch_chunked' runs delta and linear chunked, 'torch' runs rls"
        return reason

    def _run(self, q, k, v, u, *, config, initial_state, start=0):  # type: ignore[no-untyped-def]
        o, state = chunked_vla(
            q,
            k,
            v,
            u,
            config=config,
            initial_state=initial_state,
            start=start,
            chunk_size=int(self.options["chunk_size"]),
            input_precision=str(self.options["input_precision"]),
            penalty_dtype=str(self.options["penalty_dtype"]),
            penalty_chunk=self.options["penalty_chunk"],
            penalty_block=self.options["penalty_block"],
        )
        return o, tuple(x.to(q.dtype) for x in state)
