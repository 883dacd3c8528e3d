"""Proofs and certificates for the claims of spec §3.

- :mod:`.symbolic` — sympy proofs of the identities behind C1, C3 and C4 (``ALL_PROOFS``);
- :mod:`.certificates` — counterexamples saved as exact JSON, re-checked in ``mpmath.iv``
  interval arithmetic, and replayed (``vla-verify claims --replay FILE``);
- :mod:`.ledger` and :mod:`.claims` — the verdict of each claim (built on the two above).

Submodules are imported on first use: sympy is only loaded when a proof is run.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["certificates", "claims", "ledger", "symbolic"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
