"""A small progress bar for long runs (stderr; redrawn in place on a terminal, sparse otherwise)."""

from __future__ import annotations

import sys
import time
from typing import TextIO

__all__ = ["ProgressBar"]


class ProgressBar:
    """``bar = ProgressBar("validate numpy", total); bar(done, total); bar.close()``."""

    def __init__(
        self, label: str, total: int, *, stream: TextIO | None = None, enabled: bool = True
    ) -> None:
        self.label = label
        self.total = max(int(total), 1)
        self.stream = sys.stderr if stream is None else stream
        self.enabled = enabled
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.start = time.perf_counter()
        self._last_percent = -1

    def __call__(self, done: int, total: int | None = None) -> None:
        if not self.enabled:
            return
        if total is not None:
            self.total = max(int(total), 1)
        frac = min(done / self.total, 1.0)
        percent = int(frac * 100)
        elapsed = time.perf_counter() - self.start
        if self.tty:
            width = 24
            filled = int(frac * width)
            bar = "#" * filled + "." * (width - filled)
            self.stream.write(
                f"\r{self.label:<36.36s} [{bar}] {done:>4d}/{self.total:<4d} {elapsed:6.1f}s"
            )
            self.stream.flush()
        elif percent // 25 > self._last_percent // 25:  # a line at 0, 25, 50, 75, 100 %
            self.stream.write(f"{self.label}: {done}/{self.total} ({elapsed:.1f}s)\n")
            self.stream.flush()
        self._last_percent = percent

    def close(self) -> None:
        if self.enabled and self.tty:
            self.stream.write("\n")
            self.stream.flush()
