"""The backend registry: what implementations exist, what each can run, and why not.

Modelled on flash-linear-attention's per-operator ``BackendRegistry``: each backend declares its
array library, devices, dtypes, variants and whether it is differentiable, and answers
``check_support(config, shapes, dtype, device)`` with ``None`` or the reason it cannot run a
request.  Backends are imported lazily — only when asked for — so ``import vla_verify`` needs
NumPy and SciPy alone, and the registry reports a missing package as a reason instead of failing.

``VLA_VERIFY_BACKENDS=a,b`` selects the backends the test suite runs against (:func:`selected`).
"""

from __future__ import annotations

import importlib
import importlib.util
import math
import numbers
import os
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

from ..arrays import is_torch
from ..errors import (
    BackendUnavailableError,
    ConfigError,
    DeviceError,
    DTypeError,
    NonFiniteResultError,
    ShapeError,
    UnknownBackendError,
    UnknownVariantError,
    UnsupportedConfigurationError,
)
from ..spec import (
    VARIANTS,
    Shapes,
    VLAConfig,
    all_finite,
    check_config,
    check_inputs,
    check_start,
    check_variant,
    dtype_name,
)

__all__ = [
    "ENV_VAR",
    "Backend",
    "BackendStatus",
    "Capabilities",
    "available",
    "get",
    "names",
    "refuse_shifted_clock",
    "register",
    "selected",
]

ENV_VAR = "VLA_VERIFY_BACKENDS"


@dataclass(frozen=True)
class Capabilities:
    """What a backend can run, declared once."""

    array: str  # "numpy" | "torch"
    devices: tuple[str, ...]
    dtypes: tuple[str, ...]
    variants: tuple[str, ...] = VARIANTS
    differentiable: bool = False
    max_head_dim: int | None = None
    requires: tuple[str, ...] = ()  # Python packages it imports
    options: dict[str, Any] = field(default_factory=dict)  # option name -> default


def _device_of(x: Any) -> str:
    device = getattr(x, "device", "cpu")
    return str(getattr(device, "type", device))


class Backend(ABC):
    """A spec §4 callable: ``backend(q, k, v, u, *, config, initial_state=None, start=0)``.

    Calling it returns ``(o, (S, A, z))`` in the inputs' array library, dtype and device.  The
    variant and backend options are bound with :meth:`bind` (``get("torch_chunked").bind(
    variant="delta", chunk_size=32)``), so a bound backend can be passed to
    :func:`vla_verify.validate` like any user function.
    """

    name: str = ""
    description: str = ""
    capabilities: Capabilities
    #: Whether :meth:`__call__` checks that finite inputs gave finite outputs (one reduction per
    #: output).  A backend whose check would cost a device synchronisation (a GPU kernel) may
    #: turn it off, or override :meth:`checks_finite_outputs` to decide per device.
    finite_output_check: bool = True

    def __init__(self, *, variant: str = "vla", **options: Any) -> None:
        if not isinstance(variant, str):
            raise UnknownVariantError(
                "variant", f"expected one of {VARIANTS}, got {type(variant).__name__}"
            )
        self.variant = check_variant(variant)
        unknown = set(options) - set(self.capabilities.options)
        if unknown:
            raise UnsupportedConfigurationError(
                self.name,
                f"unknown option(s) {sorted(unknown)}; this backend takes "
                f"{sorted(self.capabilities.options) or 'no options'}",
                argument=sorted(unknown)[0],
            )
        for option, value in options.items():
            self._check_option(option, value, self.capabilities.options[option])
        self.options = {**self.capabilities.options, **options}

    def _check_option(self, option: str, value: Any, default: Any) -> None:
        """Refuse an option value of another type than its default's (an integer option takes
        an integer ``>= 0``), raising :class:`ConfigError` naming the option.  Backends with
        stricter options extend it."""
        if default is None:
            return
        if isinstance(default, bool):
            ok = isinstance(value, bool)
            want = "True or False"
        elif isinstance(default, numbers.Integral):
            ok = (
                isinstance(value, numbers.Integral)
                and not isinstance(value, bool)
                and int(value) >= 0
            )
            want = "an integer >= 0"
        elif isinstance(default, numbers.Real):
            ok = (
                isinstance(value, numbers.Real)
                and not isinstance(value, bool)
                and math.isfinite(value)
            )
            want = "a finite real number"
        elif isinstance(default, str):
            ok = isinstance(value, str)
            want = "a string"
        else:
            return
        if not ok:
            raise ConfigError(option, f"backend {self.name!r}: expected {want}, got {value!r}")

    def checks_finite_outputs(self, device: str) -> bool:
        """Whether :meth:`__call__` checks the outputs for NaN/Inf on ``device``: always on the
        CPU; on a GPU when the backend checks its inputs too (:meth:`_checks_finite`; a GPU
        kernel's ``check_finite`` option), since reading the outputs back is a device sync per
        call, which serialises the host with the kernel (on the H200 it nearly doubled the
        registry call of ``triton_fused`` at T = 1024,
        ``benchmarks/results/h200/chunk_c3358c5.json``, ``ops_overhead``)."""
        if not self.finite_output_check:
            return False
        return device == "cpu" or self._checks_finite()

    # -- description ---------------------------------------------------------------------------
    def availability(self) -> str | None:
        """``None`` if the backend can run on this machine, else the reason it cannot."""
        return None

    def check_support(
        self,
        config: VLAConfig,
        shapes: Shapes,
        dtype: str,
        device: str = "cpu",
        *,
        variant: str | None = None,
    ) -> str | None:
        """``None`` if this backend can run the request, else the reason it cannot."""
        caps = self.capabilities
        variant = self.variant if variant is None else variant
        if variant not in caps.variants:
            return f"variant {variant!r} is not implemented (supported: {caps.variants})"
        if dtype not in caps.dtypes:
            return f"dtype {dtype} is not supported (supported: {caps.dtypes})"
        if device not in caps.devices:
            return f"device {device!r} is not supported (supported: {caps.devices})"
        if caps.max_head_dim is not None and max(shapes.dk, shapes.dv) > caps.max_head_dim:
            return (
                f"head dims dk={shapes.dk}, dv={shapes.dv} exceed the largest supported "
                f"({caps.max_head_dim})"
            )
        if variant == "rls" and config.nudge_period is not None:
            return "the rls variant is defined without nudges; use VLAConfig.exact()"
        return None

    def bind(self, **options: Any) -> Backend:
        """A copy with the variant and/or options changed."""
        merged = {"variant": self.variant, **self.options, **options}
        return type(self)(**merged)

    # -- running -------------------------------------------------------------------------------
    def __call__(
        self,
        q: Any,
        k: Any,
        v: Any,
        u: Any,
        *,
        config: VLAConfig | None = None,
        initial_state: tuple[Any, Any, Any] | None = None,
        start: int = 0,
    ) -> tuple[Any, tuple[Any, Any, Any]]:
        config = check_config(config)
        start = check_start(start)
        if initial_state is not None and not isinstance(initial_state, (tuple, list)):
            raise ShapeError(
                "initial_state",
                f"expected a tuple (S, A, z) or None, got {type(initial_state).__name__}",
            )
        self._precheck(q, k, v, u, initial_state, config)
        reason = self.availability()
        if reason is not None:
            raise BackendUnavailableError(self.name, reason)
        # Devices first: checking values (NaN/Inf) across devices would fail less clearly.
        tensors = [q, k, v, u, *(initial_state or ())]
        devices = {_device_of(x) for x in tensors}
        if len(devices) > 1:
            raise DeviceError("q", f"expected every input on one device, got {sorted(devices)}")
        device = devices.pop()
        if device not in self.capabilities.devices:
            raise DeviceError(
                "q", f"backend {self.name!r} runs on {self.capabilities.devices}, got {device!r}"
            )
        library = "torch" if is_torch(q) else "numpy"
        if library != self.capabilities.array:
            raise DTypeError(
                "q", f"backend {self.name!r} takes {self.capabilities.array} arrays, got {library}"
            )
        shapes = check_inputs(q, k, v, u, initial_state, check_finite=self._checks_finite())
        reason = self.check_support(config, shapes, dtype_name(q), device)
        if reason is not None:
            raise UnsupportedConfigurationError(self.name, reason)
        result = self._run(q, k, v, u, config=config, initial_state=initial_state, start=start)
        if self.checks_finite_outputs(device):
            self._check_finite_outputs(result)
        return result

    def _check_finite_outputs(self, result: Any) -> None:
        """The inputs were checked finite: a NaN/Inf output is the backend's own overflow or
        breakdown, reported as :class:`NonFiniteResultError` naming the output."""
        o, state = result
        for where, x in (("o", o), *zip(("state.S", "state.A", "state.z"), state, strict=True)):
            if x is not None and not all_finite(x):  # None: a state entry not kept (fla's A)
                raise NonFiniteResultError(
                    self.name,
                    where,
                    "the recurrence overflowed or broke down (e.g. a Sherman–Morrison "
                    "denominator at the floor with a large A); its result is not a number",
                )

    def _checks_finite(self) -> bool:
        """Whether :meth:`__call__` refuses NaN/Inf inputs (on by default).  A GPU kernel may
        make it an option: the check reads every input back, a device sync per call."""
        return True

    def _precheck(
        self, q: Any, k: Any, v: Any, u: Any, initial_state: Any, config: VLAConfig
    ) -> None:
        """Backend-specific checks that must come before the generic ones (none by default):
        a backend raises here the typed error that names the argument most precisely."""
        return None

    @abstractmethod
    def _run(
        self,
        q: Any,
        k: Any,
        v: Any,
        u: Any,
        *,
        config: VLAConfig,
        initial_state: tuple[Any, Any, Any] | None,
        start: int = 0,
    ) -> tuple[Any, tuple[Any, Any, Any]]:
        """Compute; inputs are already checked.  ``start`` is the number of tokens consumed
        before this call (spec §2.3: the nudge clock continues across calls)."""

    def __repr__(self) -> str:
        opts = "".join(f", {k}={v!r}" for k, v in self.options.items())
        return f"<backend {self.name} variant={self.variant!r}{opts}>"


def refuse_shifted_clock(name: str, config: VLAConfig, start: int) -> None:
    """For a backend whose kernels count nudges from the call's first token: ``start`` changes
    nothing when there are no nudges or when it is a whole number of nudge periods; otherwise
    the call would silently nudge at the wrong steps, so it is refused, naming ``start``."""
    period = config.nudge_period
    if period is not None and start % period:
        raise UnsupportedConfigurationError(
            name,
            f"start={start} is not a multiple of nudge_period={period}: this backend counts "
            "nudges from the call's first token (use the 'torch' or 'numpy' backend)",
            argument="start",
        )


@dataclass(frozen=True)
class _Entry:
    name: str
    module: str
    cls: str
    summary: str
    requires: tuple[str, ...]
    install_hint: str


@dataclass(frozen=True)
class BackendStatus:
    """One row of :func:`available`."""

    name: str
    summary: str
    available: bool
    reason: str | None
    capabilities: Capabilities | None


_REGISTRY: dict[str, _Entry] = {}


def register(
    name: str,
    module: str,
    cls: str,
    summary: str,
    *,
    requires: tuple[str, ...] = (),
    install_hint: str = "",
) -> None:
    """Declare a backend implemented by ``module.cls`` (imported on first use)."""
    _REGISTRY[name] = _Entry(name, module, cls, summary, requires, install_hint)


def names() -> list[str]:
    """Every registered backend name, in registration order."""
    return list(_REGISTRY)


def _installed(package: str) -> bool:
    try:
        return importlib.util.find_spec(package) is not None
    except (ImportError, ValueError):  # a broken or blocked installation counts as missing
        return False


def _missing_packages(entry: _Entry) -> list[str]:
    return [p for p in entry.requires if not _installed(p)]


def _load(entry: _Entry) -> type[Backend]:
    missing = _missing_packages(entry)
    if missing:
        hint = f" ({entry.install_hint})" if entry.install_hint else ""
        raise BackendUnavailableError(
            entry.name, f"requires the package(s) {', '.join(missing)}, not installed{hint}"
        )
    try:
        module = importlib.import_module(entry.module)
    except ModuleNotFoundError as exc:
        if exc.name == entry.module:
            raise BackendUnavailableError(
                entry.name, "not implemented in this version of vla_verify"
            ) from None
        raise BackendUnavailableError(entry.name, f"import failed: {exc}") from exc
    return getattr(module, entry.cls)


def get(name: str, **options: Any) -> Backend:
    """The backend ``name`` as a spec §4 callable (``variant=`` and backend options bind).

    Raises :class:`UnknownBackendError` for a name the registry does not know and
    :class:`BackendUnavailableError` when its packages are missing.  A backend whose device is
    missing (a GPU kernel on a machine without one) is returned, and raises when called; its
    :meth:`Backend.availability` says why.
    """
    if not isinstance(name, str) or name not in _REGISTRY:
        raise UnknownBackendError("backend", f"expected one of {names()}, got {name!r}")
    return _load(_REGISTRY[name])(**options)


def available() -> list[BackendStatus]:
    """Every known backend with whether it can run here and, if not, why."""
    rows = []
    for entry in _REGISTRY.values():
        try:
            backend = _load(entry)()
        except BackendUnavailableError as exc:
            rows.append(BackendStatus(entry.name, entry.summary, False, exc.reason, None))
            continue
        reason = backend.availability()
        rows.append(
            BackendStatus(entry.name, entry.summary, reason is None, reason, backend.capabilities)
        )
    return rows


def selected(default: str = "all") -> list[str]:
    """Backends chosen by ``$VLA_VERIFY_BACKENDS`` (comma-separated names, or ``all`` = every
    backend available on this machine), else by ``default`` (same syntax; default ``all``: the
    test suite checks whatever this machine can run).  Unknown names raise
    :class:`UnknownBackendError`."""
    raw = os.environ.get(ENV_VAR, "").strip() or default
    if raw == "all":
        return [row.name for row in available() if row.available]
    chosen = [n.strip() for n in raw.split(",") if n.strip()]
    for n in chosen:
        if n not in _REGISTRY:
            raise UnknownBackendError(ENV_VAR, f"expected names from {names()}, got {n!r}")
    return chosen
