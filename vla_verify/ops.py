"""One entry point for VLA on a GPU: :func:`vla` picks the kernel for the call.

- The recurrent kernel (:func:`vla_verify.backends.triton_fused.fused_recurrent_vla`) for short
  sequences and decoding.
- The chunked kernel (:func:`vla_verify.backends.triton_chunked.chunked_vla`) for the forward
  from ``FORWARD_CROSSOVER_T`` tokens (long prefill) and for training from
  ``TRAINING_CROSSOVER_T`` tokens: per key width, the lengths where it was measured faster.

Both compute spec §2.3 with every :class:`~vla_verify.spec.VLAConfig` field and ``start``
honoured; the choice only changes speed and rounding.  torch and triton are imported on the
first call, never at ``import vla_verify``.

The entry point's own work is one attribute lookup per tensor and a comparison: no input
checks beyond the kernels' own, no conversions, no registry lookup (``benchmarks/gpu/
chunk_h200.py`` times it against the kernel called directly).
"""

from __future__ import annotations

from typing import Any

from .spec import VLAConfig

__all__ = [
    "FORWARD_CROSSOVER_T",
    "TRAINING_CROSSOVER_T",
    "choose",
    "vla",
]

#: Sequence length from which the forward runs the chunked kernel, per key width: the row of
#: the narrowest width at least ``dk``; no row (keys wider than every row) or ``None``: never.
#: Each row is the first measured length from which the chunked kernel is faster than the
#: recurrent one, side by side (B = 1, H = 16, bf16, paper preset), ms chunked / recurrent:
#: at D = 64 0.889 / 0.869 (T = 1024), 1.03 / 3.39 (4096); at D = 128 1.75 / 1.16 (1024),
#: 2.91 / 4.61 (4096), 8.74 / 18.4 (16384) (an H100,
#: ``benchmarks/results/h100/chunk_133f5d0.json``, one grid at one commit; the grid of
#: ``h100/chunk_131f844.json`` agrees: 0.882 / 0.862, 1.52 / 3.41, and 1.77 / 1.17,
#: 2.94 / 4.61, 8.77 / 18.4, as do ``h100/chunk_1b3e657.json``: 0.924 / 0.862, 0.999 / 3.39,
#: and 1.75 / 1.16, 2.74 / 4.58, 8.12 / 18.2, ``h100/chunk.json`` (commit ``b07b137``, bf16
#: state-side intermediates in the bf16 forward): 0.908 / 0.869, 1.02 / 3.41, and 1.75 / 1.17,
#: 2.49 / 4.61, 7.21 / 18.4, and the H200 grid of
#: ``h200/chunk.json``, commit ``9d069e1``, its chunked forward with bf16 intermediates then:
#: 0.895 / 0.871, 1.03 / 3.45, and 1.75 / 1.17, 2.59 / 4.65, 7.78 / 18.6); at T = 2048 the
#: recurrent kernel was faster at both widths (2.80 / 1.73 and 4.39 / 2.33 on the H200,
#: ``h200/forward_crossover.json``, where D = 128 ran one block at 2048 tokens as the chunked
#: kernel still does).  The chunked kernel stays reachable with ``kernel="chunked"``.
FORWARD_CROSSOVER_T: dict[int, int | None] = {64: 4096, 128: 4096}
#: Sequence length from which training (inputs that require grad) runs the chunked kernel, per
#: key width (as :data:`FORWARD_CROSSOVER_T`).  Both backwards are the recurrent adjoint (the
#: chunked one from its forward's checkpoints and chain values).  Forward + backward, chunked
#: against recurrent, ms, from the same grid (``h100/chunk_133f5d0.json``): at
#: D = 64 2.60 / 2.54 (T = 1024), 4.61 / 7.54 (4096), 17.3 / 29.9 (16384), and
#: 8.88 / 6.53 at T = 2048 on the H200 (``h200/forward_crossover.json``, older kernels); at
#: D = 128 5.00 / 4.96 (1024), 15.9 / 19.8 (4096), 63.1 / 79.4 (16384).  The grid of
#: ``h100/chunk_131f844.json`` has 2.79 / 2.94 at D = 64, T = 1024, the other way round from
#: the grid above by about the spread between machines, ``h200/chunk.json`` (commit
#: ``9d069e1``) 2.44 / 2.50 at D = 64 and 4.79 / 4.75 at D = 128, T = 1024 (within 2.5 %), and
#: ``h100/chunk_1b3e657.json`` 2.31 / 2.37 and 5.02 / 4.96, ``h100/chunk.json`` (commit
#: ``b07b137``) 3.49 / 3.27 and 5.10 / 4.94 (within 7 %; 4.24 / 6.86 and 15.4 / 19.9 at 4096),
#: so the rows stay at 4096.
TRAINING_CROSSOVER_T: dict[int, int | None] = {64: 4096, 128: 4096}

_KERNELS: dict[str, Any] = {}


def _kernel(name: str) -> Any:
    fn = _KERNELS.get(name)
    if fn is None:
        if name == "chunked":
            from .backends.triton_chunked import chunked_vla as fn
        else:
            from .backends.triton_fused import fused_recurrent_vla as fn
        _KERNELS[name] = fn
    return fn


def choose(T: int, training: bool, dk: int | None = None) -> str:
    """``"chunked"`` or ``"recurrent"`` for a call of ``T`` tokens with key width ``dk``
    (``None``: the narrowest row; module docstring)."""
    table = TRAINING_CROSSOVER_T if training else FORWARD_CROSSOVER_T
    widths = sorted(w for w in table if dk is None or w >= dk)
    crossover = table[widths[0]] if widths else None
    if crossover is not None and T >= crossover:
        return "chunked"
    return "recurrent"


def vla(
    q: Any,
    k: Any,
    v: Any,
    u: Any,
    *,
    config: VLAConfig | None = None,
    initial_state: tuple[Any, Any, Any] | None = None,
    start: int = 0,
    kernel: str | None = None,
) -> tuple[Any, tuple[Any, Any, Any]]:
    """VLA (spec §2.3) through the kernel that suits the call.

    Parameters
    ----------
    q, k, u : ``[B, T, H, dk]``; v : ``[B, T, H, dv]`` torch tensors on a CUDA device (spec §1).
    config : :class:`VLAConfig` (default the paper preset).
    initial_state : ``(S, A, z)`` to continue from, or ``None``.
    start : tokens consumed before the call (spec §2.3: the nudge clock continues).
    kernel : ``None`` (choose by :func:`choose`), ``"chunked"`` or ``"recurrent"``.

    Returns
    -------
    ``o`` ``[B, T, H, dv]`` in the inputs' dtype and the state ``(S, A, z)`` (float32 for
    16-bit and float32 inputs).
    """
    if kernel is None:
        training = q.requires_grad or k.requires_grad or v.requires_grad or u.requires_grad
        kernel = choose(q.shape[1], training, q.shape[-1])
    elif kernel not in ("chunked", "recurrent"):
        from .errors import VLAInputError

        raise VLAInputError("kernel", f"expected None, 'chunked' or 'recurrent', got {kernel!r}")
    fn = _kernel(kernel)
    if kernel == "chunked":
        return fn(q, k, v, u, config=config, initial_state=initial_state, start=start)  # type: ignore[no-any-return]
    if start:
        return fn(q, k, v, u, config=config, initial_state=initial_state, start=start)  # type: ignore[no-any-return]
    return fn(q, k, v, u, config=config, initial_state=initial_state)  # type: ignore[no-any-return]
