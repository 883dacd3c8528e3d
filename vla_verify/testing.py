"""Conformance as an ordinary pytest test (spec §4).

::

    # tests/test_my_kernel.py
    from vla_verify.testing import conformance_test
    from my_kernels import chunked_vla

    test_chunked_vla = conformance_test(chunked_vla, dtype="float32", chunk_size=64)

pytest collects ``test_chunked_vla``; it runs :func:`vla_verify.validate` with the options of
the pytest plugin (:mod:`vla_verify.pytest_plugin`: ``--vla-profile``, ``--vla-seed``,
``--vla-failure-dir``) and fails with the shrunk counterexample and its replay line.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from typing import Any

from .validation import ValidationReport, validate

__all__ = ["check_conformance", "conformance_test"]


def check_conformance(fn: Any, *, test_name: str = "", **kwargs: Any) -> ValidationReport:
    """Validate ``fn`` under the pytest plugin's options and fail the running test if it does
    not conform (``pytest.fail`` with the report: the shrunk counterexample and its replay line).
    ``kwargs`` go to :func:`~vla_verify.validate` and override the plugin's options."""
    import pytest

    from .pytest_plugin import current_options

    options = current_options()
    kwargs.setdefault("profile", options.profile)
    if options.seed is not None:
        kwargs.setdefault("seed", options.seed)
    else:  # the same examples on every run of this test, on every machine
        kwargs.setdefault("seed", zlib.crc32(test_name.encode()))
    if options.failure_dir is not None:
        kwargs.setdefault("failure_dir", options.failure_dir)
    report = validate(fn, **kwargs)
    if not report.passed:
        pytest.fail(report.summary(), pytrace=False)
    return report


def conformance_test(
    fn: Any,
    *,
    dtype: str = "float64",
    device: str = "cpu",
    chunk_size: int | None = None,
    name: str | None = None,
    **kwargs: Any,
) -> Callable[[], None]:
    """A pytest test function that validates ``fn`` (a callable, ``"module:function"`` or a
    backend name) in ``dtype`` on ``device``; ``chunk_size`` declares a chunked kernel's chunk
    length (spec §5).  Further ``kwargs`` go to :func:`~vla_verify.validate` (``config``,
    ``variant``, ``array``, ``max_dk``, ``configs="sweep"``, …).  Assign the result to a name
    starting with ``test_`` in a test module."""
    label = name or getattr(fn, "__qualname__", None) or str(fn)

    def test() -> None:
        check_conformance(
            fn,
            test_name=f"{label}[{dtype},{device}]",
            dtype=dtype,
            device=device,
            chunk_size=chunk_size,
            **kwargs,
        )

    test.__name__ = f"test_conformance_{''.join(c if c.isalnum() else '_' for c in label)}"
    test.__doc__ = f"{label} conforms to spec §4 in {dtype} on {device}."
    return test
