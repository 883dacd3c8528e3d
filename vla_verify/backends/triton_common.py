"""What the Triton registry backends share (:mod:`.triton_fused`, :mod:`.triton_chunked`):
whether their kernels can run here, the CPU-interpreter rule, and the opt-in NaN/Inf checks.

Imported only by those backends (it imports torch), never at ``import vla_verify``.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from ..spec import VLAConfig
from .registry import Backend


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
        return None
