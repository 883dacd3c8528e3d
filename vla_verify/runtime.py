"""How the command line sets up the process before it runs anything: the Triton interpreter on a
machine without a GPU, and Hypothesis draws that depend on the seed alone.

Both must happen before the first kernel import or the first Hypothesis draw, and the same way for
every subcommand, so that ``run``, ``check``, ``backends`` and ``claims`` see the same backends and
the same seed gives the same figures.
"""

from __future__ import annotations

import importlib.util
import os
import sys

__all__ = ["cuda_available", "pin_hypothesis_constants", "use_triton_interpreter_without_gpu"]


def cuda_available() -> bool:
    """Whether PyTorch is installed and sees a CUDA GPU."""
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def _triton_installed() -> bool:
    try:
        return importlib.util.find_spec("triton") is not None
    except (ImportError, ValueError):
        return False


def use_triton_interpreter_without_gpu() -> bool:
    """Set ``TRITON_INTERPRET=1`` when Triton is installed, there is no CUDA GPU and the user has
    not chosen, so that the Triton kernels run on the CPU through Triton's interpreter.  Must run
    before triton is first imported (it reads the variable at import); returns whether it set
    it."""
    if "TRITON_INTERPRET" in os.environ or "triton" in sys.modules or not _triton_installed():
        return False
    if cuda_available():
        return False
    os.environ["TRITON_INTERPRET"] = "1"
    return True


def pin_hypothesis_constants() -> bool:
    """Make Hypothesis' draws depend on the seed alone, not on which modules are imported.

    Hypothesis (6.13x and later) mixes into its draws constants collected from the source of
    every local module in ``sys.modules``, and caches them at the first draw.  ``vla-verify run``
    imports the conformance machinery and the backends before the claims' searches, ``claims``
    does not, so the same seed drew different examples (C3's search differed from the first
    drawn ``seed`` on).  Turning the collection off gives both the same examples.  Uses a
    private Hypothesis hook; returns False (and changes nothing) where it is absent."""
    try:
        from hypothesis.internal.conjecture import providers
    except ImportError:  # pragma: no cover - hypothesis is a dependency
        return False
    if not hasattr(providers, "_get_local_constants") or not hasattr(providers, "_local_constants"):
        return False
    empty = providers._local_constants
    providers._get_local_constants = lambda: empty
    return True
