"""What the Triton registry backends share (:mod:`.triton_fused`, :mod:`.triton_chunked`):
whether their kernels can run here, the CPU-interpreter rule (with the interpreter's bf16
conversions rounded to nearest, :func:`~vla_verify.runtime.round_interpreter_bf16_to_nearest`),
and the opt-in NaN/Inf checks.

Imported only by those backends (it imports torch), never at ``import vla_verify``.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from ..errors import UnsupportedConfigurationError
from ..runtime import round_interpreter_bf16_to_nearest
from ..spec import VLAConfig
from .registry import Backend

# Under the interpreter the kernels' bf16 conversions round as the GPU's do, whoever calls them
# (the command line and the tests install the same; without it the interpreter truncates).
round_interpreter_bf16_to_nearest()


def built_for_interpreter(kernel: Any) -> bool:
    """Whether a ``@triton.jit`` kernel was built for Triton's CPU interpreter
    (``TRITON_INTERPRET=1`` was set when Triton decorated it)."""
    return type(kernel).__name__ == "InterpretedFunction"


def availability_reason(interpreted: bool) -> str | None:
    """``None`` if kernels built so (``interpreted``) can run here, else why not."""
    if torch.cuda.is_available() or interpreted:
        return None
    if os.environ.get("TRITON_INTERPRET") == "1":
        return (
            "no CUDA GPU, and TRITON_INTERPRET=1 was set only after Triton had built the "
            "kernels; set it before the first import of triton"
        )
    return "no CUDA GPU and TRITON_INTERPRET is not set (TRITON_INTERPRET=1 runs it on CPU)"


#: The largest offset inside one batch element and head that the kernels form in 32 bits.
MAX_OFFSET = 2**31 - 1


def offsets_reason(T: int, H: int, dk: int, dv: int) -> str | None:
    """Why the kernels cannot index a request (``None`` if they can): the batch element and
    head are indexed in 64 bits, a token inside them in 32, as ``t·H·d`` in the inputs'
    ``[B, T, H, d]`` layout and ``t·BK`` in the per-head buffers (``BK ≤ 128``, ``T`` padded to
    a chunk of at most 64 tokens), so those offsets must stay within :data:`MAX_OFFSET`."""
    extent = (T + 64) * max(H * max(dk, dv), 128)
    if extent <= MAX_OFFSET:
        return None
    return (
        f"T={T}, H={H}, dk={dk}, dv={dv} need offsets (T + 64)·max(H·max(dk, dv), 128) = "
        f"{extent} inside one batch element, above the kernels' 32-bit {MAX_OFFSET}; split the "
        "sequence and carry the state (initial_state, start)"
    )


def check_offsets(backend: str, T: int, H: int, dk: int, dv: int) -> None:
    """:func:`offsets_reason` as an :class:`~vla_verify.errors.UnsupportedConfigurationError`
    naming ``q``."""
    reason = offsets_reason(T, H, dk, dv)
    if reason is not None:
        raise UnsupportedConfigurationError(backend, reason, argument="q")


class TritonKernelBackend(Backend):
    """A registry backend over Triton kernels: CUDA tensors, or CPU tensors under the
    interpreter; the option ``check_finite`` turns on the NaN/Inf checks of inputs and
    outputs, which read them back (a device sync per call) and are off by default on a GPU."""

    def _interpreted(self) -> bool:
        """Whether this backend's kernels were built for the interpreter."""
        raise NotImplementedError

    def _explain_refusal(self, reason: str) -> str:
        """A refusal of the generic checks, with the backend's advice (default: as it is)."""
        return reason

    def availability(self) -> str | None:
        return availability_reason(self._interpreted())

    def _checks_finite(self) -> bool:
        return bool(self.options["check_finite"])

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
            return self._explain_refusal(reason)
        if device == "cpu" and not self._interpreted():
            return (
                "CPU tensors need Triton's interpreter (TRITON_INTERPRET=1 before importing "
                "triton); use CUDA tensors"
            )
        return offsets_reason(shapes.T, shapes.H, shapes.dk, shapes.dv)
