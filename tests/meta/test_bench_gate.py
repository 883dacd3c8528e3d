"""The GPU benchmarks' regression gate can fail: a meta-test on the CPU.

``benchmarks/test_bench_triton.py`` feeds pytest-benchmark device time through
:class:`vla_verify.bench.DeviceClock` and gates with ``--benchmark-compare-fail=median:10%``.  Here
the same clock is advanced by a planted "device time": a baseline at 1.00 ms, then a run 20%
slower must fail the gate and a run 5% slower must pass it.  This checks our clock reaches
pytest-benchmark's comparison, and that the 10% threshold is the one applied.
"""

from __future__ import annotations

import pytest

pytest.importorskip("pytest_benchmark")

pytest_plugins = ["pytester"]

BENCH = """
import os

from vla_verify.bench import DeviceClock


def test_kernel(benchmark):
    clock = DeviceClock()
    benchmark._timer = clock
    ms = float(os.environ["PLANTED_DEVICE_MS"])
    benchmark.pedantic(lambda: clock.advance(ms / 1e3), rounds=5, iterations=1, warmup_rounds=1)
"""


def _run(pytester: pytest.Pytester, ms: float, *args: str) -> pytest.RunResult:
    pytester.makepyfile(test_gate=BENCH)
    storage = f"file://{pytester.path / 'store'}"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PLANTED_DEVICE_MS", str(ms))
        # Under `pytest -n`, this worker's PYTEST_XDIST_WORKER would reach the subprocess, and
        # pytest-benchmark disables itself whenever it sees that variable.
        for name in ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "PYTEST_XDIST_TESTRUNUID"):
            mp.delenv(name, raising=False)
        return pytester.runpytest_subprocess(
            "-p", "no:randomly", "-p", "no:xdist", f"--benchmark-storage={storage}", *args
        )


def test_regression_gate_fails_on_a_20_percent_slowdown(pytester: pytest.Pytester) -> None:
    assert _run(pytester, 1.00, "--benchmark-autosave").ret == 0
    slower = _run(pytester, 1.20, "--benchmark-compare", "--benchmark-compare-fail=median:10%")
    assert slower.ret != 0
    assert "Performance has regressed" in slower.stdout.str() + slower.stderr.str()
    within = _run(pytester, 1.05, "--benchmark-compare", "--benchmark-compare-fail=median:10%")
    assert within.ret == 0, within.stdout.str()
