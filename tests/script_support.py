"""Helpers for the tests of the scripts under ``benchmarks/``: loading a script as a module,
and the marks of a test that runs the chunked kernels under Triton's interpreter."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]


def load_script(relative: str) -> ModuleType:
    """The script at ``relative`` (to the repository's root) as a module of its file's name."""
    path = ROOT / relative
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def interpreted_chunked_marks() -> list[pytest.MarkDecorator]:
    """Skip (at collection) without torch, triton or the chunked backend, and unless Triton's
    interpreter runs the kernels (on a GPU the scripts time them instead)."""
    pytest.importorskip("torch")
    pytest.importorskip("triton")
    tc = pytest.importorskip("vla_verify.backends.triton_chunked")
    reason = tc.availability_reason()
    return [
        pytest.mark.skipif(reason is not None, reason=str(reason)),
        pytest.mark.skipif(not tc.interpreted(), reason="runs under TRITON_INTERPRET=1"),
    ]
