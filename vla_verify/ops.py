"""One entry point for VLA on a GPU: :func:`vla` picks the kernel for the call.

- The recurrent kernel (:func:`vla_verify.backends.triton_fused.fused_recurrent_vla`) for short
  sequences and decoding, and for training below ``TRAINING_CROSSOVER_T``.
- The chunked kernel (:func:`vla_verify.backends.triton_chunked.chunked_vla`) for the forward at
  ``T >= FORWARD_CROSSOVER_T`` (long prefill) and for training at ``T >= TRAINING_CROSSOVER_T``,
  with keys at most ``FORWARD_CROSSOVER_MAX_DK`` wide: the lengths and widths where it was
  measured faster.

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
    "FORWARD_CROSSOVER_MAX_DK",
    "FORWARD_CROSSOVER_T",
    "TRAINING_CROSSOVER_T",
    "choose",
    "vla",
]

#: Sequence length from which the forward runs the chunked kernel, for key widths up to
#: :data:`FORWARD_CROSSOVER_MAX_DK`; ``None``: never.  Measured on the H200 (B = 1, H = 16,
#: bf16, paper preset, ``benchmarks/results/h200/chunk.json``, side by side): at D = 64 the
#: chunked forward takes 6.14 ms against the recurrent kernel's 3.43 ms at T = 4096, 11.0 against
#: 13.7 ms at 16384 and 38.7 against 54.7 ms at 65536; the log-linear interpolation crosses at
#: T ≈ 11 300, and the rule takes the first measured length at which the chunked kernel is
#: faster.  With the state chain in two launches (``chunk_training.json``): 4.35 against 3.43 ms
#: at T = 4096, 9.04 against 13.7 ms at 16384; the rule gives the same length.  The chunked
#: kernel stays reachable with ``kernel="chunked"``.
FORWARD_CROSSOVER_T: int | None = 16384
#: The widest key dimension both crossovers hold for: at D = 128 the chunked forward is
#: slower at every measured length (33.9 against 18.5 ms at T = 16384, 122 against 74.0 ms at
#: 65536; its float64 block-start products grow as dk³), so wider keys run the recurrent kernel,
#: in training too (the two share the backward, so the forward decides).
FORWARD_CROSSOVER_MAX_DK = 64
#: Sequence length from which training (inputs that require grad) runs the chunked kernel, for
#: key widths up to :data:`FORWARD_CROSSOVER_MAX_DK`; ``None``: never.  The chunked kernel's
#: backward is the recurrent kernel's adjoint from the chunked forward's checkpoints, so the two
#: kernels differ only in the forward.  Measured on the H200 (B = 1, H = 16, bf16, paper preset,
#: D = 64, forward + backward, ``benchmarks/results/h200/chunk_training.json``, side by side):
#: chunked 25.2 against recurrent 23.6 ms at T = 4096, 88.5 against 94.3 ms at T = 16384; the
#: rule takes the first measured length at which the chunked kernel is faster.
TRAINING_CROSSOVER_T: int | None = 16384

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
    (``None``: any width the crossover holds for; module docstring)."""
    if dk is not None and dk > FORWARD_CROSSOVER_MAX_DK:
        return "recurrent"
    crossover = TRAINING_CROSSOVER_T if training else FORWARD_CROSSOVER_T
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
