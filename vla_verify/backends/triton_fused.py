"""Registry backend ``triton_fused``: the recurrent Triton kernels of spec §2.3, trainable.

- :func:`fused_recurrent_vla` — the functional API: ``(o, (S, A, z))`` from ``q, k, u``
  ``[B, T, H, dk]`` and ``v`` ``[B, T, H, dv]`` (spec §1 layouts), differentiable in
  ``q, k, v, u`` and the initial state through :class:`FusedRecurrentVLAFunction`.
- :class:`RecurrentPlan` and :func:`plan_for` — how the kernels are launched (tile sizes, warps,
  which compiled form of the gate loop), chosen per shape from a table of H200 measurements;
  experts pass a plan of their own.
- :class:`TritonFusedBackend` — the same as a spec §4 callable in the registry; its options are
  the plan's fields and the semantic arguments.

The forward is one launch of :func:`~.triton_fused_kernels.vla_stream_kernel` (gate programs and
state programs side by side); the backward reruns the gate pass from checkpoints of ``(S, A, z)``
stored every ``checkpoint_every`` tokens (memory ``B·H·⌈T/C⌉·(dk² + dv·dk + dk)`` floats, not a
T-long history) and runs the state and penalty adjoints (kernels and their organisation:
:mod:`vla_verify.backends.triton_fused_kernels`), on long inputs in blocks of tokens side by
side (:func:`_blocked_span`: each block's adjoint is an affine map of the cotangents after it).

Inputs may be float32, bfloat16 or float16 (accumulated in float32) or float64 (accumulated in
float64, useful to separate algorithm from rounding); the output ``o`` has the inputs' dtype, the
returned state the accumulation dtype (the registry backend casts it to the inputs' dtype, as
spec §4 expects).

Without a CUDA GPU the same kernels run on CPU tensors through Triton's interpreter, which must
be switched on (``TRITON_INTERPRET=1``) before Triton is first imported.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import triton.language as tl

from ..errors import DeviceError, UnsupportedConfigurationError
from ..spec import VLAConfig, check_inputs, check_start
from . import triton_fused_kernels as kernels
from .registry import Capabilities
from .triton_common import TritonKernelBackend, built_for_interpreter, check_offsets
from .triton_common import availability_reason as _availability_reason
from .triton_fused_kernels import Bug, Downdate, Nudge

__all__ = [
    "DOWNDATES",
    "MAX_HEAD_DIM",
    "PLANTED_BUGS",
    "FusedRecurrentVLAFunction",
    "RecurrentPlan",
    "TritonFusedBackend",
    "availability_reason",
    "fused_recurrent_vla",
    "interpreted",
    "plan_for",
    "with_planted_bug",
]

#: Largest dk and dv: A [dk, dk] and a block of S live in registers for the whole sequence.
MAX_HEAD_DIM = 128
_DTYPES = ("float32", "bfloat16", "float16", "float64")
_NEVER = 2**31 - 1  # nudge period meaning "never" (t + 1 < 2**31 for any T we can hold)
_NAME = "triton_fused"

#: The forward's Sherman–Morrison downdate (argument ``downdate``).
DOWNDATES: dict[str, Downdate] = {"exact": Downdate.EXACT, "fma": Downdate.FMA}

#: Planted bugs for the meta-tests (:func:`with_planted_bug`).
PLANTED_BUGS: dict[str, Bug] = {
    "gate_from_previous_A": Bug.GATE_FROM_OLD_A,
    "nudge_one_step_late": Bug.NUDGE_ONE_STEP_LATE,
    "backward_drops_dk_term": Bug.DK_SIGN,
    "fold_drops_nudges": Bug.FOLD_DROPS_NUDGES,
    "ignores_start": Bug.IGNORES_START,
    "chunk_triangle_off_by_one": Bug.CHUNK_TRIANGLE,
    "scan_stores_late": Bug.SCAN_STORES_LATE,
    "piece_end_drops_nudges": Bug.PIECE_END_DROPS_NUDGES,
    "piece_y_whole_t": Bug.PIECE_Y_WHOLE_T,
    "rerun_next_checkpoint": Bug.RERUN_NEXT_CHECKPOINT,
    "group_order": Bug.GROUP_ORDER,
}

#: Tokens per progress count of the streamed forward: the gate programs publish every
#: ``_STREAM_BLOCK`` tokens (a barrier and an atomic each), and a state program waits only when
#: the next token's gates are not yet published: it runs at most one block behind.
_STREAM_BLOCK = 32
#: Floats of the forward's per-token gate buffers at most (4 GiB in float32); longer inputs run
#: in segments of whole checkpoint chunks, the state carried between them exactly.  B·H = 16 and
#: T ≤ 65536 stay in one segment.
_FORWARD_FLOATS = 1 << 30
#: Bytes of the backward's buffers that grow with a span's length at most
#: (:func:`_span_floats_per_token`): longer inputs run in spans of whole checkpoint intervals,
#: of about equal length, the cotangents carried between them.  Fewer, longer spans give the
#: chunked adjoints more programs a launch and the pieces' scan longer groups: on an H100
#: (``h100/state_chunk_walk_d1fb5ec.json``, B·H = 16, bf16, paper preset, two rounds) forward
#: + backward took 41.6 and 42.3 against 52.3 and 50.3 ms at D = 128, T = 16384 in two spans
#: of 8192 tokens instead of sixteen of 1024, 11.5 against 13.7 at T = 4096 in one span
#: instead of four, and 10.9 and 11.1 against 13.0 and 14.4 at D = 64, T = 16384 in one span
#: instead of four; the rule here gives those spans at those sizes.
_SEGMENT_BYTES = 5 << 29


_INTERPRETED = built_for_interpreter(kernels.vla_stream_kernel)


def interpreted() -> bool:
    """Whether the kernels were built for Triton's CPU interpreter (``TRITON_INTERPRET=1`` was
    set when Triton decorated them)."""
    return _INTERPRETED


def availability_reason() -> str | None:
    """``None`` if the kernels can run here, else why not."""
    return _availability_reason(interpreted())


# Plain integer helpers: triton.cdiv and triton.next_power_of_2 are Triton functions, about 14 µs
# of host time per call outside a kernel.
def _pow2(n: int) -> int:
    """The tile width of a head dim: the next power of two, at least 16 (``tl.dot``'s least)."""
    return max(16, 1 << (n - 1).bit_length())


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _acc(dtype: torch.dtype) -> tuple[torch.dtype, Any]:
    if dtype == torch.float64:
        return torch.float64, tl.float64
    return torch.float32, tl.float32


# -- the plan ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RecurrentPlan:
    """How the kernels run one request: every field reaches a kernel launch.

    Forward (:func:`~.triton_fused_kernels.vla_stream_kernel`):

    - ``block_v``: value rows per state program (a power of two ≥ 16);
    - ``gate_warps``: warps of every program of the streamed forward, and of the backward's gate
      rerun (:func:`~.triton_fused_kernels.vla_gate_kernel`);
    - ``split_sums``: the gate's sums down the tile's axis 0 (``A u``, ``A k̂``) as this many
      interleaved partial sums (a power of two; 1 = one chain).  Where the gate kernel loads
      ``A`` from memory (a given initial state, a later forward segment, the backward's rerun)
      only with ``load_plain``, else one chain: see :func:`_split`;
    - ``nudge_scalar``: the forward's gate keeps ``A`` as ``B + c·I``, the nudge added to the
      scalar ``c``, folded into the tile every 64 tokens (and at checkpoints and the end);
      excludes ``period_loop``;
    - ``period_loop``: the gate loop runs the tokens between two nudges with a step compiled
      without the nudge and each nudge token with one compiled with it (the same bits as the
      select); forward and the backward's rerun;
    - ``load_plain``: the gate loads and stores ``A`` without vector accesses (keeps the split
      loop's layout after a load);
    - ``nudge_branch``: without ``nudge_scalar`` or ``period_loop``, the nudge under a branch
      taken on nudge tokens only instead of a select over the tile every token (the same bits).

    Backward: ``bwd_block_v`` (value rows per state-backward program), ``state_bwd_warps``
    (:func:`~.triton_fused_kernels.vla_state_bwd_kernel`), ``gate_bwd_warps``
    (:func:`~.triton_fused_kernels.vla_gate_bwd_kernel`), ``adjoint_blocks`` (how many blocks
    of tokens the adjoint runs side by side, each as one more batch element; 1 = one pass
    through the sequence: :func:`_blocked_span`), ``chunked_state_adjoint`` (the state adjoint
    by products over the checkpoint intervals in float32 accumulation:
    :func:`_state_adjoint_chunked`), ``chunked_penalty_adjoint`` (the penalty adjoint by
    products over nudge-free pieces, float32 accumulation: :func:`_penalty_adjoint_pieces`),
    ``penalty_scan_group`` (with ``chunked_penalty_adjoint``: the pieces' one sequential scan
    takes groups of this many pieces, each composed into one first; 1 = piece after piece;
    0 = by the span's piece count, :func:`_scan_group`), ``prep_register_cap`` (with the
    chunked adjoints: a cap on the registers per thread of their prep kernels, ``maxnreg``, so
    that more of their programs share an SM; 0 = the compiler's allocation),
    ``parallel_rerun`` (a one-pass span's gate rerun from every checkpoint interval side by
    side instead of through the span: :func:`_span_rerun`), ``keep_gate_values`` (in
    training the forward's gate program also stores each token's Sherman–Morrison values, and
    the backward reads them with the gates instead of rerunning the gate pass: ``(2·BK + 6)``
    floats per token and head more until the backward; a forward in more than one segment
    reruns).

    Every choice gives the spec §2.3 step (the split sums and ``nudge_scalar`` up to rounding);
    the measured table of :func:`plan_for` picks the fastest.
    """

    block_v: int
    gate_warps: int
    split_sums: int
    nudge_scalar: bool
    period_loop: bool
    load_plain: bool
    nudge_branch: bool
    bwd_block_v: int
    state_bwd_warps: int
    gate_bwd_warps: int
    adjoint_blocks: int = 1
    chunked_state_adjoint: bool = False
    chunked_penalty_adjoint: bool = False
    penalty_scan_group: int = 1
    prep_register_cap: int = 0
    parallel_rerun: bool = False
    keep_gate_values: bool = False

    def __post_init__(self) -> None:
        for name, least in (("adjoint_blocks", 1), ("penalty_scan_group", 0)):
            value = getattr(self, name)
            if not _is_int(value) or value < least:
                raise UnsupportedConfigurationError(
                    _NAME, f"{name} must be an integer >= {least}, got {value!r}", name
                )
        cap = self.prep_register_cap
        if not _is_int(cap) or not (cap == 0 or 32 <= cap <= 255):
            raise UnsupportedConfigurationError(
                _NAME,
                f"prep_register_cap must be 0 (no cap) or 32 to 255 registers, got {cap!r}",
                "prep_register_cap",
            )
        for name in ("block_v", "bwd_block_v"):
            value = getattr(self, name)
            if not _is_int(value) or value < 16 or value & (value - 1):
                raise UnsupportedConfigurationError(
                    _NAME, f"{name} must be a power of two >= 16, got {value!r}", name
                )
        for name in ("split_sums", "gate_warps", "state_bwd_warps", "gate_bwd_warps"):
            value = getattr(self, name)
            if not _is_int(value) or value < 1 or value & (value - 1):
                raise UnsupportedConfigurationError(
                    _NAME, f"{name} must be a power of two >= 1, got {value!r}", name
                )
        for name in (
            "nudge_scalar", "period_loop", "load_plain", "nudge_branch", "chunked_state_adjoint",
            "chunked_penalty_adjoint", "parallel_rerun", "keep_gate_values",
        ):  # fmt: skip
            if not isinstance(getattr(self, name), bool):
                raise UnsupportedConfigurationError(
                    _NAME, f"{name} must be a bool, got {getattr(self, name)!r}", name
                )
        if self.nudge_scalar and self.period_loop:
            raise UnsupportedConfigurationError(
                _NAME,
                "nudge_scalar and period_loop exclude each other (both remove the per-token "
                "select of the nudge)",
                "period_loop",
            )


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


#: The plan's fields: the registry backend's options besides the semantic ones.
PLAN_FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(RecurrentPlan))


@dataclass(frozen=True)
class _Measured:
    """One row of the measured table: the fastest choices at one key tile width BK, and the
    result files (under ``benchmarks/results/``) that measured them."""

    gate_warps: int
    split_sums: int
    nudge_scalar: bool
    period_loop_inference: bool
    load_plain: bool
    nudge_branch: bool
    gate_bwd_warps: int
    evidence: tuple[str, ...]
    blocked_adjoint: bool = False
    chunked_state_adjoint: bool = False
    chunked_penalty_adjoint: bool = False
    penalty_scan_group: int = 1
    # Built for sm_90 with a cap of 128 (sm90/preflight_prep_register_cap.json), at BK = 64
    # the state prep kernel keeps nothing on the stack and runs three programs an SM (two
    # uncapped), the penalty prep kernel 16 bytes and two (one); at BK = 128 the penalty prep
    # kernel keeps 672 bytes.  Timed in the rows below.
    prep_register_cap: int = 0
    parallel_rerun: bool = False
    # The gate program's extra stores against the rerun they save: at BK = 64 forward + backward
    # at T = 16384 34.82 against 34.88 ms on an H100 (h100/adjoint_fcb06ea.json), no gain for
    # the memory; not timed at 128.
    keep_gate_values: bool = False


#: The row of key tiles narrower than 64 (not timed): BK = 64's, without the period loop.
_NARROW = _Measured(
    gate_warps=2,
    split_sums=4,
    nudge_scalar=False,
    period_loop_inference=False,
    load_plain=True,
    nudge_branch=True,
    gate_bwd_warps=2,
    evidence=(),
    chunked_state_adjoint=True,
    chunked_penalty_adjoint=True,
    parallel_rerun=True,
)

#: H200, Triton 3.6, B = 1, H = 16, bf16 unless noted.
_MEASURED: dict[int, _Measured] = {
    128: _Measured(
        # 4 warps: 232 registers, no spills (8 spill 779 STL per token; offline SASS).
        gate_warps=4,
        # 8 partial sums: forward at T = 1024 / 4096 1.309 -> 1.284 and 5.163 -> 5.062 ms
        # (16: 1.318, 5.203; 32: 1.346, 5.310).
        split_sums=8,
        # the scalar shift: streamed forward 1.278 -> 1.171 ms and 5.058 -> 4.638 ms at
        # T = 1024 / 4096 (token loop 1317 -> 936 instructions, no spill).
        nudge_scalar=True,
        # nested loops compile to a token loop twice as slow (1.319 -> 2.744 ms at T = 1024).
        period_loop_inference=False,
        # plain loads compile to a 255-register loop that spills: gate 7.86 -> 11.8 ms.
        load_plain=False,
        # a tile-valued branch spills at BK = 128: the select.
        nudge_branch=False,
        # 8 warps 30.6 ms against 36.7 with 16 and 37.5 with 4 at T = 2048.
        gate_bwd_warps=8,
        evidence=(
            "h200/stream/gate_sweep_31b009b_view.json",
            "h200/stream/gate_sweep_646c312_scalar.json",
            "h200/stream/period_loop_fixed.json",
            "h200/two_pass_sweeps/run8_d07206e.json",
            "h200/two_pass_sweep.json",
            "h200/adjoint_d128_075acb0.json",
        ),
        # forward + backward at T = 16384: 8 blocks 200.8 ms against 202.3 in one pass (fused
        # 195.8 against 196.8), not worth the blocks' memory (h200/adjoint.json).
        blocked_adjoint=False,
        # the chunk kernel needed 242176 bytes of shared memory at C = 64 in one launch, above
        # the H200's 232448 (h200/adjoint.json), and the pieces' kernels 262144 and 380928
        # (sm90/preflight_pieces_128.json); built as _SPLIT_STATE_CHUNK_ABOVE and
        # _PIECES_ONE_STAGE_ABOVE say, all fit (sm90/preflight_adjoints_128.json).  Forward +
        # backward of the chunked backend at T = 16384 with both in chunks 63.7 ms, the state's
        # alone 146.8, both per token 168.4 (h200/adjoint_d128_075acb0.json).
        chunked_state_adjoint=True,
        chunked_penalty_adjoint=True,
        # by the span's piece count (_scan_group): 8 for the 64 pieces of a 1024-token span
        # here.  Forward + backward of the chunked backend at T = 16384 on an H100: groups of
        # 4 / 8 / 16 pieces 62.0 / 59.3 / 60.1 ms against 68.3 piece after piece, 32 (two
        # groups a span) 70.1 (h100/adjoint_groups_d128_753ac4b.json).
        penalty_scan_group=0,
        # uncapped: a cap of 128 took forward + backward at T = 16384 from 59.2 to 61.0 ms on
        # an H100 (h100/adjoint_prepcap_704b24b.json), the 672 bytes of stack above.
        prep_register_cap=0,
        # forward + backward at T = 16384 162.2 against 188.5 ms (the fused backend 170.5
        # against 196.9); 16 warps under a 128-register cap 201.9 (h200/adjoint_fold.json).
        parallel_rerun=True,
    ),
    64: _Measured(
        gate_warps=2,
        # 4 partial sums (16: 0.900 -> 0.924 ms at T = 1024).
        split_sums=4,
        # the same speed as the period loop (3.439 against 3.442 ms at T = 4096).
        nudge_scalar=False,
        # inference: T = 1024 0.900 -> 0.871 ms, T = 4096 3.535 -> 3.421 ms; with checkpoints
        # forward + backward 6.20 -> 6.69 ms (T = 1024), so off in training.
        period_loop_inference=True,
        # forward 5.29 -> 4.19 ms at T = 4096 (forward + backward at T = 2048 14.8 -> 13.7).
        load_plain=True,
        # 794 -> 667 instructions per token (offline SASS, 234 registers, no spill).
        nudge_branch=True,
        # 4 warps 10.6 ms against 17.2 with 2 at T = 2048.
        gate_bwd_warps=4,
        evidence=(
            "h200/stream/gate_sweep_31b009b_view.json",
            "h200/stream/pytest_benchmark_fbadab6_regressed.json",
            "h200/two_pass_sweeps/run8_d07206e.json",
            "h200/two_pass_sweep.json",
        ),
        # forward + backward at T = 4096 / 16384 (the chunked backend): one pass 25.5 / 90.3 ms;
        # 8 blocks with the state adjoint in chunks 15.0 / 61.2, 16 blocks 16.9 / 52.5; one
        # pass with the state adjoint in chunks and the penalty adjoint in pieces 13.6 / 44.4,
        # the same in 8 blocks 21.1 / 82.1 (h200/adjoint_pieces.json; the fused backend 12.5 /
        # 50.9 in one pass with both against 13.3 / 74.0 in 8 blocks with the state's).  Hence
        # one pass with both chunked adjoints.  (Without the pieces 8 blocks took 88.6 -> 51.7
        # ms and the state in chunks 43.3 in an earlier run: h200/adjoint.json.)
        blocked_adjoint=False,
        chunked_state_adjoint=True,
        chunked_penalty_adjoint=True,
        # by the span's piece count (_scan_group): 16 for the 256 pieces of a 4096-token span
        # here.  Forward + backward of the chunked backend at T = 16384 on an H100: groups of
        # 4 / 8 / 16 / 32 pieces 18.9 / 18.2 / 17.9 / 17.7 ms against 20.9 piece after piece
        # (h100/adjoint_groups_753ac4b.json).
        penalty_scan_group=0,
        # 128: forward + backward at T = 16384 17.28 against 17.67 ms uncapped on an H100
        # (h100/adjoint_prepcap_704b24b.json); on an H200 4.75 against 5.45 at T = 4096 and
        # 2.88 against 2.78 at T = 1024, where the host's launches set the time
        # (h200/adjoint_groups_short_704b24b.json).
        prep_register_cap=128,
        # with both chunked adjoints, forward + backward at T = 16384 27.1 against 39.5 ms (the
        # fused backend 37.0 against 49.4; h200/adjoint_rerun.json); the rerun in single
        # checkpoint intervals 27.09, the pieces' scan in 8 blocks 27.21 (h200/adjoint_fold.json).
        parallel_rerun=True,
    ),
    32: _NARROW,
    16: _NARROW,
}


@functools.lru_cache(maxsize=16)
def _sm_count(device: torch.device) -> int:
    return int(torch.cuda.get_device_properties(device).multi_processor_count)


def _block_v(B: int, H: int, dv: int, device: torch.device, gate_programs: bool) -> int:
    """Value rows per state program: split dv until the programs fill the SMs, not below 16.

    The streamed forward counts its ``B·H`` gate programs too (``gate_programs``): a gate
    program that shares its SM with a state program is slowed (D = 128, T = 4096: 7.92 ms with
    NV = 8, 144 programs on 132 SMs, against 6.53 ms with NV = 4;
    ``h200/stream/profile_579b46f.json``).  In the interpreter: one block."""
    bv = _pow2(dv)
    if device.type != "cuda" or interpreted():
        return bv
    sms = _sm_count(device)
    gates = B * H if gate_programs else 0
    while bv > 16 and gates + B * H * _cdiv(dv, bv // 2) <= sms:
        bv //= 2
    return bv


#: Most blocks the adjoint runs side by side; fewer than the least are not worth the blocks'
#: second gate-adjoint pass (:func:`_blocked_span`).
_MAX_ADJOINT_BLOCKS = 16
_MIN_ADJOINT_BLOCKS = 4


def _adjoint_blocks(B: int, H: int, device: torch.device) -> int:
    """Blocks of the adjoint where the measured row takes them (``_Measured.blocked_adjoint``):
    as many as fill the SMs with one penalty-adjoint program each (``B·H`` per block), at most
    :data:`_MAX_ADJOINT_BLOCKS`, none below :data:`_MIN_ADJOINT_BLOCKS`.  A sequential adjoint
    runs ``B·H`` programs (16 on 132 SMs at B·H = 16); 8 blocks there took forward + backward
    at D = 64, T = 16384 from 88.6 to 51.7 ms (``h200/adjoint.json``).  In the interpreter: 1."""
    if not _on_gpu(device):
        return 1
    blocks = min(_MAX_ADJOINT_BLOCKS, _sm_count(device) // (B * H))
    return blocks if blocks >= _MIN_ADJOINT_BLOCKS else 1


def _on_gpu(device: torch.device) -> bool:
    return device.type == "cuda" and not interpreted()


def _state_bwd_warps(bk: int, bv: int) -> int:
    """Warps of the state backward (``Sᵀ`` ``[BK, BV]``, 16 entries per thread, at most 4): at
    BK = 128, BV = 16, 4 warps 1.95 ms against 2.25 ms with 2 at T = 4096
    (``h200/two_pass_sweep.json``)."""
    return max(1, min(4, bk * bv // 512))


@functools.lru_cache(maxsize=256)
def plan_for(
    B: int,
    H: int,
    T: int,
    dk: int,
    dv: int,
    dtype: torch.dtype,
    device: torch.device,
    training: bool,
) -> RecurrentPlan:
    """The fastest measured plan for one request (:data:`_MEASURED`, per key tile width
    ``BK = max(16, next_power_of_2(dk))``; ``training``: the forward stores checkpoints for a
    backward).  The same for every ``T`` and ``dtype`` measured so far."""
    bk = _pow2(dk)
    row = _MEASURED[bk]
    bwd_bv = _block_v(B, H, dv, device, gate_programs=False)
    return RecurrentPlan(
        block_v=_block_v(B, H, dv, device, gate_programs=True),
        gate_warps=row.gate_warps,
        split_sums=row.split_sums,
        nudge_scalar=row.nudge_scalar,
        period_loop=row.period_loop_inference and not training,
        load_plain=row.load_plain,
        nudge_branch=row.nudge_branch,
        bwd_block_v=bwd_bv,
        state_bwd_warps=_state_bwd_warps(bk, bwd_bv),
        gate_bwd_warps=row.gate_bwd_warps,
        adjoint_blocks=_adjoint_blocks(B, H, device) if training and row.blocked_adjoint else 1,
        # The interpreter keeps the per-token state adjoint, whose planted bugs its tests run;
        # the chunked one has tests of its own.
        chunked_state_adjoint=training and row.chunked_state_adjoint and _on_gpu(device),
        chunked_penalty_adjoint=training and row.chunked_penalty_adjoint and _on_gpu(device),
        penalty_scan_group=row.penalty_scan_group,
        prep_register_cap=row.prep_register_cap,
        parallel_rerun=training and row.parallel_rerun and _on_gpu(device),
        keep_gate_values=training and row.keep_gate_values,
    )


def _split(plan: RecurrentPlan, bk: int, loads_tile: bool) -> int:
    """The gate's ``SPLIT``: ``plan.split_sums`` (at most BK), but one chain where the gate
    kernel loads ``A`` from memory without ``load_plain``.  Compiler workaround (Triton 3.6): the
    split loop compiled beside a vector tile load ran 20-50x slower than with an in-register
    ``A_0 = I/lambda0`` (gate kernel at T = 4096, dk = 64: 70.8 against 3.6 ms;
    ``h200/two_pass_sweeps/run5_c26525f.json``); remove when the split loop after a vector load
    keeps its layout in the SASS.  The checkpoint stores, outside the token loop, do not count
    (one chain there made the checkpointed forward at dk = 128 1.4x slower,
    ``h200/stream/backward_08c8bde.json``)."""
    return 1 if loads_tile and not plan.load_plain else min(plan.split_sums, bk)


def _nudge(plan: RecurrentPlan, forward: bool) -> Nudge:
    """The gate's ``NUDGE`` mode: the scalar shift in the forward where planned (the backward's
    rerun keeps the tile exact: the scalar shift made it slower, 7.87 -> 8.96 ms at dk = 128,
    ``h200/stream/backward_0e808a0.json``), else the branch or the select."""
    if forward and plan.nudge_scalar:
        return Nudge.SCALAR
    return Nudge.BRANCH if plan.nudge_branch else Nudge.SELECT


# -- launches ------------------------------------------------------------------------------------

_PARAMS: dict[tuple[Any, ...], torch.Tensor] = {}


def _params(config: VLAConfig, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """The configuration scalars as a device tensor, made once per (config, dtype, device): a
    host-to-device copy per call would sit on the GPU timeline and in the host time before the
    first launch.  The kernels only read it."""
    key = (config, dtype, device)
    params = _PARAMS.get(key)
    if params is None:
        if len(_PARAMS) > 64:  # many configs (a property search): do not grow without bound
            _PARAMS.clear()
        c = config
        values = (c.lambda0, c.sm_floor, c.nudge_eta, c.out_eps, c.norm_eps)
        params = _PARAMS[key] = torch.tensor(values, dtype=dtype, device=device)
    return params


@dataclass(frozen=True)
class _Run:
    """What one call fixes besides the tensors: semantic arguments, the plan, the planted bug."""

    config: VLAConfig
    plan: RecurrentPlan
    checkpoint_every: int
    downdate: Downdate
    start: int  # the nudge clock, reduced modulo the period
    bug: Bug
    state_dtype: torch.dtype | None = None  # of the returned state; None: accumulation dtype


def _clock(config: VLAConfig, start: int) -> tuple[int, int]:
    """``(nudge_period, start)`` as the kernels take them: "never" as 2**31 - 1 and ``start``
    modulo the period, so that ``start + t + 1`` stays in int32 for any ``start``."""
    period = config.nudge_period
    if period is None:
        return _NEVER, 0
    return period, start % period


def _forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    u: torch.Tensor,
    state0: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None,
    run: _Run,
    save_checkpoints: bool,
    state_dtype: torch.dtype | None = None,
) -> tuple[
    torch.Tensor,
    tuple[torch.Tensor, ...],
    tuple[torch.Tensor, ...] | None,
    tuple[torch.Tensor, ...] | None,
]:
    """The forward: one streamed launch per segment (one segment unless the per-token gate
    buffers would pass :data:`_FORWARD_FLOATS`).  Returns ``o``, the final ``(S, A, z)`` (views
    of the kernels' transposed buffers, in ``state_dtype``, default the accumulation dtype:
    the last launch rounds them as it stores them, no cast kernels after it), the checkpoints
    and, with ``save_checkpoints`` and ``plan.keep_gate_values`` in one segment, the per-token
    gate values for the backward (``chain`` of :func:`_backward`; else ``None``)."""
    B, T, H, dk = q.shape
    dv = v.shape[-1]
    acc, acc_tl = _acc(q.dtype)
    dev = q.device
    plan, config, every = run.plan, run.config, run.checkpoint_every
    bk, bv = _pow2(dk), plan.block_v
    nv = _cdiv(dv, bv)
    BH = B * H
    nc = _cdiv(T, every)
    period, start = _clock(config, run.start)
    o = torch.empty(B, T, H, dv, dtype=q.dtype, device=dev)
    ck = None
    if save_checkpoints:
        # Sᵀ checkpoints, and A, z with one more slot for the final state (the penalty adjoint
        # walks each chunk back from the next checkpoint).
        ck = (
            torch.empty(B, H, nc, dk, dv, dtype=acc, device=dev),
            torch.empty(B, H, nc + 1, dk, dk, dtype=acc, device=dev),
            torch.empty(B, H, nc + 1, dk, dtype=acc, device=dev),
        )
    params = _params(config, acc, dev)
    # The kernels hold every matrix transposed in memory (triton_fused_kernels docstring).
    if state0 is not None:
        s_in, a_in, z_in = state0[0].mT.contiguous(), state0[1].mT.contiguous(), state0[2]
    seg = max(1, _FORWARD_FLOATS // (BH * (2 * bk + 2)))
    seg = T if seg >= T else max(every, seg // every * every)
    nudge = _nudge(plan, forward=True)
    keep = save_checkpoints and plan.keep_gate_values and seg >= T
    chain = None
    for t_begin in range(0, T, seg):
        n = min(seg, T - t_begin)
        has_init = state0 is not None or t_begin > 0
        out = acc if state_dtype is None or t_begin + n < T else state_dtype
        s_out = torch.empty(B, H, dk, dv, dtype=out, device=dev)
        a_out = torch.empty(B, H, dk, dk, dtype=out, device=dev)
        z_out = torch.empty(B, H, dk, dtype=out, device=dev)
        if not has_init:
            s_in, a_in, z_in = s_out, a_out, z_out  # unread
        cks, cka, ckz = ck if ck is not None else (s_out, a_out, z_out)  # unused without
        gates = torch.empty(BH * n * (2 * bk + 2), dtype=acc, device=dev)
        sv = cs = gates  # not written without keep
        if keep:
            sv = torch.empty(BH, n, bk, dtype=acc, device=dev)
            cs = torch.empty(BH, n, 4, dtype=acc, device=dev)
            chain = (gates[: BH * n * bk].view(BH, n, bk),
                     gates[BH * n * bk : 2 * BH * n * bk].view(BH, n, bk),
                     gates[2 * BH * n * bk :].view(BH, n, 2), sv, cs)  # fmt: skip
        # [0]: the ticket that assigns roles; [1:]: tokens done per (b, h); both start at 0
        counters = torch.zeros(1 + BH, dtype=torch.int32, device=dev)
        kernels.vla_stream_kernel[(BH * (1 + nv),)](
            q_ptr=q, k_ptr=k, v_ptr=v, u_ptr=u, o_ptr=o,
            kh_ptr=gates[: BH * n * bk], ah_ptr=gates[BH * n * bk : 2 * BH * n * bk],
            sc_ptr=gates[2 * BH * n * bk :], sv_ptr=sv, cs_ptr=cs, a0_ptr=a_in, z0_ptr=z_in,
            s0_ptr=s_in,
            aT_ptr=a_out, zT_ptr=z_out, sT_ptr=s_out, cka_ptr=cka, ckz_ptr=ckz, cks_ptr=cks,
            p_ptr=params, counters_ptr=counters, T=T, H=H, DK=dk, DV=dv, nudge_period=period,
            start=start, CK=every, NC=nc, t_begin=t_begin, n_steps=n, a_stride=dk, BH=BH, NV=nv,
            BK=bk, BV=bv, HAS_INIT=has_init, SAVE_CKPT=save_checkpoints, SAVE_CHAIN=keep,
            NORM_GATE=config.normalize_gate, NORM_OUT=config.normalize_output, ACC=acc_tl,
            BUG=int(run.bug), DOWNDATE=int(run.downdate),
            SPLIT=_split(plan, bk, loads_tile=has_init), NUDGE=int(nudge),
            LOAD_PLAIN=plan.load_plain, PERIOD_LOOP=plan.period_loop,
            BLOCK_T=_STREAM_BLOCK, num_warps=plan.gate_warps,
        )  # fmt: skip
        s_in, a_in, z_in = s_out, a_out, z_out
    # The final S and A as transposed views of the kernels' buffers, not copies.
    return o, (s_in.mT, a_in.mT, z_in), ck, chain


_Grads = tuple[torch.Tensor, ...]
_Cotangents = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


@dataclass
class _Adjoint:
    """One backward's tensors and launch arguments, shared by its spans (:func:`_backward`).

    ``q, k, v, u, do`` ``[B, T, H, ·]``; the checkpoints ``cks`` (``Sᵀ`` ``[B, H, nc, dk, dv]``),
    ``cka`` (``Aᵀ`` ``[B, H, nc + 1, dk, dk]``), ``ckz`` ``[B, H, nc + 1, dk]``; the gradients
    ``dq, dk, dv, du`` are written span by span.  ``chain``: the forward's per-token gate
    values ``(k̂, α̂, sc, s, cs)`` ``[B·H, T, ·]`` (those :func:`_rerun` writes per span), or
    ``None``: each span reruns the gate pass."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    u: torch.Tensor
    do: torch.Tensor
    cks: torch.Tensor
    cka: torch.Tensor
    ckz: torch.Tensor
    dq: torch.Tensor
    dk: torch.Tensor
    dv: torch.Tensor
    du: torch.Tensor
    run: _Run
    params: torch.Tensor
    period: int
    start: int
    chain: tuple[torch.Tensor, ...] | None = None


def _rerun(
    adj: _Adjoint, xs: tuple[torch.Tensor, ...], a0: torch.Tensor, z0: torch.Tensor, t_begin: int,
    n: int, start: int, fold: tuple[int, int] = (1, 0),
) -> tuple[torch.Tensor, ...]:  # fmt: skip
    """:func:`kernels.vla_gate_kernel` over tokens ``t_begin ≤ t < t_begin + n`` of ``xs =
    (q, k, u)`` ``[B', T', H, dk]`` from the ``(Aᵀ, z)`` ``a0, z0`` ``[B', H, ·]``: the
    per-token ``k̂, α̂, (α̂ᵀq, z_tᵀq), s, (1 + uᵀs, δ, ‖α‖, ‖k‖)`` ``[B'·H, n, ·]``.  ``fold =
    (m, L)``: ``xs`` holds a span folded into ``m`` pieces of ``L`` tokens (batch element
    ``b₀·m + j`` piece ``j``, whose clock runs ``j·L`` steps ahead of ``start``)."""
    q, k, u = xs
    Bp, Tp, H, dk = q.shape
    BH, bk, plan, config = Bp * H, _pow2(dk), adj.run.plan, adj.run.config
    acc, acc_tl = _acc(q.dtype)
    dev = q.device
    kh, ah, sv = (torch.empty(BH, n, bk, dtype=acc, device=dev) for _ in range(3))
    sc = torch.empty(BH, n, 2, dtype=acc, device=dev)
    cs = torch.empty(BH, n, 4, dtype=acc, device=dev)
    a_end = torch.empty(Bp, H, dk, dk, dtype=acc, device=dev)  # the rerun's end state, unused
    z_end = torch.empty(Bp, H, dk, dtype=acc, device=dev)
    kernels.vla_gate_kernel[(BH,)](
        q_ptr=q, k_ptr=k, u_ptr=u, kh_ptr=kh, ah_ptr=ah, sc_ptr=sc, sv_ptr=sv, cs_ptr=cs,
        a0_ptr=a0, z0_ptr=z0, aT_ptr=a_end, zT_ptr=z_end, p_ptr=adj.params, T=Tp, H=H, DK=dk,
        nudge_period=adj.period, start=start, t_begin=t_begin, n_steps=n, a_stride=dk,
        fold_m=fold[0], fold_len=fold[1], BK=bk,
        NORM_GATE=config.normalize_gate, ACC=acc_tl, DOWNDATE=int(adj.run.downdate),
        SPLIT=_split(plan, bk, loads_tile=True), NUDGE=int(_nudge(plan, forward=False)),
        LOAD_PLAIN=plan.load_plain, PERIOD_LOOP=plan.period_loop, num_warps=plan.gate_warps,
    )  # fmt: skip
    return kh, ah, sc, sv, cs


def _state_adjoint(
    adj: _Adjoint, q: torch.Tensor, v: torch.Tensor, do: torch.Tensor,
    gates: tuple[torch.Tensor, ...], cks: torch.Tensor, dS: torch.Tensor, dv_out: torch.Tensor,
    t_begin: int, n: int,
) -> tuple[torch.Tensor, ...]:  # fmt: skip
    """:func:`kernels.vla_state_bwd_kernel` over ``t_begin ≤ t < t_begin + n`` of ``q``
    ``[B', T', H, dk]``, ``v, do`` ``[B', T', H, dv']`` with the gates ``(k̂, α̂, scalars)``
    ``[B'·H, n, ·]``, the ``Sᵀ`` checkpoints ``cks`` ``[B'·H, ·, dk, dv']`` and ``dSᵀ`` after
    the span ``[B'·H, dk, dv']``; writes ``dv_out``.  Returns the value-row sums ``(Σ S_tᵀdr,
    Σ dSᵀe, Σ −S_{t-1}ᵀde)`` ``[3, B'·H, n, BK]``, ``Σ doᵀS_t q`` ``[B'·H, n]`` and ``dSᵀ``
    before the span."""
    Bp, Tp, H, dk = q.shape
    dvp = v.shape[-1]
    BH, bk, plan, config = Bp * H, _pow2(dk), adj.run.plan, adj.run.config
    every, bv = adj.run.checkpoint_every, plan.bwd_block_v
    nv = _cdiv(dvp, bv)
    acc, acc_tl = _acc(q.dtype)
    dev = q.device
    kh, ah, sc = gates
    if _chunked(adj.run.plan.chunked_state_adjoint, adj.run, q.dtype, q.shape[-1]):
        return _state_adjoint_chunked(adj, q, v, do, gates, cks, dS, dv_out, t_begin, n)
    e = torch.empty(nv * BH, every, bv, dtype=acc, device=dev)
    parts = torch.empty(3, nv, BH, n, bk, dtype=acc, device=dev)
    dn_parts = torch.empty(nv, BH, n, dtype=acc, device=dev)
    dS_begin = torch.empty(BH, dk, dvp, dtype=acc, device=dev)
    kernels.vla_state_bwd_kernel[(nv, BH)](
        q_ptr=q, v_ptr=v, do_ptr=do, kh_ptr=kh, ah_ptr=ah, sc_ptr=sc, cks_ptr=cks, dsT_ptr=dS,
        e_ptr=e, dv_ptr=dv_out, dqp_ptr=parts[0], dahp_ptr=parts[1], dkhp_ptr=parts[2],
        dnp_ptr=dn_parts, ds0_ptr=dS_begin, p_ptr=adj.params, T=Tp, H=H, DK=dk, DV=dvp,
        CK=every, NC=cks.numel() // (BH * dk * dvp), t_begin=t_begin, n_steps=n, BK=bk, BV=bv,
        NORM_OUT=config.normalize_output, ACC=acc_tl, num_warps=plan.state_bwd_warps,
    )  # fmt: skip
    sums = parts.sum(dim=1) if nv > 1 else parts[:, 0]
    dn_sum = dn_parts.sum(dim=0) if nv > 1 else dn_parts[0]
    return sums, dn_sum, dS_begin


#: Longest checkpoint interval the chunked adjoints take (their ``[C, C]`` tiles), and the
#: widest key tile of each.  At BK = 128 both fit an H200 SM's 232448 bytes of shared memory
#: only as they are built there: the state adjoint's chunk kernel over three launches
#: (:data:`_SPLIT_STATE_CHUNK_ABOVE`), the pieces' scan and piece kernels with one pipeline
#: stage (:data:`_PIECES_ONE_STAGE_ABOVE`); ``sm90/preflight_adjoints_128.json``.
_MAX_CHUNKED_INTERVAL = 64
_MAX_CHUNKED_WIDTH = 128
#: Key tiles wider than this run :func:`kernels.vla_state_bwd_chunk_kernel` once per group of
#: outputs (``PARTS`` 1: ``dv``, ``dq``, ``dn``; 2: ``dα̂``; 4: ``dk̂``), each launch forming
#: the chunk's ``E`` and ``DE`` again: one program computing all of them keeps 448 bytes per
#: thread on the stack at BK = 128 (8 warps, two stages), the three none
#: (``sm90/preflight_state_chunk_value_walk.json``).
_SPLIT_STATE_CHUNK_ABOVE = 64
#: Warps and software-pipeline stages of :func:`kernels.vla_state_bwd_chunk_kernel`, which walks
#: a chunk's value blocks keeping five sums across them: built for sm_90 (Triton 3.6,
#: ``sm90/preflight_state_chunk_value_walk.json``) with 4 warps it keeps 480 bytes per thread on
#: the stack at BK = 64 and up to 472 at BK = 128, with 8 none; with Triton's default three
#: stages its launch of ``dv, dq, dn`` at BK = 128 asks 299520 bytes of shared memory (the
#: loop's loads buffered three deep), with two 205056.
_STATE_CHUNK_WARPS = 8
_STATE_CHUNK_STAGES = 2
#: Key tiles wider than this build :func:`kernels.vla_state_bwd_scan_kernel` with one stage of
#: Triton's software pipeline: on an H100 (bf16 inputs, T = 16384, ``benchmarks/gpu/
#: chunk_h200.py --adjoint``) its default build asked 242176 bytes of shared memory at BK = 128,
#: above the 232448 an sm_90 block may use (an offline build without the launch's argument
#: alignments had reported 213504; ``benchmarks/preflight_sm90.py`` builds with them and reports
#: 242176, ``sm90/preflight_aligned_128_f61ae7f.json``).  In one stage it asks 79872.
_STATE_SCAN_ONE_STAGE_ABOVE = 64
#: Key tiles wider than this build the pieces' scan and piece kernels with one stage of
#: Triton's software pipeline (``num_stages=1``: the loads in their loops are not
#: multi-buffered in shared memory): with the default they asked 262144 and 237568 bytes at
#: BK = 128, with one stage 131072 and 221184 (``sm90/preflight_adjoints_128.json``).
_PIECES_ONE_STAGE_ABOVE = 64
#: The largest Sherman–Morrison denominator ``δ = 1 + uᵀA u`` in a span that the penalty adjoint
#: in pieces takes; above it the span runs the per-token kernel.  The pieces' products read the
#: contraction of ``A`` along ``u`` from differences whose float32 rounding grows about like
#: ``δ`` (``u_tᵀα_j = u_tᵀA_j k̂_j`` is formed from ``α_j`` at the scale of ``A``, while
#: ``A_j u_t`` is ``δ`` times smaller), where the per-token kernel's does not: on penalties along
#: two axes with mixed magnitudes up to 10^{1, 1.5, 2} (``δ`` up to 10^3, 10^4, 10^5; float32,
#: paper preset, from the zero state, three seeds) the pieces reached 1.08, 1.20 and 2.67 times
#: the spec §4 budget, and up to 10^0.5 (``δ`` ≤ 100) at most 0.39 of it, the per-token kernel
#: 0.54 (``benchmarks/results/cpu/pieces_accuracy.json``; the limit's meta-test:
#: ``tests/test_triton_fused.py::test_penalty_adjoint_in_pieces_on_strong_penalties``).
#: Layer-like penalties (``‖u‖² = 1/dk``) keep ``δ`` near ``1 + 1/(lambda0·dk)``.
PIECES_MAX_DENOMINATOR = 100.0
#: Tokens per program of the pieces' part of ``dAᵀ``
#: (:func:`kernels.vla_penalty_bwd_da_part_kernel`), and per product inside it: 512 programs at
#: T = 16384, B·H = 16.  As one float64 product of the span's rows, converted from float32, it
#: was the only float64 work of the backward: in a training step on an H100
#: (``h100/training_breakdown_48b4b36.json``, both backends alike) float64 copies took 0.35 ms
#: and a float64 matrix product 0.33 ms at D = 64, 0.78 and 0.62 ms at D = 128.
_DA_PART_ROWS = 512
_DA_PART_BLOCK_ROWS = 32


def _register_cap(plan: RecurrentPlan) -> dict[str, int]:
    """The prep kernels' launch option for ``plan.prep_register_cap`` (none for 0)."""
    return {"maxnreg": plan.prep_register_cap} if plan.prep_register_cap else {}


def _chunked(asked: bool, run: _Run, dtype: torch.dtype, dk: int) -> bool:
    """Whether an adjoint half runs by products (the state adjoint in chunks,
    :func:`_state_adjoint_chunked`; the penalty adjoint in pieces,
    :func:`_penalty_adjoint_pieces`): where the plan asks for it (``asked``), in float32
    accumulation (float64 keeps the per-token order of the oracle), with checkpoints at most
    :data:`_MAX_CHUNKED_INTERVAL` tokens apart and key tiles at most :data:`_MAX_CHUNKED_WIDTH`
    wide; elsewhere the per-token kernels (same results up to rounding)."""
    return (
        asked
        and _acc(dtype)[0] == torch.float32
        and run.checkpoint_every <= _MAX_CHUNKED_INTERVAL
        and _pow2(dk) <= _MAX_CHUNKED_WIDTH
    )


def _state_adjoint_chunked(
    adj: _Adjoint, q: torch.Tensor, v: torch.Tensor, do: torch.Tensor,
    gates: tuple[torch.Tensor, ...], cks: torch.Tensor, dS: torch.Tensor, dv_out: torch.Tensor,
    t_begin: int, n: int,
) -> tuple[torch.Tensor, ...]:  # fmt: skip
    """:func:`_state_adjoint` (same arguments, same results) by the chunked kernels: the
    checkpoint intervals are the chunks, ``T_c, W, U`` prepared for all chunks at once
    (:func:`kernels.vla_state_bwd_prep_kernel`), ``dSᵀ`` through the chunks in sequence
    (:func:`kernels.vla_state_bwd_scan_kernel`, two products a chunk), then every chunk's
    per-token adjoint in parallel (:func:`kernels.vla_state_bwd_chunk_kernel`); products of
    float32 operands, ``ieee`` for float32 inputs and ``tf32`` for 16-bit ones (the chunked
    forward's rule).  The derivation is in the kernels' module."""
    Bp, Tp, H, dk = q.shape
    dvp = v.shape[-1]
    BH, bk, plan, config = Bp * H, _pow2(dk), adj.run.plan, adj.run.config
    every, bv = adj.run.checkpoint_every, plan.bwd_block_v
    nv = _cdiv(dvp, bv)
    bc = _pow2(every)
    chunks = _cdiv(n, every)
    acc = torch.float32
    dev = q.device
    kh, ah, sc = gates
    common = {"p_ptr": adj.params, "T": Tp, "H": H, "DK": dk, "DV": dvp, "CK": every,
              "t_begin": t_begin, "n_steps": n, "BK": bk, "BV": bv, "BC": bc,
              "NORM_OUT": config.normalize_output, "ACC": tl.float32,
              "PREC": "tf32" if q.dtype in (torch.bfloat16, torch.float16) else "ieee"}  # fmt: skip
    tm = torch.empty(BH, chunks, bc, bc, dtype=acc, device=dev)
    w = torch.empty(BH, chunks * bc, bk, dtype=acc, device=dev)
    u = torch.empty(BH, chunks * bc, nv * bv, dtype=acc, device=dev)
    kernels.vla_state_bwd_prep_kernel[(chunks, BH)](
        q_ptr=q, do_ptr=do, kh_ptr=kh, ah_ptr=ah, sc_ptr=sc, tm_ptr=tm, w_ptr=w, u_ptr=u, NV=nv,
        **common, **_register_cap(plan),
    )  # fmt: skip
    x_end = torch.empty(BH, chunks, dk, dvp, dtype=acc, device=dev)
    dS_begin = torch.empty(BH, dk, dvp, dtype=acc, device=dev)
    stages = {"num_stages": 1} if bk > _STATE_SCAN_ONE_STAGE_ABOVE else {}
    kernels.vla_state_bwd_scan_kernel[(nv, BH)](
        q_ptr=q, do_ptr=do, kh_ptr=kh, ah_ptr=ah, sc_ptr=sc, w_ptr=w, u_ptr=u, dsT_ptr=dS,
        xend_ptr=x_end, ds0_ptr=dS_begin, NV=nv, BUG=int(adj.run.bug), **common, **stages,
    )  # fmt: skip
    sums = torch.empty(3, BH, n, bk, dtype=acc, device=dev)
    dn_sum = torch.empty(BH, n, dtype=acc, device=dev)
    for out_parts in (7,) if bk <= _SPLIT_STATE_CHUNK_ABOVE else (1, 2, 4):
        kernels.vla_state_bwd_chunk_kernel[(chunks, BH)](
            q_ptr=q, v_ptr=v, do_ptr=do, kh_ptr=kh, ah_ptr=ah, sc_ptr=sc, tm_ptr=tm, w_ptr=w,
            u_ptr=u, cks_ptr=cks, xend_ptr=x_end, dv_ptr=dv_out, dqp_ptr=sums[0], dahp_ptr=sums[1],
            dkhp_ptr=sums[2], dnp_ptr=dn_sum, NC=cks.numel() // (BH * dk * dvp), NV=nv,
            BUG=int(adj.run.bug), PARTS=out_parts, **common,
            num_warps=_STATE_CHUNK_WARPS, num_stages=_STATE_CHUNK_STAGES,
        )  # fmt: skip
    return sums, dn_sum, dS_begin


def _penalty_adjoint(
    adj: _Adjoint, xs: tuple[torch.Tensor, ...], chain: tuple[torch.Tensor, ...],
    sums: tuple[torch.Tensor, torch.Tensor], cka: torch.Tensor, ckz: torch.Tensor,
    dA: torch.Tensor, dz: torch.Tensor, outs: tuple[torch.Tensor, ...], t_begin: int, n: int,
    start: int,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """:func:`kernels.vla_gate_bwd_kernel` over ``t_begin ≤ t < t_begin + n`` of ``xs = (q, k,
    u)`` ``[B', T', H, dk]``, from the rerun's ``chain`` (:func:`_rerun`), the state adjoint's
    ``sums`` (:func:`_state_adjoint`), the ``(Aᵀ, z)`` checkpoints ``[B'·H, ·, ·]`` and ``dAᵀ,
    dz`` after the span; writes ``outs = (dq, dk, du)``.  Returns ``dAᵀ, dz`` before it."""
    q, k, u = xs
    Bp, Tp, H, dk = q.shape
    BH, bk, run = Bp * H, _pow2(dk), adj.run
    if _chunked(run.plan.chunked_penalty_adjoint, run, q.dtype, dk):
        got = _penalty_adjoint_pieces(
            adj, xs, chain, sums, cka, ckz, dA, dz, outs, t_begin, n, start
        )
        if got is not None:
            return got
    acc, acc_tl = _acc(q.dtype)
    kh, ah, sc, sv, cs = chain
    parts, dn = sums
    dA_begin = torch.empty(BH, dk, dk, dtype=acc, device=q.device)
    dz_begin = torch.empty(BH, dk, dtype=acc, device=q.device)
    kernels.vla_gate_bwd_kernel[(BH,)](
        q_ptr=q, k_ptr=k, u_ptr=u, kh_ptr=kh, ah_ptr=ah, sc_ptr=sc, sv_ptr=sv, cs_ptr=cs,
        dqs_ptr=parts[0], dahs_ptr=parts[1], dkhs_ptr=parts[2], dns_ptr=dn, cka_ptr=cka,
        ckz_ptr=ckz, daT_ptr=dA, dzT_ptr=dz, dq_ptr=outs[0], dk_ptr=outs[1], du_ptr=outs[2],
        da0_ptr=dA_begin, dz0_ptr=dz_begin, p_ptr=adj.params, T=Tp, H=H, DK=dk,
        nudge_period=adj.period, start=start, CK=run.checkpoint_every,
        NC=ckz.numel() // (BH * dk) - 1, t_begin=t_begin, n_steps=n, BK=bk,
        NORM_GATE=run.config.normalize_gate, NORM_OUT=run.config.normalize_output, ACC=acc_tl,
        BUG=int(run.bug), DOWNDATE=int(run.downdate), num_warps=run.plan.gate_bwd_warps,
    )  # fmt: skip
    return dA_begin, dz_begin


@functools.lru_cache(maxsize=64)
def _piece_bounds(t_begin: int, n: int, period: int, start: int, every: int) -> tuple[int, ...]:
    """The pieces of the span ``t_begin ≤ t < t_begin + n`` (local indices ``0 = b_0 < b_1 <
    ⋯ = n``): cut after every nudge token (``(start + t + 1) % period == 0``) and at every
    checkpoint (``t % every == 0``; ``t_begin`` is one), so that no piece holds a nudge but on
    its last token and every piece lies in one checkpoint interval."""
    cuts = set(range(0, n, every))
    if period < _NEVER:
        first = (-(start + t_begin + 1)) % period
        cuts.update(i + 1 for i in range(first, n, period))
    cuts.add(n)
    return tuple(sorted(c for c in cuts if 0 <= c <= n))


def _penalty_adjoint_pieces(
    adj: _Adjoint, xs: tuple[torch.Tensor, ...], chain: tuple[torch.Tensor, ...],
    sums: tuple[torch.Tensor, torch.Tensor], cka: torch.Tensor, ckz: torch.Tensor,
    dA: torch.Tensor, dz: torch.Tensor, outs: tuple[torch.Tensor, ...], t_begin: int, n: int,
    start: int,
) -> tuple[torch.Tensor, torch.Tensor] | None:  # fmt: skip
    """:func:`_penalty_adjoint` (same arguments, same results) by products over the span's
    nudge-free pieces (:func:`_piece_bounds`): each piece's ``Q`` and local term in parallel
    (:func:`kernels.vla_penalty_bwd_prep_kernel`), the symmetric ``dA`` and ``dz`` through the
    pieces in sequence (:func:`kernels.vla_penalty_bwd_scan_kernel`, two ``d × d`` products a
    piece; with ``plan.penalty_scan_group = m > 1`` through groups of ``m`` pieces composed
    side by side, :func:`kernels.vla_penalty_bwd_group_kernel`, then each group's inner pieces
    from the group's end, side by side), then every piece's tokens in parallel
    (:func:`kernels.vla_penalty_bwd_piece_kernel`);
    ``dAᵀ`` before the span is the scan's symmetric part plus the antisymmetric part of the
    pieces' sum.  ``None`` where a denominator was floored (the congruence does not hold there)
    or exceeds :data:`PIECES_MAX_DENOMINATOR` (the products lose accuracy there; one device
    synchronisation for both): the caller runs :func:`kernels.vla_gate_bwd_kernel`.
    Derivation: the kernels' module."""
    q, k, u = xs
    Bp, Tp, H, dk = q.shape
    BH, bk, run = Bp * H, _pow2(dk), adj.run
    every = run.checkpoint_every
    kh, ah, sc, sv, cs = chain
    parts, dn = sums
    if t_begin % every:
        raise AssertionError(f"span start {t_begin} off the checkpoint interval {every}")
    bounds = _piece_bounds(t_begin, n, adj.period, start, every)
    n_p = len(bounds) - 1
    dev = q.device
    pc = torch.tensor(bounds, dtype=torch.int32, device=dev)
    bp = max(16, _pow2(max(b - a for a, b in itertools.pairwise(bounds))))
    f32 = torch.float32
    qm, lm = (torch.empty(BH, n_p, bk, bk, dtype=f32, device=dev) for _ in range(2))
    dzp = torch.empty(BH, n_p, bk, dtype=f32, device=dev)
    prec = "tf32" if q.dtype in (torch.bfloat16, torch.float16) else "ieee"
    # 4 warps up to BK = 64, 8 above.  At BK = 64 the piece kernel spills more with 4 than
    # with 8 (888 bytes of stack a thread, sm90/preflight_b9118ed.json; 448 with 8,
    # sm90/preflight_da_part.json) and is still faster: a training step at D = 64,
    # T = 16384 took 15.0 ms with the piece kernel at 4 and 16.2 with the prep kernel at 4,
    # against a median of 17.2 where only a forward kernel's warps changed
    # (h200/launch_warps_64_8e0d05d.json); at BK = 128 4 warps were slower
    # (59.3 against 53.8 ms with the piece kernel at 4, h200/launch_warps_128_9d069e1.json).
    warps = 8 if bk > 64 else 4
    common = {"p_ptr": adj.params, "T": Tp, "H": H, "DK": dk, "CK": every,
              "NC": ckz.numel() // (BH * dk) - 1, "nudge_period": adj.period, "start": start,
              "t_begin": t_begin, "n_steps": n, "BK": bk, "BP": bp, "BC": max(16, _pow2(every)),
              "NORM_GATE": run.config.normalize_gate, "NORM_OUT": run.config.normalize_output,
              "ACC": tl.float32, "PREC": prec, "BUG": int(run.bug), "num_warps": warps}  # fmt: skip
    kernels.vla_penalty_bwd_prep_kernel[(n_p, BH)](
        pc_ptr=pc, q_ptr=q, kh_ptr=kh, ah_ptr=ah, sc_ptr=sc, sv_ptr=sv, cs_ptr=cs,
        dahs_ptr=parts[1], dns_ptr=dn, u_ptr=u, qm_ptr=qm, lm_ptr=lm, dzp_ptr=dzp,
        **common, **_register_cap(run.plan),
    )  # fmt: skip
    # After the first launch, so that the check's synchronisation overlaps it.
    delta_raw = cs[..., 0]
    if not bool(((delta_raw > run.config.sm_floor) & (delta_raw <= PIECES_MAX_DENOMINATOR)).all()):
        return None
    if bk > _PIECES_ONE_STAGE_ABOVE:
        common["num_stages"] = 1
    group = _scan_group(n_p, run.plan.penalty_scan_group)
    sig, dze, sig_begin, dz_begin = _scan_pieces(qm, lm, dzp, dA, dz, dk, group, bug=int(run.bug))
    da, dsm = (torch.empty(BH, n, bk, dtype=f32, device=dev) for _ in range(2))
    kernels.vla_penalty_bwd_piece_kernel[(n_p, BH)](
        pc_ptr=pc, q_ptr=q, k_ptr=k, kh_ptr=kh, ah_ptr=ah, sc_ptr=sc, sv_ptr=sv, cs_ptr=cs,
        dqs_ptr=parts[0], dahs_ptr=parts[1], dkhs_ptr=parts[2], dns_ptr=dn, u_ptr=u,
        cka_ptr=cka, ckz_ptr=ckz, sig_ptr=sig, dze_ptr=dze, da_ptr=da, dsm_ptr=dsm,
        dq_ptr=outs[0], dk_ptr=outs[1], du_ptr=outs[2], **common,
    )  # fmt: skip
    # The pieces' part of dAᵀ, Σ_t k̂_t dα_tᵀ + u_t ds_tᵀ over the span, in segments of
    # _DA_PART_ROWS tokens side by side.
    segments = _cdiv(n, _DA_PART_ROWS)
    seg_part = torch.empty(BH, segments, bk, bk, dtype=f32, device=dev)
    kernels.vla_penalty_bwd_da_part_kernel[(segments, BH)](
        kh_ptr=kh, da_ptr=da, u_ptr=u, dsm_ptr=dsm, part_ptr=seg_part, T=Tp, H=H, DK=dk,
        t_begin=t_begin, n_steps=n, rows=_DA_PART_ROWS, BK=bk, BR=_DA_PART_BLOCK_ROWS,
        num_warps=warps,
    )  # fmt: skip
    part = seg_part.sum(dim=1)[:, :dk, :dk]
    # The symmetric part from the scan, the antisymmetric one from the sum (kernels' module).
    total = dA.reshape(BH, dk, dk).to(f32) + part
    dA_begin = sig_begin[:, :dk, :dk] + 0.5 * (total - total.mT)
    return dA_begin, dz_begin[:, :dk]


def _scan_group(n_p: int, asked: int) -> int:
    """Pieces per group of the penalty adjoint's scan through ``n_p`` pieces: ``asked``, or
    with ``asked = 0`` the power of two nearest ``√n_p`` on a log scale, ties up.  The scan's
    dependent steps are about ``2m`` inside the groups (composing them, then the pieces from
    each group's end) plus ``n_p/m`` through the groups, fewest near ``m = √(n_p/2)``; the
    composed steps cost more than the scan's and run side by side, which moves the best ``m``
    up.  Measured on an
    H100 (B = 1, H = 16, bf16, paper preset): 64 pieces a span (D = 128, T = 16384), the
    training step fastest at 8 (59.3 ms; 4 / 16 / 32: 62.0 / 60.1 / 70.1); 256 (D = 64)
    17.9 ms at 16 against 17.7 at 32, 18.2 at 8; the scan alone over 1024 pieces fastest at
    32 at both widths (``benchmarks/results/h100/adjoint_groups_753ac4b.json``,
    ``adjoint_groups_d128_753ac4b.json``, ``penalty_scan_low_rank_753ac4b.json``)."""
    if asked:
        return asked
    return 1 << math.floor(math.log2(max(1, n_p)) / 2 + 0.5)


def _scan_pieces(
    qm: torch.Tensor, lm: torch.Tensor, dzp: torch.Tensor, dA: torch.Tensor, dz: torch.Tensor,
    dk: int, group: int = 1, *, bug: int = 0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    """The penalty adjoint's scan through a span's pieces, from their ``Q``, local terms and
    ``dz`` parts (``qm, lm`` ``[B·H, n_p, BK, BK]``, ``dzp`` ``[B·H, n_p, BK]``, float32, as
    :func:`kernels.vla_penalty_bwd_prep_kernel` writes them) and the cotangents after the span
    (``dA`` ``[B·H, dk, dk]`` (``dAᵀ``; its symmetric part is taken), ``dz`` ``[B·H, dk]``):
    ``Σ`` and ``dz`` after every piece (``[B·H, n_p, BK, BK]``, ``[B·H, n_p, BK]``) and before
    the span (``[B·H, BK, BK]``, ``[B·H, BK]``).  ``group = m > 1`` (with more than ``m``
    pieces): groups of ``m`` pieces composed side by side
    (:func:`kernels.vla_penalty_bwd_group_kernel`), the scan over the ``⌈n_p/m⌉`` groups, then
    every group's inner pieces from the ``Σ`` after it, side by side again
    (``vla_penalty_bwd_scan_kernel`` with ``FROM_TILES``); else piece after piece."""
    BH, n_p, bk, _ = qm.shape
    dev, f32 = qm.device, torch.float32
    # 8 warps above BK = 64, as the pieces' other kernels (the group kernel with 4 at BK = 64:
    # 16.6 against a median of 17.2 ms a training step, h200/launch_warps_64_8e0d05d.json).
    warps = 8 if bk > 64 else 4
    scan = {"DK": dk, "BK": bk, "ACC": tl.float32, "num_warps": warps}
    if bk > _PIECES_ONE_STAGE_ABOVE:
        scan["num_stages"] = 1
    sig = torch.empty(BH, n_p, bk, bk, dtype=f32, device=dev)
    dze = torch.empty(BH, n_p, bk, dtype=f32, device=dev)
    sig_begin = torch.empty(BH, bk, bk, dtype=f32, device=dev)
    dz_begin = torch.empty(BH, bk, dtype=f32, device=dev)
    if group == 1 or n_p <= group:
        kernels.vla_penalty_bwd_scan_kernel[(1, BH)](
            qm_ptr=qm, lm_ptr=lm, dzp_ptr=dzp, daT_ptr=dA, dzT_ptr=dz, sig_ptr=sig,
            dze_ptr=dze, sig0_ptr=sig_begin, dz0_ptr=dz_begin, n_p=n_p, per_group=n_p,
            FROM_TILES=False, **scan,
        )  # fmt: skip
        return sig, dze, sig_begin, dz_begin
    G = _cdiv(n_p, group)
    qg, lg, sig_g, sig_gb = (torch.empty(BH, G, bk, bk, dtype=f32, device=dev) for _ in range(4))
    dzg, dze_g, dz_gb = (torch.empty(BH, G, bk, dtype=f32, device=dev) for _ in range(3))
    kernels.vla_penalty_bwd_group_kernel[(G, BH)](
        qm_ptr=qm, lm_ptr=lm, dzp_ptr=dzp, qg_ptr=qg, lg_ptr=lg, dzg_ptr=dzg, n_p=n_p,
        per_group=group, BK=bk, BUG=bug, num_warps=warps,
        **({"num_stages": 1} if bk > _PIECES_ONE_STAGE_ABOVE else {}),
    )  # fmt: skip
    kernels.vla_penalty_bwd_scan_kernel[(1, BH)](
        qm_ptr=qg, lm_ptr=lg, dzp_ptr=dzg, daT_ptr=dA, dzT_ptr=dz, sig_ptr=sig_g,
        dze_ptr=dze_g, sig0_ptr=sig_begin, dz0_ptr=dz_begin, n_p=G, per_group=G,
        FROM_TILES=False, **scan,
    )  # fmt: skip
    kernels.vla_penalty_bwd_scan_kernel[(G, BH)](
        qm_ptr=qm, lm_ptr=lm, dzp_ptr=dzp, daT_ptr=sig_g, dzT_ptr=dze_g, sig_ptr=sig,
        dze_ptr=dze, sig0_ptr=sig_gb, dz0_ptr=dz_gb, n_p=n_p, per_group=group,
        FROM_TILES=True, **scan,
    )  # fmt: skip
    return sig, dze, sig_begin, dz_begin


def _sequential_span(adj: _Adjoint, t_begin: int, n: int, cot: _Cotangents) -> _Cotangents:
    """The adjoint over ``t_begin ≤ t < t_begin + n`` in one pass per (b, h), from the
    cotangents ``(dSᵀ, dAᵀ, dz)`` after the span to those before it: the gate rerun from the
    span's checkpoint, the state adjoint, the penalty adjoint."""
    B, _, H, dk = adj.q.shape
    xs = (adj.q, adj.k, adj.u)
    chain = _span_rerun(adj, t_begin, n)
    dS, dA, dz = cot
    *sums, dS_begin = _state_adjoint(
        adj, adj.q, adj.v, adj.do, chain[:3], adj.cks, dS, adj.dv, t_begin, n
    )
    dA_begin, dz_begin = _penalty_adjoint(
        adj, xs, chain, (sums[0], sums[1]), adj.cka, adj.ckz, dA, dz,
        (adj.dq, adj.dk, adj.du), t_begin, n, adj.start,
    )  # fmt: skip
    return (dS_begin.reshape(B, H, dk, -1), dA_begin.reshape(B, H, dk, dk),
            dz_begin.reshape(B, H, dk))  # fmt: skip


def _span_rerun(adj: _Adjoint, t_begin: int, n: int) -> tuple[torch.Tensor, ...]:
    """The gate values (:func:`_rerun`'s) over ``t_begin ≤ t < t_begin + n`` for a one-pass
    span: the forward's, where it kept them (``adj.chain``), else a rerun of the gate pass.

    Through the span from its checkpoint, one program per (b, h); with ``plan.parallel_rerun``,
    from every checkpoint of the span side by side instead: the span folded into pieces of one
    checkpoint interval, each one more batch element whose nudge clock the kernel advances by
    its offset, and the rest of the span after the last whole piece through it.  Each piece
    starts from the forward's own ``A`` and ``z`` at its checkpoint, so the rerun follows the
    forward's trajectory at least as closely as one started at the span's beginning."""
    if adj.chain is not None:
        # Copies only where the span is part of the sequence (the kernels read [B·H, n, ·]).
        return tuple(x[:, t_begin : t_begin + n].contiguous() for x in adj.chain)
    xs = (adj.q, adj.k, adj.u)
    every = adj.run.checkpoint_every
    c = t_begin // every
    unit = every
    m = n // unit
    if not adj.run.plan.parallel_rerun or m < 2:
        return _rerun(adj, xs, adj.cka[:, :, c].contiguous(), adj.ckz[:, :, c].contiguous(),
                      t_begin, n, adj.start)  # fmt: skip
    B, _, H, dk = adj.q.shape
    head = m * unit
    slots = c + torch.arange(m, device=adj.q.device)
    if adj.run.bug == Bug.RERUN_NEXT_CHECKPOINT:
        slots = slots + 1

    def fold(x: torch.Tensor) -> torch.Tensor:  # [B, T, H, d] -> [B·m, unit, H, d]
        return x[:, t_begin : t_begin + head].reshape(B * m, unit, H, x.shape[-1])

    a0 = adj.cka[:, :, slots].transpose(1, 2).reshape(B * m, H, dk, dk).contiguous()
    z0 = adj.ckz[:, :, slots].transpose(1, 2).reshape(B * m, H, dk).contiguous()
    start = (adj.start + t_begin) % adj.period if adj.period != _NEVER else 0
    folded = _rerun(adj, tuple(fold(x) for x in xs), a0, z0, 0, unit, start, fold=(m, unit))
    # [B·m·H, unit, ·] -> [B·H, m·unit, ·]
    parts = tuple(
        x.reshape(B, m, H, unit, x.shape[-1]).transpose(1, 2).reshape(B * H, head, x.shape[-1])
        for x in folded
    )
    if head == n:
        return parts
    e = c + head // every
    tail = _rerun(adj, xs, adj.cka[:, :, e].contiguous(), adj.ckz[:, :, e].contiguous(),
                  t_begin + head, n - head, adj.start)  # fmt: skip
    return tuple(torch.cat([p, t], dim=1) for p, t in zip(parts, tail, strict=True))


def _sym(x: torch.Tensor) -> torch.Tensor:
    return 0.5 * (x + x.mT)


def _state_block_ends(dS_T: torch.Tensor, KT: torch.Tensor, local: torch.Tensor) -> torch.Tensor:
    """``dSᵀ`` after every block ``[B, blocks, H, dk, dv]`` (float64) from ``dSᵀ`` after the
    last ``[B, H, dk, dv]``, each block's ``Kᵀ`` and adjoint from zero ``[B, blocks, H, ·, ·]``:
    ``dSᵀ_end(b − 1) = Kᵀ_b dSᵀ_end(b) + ℓ_b`` (:func:`_blocked_span`)."""
    ends = [dS_T.double()]
    for b in range(KT.shape[1] - 1, 0, -1):
        ends.append(KT[:, b].double() @ ends[-1] + local[:, b].double())
    return torch.stack(ends[::-1], dim=1)


def _penalty_block_ends(
    dA_T: torch.Tensor, dz_T: torch.Tensor, JT: torch.Tensor, local_A: torch.Tensor,
    local_z: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """``dAᵀ`` and ``dz`` after every block (float64, ``[B, blocks, H, ·]``) from those after
    the last, each block's ``Jᵀ`` and adjoint from zero: ``Σ_end(b − 1) = Jᵀ_b Σ_end(b) J_b +
    sym(ℓ_b)``, ``dz_end(b − 1) = dz_end(b) + ℓ_z``; the last block takes the whole ``dA``, its
    antisymmetric part included (:func:`_blocked_span`)."""
    JT = JT.double()
    sigma, zs = [_sym(dA_T.double())], [dz_T.double()]
    for b in range(JT.shape[1] - 1, 0, -1):
        sigma.append(JT[:, b] @ sigma[-1] @ JT[:, b].mT + _sym(local_A[:, b].double()))
        zs.append(zs[-1] + local_z[:, b].double())
    sigma[0] = dA_T.double()
    return torch.stack(sigma[::-1], dim=1), torch.stack(zs[::-1], dim=1)


def _join_penalty_blocks(dA_begin: torch.Tensor) -> torch.Tensor:
    """``dAᵀ_0`` ``[B, H, dk, dk]`` from every block's ``dAᵀ`` before it ``[B, blocks, H, dk,
    dk]`` (second pass): the first block's, plus the antisymmetric part that each later block
    added, which passes the earlier blocks unchanged (:func:`_blocked_span`)."""
    later = dA_begin[:, 1:]
    return dA_begin[:, 0] + 0.5 * (later - later.mT).sum(dim=1)


def _blocked_span(
    adj: _Adjoint, t_begin: int, blocks: int, L: int, cot: _Cotangents
) -> _Cotangents | None:
    """The adjoint over ``t_begin ≤ t < t_begin + blocks·L`` with its ``blocks`` blocks of
    ``L`` tokens side by side, each one more batch element (``L`` a multiple of the checkpoint
    interval and of the nudge period, so that every block starts at a checkpoint with the same
    nudge clock).  ``None`` where a Sherman–Morrison denominator was floored in the span (then
    the penalty adjoint is not the congruence below; the caller runs the span in one pass).

    Every cotangent of spec §2.3 propagates linearly backwards, so each block's adjoint is an
    affine map of the cotangent after the block:

    - ``dS_start = dS_end K + ℓ_S`` with ``K = Π_t (I − α̂_t k̂_tᵀ)`` (later tokens first);
    - ``dz_start = dz_end + ℓ_z``;
    - the symmetric part of ``dA``: ``Σ_start = Jᵀ Σ_end J + sym(ℓ_A)`` with the
      Sherman–Morrison step's Jacobian ``J = Π_t N_t``, ``N_t = I − s_t u_tᵀ/δ_t`` (later tokens
      first; the nudge's Jacobian is the identity).  An antisymmetric ``dA`` passes a step
      unchanged and changes no input's gradient (the step reads ``dA + dAᵀ`` and ``sᵀdA s``):
      each block's own antisymmetric part is added to ``dA_0`` at the end.

    ``ℓ`` is a block's adjoint from zero cotangents.  ``K`` and ``J`` come from the state
    adjoint kernel run on the identity (``dS_end = I`` with ``do = 0`` walks ``dS ← dS(I −
    α̂k̂ᵀ)``; with ``k̂ → u``, ``α̂ → s/δ`` it walks ``dS ← dS N_t``).  A scan over the blocks
    gives each block's true cotangents after it, and a second pass of every block from them
    gives all gradients.  Over ``blocks`` times as many programs, the gate rerun runs once, the
    penalty adjoint twice and the state adjoint three times (from zero with ``K`` on ``[dv |
    dk]`` rows, for ``J`` on ``dk`` rows, and from the true cotangents)."""
    run = adj.run
    B, _, H, dk = adj.q.shape
    dv = adj.v.shape[-1]
    Bp, n = B * blocks, blocks * L
    every = run.checkpoint_every
    per = L // every  # checkpoints per block
    c0 = t_begin // every
    acc = _acc(adj.q.dtype)[0]
    dev = adj.q.device

    def fold(x: torch.Tensor) -> torch.Tensor:  # [B, T, H, d] -> [B·blocks, L, H, d]
        return x[:, t_begin : t_begin + n].reshape(Bp, L, H, x.shape[-1])

    def unfold(x: torch.Tensor) -> torch.Tensor:  # [B·blocks·H, ...] -> [B, blocks, H, ...]
        return x.reshape(B, blocks, H, *x.shape[1:])

    q, k, v, u, do = (fold(x) for x in (adj.q, adj.k, adj.v, adj.u, adj.do))
    xs = (q, k, u)
    # Block b's checkpoints: slots c0 + b·per + j; the A and z slots run one past its end.
    slots = c0 + per * torch.arange(blocks, device=dev)[:, None] + torch.arange(per + 1, device=dev)
    cks = adj.cks[:, :, c0 : c0 + blocks * per].reshape(B, H, blocks, per, dk, dv)
    cks = cks.transpose(1, 2).contiguous()
    cka = adj.cka[:, :, slots].transpose(1, 2).contiguous()  # [B, blocks, H, per + 1, dk, dk]
    ckz = adj.ckz[:, :, slots].transpose(1, 2).contiguous()
    start = (adj.start + t_begin) % adj.period if adj.period != _NEVER else 0
    if adj.chain is not None:  # [B·H, T, c] -> [B·blocks·H, L, c]
        chain = tuple(
            x.view(B, H, -1, x.shape[-1])[:, :, t_begin : t_begin + n]
            .reshape(B, H, blocks, L, x.shape[-1]).transpose(1, 2)
            .reshape(Bp * H, L, x.shape[-1]).contiguous()
            for x in adj.chain
        )  # fmt: skip
    else:
        chain = _rerun(adj, xs, cka[:, :, :, 0].reshape(Bp, H, dk, dk).contiguous(),
                       ckz[:, :, :, 0].reshape(Bp, H, dk).contiguous(), 0, L, start)  # fmt: skip
    kh, ah, sc, sv, cs = chain
    if not bool((cs[..., 0] > run.config.sm_floor).all()):
        return None
    bk = kh.shape[-1]
    eye = torch.eye(dk, dtype=acc, device=dev)

    # 1. The state adjoint from zero, and K: values [v | 0], cotangents [do | 0], dS_end [0 | I].
    wide = torch.zeros(Bp, L, H, dv + dk, dtype=adj.v.dtype, device=dev)
    wide_do = torch.zeros_like(wide)
    wide_do[..., :dv] = do
    dS_end = torch.zeros(Bp * H, dk, dv + dk, dtype=acc, device=dev)
    dS_end[:, :, dv:] = eye
    wide_ck = torch.zeros(Bp * H * per, dk, dv + dk, dtype=acc, device=dev)
    *_, dS_zero = _state_adjoint(adj, q, wide, wide_do, (kh, ah, sc), wide_ck, dS_end,
                                 torch.empty_like(wide), 0, L)  # fmt: skip
    local_S, KT = unfold(dS_zero[:, :, :dv]), unfold(dS_zero[:, :, dv:])  # Kᵀ: dSᵀ ← Kᵀ dSᵀ
    # 2. J by the same kernel: k̂ → u, α̂ → s/δ, dS_end = I.
    u_rows = torch.zeros(Bp * H, L, bk, dtype=acc, device=dev)
    u_rows[:, :, :dk] = u.permute(0, 2, 1, 3).reshape(Bp * H, L, dk)
    s_rows = sv / cs[..., 1:2]
    square = torch.zeros(Bp, L, H, dk, dtype=adj.v.dtype, device=dev)
    *_, JT = _state_adjoint(adj, q, square, square, (u_rows, s_rows, sc),
                            torch.zeros(Bp * H * per, dk, dk, dtype=acc, device=dev),
                            eye.expand(Bp * H, dk, dk).contiguous(), torch.empty_like(square),
                            0, L)  # fmt: skip
    JT = unfold(JT)  # Jᵀ, since the kernel returns dSᵀ = (I·J)ᵀ
    # 3. The state scan, then the state adjoint of every block from its true dS_end.
    dS_T, dA_T, dz_T = cot  # [B, H, ·]
    dS_ends = _state_block_ends(dS_T, KT, local_S).to(acc).reshape(Bp * H, dk, dv)
    dv_f = torch.empty_like(v)
    *sums, dS_begin = _state_adjoint(adj, q, v, do, (kh, ah, sc), cks, dS_ends, dv_f, 0, L)
    # 4. The penalty adjoint from zero, the scan of Σ and dz, the second pass.
    outs = tuple(torch.empty_like(x) for x in (q, k, u))
    zeros_A = torch.zeros(Bp * H, dk, dk, dtype=acc, device=dev)
    zeros_z = torch.zeros(Bp * H, dk, dtype=acc, device=dev)
    local_A, local_z = _penalty_adjoint(adj, xs, chain, (sums[0], sums[1]), cka, ckz, zeros_A,
                                        zeros_z, outs, 0, L, start)  # fmt: skip
    dA_ends, dz_ends = _penalty_block_ends(dA_T, dz_T, JT, unfold(local_A), unfold(local_z))
    dA_ends, dz_ends = dA_ends.to(acc).reshape(Bp * H, dk, dk), dz_ends.to(acc).reshape(Bp * H, dk)
    dA_begin, dz_begin = _penalty_adjoint(adj, xs, chain, (sums[0], sums[1]), cka, ckz, dA_ends,
                                          dz_ends, outs, 0, L, start)  # fmt: skip
    for grad, out in zip((adj.dq, adj.dk, adj.du, adj.dv), (*outs, dv_f), strict=True):
        grad[:, t_begin : t_begin + n] = out.reshape(B, n, H, out.shape[-1])
    dA_0 = _join_penalty_blocks(unfold(dA_begin))
    return (unfold(dS_begin)[:, 0].reshape(B, H, dk, dv), dA_0.reshape(B, H, dk, dk),
            unfold(dz_begin)[:, 0].reshape(B, H, dk))  # fmt: skip


def _span_floats_per_token(run: _Run, dtype: torch.dtype, dk: int, dv: int, period: int) -> int:
    """Floats per token and head of the backward's buffers that grow with a span's length, an
    upper bound: the state adjoint's value-row sums (``4·rows·BK``, ``rows`` value blocks, for
    the per-token kernel, which keeps one partial sum per block; ``4·BK`` for the chunk kernel,
    which sums them, besides its ``T_c``, ``W``, ``U`` and ``dSᵀ`` after every interval) and,
    for the penalty adjoint in pieces, ``3·BK²`` a piece (``Q``, the local term, ``Σ``) for at
    most one piece per interval and one per nudge period, besides ``3·BK`` (``dzp``, ``DA``,
    ``DS``).  A span also allocates ``3·BK²`` per head for each group of pieces (about the
    root of their number, which the count's margin covers in long spans) and a few ``BK²``
    whatever its length (``dAᵀ`` and ``dSᵀ`` before it, the pieces' part of ``dAᵀ``)."""
    plan, every = run.plan, run.checkpoint_every
    bk = _pow2(dk)
    # The blocked span's widest state adjoint has dv + dk value rows.
    width = dv if plan.adjoint_blocks == 1 else dv + dk
    if _chunked(plan.chunked_state_adjoint, run, dtype, dk):
        padded = _cdiv(width, plan.bwd_block_v) * plan.bwd_block_v
        floats = 4 * bk + _pow2(every) + bk + padded + _cdiv(dk * width, every)
    else:
        floats = 4 * _cdiv(width, plan.bwd_block_v) * bk
    if _chunked(plan.chunked_penalty_adjoint, run, dtype, dk):
        floats += _cdiv(3 * bk * bk * (every + min(period, every)), every * min(period, every))
        floats += 3 * bk
    return floats


def _span_tokens(run: _Run, dtype: torch.dtype, T: int, BH: int, dk: int, dv: int) -> int:
    """Tokens per span of the backward: as many whole checkpoint intervals as keep the span's
    buffers (:func:`_span_floats_per_token`, in the accumulation dtype) under
    :data:`_SEGMENT_BYTES`, at least one, then evened out over the ``⌈T/seg⌉`` spans."""
    every = run.checkpoint_every
    period = _clock(run.config, run.start)[0]
    per_token = BH * _span_floats_per_token(run, dtype, dk, dv, period) * _acc(dtype)[0].itemsize
    seg = max(every, _SEGMENT_BYTES // per_token // every * every)
    return _cdiv(_cdiv(T, _cdiv(T, seg)), every) * every


def _spans(T: int, seg: int, unit: int, blocks: int) -> list[tuple[int, int, int]]:
    """The backward's spans, last first, as ``(t_begin, blocks, L)`` (``blocks = 1``: one pass
    over ``L`` tokens): segments of at most ``seg`` tokens (whole checkpoint intervals); a
    segment runs as ``blocks`` blocks of ``L`` tokens, ``L`` a multiple of ``unit``, where at
    least :data:`_MIN_ADJOINT_BLOCKS` fit, its remainder in one pass first."""
    spans = []
    for t_begin in reversed(range(0, T, seg)):
        n = min(seg, T - t_begin)
        nb = min(blocks, n // unit)
        if blocks == 1 or nb < min(blocks, _MIN_ADJOINT_BLOCKS) or nb < 2:
            spans.append((t_begin, 1, n))
            continue
        L = n // (nb * unit) * unit
        if n > nb * L:
            spans.append((t_begin + nb * L, 1, n - nb * L))
        spans.append((t_begin, nb, L))
    return spans


def _backward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    u: torch.Tensor,
    ck: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    do: torch.Tensor,
    final: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    run: _Run,
    chain: tuple[torch.Tensor, ...] | None = None,
) -> _Grads:
    """The adjoint of spec §2.3, span by span from the end (:func:`_spans`), ``dS, dA, dz``
    carried between spans.  A span in one pass (:func:`_sequential_span`) is three kernels:

    1. :func:`kernels.vla_gate_kernel` reruns the gate pass from the span's ``(A, z)``
       checkpoint, for the span's ``k̂, α̂, s`` and scalars — unless the forward kept them
       (``chain``: ``k̂, α̂`` ``[B·H, T, BK]``, ``(α̂ᵀq, z_tᵀq)`` ``[B·H, T, 2]``, ``s``
       ``[B·H, T, BK]``, ``(1 + uᵀs, δ, ‖α‖, ‖k‖)`` ``[B·H, T, 4]``, in the accumulation
       dtype, ``BK`` the key tile, zero past ``dk``: the chunked backend's forward);
    2. :func:`kernels.vla_state_bwd_kernel`, one program per (b, h) and value block: the state
       adjoint, with per-block partial sums of the vectors the penalty half needs;
    3. :func:`kernels.vla_gate_bwd_kernel`, one program per (b, h): the penalty adjoint from the
       summed partials and the rerun's vectors, walking each chunk back from the next
       checkpoint (the forward stores the final state as one more).

    With ``plan.adjoint_blocks > 1`` a long span runs as blocks side by side
    (:func:`_blocked_span`).  Spans keep their buffers under :data:`_SEGMENT_BYTES`.  Returns
    ``dq, dk, dv, du`` (inputs' dtype) and ``dS_0, dA_0, dz_0`` (accumulation dtype).
    """
    B, T, H, dk = q.shape
    dv = v.shape[-1]
    BH = B * H
    acc = _acc(q.dtype)[0]
    plan, config, every = run.plan, run.config, run.checkpoint_every
    period, start = _clock(config, run.start)
    seg = _span_tokens(run, q.dtype, T, BH, dk, dv)
    cks, cka, ckz = ck
    adj = _Adjoint(
        q=q, k=k, v=v, u=u, do=do, cks=cks, cka=cka, ckz=ckz, dq=torch.empty_like(q),
        dk=torch.empty_like(k), dv=torch.empty_like(v), du=torch.empty_like(u), run=run,
        params=_params(config, acc, q.device), period=period, start=start, chain=chain,
    )  # fmt: skip
    unit = every if period == _NEVER else every * period // math.gcd(every, period)
    # dSᵀ, dAᵀ: the kernels' memory layout, like the checkpoints (cks holds Sᵀ [dk, dv]).
    cot: _Cotangents = (final[0].mT.contiguous(), final[1].mT.contiguous(), final[2])
    for t_begin, blocks, L in _spans(T, seg, unit, plan.adjoint_blocks):
        done = None if blocks == 1 else _blocked_span(adj, t_begin, blocks, L, cot)
        if done is None:
            n = L if blocks == 1 else blocks * L
            done = _sequential_span(adj, t_begin, n, cot)
        cot = done
    dS, dA, dz = cot
    return adj.dq, adj.dk, adj.dv, adj.du, dS.mT.contiguous(), dA.mT.contiguous(), dz


class FusedRecurrentVLAFunction(torch.autograd.Function):
    """Autograd for the kernels: the forward saves checkpoints, the backward reruns from them.

    ``forward(q, k, v, u, S0, A0, z0, run)`` returns ``(o, S_T, A_T, z_T)``; the initial-state
    arguments may be ``None`` (spec §2.3 defaults).  Gradients flow to ``q, k, v, u`` and, when
    given, the initial state.
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
        run: _Run,
    ) -> tuple[torch.Tensor, ...]:
        state0 = None if S0 is None else (S0, A0, z0)
        save = any(ctx.needs_input_grad[:7])
        o, (sT, aT, zT), ck, chain = _forward(q, k, v, u, state0, run, save, run.state_dtype)  # type: ignore[arg-type]
        if save:
            assert ck is not None
            ctx.save_for_backward(q, k, v, u, *ck, *(chain or ()))
            ctx.run = run
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
        q, k, v, u, cks, cka, ckz, *chain = ctx.saved_tensors
        acc = _acc(q.dtype)[0]
        final = (dsT.to(acc).contiguous(), daT.to(acc).contiguous(), dzT.to(acc).contiguous())
        dq, dk_, dv_, du, ds0, da0, dz0 = _backward(
            q, k, v, u, (cks, cka, ckz), do.contiguous(), final, ctx.run, tuple(chain) or None
        )
        grads_state: tuple[torch.Tensor | None, ...] = (None, None, None)
        if ctx.state_dtypes is not None:
            grads_state = tuple(
                g.to(dt) for g, dt in zip((ds0, da0, dz0), ctx.state_dtypes, strict=True)
            )
        return (dq, dk_, dv_, du, *grads_state, None)


# -- the public function -------------------------------------------------------------------------


def _check_run(q: torch.Tensor, v: torch.Tensor) -> None:
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


def _apply(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    u: torch.Tensor,
    config: VLAConfig,
    initial_state: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None,
    start: int,
    checkpoint_every: int,
    downdate: str,
    plan: RecurrentPlan | None,
    bug: Bug,
    state_dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """:func:`fused_recurrent_vla` after the layout checks (shapes, dtypes, ``start``); the
    final state in ``state_dtype`` (default the accumulation dtype)."""
    _check_run(q, v)
    if not _is_int(checkpoint_every) or checkpoint_every < 1:
        raise UnsupportedConfigurationError(
            _NAME, f"checkpoint_every must be an integer >= 1, got {checkpoint_every!r}",
            "checkpoint_every",
        )  # fmt: skip
    if downdate not in DOWNDATES:
        raise UnsupportedConfigurationError(
            _NAME, f"downdate must be one of {sorted(DOWNDATES)}, got {downdate!r}", "downdate"
        )
    if plan is not None and not isinstance(plan, RecurrentPlan):
        raise UnsupportedConfigurationError(
            _NAME, f"plan must be a RecurrentPlan (see plan_for), got {type(plan).__name__}",
            "plan",
        )  # fmt: skip
    state = tuple(initial_state) if initial_state is not None else ()
    training = torch.is_grad_enabled() and any(x.requires_grad for x in (q, k, v, u, *state))
    if plan is None:
        B, T, H, dk = q.shape
        plan = plan_for(B, H, T, dk, v.shape[-1], q.dtype, q.device, training)
    run = _Run(
        config=config,
        plan=plan,
        checkpoint_every=checkpoint_every,
        # float64 is the reference-grade path: it keeps the oracle's order of operations (the
        # fma form left float64 gradients 1.3x outside their error budget in the tests).
        downdate=Downdate.EXACT if q.dtype == torch.float64 else DOWNDATES[downdate],
        start=start,
        bug=bug,
        state_dtype=state_dtype,
    )
    q, k, v, u = (x.contiguous() for x in (q, k, v, u))
    S0 = A0 = z0 = None
    if state:
        S0, A0, z0 = (x.contiguous() for x in state)
    if not training:  # no autograd record, no checkpoints
        state0 = (S0, A0, z0) if state else None
        o, final, _, _ = _forward(q, k, v, u, state0, run, False, run.state_dtype)  # type: ignore[arg-type]
        return o, final  # type: ignore[return-value]
    o, sT, aT, zT = FusedRecurrentVLAFunction.apply(q, k, v, u, S0, A0, z0, run)
    return o, (sT, aT, zT)


def fused_recurrent_vla(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    u: torch.Tensor,
    *,
    config: VLAConfig | None = None,
    initial_state: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
    start: int = 0,
    checkpoint_every: int = 64,
    downdate: str = "fma",
    check_finite: bool = False,
    plan: RecurrentPlan | None = None,
) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """The recurrence of spec §2.3 in Triton kernels; differentiable.

    Parameters
    ----------
    q, k, u : ``[B, T, H, dk]``; v : ``[B, T, H, dv]`` (spec §1), one float dtype (float32,
        bfloat16, float16 accumulate in float32; float64 in float64), on a CUDA device — or on
        the CPU when Triton's interpreter is on.  ``dk, dv <= 128``; ``(T + 64)·H·max(dk, dv)
        < 2**31`` (the kernels' offsets inside one batch element).
    config : :class:`VLAConfig` (every field honoured; default the paper preset).
    initial_state : ``(S [B, H, dv, dk], A [B, H, dk, dk], z [B, H, dk])`` or ``None``, each
        in the inputs' dtype or float32 (the state this function returns, taken as it is).
    start : the tokens consumed before this call (spec §2.3): the nudge follows token ``t`` of
        the call when ``(start + t + 1) % nudge_period == 0``, so that a sequence cut anywhere
        and continued from the returned state with ``start`` = the tokens so far is the whole.
    checkpoint_every : C, tokens between the state checkpoints that the backward reruns from
        (memory ``⌈T/C⌉`` states per (b, h); rounding of the in-chunk reversal grows with C).
    downdate : the Sherman–Morrison downdate of ``A``: ``"fma"`` (default; ``fma(−s_i s_j,
        1/δ, A)``, a multiply and a fused multiply-add per entry, the oracle's error bound) or
        ``"exact"`` (each ``s_i s_j / δ`` a correctly rounded division, the oracle's order of
        operations; 2-3x slower on the H200, ``benchmarks/results/h200/variants.json``).
        float64 inputs always take ``"exact"``.  The backward's rerun uses the forward's
        downdate, so that it retraces the forward's rounding.
    check_finite : also refuse NaN/Inf inputs (a device sync per input).
    plan : how the kernels run (:class:`RecurrentPlan`); default :func:`plan_for` of the shape
        (the fastest measured).

    Returns
    -------
    ``o`` ``[B, T, H, dv]`` in the inputs' dtype and the final ``(S, A, z)`` in float32
    (float64 for float64 inputs).

    Raises
    ------
    ShapeError, DTypeError, NonFiniteError, DeviceError, ConfigError, UnsupportedConfigurationError
        naming the argument (e.g. ``q`` for dk > 128, ``q`` for CPU tensors without the
        interpreter, ``start`` for a negative one).
    """
    config = VLAConfig() if config is None else config
    shapes = check_inputs(
        q,
        k,
        v,
        u,
        initial_state,
        dtypes=_DTYPES,
        check_finite=check_finite,
        state_dtypes=("float32",),
    )
    check_offsets(_NAME, shapes.T, shapes.H, shapes.dk, shapes.dv)
    start = check_start(start)
    return _apply(
        q, k, v, u, config, initial_state, start, checkpoint_every, downdate, plan, Bug.NONE
    )


def with_planted_bug(bug: str) -> Callable[..., Any]:
    """:func:`fused_recurrent_vla` with the planted bug ``bug`` (:data:`PLANTED_BUGS`) in the
    kernels: for the meta-tests that show the checks reject a wrong kernel."""
    planted = PLANTED_BUGS[bug]

    def fn(
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        u: torch.Tensor,
        *,
        config: VLAConfig | None = None,
        initial_state: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
        start: int = 0,
        checkpoint_every: int = 64,
        downdate: str = "fma",
        plan: RecurrentPlan | None = None,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        config = VLAConfig() if config is None else config
        shapes = check_inputs(
            q,
            k,
            v,
            u,
            initial_state,
            dtypes=_DTYPES,
            check_finite=False,
            state_dtypes=("float32",),
        )
        check_offsets(_NAME, shapes.T, shapes.H, shapes.dk, shapes.dv)
        return _apply(
            q, k, v, u, config, initial_state, check_start(start), checkpoint_every, downdate,
            plan, planted,
        )  # fmt: skip

    return fn


# -- the registry backend ------------------------------------------------------------------------

#: The backend's options that are not plan fields, with their defaults.
_SEMANTIC_OPTIONS: dict[str, Any] = {
    "checkpoint_every": 64,
    "downdate": "fma",
    "check_finite": False,
}


class TritonFusedBackend(TritonKernelBackend):
    """Registry name ``triton_fused``: :func:`fused_recurrent_vla` as a spec §4 callable.

    Returns ``(o, (S, A, z))`` all in the inputs' dtype and device.  Options: the semantic
    ``checkpoint_every``, ``downdate``, ``check_finite`` (NaN/Inf inputs refused, a device sync
    per input; off by default, as in :func:`fused_recurrent_vla`) and every field of
    :class:`RecurrentPlan` (default ``None``: from :func:`plan_for`).
    """

    name = _NAME
    description = "Triton recurrent kernels (spec §2.3), streamed forward and backward"
    capabilities = Capabilities(
        array="torch",
        devices=("cuda", "cpu"),
        dtypes=_DTYPES,
        variants=("vla",),
        differentiable=True,
        max_head_dim=MAX_HEAD_DIM,
        requires=("torch", "triton"),
        options={**_SEMANTIC_OPTIONS, **dict.fromkeys(PLAN_FIELDS)},
    )

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._plan_options = {
            n: self.options[n] for n in PLAN_FIELDS if self.options[n] is not None
        }

    def _interpreted(self) -> bool:
        return interpreted()

    def _run(self, q, k, v, u, *, config, initial_state, start=0):  # type: ignore[no-untyped-def]
        plan = None
        if self._plan_options:
            B, T, H, dk = q.shape
            state = initial_state or ()
            training = torch.is_grad_enabled() and any(
                x.requires_grad for x in (q, k, v, u, *state)
            )
            base = plan_for(B, H, T, dk, v.shape[-1], q.dtype, q.device, training)
            plan = dataclasses.replace(base, **self._plan_options)
        # The inputs' layouts were checked by Backend.__call__.
        # The state in the inputs' dtype (spec §4), stored so by the kernel: no cast kernels.
        return _apply(
            q, k, v, u, config, initial_state, start, self.options["checkpoint_every"],
            self.options["downdate"], plan, Bug.NONE, q.dtype,
        )  # fmt: skip
