"""pytest-benchmark configuration for GPU kernels.

- Machine info gains the GPU name, driver, CUDA, torch, triton and fla versions
  (:func:`vla_verify.bench.machine_info`): pytest-benchmark's own machine id ignores the GPU.
- Results are stored per GPU: ``--benchmark-storage`` defaults to
  ``benchmarks/results/<gpu>/pytest-benchmark/`` (``<gpu>`` the device name without its vendor
  and its memory, e.g. ``h200``, ``h100``: ``vla_verify.bench.card_folder``), so that
  baselines of different cards are never compared.
- Timing is done by CUDA events (``triton.testing.do_bench``) inside the benchmark functions, not
  by pytest-benchmark's host clock (see ``test_bench_triton.py``).

Regression gate, on the same machine::

    pytest benchmarks --benchmark-only --benchmark-autosave          # store a baseline
    pytest benchmarks --benchmark-only --benchmark-compare=NNNN --benchmark-compare-fail=median:3%

(``NNNN``: the run number of the stored baseline file under ``results/<gpu>/<machine id>/``.)
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# The interpreter would time Python, not a GPU: benchmarks only run on a real device.
os.environ.pop("TRITON_INTERPRET", None)

RESULTS = Path(__file__).parent / "results"


def gpu_slug() -> str:
    """The results folder of the first CUDA device (``vla_verify.bench.card_folder``; ``cpu``
    without one)."""
    try:
        import torch

        if torch.cuda.is_available():
            from vla_verify.bench import card_folder

            return card_folder(torch.cuda.get_device_name(0))
    except ImportError:
        pass
    return "cpu"


def pytest_configure(config: pytest.Config) -> None:
    # Store and compare per GPU unless the user named a storage explicitly.
    option = str(getattr(config.option, "benchmark_storage", "") or "")
    if option in ("", "file://./.benchmarks"):  # pytest-benchmark's default: not per GPU
        config.option.benchmark_storage = f"file://{RESULTS / gpu_slug() / 'pytest-benchmark'}"


def pytest_benchmark_update_machine_info(config: pytest.Config, machine_info: dict) -> None:
    from vla_verify.bench import machine_info as gpu_info

    machine_info["gpu"] = gpu_info()
