"""The pytest plugin of vla_verify (entry point ``pytest11``: ``vla_verify``).

It adds three options that every :func:`vla_verify.testing.conformance_test` reads, a header line,
and the ``vla_validate`` fixture:

- ``--vla-profile quick|default|thorough``: the search effort of
  :data:`vla_verify.validation.PROFILES` (default: from ``HYPOTHESIS_PROFILE``: ``ci`` → quick,
  ``thorough`` → thorough, otherwise default);
- ``--vla-seed N``: the Hypothesis seed (default: one derived from the test's name, so that a
  failure in CI fails the same way on a laptop);
- ``--vla-failure-dir DIR``: where failing cases are saved for replay (default:
  ``$VLA_VERIFY_FAILURE_DIR`` or ``vla-verify-failures`` in the temporary directory).

A test that fails prints the shrunk counterexample and its replay line, nothing else.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import pytest

__all__ = ["PluginOptions", "current_options"]


@dataclass(frozen=True)
class PluginOptions:
    """What the command line asked of conformance tests."""

    profile: str
    seed: int | None
    failure_dir: str | None


def _profile_from_hypothesis() -> str:
    hypothesis_profile = os.environ.get("HYPOTHESIS_PROFILE", "")
    if hypothesis_profile == "ci" or (not hypothesis_profile and os.environ.get("CI")):
        return "quick"
    if hypothesis_profile == "thorough":
        return "thorough"
    return "default"


_options: PluginOptions | None = None


def current_options() -> PluginOptions:
    """The options of the running pytest session, or their defaults outside one."""
    if _options is not None:
        return _options
    return PluginOptions(_profile_from_hypothesis(), None, None)


def pytest_addoption(parser: pytest.Parser) -> None:
    from .validation import PROFILES

    group = parser.getgroup("vla_verify", "vla_verify conformance tests")
    group.addoption(
        "--vla-profile",
        choices=tuple(PROFILES),
        default=None,
        help="search effort of conformance tests (default: from HYPOTHESIS_PROFILE: ci -> "
        "quick, thorough -> thorough, else default)",
    )
    group.addoption(
        "--vla-seed",
        type=int,
        default=None,
        help="Hypothesis seed of conformance tests (default: derived from the test's name)",
    )
    group.addoption(
        "--vla-failure-dir",
        default=None,
        help="where failing cases are saved (default: $VLA_VERIFY_FAILURE_DIR or "
        "vla-verify-failures in the temporary directory)",
    )


def pytest_configure(config: pytest.Config) -> None:
    global _options
    config.addinivalue_line(
        "markers", "vla_conformance: a vla_verify conformance test (vla_verify.testing)"
    )
    _options = PluginOptions(
        config.getoption("--vla-profile") or _profile_from_hypothesis(),
        config.getoption("--vla-seed"),
        config.getoption("--vla-failure-dir"),
    )


def pytest_unconfigure(config: pytest.Config) -> None:
    global _options
    _options = None


def pytest_report_header(config: pytest.Config) -> str:
    options = current_options()
    seed = "per test" if options.seed is None else options.seed
    return f"vla_verify conformance: profile={options.profile}, seed={seed}"


@pytest.fixture
def vla_validate(request: pytest.FixtureRequest) -> Any:
    """``vla_validate(fn, **validate_kwargs)``: validate ``fn`` and fail the test with the shrunk
    counterexample and its replay line when it does not conform."""
    from .testing import check_conformance

    def run(fn: Any, **kwargs: Any) -> Any:
        return check_conformance(fn, test_name=request.node.nodeid, **kwargs)

    return run
