"""vla_verify — numerical verification and property testing for Variational Linear Attention.

The mathematics is the spec, ``docs/spec.md``; docstrings cite it by section.

- :class:`VLAConfig` — the configuration of spec §2.2 (``VLAConfig()`` is the paper preset);
- :mod:`vla_verify.oracle` — the float64 oracle and the closed forms;
- :mod:`vla_verify.backends` — the registry (``backends.get(name)``, ``backends.available()``);
- :func:`validate` — check any spec §4 implementation against the oracle.

Importing this package needs NumPy, SciPy, mpmath and Hypothesis only; PyTorch and Triton are
imported when a backend that needs them is asked for.
"""

from . import backends, errors, oracle
from .errors import (
    BackendUnavailableError,
    UnsupportedConfigurationError,
    VLAError,
    VLAInputError,
)
from .spec import VARIANTS, VLAConfig
from .validation import ValidationReport, validate

__version__ = "0.1.0"

__all__ = [
    "VARIANTS",
    "BackendUnavailableError",
    "UnsupportedConfigurationError",
    "VLAConfig",
    "VLAError",
    "VLAInputError",
    "ValidationReport",
    "__version__",
    "backends",
    "errors",
    "oracle",
    "validate",
]
