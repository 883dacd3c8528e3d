"""How the command line sets up the process before it runs anything: the Triton interpreter on a
machine without a GPU, and Hypothesis draws that depend on the seed alone.

Both must happen before the first kernel import or the first Hypothesis draw, and the same way for
every subcommand, so that ``run``, ``check``, ``backends`` and ``claims`` see the same backends and
the same seed gives the same figures.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import sys
from collections.abc import Iterator

__all__ = ["cuda_available", "seed_only_draws", "use_triton_interpreter_without_gpu"]


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


@contextlib.contextmanager
def seed_only_draws() -> Iterator[bool]:
    """Within the block, Hypothesis' draws depend on the seed alone, not on which modules are
    imported; yields whether it could arrange that.

    Hypothesis (6.13x and later) mixes into its draws constants collected from the source of
    every local module in ``sys.modules``, cached at the first draw of each kind.  ``vla-verify
    run`` imports the conformance machinery and the backends before the claims' searches,
    ``claims`` does not, so the same seed drew different examples (C3's search differed from the
    first drawn ``seed`` on).  Inside the block the collection is off and the cache empty; both
    are restored on exit.  Uses a private Hypothesis hook; where it is absent, nothing changes.
    """
    try:
        from hypothesis.internal.conjecture import providers
    except ImportError:  # pragma: no cover - hypothesis is a dependency
        yield False
        return
    hook = getattr(providers, "_get_local_constants", None)
    pool = getattr(providers, "_local_constants", None)
    cache = getattr(providers, "CONSTANTS_CACHE", None)
    if hook is None or pool is None or cache is None:
        yield False
        return
    empty = type(pool)()
    # A fresh cache: entries drawn before the block were computed with the constants.
    providers.CONSTANTS_CACHE = type(cache)(getattr(cache, "max_size", 1024))
    providers._get_local_constants = lambda: empty
    try:
        yield True
    finally:
        providers._get_local_constants = hook
        providers.CONSTANTS_CACHE = cache
