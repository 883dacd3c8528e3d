"""Property-based checks of spec §3 (claims C1–C5) and §4 (agreement, state carry).

- :mod:`.strategies` — Hypothesis strategies for inputs and states, with the hard corners;
- :mod:`.invariants` — the invariants, each run over any registered backend
  (``ALL_INVARIANTS`` says which claim, variants and backends each applies to).

Submodules are imported on first use, so ``import vla_verify`` stays light (and
:mod:`vla_verify.validation` may import the strategies without importing the invariants).
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["invariants", "strategies"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
