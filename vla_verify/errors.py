"""Typed errors of vla_verify.

Every error raised for bad input is a :class:`VLAInputError`, a ``ValueError`` subclass that
names the offending argument (``.argument``) and says what was expected.  A backend that cannot
run a request raises :class:`UnsupportedConfigurationError` (also a ``ValueError``) with the
registry's reason; a backend whose packages or device are missing raises
:class:`BackendUnavailableError`.
"""

from __future__ import annotations

__all__ = [
    "BackendUnavailableError",
    "ConfigError",
    "DTypeError",
    "DeviceError",
    "IllConditionedError",
    "NonFiniteError",
    "NonFiniteResultError",
    "ShapeError",
    "UnknownBackendError",
    "UnknownVariantError",
    "UnsupportedConfigurationError",
    "VLAError",
    "VLAInputError",
]


class VLAError(Exception):
    """Base class of every error raised by vla_verify."""


class VLAInputError(VLAError, ValueError):
    """Bad input: the message names the argument and what was expected."""

    def __init__(self, argument: str, message: str) -> None:
        self.argument = argument
        super().__init__(f"{argument}: {message}")


class ConfigError(VLAInputError):
    """An invalid :class:`~vla_verify.spec.VLAConfig` field."""


class ShapeError(VLAInputError):
    """Wrong rank or mismatched shapes (layouts of spec §1)."""


class DTypeError(VLAInputError):
    """A non-float dtype, mixed dtypes, or a dtype the backend cannot take."""


class NonFiniteError(VLAInputError):
    """NaN or Inf in an input array."""


class UnknownVariantError(VLAInputError):
    """A variant name other than those of spec §2.3–§2.4."""


class UnknownBackendError(VLAInputError):
    """A backend name the registry does not know."""


class DeviceError(VLAInputError):
    """Inputs on a device the backend cannot use, or on several devices."""


class UnsupportedConfigurationError(VLAInputError):
    """The backend exists and is available but cannot run this request (the reason says why)."""

    def __init__(self, backend: str, reason: str, argument: str = "config") -> None:
        self.backend = backend
        self.reason = reason
        super().__init__(argument, f"backend {backend!r} cannot run this request: {reason}")


class BackendUnavailableError(VLAError, RuntimeError):
    """The backend's packages or device are missing on this machine."""

    def __init__(self, backend: str, reason: str) -> None:
        self.backend = backend
        self.reason = reason
        super().__init__(f"backend {backend!r} is not available here: {reason}")


class IllConditionedError(VLAError, ArithmeticError):
    """The reference cannot vouch for its own result: along the recurrence the quantity that
    predicts its loss of accuracy (e.g. the Sherman–Morrison cancellation, the floor taking
    effect, the drift of ``A`` from symmetric positive definite, overflow) passed what the
    working precision resolves, and no escalation could recover it.

    ``step`` is the 1-based token at which it happened (``None`` when not tied to one),
    ``figure`` names the quantity and ``estimate`` is its value (e.g. the a-posteriori relative
    error estimate).
    """

    def __init__(
        self, message: str, *, step: int | None = None, figure: str = "", estimate: float = 0.0
    ) -> None:
        self.step = step
        self.figure = figure
        self.estimate = estimate
        where = "" if step is None else f" at step {step}"
        super().__init__(f"ill-conditioned{where}: {message}")


class NonFiniteResultError(VLAError, ArithmeticError):
    """A backend produced NaN or Inf from finite inputs (``where`` names the output, e.g.
    ``"o"`` or ``"state.A"``)."""

    def __init__(self, backend: str, where: str, message: str = "") -> None:
        self.backend = backend
        self.where = where
        extra = f": {message}" if message else ""
        super().__init__(
            f"backend {backend!r} returned non-finite {where} from finite inputs{extra}"
        )
