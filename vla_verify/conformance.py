"""The conformance table of ``vla-verify run``: every backend validated against the oracle.

:func:`conformance` validates each available backend (or those named) for the dtypes of its
plan, variant ``vla``, under the error budget of spec §4, and returns one
:class:`ConformanceRow` per (backend, dtype); :func:`format_conformance` prints them.  A backend
named explicitly that cannot run here is an error with the registry's reason (not a silent
``SKIPPED``); with no names, every backend the registry knows gets a row.

Counts.  ``examples`` is the number of examples that count toward ``max_examples`` (those inside
the precision's envelope, as Hypothesis counts them; the progress bar counts the same), and
``rejected`` the examples drawn on top that fell outside the envelope of the dtype and were
redrawn.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .backends import available, get
from .errors import BackendUnavailableError, UnsupportedConfigurationError, VLAError, VLAInputError
from .progress import ProgressBar
from .properties.strategies import ShapeBounds
from .runtime import cuda_available
from .spec import Shapes, VLAConfig
from .validation import ValidationReport, validate

__all__ = ["ConformanceRow", "conformance", "format_conformance", "run_config"]


@dataclass
class ConformanceRow:
    """One (backend, dtype) line of the conformance report."""

    backend: str
    dtype: str
    device: str
    verdict: str  # PASSED | FAILED | SKIPPED
    examples: int
    worst_ratio: float | None
    seconds: float
    note: str
    rejected: int = 0

    def as_dict(self) -> dict[str, Any]:
        return self.__dict__.copy()


#: Per backend: dtypes to check in `run`, the largest shapes (mpmath is slow) and the share of
#: ``max_examples``.
_RUN_PLAN: dict[str, tuple[tuple[str, ...], ShapeBounds | None, float]] = {
    "numpy": (("float64", "float32"), None, 1.0),
    "mpmath": (("float64",), ShapeBounds(max_B=1, max_H=1, max_T=24, max_dk=3, max_dv=3), 0.2),
    "torch": (("float64", "float32", "bfloat16"), None, 1.0),
    "torch_chunked": (("float64", "float32", "bfloat16"), None, 1.0),
    "triton_fused": (("float32", "bfloat16"), None, 0.5),
    "triton_chunked": (("float32", "bfloat16"), None, 0.5),
    "fla": (("float32", "bfloat16"), ShapeBounds(max_T=24), 0.5),
}

#: Shapes for the Triton kernels when they run through the interpreter (no GPU): at the
#: checker's default sizes (dk to 128, T to 640) one interpreted example takes minutes.
_INTERPRETER_BOUNDS = ShapeBounds(max_B=2, max_H=2, max_T=80, max_dk=16, max_dv=16)


def _check_count(value: Any, argument: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise VLAInputError(argument, f"expected a positive integer, got {value!r}")
    return value


def conformance(
    names: Sequence[str] | None = None,
    *,
    max_examples: int = 30,
    seed: int = 0,
    show_progress: bool = True,
) -> list[ConformanceRow]:
    """Validate every available backend (or ``names``) against the oracle, variant ``vla``.

    Raises :class:`~vla_verify.errors.UnknownBackendError`-like :class:`VLAInputError` for an
    unknown name, :class:`BackendUnavailableError` for a named backend that is not available
    here, and :class:`UnsupportedConfigurationError` for a named backend none of whose planned
    dtypes can run, each with the registry's reason, before any validation runs.
    """
    max_examples = _check_count(max_examples, "max_examples")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise VLAInputError("seed", f"expected an integer, got {seed!r}")
    if names is not None and (
        isinstance(names, str) or not all(isinstance(n, str) and n for n in names)
    ):
        raise VLAInputError("--backends", f"expected a list of backend names, got {names!r}")
    statuses = {s.name: s for s in available()}
    explicit = bool(names)
    chosen = list(names) if names else list(statuses)
    for name in chosen:
        status = statuses.get(name)
        if status is None:
            raise VLAInputError("--backends", f"unknown backend {name!r}; known: {list(statuses)}")
        if explicit and (not status.available or status.capabilities is None):
            raise BackendUnavailableError(name, status.reason or "unavailable")
    rows: list[ConformanceRow] = []
    for name in chosen:
        status = statuses[name]
        if not status.available or status.capabilities is None:
            reason = status.reason or "unavailable"
            rows.append(ConformanceRow(name, "-", "-", "SKIPPED", 0, None, 0.0, reason))
            continue
        rows.extend(_backend_rows(name, status.capabilities, max_examples, seed, show_progress))
        if explicit and all(r.verdict == "SKIPPED" for r in rows if r.backend == name):
            reasons = "; ".join(r.note for r in rows if r.backend == name)
            raise UnsupportedConfigurationError(
                name, reasons or "no planned dtype is supported", argument="--backends"
            )
    return rows


def _backend_rows(
    name: str, caps: Any, max_examples: int, seed: int, show_progress: bool
) -> list[ConformanceRow]:
    rows: list[ConformanceRow] = []
    dtypes, bounds, scale = _RUN_PLAN.get(name, (caps.dtypes, None, 1.0))
    if "cuda" in caps.devices and cuda_available():
        device = "cuda"
    else:
        device = "cpu" if "cpu" in caps.devices else caps.devices[0]
    backend = get(name)
    if name.startswith("triton") and device == "cpu":
        bounds = _INTERPRETER_BOUNDS
    for dtype in dtypes:
        if dtype not in caps.dtypes:
            continue
        config, config_note = run_config(backend, dtype, device)
        n = max(5, int(max_examples * scale))
        bar = ProgressBar(f"conformance {name} {dtype}", n, enabled=show_progress)
        try:
            report: ValidationReport = validate(
                backend,
                config=config,
                array=caps.array,
                dtype=dtype,
                device=device,
                max_examples=n,
                seed=seed,
                bounds=bounds,
                progress=bar,
            )
        except (VLAError, BackendUnavailableError) as exc:
            bar.close()
            rows.append(ConformanceRow(name, dtype, device, "SKIPPED", 0, None, 0.0, str(exc)))
            continue
        bar.close()
        note = "; ".join(
            x for x in (config_note, "" if report.passed else report.failures[0].message) if x
        )
        rows.append(
            ConformanceRow(
                name,
                dtype,
                device,
                "PASSED" if report.passed else "FAILED",
                report.examples - report.rejected - report.beyond_reach,
                report.worst_ratio,
                report.elapsed_s,
                note,
                report.rejected + report.beyond_reach,
            )
        )
        if not report.passed:
            print(report.summary(), file=sys.stderr)
    return rows


def run_config(backend: Any, dtype: str, device: str) -> tuple[VLAConfig, str]:
    """The paper preset if the backend takes it, else the nearest configuration it does take
    (a chunked backend needs nudges at chunk boundaries), with a note saying which."""
    one = Shapes(1, 1, 1, 1, 1)
    preset = VLAConfig()
    if backend.check_support(preset, one, dtype, device) is None:
        return preset, ""
    chunk = getattr(backend, "options", {}).get("chunk_size")
    for config in ([preset.replace(nudge_period=chunk)] if chunk else []) + [VLAConfig.exact()]:
        if backend.check_support(config, one, dtype, device) is None:
            return config, f"config: nudge_period={config.nudge_period} (the preset's 20 refused)"
    return preset, ""


def format_conformance(rows: Sequence[ConformanceRow]) -> str:
    """The table printed by ``vla-verify run``."""
    lines = [
        "Conformance against the float64 oracle (variant vla, error budget of spec §4)",
        f"{'backend':<15} {'dtype':<9} {'device':<6} {'verdict':<8} {'examples':>8} "
        f"{'rejected':>8} {'err/budget':>10} {'time':>7}  note",
    ]
    for r in rows:
        ratio = "-" if r.worst_ratio is None else f"{r.worst_ratio:.3g}"
        lines.append(
            f"{r.backend:<15} {r.dtype:<9} {r.device:<6} {r.verdict:<8} {r.examples:>8} "
            f"{r.rejected:>8} {ratio:>10} {r.seconds:>6.1f}s  {r.note}"
        )
    lines.append(
        "examples: those counted toward --max-examples (as the progress bars count them); "
        "rejected: drawn on top (outside the dtype's envelope, or beyond the reference's reach), "
        "redrawn"
    )
    return "\n".join(lines)
